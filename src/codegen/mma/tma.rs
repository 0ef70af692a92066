//! The pipeline along the reduction when the copy engine makes the
//! operand copies (`gpu::tma`): S stages, each with a full barrier (one
//! arrival, the producing thread's, and the bytes of its boxes) and an
//! empty barrier (one arrival per warp once its `wgmma` on the stage is
//! done). Thread 0 is the producer: it fills every stage before the first
//! step, and refills the stage of step `t - 1` with tile `t - 1 + S` at
//! step `t`, after waiting for that stage's empty barrier. Every thread
//! waits for a stage's full barrier before its `wgmma` on it.
//!
//! A barrier's phase flips each time it completes; a thread waits for the
//! phase it last saw to end (`try_wait.parity`). The phases each thread
//! expects next are bits of `pf_full_MARK` (stage s: bit s) and, for the
//! producer, `pf_empty_MARK`, declared once per kernel with the barriers
//! (`declare`), so a block's later tiles continue where its earlier ones
//! left the barriers. A stage is released only where it is refilled, so
//! every empty phase has its wait. In the emulation the same code runs in
//! program order: a copy completes when it is issued, and a wait on a
//! phase that has not ended stops the program (on the GPU it would wait
//! forever).

use super::engine::Engine;
use super::writer::Lines;
use crate::gpu::tma::TmaOperand;
use crate::gpu::TensorMap;

/// The barriers', phases' and maps' names of region `mark`.
pub(super) fn barriers(mark: &str) -> String {
    format!("pf_bar_{mark}")
}

fn full_phases(mark: &str) -> String {
    format!("pf_full_{mark}")
}

fn empty_phases(mark: &str) -> String {
    format!("pf_empty_{mark}")
}

/// The kernel parameter of operand `which` (0: A, 1: B)'s tensor map.
pub fn map_param(which: usize) -> &'static str {
    ["pf_map_a", "pf_map_b"][which]
}

/// The barriers and phases of a region with `stages` stages and `warps`
/// warps, declared (and, by thread 0, initialised) at the kernel's start.
pub fn declare_barriers(mark: &str, stages: i64, warps: i64, emulate: bool, pad: &str) -> String {
    let (bar, full, empty) = (barriers(mark), full_phases(mark), empty_phases(mark));
    if emulate {
        format!(
            "{pad}static pf_emu_mbar {bar}[{}];\n\
             {pad}unsigned {full} = 0, {empty} = 0;\n\
             {pad}for (int pf_s = 0; pf_s < {stages}; pf_s++) {{ pf_emu_mbar_init(&{bar}[pf_s], 1); pf_emu_mbar_init(&{bar}[{stages} + pf_s], {warps}); }}\n",
            2 * stages
        )
    } else {
        format!(
            "{pad}#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             {pad}__shared__ __align__(8) unsigned long long {bar}[{}];\n\
             {pad}unsigned {full} = 0, {empty} = 0;\n\
             {pad}if (threadIdx.x == 0) {{\n\
             {pad}  for (int pf_s = 0; pf_s < {stages}; pf_s++) {{ pf_mbar_init(&{bar}[pf_s], 1); pf_mbar_init(&{bar}[{stages} + pf_s], {warps}); }}\n\
             {pad}  asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n\
             {pad}}}\n\
             {pad}__syncthreads();\n\
             {pad}#endif\n",
            2 * stages
        )
    }
}

/// The coordinates along `map`'s dimensions (contiguous first) of the
/// element at offset `at` (a C variable, elements from the tensor's
/// start), each declared as `{prefix}{d}`, except dimension `skip` (one
/// the caller sets itself): the offset's digits in the tensor's extents.
/// The element must lie inside the tensor.
pub fn coordinate_lines(
    map: &TensorMap,
    at: &str,
    prefix: &str,
    skip: Option<usize>,
) -> Vec<String> {
    let mut elements = 1u64;
    let mut lines = Vec::new();
    for (d, extent) in map.dims.iter().enumerate() {
        if Some(d) != skip {
            lines.push(format!(
                "const int {prefix}{d} = (int)(({at} / {elements}) % {extent});"
            ));
        }
        elements *= extent;
    }
    lines
}

