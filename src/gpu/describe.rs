//! The gpu stage's kernel plans as text, for its dump (`POLYFUSE_DUMP=gpu`):
//! per kernel its launch on one line, then one line per decision the
//! mapping made (shared copies, the register tile and its engine, private
//! arrays, lanes, the attention and its second kernel); and the kernels'
//! arguments and host loops for the `kernels` stage's. The plans' `Debug`
//! output prints every field and every isl expression on one line, which
//! hides the decision one is looking for; this prints what a reader of the
//! CUDA would want to know first, and `Debug` stays for the rest.

use std::fmt;

use super::attention::{Attention, ScoreScale};
use super::contraction::{Accumulation, Contraction};
use super::lanes::{LaneAxis, LaneLoop, State};
use super::mapping::{AttentionPlan, CombineKernel, KernelBody, KernelPlan, Registers, ThreadPlan};
use super::private::PrivateRegion;
use super::promote::Promotion;
use super::registers::RegisterTile;
use super::stores::Stores;
use super::tma::TmaOperand;
use super::{HostLoop, KernelArg};
use crate::isl::ast::{c_expr, Expr};

/// `[a, b, c]`.
fn list<T: fmt::Display>(items: &[T]) -> String {
    let parts: Vec<String> = items.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// `[e, ...]`, each expression in C as the launch computes it.
fn exprs(items: &[Expr]) -> String {
    let name = |n: &str| n.to_string();
    let parts: Vec<String> = items.iter().map(|e| c_expr(e, &name)).collect();
    format!("[{}]", parts.join(", "))
}

/// `32x32`: a box's sizes.
fn sizes(s: &[i64]) -> String {
    let parts: Vec<String> = s.iter().map(|x| x.to_string()).collect();
    parts.join("x")
}

impl fmt::Display for KernelPlan {
    /// The launch, then the body's decisions, a line each.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: grid {}, block {}, shared {} B dynamic, {} B static",
            self.mark,
            exprs(&self.grid),
            list(&self.block),
            self.dynamic_shared,
            self.static_shared
        )?;
        if let Some(n) = self.min_blocks {
            write!(f, ", launch bounds for {n} blocks a multiprocessor")?;
        }
        writeln!(f)?;
        for (axis, _) in self.reversed.iter().enumerate().filter(|(_, r)| **r) {
            writeln!(
                f,
                "  blocks along {} start at the last tile (the heaviest)",
                ['x', 'y', 'z'][axis]
            )?;
        }
        match &self.body {
            KernelBody::Threads(t) => threads(f, t),
            KernelBody::Attention(a) => attention(f, a),
        }
    }
}

/// A kernel whose tree is mapped to blocks and threads.
fn threads(f: &mut fmt::Formatter<'_>, t: &ThreadPlan) -> fmt::Result {
    writeln!(f, "  body: threads")?;
    if t.reduce_x {
        writeln!(f, "  reductions across threadIdx.x")?;
    }
    for p in t.scope.iter().flat_map(|s| &s.arrays) {
        shared(f, p)?;
    }
    match &t.registers {
        Some(Registers::Tile(tile)) => registers(f, tile, "the SIMT cores")?,
        Some(Registers::TensorCores { tile, contraction }) => {
            registers(f, tile, "tensor cores")?;
            tensor_cores(f, contraction)?;
        }
        None => {}
    }
    for region in &t.private {
        private(f, region)?;
    }
    for (k, l) in t.lanes.iter().flatten().enumerate() {
        lane_loop(f, k, l)?;
    }
    if let LaneAxis::Y(c) = &t.lane_axis {
        writeln!(
            f,
            "  columns: {} rows a block along x, {} lanes a row along y",
            c.rows, c.lanes
        )?;
    }
    Ok(())
}

/// A copy of a tensor's tile in shared memory.
fn shared(f: &mut fmt::Formatter<'_>, p: &Promotion) -> fmt::Result {
    write!(
        f,
        "  shared {}: {} {} at {} in {}, pitch {}, {} stage(s)",
        p.tensor,
        p.dtype,
        sizes(&p.sizes),
        exprs(&p.offset),
        p.buffer,
        list(&p.layout.pitch),
        p.layout.stages
    )?;
    if p.vector4 {
        write!(f, ", 16-byte loads")?;
    }
    writeln!(f)
}

