//! The `cp.async` pipeline along the reduction, S stages deep: the first
//! tiles copied ahead, then at each step a wait for the oldest tile, the
//! engine's step on it and the copy of the tile ahead into the stage freed
//! last; at the end the drain that leaves no copy in flight.

use super::engine::Engine;
use super::writer::Lines;

impl Engine<'_, '_> {
    /// Tiles copied ahead: S - 1 for mma.sync, which is done with a stage
    /// once the barrier of the next step has passed; S - 2 for wgmma,
    /// whose instructions run on past their step (each warpgroup waits
    /// only for the step before), so the stage of step t - 2 is the one
    /// free to overwrite at step t. Every k tile its own stage
    /// (`whole_k`): all S copied first, none refilled.
    fn tiles_ahead(&self) -> i64 {
        let st = self.c.stages;
        if self.c.whole_k {
            st
        } else if self.wg {
            st - 2
        } else {
            st - 1
        }
    }

    /// The pipeline: the chunks' setup (on the GPU, once), the prologue's
    /// copies, the main loop and the drain.
    pub(super) fn pipeline(&self, o: &mut Lines) {
        if let Some(ops) = self.tma_operands() {
            return self.tma_pipeline(o, ops);
        }
        if !self.emulated() {
            self.setup_chunks(o, 1);
        }
        self.prologue(o);
        self.main_loop(o);
        if !self.emulated() {
            if self.wg {
                o.line(1, "pf_wgmma_wait0();");
            }
            // No copy may still be in flight into shared memory when the
            // block's next tile (a cyclic grid) starts its prologue.
            o.line(1, "pf_cp_async_wait<0>();");
            o.line(1, "__syncthreads();");
        }
    }

    /// The tiles copied before the first step, one `cp.async` group each
    /// (empty past the block's range, so that the count the waits assume
    /// holds).
    fn prologue(&self, o: &mut Lines) {
        let (tk, dist) = (self.tk, self.tiles_ahead());
        let gpu = !self.emulated();
        // Whole tiles with every chunk aligned and inside (a test that
        // does not change along k): the first tiles' copies in a loop of
        // their own, free of the per-chunk tests and of the general path.
        // Measured on the H100 (128 x 1024 x 1024 f16, 16 stages, the
        // kernel edited by hand, 20 launches in a CUDA graph): 4.84 ->
        // 4.20 us. The CPU emulation runs the loop below, whose fast
        // branches make the same copies.
        let hoisted = if self.region.full_tiles && gpu {
            self.fast_copies()
        } else {
            None
        };
        if let Some(fast) = &hoisted {
            o.line(1, "if (pf_A_all && pf_B_all) {");
            if self.c.whole_k {
                o.line(2, "#pragma unroll 1");
            } else {
                o.line(2, "#pragma unroll");
            }
            o.line(2, format!("for (int pf_s = 0; pf_s < {dist}; pf_s++) {{"));
            o.line(3, format!("if (pf_kb + pf_s * {tk} < pf_ke) {{"));
            for (dst, src) in fast {
                o.line(4, format!("pf_cp_async16_full({dst}, {src});"));
            }
            o.line(3, "}");
            o.line(3, "pf_cp_async_commit();");
            o.line(2, "}");
            o.line(1, "} else {");
        }
        if self.c.whole_k {
            // One copy in a loop: the code a block runs once stays small.
            if gpu {
                o.line(1, "#pragma unroll 1");
            }
            o.line(1, format!("for (int pf_s = 0; pf_s < {dist}; pf_s++) {{"));
            o.line(2, format!("if (pf_kb + pf_s * {tk} < pf_ke) {{"));
            self.copy(o, 3, "pf_s", &format!("(pf_kb + pf_s * {tk})"));
            o.line(2, "}");
            if gpu {
                o.line(2, "else pf_cp_async_commit();");
            }
            o.line(1, "}");
        } else {
            for s in 0..dist {
                o.line(1, format!("if (pf_kb + {} < pf_ke) {{", s * tk));
                self.copy(o, 2, &s.to_string(), &format!("(pf_kb + {})", s * tk));
                o.line(1, "}");
                if gpu {
                    o.line(1, "else pf_cp_async_commit();");
                }
            }
        }
        if hoisted.is_some() {
            o.line(1, "}");
        }
    }

