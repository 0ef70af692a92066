//! The cost model: the time a mapped program is expected to take on the
//! GPU, from what the gpu stage decided (its kernel plans and mapped tree),
//! so that the pipeline can choose between groupings (issue 32) before any
//! code is printed.
//!
//! For kernel `k`, with `W_k` its arithmetic (Σ over its statement
//! instances of `model::count::flops_per_instance`), `Q_k` its global
//! traffic (`gpu::traffic`: each tile's footprints, temps a tile writes and
//! reads itself served on chip) and `R_k` the rate of the engine its plan
//! runs on:
//!
//! ```text
//! t_k = max(W_k / R_k, Q_k / BW) / u_k + launch,
//! u_k = min(1, threads_k / (SMs x resident threads per SM))
//!       (tensor cores: min(1, blocks_k / SMs))
//! ```
//!
//! `u_k` charges a kernel that cannot fill the machine (a grid of a few
//! blocks, a block of one thread) for the idle part; a tensor-core kernel
//! fills an SM with one block of few threads. The engines:
//! tensor cores (a contraction or attention plan), SIMT with a register
//! tile (each loaded operand reused across a thread's tile) and plain SIMT.
//! The rates are the H100's orders of magnitude, not calibrated figures:
//! the model ranks groupings whose costs differ by multiples (a product
//! fused into a row-per-block kernel moves 40 to 1000 times the bytes of
//! the product tiled alone); groupings within a few percent are left to
//! the default order (the first candidate wins ties).

use std::collections::HashMap;

use crate::error::Result;
use crate::frontend::ast::Program;
use crate::isl::{ScheduleNode, ScheduleNodeType, UnionSet};
use crate::model::count::{count_points, flops_per_instance};
use crate::model::Scop;

use super::mapping::KernelPlan;
use super::traffic::tile_point_traffic;

/// The machine the estimate is for.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    /// Global-memory bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Tensor-core arithmetic, operations per second (f16 and bf16 in,
    /// f32 accumulate).
    pub tensor_rate: f64,
    /// SIMT arithmetic where a register tile reuses each operand.
    pub tiled_rate: f64,
    /// SIMT arithmetic without a register tile (operands from shared or
    /// global memory at every step).
    pub simt_rate: f64,
    /// Threads the machine keeps resident at once.
    pub resident_threads: f64,
    /// Multiprocessors: a tensor-core kernel's blocks are few and heavy,
    /// so its fill is counted in blocks.
    pub sms: f64,
    /// Cost of one launch, seconds.
    pub launch: f64,
}

impl Machine {
    /// An H100 SXM (132 SMs): 3.35 TB/s, about 990 TFLOP/s dense f16 on
    /// tensor cores and 67 TFLOP/s f32 FMA on the SIMT cores, taken at
    /// the fractions kernels of these kinds reach.
    pub const H100: Machine = Machine {
        bandwidth: 3.0e12,
        tensor_rate: 6.0e14,
        tiled_rate: 3.0e13,
        simt_rate: 8.0e12,
        resident_threads: 132.0 * 1024.0,
        sms: 132.0,
        launch: 4.0e-6,
    };
}

/// The engine a kernel's arithmetic runs on, from its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    TensorCores,
    RegisterTile,
    Simt,
}

impl Engine {
    fn of(plan: &KernelPlan) -> Engine {
        if plan.contraction().is_some() || plan.attention().is_some() {
            Engine::TensorCores
        } else if plan.register_tile().is_some() {
            Engine::RegisterTile
        } else {
            Engine::Simt
        }
    }

    fn rate(self, m: &Machine) -> f64 {
        match self {
            Engine::TensorCores => m.tensor_rate,
            Engine::RegisterTile => m.tiled_rate,
            Engine::Simt => m.simt_rate,
        }
    }
}

/// One kernel's estimate.
#[derive(Debug, Clone)]
pub struct KernelCost {
    pub mark: String,
    pub engine: Engine,
    pub flops: u64,
    pub bytes: u64,
    /// Blocks times threads per block at the program's sizes.
    pub threads: u64,
    pub seconds: f64,
}

