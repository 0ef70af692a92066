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
//!
//! This file holds what the kernel's printer asks for (the helpers, the
//! shared buffers' declarations, [`Region`]); the region itself is printed
//! by `engine::Engine`, one section to a file: `staging` (the copies of
//! a k tile into a stage), `pipeline` (the stages along k), `mma_sync`
//! (`ldmatrix` and `mma.sync`), `wgmma` (the descriptors' step), `cluster`
//! (a reduction split over a cluster) and `epilogue` (the stores), through
//! the indenting `writer`. What the GPU and the emulation print alike but
//! for a word (the thread loop, `#pragma unroll`, a 16-byte copy, types)
//! is in `target`; the sections that are different programs on the two
//! say so where they branch.

mod cluster;
mod engine;
mod epilogue;
mod mma_sync;
mod pipeline;
mod staging;
mod target;
mod tma;
mod wgmma;
mod writer;

pub use tma::{box_copy, coordinate_lines, map_param};

use engine::Engine;

use crate::frontend::ast::DType;
use crate::gpu::contraction::{Contraction, SharedTile};

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

/// `pf_wgmma_<ty>_n<n>_t<ta><tb>(d, desc_a, desc_b, scale_d)`: `d += A B`
/// (`d = A B` where `scale_d` is 0) for a warpgroup, m64 n`n` k16, both
/// operands in shared memory, each K-major (`t` 0) or MN-major (`t` 1, the
/// instruction's transpose flag); `d` holds the thread's `n / 2`
/// accumulators.
pub fn wgmma_helper(ty: &str, n: i64, trans: [bool; 2]) -> String {
    let (ta, tb) = (u8::from(trans[0]), u8::from(trans[1]));
    let regs = n / 2;
    let (outs, cons) = accumulator_operands(n);
    format!(
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
         static __device__ __forceinline__ void pf_wgmma_{ty}_n{n}_t{ta}{tb}(float *d, unsigned long long da, unsigned long long db, int scale_d) {{\n\
         \x20 asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{scale}, 0;\\n\"\n\
         \x20   \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{outs}}}, %{da}, %{db}, p, 1, 1, {ta}, {tb};\\n}}\\n\"\n\
         \x20   : {cons}\n\
         \x20   : \"l\"(da), \"l\"(db), \"r\"(scale_d));\n\
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
/* The tensor cores' f32 sum of one instruction's terms t[0 .. n) (the
   exact products and the incoming accumulator), as modelled in
   bench/tc-model.c: each term cut (toward zero) 25 bits below the largest
   one's leading bit, the terms added exactly, the sum cut to 24 bits. Not
   IEEE's round to nearest: chained over a long reduction the cuts add up
   with one sign, which is what `Accumulation::Promoted` avoids. */
static float pf_emu_tc_sum(const double *t, int n) {
  double big = 0.0, sum = 0.0;
  for (int i = 0; i < n; i++) if (fabs(t[i]) > big) big = fabs(t[i]);
  if (big == 0.0) return 0.0f;
  int e;
  frexp(big, &e);
  double q = ldexp(1.0, e - 25);
  for (int i = 0; i < n; i++) sum += trunc(t[i] / q) * q;
  if (sum == 0.0) return 0.0f;
  frexp(sum, &e);
  q = ldexp(1.0, e - 24);
  return (float)(trunc(sum / q) * q);
}
/* wgmma.m64nNk16 for one warpgroup: thread 32 w + l holds rows 16 w + l / 4
   (+ 8) and columns 8 j + 2 (l % 4) (+ 1) at 4 j + (0 .. 3) of its
   `stride` accumulators, each summed with its 16 products by the tensor
   cores' rule (pf_emu_tc_sum). */
static void pf_emu_wgmma(float *acc, long stride, const uint16_t *a, long a_off, int a_mn, long a_lbo, int a_span,
                         const uint16_t *b, long b_off, int b_mn, long b_lbo, int b_span, int n, int bf16) {
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < n; c++) {
      double terms[17];
      for (int k = 0; k < 16; k++) {
        uint16_t x = pf_emu_sw(a, a_off, a_mn, a_lbo, a_span, r, k);
        uint16_t y = pf_emu_sw(b, b_off, b_mn, b_lbo, b_span, c, k);
        terms[k] = (double)(bf16 ? pf_b2f(x) : pf_h2f(x)) * (double)(bf16 ? pf_b2f(y) : pf_h2f(y));
      }
      int w = r / 16, g = (r % 16) % 8, hi = (r % 16) / 8;
      int j = c / 8, t = (c % 8) / 2, lo = c % 2;
      float *d = &acc[(long)(w * 32 + g * 4 + t) * stride + 4 * j + 2 * hi + lo];
      terms[16] = *d;
      *d = pf_emu_tc_sum(terms, 17);
    }
}
/* mma.m16n8k16.row.col with f32 accumulators d (per lane, 4 each), each
   summed with its 16 products by the tensor cores' rule (pf_emu_tc_sum). */
static void pf_emu_mma(float d[32][4], uint32_t a[32][4], uint32_t b[32][2], int bf16) {
  float A[16][16], B[16][8];
  float *D[16][8];
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
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    D[g][2 * t] = &d[l][0]; D[g][2 * t + 1] = &d[l][1];
    D[g + 8][2 * t] = &d[l][2]; D[g + 8][2 * t + 1] = &d[l][3];
  }
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 8; j++) {
      double terms[17];
      for (int k = 0; k < 16; k++) terms[k] = (double)A[i][k] * (double)B[k][j];
      terms[16] = *D[i][j];
      *D[i][j] = pf_emu_tc_sum(terms, 17);
    }
}
"#;

/// For kernels with a `wgmma` path (`wgmma_kernel`, both of their
/// engines): when every thread's chunks of an operand (`per_line` chunks to
/// a line, `threads` threads) lie in the same column, `Some(L)` with L the
/// lines between two of them (for the swizzled layout, `wg`, a multiple of
/// the swizzle's 8), so that each chunk's place follows from the first's
/// by a constant. The kernel then keeps one chunk's addresses and flags
/// across the pipeline instead of one set per chunk: with 64 x N
/// accumulators in registers, twelve sets spilled (ptxas, f16 4096^3,
/// 128 x 256 x 64, on either engine).
/// CUDA helpers of the copy engine's pipeline (`gpu::tma`, sm_90): the
/// tensor map's parameter type (the driver's 128-byte `CUtensorMap`, which
/// NVRTC's headers do not declare), the mbarrier operations, and a box's
/// copy for each rank the maps have (2 to 5).
pub fn tma_gpu_helpers() -> String {
    let mut s = String::from(
        r#"struct __align__(64) PfTensorMap { unsigned long long opaque[16]; };
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ void pf_mbar_init(unsigned long long *bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(count) : "memory");
}
static __device__ __forceinline__ void pf_mbar_expect_tx(unsigned long long *bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void pf_mbar_arrive(unsigned long long *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
}
/* Returns once the barrier's phase of parity `parity` has completed. */
static __device__ __forceinline__ void pf_mbar_wait(unsigned long long *bar, unsigned parity) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  unsigned done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
"#,
    );
    for rank in 2..=5 {
        let params: Vec<String> = (0..rank).map(|d| format!("int c{d}")).collect();
        let slots: Vec<String> = (0..rank).map(|d| format!("%{}", d + 3)).collect();
        let args: Vec<String> = (0..rank).map(|d| format!("\"r\"(c{d})")).collect();
        s.push_str(&format!(
            "static __device__ __forceinline__ void pf_tma_load{rank}(void *dst, const PfTensorMap *map, unsigned long long *bar, {}) {{\n\
             \x20 asm volatile(\"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{{}}}], [%2];\\n\"\n\
             \x20   :: \"r\"((unsigned)__cvta_generic_to_shared(dst)), \"l\"((unsigned long long)map), \"r\"((unsigned)__cvta_generic_to_shared(bar)), {} : \"memory\");\n}}\n",
            params.join(", "),
            slots.join(", "),
            args.join(", ")
        ));
    }
    s.push_str("#endif\n");
    s
}

/// The emulation of the copy engine and of mbarriers: a barrier counts
/// the arrivals and bytes its phase still expects and completes it when
/// both are zero; a wait on a phase that has not completed stops the
/// program (exit status 87: on the GPU the threads would wait forever); a
/// box's copy reads the tensor at the map's extents and pitches (zeros
/// past the extents, as the engine fills), writes the box's lines in the
/// swizzle (16-byte chunk XOR the line's place in its 1024- or 512-byte
/// atom; the box starts on such a boundary) and completes its bytes.
pub const TMA_EMULATION_HELPERS: &str = r#"typedef struct { int count, pending; long tx; unsigned phase; } pf_emu_mbar;
static void pf_emu_mbar_fail(const char *what) { fprintf(stderr, "mbarrier: %s\n", what); exit(87); }
static void pf_emu_mbar_init(pf_emu_mbar *b, int count) { b->count = count; b->pending = count; b->tx = 0; b->phase = 0; }
static void pf_emu_mbar_done(pf_emu_mbar *b) { if (b->pending == 0 && b->tx == 0) { b->phase++; b->pending = b->count; } }
static void pf_emu_mbar_arrive(pf_emu_mbar *b) {
  if (b->pending <= 0) pf_emu_mbar_fail("more arrivals than the barrier expects");
  b->pending--;
  pf_emu_mbar_done(b);
}
static void pf_emu_mbar_expect_tx(pf_emu_mbar *b, long bytes) { b->tx += bytes; pf_emu_mbar_arrive(b); }
static void pf_emu_mbar_wait(pf_emu_mbar *b, unsigned parity) {
  if ((b->phase & 1u) == parity) pf_emu_mbar_fail("a wait on a phase that does not complete (the GPU would hang)");
}
static void pf_emu_tma_load(uint16_t *dst, const uint16_t *src, int rank, const long *dims, const long *pitch,
                            const long *box, const long *coord, int swizzle, pf_emu_mbar *bar) {
  long n = 1;
  for (int d = 0; d < rank; d++) n *= box[d];
  for (long e = 0; e < n; e++) {
    long rest = e, off = 0;
    int inside = 1;
    for (int d = 0; d < rank; d++) {
      long x = coord[d] + rest % box[d];
      rest /= box[d];
      if (x < 0 || x >= dims[d]) inside = 0;
      off += x * pitch[d];
    }
    long a = (e / box[0]) * box[0] * 2 + (e % box[0]) * 2;
    a ^= ((a >> 7) & (swizzle / 16 - 1)) << 4;
    dst[a / 2] = inside ? src[off] : 0;
  }
  if (bar->tx < n * 2) pf_emu_mbar_fail("a copy of more bytes than the barrier expects");
  bar->tx -= n * 2;
  pf_emu_mbar_done(bar);
}
"#;

fn uniform_lines(wgmma_kernel: bool, wg: bool, per_line: i64, threads: u32) -> Option<i64> {
    let threads = i64::from(threads);
    let lines = threads / per_line;
    (wgmma_kernel && threads % per_line == 0 && (!wg || lines % 8 == 0)).then_some(lines)
}

/// A `wgmma` descriptor's fields of a tile laid out by the gpu stage
/// (`SharedTile::descriptor`): (leading and stride byte offsets, the
/// helper that builds it, by its swizzle).
fn descriptor_fields(tile: &SharedTile) -> (i64, i64, &'static str) {
    let d = tile
        .descriptor
        .expect("the wgmma engine's tiles have descriptors");
    let make = if d.swizzle == 64 {
        "pf_wgmma_desc_sw64"
    } else {
        "pf_wgmma_desc"
    };
    (d.lbo, d.sbo, make)
}

/// The shared buffers' names for kernel `mark`.
pub fn buffers(mark: &str) -> (String, String) {
    (format!("pf_mma_{mark}_A"), format!("pf_mma_{mark}_B"))
}

/// Declarations of the shared buffers: the kernel's dynamic shared memory
/// on the GPU, static arrays on the CPU.
pub fn declare(c: &Contraction, mark: &str, emulate: bool, pad: &str) -> String {
    let (na, nb) = buffers(mark);
    let barriers = if c.copies.tma().is_some() {
        tma::declare_barriers(mark, c.stages, i64::from(c.threads() / 32), emulate, pad)
    } else {
        String::new()
    };
    if emulate {
        let t = c.shared_tiles(c.wgmma);
        format!(
            "{pad}static uint16_t {na}[{}];\n{pad}static uint16_t {nb}[{}];\n{barriers}",
            t.a.end() - t.a.start,
            t.b.end() - t.b.start
        )
    } else {
        // B follows A's stages, whose length depends on the engine (padded
        // rows for mma.sync, the swizzled tile for wgmma): each engine's B
        // starts after its own A.
        let sync = c.shared_tiles(false);
        let wgmma = if c.wgmma { c.shared_tiles(true) } else { sync };
        // The operands' descriptors at their buffers' starts, once: a
        // step's descriptor is one of these moved by its offset
        // (`pf_wgmma_desc_at`, one add), not built from its address.
        let descriptors = if c.wgmma {
            let (a_lbo, a_sbo, a_make) = descriptor_fields(&wgmma.a);
            let (b_lbo, b_sbo, b_make) = descriptor_fields(&wgmma.b);
            format!(
                "{pad}#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
                 {pad}const unsigned long long {na}_desc = {a_make}({na}, {a_lbo}, {a_sbo});\n\
                 {pad}const unsigned long long {nb}_desc = {b_make}({nb}, {b_lbo}, {b_sbo});\n\
                 {pad}#endif\n"
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
             {pad}#endif\n{descriptors}{barriers}",
            wgmma.b.start,
            sync.b.start,
            align = sync.align,
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
    /// The further sums of `c.terms`, in order: their operands' addresses
    /// and their extents along `k`.
    pub terms: Vec<TermRegion<'a>>,
}

/// What one of `Contraction::terms` needs from the kernel around it.
pub struct TermRegion<'a> {
    pub a_address: &'a dyn Fn(&str, &str) -> String,
    pub b_address: &'a dyn Fn(&str, &str) -> String,
    pub k_extent: String,
}

impl Region<'_> {
    /// The region, indented by `depth` levels. A kernel whose operands
    /// both have `k` contiguous has two: `wgmma` where the compiler
    /// targets sm_90a, `mma.sync` elsewhere; the CPU emulation runs the
    /// former.
    pub fn print(&self, depth: usize) -> String {
        if !self.c.wgmma {
            return Engine::new(self, false).print(depth);
        }
        if self.emulate.is_some() {
            return Engine::new(self, true).print(depth);
        }
        format!(
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n{}#else\n{}#endif\n",
            Engine::new(self, true).print(depth),
            Engine::new(self, false).print(depth)
        )
    }
}
