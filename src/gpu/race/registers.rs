//! A kernel's register tile (`gpu::registers`), proven: each element of
//! the tiled tensor lives in one register of one thread of one block.
//!
//! Below the `registers` mark every thread keeps the elements of `T` its
//! thread points own in registers: it loads them (or starts them at the
//! reduction's identity, when the initialisation is hoisted), works on
//! them through the sequential loops, and stores them once at the end.
//! Registers are private, so a barrier orders nothing between them: a
//! thread sees only its own writes. With `A` the accesses (reads and
//! writes) of `T` by the kernel's instances `D_K`, `D_R` the instances
//! below the mark, and `O` each instance's block and thread values, the
//! tile is sound when
//!
//! 1. every access of `T` in the kernel is in the region: `dom A ⊆ D_R`
//!    (an access outside would see global memory, which the registers
//!    only reach at the region's end);
//! 2. every two instances that touch one element run on one thread of one
//!    block, in one slot: `(A⁻¹ ∘ A) ∩ (D_R × D_R) ⊆ O⁻¹ ∘ O` (equal
//!    block values and equal thread values; an instance isl prints
//!    without its thread loop runs on the thread that owns its element,
//!    `codegen::cuda`'s `owned_statement`);
//! 3. with the initialisation hoisted, every element the region touches is
//!    one the initialisation writes: `ran A ⊆ ran W_init` (the registers
//!    start at the identity instead of the tensor's value).

use crate::isl::{ScheduleNode, UnionSet};

use super::{accesses_of, find_marks, Threads};
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::gpu::registers::RegisterTile;
use crate::isl::IslPrint;
use crate::model::Scop;

/// Proves the register tile `tile` of kernel `kernel` (mark `mark`).
pub(super) fn prove_tile(
    program: &Program,
    scop: &Scop,
    kernel: &ScheduleNode,
    mark: &str,
    tile: &RegisterTile,
    threads: Threads,
    identities: &super::Identities,
) -> Result<()> {
    let mut regions = Vec::new();
    find_marks(kernel.copy()?, "registers", &mut regions)?;
    let Some(first) = regions.first() else {
        return Ok(());
    };
    let mut inside = UnionSet::empty(first.get_domain()?.get_space()?)?;
    for r in &regions {
        inside = inside.union(r.get_domain()?)?;
    }
    let refuse = |what: String| Error::Race {
        file: program.source.clone(),
        message: format!("{mark}: the register tile of {}: {what}", tile.tensor),
    };
    let (reads, writes) = accesses_of(scop, &tile.tensor, &kernel.get_domain()?)?;
    let accesses = reads.union(writes)?;
    // 1. Every access in the region.
    let outside = accesses.copy()?.domain()?.subtract(inside.copy()?)?;
    if !outside.is_empty()? {
        return Err(refuse(format!(
            "an instance outside the register region accesses it: {}",
            sample(&outside)?
        )));
    }
    // 2. One element, one thread of one block.
    // In one launch (a host loop launches the kernel once per iteration).
    let pairs = accesses
        .copy()?
        .apply_range(accesses.copy()?.reverse()?)?
        .subtract(inside.copy()?.identity()?)?
        .intersect(super::one_launch(kernel)?)?;
    if !pairs.is_empty()? {
        let same_thread = super::same_thread(kernel, threads, true, false, identities)?.same_thread;
        let owner = same_thread.intersect(super::same_block(kernel)?)?;
        let apart = pairs.subtract(owner)?;
        if !apart.is_empty()? {
            let example = crate::isl::Map::from_basic_map(apart.sample()?)?.text();
            return Err(refuse(format!(
                "two instances that touch one element run on different threads or blocks, and a thread sees only its own registers: {example}"
            )));
        }
    }
    // 3. A hoisted initialisation covers every element.
    if let Some(init) = &tile.init {
        let written = scop
            .writes()?
            .intersect_domain(inside.copy()?)?
            .intersect_domain(statement_domain(scop, &init.statement)?)?
            .range()?;
        let uncovered = accesses.range()?.subtract(written)?;
        if !uncovered.is_empty()? {
            return Err(refuse(format!(
                "its registers start at the identity of {}, which does not initialise {}",
                init.statement,
                sample(&uncovered)?
            )));
        }
    }
    Ok(())
}

/// Every instance of model statement `name`.
fn statement_domain(scop: &Scop, name: &str) -> Result<UnionSet> {
    let s = scop
        .statement(name)
        .ok_or_else(|| Error::Internal(format!("no statement {name} in the model")))?;
    Ok(UnionSet::from_set(s.domain.copy()?)?)
}

/// One point of `set`, as text.
fn sample(set: &UnionSet) -> Result<String> {
    Ok(crate::isl::Set::from_basic_set(set.copy()?.sample()?)?.text())
}
