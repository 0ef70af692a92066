//! The reduction split over the blocks of a cluster (`Contraction::split`):
//! each block's range of k tiles, its rank (the block's own on the GPU, a
//! loop over the blocks in the emulation), and the sum of the partial
//! tiles before the stores.

use super::engine::Engine;
use super::writer::Lines;

impl Engine<'_, '_> {
    /// This block's range of k tiles, `pf_kb .. pf_ke`: the k tiles in
    /// `pf_ranks` runs of equal length (the last one shorter), the block's
    /// rank in its cluster picking one.
    pub(super) fn k_range(&self, o: &mut Lines, d: usize) {
        let tk = self.tk;
        if self.split > 1 {
            o.line(
                d,
                format!("const pf_i pf_kc = ((pf_ek + {tk} - 1) / {tk} + pf_ranks - 1) / pf_ranks * {tk};"),
            );
            o.line(d, "const pf_i pf_kb = pf_rank * pf_kc;");
            o.line(d, "const pf_i pf_ke = pf_min(pf_ek, pf_kb + pf_kc);");
        } else {
            o.line(d, "const pf_i pf_kb = 0, pf_ke = pf_ek;");
        }
    }

    /// On the GPU, the block's rank in its cluster, and the test that
    /// opens the rest of the region. On GPUs without clusters (before
    /// sm_90) the kernel is launched with the same grid: the block of
    /// rank 0 runs all of k and the others have nothing to do.
    pub(super) fn cluster_rank(&self, o: &mut Lines) {
        let split = self.split;
        if split == 1 {
            return;
        }
        o.line(
            1,
            format!("/* k split over the {split} blocks of a cluster */"),
        );
        o.line(1, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900");
        o.line(1, format!("const int pf_ranks = {split};"));
        o.line(1, "const int pf_rank = pf_cluster_rank();");
        o.line(1, "#else");
        o.line(1, "const int pf_ranks = 1, pf_rank = 0;");
        o.line(1, "#endif");
        o.line(1, "if (pf_ranks > 1 || blockIdx.z == 0) {");
    }

    /// In the emulation, the blocks of a cluster one after the other, each
    /// leaving its partial tile in its (emulated) shared memory.
    pub(super) fn open_rank_loop(&self, o: &mut Lines) {
        let split = self.split;
        if split == 1 {
            return;
        }
        o.line(
            1,
            format!(
                "static float pf_part[{split}][{}];",
                i64::from(self.threads) * self.mt * self.nt * 4
            ),
        );
        self.rank_loop(o);
        self.k_range(o, 1);
    }

    /// The emulation's loop over the cluster's ranks, from the last.
    fn rank_loop(&self, o: &mut Lines) {
        let split = self.split;
        o.line(
            1,
            format!(
                "for (int pf_rank = {}; pf_rank >= 0; pf_rank--) {{",
                split - 1
            ),
        );
        o.line(1, format!("const int pf_ranks = {split};"));
    }

    /// A register's place in a partial tile (its thread's registers
    /// `threads` floats apart, so that a warp's accesses are consecutive).
    fn part_index(&self) -> String {
        format!(
            "((pf_mt * {} + pf_nt) * 4 + pf_r) * {} + pf_tid",
            self.nt, self.threads
        )
    }

    /// Whether this block owns a register in a split: pairs of registers
    /// (neighbours along n, stored together) dealt out in turn.
    pub(super) fn owner(&self) -> String {
        format!(
            "((pf_mt * {} + pf_nt) * 2 + pf_r / 2) % pf_ranks == pf_rank",
            self.nt
        )
    }

    /// `body` for each of the thread's registers.
    fn registers(&self, o: &mut Lines, d: usize, body: &str) {
        for (var, count) in [("pf_mt", self.mt), ("pf_nt", self.nt), ("pf_r", 4)] {
            self.target.unroll(o, d);
            o.line(d, format!("for (int {var} = 0; {var} < {count}; {var}++)"));
        }
        o.line(d + 1, body);
    }

    /// A split's partial tiles meet: each block writes its registers to
    /// its shared memory (the pipeline's stages are free now), and after
    /// the cluster's barrier sums, for the registers it owns, the partials
    /// of all the cluster's blocks in rank order (the same order whatever
    /// the timing: the result does not vary from run to run); a second
    /// barrier keeps every block's shared memory alive until the others
    /// have read it. The emulation runs the ranks' loop to its end, sums
    /// every register at once (each is owned by one block), and opens the
    /// loop again for the stores.
    pub(super) fn sum_partials(&self, o: &mut Lines) {
        let split = self.split;
        if split == 1 {
            return;
        }
        let acc = self.target.accumulator();
        let part = self.part_index();
        if self.emulated() {
            let d = self.target.open_threads(o, 1, self.threads);
            self.registers(o, d, &format!("pf_part[pf_rank][{part}] = {acc};"));
            o.line(1, "}");
            o.line(1, "}");
            // Every register is owned by one block: all sums at once.
            let d = self.target.open_threads(o, 1, self.threads);
            self.registers(
                o,
                d,
                &format!(
                    "{{ float pf_sum = 0.0f; for (int pf_q = 0; pf_q < {split}; pf_q++) pf_sum += pf_part[pf_q][{part}]; {acc} = pf_sum; }}"
                ),
            );
            o.line(1, "}");
            self.rank_loop(o);
        } else {
            let owner = self.owner();
            o.line(1, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900");
            o.line(1, "if (pf_ranks > 1) {");
            o.line(2, "float *const pf_part = (float *)pf_dynamic_shared;");
            self.registers(o, 2, &format!("pf_part[{part}] = {acc};"));
            o.line(2, "pf_cluster_sync();");
            self.registers(
                o,
                2,
                &format!(
                    "if ({owner}) {{ float pf_sum = 0.0f; for (int pf_q = 0; pf_q < {split}; pf_q++) pf_sum += pf_cluster_load(&pf_part[{part}], pf_q); {acc} = pf_sum; }}"
                ),
            );
            o.line(2, "pf_cluster_sync();");
            o.line(1, "}");
            o.line(1, "#endif");
        }
    }
}