/// One box's copy of `map` (the kernel's parameter `param`) into `dst` at
/// `coords` (map dimensions, contiguous first), counted on barrier `bar`
/// (an address): the TMA instruction on the GPU; in the emulation its
/// model, the box read from the tensor at the map's extents and pitches,
/// zeros past them, written in the swizzle, and its bytes completed on the
/// barrier.
pub fn box_copy(
    map: &TensorMap,
    param: &str,
    dst: &str,
    bar: &str,
    coords: &[String],
    emulate: bool,
) -> String {
    let rank = map.dims.len();
    if emulate {
        let list = |v: Vec<String>| v.join(", ");
        let pitches: Vec<String> = std::iter::once("1".to_string())
            .chain(map.strides.iter().map(|s| (s / 2).to_string()))
            .collect();
        format!(
            "pf_emu_tma_load({dst}, {}, {rank}, (const long[]){{{}}}, (const long[]){{{}}}, (const long[]){{{}}}, (const long[]){{{}}}, {}, {bar});",
            crate::codegen::expr::tensor_name(&map.tensor),
            list(map.dims.iter().map(u64::to_string).collect()),
            list(pitches),
            list(map.boxes.iter().map(u32::to_string).collect()),
            list(coords.to_vec()),
            map.swizzle
        )
    } else {
        format!(
            "pf_tma_load{rank}({dst}, &{param}, {bar}, {});",
            coords.join(", ")
        )
    }
}

impl Engine<'_, '_> {
    /// The copy engine's operands, where it makes this engine's copies
    /// (the `wgmma` engine of the update's own reduction).
    pub(super) fn tma_operands(&self) -> Option<&[TmaOperand; 2]> {
        if self.wg && self.term == 0 {
            self.c.copies.tma()
        } else {
            None
        }
    }

    /// The pipeline: each operand's coordinates at the block's tile, the
    /// producer's first copies, the main loop and the drain.
    pub(super) fn tma_pipeline(&self, o: &mut Lines, ops: &[TmaOperand; 2]) {
        self.tma_origins(o, ops);
        let (st, tk) = (self.c.stages, self.tk);
        let gpu = !self.emulated();
        if gpu {
            o.line(1, "if (pf_tid == 0) {");
        } else {
            o.line(1, "{");
        }
        for s in 0..st {
            o.line(2, format!("if (pf_kb + {} < pf_ke) {{", s * tk));
            self.tma_stage(o, 3, ops, &s.to_string(), &format!("pf_kb + {}", s * tk));
            o.line(2, "}");
        }
        o.line(1, "}");
        self.tma_main_loop(o);
        if gpu {
            // Every copy issued was waited for: only the tensor cores may
            // still read the stages the next tile's copies overwrite.
            o.line(1, "pf_wgmma_wait0();");
            o.line(1, "__syncthreads();");
        }
    }

    /// `pf_X_cD`: operand X's coordinate along map dimension D at the
    /// block's first row and `k` = 0, from the element's offset in its
    /// tensor (the map's dimensions are the tensor's, contiguous first).
    fn tma_origins(&self, o: &mut Lines, ops: &[TmaOperand; 2]) {
        let r = self.region;
        for (which, op) in ops.iter().enumerate() {
            let (name, address, row) = if which == 0 {
                ("A", r.a_address, &r.origin[0])
            } else {
                ("B", r.b_address, &r.origin[1])
            };
            let base = crate::codegen::expr::tensor_name(&op.map.tensor);
            o.line(
                1,
                format!(
                    "const long pf_{name}_at = (long)({} - {base});",
                    address(row, "0")
                ),
            );
            let at = format!("pf_{name}_at");
            for line in coordinate_lines(&op.map, &at, &format!("pf_{name}_c"), Some(op.k_dim)) {
                o.line(1, line);
            }
        }
    }