/// A mapped program's estimate: its kernels in launch order.
#[derive(Debug, Clone)]
pub struct Estimate {
    pub kernels: Vec<KernelCost>,
}

impl Estimate {
    pub fn seconds(&self) -> f64 {
        self.kernels.iter().map(|k| k.seconds).sum()
    }
}

/// Whether [`estimate`] gives an estimate for `program`: every parameter
/// has a value (the model weighs sizes, not shapes).
pub fn estimable(program: &Program) -> bool {
    program.known_params().len() == program.params.len()
}

/// The estimate of `mapped` (the gpu stage's tree, `kernel_K` marks above
/// each kernel) with `plans`, at the program's parameter values; `None`
/// when a parameter has none (the model weighs sizes, not shapes).
pub fn estimate(
    scop: &Scop,
    program: &Program,
    mapped: &crate::isl::Schedule,
    plans: &[KernelPlan],
    machine: &Machine,
) -> Result<Option<Estimate>> {
    if !estimable(program) {
        return Ok(None);
    }
    let params = program.known_params();
    let traffic = tile_point_traffic(scop, program, mapped.get_root()?)?;
    let mut bytes: HashMap<String, u64> = HashMap::new();
    for p in &traffic {
        if let Some(k) = &p.kernel {
            let b = bytes.entry(k.clone()).or_default();
            *b = b.saturating_add(p.bytes());
        }
    }
    let mut domains = Vec::new();
    kernel_domains(mapped.get_root()?, &mut domains)?;
    let mut kernels = Vec::new();
    for plan in plans {
        let flops = match domains.iter().find(|(m, _)| m == &plan.mark) {
            Some((_, d)) => kernel_flops(scop, program, d)?,
            None => 0,
        };
        let engine = Engine::of(plan);
        let blocks: i64 = plan
            .grid
            .iter()
            .map(|e| super::eval(e, &params).unwrap_or(1).max(1))
            .product();
        let per_block: i64 = plan.block.iter().map(|b| i64::from(*b)).product();
        let threads = (blocks.max(1) as u64).saturating_mul(per_block.max(1) as u64);
        let q = bytes.get(&plan.mark).copied().unwrap_or(0);
        let busy = (flops as f64 / engine.rate(machine)).max(q as f64 / machine.bandwidth);
        let used = match engine {
            Engine::TensorCores => blocks.max(1) as f64 / machine.sms,
            _ => threads as f64 / machine.resident_threads,
        }
        .min(1.0);
        kernels.push(KernelCost {
            mark: plan.mark.clone(),
            engine,
            flops,
            bytes: q,
            threads,
            seconds: busy / used + machine.launch,
        });
    }
    Ok(Some(Estimate { kernels }))
}

/// The statement instances below each `kernel_K` mark.
fn kernel_domains(node: ScheduleNode, out: &mut Vec<(String, UnionSet)>) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Mark {
        let name = node.mark_get_id()?.get_name()?.to_string();
        if name.starts_with("kernel_") {
            out.push((name, node.get_domain()?));
            return Ok(());
        }
    }
    for i in 0..node.n_children()? {
        kernel_domains(node.get_child(i)?, out)?;
    }
    Ok(())
}

/// Σ over the statements of `domain` of instances x flops per instance.
fn kernel_flops(scop: &Scop, program: &Program, domain: &UnionSet) -> Result<u64> {
    let mut flops: u64 = 0;
    let sets = domain.get_set_list()?;
    for k in 0..sets.size()? {
        let set = sets.get_at(k)?;
        let name = set.get_tuple_name()?.to_string();
        let Some(s) = scop.statement(&name) else {
            continue;
        };
        let Some(source) = program.statements.get(s.source) else {
            continue;
        };
        let per = flops_per_instance(source, s.kind);
        if per == 0 {
            continue;
        }
        let fixed = set
            .intersect_params(scop.context.copy()?)?
            .project_out_all_params()?;
        // A domain too coupled to count stays uncounted: the bytes still
        // weigh the kernel.
        let n = count_points(&fixed).unwrap_or(0);
        flops = flops.saturating_add(n.saturating_mul(per));
    }
    Ok(flops)
}