/// The tensor a thread keeps in registers, and how its loops are printed.
fn registers(f: &mut fmt::Formatter<'_>, t: &RegisterTile, engine: &str) -> fmt::Result {
    writeln!(
        f,
        "  registers {}: {} in {}, thread tiles {} on {}, groups of {}",
        t.tensor,
        t.dtype,
        t.buffer,
        list(&t.thread_tiles),
        engine,
        t.vector
    )?;
    if let Some(init) = &t.init {
        writeln!(
            f,
            "  init {} hoisted: the registers start at the identity of {}",
            init.statement,
            init.reducer.symbol()
        )?;
    }
    if let Some(n) = t.unrolled_steps {
        writeln!(f, "  step loops of at most {n} steps unrolled")?;
    }
    if !t.store.is_empty() {
        let names: Vec<&str> = t.store.iter().map(|s| s.statement.as_str()).collect();
        writeln!(f, "  at the registers' store: {}", names.join(", "))?;
    }
    Ok(())
}

/// A contraction run on tensor cores.
fn tensor_cores(f: &mut fmt::Formatter<'_>, c: &Contraction) -> fmt::Result {
    write!(
        f,
        "  contraction {}: {} x {} over {}, {}, tile {}, warps {}, {} stage(s), split {}, {}",
        c.statement,
        c.m,
        c.n,
        c.k,
        c.dtype,
        list(&c.tile),
        list(&c.warps),
        c.stages,
        c.split,
        if c.wgmma { "wgmma" } else { "mma.sync" }
    )?;
    if !c.batch.is_empty() {
        write!(f, ", batch {}", list(&c.batch))?;
    }
    if !c.epilogue.is_empty() {
        let names: Vec<&str> = c.epilogue.iter().map(|e| e.statement.as_str()).collect();
        write!(f, ", epilogue {}", names.join(", "))?;
    }
    if let Accumulation::Promoted { k_tiles } = c.accumulation {
        write!(
            f,
            ", sums added in IEEE f32 every {} of k ({k_tiles} k tiles; an f32 store)",
            k_tiles * c.tile[2]
        )?;
    }
    writeln!(f)?;
    if let Some(ops) = c.copies.tma() {
        tma_copies(f, ops)?;
    }
    if let Stores::Staged { pitch, piece } = c.stores {
        writeln!(
            f,
            "  stores of {} through shared memory: {} rows of {pitch}, copied out {piece} elements a thread",
            c.stored, c.tile[0]
        )?;
    }
    Ok(())
}

/// Tiles copied by the copy engine: each operand's map, box (times the
/// boxes of a stage) and swizzle.
fn tma_copies(f: &mut fmt::Formatter<'_>, ops: &[TmaOperand]) -> fmt::Result {
    let parts: Vec<String> = ops
        .iter()
        .map(|o| {
            format!(
                "{} dims {} box {} x {} ({}-byte swizzle)",
                o.map.tensor,
                list(&o.map.dims),
                list(&o.map.boxes),
                o.boxes,
                o.map.swizzle
            )
        })
        .collect();
    writeln!(f, "  copies by the copy engine (TMA): {}", parts.join("; "))
}

/// Tensors kept in registers inside a region's thread loops.
fn private(f: &mut fmt::Formatter<'_>, r: &PrivateRegion) -> fmt::Result {
    for a in &r.arrays {
        let moves = match (a.load, a.store) {
            (true, true) => "loaded and stored",
            (true, false) => "loaded",
            (false, true) => "stored",
            (false, false) => "neither loaded nor stored",
        };
        writeln!(
            f,
            "  private {} at {}: {} {} in {}, {moves}",
            a.tensor,
            r.mark,
            a.dtype,
            sizes(&a.sizes),
            a.buffer
        )?;
    }
    Ok(())
}

/// One loop of a row run across the lanes, and what its lanes combine.
fn lane_loop(f: &mut fmt::Formatter<'_>, k: usize, l: &LaneLoop) -> fmt::Result {
    let extent = l.extent.map_or("unknown".to_string(), |e| e.to_string());
    write!(f, "  lanes_{k}: extent {extent}")?;
    if let Some(states) = &l.states {
        let parts: Vec<String> = states
            .iter()
            .map(|(name, s)| match s {
                State::Reduce(r) => format!("{name} ({})", r.symbol()),
                State::Cache { of } => format!("{name} (cache of {of})"),
                State::Target { reducer, .. } => format!("{name} (rolling, {})", reducer.symbol()),
            })
            .collect();
        write!(f, ", combines {}", parts.join(", "))?;
    }
    writeln!(f)
}

/// A rolling attention on tensor cores, and its second kernel if split.
fn attention(f: &mut fmt::Formatter<'_>, p: &AttentionPlan) -> fmt::Result {
    let a: &Attention = &p.attention;
    let batch: Vec<String> = a.batch.iter().map(|(n, e)| format!("{n}={e}")).collect();
    writeln!(
        f,
        "  body: attention {}: {} rows x {} keys, depth {}, {}, batch {}, {} of {} rolled into {}",
        a.score,
        a.rows,
        a.keys,
        a.depth,
        a.dtype,
        list(&batch),
        a.reducer.symbol(),
        a.pred,
        a.cache
    )?;
    if let Some(s) = &a.split {
        writeln!(
            f,
            "  split along {}: {} slices of {}",
            s.slice, s.slices, s.len
        )?;
    }
    if let Some(s) = &p.score_scale {
        score_scale(f, s)?;
    }
    if let Some(c) = &p.combine {
        combine(f, c)?;
    }
    if !p.copies.is_empty() {
        tma_copies(f, &p.copies)?;
    }
    Ok(())
}