    /// The producer's copies of the k tile at `k` into stage `stage`: the
    /// bytes expected on its full barrier, then every box of both operands.
    fn tma_stage(&self, o: &mut Lines, d: usize, ops: &[TmaOperand; 2], stage: &str, k: &str) {
        let bar = barriers(self.region.mark);
        let bytes: i64 = ops.iter().map(TmaOperand::stage_bytes).sum();
        if self.emulated() {
            o.line(
                d,
                format!("pf_emu_mbar_expect_tx(&{bar}[{stage}], {bytes});"),
            );
        } else {
            o.line(d, format!("pf_mbar_expect_tx(&{bar}[{stage}], {bytes});"));
        }
        for (which, op) in ops.iter().enumerate() {
            let (name, buffer, tile) = if which == 0 {
                ("A", &self.ba, &self.tiles.a)
            } else {
                ("B", &self.bb, &self.tiles.b)
            };
            for j in 0..op.boxes {
                let coords: Vec<String> = (0..op.map.dims.len())
                    .map(|dim| {
                        if dim == op.k_dim {
                            format!("(int)({k})")
                        } else if dim == op.row_dim && j > 0 {
                            format!("pf_{name}_c{dim} + {}", j * op.span())
                        } else {
                            format!("pf_{name}_c{dim}")
                        }
                    })
                    .collect();
                let dst = format!(
                    "&{buffer}[({stage}) * {} + {}]",
                    tile.stage_len,
                    j * op.box_len
                );
                let bar = format!("&{bar}[{stage}]");
                let load = box_copy(
                    &op.map,
                    map_param(which),
                    &dst,
                    &bar,
                    &coords,
                    self.emulated(),
                );
                o.line(d, load);
            }
        }
    }

    /// The main loop, unrolled by the stages (every stage index a
    /// constant): wait for the stage, the `wgmma` step, the waits of the
    /// step before, and the release and refill of that step's stage.
    fn tma_main_loop(&self, o: &mut Lines) {
        let (st, tk) = (self.c.stages, self.tk);
        let gpu = !self.emulated();
        let mark = self.region.mark;
        let (bar, full) = (barriers(mark), full_phases(mark));
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
        let wait = if gpu {
            "pf_mbar_wait"
        } else {
            "pf_emu_mbar_wait"
        };
        o.line(
            4,
            format!("{wait}(&{bar}[pf_stage], ({full} >> pf_stage) & 1u);"),
        );
        o.line(4, format!("{full} ^= 1u << pf_stage;"));
        self.wgmma_step(o, 4);
        self.wgmma_waits(o, 4);
        if !self.c.whole_k {
            self.tma_refill(o, 4);
        }
        o.line(3, "}");
        o.line(2, "}");
        o.line(1, "}");
    }

    /// The release of the step before's stage (its `wgmma` are done: one
    /// arrival per warp) and, by the producer once every warp has arrived,
    /// its refill with the tile S steps after it; only where there is such
    /// a tile.
    fn tma_refill(&self, o: &mut Lines, d: usize) {
        let Some(ops) = self.tma_operands() else {
            return;
        };
        let (st, tk) = (self.c.stages, self.tk);
        let mark = self.region.mark;
        let (bar, empty) = (barriers(mark), empty_phases(mark));
        let warps = i64::from(self.threads / 32);
        let refill = format!("pf_kt + {}", (st - 1) * tk);
        o.line(
            d,
            format!("const int pf_prev = (pf_u + {}) % {st};", st - 1),
        );
        o.line(d, format!("if (pf_kt > pf_kb && {refill} < pf_ke) {{"));
        if self.emulated() {
            o.line(
                d + 1,
                format!("for (int pf_w = 0; pf_w < {warps}; pf_w++) pf_emu_mbar_arrive(&{bar}[{st} + pf_prev]);"),
            );
            o.line(
                d + 1,
                format!("pf_emu_mbar_wait(&{bar}[{st} + pf_prev], ({empty} >> pf_prev) & 1u);"),
            );
            o.line(d + 1, format!("{empty} ^= 1u << pf_prev;"));
            self.tma_stage(o, d + 1, ops, "pf_prev", &refill);
        } else {
            o.line(d + 1, "__syncwarp();");
            o.line(
                d + 1,
                format!("if (pf_tid % 32 == 0) pf_mbar_arrive(&{bar}[{st} + pf_prev]);"),
            );
            o.line(d + 1, "if (pf_tid == 0) {");
            o.line(
                d + 2,
                format!("pf_mbar_wait(&{bar}[{st} + pf_prev], ({empty} >> pf_prev) & 1u);"),
            );
            o.line(d + 2, format!("{empty} ^= 1u << pf_prev;"));
            self.tma_stage(o, d + 2, ops, "pf_prev", &refill);
            o.line(d + 1, "}");
        }
        o.line(d, "}");
    }
}
