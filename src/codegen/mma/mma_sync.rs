//! The `mma.sync` step: per 16 of k, each warp's A and B fragments loaded
//! from shared memory with `ldmatrix` (x4: four 8 x 8 matrices, `.trans`
//! for an operand whose k is not contiguous) and `mma.m16n8k16` on every
//! pair of fragments. The GPU keeps fragments two deep along k; the
//! emulation runs each warp in turn through `pf_emu_ldmatrix_x4` and
//! `pf_emu_mma`, the lanes' row addresses and fragments as arrays.

use super::engine::Engine;
use super::writer::Lines;
use crate::frontend::ast::DType;
use crate::gpu::contraction::{MMA_K, MMA_M, MMA_N};

impl Engine<'_, '_> {
    /// Shared offset (in elements) of the row lane `lane` hands to
    /// `ldmatrix` for an A fragment at warp rows `pf_ar` and k `pf_kk`.
    fn a_lane(&self, lane: &str) -> String {
        let pitch = self.tiles.a.line_len;
        if self.c.a.k_contiguous {
            format!("(pf_ar + ({lane}) % 8 + (({lane}) / 8) % 2 * 8) * {pitch} + pf_kk + ({lane}) / 16 * 8")
        } else {
            format!("(pf_kk + (({lane}) / 8) / 2 * 8 + ({lane}) % 8) * {pitch} + pf_ar + (({lane}) / 8) % 2 * 8")
        }
    }

    /// The same for a pair of B fragments at warp columns `pf_bc`.
    fn b_lane(&self, lane: &str) -> String {
        let pitch = self.tiles.b.line_len;
        if self.c.b.k_contiguous {
            format!("(pf_bc + (({lane}) / 8) / 2 * 8 + ({lane}) % 8) * {pitch} + pf_kk + (({lane}) / 8) % 2 * 8")
        } else {
            format!("(pf_kk + (({lane}) / 8) % 2 * 8 + ({lane}) % 8) * {pitch} + pf_bc + (({lane}) / 8) / 2 * 8")
        }
    }

