//! The tensor-core region of a contraction kernel (see
//! `gpu::contraction`): operand tiles copied to shared memory with
//! `cp.async` two stages deep along the reduction, `ldmatrix` fragment
//! loads, `mma.sync.m16n8k16` with f32 accumulators in registers, and the
//! epilogue that stores the accumulators through the statement's element
//! map.
//!
//! Shared layout of an operand with `R` rows (`m` for A, `n` for B) and a
//! k tile of `K`: `[2][R][K + 8]` when `k` is its contiguous dimension, else
//! `[2][K][R + 8]`. The 8-element (16-byte) padding keeps every row 16-byte
//! aligned for `cp.async` and `ldmatrix` and puts the eight rows one
//! `ldmatrix` reads in eight different groups of four banks.
//!
//! Fragment layouts (PTX ISA, `mma.m16n8k16` with 16-bit operands): lane
//! `l` has group `g = l / 4` and thread `t = l % 4`; it holds A elements
//! `(g, 2t..2t+1)`, `(g+8, 2t..)`, `(g, 2t+8..)`, `(g+8, 2t+8..)`, B elements
//! `(2t..2t+1, g)` and `(2t+8.., g)`, and accumulators `(g, 2t)`, `(g,
//! 2t+1)`, `(g+8, 2t)`, `(g+8, 2t+1)`.
//!
//! The CPU emulation prints the same region with the warp-wide
//! instructions replaced by C functions that implement them from the PTX
//! definitions (`pf_emu_ldmatrix_x4`: which lane's row address feeds which
//! matrix and which lane receives which pair; `pf_emu_mma`: the fragments
//! reassembled into 16 x 16 and 16 x 8 matrices), so the addresses of every
//! `ldmatrix`, the stage bookkeeping of the pipeline, the zero fill and the
//! epilogue's ownership are all executed and checked in CI.

use std::fmt::Write;

use crate::frontend::ast::DType;
use crate::gpu::contraction::{Contraction, Operand, MMA_K, MMA_M, MMA_N};

/// CUDA helpers for the tensor-core path (sm_80 and later).
pub const GPU_HELPERS: &str = r#"static __device__ __forceinline__ void pf_cp_async16(void *dst, const void *src, int bytes) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void pf_cp_async16_full(void *dst, const void *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(d), "l"(src));
}
static __device__ __forceinline__ void pf_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void pf_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
static __device__ __forceinline__ void pf_ldmatrix_x4(unsigned r[4], const void *p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
static __device__ __forceinline__ void pf_ldmatrix_x4_trans(unsigned r[4], const void *p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
static __device__ __forceinline__ void pf_mma_f16(float d[4], const unsigned a[4], const unsigned b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void pf_mma_bf16(float d[4], const unsigned a[4], const unsigned b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"#;

/// `wgmma` helpers (sm_90a only): descriptors of no-swizzle K-major
/// operands, fence, commit and wait.
pub const WGMMA_HELPERS: &str = r#"#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ unsigned long long pf_wgmma_desc(const void *p, unsigned lbo, unsigned sbo) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  return (unsigned long long)((a >> 4) & 0x3fff) | ((unsigned long long)((lbo >> 4) & 0x3fff) << 16) | ((unsigned long long)((sbo >> 4) & 0x3fff) << 32);
}
static __device__ __forceinline__ void pf_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void pf_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void pf_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
static __device__ __forceinline__ void pf_wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
#endif
"#;

/// `pf_wgmma_<ty>_n<n>(d, desc_a, desc_b)`: `d += A B` for a warpgroup,
/// m64 n`n` k16, both operands K-major in shared memory; `d` holds the
/// thread's `n / 2` accumulators.
pub fn wgmma_helper(ty: &str, n: i64) -> String {
    let regs = n / 2;
    let outs: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let cons: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    format!(
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
         static __device__ __forceinline__ void pf_wgmma_{ty}_n{n}(float *d, unsigned long long da, unsigned long long db) {{\n\
         \x20 asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale}, 0;\\n\"\n\
         \x20   \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{outs}}}, %{da}, %{db}, p, 1, 1, 0, 0;\\n}}\\n\"\n\
         \x20   : {cons}\n\
         \x20   : \"l\"(da), \"l\"(db), \"r\"(1));\n\
         }}\n#endif\n",
        outs = outs.join(", "),
        cons = cons.join(", "),
        da = regs,
        db = regs + 1,
        scale = regs + 2,
    )
}

/// C versions of the warp-wide instructions, from their PTX definitions.
pub const EMULATION_HELPERS: &str = r#"/* ldmatrix.m8n8.x4 over a warp: matrix j's row i is at rows[8 j + i];
   lane l receives in register j the pair (l / 4, 2 (l % 4) .. + 1) of
   matrix j, or of its transpose with `trans`. Low half first. */
static void pf_emu_ldmatrix_x4(const uint16_t *rows[32], int trans, uint32_t out[32][4]) {
  for (int l = 0; l < 32; l++)
    for (int j = 0; j < 4; j++) {
      int g = l / 4, t = l % 4;
      uint16_t lo, hi;
      if (trans) { lo = rows[8 * j + 2 * t][g]; hi = rows[8 * j + 2 * t + 1][g]; }
      else { lo = rows[8 * j + g][2 * t]; hi = rows[8 * j + g][2 * t + 1]; }
      out[l][j] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
}
/* wgmma.m64nNk16 for one warpgroup, both operands K-major without swizzle:
   element (r, k) of A at a[(k / 8) a_lbo + (r / 8) a_sbo + (r % 8) 8 + k % 8]
   (in elements), B likewise with its n rows; thread 32 w + l holds rows
   16 w + l / 4 (+ 8) and columns 8 j + 2 (l % 4) (+ 1) at 4 j + (0 .. 3) of
   its `stride` accumulators. */
static void pf_emu_wgmma(float *acc, long stride, const uint16_t *a, long a_lbo, long a_sbo,
                         const uint16_t *b, long b_lbo, long b_sbo, int n, int bf16) {
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < n; c++) {
      float s = 0.0f;
      for (int k = 0; k < 16; k++) {
        uint16_t x = a[(k / 8) * a_lbo + (r / 8) * a_sbo + (r % 8) * 8 + k % 8];
        uint16_t y = b[(k / 8) * b_lbo + (c / 8) * b_sbo + (c % 8) * 8 + k % 8];
        s += (bf16 ? pf_b2f(x) : pf_h2f(x)) * (bf16 ? pf_b2f(y) : pf_h2f(y));
      }
      int w = r / 16, g = (r % 16) % 8, hi = (r % 16) / 8;
      int j = c / 8, t = (c % 8) / 2, lo = c % 2;
      acc[(long)(w * 32 + g * 4 + t) * stride + 4 * j + 2 * hi + lo] += s;
    }
}
/* mma.m16n8k16.row.col with f32 accumulators d (per lane, 4 each). */
static void pf_emu_mma(float d[32][4], uint32_t a[32][4], uint32_t b[32][2], int bf16) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; h++) {
      float v[4], w[2];
      for (int r = 0; r < 4; r++) { uint16_t x = (uint16_t)(a[l][r] >> (16 * h)); v[r] = bf16 ? pf_b2f(x) : pf_h2f(x); }
      for (int r = 0; r < 2; r++) { uint16_t x = (uint16_t)(b[l][r] >> (16 * h)); w[r] = bf16 ? pf_b2f(x) : pf_h2f(x); }
      A[g][2 * t + h] = v[0]; A[g + 8][2 * t + h] = v[1]; A[g][2 * t + 8 + h] = v[2]; A[g + 8][2 * t + 8 + h] = v[3];
      B[2 * t + h][g] = w[0]; B[2 * t + 8 + h][g] = w[1];
    }
  }
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 8; j++) {
      float s = 0.0f;
      for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j];
      C[i][j] = s;
    }
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    d[l][0] += C[g][2 * t]; d[l][1] += C[g][2 * t + 1];
    d[l][2] += C[g + 8][2 * t]; d[l][3] += C[g + 8][2 * t + 1];
  }
}
"#;

