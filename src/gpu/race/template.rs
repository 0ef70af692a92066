//! Kernels printed whole from a template (a tensor-core contraction,
//! attention on tensor cores), proven free of races between their blocks.
//!
//! Such a kernel synchronises its own threads (the copy pipeline's
//! barriers, the warps' fragments), which the statement-level walk of the
//! tree does not see, and those are left to the template's recogniser.
//! What this proves is what no barrier could mend: that no two blocks
//! touch one element, one of them writing. Each instance gets the block
//! (for a split contraction: the cluster) that the template runs it on,
//! from the plan's own tiles, not from the tree's:
//!
//! * contraction, update `S[b.., m, n, k]`, its initialisation, its
//!   further sums (`Contraction::terms`) and its epilogue statements over
//!   `(b.., m, n)`: `(b.., ⌊m / T_m⌋, ⌊n / T_n⌋)`;
//! * attention over `(b.., i, ..)`: `(b.., ⌊i / R⌋)` with `R` the query
//!   rows of a block.
//!
//! With `C` the kernel's conflicts (as in the race proof) and `B` that
//! block map, `C \ (B⁻¹ ∘ B)` must be empty. The split-k form of attention
//! (its slices' local states, then their combination, a second launch) is
//! not covered.

use crate::isl::{ScheduleNode, UnionMap};

use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::gpu::mapping::KernelPlan;
use crate::isl::IslPrint;
use crate::model::Scop;

/// Proves that the template kernel `kernel` (plan `plan`) has no conflict
/// between two of its blocks.
pub(super) fn prove_blocks(
    program: &Program,
    scop: &Scop,
    kernel: &ScheduleNode,
    plan: &KernelPlan,
) -> Result<()> {
    let Some(blocks) = block_map(scop, kernel, plan)? else {
        return Ok(());
    };
    let conflicts = super::conflicts(scop, kernel, None)?;
    if conflicts.is_empty()? {
        return Ok(());
    }
    let same_block = blocks.copy()?.apply_range(blocks.reverse()?)?;
    let apart = conflicts.subtract(same_block)?;
    if apart.is_empty()? {
        return Ok(());
    }
    let example = crate::isl::Map::from_basic_map(apart.sample()?)?.text();
    Err(Error::Race {
        file: program.source.clone(),
        message: format!(
            "{}: the {} kernel races: two instances that touch one element (one of them a write) run on different blocks: {example}",
            plan.mark,
            if plan.contraction().is_some() { "tensor-core contraction" } else { "attention" },
        ),
    })
}

/// Each instance of the kernel mapped to its block, by the template's
/// tiles: statement name, and for each the iterators that give the block
/// with the tile each is divided by (1: taken whole). `None` for a form
/// this proof does not cover.
fn block_map(scop: &Scop, kernel: &ScheduleNode, plan: &KernelPlan) -> Result<Option<UnionMap>> {
    let mut keys: Vec<(String, Vec<(String, i64)>)> = Vec::new();
    if let Some(c) = plan.contraction() {
        let element = |b: &[String], m: &str, n: &str| -> Vec<(String, i64)> {
            let mut key: Vec<(String, i64)> = b.iter().map(|x| (x.clone(), 1)).collect();
            key.push((m.to_string(), c.tile[0]));
            key.push((n.to_string(), c.tile[1]));
            key
        };
        // The update and its initialisation (the model statements of one
        // source statement) share the update's iterators.
        let update = element(&c.batch, &c.m, &c.n);
        let source = scop.statement(&c.statement).map(|s| s.source);
        for s in scop.statements.iter().filter(|s| Some(s.source) == source) {
            keys.push((s.name.clone(), update.clone()));
        }
        // Further sums into the accumulator, by their own iterators.
        for t in &c.terms {
            keys.push((t.statement.clone(), element(&t.batch, &t.m, &t.n)));
        }
        let nb = c.batch.len();
        for e in &c.epilogue {
            if e.iterators.len() != nb + 2 {
                return Ok(None);
            }
            let key = element(&e.iterators[..nb], &e.iterators[nb], &e.iterators[nb + 1]);
            keys.push((e.statement.clone(), key));
        }
    } else if let Some(a) = plan.attention() {
        if a.split.is_some() {
            return Ok(None);
        }
        let mut key: Vec<(String, i64)> = a.batch.iter().map(|(x, _)| (x.clone(), 1)).collect();
        key.push((a.row.clone(), a.block_rows()));
        for s in &scop.statements {
            keys.push((s.name.clone(), key.clone()));
        }
    } else {
        return Ok(None);
    }
    let domain = kernel.get_domain()?;
    let mut out = UnionMap::empty(domain.get_space()?)?;
    for (name, key) in keys {
        let Some(s) = scop.statement(&name) else {
            continue;
        };
        let vars: Vec<String> = (0..s.iterators.len()).map(|i| format!("x{i}")).collect();
        let mut values = Vec::new();
        for (it, tile) in &key {
            // An instance whose statement lacks an iterator of the block
            // has no block here: left out, its conflicts are refused.
            let Some(pos) = s.iterators.iter().position(|i| i == it) else {
                values.clear();
                break;
            };
            values.push(match tile {
                1 => vars[pos].clone(),
                t => format!("floor({} / {t})", vars[pos]),
            });
        }
        if values.len() != key.len() {
            continue;
        }
        let text = format!(
            "{}{{ {}[{}] -> [{}] }}",
            scop.param_prefix,
            name,
            vars.join(", "),
            values.join(", ")
        );
        let map = UnionMap::read_from_str(&kernel.get_ctx(), &text)?;
        out = out.union(map)?;
    }
    Ok(Some(out.intersect_domain(domain)?))
}
