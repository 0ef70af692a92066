//! One engine's region (`mma.sync` or `wgmma`, on the GPU or in the CPU
//! emulation): the shape its sections share, and the order they are
//! printed in. Each section lives in the file named after what it prints
//! (`staging`, `pipeline`, `mma_sync`, `wgmma`, `cluster`, `epilogue`).

use super::target::Target;
use super::writer::Lines;
use super::{buffers, Region};
use crate::frontend::ast::DType;
use crate::gpu::contraction::{Accumulation, Contraction, SharedTiles, MMA_M, MMA_N};

/// The region of one engine, with the sizes every section reads.
#[derive(Clone)]
pub(super) struct Engine<'r, 'a> {
    pub(super) region: &'r Region<'a>,
    pub(super) c: &'a Contraction,
    /// The `wgmma` engine (else `mma.sync`).
    pub(super) wg: bool,
    pub(super) target: Target,
    /// Fragments per warp along `m` and `n` (`wgmma`: one 64-row group,
    /// `tn / 8` accumulator fragments).
    pub(super) mt: i64,
    pub(super) nt: i64,
    /// Warps along `n` (the warp grid's columns).
    pub(super) wn: i64,
    /// The block's tile and a warp's share of it.
    pub(super) tm: i64,
    pub(super) tn: i64,
    pub(super) tk: i64,
    pub(super) wtm: i64,
    pub(super) wtn: i64,
    pub(super) threads: u32,
    /// Blocks of a cluster sharing the reduction (1: no split).
    pub(super) split: i64,
    /// The engine's shared tiles (as the gpu stage laid them out), and
    /// their buffers' names.
    pub(super) tiles: SharedTiles,
    pub(super) ba: String,
    pub(super) bb: String,
    /// Whose reduction loop the copies stage: 0 for the update's, `j` for
    /// `c.terms[j - 1]`'s.
    pub(super) term: usize,
}

impl<'r, 'a> Engine<'r, 'a> {
    pub(super) fn new(region: &'r Region<'a>, wg: bool) -> Self {
        let c = region.c;
        let [mt, nt] = if wg {
            [1, c.tile[1] / MMA_N]
        } else {
            c.fragments()
        };
        let [wm, wn] = c.warps;
        let [tm, tn, tk] = c.tile;
        let (ba, bb) = buffers(region.mark);
        Engine {
            region,
            c,
            wg,
            target: Target::of(region.emulate),
            mt,
            nt,
            wn,
            tm,
            tn,
            tk,
            wtm: tm / wm,
            wtn: tn / wn,
            threads: c.threads(),
            split: c.split,
            tiles: c.shared_tiles(wg),
            ba,
            bb,
            term: 0,
        }
    }

    pub(super) fn emulated(&self) -> bool {
        self.target == Target::Emulation
    }

    /// Each step's (or run of steps') products are summed from zero and
    /// added to the accumulators in IEEE f32 (`Accumulation::Promoted`).
    pub(super) fn promoted(&self) -> bool {
        self.c.accumulation.is_promoted()
    }

    /// A promoted engine's run: `(first, last)`, C conditions true at
    /// the first step of a run of `k_tiles` k tiles (its sums start from
    /// zero) and at its last (they are added), counted from the block's
    /// first k tile; the block's last k tile ends a run too.
    pub(super) fn promotion_run(&self) -> Option<(String, String)> {
        match self.c.accumulation {
            Accumulation::Promoted { k_tiles } => {
                let (tk, span) = (self.tk, k_tiles * self.tk);
                Some((
                    format!("(pf_kt - pf_kb) % {span} == 0"),
                    format!("((pf_kt - pf_kb + {tk}) % {span} == 0 || pf_kt + {tk} >= pf_ke)"),
                ))
            }
            Accumulation::Chained => None,
        }
    }