/// Padding of each shared row, in elements (16 bytes).
const PAD: i64 = 8;

/// `(rows, pitch)` of one stage of operand `x` with `r` rows in the tile.
fn layout(c: &Contraction, x: &Operand, r: i64) -> (i64, i64) {
    if x.k_contiguous {
        (r, c.tile[2] + PAD)
    } else {
        (c.tile[2], r + PAD)
    }
}

/// Elements of one stage of A and of B: padded rows for `ldmatrix`, or
/// (`wgmma`) the tile's core matrices without padding.
fn stage_len(c: &Contraction, wgmma: bool) -> (i64, i64) {
    if wgmma {
        return (c.tile[0] * c.tile[2], c.tile[1] * c.tile[2]);
    }
    let (ra, pa) = layout(c, &c.a, c.tile[0]);
    let (rb, pb) = layout(c, &c.b, c.tile[1]);
    (ra * pa, rb * pb)
}

/// Shared memory of the region in bytes (dynamic shared memory on the
/// GPU: more than the 48 KB a static array may take): the larger of the
/// two layouts when the kernel has both.
pub fn shared_bytes(c: &Contraction) -> usize {
    let (a, b) = stage_len(c, false);
    let (wa, wb) = if c.wgmma { stage_len(c, true) } else { (0, 0) };
    (c.stages * (a + b).max(wa + wb) * 2) as usize
}

/// The shared buffers' names for kernel `mark`.
pub fn buffers(mark: &str) -> (String, String) {
    (format!("pf_mma_{mark}_A"), format!("pf_mma_{mark}_B"))
}

/// Declarations of the shared buffers: the kernel's dynamic shared memory
/// on the GPU, static arrays on the CPU.
pub fn declare(c: &Contraction, mark: &str, emulate: bool, pad: &str) -> String {
    let (a, b) = stage_len(c, c.wgmma && emulate);
    let (na, nb) = buffers(mark);
    if emulate {
        format!(
            "{pad}static uint16_t {na}[{}];\n{pad}static uint16_t {nb}[{}];\n",
            c.stages * a,
            c.stages * b
        )
    } else {
        // B follows A's stages (`wgmma`'s A, when the kernel has both
        // layouts, is the larger one: its rows have no padding but B's
        // start moves to the end of either).
        let (wa, _) = if c.wgmma { stage_len(c, true) } else { (0, 0) };
        let _ = a;
        format!(
            "{pad}extern __shared__ __align__(128) unsigned short pf_dynamic_shared[];\n\
             {pad}unsigned short *const {na} = pf_dynamic_shared;\n\
             {pad}#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             {pad}unsigned short *const {nb} = pf_dynamic_shared + {};\n\
             {pad}#else\n\
             {pad}unsigned short *const {nb} = pf_dynamic_shared + {};\n\
             {pad}#endif\n",
            c.stages * if c.wgmma { wa } else { stage_len(c, false).0 },
            c.stages * stage_len(c, false).0
        )
    }
}

