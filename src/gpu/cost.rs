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
use crate::isl::{ScheduleNode, ScheduleNodeType, UnionMap, UnionSet};
use crate::model::count::{flops_per_instance, Counts};
use crate::model::Scop;

use super::mapping::KernelPlan;
use super::traffic::tile_point_traffic_counted;

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
    /// Steps of its sequential loops a block runs without an instance
    /// ([`empty_steps`]).
    pub empty_steps: u64,
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
/// when a parameter has none (the model weighs sizes, not shapes). Its
/// sets are counted through `counts`: one memo for every estimate of a
/// compilation, whose candidates count many of the same sets.
pub fn estimate(
    scop: &Scop,
    program: &Program,
    mapped: &crate::isl::Schedule,
    plans: &[KernelPlan],
    machine: &Machine,
    counts: &Counts,
) -> Result<Option<Estimate>> {
    if !estimable(program) {
        return Ok(None);
    }
    let params = program.known_params();
    let traffic = tile_point_traffic_counted(scop, program, mapped.get_root()?, counts)?;
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
        let kernel = domains.iter().find(|(m, _, _)| m == &plan.mark);
        let flops = match kernel {
            Some((_, d, _)) => kernel_flops(scop, program, d, counts)?,
            None => 0,
        };
        let empty = match kernel {
            Some((_, _, node)) => empty_steps(node, counts)?,
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
        // Empty steps delay every block of a wave alike.
        let waves = (blocks.max(1) as f64 / machine.sms).ceil();
        let idle = empty as f64 * EMPTY_STEP_SECONDS * waves;
        kernels.push(KernelCost {
            mark: plan.mark.clone(),
            engine,
            flops,
            bytes: q,
            threads,
            empty_steps: empty,
            seconds: busy / used + idle + machine.launch,
        });
    }
    Ok(Some(Estimate { kernels }))
}

/// The statement instances below each `kernel_K` mark, with the mark.
fn kernel_domains(
    node: ScheduleNode,
    out: &mut Vec<(String, UnionSet, ScheduleNode)>,
) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Mark {
        let name = node.mark_get_id()?.get_name()?.to_string();
        if name.starts_with("kernel_") {
            out.push((name, node.get_domain()?, node));
            return Ok(());
        }
    }
    for i in 0..node.n_children()? {
        kernel_domains(node.get_child(i)?, out)?;
    }
    Ok(())
}

/// Σ over the statements of `domain` of instances x flops per instance.
fn kernel_flops(scop: &Scop, program: &Program, domain: &UnionSet, counts: &Counts) -> Result<u64> {
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
        let n = counts.estimated_points(&fixed).unwrap_or(0);
        flops = flops.saturating_add(n.saturating_mul(per));
    }
    Ok(flops)
}

/// Time one empty step of a sequential loop costs a block: the loop's
/// control and its slots' guards run though no instance does. Calibrated
/// on the H100 (2026-11-27) by correlation's product with its epilogue
/// scheduled by isl at `256 + 3743 i` in the product's step loop: 13,759
/// empty steps a block ([`empty_steps`]), 1,024 blocks (8 waves of 132),
/// 2.6 ms more than the same program in kernels without them (about 25
/// ns a step and wave).
const EMPTY_STEP_SECONDS: f64 = 2.5e-8;

/// The steps a block of the kernel below `node` runs without an instance,
/// at most over its sequential loops and their statements: a band member
/// outside the bands that blocks and threads take, whose values for one
/// statement on one block span `extent / stride` steps of which only the
/// distinct values run anything. isl's scheduler may put an epilogue after a product's
/// reduction loop with a large coefficient (correlation: `256 + 3743 i`
/// in the k-step member), so the step loop runs thousands of empty steps
/// in every block. Counted: the largest span of one block, less the
/// distinct values a block has on average; 0 where a set cannot be
/// counted.
pub fn empty_steps(node: &ScheduleNode, counts: &Counts) -> Result<u64> {
    let mut worst = 0;
    walk_sequential(node.copy()?, None, false, counts, &mut worst)?;
    Ok(worst)
}