    /// The region in one block, `depth` levels into the kernel: the
    /// block's tile and range of k, the accumulators' start, the pipeline
    /// (which prints the engine's step), the sum of a split's partial
    /// tiles, and the stores.
    pub(super) fn print(&self, depth: usize) -> String {
        let mut o = Lines::new(depth);
        o.line(0, "{");
        self.header(&mut o);
        // The cluster's ranks: on the GPU the block's own, before its
        // range of k; in the emulation a loop over the blocks, once the
        // accumulators they share are declared.
        if !self.emulated() {
            self.cluster_rank(&mut o);
        }
        if !self.emulated() || self.split == 1 {
            self.k_range(&mut o, 1);
        }
        self.declare_accumulators(&mut o);
        if self.emulated() {
            self.open_rank_loop(&mut o);
        }
        self.start_accumulators(&mut o);
        self.pipeline(&mut o);
        // Further sums into the accumulators (`Contraction::terms`): a
        // pipeline of their own each, over their operands and their range
        // of k (unsplit), after the one before has drained.
        for (j, t) in self.region.terms.iter().enumerate() {
            let statement = &self.c.terms[j].statement;
            o.line(1, format!("{{ /* then {statement}'s sum */"));
            o.line(1, format!("const pf_i pf_ek = {};", t.k_extent));
            o.line(1, "const pf_i pf_kb = 0, pf_ke = pf_ek;");
            Engine {
                term: j + 1,
                ..self.clone()
            }
            .pipeline(&mut o);
            o.line(1, "}");
        }
        self.sum_partials(&mut o);
        self.store(&mut o);
        if self.split > 1 {
            // The rank loop (CPU) or the test of a block's rank (GPU).
            o.line(1, "}");
        }
        o.line(0, "}");
        o.finish()
    }

    /// The region's comment (tiles, warps or warpgroups, stages) and the
    /// block's origin and the domain's extents as `pf_m0`, `pf_n0`,
    /// `pf_em`, `pf_en`, `pf_ek`.
    fn header(&self, o: &mut Lines) {
        let (tm, tn, tk) = (self.tm, self.tn, self.tk);
        let layout = if self.wg {
            format!("{} warpgroups of 64 x {tn} (wgmma.m64n{tn}k16)", tm / 64)
        } else {
            let [wm, wn] = self.c.warps;
            format!(
                "{wm} x {wn} warps of {} x {} (mma.m16n8k16)",
                self.wtm, self.wtn
            )
        };
        o.line(
            1,
            format!(
                "/* tensor cores: {tm} x {tn} x {tk} tiles, {layout} ({} stages) */",
                self.c.stages
            ),
        );
        let r = self.region;
        for (name, value) in [
            ("pf_m0", &r.origin[0]),
            ("pf_n0", &r.origin[1]),
            ("pf_em", &r.extents[0]),
            ("pf_en", &r.extents[1]),
            ("pf_ek", &r.extents[2]),
        ] {
            o.line(1, format!("const pf_i {name} = {value};"));
        }
    }

    /// The accumulators: each thread's registers on the GPU (with its
    /// index), one static array of every thread's in the emulation.
    fn declare_accumulators(&self, o: &mut Lines) {
        let (mt, nt) = (self.mt, self.nt);
        // A promoted run's sums (`pf_step`), the accumulators' shape.
        let part = self.promoted();
        if self.emulated() {
            o.line(
                1,
                format!("static float pf_acc[{}][{mt}][{nt}][4];", self.threads),
            );
            if part {
                o.line(
                    1,
                    format!("static float pf_step[{}][{mt}][{nt}][4];", self.threads),
                );
            }
        } else {
            o.line(1, format!("float pf_acc[{mt}][{nt}][4];"));
            if part {
                o.line(1, format!("float pf_step[{mt}][{nt}][4] = {{}};"));
            }
            o.line(1, "const int pf_tid = (int)threadIdx.x;");
        }
    }