/// What the region needs from the kernel around it, as C expressions.
pub struct Region<'a> {
    pub c: &'a Contraction,
    pub mark: &'a str,
    /// `Some(threads)`: print the CPU emulation.
    pub emulate: Option<u32>,
    /// Origins of the block's tile along `m` and `n` (iteration values).
    pub origin: [String; 2],
    /// Extents of the domain along `m`, `n`, `k`.
    pub extents: [String; 3],
    /// `&t_X[...]` of an operand element at iteration values `(row, k)`
    /// (`row` is `m` for A, `n` for B).
    pub a_address: &'a dyn Fn(&str, &str) -> String,
    pub b_address: &'a dyn Fn(&str, &str) -> String,
    /// The output element at local `(m, n)` of the block's tile: `t_C[...]`.
    pub c_element: &'a dyn Fn(&str, &str) -> String,
    pub c_dtype: DType,
    /// The accumulators start at zero (a hoisted `+=!`); otherwise they
    /// start from the output.
    pub zero_init: bool,
    /// The epilogue statements on the element's value `pf_cv` (stored
    /// type), for the element at local `(pf_lm, pf_ln)`.
    pub epilogue: String,
}

impl Region<'_> {
    /// The region, indented by `depth` levels. A kernel whose operands
    /// both have `k` contiguous has two: `wgmma` where the compiler
    /// targets sm_90a, `mma.sync` elsewhere; the CPU emulation runs the
    /// former.
    pub fn print(&self, depth: usize) -> String {
        if !self.c.wgmma {
            return self.print_engine(depth, false);
        }
        if self.emulate.is_some() {
            return self.print_engine(depth, true);
        }
        format!(
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n{}#else\n{}#endif\n",
            self.print_engine(depth, true),
            self.print_engine(depth, false)
        )
    }

    fn print_engine(&self, depth: usize, wg: bool) -> String {
        let c = self.c;
        let pad = "  ".repeat(depth);
        let mut o = String::new();
        let [mt, nt] = if wg {
            [1, c.tile[1] / MMA_N]
        } else {
            c.fragments()
        };
        let [wm, wn] = c.warps;
        let (tm, tn, tk) = (c.tile[0], c.tile[1], c.tile[2]);
        let (wtm, wtn) = (tm / wm, tn / wn);
        let threads = c.threads();
        let emu = self.emulate.is_some();
        let w = |o: &mut String, d: usize, s: &str| {
            let _ = writeln!(o, "{pad}{}{s}", "  ".repeat(d));
        };
        w(&mut o, 0, "{");
        w(
            &mut o,
            1,
            &format!(
                "/* tensor cores: {tm} x {tn} x {tk} tiles, {} ({} stages) */",
                if wg {
                    format!("{} warpgroups of 64 x {tn} (wgmma.m64n{tn}k16)", tm / 64)
                } else {
                    format!("{wm} x {wn} warps of {wtm} x {wtn} (mma.m16n8k16)")
                },
                c.stages
            ),
        );
        w(
            &mut o,
            1,
            &format!("const pf_i pf_m0 = {};", self.origin[0]),
        );
        w(
            &mut o,
            1,
            &format!("const pf_i pf_n0 = {};", self.origin[1]),
        );
        w(
            &mut o,
            1,
            &format!("const pf_i pf_em = {};", self.extents[0]),
        );
        w(
            &mut o,
            1,
            &format!("const pf_i pf_en = {};", self.extents[1]),
        );
        w(
            &mut o,
            1,
            &format!("const pf_i pf_ek = {};", self.extents[2]),
        );
        let (sa, sb) = stage_len(c, wg);
        let (ba, bb) = buffers(self.mark);
        if emu {
            w(
                &mut o,
                1,
                &format!("static float pf_acc[{threads}][{mt}][{nt}][4];"),
            );
        } else {
            w(&mut o, 1, &format!("float pf_acc[{mt}][{nt}][4];"));
            w(&mut o, 1, "const int pf_tid = (int)threadIdx.x;");
        }
        // Per-thread loops: the thread's own accumulators.
        let each_thread_open = |o: &mut String, d: usize| -> usize {
            if emu {
                w(
                    o,
                    d,
                    &format!(
                        "for (int pf_tid = {}; pf_tid >= 0; pf_tid--) {{",
                        threads - 1
                    ),
                );
                d + 1
            } else {
                d
            }
        };
        let acc = if emu {
            "pf_acc[pf_tid][pf_mt][pf_nt][pf_r]"
        } else {
            "pf_acc[pf_mt][pf_nt][pf_r]"
        };
        let fragments = |o: &mut String, d: usize, body: &dyn Fn(&mut String, usize)| {
            let un = |o: &mut String| {
                if !emu {
                    w(o, d, "#pragma unroll");
                }
            };
            un(o);
            w(o, d, &format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"));
            un(o);
            w(o, d, &format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++)"));
            un(o);
            w(o, d, "for (int pf_r = 0; pf_r < 4; pf_r++) {");
            w(
                o,
                d + 1,
                "const int pf_lane = pf_tid % 32, pf_warp = pf_tid / 32;",
            );
            if wg {
                // wgmma's accumulators: warp w of a warpgroup owns rows
                // 16 (w % 4) .. + 15 of the group's 64, in the layout of
                // an m16n8 fragment repeated along n.
                w(
                    o,
                    d + 1,
                    "const pf_i pf_lm = (pf_warp / 4) * 64 + (pf_warp % 4) * 16 + pf_lane / 4 + (pf_r / 2) * 8;",
                );
                w(
                    o,
                    d + 1,
                    &format!("const pf_i pf_ln = pf_nt * {MMA_N} + (pf_lane % 4) * 2 + pf_r % 2;"),
                );
            } else {
                w(
                    o,
                    d + 1,
                    &format!(
                        "const pf_i pf_lm = (pf_warp / {wn}) * {wtm} + pf_mt * {MMA_M} + pf_lane / 4 + (pf_r / 2) * 8;"
                    ),
                );
                w(
                    o,
                    d + 1,
                    &format!(
                        "const pf_i pf_ln = (pf_warp % {wn}) * {wtn} + pf_nt * {MMA_N} + (pf_lane % 4) * 2 + pf_r % 2;"
                    ),
                );
            }
            w(
                o,
                d + 1,
                "const int pf_in = pf_m0 + pf_lm < pf_em && pf_n0 + pf_ln < pf_en;",
            );
            body(o, d + 1);
            w(o, d, "}");
        };
        let load_c = match (self.c_dtype, emu) {
            (DType::F16, _) => format!("pf_h2f({})", (self.c_element)("pf_lm", "pf_ln")),
            (DType::BF16, _) => format!("pf_b2f({})", (self.c_element)("pf_lm", "pf_ln")),
            _ => format!("(float)({})", (self.c_element)("pf_lm", "pf_ln")),
        };
        let store_c = match self.c_dtype {
            DType::F16 => format!("pf_f2h({acc})"),
            DType::BF16 => format!("pf_f2b({acc})"),
            _ => acc.to_string(),
        };
        // Accumulators: zero, or the output's current values.
        let d = each_thread_open(&mut o, 1);
        fragments(&mut o, d, &|o, d| {
            if self.zero_init {
                w(o, d, &format!("{acc} = 0.0f; (void)pf_in;"));
            } else {
                w(o, d, &format!("{acc} = pf_in ? {load_c} : 0.0f;"));
            }
        });
        if emu {
            w(&mut o, 1, "}");
        }
        // The copy of one k tile of both operands into a stage. Thread
        // `tid` copies chunks `tid + j * threads` (8 elements, 16 bytes,
        // along the contiguous dimension). What does not change from one k
        // tile to the next is set up once (`setup`, before the pipeline on
        // the GPU; on the CPU inside each copy, per emulated thread): the
        // chunk's place in the stage, its source at k = its k offset, the
        // distance between two k (`&X[.., k + 1] - &X[.., k]`), the count
        // along the rows, and the alignment (a k tile moves the source by a
        // multiple of 16 bytes).
        let operands = [
            ("A", &c.a, tm, &ba, sa, self.a_address, "pf_em", "pf_m0"),
            ("B", &c.b, tn, &bb, sb, self.b_address, "pf_en", "pf_n0"),
        ];
        let setup = |o: &mut String, d: usize| {
            for (name, x, rows, _, _, address, ext, origin) in operands {
                let (lines, pitch) = layout(c, x, rows);
                let per_line = (pitch - PAD) / 8;
                let chunks = lines * per_line;
                let per_thread = (chunks + i64::from(threads) - 1) / i64::from(threads);
                for j in 0..per_thread {
                    let v = format!("pf_{name}{j}");
                    w(
                        o,
                        d,
                        &format!("const pf_i {v}_e = pf_tid + {};", j * i64::from(threads)),
                    );
                    w(o, d, &format!("const int {v}_live = {v}_e < {chunks};"));
                    if wg {
                        // Core matrices (8 rows of 16 bytes) one after the
                        // other along the rows, then along k: element (r, k)
                        // at (k / 8) R 8 + r 8 + k % 8. Two threads take a
                        // row's 32 bytes (a sector), the next two the next
                        // row.
                        w(
                            o,
                            d,
                            &format!("const pf_i {v}_line = ({v}_e / 2) % {lines};"),
                        );
                        w(
                            o,
                            d,
                            &format!(
                                "const pf_i {v}_col = ({v}_e % 2 + ({v}_e / {}) * 2) * 8;",
                                2 * lines
                            ),
                        );
                        w(
                            o,
                            d,
                            &format!(
                                "const pf_i {v}_dst = ({v}_col / 8) * {} + {v}_line * 8;",
                                lines * 8
                            ),
                        );
                    } else {
                        w(o, d, &format!("const pf_i {v}_line = {v}_e / {per_line};"));
                        w(
                            o,
                            d,
                            &format!("const pf_i {v}_col = ({v}_e % {per_line}) * 8;"),
                        );
                        w(
                            o,
                            d,
                            &format!("const pf_i {v}_dst = {v}_line * {pitch} + {v}_col;"),
                        );
                    }
                    let (row, k) = if x.k_contiguous {
                        (format!("{origin} + {v}_line"), format!("{v}_col"))
                    } else {
                        (format!("{origin} + {v}_col"), format!("{v}_line"))
                    };
                    w(o, d, &format!("const pf_i {v}_row = {row};"));
                    w(o, d, &format!("const pf_i {v}_k = {k};"));
                    w(
                        o,
                        d,
                        &format!(
                            "const unsigned short *const {v}_src = (const unsigned short *){};",
                            address(&format!("{v}_row"), &format!("{v}_k"))
                        ),
                    );
                    w(
                        o,
                        d,
                        &format!(
                            "const pf_i {v}_ks = (pf_i)((const unsigned short *){} - (const unsigned short *){});",
                            address(&format!("{v}_row"), &format!("{v}_k + 1")),
                            address(&format!("{v}_row"), &format!("{v}_k"))
                        ),
                    );
                    if x.k_contiguous {
                        w(
                            o,
                            d,
                            &format!("const int {v}_rows = {v}_live && {v}_row < {ext};"),
                        );
                    } else {
                        w(
                            o,
                            d,
                            &format!(
                                "const int {v}_rows = {v}_live ? (int)pf_max(pf_min({ext} - {v}_row, (pf_i)8), (pf_i)0) : 0;"
                            ),
                        );
                    }
                    w(
                        o,
                        d,
                        &format!(
                            "const int {v}_aligned = (((unsigned long long){v}_src) & 15) == 0;"
                        ),
                    );
                    // A chunk all of whose rows are inside: in a k tile
                    // that is inside too, it is one 16-byte copy.
                    let rows_in = if x.k_contiguous {
                        format!("{v}_rows")
                    } else {
                        format!("{v}_rows == 8")
                    };
                    w(
                        o,
                        d,
                        &format!("const int {v}_fast = {v}_live && {v}_aligned && {rows_in};"),
                    );
                }
            }
        };
        let copy = |o: &mut String, d: usize, stage: &str, k0: &str| {
            let mut d = d;
            if emu {
                w(
                    o,
                    d,
                    &format!(
                        "for (int pf_tid = {}; pf_tid >= 0; pf_tid--) {{",
                        threads - 1
                    ),
                );
                d += 1;
                setup(o, d);
            }
            w(
                o,
                d,
                &format!("const int pf_full = ({k0}) + {tk} <= pf_ek;"),
            );
            for (name, x, rows, buf, len, _, _, _) in operands {
                let (lines, pitch) = layout(c, x, rows);
                let chunks = lines * (pitch - PAD) / 8;
                let per_thread = (chunks + i64::from(threads) - 1) / i64::from(threads);
                for j in 0..per_thread {
                    let v = format!("pf_{name}{j}");
                    let dst = format!("&{buf}[({stage}) * {len} + {v}_dst]");
                    let src = format!("({v}_src + ({k0}) * {v}_ks)");
                    if emu {
                        w(
                            o,
                            d,
                            &format!("if (pf_full && {v}_fast) memcpy({dst}, {src}, 16);"),
                        );
                    } else {
                        w(
                            o,
                            d,
                            &format!("if (pf_full && {v}_fast) pf_cp_async16_full({dst}, {src});"),
                        );
                    }
                    w(o, d, &format!("else if ({v}_live) {{"));
                    // How many of the chunk's 8 elements lie in the domain.
                    let count = if x.k_contiguous {
                        format!("{v}_rows ? (int)pf_max(pf_min(pf_ek - ({k0} + {v}_k), (pf_i)8), (pf_i)0) : 0")
                    } else {
                        format!("({k0} + {v}_k < pf_ek) ? {v}_rows : 0")
                    };
                    w(o, d + 1, &format!("const int pf_count = {count};"));
                    if emu {
                        w(o, d + 1, &format!("uint16_t *pf_dst = {dst};"));
                        w(o, d + 1, &format!("const uint16_t *pf_src = {src};"));
                        w(
                            o,
                            d + 1,
                            "for (int pf_q = 0; pf_q < 8; pf_q++) pf_dst[pf_q] = pf_q < pf_count ? pf_src[pf_q] : 0;",
                        );
                    } else {
                        w(o, d + 1, &format!("unsigned short *pf_dst = {dst};"));
                        w(o, d + 1, "if (pf_count > 0) {");
                        w(o, d + 2, &format!("const unsigned short *pf_src = {src};"));
                        w(
                            o,
                            d + 2,
                            &format!(
                                "if ({v}_aligned) pf_cp_async16(pf_dst, pf_src, 2 * pf_count);"
                            ),
                        );
                        w(
                            o,
                            d + 2,
                            "else for (int pf_q = 0; pf_q < 8; pf_q++) pf_dst[pf_q] = pf_q < pf_count ? pf_src[pf_q] : (unsigned short)0;",
                        );
                        w(o, d + 1, "} else {");
                        w(o, d + 2, "*(uint4 *)pf_dst = make_uint4(0, 0, 0, 0);");
                        w(o, d + 1, "}");
                    }
                    w(o, d, "}");
                }
            }
            if emu {
                w(o, d - 1, "}");
            } else {
                w(o, d, "pf_cp_async_commit();");
            }
        };
        // Shared offsets (in elements) of the rows each lane hands to
        // ldmatrix, for an A fragment at warp rows `r0` and k `kk`, and for
        // a pair of B fragments at warp columns `c0`.
        let a_lane = |lane: &str| -> String {
            let (_, pitch) = layout(c, &c.a, tm);
            if c.a.k_contiguous {
                format!("(pf_ar + ({lane}) % 8 + (({lane}) / 8) % 2 * 8) * {pitch} + pf_kk + ({lane}) / 16 * 8")
            } else {
                format!("(pf_kk + (({lane}) / 8) / 2 * 8 + ({lane}) % 8) * {pitch} + pf_ar + (({lane}) / 8) % 2 * 8")
            }
        };
        let b_lane = |lane: &str| -> String {
            let (_, pitch) = layout(c, &c.b, tn);
            if c.b.k_contiguous {
                format!("(pf_bc + (({lane}) / 8) / 2 * 8 + ({lane}) % 8) * {pitch} + pf_kk + (({lane}) / 8) % 2 * 8")
            } else {
                format!("(pf_kk + (({lane}) / 8) % 2 * 8 + ({lane}) % 8) * {pitch} + pf_bc + (({lane}) / 8) / 2 * 8")
            }
        };
        let a_trans = if c.a.k_contiguous { 0 } else { 1 };
        let b_trans = if c.b.k_contiguous { 0 } else { 1 };
        let mma = if c.dtype == DType::BF16 {
            "bf16"
        } else {
            "f16"
        };
        let compute = |o: &mut String, d: usize| {
            if wg {
                // One wgmma per 16 of k for each warpgroup's 64 rows; the
                // descriptors give each operand's core matrices: LBO the
                // distance between two along k (R 8 elements), SBO between
                // two along the rows (8 rows of 16 bytes).
                let (lbo_a, lbo_b) = (tm * 16, tn * 16);
                let bf = i32::from(c.dtype == DType::BF16);
                let ty = if c.dtype == DType::BF16 {
                    "bf16"
                } else {
                    "f16"
                };
                if emu {
                    w(
                        o,
                        d,
                        &format!("for (int pf_wg = 0; pf_wg < {}; pf_wg++)", tm / 64),
                    );
                    w(
                        o,
                        d,
                        &format!("for (int pf_ks = 0; pf_ks < {}; pf_ks++)", tk / MMA_K),
                    );
                    w(
                        o,
                        d + 1,
                        &format!(
                            "pf_emu_wgmma(&pf_acc[pf_wg * 128][0][0][0], {}, &{ba}[pf_stage * {sa} + pf_ks * {} + pf_wg * 512], {}, 64, &{bb}[pf_stage * {sb} + pf_ks * {}], {}, 64, {tn}, {bf});",
                            tn / 2,
                            2 * tm * 8,
                            tm * 8,
                            2 * tn * 8,
                            tn * 8
                        ),
                    );
                } else {
                    w(o, d, "const int pf_wg = pf_tid / 128;");
                    w(o, d, "pf_wgmma_fence();");
                    w(o, d, "#pragma unroll");
                    w(
                        o,
                        d,
                        &format!("for (int pf_ks = 0; pf_ks < {}; pf_ks++) {{", tk / MMA_K),
                    );
                    w(
                        o,
                        d + 1,
                        &format!(
                            "const unsigned long long pf_da = pf_wgmma_desc(&{ba}[pf_stage * {sa} + pf_ks * {} + pf_wg * 512], {lbo_a}, 128);",
                            2 * tm * 8
                        ),
                    );
                    w(
                        o,
                        d + 1,
                        &format!(
                            "const unsigned long long pf_db = pf_wgmma_desc(&{bb}[pf_stage * {sb} + pf_ks * {}], {lbo_b}, 128);",
                            2 * tn * 8
                        ),
                    );
                    w(
                        o,
                        d + 1,
                        &format!("pf_wgmma_{ty}_n{tn}(&pf_acc[0][0][0], pf_da, pf_db);"),
                    );
                    w(o, d, "}");
                    w(o, d, "pf_wgmma_commit();");
                    // This step's wgmma runs on; the previous one is done.
                    w(o, d, "pf_wgmma_wait1();");
                }
                return;
            }
            if emu {
                w(
                    o,
                    d,
                    &format!(
                        "for (int pf_warp = {}; pf_warp >= 0; pf_warp--) {{",
                        i64::from(threads / 32) - 1
                    ),
                );
                w(
                    o,
                    d + 1,
                    &format!("for (int pf_kk = 0; pf_kk < {tk}; pf_kk += {MMA_K}) {{"),
                );
                w(
                    o,
                    d + 2,
                    &format!("static uint32_t pf_fa[{mt}][32][4], pf_fb[{nt}][32][2];"),
                );
                w(o, d + 2, "const uint16_t *pf_rows[32];");
                w(o, d + 2, "static uint32_t pf_q[32][4];");
                w(
                    o,
                    d + 2,
                    &format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++) {{"),
                );
                w(
                    o,
                    d + 3,
                    &format!("const int pf_ar = (pf_warp / {wn}) * {wtm} + pf_mt * {MMA_M};"),
                );
                w(
                    o,
                    d + 3,
                    &format!(
                        "for (int pf_l = 0; pf_l < 32; pf_l++) pf_rows[pf_l] = &{ba}[pf_stage * {sa} + {}];",
                        a_lane("pf_l")
                    ),
                );
                w(
                    o,
                    d + 3,
                    &format!("pf_emu_ldmatrix_x4(pf_rows, {a_trans}, pf_fa[pf_mt]);"),
                );
                w(o, d + 2, "}");
                w(
                    o,
                    d + 2,
                    &format!("for (int pf_np = 0; pf_np < {}; pf_np++) {{", nt / 2),
                );
                w(
                    o,
                    d + 3,
                    &format!(
                        "const int pf_bc = (pf_warp % {wn}) * {wtn} + pf_np * {};",
                        2 * MMA_N
                    ),
                );
                w(
                    o,
                    d + 3,
                    &format!(
                        "for (int pf_l = 0; pf_l < 32; pf_l++) pf_rows[pf_l] = &{bb}[pf_stage * {sb} + {}];",
                        b_lane("pf_l")
                    ),
                );
                w(
                    o,
                    d + 3,
                    &format!("pf_emu_ldmatrix_x4(pf_rows, {b_trans}, pf_q);"),
                );
                w(o, d + 3, "for (int pf_l = 0; pf_l < 32; pf_l++) {");
                w(o, d + 4, "pf_fb[2 * pf_np][pf_l][0] = pf_q[pf_l][0]; pf_fb[2 * pf_np][pf_l][1] = pf_q[pf_l][1];");
                w(o, d + 4, "pf_fb[2 * pf_np + 1][pf_l][0] = pf_q[pf_l][2]; pf_fb[2 * pf_np + 1][pf_l][1] = pf_q[pf_l][3];");
                w(o, d + 3, "}");
                w(o, d + 2, "}");
                w(
                    o,
                    d + 2,
                    &format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"),
                );
                w(
                    o,
                    d + 2,
                    &format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++) {{"),
                );
                w(o, d + 3, "static float pf_d[32][4];");
                w(o, d + 3, "for (int pf_l = 0; pf_l < 32; pf_l++) for (int pf_r = 0; pf_r < 4; pf_r++) pf_d[pf_l][pf_r] = pf_acc[pf_warp * 32 + pf_l][pf_mt][pf_nt][pf_r];");
                w(
                    o,
                    d + 3,
                    &format!(
                        "pf_emu_mma(pf_d, pf_fa[pf_mt], pf_fb[pf_nt], {});",
                        i32::from(c.dtype == DType::BF16)
                    ),
                );
                w(o, d + 3, "for (int pf_l = 0; pf_l < 32; pf_l++) for (int pf_r = 0; pf_r < 4; pf_r++) pf_acc[pf_warp * 32 + pf_l][pf_mt][pf_nt][pf_r] = pf_d[pf_l][pf_r];");
                w(o, d + 2, "}");
                w(o, d + 1, "}");
                w(o, d, "}");
            } else {
                w(
                    o,
                    d,
                    "const int pf_lane = pf_tid % 32, pf_warp = pf_tid / 32;",
                );
                w(
                    o,
                    d,
                    &format!("const pf_i pf_wr = (pf_warp / {wn}) * {wtm};"),
                );
                w(
                    o,
                    d,
                    &format!("const pf_i pf_wc = (pf_warp % {wn}) * {wtn};"),
                );
                // Fragments two deep along k: the loads of step kk + 16
                // are issued before the mma of step kk.
                w(
                    o,
                    d,
                    &format!("unsigned pf_fa[2][{mt}][4], pf_fb[2][{nt}][2];"),
                );
                let load = |o: &mut String, d: usize, kk: &str, buf: &str| {
                    w(o, d, "{");
                    w(o, d + 1, &format!("const int pf_kk = {kk};"));
                    w(o, d + 1, "#pragma unroll");
                    w(
                        o,
                        d + 1,
                        &format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++) {{"),
                    );
                    w(
                        o,
                        d + 2,
                        &format!("const int pf_ar = pf_wr + pf_mt * {MMA_M};"),
                    );
                    let t = if a_trans == 1 { "_trans" } else { "" };
                    w(
                        o,
                        d + 2,
                        &format!(
                            "pf_ldmatrix_x4{t}(pf_fa[{buf}][pf_mt], &{ba}[pf_stage * {sa} + {}]);",
                            a_lane("pf_lane")
                        ),
                    );
                    w(o, d + 1, "}");
                    w(o, d + 1, "#pragma unroll");
                    w(
                        o,
                        d + 1,
                        &format!("for (int pf_np = 0; pf_np < {}; pf_np++) {{", nt / 2),
                    );
                    w(
                        o,
                        d + 2,
                        &format!("const int pf_bc = pf_wc + pf_np * {};", 2 * MMA_N),
                    );
                    w(o, d + 2, "unsigned pf_q[4];");
                    let t = if b_trans == 1 { "_trans" } else { "" };
                    w(
                        o,
                        d + 2,
                        &format!(
                            "pf_ldmatrix_x4{t}(pf_q, &{bb}[pf_stage * {sb} + {}]);",
                            b_lane("pf_lane")
                        ),
                    );
                    w(o, d + 2, &format!("pf_fb[{buf}][2 * pf_np][0] = pf_q[0]; pf_fb[{buf}][2 * pf_np][1] = pf_q[1];"));
                    w(o, d + 2, &format!("pf_fb[{buf}][2 * pf_np + 1][0] = pf_q[2]; pf_fb[{buf}][2 * pf_np + 1][1] = pf_q[3];"));
                    w(o, d + 1, "}");
                    w(o, d, "}");
                };
                load(o, d, "0", "0");
                w(o, d, "#pragma unroll");
                w(
                    o,
                    d,
                    &format!("for (int pf_ks = 0; pf_ks < {}; pf_ks++) {{", tk / MMA_K),
                );
                w(o, d + 1, &format!("if (pf_ks + 1 < {})", tk / MMA_K));
                load(
                    o,
                    d + 1,
                    &format!("(pf_ks + 1) * {MMA_K}"),
                    "(pf_ks + 1) % 2",
                );
                w(o, d + 1, "#pragma unroll");
                w(
                    o,
                    d + 1,
                    &format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"),
                );
                w(o, d + 1, "#pragma unroll");
                w(
                    o,
                    d + 1,
                    &format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++)"),
                );
                w(
                    o,
                    d + 2,
                    &format!("pf_mma_{mma}(pf_acc[pf_mt][pf_nt], pf_fa[pf_ks % 2][pf_mt], pf_fb[pf_ks % 2][pf_nt]);"),
                );
                w(o, d, "}");
            }
        };
        // The pipeline, S stages deep: tiles 0 .. S-2 first; then at each
        // step wait for the oldest tile, and (after the barrier that also
        // says every warp is done with the stage computed last) copy the
        // tile S-1 steps ahead into that stage while the tensor cores work
        // on this one.
        let st = c.stages;
        if !emu {
            setup(&mut o, 1);
        }
        // Tiles copied ahead: S - 1 for mma.sync, which is done with a
        // stage when the barrier of the next step passes; S - 2 for wgmma,
        // whose instructions run on after their step (each warpgroup
        // waits for the previous step's only), so the stage of step t - 2
        // is the one free to overwrite.
        let dist = if wg { st - 2 } else { st - 1 };
        for s in 0..dist {
            w(&mut o, 1, &format!("if ((pf_i){} < pf_ek) {{", s * tk));
            copy(&mut o, 2, &s.to_string(), &format!("(pf_i){}", s * tk));
            w(&mut o, 1, "}");
            if !emu {
                w(&mut o, 1, "else pf_cp_async_commit();");
            }
        }
        // The main loop, unrolled by the number of stages so that every
        // stage index (and so every shared address) is a constant.
        w(
            &mut o,
            1,
            &format!(
                "for (pf_i pf_k0 = 0; pf_k0 < pf_ek; pf_k0 += {}) {{",
                st * tk
            ),
        );
        if !emu {
            w(&mut o, 2, "#pragma unroll");
        }
        w(
            &mut o,
            2,
            &format!("for (int pf_u = 0; pf_u < {st}; pf_u++) {{"),
        );
        w(
            &mut o,
            3,
            &format!("const pf_i pf_kt = pf_k0 + pf_u * {tk};"),
        );
        w(&mut o, 3, "if (pf_kt < pf_ek) {");
        w(&mut o, 4, "const int pf_stage = pf_u;");
        w(
            &mut o,
            4,
            &format!("const int pf_next = (pf_u + {dist}) % {st};"),
        );
        if !emu {
            w(&mut o, 4, &format!("pf_cp_async_wait<{}>();", dist - 1));
            if wg {
                // The tensor cores read shared memory through the async
                // proxy: order this thread's copies before them.
                w(
                    &mut o,
                    4,
                    "asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");",
                );
            }
            w(&mut o, 4, "__syncthreads();");
        }
        let ahead = dist * tk;
        w(&mut o, 4, &format!("if (pf_kt + {ahead} < pf_ek) {{"));
        copy(&mut o, 5, "pf_next", &format!("(pf_kt + {ahead})"));
        w(&mut o, 4, "}");
        if !emu {
            // An empty group when there is no tile left keeps the count.
            w(&mut o, 4, "else pf_cp_async_commit();");
        }
        compute(&mut o, 4);
        w(&mut o, 3, "}");
        w(&mut o, 2, "}");
        w(&mut o, 1, "}");
        if !emu {
            if wg {
                w(&mut o, 1, "pf_wgmma_wait0();");
            }
            // No copy may still be in flight into shared memory when the
            // block's next tile (a cyclic grid) starts its prologue.
            w(&mut o, 1, "pf_cp_async_wait<0>();");
            w(&mut o, 1, "__syncthreads();");
        }
        // Epilogue: each lane stores the elements it owns.
        let d = each_thread_open(&mut o, 1);
        let storage = match (self.c_dtype, emu) {
            (DType::F16 | DType::BF16, false) => "unsigned short",
            (DType::F16 | DType::BF16, true) => "uint16_t",
            (DType::F64, _) => "double",
            (DType::I32, _) => "int",
            _ => "float",
        };
        fragments(&mut o, d, &|o, d| {
            if self.epilogue.is_empty() {
                w(
                    o,
                    d,
                    &format!(
                        "if (pf_in) {} = {store_c};",
                        (self.c_element)("pf_lm", "pf_ln")
                    ),
                );
            } else {
                w(o, d, "if (pf_in) {");
                w(o, d + 1, &format!("{storage} pf_cv = {store_c};"));
                for line in self.epilogue.lines() {
                    w(o, d + 1, line);
                }
                w(
                    o,
                    d + 1,
                    &format!("{} = pf_cv;", (self.c_element)("pf_lm", "pf_ln")),
                );
                w(o, d, "}");
            }
        });
        if emu {
            w(&mut o, 1, "}");
        }
        w(&mut o, 0, "}");
        o
    }
}