fn walk_sequential(
    node: ScheduleNode,
    blocks: Option<&UnionMap>,
    mapped: bool,
    counts: &Counts,
    worst: &mut u64,
) -> Result<()> {
    let mut blocks = blocks.map(|b| b.copy()).transpose()?;
    match node.get_type()? {
        ScheduleNodeType::Mark => {
            let name = node.mark_get_id()?.get_name()?.to_string();
            let block = name.starts_with("block_");
            let thread = name.starts_with("thread_");
            let child = node.get_child(0)?;
            if block && child.get_type()? == ScheduleNodeType::Band {
                let partial = child.band_get_partial_schedule_union_map()?;
                blocks = Some(match blocks {
                    None => partial,
                    Some(b) => b.flat_range_product(partial)?,
                });
            }
            return walk_sequential(child, blocks.as_ref(), block || thread, counts, worst);
        }
        ScheduleNodeType::Band if !mapped => {
            if let Some(b) = &blocks {
                let n = node.band_n_member()? as usize;
                let partial = node
                    .band_get_partial_schedule_union_map()?
                    .intersect_domain(node.get_domain()?)?;
                for m in 0..n {
                    let member = super::mapping::project_members(&partial, m, m + 1, n)?;
                    // Per statement: isl prints a statement whose values
                    // lie apart from the others' in a loop of its own.
                    let maps = member.get_map_list()?;
                    for k in 0..maps.size()? {
                        let one = UnionMap::from_map(maps.get_at(k)?)?;
                        let steps = member_empty_steps(b, one, counts).unwrap_or(0);
                        *worst = (*worst).max(steps);
                    }
                }
            }
        }
        _ => {}
    }
    for i in 0..node.n_children()? {
        walk_sequential(node.get_child(i)?, blocks.as_ref(), false, counts, worst)?;
    }
    Ok(())
}

/// The empty steps of one member (see [`empty_steps`]); `None` where isl
/// cannot bound or count them.
fn member_empty_steps(blocks: &UnionMap, member: UnionMap, counts: &Counts) -> Option<u64> {
    let nb = {
        let r = blocks.copy().ok()?.range().ok()?;
        crate::isl::Set::from_union_set(r)
            .ok()?
            .dim(crate::isl::DimType::Set)
            .ok()? as u32
    };
    let joint = blocks
        .copy()
        .ok()?
        .intersect_domain(member.copy().ok()?.domain().ok()?)
        .ok()?
        .flat_range_product(member)
        .ok()?;
    let points = crate::isl::Set::from_union_set(joint.range().ok()?).ok()?;
    let np = points.dim(crate::isl::DimType::Param).ok()? as u32;
    let stride = points.get_stride(nb as i32).ok()?.get_num_si().ok()?.max(1);
    // One block's values: the block coordinates as parameters.
    let per_block = points
        .copy()
        .ok()?
        .move_dims(
            crate::isl::DimType::Param,
            np,
            crate::isl::DimType::Set,
            0,
            nb,
        )
        .ok()?;
    let span = per_block
        .copy()
        .ok()?
        .dim_max(0)
        .ok()?
        .sub(per_block.dim_min(0).ok()?)
        .ok()?
        .max_val()
        .ok()?;
    if span.is_infty().ok()? || !span.is_int().ok()? {
        return None;
    }
    let steps = (span.get_num_si().ok()? / stride + 1).max(0) as u64;
    let fixed = points.copy().ok()?.project_out_all_params().ok()?;
    let distinct = counts.estimated_points(&fixed).ok()?;
    let n_blocks = counts
        .estimated_points(&fixed.project_out(crate::isl::DimType::Set, nb, 1).ok()?)
        .ok()?
        .max(1);
    Some(steps.saturating_sub(distinct / n_blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isl::Isl;

    /// A kernel whose sequential member runs a product's k tiles (`S`,
    /// stride 16) and an epilogue `T` that isl placed after them with a
    /// large coefficient, as in correlation (`256 + 3743 i - ((-i) mod
    /// 16)`): `T`'s values on a block of 32 rows span 3743 x 31 + 15, about
    /// 7,250 steps of 16, of which 32 run. The k tiles run every step.
    #[test]
    fn a_skewed_epilogue_runs_empty_steps_and_a_product_none() {
        let isl = Isl::new();
        let band = |s: &str| format!("schedule: \"[{s}]\"");
        let text = |inner: &str| {
            format!(
                "{{ domain: \"{{ S[i, k] : 0 <= i < 128 and 0 <= k < 64; T[i] : 0 <= i < 128 }}\", \
                 child: {{ mark: \"kernel_0\", child: {{ mark: \"block_x_0\", child: {{ {}, \
                 child: {{ {} }} }} }} }} }}",
                band("{ S[i, k] -> [(i - (i) mod 32)]; T[i] -> [(i - (i) mod 32)] }"),
                band(inner)
            )
        };
        let empty = |inner: &str| {
            let s = isl.schedule(&text(inner)).unwrap();
            let kernel = s.get_root().unwrap().get_child(0).unwrap();
            empty_steps(&kernel, &Counts::default()).unwrap()
        };
        let skewed =
            empty("{ S[i, k] -> [(k - (k) mod 16)]; T[i] -> [(256 + 3743i - (-i) mod 16)] }");
        assert!((7_000..7_300).contains(&skewed), "{skewed}");
        assert_eq!(
            empty("{ S[i, k] -> [(k - (k) mod 16)]; T[i] -> [(64)] }"),
            0
        );
    }
}