    /// `pf_acc += pf_step`, every register of the thread's (every thread's
    /// in the emulation): a promoted run's sums added in IEEE f32.
    pub(super) fn add_part(&self, o: &mut Lines, d: usize) {
        let (mt, nt) = (self.mt, self.nt);
        let (acc, part) = if self.emulated() {
            o.line(
                d,
                format!("for (int pf_t = 0; pf_t < {}; pf_t++)", self.threads),
            );
            ("pf_acc[pf_t]", "pf_step[pf_t]")
        } else {
            o.line(d, "#pragma unroll");
            ("pf_acc", "pf_step")
        };
        o.line(d, format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"));
        if !self.emulated() {
            o.line(d, "#pragma unroll");
        }
        o.line(d, format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++)"));
        if !self.emulated() {
            o.line(d, "#pragma unroll");
        }
        o.line(d, "for (int pf_r = 0; pf_r < 4; pf_r++)");
        o.line(
            d + 1,
            format!("{acc}[pf_mt][pf_nt][pf_r] += {part}[pf_mt][pf_nt][pf_r];"),
        );
    }

    /// Accumulators: zero, or the output's current values (in the block
    /// of rank 0 of a split).
    fn start_accumulators(&self, o: &mut Lines) {
        let r = self.region;
        let acc = self.target.accumulator();
        // The output's element only where the accumulators start from it:
        // printing it notes the tensor as one the kernel touches, and an
        // accumulator that starts at zero and is moved into another tensor
        // (`Contraction::stored`) is never read or written.
        let load = if r.zero_init {
            String::new()
        } else {
            let element = (r.c_element)("pf_lm", "pf_ln");
            match r.c_dtype {
                DType::F16 => format!("pf_h2f({element})"),
                DType::BF16 => format!("pf_b2f({element})"),
                _ => format!("(float)({element})"),
            }
        };
        let d = self.target.open_threads(o, 1, self.threads);
        self.fragments(o, d, false, |o, d| {
            if r.zero_init {
                o.line(d, format!("{acc} = 0.0f; (void)pf_in;"));
            } else if self.split > 1 {
                o.line(d, format!("{acc} = pf_in && pf_rank == 0 ? {load} : 0.0f;"));
            } else {
                o.line(d, format!("{acc} = pf_in ? {load} : 0.0f;"));
            }
        });
        self.target.close_threads(o, 1);
    }

    /// A loop over the thread's accumulators around `body`, one at a time
    /// (`pf_r` 0 .. 3, with `pf_in` saying whether the element is inside
    /// the output), or (`pairs`) two neighbours along n at a time (`pf_r`
    /// 0 and 2, with `pf_r + 1` at `pf_ln + 1`); inside, the element's
    /// local place in the block's tile, `(pf_lm, pf_ln)`.
    pub(super) fn fragments(
        &self,
        o: &mut Lines,
        d: usize,
        pairs: bool,
        body: impl Fn(&mut Lines, usize),
    ) {
        let (mt, nt) = (self.mt, self.nt);
        self.target.unroll(o, d);
        o.line(d, format!("for (int pf_mt = 0; pf_mt < {mt}; pf_mt++)"));
        self.target.unroll(o, d);
        o.line(d, format!("for (int pf_nt = 0; pf_nt < {nt}; pf_nt++)"));
        self.target.unroll(o, d);
        if pairs {
            o.line(d, "for (int pf_r = 0; pf_r < 4; pf_r += 2) {");
        } else {
            o.line(d, "for (int pf_r = 0; pf_r < 4; pf_r++) {");
        }
        o.line(
            d + 1,
            "const int pf_lane = pf_tid % 32, pf_warp = pf_tid / 32;",
        );
        if self.wg {
            // wgmma's accumulators: warp w of a warpgroup owns rows
            // 16 (w % 4) .. + 15 of the group's 64, in the layout of an
            // m16n8 fragment repeated along n.
            o.line(
                d + 1,
                "const pf_i pf_lm = (pf_warp / 4) * 64 + (pf_warp % 4) * 16 + pf_lane / 4 + (pf_r / 2) * 8;",
            );
            o.line(
                d + 1,
                format!("const pf_i pf_ln = pf_nt * {MMA_N} + (pf_lane % 4) * 2 + pf_r % 2;"),
            );
        } else {
            let (wn, wtm, wtn) = (self.wn, self.wtm, self.wtn);
            o.line(
                d + 1,
                format!(
                    "const pf_i pf_lm = (pf_warp / {wn}) * {wtm} + pf_mt * {MMA_M} + pf_lane / 4 + (pf_r / 2) * 8;"
                ),
            );
            o.line(
                d + 1,
                format!(
                    "const pf_i pf_ln = (pf_warp % {wn}) * {wtn} + pf_nt * {MMA_N} + (pf_lane % 4) * 2 + pf_r % 2;"
                ),
            );
        }
        if !pairs {
            o.line(
                d + 1,
                if self.region.full_tiles {
                    "const int pf_in = 1;"
                } else {
                    "const int pf_in = pf_m0 + pf_lm < pf_em && pf_n0 + pf_ln < pf_en;"
                },
            );
        }
        body(o, d + 1);
        o.line(d, "}");
    }
}