    /// The step on stage `pf_stage`, on the GPU or emulated. A promoted
    /// run (`Accumulation::Promoted`) starts its sums from zero at its
    /// first step and adds them to the accumulators after its last.
    pub(super) fn mma_sync_step(&self, o: &mut Lines, d: usize) {
        let run = self.promotion_run();
        if let Some((first, _)) = &run {
            if self.emulated() {
                o.line(
                    d,
                    format!("if ({first}) memset(pf_step, 0, sizeof pf_step);"),
                );
            } else {
                let (mt, nt) = (self.mt, self.nt);
                o.line(d, format!("if ({first})"));
                o.line(d + 1, "#pragma unroll");
                o.line(d + 1, format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"));
                o.line(d + 1, "#pragma unroll");
                o.line(d + 1, format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++)"));
                o.line(d + 1, "#pragma unroll");
                o.line(
                    d + 1,
                    "for (int pf_r = 0; pf_r < 4; pf_r++) pf_step[pf_mt][pf_nt][pf_r] = 0.0f;",
                );
            }
        }
        if self.emulated() {
            self.emulated_mma_sync_step(o, d);
        } else {
            self.gpu_mma_sync_step(o, d);
        }
        if let Some((_, last)) = &run {
            o.line(d, format!("if {last}"));
            self.add_part(o, d + 1);
        }
    }

    /// Each warp in turn (from the last), each 16 of k: the fragments of
    /// its lanes as arrays, `ldmatrix` and `mma` as C functions on them.
    /// `pf_emu_mma` models the tensor cores' truncated sum
    /// (`pf_emu_tc_sum`): a promoted step (`Accumulation::Promoted`) runs
    /// it on its run's sums, a chained one on the accumulators.
    fn emulated_mma_sync_step(&self, o: &mut Lines, d: usize) {
        let (mt, nt, wn, wtm, wtn, tk) = (self.mt, self.nt, self.wn, self.wtm, self.wtn, self.tk);
        let (ba, bb) = (&self.ba, &self.bb);
        let (sa, sb) = (self.tiles.a.stage_len, self.tiles.b.stage_len);
        let a_trans = i32::from(!self.c.a.k_contiguous);
        let b_trans = i32::from(!self.c.b.k_contiguous);
        o.line(
            d,
            format!(
                "for (int pf_warp = {}; pf_warp >= 0; pf_warp--) {{",
                i64::from(self.threads / 32) - 1
            ),
        );
        o.line(
            d + 1,
            format!("for (int pf_kk = 0; pf_kk < {tk}; pf_kk += {MMA_K}) {{"),
        );
        o.line(
            d + 2,
            format!("static uint32_t pf_fa[{mt}][32][4], pf_fb[{nt}][32][2];"),
        );
        o.line(d + 2, "const uint16_t *pf_rows[32];");
        o.line(d + 2, "static uint32_t pf_q[32][4];");
        o.line(
            d + 2,
            format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++) {{"),
        );
        o.line(
            d + 3,
            format!("const int pf_ar = (pf_warp / {wn}) * {wtm} + pf_mt * {MMA_M};"),
        );
        o.line(
            d + 3,
            format!(
                "for (int pf_l = 0; pf_l < 32; pf_l++) pf_rows[pf_l] = &{ba}[pf_stage * {sa} + {}];",
                self.a_lane("pf_l")
            ),
        );
        o.line(
            d + 3,
            format!("pf_emu_ldmatrix_x4(pf_rows, {a_trans}, pf_fa[pf_mt]);"),
        );
        o.line(d + 2, "}");
        o.line(
            d + 2,
            format!("for (int pf_np = 0; pf_np < {}; pf_np++) {{", nt / 2),
        );
        o.line(
            d + 3,
            format!(
                "const int pf_bc = (pf_warp % {wn}) * {wtn} + pf_np * {};",
                2 * MMA_N
            ),
        );
        o.line(
            d + 3,
            format!(
                "for (int pf_l = 0; pf_l < 32; pf_l++) pf_rows[pf_l] = &{bb}[pf_stage * {sb} + {}];",
                self.b_lane("pf_l")
            ),
        );
        o.line(
            d + 3,
            format!("pf_emu_ldmatrix_x4(pf_rows, {b_trans}, pf_q);"),
        );
        o.line(d + 3, "for (int pf_l = 0; pf_l < 32; pf_l++) {");
        o.line(
            d + 4,
            "pf_fb[2 * pf_np][pf_l][0] = pf_q[pf_l][0]; pf_fb[2 * pf_np][pf_l][1] = pf_q[pf_l][1];",
        );
        o.line(d + 4, "pf_fb[2 * pf_np + 1][pf_l][0] = pf_q[pf_l][2]; pf_fb[2 * pf_np + 1][pf_l][1] = pf_q[pf_l][3];");
        o.line(d + 3, "}");
        o.line(d + 2, "}");
        o.line(d + 2, format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"));
        o.line(
            d + 2,
            format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++) {{"),
        );
        o.line(d + 3, "static float pf_d[32][4];");
        // Promoted: onto the run's sums (`pf_step`, from zero at its
        // start), chained: onto the accumulators.
        let into = if self.promoted() { "pf_step" } else { "pf_acc" };
        let reg = format!("{into}[pf_warp * 32 + pf_l][pf_mt][pf_nt][pf_r]");
        o.line(d + 3, format!("for (int pf_l = 0; pf_l < 32; pf_l++) for (int pf_r = 0; pf_r < 4; pf_r++) pf_d[pf_l][pf_r] = {reg};"));
        o.line(
            d + 3,
            format!(
                "pf_emu_mma(pf_d, pf_fa[pf_mt], pf_fb[pf_nt], {});",
                i32::from(self.c.dtype == DType::BF16)
            ),
        );
        o.line(d + 3, format!("for (int pf_l = 0; pf_l < 32; pf_l++) for (int pf_r = 0; pf_r < 4; pf_r++) {reg} = pf_d[pf_l][pf_r];"));
        o.line(d + 2, "}");
        o.line(d + 1, "}");
        o.line(d, "}");
    }

    /// The warp's step: fragments two deep along k, the loads of step
    /// `kk + 16` issued before the mma of step `kk`.
    fn gpu_mma_sync_step(&self, o: &mut Lines, d: usize) {
        let (mt, nt, wn, wtm, wtn, tk) = (self.mt, self.nt, self.wn, self.wtm, self.wtn, self.tk);
        let mma = if self.c.dtype == DType::BF16 {
            "bf16"
        } else {
            "f16"
        };
        o.line(d, "const int pf_lane = pf_tid % 32, pf_warp = pf_tid / 32;");
        o.line(d, format!("const pf_i pf_wr = (pf_warp / {wn}) * {wtm};"));
        o.line(d, format!("const pf_i pf_wc = (pf_warp % {wn}) * {wtn};"));
        o.line(d, format!("unsigned pf_fa[2][{mt}][4], pf_fb[2][{nt}][2];"));
        self.load_fragments(o, d, "0", "0");
        o.line(d, "#pragma unroll");
        o.line(
            d,
            format!("for (int pf_ks = 0; pf_ks < {}; pf_ks++) {{", tk / MMA_K),
        );
        o.line(d + 1, format!("if (pf_ks + 1 < {})", tk / MMA_K));
        self.load_fragments(
            o,
            d + 1,
            &format!("(pf_ks + 1) * {MMA_K}"),
            "(pf_ks + 1) % 2",
        );
        o.line(d + 1, "#pragma unroll");
        o.line(d + 1, format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"));
        o.line(d + 1, "#pragma unroll");
        o.line(d + 1, format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++)"));
        let operands = "pf_fa[pf_ks % 2][pf_mt], pf_fb[pf_ks % 2][pf_nt]";
        let into = if self.promoted() { "pf_step" } else { "pf_acc" };
        o.line(
            d + 2,
            format!("pf_mma_{mma}({into}[pf_mt][pf_nt], {operands});"),
        );
        o.line(d, "}");
    }

    /// The warp's A and B fragments at k `kk` of the stage into fragment
    /// buffer `buf` (0 or 1): one `ldmatrix.x4` per A fragment, one per
    /// pair of B fragments.
    fn load_fragments(&self, o: &mut Lines, d: usize, kk: &str, buf: &str) {
        let (mt, nt) = (self.mt, self.nt);
        let (ba, bb) = (&self.ba, &self.bb);
        let (sa, sb) = (self.tiles.a.stage_len, self.tiles.b.stage_len);
        let trans = |k_contiguous: bool| if k_contiguous { "" } else { "_trans" };
        o.line(d, "{");
        o.line(d + 1, format!("const int pf_kk = {kk};"));
        o.line(d + 1, "#pragma unroll");
        o.line(
            d + 1,
            format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++) {{"),
        );
        o.line(d + 2, format!("const int pf_ar = pf_wr + pf_mt * {MMA_M};"));
        o.line(
            d + 2,
            format!(
                "pf_ldmatrix_x4{}(pf_fa[{buf}][pf_mt], &{ba}[pf_stage * {sa} + {}]);",
                trans(self.c.a.k_contiguous),
                self.a_lane("pf_lane")
            ),
        );
        o.line(d + 1, "}");
        o.line(d + 1, "#pragma unroll");
        o.line(
            d + 1,
            format!("for (int pf_np = 0; pf_np < {}; pf_np++) {{", nt / 2),
        );
        o.line(
            d + 2,
            format!("const int pf_bc = pf_wc + pf_np * {};", 2 * MMA_N),
        );
        o.line(d + 2, "unsigned pf_q[4];");
        o.line(
            d + 2,
            format!(
                "pf_ldmatrix_x4{}(pf_q, &{bb}[pf_stage * {sb} + {}]);",
                trans(self.c.b.k_contiguous),
                self.b_lane("pf_lane")
            ),
        );
        o.line(
            d + 2,
            format!("pf_fb[{buf}][2 * pf_np][0] = pf_q[0]; pf_fb[{buf}][2 * pf_np][1] = pf_q[1];"),
        );
        o.line(d + 2, format!("pf_fb[{buf}][2 * pf_np + 1][0] = pf_q[2]; pf_fb[{buf}][2 * pf_np + 1][1] = pf_q[3];"));
        o.line(d + 1, "}");
        o.line(d, "}");
    }
}
