//! The `wgmma` step (sm_90a): one `wgmma` per 16 of k for each
//! warpgroup's 64 rows, reading both operands from shared memory through
//! descriptors; the emulation calls `pf_emu_wgmma` with the same
//! descriptors' fields, for every warpgroup in turn.

use super::descriptor_fields;
use super::engine::Engine;
use super::writer::Lines;
use crate::frontend::ast::DType;
use crate::gpu::contraction::SharedTile;
use crate::gpu::contraction::MMA_K;

impl Engine<'_, '_> {
    /// The step on stage `pf_stage`. The descriptor of a K-major operand
    /// starts 32 bytes further along its swizzled rows per 16 of k (the
    /// hardware applies the swizzle to the address it forms), 8-row groups
    /// 1024 bytes apart (SBO; LBO unused); an MN-major one starts 16 lines
    /// (2048 bytes) further per 16 of k, 8-line groups 1024 bytes apart
    /// (SBO), 64-row groups `tk` lines apart (LBO).
    pub(super) fn wgmma_step(&self, o: &mut Lines, d: usize) {
        let c = self.c;
        let (tk, sa, sb) = (self.tk, self.tiles.a.stage_len, self.tiles.b.stage_len);
        // Start in elements of operand `mn` at 64-row group `group` of its
        // stage `base`; the other fields of the descriptors are the
        // tiles' (`descriptor_fields`).
        let start = |base: String, mn: bool, group: &str| -> String {
            if mn {
                format!("{base} + {group} * {} + pf_ks * {}", tk * 64, 16 * 64)
            } else {
                format!("{base} + {group} * {} + pf_ks * 16", 64 * 64)
            }
        };
        let a_start = start(format!("pf_stage * {sa}"), !c.a.k_contiguous, "pf_wg");
        // A narrow B (the 64-byte swizzle, 32 wide): 16 lines of 64 bytes
        // per 16 of k, one group along n.
        let b_start = if c.narrow_b() {
            format!("pf_stage * {sb} + pf_ks * {}", 16 * 32)
        } else {
            start(format!("pf_stage * {sb}"), !c.b.k_contiguous, "0")
        };
        if self.emulated() {
            self.emulated_wgmma_step(o, d, &a_start, &b_start);
        } else {
            self.gpu_wgmma_step(o, d, &a_start, &b_start);
        }
    }

    /// Each warpgroup in turn, each 16 of k: `pf_emu_wgmma` on the
    /// descriptors' fields (the starts in bytes, `a_start` and `b_start`
    /// in elements, the byte offsets, the swizzle's span, the transposes).
    fn emulated_wgmma_step(&self, o: &mut Lines, d: usize, a_start: &str, b_start: &str) {
        let c = self.c;
        let (tm, tn, tk) = (self.tm, self.tn, self.tk);
        let (ba, bb) = (&self.ba, &self.bb);
        let (a_lbo, _, _) = descriptor_fields(&self.tiles.a);
        let (b_lbo, _, _) = descriptor_fields(&self.tiles.b);
        // The swizzle's line in elements (64 bytes for a narrow B).
        let span = |t: &SharedTile| t.descriptor.map_or(64, |d| d.swizzle / 2);
        let (a_span, b_span) = (span(&self.tiles.a), span(&self.tiles.b));
        // Promoted: a run's sums from zero in `pf_step`, added at its end.
        let run = self.promotion_run();
        let into = if let Some((first, _)) = &run {
            o.line(
                d,
                format!("if ({first}) memset(pf_step, 0, sizeof pf_step);"),
            );
            "pf_step"
        } else {
            "pf_acc"
        };
        o.line(
            d,
            format!("for (int pf_wg = 0; pf_wg < {}; pf_wg++)", tm / 64),
        );
        o.line(
            d,
            format!("for (int pf_ks = 0; pf_ks < {}; pf_ks++)", tk / MMA_K),
        );
        o.line(
            d + 1,
            format!(
                "pf_emu_wgmma(&{into}[pf_wg * 128][0][0][0], {}, {ba}, 2L * ({a_start}), {}, {a_lbo}, {a_span}, {bb}, 2L * ({b_start}), {}, {b_lbo}, {b_span}, {tn}, {});",
                tn / 2,
                i32::from(!c.a.k_contiguous),
                i32::from(!c.b.k_contiguous),
                i32::from(c.dtype == DType::BF16),
            ),
        );
        if let Some((_, last)) = &run {
            o.line(d, format!("if {last}"));
            self.add_part(o, d + 1);
        }
    }

    /// The warpgroup's step: each 16 of k, the buffers' descriptors moved
    /// to `a_start` and `b_start` (elements) and one `wgmma`, fenced
    /// before and committed after as one group.
    fn gpu_wgmma_step(&self, o: &mut Lines, d: usize, a_start: &str, b_start: &str) {
        let c = self.c;
        let (tm, tn, tk) = (self.tm, self.tn, self.tk);
        let (ba, bb) = (&self.ba, &self.bb);
        let ty = if c.dtype == DType::BF16 {
            "bf16"
        } else {
            "f16"
        };
        // One warpgroup (64 rows): its offset is a constant the
        // descriptors fold in.
        o.line(
            d,
            if tm == 64 {
                "const int pf_wg = 0;"
            } else {
                "const int pf_wg = pf_tid / 128;"
            },
        );
        o.line(d, "pf_wgmma_fence();");
        o.line(d, "#pragma unroll");
        o.line(
            d,
            format!("for (int pf_ks = 0; pf_ks < {}; pf_ks++) {{", tk / MMA_K),
        );
        o.line(
            d + 1,
            format!("const unsigned long long pf_da = pf_wgmma_desc_at({ba}_desc, 2u * (unsigned)({a_start}));"),
        );
        o.line(
            d + 1,
            format!("const unsigned long long pf_db = pf_wgmma_desc_at({bb}_desc, 2u * (unsigned)({b_start}));"),
        );
        // Promoted: a run's first instruction starts `pf_step` from zero
        // (scale-d 0); the main loop waits for the run's last group and
        // adds it.
        let (into, scale) = match self.promotion_run() {
            Some((first, _)) => ("pf_step", format!("!({first}) || pf_ks > 0")),
            None => ("pf_acc", "1".to_string()),
        };
        o.line(
            d + 1,
            format!(
                "pf_wgmma_{ty}_n{tn}_t{}{}(&{into}[0][0][0], pf_da, pf_db, {scale});",
                u8::from(!c.a.k_contiguous),
                u8::from(!c.b.k_contiguous)
            ),
        );
        o.line(d, "}");
        o.line(d, "pf_wgmma_commit();");
    }
}
