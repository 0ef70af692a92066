//! The shared copies of a kernel's promoted tensors (`gpu::promote`),
//! proven free of races.
//!
//! At a `shared` mark the block's threads copy the box of each promoted
//! tensor that the instances below need for the current values `c` of the
//! prefix schedule `P` (block and sequential tile loops), together, then
//! wait at a barrier, then read the copy (`codegen::cuda`'s `copy_in`).
//! Only tensors the kernel does not write are promoted, so the copy is the
//! only writer of the shared array. The barrier after the copy orders it
//! before the reads of the same `c`. What remains to prove is that the
//! copy for one value of `P` never overwrites the array while a thread
//! still reads the copy of another: for every instance `s` that reads the
//! promoted tensor `T` and every instance `s'` of the region,
//!
//! `C_T = { (s, s') : s ∈ dom R_T, s' ∈ D, P(s) ≠ P(s') }` (and its inverse)
//!
//! must be ordered by a barrier that the whole block passes, at the node of
//! the tree that separates the pair: a sequence or an iteration of a
//! sequential loop outside the thread loops, without `nosync`. A pair on
//! two blocks touches two different copies. A double-buffered copy
//! (`Scope::double_buffered`) writes the next step's stage while the
//! current one is read; the barrier at the end of every step, which this
//! proof demands, is what orders the stores of step `c` after the reads of
//! that stage in step `c - 1`, and before its reads in step `c + 1`.

use crate::isl::{ScheduleNode, UnionMap};

use super::{accesses_of, find_marks, Kernel, Memory, Threads};
use crate::error::Result;
use crate::frontend::ast::Program;
use crate::gpu::promote::Scope;
use crate::model::Scop;

/// Proves that no shared copy of `scope` is overwritten while another
/// value of its prefix still reads it, in kernel `kernel` (mark `mark`).
pub(super) fn prove_copies(
    program: &Program,
    scop: &Scop,
    kernel: &ScheduleNode,
    mark: &str,
    scope: &Scope,
    threads: Threads,
) -> Result<()> {
    if scope.arrays.is_empty() || threads.single_thread {
        return Ok(());
    }
    let has_threads = super::thread_marks_below(kernel)?;
    if !has_threads {
        // One thread copies and reads everything, in order.
        return Ok(());
    }
    let mut regions = Vec::new();
    find_marks(kernel.copy()?, "shared", &mut regions)?;
    for region in regions {
        let domain = region.get_domain()?;
        let prefix = region
            .get_prefix_schedule_union_map()?
            .intersect_domain(domain.copy()?)?;
        let same_prefix = prefix.copy()?.apply_range(prefix.reverse()?)?;
        for array in &scope.arrays {
            let (reads, _) = accesses_of(scop, &array.tensor, &domain)?;
            let readers = reads.domain()?;
            let overwritten = UnionMap::from_domain_and_range(readers, domain.copy()?)?
                .subtract(same_prefix.copy()?)?;
            // In one launch (a host loop launches the kernel once per
            // iteration, each after the last).
            let pairs = overwritten
                .copy()?
                .union(overwritten.reverse()?)?
                .intersect(super::one_launch(kernel)?)?;
            let k = Kernel {
                same_thread: UnionMap::empty(pairs.get_space()?)?,
                same_identity: UnionMap::empty(pairs.get_space()?)?,
                skewed: false,
                reorderable: &UnionMap::empty(pairs.get_space()?)?,
                has_threads,
                mark,
                file: &program.source,
                memory: Memory::SharedCopy(&array.tensor),
                fast: true,
            };
            super::walk_kernel(k, kernel, pairs)?;
        }
    }
    Ok(())
}
