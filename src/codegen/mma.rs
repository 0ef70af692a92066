//! The tensor-core region of a contraction kernel (see
//! `gpu::contraction`): operand tiles copied to shared memory with
//! `cp.async`, `S` stages deep along the reduction (`S - 1` tiles copied
//! ahead), then either `ldmatrix` fragment loads and `mma.sync.m16n8k16`,
//! or (sm_90a, tiles in whole swizzle atoms) `wgmma` reading shared memory
//! through descriptors; f32 accumulators in registers, and the epilogue
//! that stores the accumulators through the statement's element map.
//!
//! `mma.sync` layout of an operand with `R` rows (`m` for A, `n` for B)
//! and a k tile of `K`: `[S][R][K + 8]` when `k` is its contiguous
//! dimension, else `[S][K][R + 8]`. The 8-element (16-byte) padding keeps
//! every row 16-byte aligned for `cp.async` and `ldmatrix` and puts the
//! eight rows one `ldmatrix` reads in eight different groups of four banks.
//!
//! `wgmma` layout (the 128-byte swizzle, K = 64): a line of 64 elements is
//! 128 bytes, its 16-byte chunk `q` stored at chunk `q ^ (line % 8)`, and
//! the stages start on 1024-byte boundaries (the hardware takes the row of
//! the XOR from address bits 7-9). A K-major operand has one line per row
//! (`[S][R][64]`); an MN-major one has one line per k for each group of 64
//! rows (`[S][R / 64][64][64]`). The descriptors say which (the transpose
//! flags) and where 8-line groups (SBO, 1024 bytes) and 64-row groups (LBO,
//! MN-major only) start.
//!
//! Fragment layouts (PTX ISA, `mma.m16n8k16` with 16-bit operands): lane
//! `l` has group `g = l / 4` and thread `t = l % 4`; it holds A elements
//! `(g, 2t..2t+1)`, `(g+8, 2t..)`, `(g, 2t+8..)`, `(g+8, 2t+8..)`, B elements
//! `(2t..2t+1, g)` and `(2t+8.., g)`, and accumulators `(g, 2t)`, `(g,
//! 2t+1)`, `(g+8, 2t)`, `(g+8, 2t+1)`. `wgmma.m64nN` gives warp `w` of a
//! warpgroup rows `16 w ..` in the same accumulator layout, repeated along n.
//!
//! The CPU emulation prints the same region with the warp-wide
//! instructions replaced by C functions that implement them from the PTX
//! definitions (`pf_emu_ldmatrix_x4`: which lane's row address feeds which
//! matrix and which lane receives which pair; `pf_emu_mma`: the fragments
//! reassembled into 16 x 16 and 16 x 8 matrices; `pf_emu_wgmma`: each
//! operand element read at the swizzled address its descriptor gives), so
//! the addresses of every `ldmatrix` and descriptor, the swizzled copies,
//! the stage bookkeeping of the pipeline, the zero fill and the epilogue's
//! ownership are all executed and checked in CI.

use std::fmt::Write;

use crate::frontend::ast::DType;
use crate::gpu::contraction::{narrow, Contraction, Operand, MMA_K, MMA_M, MMA_N, SHARED_ROW_PAD};

/// CUDA helpers for the tensor-core path (sm_80 and later).
pub const GPU_HELPERS: &str = r#"static __device__ __forceinline__ void pf_cp_async16(void *dst, const void *src, int bytes) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void pf_cp_async16_full(void *dst, const void *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(d), "l"(src));
}
/* The same, the L2 asked to fetch the source's whole 128-byte line: for
   tiles that stream contiguous rows once (attention's key and value
   tiles; H100, decoding: 194.7 -> 191.6 us). */
static __device__ __forceinline__ void pf_cp_async16_line(void *dst, const void *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" :: "r"(d), "l"(src));
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

/// Thread-block cluster helpers (sm_90 and later): the block's rank in
/// its cluster, the cluster-wide barrier (release and acquire: a block's
/// shared-memory writes before it are seen by the others after it), and a
/// load from the shared memory of the cluster's block `rank`
/// (distributed shared memory: `mapa` maps the address to that block's).
pub const CLUSTER_HELPERS: &str = r#"#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ int pf_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return (int)r;
}
static __device__ __forceinline__ void pf_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ float pf_cluster_load(const float *p, int rank) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p), r;
  float v;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(r) : "memory");
  return v;
}
#endif
"#;

/// `wgmma` helpers (sm_90a only): the descriptor of an operand tile in
/// the 128-byte swizzle (bits 62-63 = 1; start, leading and stride byte
/// offsets in 16-byte units), fence, commit and wait.
pub const WGMMA_HELPERS: &str = r#"#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ unsigned long long pf_wgmma_desc(const void *p, unsigned lbo, unsigned sbo) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  return (unsigned long long)((a >> 4) & 0x3fff) | ((unsigned long long)((lbo >> 4) & 0x3fff) << 16) | ((unsigned long long)((sbo >> 4) & 0x3fff) << 32) | (1ull << 62);
}
/* The descriptor of the tile `bytes` (a multiple of 16) after d's: only
   the start address (bits 0-13, in 16-byte units) moves, in 32-bit
   arithmetic; it cannot carry into the leading byte offset while the
   tile lies in shared memory (under 256 KB). A descriptor computed once
   and moved this way is one add, where pf_wgmma_desc of each tile's
   generic address is several 64-bit operations. */
static __device__ __forceinline__ unsigned long long pf_wgmma_desc_at(unsigned long long d, unsigned bytes) {
  return ((unsigned long long)(unsigned)(d >> 32) << 32) | (unsigned)((unsigned)d + (bytes >> 4));
}
/* Bytes from the start of the dynamic shared memory to p. */
#define pf_shared_bytes(p) ((unsigned)((const char *)(p) - (const char *)pf_dynamic_shared))
/* The same in the 64-byte swizzle (bits 62-63 = 2). */
static __device__ __forceinline__ unsigned long long pf_wgmma_desc_sw64(const void *p, unsigned lbo, unsigned sbo) {
  return (pf_wgmma_desc(p, lbo, sbo) & ~(3ull << 62)) | (2ull << 62);
}
static __device__ __forceinline__ void pf_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void pf_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void pf_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
static __device__ __forceinline__ void pf_wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
#endif
"#;

