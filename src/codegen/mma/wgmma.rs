//! The `wgmma` step (sm_90a): one `wgmma` per 16 of k for each
//! warpgroup's 64 rows, reading both operands from shared memory through
//! descriptors; the emulation calls `pf_emu_wgmma` with the same
//! descriptors' fields, for every warpgroup in turn.

use super::engine::Engine;
use super::wgmma_fields;
use super::writer::Lines;
use crate::frontend::ast::DType;
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
        let (tm, tn, tk, sa, sb) = (self.tm, self.tn, self.tk, self.sa, self.sb);
        let (ba, bb) = (&self.ba, &self.bb);
        let bf16 = c.dtype == DType::BF16;
        let a_mn = !c.a.k_contiguous;
        let b_mn = !c.b.k_contiguous;
        // Start in elements of operand `mn` at 64-row group `group` of its
        // stage `base`; the other fields of the descriptors from
        // `wgmma_fields`.
        let start = |base: String, mn: bool, group: &str| -> String {
            if mn {
                format!("{base} + {group} * {} + pf_ks * {}", tk * 64, 16 * 64)
            } else {
                format!("{base} + {group} * {} + pf_ks * 16", 64 * 64)
            }
        };
        let (a_lbo, b_lbo, _, narrow) = wgmma_fields(c);
        let a_start = start(format!("pf_stage * {sa}"), a_mn, "pf_wg");
        // A narrow B (the 64-byte swizzle, 32 wide): 16 lines of 64 bytes
        // per 16 of k, one group along n.
        let b_start = if narrow {
            format!("pf_stage * {sb} + pf_ks * {}", 16 * 32)
        } else {
            start(format!("pf_stage * {sb}"), b_mn, "0")
        };
        let b_span = if narrow { 32 } else { 64 };
        if self.emulated() {
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
                    "pf_emu_wgmma(&pf_acc[pf_wg * 128][0][0][0], {}, {ba}, 2L * ({a_start}), {}, {a_lbo}, 64, {bb}, 2L * ({b_start}), {}, {b_lbo}, {b_span}, {tn}, {});",
                    tn / 2,
                    i32::from(a_mn),
                    i32::from(b_mn),
                    i32::from(bf16),
                ),
            );
            return;
        }
        let ty = if bf16 { "bf16" } else { "f16" };
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
        o.line(
            d + 1,
            format!(
                "pf_wgmma_{ty}_n{tn}_t{}{}(&pf_acc[0][0][0], pf_da, pf_db);",
                u8::from(a_mn),
                u8::from(b_mn)
            ),
        );
        o.line(d, "}");
        o.line(d, "pf_wgmma_commit();");
    }
}
