//! The attention kernel's CPU emulation: C, each thread's part in a loop
//! over the block's threads (every per-thread variable an array indexed
//! by the thread), the warp-wide instructions as C helpers (`codegen::mma`'s
//! and [`EMULATION_HELPERS`]), the shared buffers at the kernel's own
//! offsets in one array.

use std::fmt::Write;

use crate::frontend::ast::{DType, Reducer};
use crate::gpu::attention::{Attention, BLOCK_KEYS, COMBINE_WARPS, WARP_TILES};

use super::target::{FlashTarget, Fragment};
use super::{reducer_op, weight_parts, Emit, VALUE_LBO};

/// C, run on the CPU one thread after the other.
pub(super) struct Emulation;

/// Emulation helpers: the accumulator-layout `mma` on strided per-thread
/// arrays, and the combination of each four lanes (a row's lanes).
pub const EMULATION_HELPERS: &str = r#"/* A pair of weights split into the rounded pair and the rounded
   remainders (f16, or bf16 with `bf16`), packed low first. */
static void pf_split2(float a, float b, uint32_t *hi, uint32_t *lo, int bf16) {
  uint16_t ha = bf16 ? pf_f2b(a) : pf_f2h(a), hb = bf16 ? pf_f2b(b) : pf_f2h(b);
  float fa = bf16 ? pf_b2f(ha) : pf_h2f(ha), fb = bf16 ? pf_b2f(hb) : pf_h2f(hb);
  uint16_t la = bf16 ? pf_f2b(a - fa) : pf_f2h(a - fa), lb = bf16 ? pf_f2b(b - fb) : pf_f2h(b - fb);
  *hi = (uint32_t)ha | ((uint32_t)hb << 16);
  *lo = (uint32_t)la | ((uint32_t)lb << 16);
}
/* A pair of weights rounded once (weights declared f16 or bf16). */
static void pf_round2(float a, float b, uint32_t *hi, int bf16) {
  uint16_t ha = bf16 ? pf_f2b(a) : pf_f2h(a), hb = bf16 ? pf_f2b(b) : pf_f2h(b);
  *hi = (uint32_t)ha | ((uint32_t)hb << 16);
}
/* wgmma.m64nNk16 with A in registers: thread 32 w + l holds A's rows
   16 w + l / 4 (+ 8) at columns 2 (l % 4) (+ 1) and 8 on, as the A
   fragment of mma.m16n8k16 (register 0: row g, 1: row g + 8, 2 and 3:
   the same rows 8 columns on; low half first), its registers `as` apart;
   B as in pf_emu_wgmma, summed by the tensor cores' rule as there. */
static void pf_emu_wgmma_ra(float *acc, long stride, const uint32_t *a, long as, const uint16_t *b, long b_off,
                            int b_mn, long b_lbo, int n, int bf16) {
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < n; c++) {
      double terms[17];
      for (int k = 0; k < 16; k++) {
        int w = r / 16, g = r % 8, hi = (r % 16) / 8, t = (k % 8) / 2;
        uint16_t x = (uint16_t)(a[(long)(w * 32 + g * 4 + t) * as + hi + 2 * (k / 8)] >> (16 * (k % 2)));
        uint16_t y = pf_emu_sw(b, b_off, b_mn, b_lbo, 64, c, k);
        terms[k] = (double)(bf16 ? pf_b2f(x) : pf_h2f(x)) * (double)(bf16 ? pf_b2f(y) : pf_h2f(y));
      }
      int w = r / 16, g = (r % 16) % 8, hi = (r % 16) / 8;
      int j = c / 8, t = (c % 8) / 2, lo = c % 2;
      float *d = &acc[(long)(w * 32 + g * 4 + t) * stride + 4 * j + 2 * hi + lo];
      terms[16] = *d;
      *d = pf_emu_tc_sum(terms, 17);
    }
}
/* mma.m16n8k16 on lanes whose fragments are `ds`, `as`, `bs` apart. */
static void pf_emu_mma_at(float *d, long ds, const uint32_t *a, long as, const uint32_t *b, long bs, int bf16) {
  float D[32][4]; uint32_t A[32][4], B[32][2];
  for (int l = 0; l < 32; l++) {
    for (int r = 0; r < 4; r++) { D[l][r] = d[l * ds + r]; A[l][r] = a[l * as + r]; }
    for (int r = 0; r < 2; r++) B[l][r] = b[l * bs + r];
  }
  pf_emu_mma(D, A, B, bf16);
  for (int l = 0; l < 32; l++)
    for (int r = 0; r < 4; r++) d[l * ds + r] = D[l][r];
}
/* Each four lanes (t, t+1, t+2, t+3) combine entry r of their arrays
   `stride` apart, as two xor-shuffles would: op 0 sum, 1 max, 2 min. */