/// `pf_wgmma_<ty>_n<n>_t<ta><tb>(d, desc_a, desc_b)`: `d += A B` for a
/// warpgroup, m64 n`n` k16, both operands in shared memory, each K-major
/// (`t` 0) or MN-major (`t` 1, the instruction's transpose flag); `d`
/// holds the thread's `n / 2` accumulators.
pub fn wgmma_helper(ty: &str, n: i64, trans: [bool; 2]) -> String {
    let (ta, tb) = (u8::from(trans[0]), u8::from(trans[1]));
    let regs = n / 2;
    let (outs, cons) = accumulator_operands(n);
    format!(
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
         static __device__ __forceinline__ void pf_wgmma_{ty}_n{n}_t{ta}{tb}(float *d, unsigned long long da, unsigned long long db) {{\n\
         \x20 asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale}, 0;\\n\"\n\
         \x20   \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{outs}}}, %{da}, %{db}, p, 1, 1, {ta}, {tb};\\n}}\\n\"\n\
         \x20   : {cons}\n\
         \x20   : \"l\"(da), \"l\"(db), \"r\"(1));\n\
         }}\n#endif\n",
        da = regs,
        db = regs + 1,
        scale = regs + 2,
    )
}

/// The accumulators of a `wgmma.m64nN` in an `asm` statement: the operand
/// list `%0, .., %(n/2 - 1)` and their read-write constraints on `d[0]` ..
/// `d[n/2 - 1]` (a thread's `n / 2` f32 accumulators).
pub fn accumulator_operands(n: i64) -> (String, String) {
    let regs = n / 2;
    let outs: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let cons: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    (outs.join(", "), cons.join(", "))
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
/* An element of a wgmma operand in a swizzle of lines of `span` elements
   (64: the 128-byte swizzle; 32: the 64-byte one), as the tensor cores
   address it: `off` is the descriptor's start in bytes from a base
   aligned to 1024 bytes; K-major (mn = 0, 128-byte only): row r of 8-row
   groups SBO = 1024 apart, k along the row; MN-major (mn = 1): `span`
   rows along the line, groups of `span` rows `lbo` apart, k in 8-line
   groups 8 lines apart. Then the address's 16-byte chunk (bits 4-6, or
   4-5) is XORed with address bits 7-9 (or 7-8): the line's place in its
   1024- (or 512-) byte atom. */
static uint16_t pf_emu_sw(const uint16_t *base, long off, int mn, long lbo, int span, int r, int k) {
  long line = 2L * span;
  long a = mn ? off + (r / span) * lbo + (k / 8) * 8 * line + (k % 8) * line + (r % span) * 2
              : off + (r / 8) * 1024 + (r % 8) * 128 + k * 2;
  a ^= ((a >> 7) & (line / 16 - 1)) << 4;
  return base[a / 2];
}
/* wgmma.m64nNk16 for one warpgroup: thread 32 w + l holds rows 16 w + l / 4
   (+ 8) and columns 8 j + 2 (l % 4) (+ 1) at 4 j + (0 .. 3) of its
   `stride` accumulators. */
static void pf_emu_wgmma(float *acc, long stride, const uint16_t *a, long a_off, int a_mn, long a_lbo, int a_span,
                         const uint16_t *b, long b_off, int b_mn, long b_lbo, int b_span, int n, int bf16) {
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < n; c++) {
      float s = 0.0f;
      for (int k = 0; k < 16; k++) {
        uint16_t x = pf_emu_sw(a, a_off, a_mn, a_lbo, a_span, r, k);
        uint16_t y = pf_emu_sw(b, b_off, b_mn, b_lbo, b_span, c, k);
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

/// Elements from one line of operand `x`'s shared tile (`rows` rows) to
/// the next: the padded pitch for `mma.sync` (`wg` false), else the
/// swizzle's line, 32 elements in the 64-byte swizzle ([`narrow`]) and 64
/// in the 128-byte one.
fn line_len(c: &Contraction, x: &Operand, rows: i64, wg: bool) -> i64 {
    if !wg {
        c.layout(x, rows).1
    } else if narrow(x, rows) {
        32
    } else {
        64
    }
}

/// For kernels with a `wgmma` path (`wgmma_kernel`, both of their
/// engines): when every thread's chunks of an operand (`per_line` chunks to
/// a line, `threads` threads) lie in the same column, `Some(L)` with L the
/// lines between two of them (for the swizzled layout, `wg`, a multiple of
/// the swizzle's 8), so that each chunk's place follows from the first's
/// by a constant. The kernel then keeps one chunk's addresses and flags
/// across the pipeline instead of one set per chunk: with 64 x N
/// accumulators in registers, twelve sets spilled (ptxas, f16 4096^3,
/// 128 x 256 x 64, on either engine).
fn uniform_lines(wgmma_kernel: bool, wg: bool, per_line: i64, threads: u32) -> Option<i64> {
    let threads = i64::from(threads);
    let lines = threads / per_line;
    (wgmma_kernel && threads % per_line == 0 && (!wg || lines % 8 == 0)).then_some(lines)
}

/// The fields of the `wgmma` descriptors other than the start address:
/// (A's leading byte offset, B's leading and stride byte offsets, whether
/// B is narrow). K-major operands: LBO unused (16), 8-row groups 1024
/// bytes apart; MN-major: 64-row groups `tk` lines of 128 bytes apart; a
/// narrow B (the 64-byte swizzle, 32 wide): 8-line groups 512 bytes apart.
fn wgmma_fields(c: &Contraction) -> (i64, i64, i64, bool) {
    let tk = c.tile[2];
    let a_lbo = if c.a.k_contiguous { 16 } else { tk * 128 };
    let narrow = c.narrow_b();
    let b_lbo = if narrow {
        tk * 64
    } else if c.b.k_contiguous {
        16
    } else {
        tk * 128
    };
    (a_lbo, b_lbo, if narrow { 512 } else { 1024 }, narrow)
}

/// The shared buffers' names for kernel `mark`.
pub fn buffers(mark: &str) -> (String, String) {
    (format!("pf_mma_{mark}_A"), format!("pf_mma_{mark}_B"))
}

/// Declarations of the shared buffers: the kernel's dynamic shared memory
/// on the GPU, static arrays on the CPU.
pub fn declare(c: &Contraction, mark: &str, emulate: bool, pad: &str) -> String {
    let (na, nb) = buffers(mark);
    if emulate {
        let (a, b) = c.stage_len(c.wgmma);
        format!(
            "{pad}static uint16_t {na}[{}];\n{pad}static uint16_t {nb}[{}];\n",
            c.stages * a,
            c.stages * b
        )
    } else {
        // B follows A's stages, whose length depends on the engine (padded
        // rows for mma.sync, the swizzled tile for wgmma): each engine's B
        // starts after its own A.
        let a_sync = c.stage_len(false).0;
        let a_wgmma = if c.wgmma { c.stage_len(true).0 } else { a_sync };
        // The operands' descriptors at their buffers' starts, once: a
        // step's descriptor is one of these moved by its offset
        // (`pf_wgmma_desc_at`, one add), not built from its address.
        let descriptors = if c.wgmma {
            let (a_lbo, b_lbo, b_sbo, narrow) = wgmma_fields(c);
            format!(
                "{pad}#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
                 {pad}const unsigned long long {na}_desc = pf_wgmma_desc({na}, {a_lbo}, 1024);\n\
                 {pad}const unsigned long long {nb}_desc = {}({nb}, {b_lbo}, {b_sbo});\n\
                 {pad}#endif\n",
                if narrow {
                    "pf_wgmma_desc_sw64"
                } else {
                    "pf_wgmma_desc"
                }
            )
        } else {
            String::new()
        };
        format!(
            "{pad}extern __shared__ __align__({align}) unsigned short pf_dynamic_shared[];\n\
             {pad}unsigned short *const {na} = pf_dynamic_shared;\n\
             {pad}#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             {pad}unsigned short *const {nb} = pf_dynamic_shared + {};\n\
             {pad}#else\n\
             {pad}unsigned short *const {nb} = pf_dynamic_shared + {};\n\
             {pad}#endif\n{descriptors}",
            c.stages * a_wgmma,
            c.stages * a_sync,
            // The swizzle's XOR takes the row from address bits 7-9: the
            // stages start on 1024-byte boundaries.
            align = if c.wgmma { 1024 } else { 128 },
        )
    }
}

/// A tensor's element at a tile's local `(m, n)`, as C text.
pub type ElementAt<'a> = dyn Fn(&str, &str) -> String + 'a;

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
    /// Where the epilogue moves the element's value into another tensor
    /// (`Contraction::stored`): that tensor's element at local `(m, n)`
    /// and its type. The epilogue's last statement sets `pf_dv`, which is
    /// what is stored; the accumulator's own tensor is not.
    pub moved: Option<(&'a ElementAt<'a>, DType)>,
    /// The accumulators start at zero (a hoisted `+=!`); otherwise they
    /// start from the output.
    pub zero_init: bool,
    /// The epilogue statements on the element's value `pf_cv` (stored
    /// type), for the element at local `(pf_lm, pf_ln)`.
    pub epilogue: String,
    /// Every tile is whole, known at compile time (the extents are
    /// constants, multiples of the tile sizes along `m`, `n` and `k`):
    /// the copies need no test of the k tile's end and the epilogue no
    /// test of the output's bounds. A block that runs its code once (the
    /// latency regime) spends its time issuing instructions: on the H100,
    /// 128 x 1024 x 1024 f16 executed 590 848 warp instructions against
    /// 410 112 for a hand-written kernel of the same tiles.
    pub full_tiles: bool,
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
        let split = c.split;
        // This block's range of k tiles, `pf_kb .. pf_ke`: the k tiles in
        // `pf_ranks` runs of equal length (the last one shorter), the
        // block's rank in its cluster picking one.
        let k_range = |o: &mut String, d: usize| {
            if split > 1 {
                w(
                    o,
                    d,
                    &format!("const pf_i pf_kc = ((pf_ek + {tk} - 1) / {tk} + pf_ranks - 1) / pf_ranks * {tk};"),
                );
                w(o, d, "const pf_i pf_kb = pf_rank * pf_kc;");
                w(o, d, "const pf_i pf_ke = pf_min(pf_ek, pf_kb + pf_kc);");
            } else {
                w(o, d, "const pf_i pf_kb = 0, pf_ke = pf_ek;");
            }
        };
        if split > 1 && !emu {
            // On GPUs without clusters (before sm_90) the kernel is
            // launched with the same grid: the block of rank 0 runs all
            // of k and the others have nothing to do.
            w(
                &mut o,
                1,
                &format!("/* k split over the {split} blocks of a cluster */"),
            );
            w(
                &mut o,
                1,
                "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900",
            );
            w(&mut o, 1, &format!("const int pf_ranks = {split};"));
            w(&mut o, 1, "const int pf_rank = pf_cluster_rank();");
            w(&mut o, 1, "#else");
            w(&mut o, 1, "const int pf_ranks = 1, pf_rank = 0;");
            w(&mut o, 1, "#endif");
            w(&mut o, 1, "if (pf_ranks > 1 || blockIdx.z == 0) {");
        }
        if !emu || split == 1 {
            k_range(&mut o, 1);
        }
        // A register's place in a partial tile (its thread's registers
        // `threads` floats apart, so that a warp's accesses are
        // consecutive), and the block that owns it in a split: pairs of
        // registers (neighbours along n, stored together) dealt out in
        // turn.
        let part_index = format!("((pf_mt * {nt} + pf_nt) * 4 + pf_r) * {threads} + pf_tid");
        let owner = format!("((pf_mt * {nt} + pf_nt) * 2 + pf_r / 2) % pf_ranks == pf_rank");
        let (sa, sb) = c.stage_len(wg);
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
        // The thread's accumulators, one at a time (`pf_r` 0 .. 3), or
        // (`pairs`) two neighbours along n at a time (`pf_r` 0 and 2, with
        // `pf_r + 1` at `pf_ln + 1`).
        let fragments = |o: &mut String,
                         d: usize,
                         pairs: bool,
                         body: &dyn Fn(&mut String, usize)| {
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
            if pairs {
                w(o, d, "for (int pf_r = 0; pf_r < 4; pf_r += 2) {");
            } else {
                w(o, d, "for (int pf_r = 0; pf_r < 4; pf_r++) {");
            }
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
            if !pairs {
                w(
                    o,
                    d + 1,
                    if self.full_tiles {
                        "const int pf_in = 1;"
                    } else {
                        "const int pf_in = pf_m0 + pf_lm < pf_em && pf_n0 + pf_ln < pf_en;"
                    },
                );
            }
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
        if split > 1 && emu {
            // The blocks of a cluster one after the other, each leaving
            // its partial tile in its (emulated) shared memory.
            w(
                &mut o,
                1,
                &format!(
                    "static float pf_part[{split}][{}];",
                    i64::from(threads) * mt * nt * 4
                ),
            );
            w(
                &mut o,
                1,
                &format!(
                    "for (int pf_rank = {}; pf_rank >= 0; pf_rank--) {{",
                    split - 1
                ),
            );
            w(&mut o, 1, &format!("const int pf_ranks = {split};"));
            k_range(&mut o, 1);
        }
        // Accumulators: zero, or the output's current values (in the
        // block of rank 0 of a split).
        let d = each_thread_open(&mut o, 1);
        fragments(&mut o, d, false, &|o, d| {
            if self.zero_init {
                w(o, d, &format!("{acc} = 0.0f; (void)pf_in;"));
            } else if split > 1 {
                w(
                    o,
                    d,
                    &format!("{acc} = pf_in && pf_rank == 0 ? {load_c} : 0.0f;"),
                );
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
        // A chunk's flags from its `_live`, `_row` and `_src`: how many of
        // its rows are inside (`_rows`), whether its source is 16-byte
        // aligned, and whether it is one 16-byte copy in a k tile that is
        // inside too (`_fast`: all its rows inside).
        let chunk_flags = |o: &mut String, d: usize, v: &str, x: &Operand, ext: &str| {
            let (rows, rows_in) = if x.k_contiguous {
                (format!("{v}_live && {v}_row < {ext}"), format!("{v}_rows"))
            } else {
                (
                    format!(
                        "{v}_live ? (int)pf_max(pf_min({ext} - {v}_row, (pf_i)8), (pf_i)0) : 0"
                    ),
                    format!("{v}_rows == 8"),
                )
            };
            w(o, d, &format!("const int {v}_rows = {rows};"));
            w(
                o,
                d,
                &format!("const int {v}_aligned = (((unsigned long long){v}_src) & 15) == 0;"),
            );
            w(
                o,
                d,
                &format!("const int {v}_fast = {v}_live && {v}_aligned && {rows_in};"),
            );
        };
        let setup = |o: &mut String, d: usize| {
            for (name, x, rows, _, _, address, ext, origin) in operands {
                let (lines, pitch) = c.layout(x, rows);
                let per_line = (pitch - SHARED_ROW_PAD) / 8;
                let chunks = lines * per_line;
                let per_thread = (chunks + i64::from(threads) - 1) / i64::from(threads);
                let uniform = uniform_lines(c.wgmma, wg, per_line, threads);
                for j in 0..if uniform.is_some() { 1 } else { per_thread } {
                    let v = format!("pf_{name}{j}");
                    w(
                        o,
                        d,
                        &format!("const pf_i {v}_e = pf_tid + {};", j * i64::from(threads)),
                    );
                    w(o, d, &format!("const int {v}_live = {v}_e < {chunks};"));
                    w(o, d, &format!("const pf_i {v}_line = {v}_e / {per_line};"));
                    w(
                        o,
                        d,
                        &format!("const pf_i {v}_col = ({v}_e % {per_line}) * 8;"),
                    );
                    if wg {
                        // The 128-byte swizzle: a line of 64 elements is
                        // 128 bytes, and its 16-byte chunk `q` sits at
                        // `q ^ (line % 8)`. K-major: a line is a row's k
                        // tile. MN-major: a line is 64 of the rows at one
                        // k, the tile's 64-row groups `tk` lines apart.
                        let dst = if x.k_contiguous {
                            format!("{v}_line * 64 + ((({v}_col / 8) ^ ({v}_line % 8)) * 8)")
                        } else if narrow(x, rows) {
                            // The 64-byte swizzle (an MN-major tile 32
                            // wide): a line is 64 bytes, and its chunk `q`
                            // sits at `q ^ ((line / 2) % 4)` (address bits
                            // 4-5 XOR bits 7-8).
                            format!("{v}_line * 32 + ((({v}_col / 8) ^ (({v}_line / 2) % 4)) * 8)")
                        } else {
                            format!(
                                "({v}_col / 64) * {} + {v}_line * 64 + (((({v}_col % 64) / 8) ^ ({v}_line % 8)) * 8)",
                                tk * 64
                            )
                        };
                        w(o, d, &format!("const pf_i {v}_dst = {dst};"));
                    } else {
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
                    if uniform.is_some() {
                        // The distance between two lines (rows of a K-major
                        // operand, k of an MN-major one).
                        let (row1, k1) = if x.k_contiguous {
                            (format!("{v}_row + 1"), format!("{v}_k"))
                        } else {
                            (format!("{v}_row"), format!("{v}_k + 1"))
                        };
                        w(
                            o,
                            d,
                            &format!(
                                "const pf_i {v}_ls = (pf_i)((const unsigned short *){} - (const unsigned short *){});",
                                address(&row1, &k1),
                                address(&format!("{v}_row"), &format!("{v}_k"))
                            ),
                        );
                    }
                    chunk_flags(o, d, &v, x, ext);
                }
                if let Some(step) = uniform {
                    // Whether every chunk of this thread is one whole
                    // 16-byte copy in a k tile that is inside: the copy's
                    // fast path then needs no test per chunk.
                    let v = format!("pf_{name}0");
                    let last = (per_thread - 1) * step;
                    let live = if chunks % i64::from(threads) == 0 {
                        "1".to_string()
                    } else {
                        format!(
                            "pf_tid + {} < {chunks}",
                            (per_thread - 1) * i64::from(threads)
                        )
                    };
                    let rows_in = if x.k_contiguous {
                        format!("{v}_row + {last} < {ext}")
                    } else {
                        format!("{v}_rows == 8")
                    };
                    w(
                        o,
                        d,
                        &format!(
                            "const int pf_{name}_all = ({live}) && {v}_aligned && ((pf_i)({step} * {v}_ls)) % 8 == 0 && {rows_in};"
                        ),
                    );
                }
            }
        };
        // The fast path's copies of operand `x` (one chunk's addresses
        // kept, the others a constant number of lines on) into `stage` from
        // k tile `k0`, as (destination, source) pairs; `None` where the
        // operand's chunks do not lie in one column (`uniform_lines`).
        let fast_chunks = |name: &str,
                           x: &Operand,
                           rows: i64,
                           buf: &str,
                           len: i64,
                           stage: &str,
                           k0: &str|
         -> Option<Vec<(String, String)>> {
            let (lines, pitch) = c.layout(x, rows);
            let chunks = lines * (pitch - SHARED_ROW_PAD) / 8;
            let per_thread = (chunks + i64::from(threads) - 1) / i64::from(threads);
            let step = uniform_lines(c.wgmma, wg, chunks / lines, threads)?;
            let line_len = line_len(c, x, rows, wg);
            let v = format!("pf_{name}0");
            Some(
                (0..per_thread)
                    .map(|j| {
                        (
                            format!(
                                "&{buf}[({stage}) * {len} + {v}_dst + {}]",
                                j * step * line_len
                            ),
                            format!("({v}_src + ({k0}) * {v}_ks + {} * {v}_ls)", j * step),
                        )
                    })
                    .collect(),
            )
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
            if self.full_tiles {
                w(o, d, "const int pf_full = 1;");
            } else {
                w(
                    o,
                    d,
                    &format!("const int pf_full = ({k0}) + {tk} <= pf_ek;"),
                );
            }
            for (name, x, rows, buf, len, _, ext, _) in operands {
                let (lines, pitch) = c.layout(x, rows);
                let chunks = lines * (pitch - SHARED_ROW_PAD) / 8;
                let per_thread = (chunks + i64::from(threads) - 1) / i64::from(threads);
                let per_line = chunks / lines;
                let uniform = uniform_lines(c.wgmma, wg, per_line, threads);
                let line_len = line_len(c, x, rows, wg);
                if let Some(fast) = fast_chunks(name, x, rows, buf, len, stage, k0) {
                    w(o, d, &format!("if (pf_full && pf_{name}_all) {{"));
                    for (dst, src) in fast {
                        if emu {
                            w(o, d + 1, &format!("memcpy({dst}, {src}, 16);"));
                        } else {
                            w(o, d + 1, &format!("pf_cp_async16_full({dst}, {src});"));
                        }
                    }
                    w(o, d, "} else {");
                }
                let d = if uniform.is_some() { d + 1 } else { d };
                for j in 0..per_thread {
                    let v = format!("pf_{name}{j}");
                    let derived = match uniform {
                        Some(step) if j > 0 => Some(step * j),
                        _ => None,
                    };
                    if let Some(dl) = derived {
                        // Chunk j is `dl` lines after chunk 0, in the same
                        // column: its values follow from chunk 0's, so the
                        // kernel keeps only chunk 0's across the pipeline.
                        let v0 = format!("pf_{name}0");
                        let (row, k) = if x.k_contiguous {
                            (format!("{v0}_row + {dl}"), format!("{v0}_k"))
                        } else {
                            (format!("{v0}_row"), format!("{v0}_k + {dl}"))
                        };
                        w(o, d, "{");
                        let mut p = |line: String| w(o, d + 1, &line);
                        p(format!(
                            "const int {v}_live = pf_tid + {} < {chunks};",
                            j * i64::from(threads)
                        ));
                        p(format!(
                            "const pf_i {v}_dst = {v0}_dst + {};",
                            dl * line_len
                        ));
                        p(format!("const pf_i {v}_row = {row};"));
                        p(format!("const pf_i {v}_k = {k};"));
                        p(format!(
                            "const unsigned short *const {v}_src = {v0}_src + {dl} * {v0}_ls;"
                        ));
                        p(format!("const pf_i {v}_ks = {v0}_ks;"));
                        chunk_flags(o, d + 1, &v, x, ext);
                    }
                    let d = if derived.is_some() { d + 1 } else { d };
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
                        // A whole aligned chunk is copied asynchronously; a
                        // partial one element by element. (`cp.async` with a
                        // smaller source size reads only those bytes, but
                        // compute-sanitizer's memcheck counts all 16, and a
                        // chunk at the end of a tensor would be reported.)
                        w(
                            o,
                            d + 2,
                            &format!(
                                "if ({v}_aligned && pf_count == 8) pf_cp_async16_full(pf_dst, pf_src);"
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
                    if derived.is_some() {
                        w(o, d - 1, "}");
                    }
                }
                if uniform.is_some() {
                    w(o, d - 1, "}");
                }
            }
            if emu {
                w(o, d - 1, "}");
            } else {
                w(o, d, "pf_cp_async_commit();");
            }
        };
        // The copies of one stage when every chunk of both operands is
        // aligned and inside (`pf_A_all && pf_B_all`) and the tile is
        // whole: the fast branches of `copy` alone (GPU only; `None` where
        // an operand has no such branch).
        let fast_copies = || -> Option<String> {
            let mut o = String::new();
            for (name, x, rows, buf, len, _, _, _) in operands {
                let k0 = format!("pf_kb + pf_s * {tk}");
                for (dst, src) in fast_chunks(name, x, rows, buf, len, "pf_s", &k0)? {
                    let _ = writeln!(o, "pf_cp_async16_full({dst}, {src});");
                }
            }
            Some(o)
        };
        // Shared offsets (in elements) of the rows each lane hands to
        // ldmatrix, for an A fragment at warp rows `r0` and k `kk`, and for
        // a pair of B fragments at warp columns `c0`.
        let a_lane = |lane: &str| -> String {
            let (_, pitch) = c.layout(&c.a, tm);
            if c.a.k_contiguous {
                format!("(pf_ar + ({lane}) % 8 + (({lane}) / 8) % 2 * 8) * {pitch} + pf_kk + ({lane}) / 16 * 8")
            } else {
                format!("(pf_kk + (({lane}) / 8) / 2 * 8 + ({lane}) % 8) * {pitch} + pf_ar + (({lane}) / 8) % 2 * 8")
            }
        };
        let b_lane = |lane: &str| -> String {
            let (_, pitch) = c.layout(&c.b, tn);
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
                // One wgmma per 16 of k for each warpgroup's 64 rows. The
                // descriptor of a K-major operand starts 32 bytes further
                // along its swizzled rows per 16 of k (the hardware applies
                // the swizzle to the address it forms), 8-row groups 1024
                // bytes apart (SBO; LBO unused); an MN-major one starts 16
                // lines (2048 bytes) further per 16 of k, 8-line groups
                // 1024 bytes apart (SBO), 64-row groups `tk` lines apart
                // (LBO).
                let bf = i32::from(c.dtype == DType::BF16);
                let ty = if c.dtype == DType::BF16 {
                    "bf16"
                } else {
                    "f16"
                };
                let a_mn = !c.a.k_contiguous;
                let b_mn = !c.b.k_contiguous;
                // Start in elements of operand `mn` at 64-row group
                // `group` of its stage `base`; the other fields of the
                // descriptors from `wgmma_fields`.
                let start = |base: String, mn: bool, group: &str| -> String {
                    if mn {
                        format!("{base} + {group} * {} + pf_ks * {}", tk * 64, 16 * 64)
                    } else {
                        format!("{base} + {group} * {} + pf_ks * 16", 64 * 64)
                    }
                };
                let (a_lbo, b_lbo, _, narrow) = wgmma_fields(c);
                let a_start = start(format!("pf_stage * {sa}"), a_mn, "pf_wg");
                // A narrow B (the 64-byte swizzle, 32 wide): 16 lines of
                // 64 bytes per 16 of k, one group along n.
                let b_start = if narrow {
                    format!("pf_stage * {sb} + pf_ks * {}", 16 * 32)
                } else {
                    start(format!("pf_stage * {sb}"), b_mn, "0")
                };
                let b_span = if narrow { 32 } else { 64 };
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
                            "pf_emu_wgmma(&pf_acc[pf_wg * 128][0][0][0], {}, {ba}, 2L * ({a_start}), {}, {a_lbo}, 64, {bb}, 2L * ({b_start}), {}, {b_lbo}, {b_span}, {tn}, {bf});",
                            tn / 2,
                            i32::from(a_mn),
                            i32::from(b_mn),
                        ),
                    );
                } else {
                    // One warpgroup (64 rows): its offset is a constant
                    // the descriptors fold in.
                    w(
                        o,
                        d,
                        if tm == 64 {
                            "const int pf_wg = 0;"
                        } else {
                            "const int pf_wg = pf_tid / 128;"
                        },
                    );
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
                            "const unsigned long long pf_da = pf_wgmma_desc_at({ba}_desc, 2u * (unsigned)({a_start}));"
                        ),
                    );
                    w(
                        o,
                        d + 1,
                        &format!(
                            "const unsigned long long pf_db = pf_wgmma_desc_at({bb}_desc, 2u * (unsigned)({b_start}));"
                        ),
                    );
                    w(
                        o,
                        d + 1,
                        &format!(
                            "pf_wgmma_{ty}_n{tn}_t{}{}(&pf_acc[0][0][0], pf_da, pf_db);",
                            u8::from(a_mn),
                            u8::from(b_mn)
                        ),
                    );
                    w(o, d, "}");
                    w(o, d, "pf_wgmma_commit();");
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
        // Tiles copied ahead: S - 1 for mma.sync, which is done with a stage
        // once the barrier of the next step has passed; S - 2 for wgmma,
        // whose instructions run on past their step (each warpgroup waits
        // only for the step before), so the stage of step t - 2 is the one
        // free to overwrite at step t.
        // Every k tile its own stage (`whole_k`): all S copied first, none
        // refilled.
        let dist = if c.whole_k {
            st
        } else if wg {
            st - 2
        } else {
            st - 1
        };
        // Whole tiles with every chunk aligned and inside (a test that
        // does not change along k): the first tiles' copies in a loop of
        // their own, free of the per-chunk tests and of the general path.
        // Measured on the H100 (128 x 1024 x 1024 f16, 16 stages, the
        // kernel edited by hand, 20 launches in a CUDA graph): 4.84 ->
        // 4.20 us. The CPU emulation runs the loop below, whose fast
        // branches make the same copies.
        let hoisted = if self.full_tiles && !emu {
            fast_copies()
        } else {
            None
        };
        if let Some(fast) = &hoisted {
            w(&mut o, 1, "if (pf_A_all && pf_B_all) {");
            if c.whole_k {
                w(&mut o, 2, "#pragma unroll 1");
            } else {
                w(&mut o, 2, "#pragma unroll");
            }
            w(
                &mut o,
                2,
                &format!("for (int pf_s = 0; pf_s < {dist}; pf_s++) {{"),
            );
            w(&mut o, 3, &format!("if (pf_kb + pf_s * {tk} < pf_ke) {{"));
            for line in fast.lines() {
                w(&mut o, 4, line);
            }
            w(&mut o, 3, "}");
            w(&mut o, 3, "pf_cp_async_commit();");
            w(&mut o, 2, "}");
            w(&mut o, 1, "} else {");
        }
        if c.whole_k {
            // One copy in a loop: the code a block runs once stays small.
            if !emu {
                w(&mut o, 1, "#pragma unroll 1");
            }
            w(
                &mut o,
                1,
                &format!("for (int pf_s = 0; pf_s < {dist}; pf_s++) {{"),
            );
            w(&mut o, 2, &format!("if (pf_kb + pf_s * {tk} < pf_ke) {{"));
            copy(&mut o, 3, "pf_s", &format!("(pf_kb + pf_s * {tk})"));
            w(&mut o, 2, "}");
            if !emu {
                w(&mut o, 2, "else pf_cp_async_commit();");
            }
            w(&mut o, 1, "}");
        } else {
            for s in 0..dist {
                w(&mut o, 1, &format!("if (pf_kb + {} < pf_ke) {{", s * tk));
                copy(&mut o, 2, &s.to_string(), &format!("(pf_kb + {})", s * tk));
                w(&mut o, 1, "}");
                if !emu {
                    w(&mut o, 1, "else pf_cp_async_commit();");
                }
            }
        }
        if hoisted.is_some() {
            w(&mut o, 1, "}");
        }
        // The main loop, unrolled by the number of stages so that every
        // stage index (and so every shared address) is a constant; rolled
        // when every k tile has its own stage (`Contraction::whole_k`).
        w(
            &mut o,
            1,
            &format!(
                "for (pf_i pf_k0 = pf_kb; pf_k0 < pf_ke; pf_k0 += {}) {{",
                st * tk
            ),
        );
        if !emu {
            w(
                &mut o,
                2,
                if c.whole_k {
                    "#pragma unroll 1"
                } else {
                    "#pragma unroll"
                },
            );
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
        w(&mut o, 3, "if (pf_kt < pf_ke) {");
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
        // wgmma runs asynchronously: its instructions for this stage are
        // issued first and the copy of the tile ahead is issued while the
        // tensor cores work; each warpgroup then waits for the previous
        // step's wgmma only, so this step's runs on across the next
        // barrier. Measured on the H100 (f16 4096^3, 128 x 256 x 64):
        // copying first left the tensor cores idle while the copy was
        // issued (451 us); issuing first and waiting for this step's wgmma
        // at its end (three stages) took 232 us; keeping it in flight (four
        // stages) 222 us.
        if wg {
            compute(&mut o, 4);
        }
        if c.whole_k {
            // Nothing left to copy: an empty group keeps the count (and so
            // the wait above) the same at every step. No stage is
            // refilled, so the wgmma of every step stays in flight.
            if !emu {
                w(&mut o, 4, "pf_cp_async_commit();");
            }
        } else {
            w(&mut o, 4, &format!("if (pf_kt + {ahead} < pf_ke) {{"));
            copy(&mut o, 5, "pf_next", &format!("(pf_kt + {ahead})"));
            w(&mut o, 4, "}");
            if !emu {
                // An empty group when there is no tile left keeps the count.
                w(&mut o, 4, "else pf_cp_async_commit();");
            }
        }
        if !wg {
            compute(&mut o, 4);
        } else if !emu && !c.whole_k {
            w(&mut o, 4, "pf_wgmma_wait1();");
        }
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
        // A split's partial tiles meet: each block writes its registers to
        // its shared memory (the pipeline's stages are free now), and
        // after the cluster's barrier sums, for the registers it owns, the
        // partials of all the cluster's blocks in rank order (the same
        // order whatever the timing: the result does not vary from run to
        // run); a second barrier keeps every block's shared memory alive
        // until the others have read it.
        let registers = |o: &mut String, d: usize, body: &str| {
            for (var, count) in [("pf_mt", mt), ("pf_nt", nt), ("pf_r", 4)] {
                if !emu {
                    w(o, d, "#pragma unroll");
                }
                w(
                    o,
                    d,
                    &format!("for (int {var} = 0; {var} < {count}; {var}++)"),
                );
            }
            w(o, d + 1, body);
        };
        if split > 1 && emu {
            let d = each_thread_open(&mut o, 1);
            registers(
                &mut o,
                d,
                &format!("pf_part[pf_rank][{part_index}] = {acc};"),
            );
            w(&mut o, 1, "}");
            w(&mut o, 1, "}");
            // Every register is owned by one block: all sums at once.
            let d = each_thread_open(&mut o, 1);
            registers(
                &mut o,
                d,
                &format!(
                    "{{ float pf_sum = 0.0f; for (int pf_q = 0; pf_q < {split}; pf_q++) pf_sum += pf_part[pf_q][{part_index}]; {acc} = pf_sum; }}"
                ),
            );
            w(&mut o, 1, "}");
            w(
                &mut o,
                1,
                &format!(
                    "for (int pf_rank = {}; pf_rank >= 0; pf_rank--) {{",
                    split - 1
                ),
            );
            w(&mut o, 1, &format!("const int pf_ranks = {split};"));
        } else if split > 1 {
            w(
                &mut o,
                1,
                "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900",
            );
            w(&mut o, 1, "if (pf_ranks > 1) {");
            w(
                &mut o,
                2,
                "float *const pf_part = (float *)pf_dynamic_shared;",
            );
            registers(&mut o, 2, &format!("pf_part[{part_index}] = {acc};"));
            w(&mut o, 2, "pf_cluster_sync();");
            registers(
                &mut o,
                2,
                &format!(
                    "if ({owner}) {{ float pf_sum = 0.0f; for (int pf_q = 0; pf_q < {split}; pf_q++) pf_sum += pf_cluster_load(&pf_part[{part_index}], pf_q); {acc} = pf_sum; }}"
                ),
            );
            w(&mut o, 2, "pf_cluster_sync();");
            w(&mut o, 1, "}");
            w(&mut o, 1, "#endif");
        }
        // Epilogue: each lane stores the elements it owns (of a split, the
        // elements its block owns).
        let owned = if split > 1 {
            format!(" && {owner}")
        } else {
            String::new()
        };
        let d = each_thread_open(&mut o, 1);
        let storage_of = |t: DType| {
            if emu {
                super::c::storage_type(t)
            } else {
                super::cuda::storage_type(t)
            }
        };
        let storage = storage_of(self.c_dtype);
        // The value stored and where: `pf_cv` into the update's tensor, or
        // `pf_dv` into the tensor the epilogue moves it to.
        let (value, stored_dtype, declare): (&str, DType, String) = match self.moved {
            Some((_, t)) => ("pf_dv", t, format!("{} pf_dv;", storage_of(t))),
            None => ("pf_cv", self.c_dtype, String::new()),
        };
        let target = |lm: &str, ln: &str| match self.moved {
            Some((element, _)) => element(lm, ln),
            None => (self.c_element)(lm, ln),
        };
        // Two neighbours along n are stored as one access (4 bytes for
        // 16-bit outputs, 8 for f32) where both are inside, adjacent in
        // memory and the first is aligned to the pair; otherwise one at a
        // time. Measured on the H100 (f16 4096^3, wgmma): single 2-byte
        // stores took 17 us more.
        let pair = match stored_dtype {
            DType::F16 | DType::BF16 => Some(if emu { "uint32_t" } else { "unsigned int" }),
            DType::F32 => Some(if emu { "uint64_t" } else { "float2" }),
            _ => None,
        };
        fragments(&mut o, d, pair.is_some(), &|o, d| {
            let Some(pair_type) = pair else {
                w(o, d, &format!("if (pf_in{owned}) {{"));
                w(o, d + 1, &format!("{storage} pf_cv = {store_c};"));
                if !declare.is_empty() {
                    w(o, d + 1, &declare);
                }
                for line in self.epilogue.lines() {
                    w(o, d + 1, line);
                }
                w(
                    o,
                    d + 1,
                    &format!("{} = {value};", target("pf_lm", "pf_ln")),
                );
                w(o, d, "}");
                return;
            };
            let align = if emu { "" } else { "__align__(8) " };
            w(
                o,
                d,
                &format!("{align}{} pf_two[2];", storage_of(stored_dtype)),
            );
            w(o, d, "int pf_inside[2];");
            if !emu {
                w(o, d, "#pragma unroll");
            }
            w(o, d, "for (int pf_c = 0; pf_c < 2; pf_c++) {");
            w(o, d + 1, "const int pf_r2 = pf_r + pf_c;");
            w(o, d + 1, "const pf_i pf_ln2 = pf_ln + pf_c;");
            let bounds = if self.full_tiles {
                "1".to_string()
            } else {
                "pf_m0 + pf_lm < pf_em && pf_n0 + pf_ln2 < pf_en".to_string()
            };
            w(o, d + 1, &format!("pf_inside[pf_c] = {bounds}{owned};"));
            w(o, d + 1, "if (pf_inside[pf_c]) {");
            // The element's own names for the epilogue's statements.
            w(
                o,
                d + 2,
                "const int pf_r = pf_r2; const pf_i pf_ln = pf_ln2;",
            );
            w(o, d + 2, &format!("{storage} pf_cv = {store_c};"));
            if !declare.is_empty() {
                w(o, d + 2, &declare);
            }
            for line in self.epilogue.lines() {
                w(o, d + 2, line);
            }
            w(o, d + 2, &format!("pf_two[pf_c] = {value};"));
            w(o, d + 1, "}");
            w(o, d, "}");
            let first = target("pf_lm", "pf_ln");
            let second = target("pf_lm", "pf_ln + 1");
            w(
                o,
                d,
                &format!(
                    "if (pf_inside[0] && pf_inside[1] && &{second} == &{first} + 1 && ((unsigned long long)&{first}) % sizeof({pair_type}) == 0) {{"
                ),
            );
            if emu {
                w(
                    o,
                    d + 1,
                    &format!("memcpy(&{first}, pf_two, sizeof({pair_type}));"),
                );
            } else {
                w(
                    o,
                    d + 1,
                    &format!("*({pair_type} *)&{first} = *({pair_type} *)pf_two;"),
                );
            }
            w(o, d, "} else {");
            w(o, d + 1, &format!("if (pf_inside[0]) {first} = pf_two[0];"));
            w(
                o,
                d + 1,
                &format!("if (pf_inside[1]) {second} = pf_two[1];"),
            );
            w(o, d, "}");
        });
        if emu {
            w(&mut o, 1, "}");
        }
        if split > 1 {
            // The rank loop (CPU) or the test of a block's rank (GPU).
            w(&mut o, 1, "}");
        }
        w(&mut o, 0, "}");
        o
    }
}