/// The constant the scores are scaled by.
fn score_scale(f: &mut fmt::Formatter<'_>, s: &ScoreScale) -> fmt::Result {
    write!(f, "  scores {} scaled by {}", s.scaled, s.factor)?;
    if s.folded {
        write!(f, ", outside the maximum's loop")?;
    }
    writeln!(f)
}

/// A split attention's second kernel.
fn combine(f: &mut fmt::Formatter<'_>, c: &CombineKernel) -> fmt::Result {
    writeln!(
        f,
        "  then {}: grid {}, block {}",
        c.name,
        exprs(&c.grid),
        list(&c.block)
    )
}

impl fmt::Display for KernelArg {
    /// `tensor X: f32[N, D]`, `param N`, `step t`: an argument as the
    /// kernels take it (the `kernels` stage's dump).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelArg::Tensor { name, dtype, shape } => {
                write!(f, "tensor {name}: {dtype}[{}]", shape.join(", "))
            }
            KernelArg::Param { name } => write!(f, "param {name}"),
            KernelArg::Step { name } => write!(f, "step {name}"),
        }
    }
}

impl fmt::Display for HostLoop {
    /// The loop as C, and the kernels each iteration launches.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |n: &str| n.to_string();
        write!(
            f,
            "for ({} = {}; {}; {} += {}) kernels {}..{}, mark {}",
            self.iterator,
            c_expr(&self.init, &name),
            c_expr(&self.cond, &name),
            self.iterator,
            c_expr(&self.inc, &name),
            self.first,
            self.end,
            self.step.mark()
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::frontend::ast::DType;
    use crate::gpu::test_support::Analysed;
    use crate::gpu::{GpuOptions, KernelArg};

    #[test]
    fn kernel_arguments_read_as_declarations() {
        let tensor = KernelArg::Tensor {
            name: "X".into(),
            dtype: DType::F16,
            shape: vec!["N".into(), "D - 1".into()],
        };
        assert_eq!(tensor.to_string(), "tensor X: f16[N, D - 1]");
        assert_eq!(KernelArg::Param { name: "N".into() }.to_string(), "param N");
        assert_eq!(KernelArg::Step { name: "t".into() }.to_string(), "step t");
    }

    /// examples/gemm.json's one kernel: a register tile on the SIMT cores
    /// reading shared copies of A and B, each decision on its own line.
    #[test]
    fn a_gemm_plan_reads_a_decision_a_line() {
        let a = Analysed::new(include_str!("../../examples/gemm.json"));
        let options = GpuOptions {
            block: vec![16, 16],
            ..GpuOptions::default()
        };
        let plans = a.plans(&[32, 32, 32], &options);
        let text: String = plans.iter().map(|p| p.to_string()).collect();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("kernel_0: grid [")
                && lines[0].contains("block [16, 16, 1], shared 0 B dynamic"),
            "{text}"
        );
        assert_eq!(lines[1], "  body: threads", "{text}");
        for line in [
            "  shared A: f32 32x32 at [c0, c2]",
            "  shared B: f32 32x32 at [c2, c1]",
            "  registers C: f32 in pf_reg_kernel_0_C, thread tiles [32, 32] on the SIMT cores",
            "  init S0_init hoisted: the registers start at the identity of +",
        ] {
            assert!(
                lines.iter().any(|l| l.starts_with(line)),
                "no line `{line}` in:\n{text}"
            );
        }
        assert!(!text.contains("Some("), "Debug output leaked:\n{text}");
    }

    /// examples/gemm_f16.json stores its f16 product as f32; at K = 1600
    /// (longer than one run) the tensor-core line says how often its sums
    /// are added in IEEE f32.
    #[test]
    fn a_promoted_contraction_says_how_often_it_adds_its_sums() {
        let json =
            include_str!("../../examples/gemm_f16.json").replace("\"K\": 160", "\"K\": 1600");
        let a = Analysed::new(&json);
        for (tile, every) in [
            ([64, 64, 64], "every 128 of k (2 k tiles"),
            ([32, 32, 32], "every 128 of k (4 k tiles"),
        ] {
            let plans = a.plans(&tile, &GpuOptions::default());
            let text: String = plans.iter().map(|p| p.to_string()).collect();
            assert!(
                text.contains(&format!("sums added in IEEE f32 {every}; an f32 store)")),
                "{tile:?}:\n{text}"
            );
        }
    }
}