static float pf_emu_op(float a, float b, int op) { return op == 0 ? a + b : op == 1 ? fmaxf(a, b) : fminf(a, b); }
static void pf_emu_quad(float *v, long stride, int n, int threads, int op) {
  for (int t = 0; t < threads; t += 4)
    for (int r = 0; r < n; r++) {
      float a = v[t * stride + r], b = v[(t + 1) * stride + r], c = v[(t + 2) * stride + r], d = v[(t + 3) * stride + r];
      float x = pf_emu_op(pf_emu_op(a, b, op), pf_emu_op(c, d, op), op);
      for (int k = 0; k < 4; k++) v[(t + k) * stride + r] = x;
    }
}
"#;

impl FlashTarget for Emulation {
    fn unroll(&self) -> &'static str {
        ""
    }

    fn unroll4(&self) -> &'static str {
        ""
    }

    fn at(&self, name: &str, idx: &str) -> String {
        format!("{name}[pf_t][{idx}]")
    }

    fn threads(&self, out: &mut String, threads: u32, code: &str) {
        let _ = writeln!(
            out,
            "for (int pf_t = 0; pf_t < {threads}; pf_t++) {{\n\
             const int pf_w = pf_t / 32, pf_l = pf_t % 32, pf_g = pf_l / 4, pf_c = pf_l % 4;\n\
             (void)pf_w; (void)pf_g; (void)pf_c;\n{code}}}"
        );
    }

    fn warps(&self, out: &mut String, warps: i64, code: &str) {
        let _ = writeln!(
            out,
            "for (int pf_w = 0; pf_w < {warps}; pf_w++) {{\n{code}}}"
        );
    }

    fn barrier(&self) -> &'static str {
        ""
    }

    /// The 32 lanes' row addresses gathered, `pf_emu_ldmatrix_x4`, the
    /// registers scattered to the warp's threads.
    fn ldsm(&self, dst: &str, off: &str, addr: &str, trans: bool) -> String {
        format!(
            "{{ const uint16_t *pf_rows[32]; uint32_t pf_x4[32][4];\n\
             for (int pf_l = 0; pf_l < 32; pf_l++) pf_rows[pf_l] = {addr};\n\
             pf_emu_ldmatrix_x4(pf_rows, {}, pf_x4);\n\
             for (int pf_l = 0; pf_l < 32; pf_l++) for (int pf_q = 0; pf_q < 4; pf_q++) {dst}[pf_w * 32 + pf_l][{off} + pf_q] = pf_x4[pf_l][pf_q]; }}\n",
            i32::from(trans)
        )
    }

    fn mma(&self, d: Fragment<'_>, a: Fragment<'_>, b: Fragment<'_>, bf16: bool) -> String {
        format!(
            "pf_emu_mma_at(&{}[pf_w * 32][{}], {}, &{}[pf_w * 32][{}], {}, &{}[pf_w * 32][{}], {}, {});\n",
            d.0,
            d.1,
            d.2,
            a.0,
            a.1,
            a.2,
            b.0,
            b.1,
            b.2,
            i32::from(bf16)
        )
    }

    /// `pf_emu_quad` over the whole block.
    fn quad(&self, out: &mut String, threads: u32, name: &str, n: i64, op: Reducer) {
        let _ = writeln!(
            out,
            "pf_emu_quad(&{name}[0][0], {n}, {n}, {threads}, {});",
            reducer_op(op)
        );
    }

    fn fast_exp(&self) -> bool {
        false
    }

    fn u16(&self) -> &'static str {
        "uint16_t"
    }

    fn copy_chunk(&self, src: &str, _tensor: &str) -> (String, String) {
        (
            format!("memcpy(pf_dst, &{src}, 16);"),
            "memset(pf_dst, 0, 16);".to_string(),
        )
    }

    fn commit(&self) -> &'static str {
        ""
    }

    fn wait(&self, _n: i32) -> String {
        String::new()
    }

    fn proxy_fence(&self) -> &'static str {
        ""
    }

    fn beside_wgmma<'a>(&self, _e: &mut Emit<'a>, _mma_sync: fn(&mut Emit<'a>)) {}

    fn emulated(&self) -> bool {
        true
    }

    fn tile_barriers(&self, name: &str, stages: i64) -> String {
        format!(
            "static pf_emu_mbar {name}[{stages}];\n\
             for (int pf_s = 0; pf_s < {stages}; pf_s++) pf_emu_mbar_init(&{name}[pf_s], 1);\n"
        )
    }

    fn tma_or(&self, tma: &str, _threads: &str) -> String {
        tma.to_string()
    }

    fn expect_bytes(&self, bar: &str, bytes: i64) -> String {
        format!("pf_emu_mbar_expect_tx({bar}, {bytes});\n")
    }

    fn tile_landed(&self, _n: i32, bar: &str, parity: &str) -> String {
        format!("pf_emu_mbar_wait({bar}, {parity});\n")
    }

    /// The scores zeroed, then `pf_emu_wgmma` per warpgroup and step,
    /// reading both operands at the swizzled addresses the GPU's
    /// descriptors name.
    fn wgmma_scores(&self, e: &mut Emit<'_>) {
        let a = e.a;
        let qa = a.block_rows() * 64;
        let groups = a.warps() / 4;
        let ka = BLOCK_KEYS * 64;
        let steps = a.depth / 16;
        let ls = WARP_TILES * a.warp_keys() / 8 * 4;
        let c = format!(
            "for (int pf_k = 0; pf_k < {ls}; pf_k++) {} = 0.0f;\n",
            self.at("pf_s", "pf_k")
        );
        e.threads(&c);
        let _ = writeln!(
            e.out,
            "for (int pf_wg = 0; pf_wg < {groups}; pf_wg++)\n\
             for (int pf_kk = 0; pf_kk < {steps}; pf_kk++)\n\
             pf_emu_wgmma(&pf_s[pf_wg * 128][0], {ls}, pf_dynamic_shared, 2L * (pf_fa_q - pf_dynamic_shared + pf_wg * 4096 + (pf_kk / 4) * {qa} + (pf_kk % 4) * 16), 0, 16, 64, \
             pf_dynamic_shared, 2L * (pf_kcur - pf_dynamic_shared + (pf_kk / 4) * {ka} + (pf_kk % 4) * 16), 0, 16, 64, {}, {});",
            a.warp_keys(),
            i32::from(a.dtype == DType::BF16)
        );
    }

    /// Each contraction's products in turn: `pf_emu_wgmma_ra` per
    /// warpgroup, step and weight part.
    fn wgmma_values(&self, e: &mut Emit<'_>) {
        let a = e.a;
        let steps = a.warp_keys() / 16;
        let frags = WARP_TILES * a.warp_keys() / 16 * 4;
        let bf = i32::from(a.dtype == DType::BF16);
        for (k, x) in a.contractions.iter().enumerate() {
            e.start_tile_sums(k, x);
            let lo = Emit::accumulators(x);
            let _ = writeln!(
                e.out,
                "for (int pf_wg = 0; pf_wg < {}; pf_wg++)\n\
                 for (int pf_kc = 0; pf_kc < {steps}; pf_kc++) {{",
                a.warps() / 4
            );
            let o = Emit::value_sums(k, x);
            for part in weight_parts(x) {
                let _ = writeln!(
                    e.out,
                    "pf_emu_wgmma_ra(&{o}[pf_wg * 128][0], {lo}, &pf_{part}{k}[pf_wg * 128][pf_kc * 4], {frags}, \
                     pf_dynamic_shared, 2L * (pf_vcur{k} - pf_dynamic_shared + pf_kc * 1024), 1, {VALUE_LBO}, {}, {bf});",
                    x.width
                );
            }
            e.line("}");
            e.add_tile_values(k, x);
        }
    }

    fn shared_memory(&self, a: &Attention) -> String {
        format!(
            "static uint16_t pf_dynamic_shared[{}];\n",
            a.shared_bytes() / 2
        )
    }

    fn wgmma_descriptors(&self) -> String {
        String::new()
    }

    fn per_thread(&self, threads: u32, ty: &str, name: &str, len: i64) -> String {
        format!("static {ty} {name}[{threads}][{len}];\n")
    }

    fn open_block(&self, a: &Attention, batch_decl: &str) -> String {
        format!(
            "for (pf_i pf_bx = 0; pf_bx < {}; pf_bx++)\nfor (pf_i pf_bt = 0; pf_bt < {}; pf_bt++) {{\n{batch_decl}\n",
            a.grid_x(),
            a.batches()
        )
    }

    fn close_block(&self) -> &'static str {
        "}\n"
    }

    fn any_lane(&self, _conds: &[String]) -> String {
        String::new()
    }

    fn dtype_arg(&self, bf16: bool) -> String {
        format!(", {}", i32::from(bf16))
    }

    fn merge_buffer(&self, floats: i64) -> String {
        format!("static float pf_mg[{floats}];\n")
    }

    fn warp_fold(&self, var: &str, lanes: &str, combine: &dyn Fn(&str, &str) -> String) -> String {
        format!(
            "float {var};\n{{ float pf_lane[32];\n\
             for (int pf_l = 0; pf_l < 32; pf_l++) {{\n{lanes}pf_lane[pf_l] = pf_v;\n}}\n\
             for (int pf_o = 16; pf_o > 0; pf_o /= 2)\n\
             for (int pf_l = 0; pf_l < pf_o; pf_l++) pf_lane[pf_l] = {};\n\
             {var} = pf_lane[0]; }}\n",
            combine("pf_lane[pf_l]", "pf_lane[pf_l + pf_o]")
        )
    }

    /// A warp's lanes are the folds' own loops: one pass a warp.
    fn combine_grid(&self, a: &Attention, code: &str) -> String {
        format!(
            "for (pf_i pf_ei = 0; pf_ei < {}; pf_ei++)\n\
             for (pf_i pf_bt = 0; pf_bt < {}; pf_bt++)\n\
             for (pf_i pf_ez = 0; pf_ez < {}; pf_ez++)\n\
             for (int pf_w = 0; pf_w < {COMBINE_WARPS}; pf_w++) {{\n\
             const int pf_t = pf_w * 32, pf_l = 0; (void)pf_t; (void)pf_l;\n{code}}}\n",
            a.rows,
            a.batches(),
            a.combine_column_blocks()
        )
    }
}