    /// The main loop, unrolled by the number of stages so that every
    /// stage index (and so every shared address) is a constant; rolled
    /// when every k tile has its own stage (`Contraction::whole_k`).
    fn main_loop(&self, o: &mut Lines) {
        let (st, tk, dist) = (self.c.stages, self.tk, self.tiles_ahead());
        let gpu = !self.emulated();
        o.line(
            1,
            format!(
                "for (pf_i pf_k0 = pf_kb; pf_k0 < pf_ke; pf_k0 += {}) {{",
                st * tk
            ),
        );
        if gpu {
            o.line(
                2,
                if self.c.whole_k {
                    "#pragma unroll 1"
                } else {
                    "#pragma unroll"
                },
            );
        }
        o.line(2, format!("for (int pf_u = 0; pf_u < {st}; pf_u++) {{"));
        o.line(3, format!("const pf_i pf_kt = pf_k0 + pf_u * {tk};"));
        o.line(3, "if (pf_kt < pf_ke) {");
        o.line(4, "const int pf_stage = pf_u;");
        o.line(4, format!("const int pf_next = (pf_u + {dist}) % {st};"));
        if gpu {
            o.line(4, format!("pf_cp_async_wait<{}>();", dist - 1));
            if self.wg {
                // The tensor cores read shared memory through the async
                // proxy: order this thread's copies before them.
                o.line(
                    4,
                    "asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");",
                );
            }
            o.line(4, "__syncthreads();");
        }
        let ahead = dist * tk;
        // wgmma runs asynchronously: its instructions for this stage are
        // issued first and the copy of the tile ahead is issued while the
        // tensor cores work; each warpgroup then waits for the previous
        // step's wgmma only, so this step's runs on across the next
        // barrier. Measured on the H100 (f16 4096^3, 128 x 256 x 64):
        // copying first left the tensor cores idle while the copy was
        // issued (451 us); issuing first and waiting for this step's wgmma
        // at its end (three stages) took 232 us; keeping it in flight
        // (four stages) 222 us.
        if self.wg {
            self.wgmma_step(o, 4);
        }
        if self.c.whole_k {
            // Nothing left to copy: an empty group keeps the count (and so
            // the wait above) the same at every step. No stage is
            // refilled, so the wgmma of every step stays in flight.
            if gpu {
                o.line(4, "pf_cp_async_commit();");
            }
        } else {
            o.line(4, format!("if (pf_kt + {ahead} < pf_ke) {{"));
            self.copy(o, 5, "pf_next", &format!("(pf_kt + {ahead})"));
            o.line(4, "}");
            if gpu {
                // An empty group when there is no tile left keeps the
                // count.
                o.line(4, "else pf_cp_async_commit();");
            }
        }
        if self.wg {
            self.wgmma_waits(o, 4);
        } else {
            self.mma_sync_step(o, 4);
        }
        o.line(3, "}");
        o.line(2, "}");
        o.line(1, "}");
    }

    /// The waits for earlier steps' `wgmma` at the end of a step (GPU): a
    /// promoted run's sums must be complete before they are added (and
    /// before the next run's first step overwrites them), so its last step
    /// waits for its own group and adds it; other steps wait for the step
    /// before only, and with a stage per k tile every step stays in
    /// flight.
    pub(super) fn wgmma_waits(&self, o: &mut Lines, d: usize) {
        if self.emulated() {
            return;
        }
        if let Some((_, last)) = self.promotion_run() {
            o.line(d, format!("if {last} {{"));
            o.line(d + 1, "pf_wgmma_wait0();");
            self.add_part(o, d + 1);
            if !self.c.whole_k {
                o.line(d, "} else {");
                o.line(d + 1, "pf_wgmma_wait1();");
            }
            o.line(d, "}");
        } else if !self.c.whole_k {
            o.line(d, "pf_wgmma_wait1();");
        }
    }
}
