//! Statements of a register tile that may run over the tile's whole box.
//!
//! A triangular output (syrk's `C(i, j) += .. where j <= i`) bounds one
//! slot loop by another slot: `c5 <= min(63, (c0 - c1) + c4)`. The tiles
//! off the diagonal satisfy that bound at every slot and run the region's
//! copy without tests (`codegen::cuda::slot_box`); the tiles on the
//! diagonal test every slot at every step, and on the H200 those 32 tiles
//! of 528 set the kernel's time: syrk's product ran 962 us against 412 us
//! with the tests dropped (an experiment's binary, wrong results; bench/
//! RESULTS.md). A slot beyond such a bound can instead run the statement
//! at the bound, `c5 = min(slot, bound)` (a valid point: its reads stay
//! inside the tensors and the shared tiles), into the slot's own register,
//! when that register is dead: no statement of the tile ever uses it, and
//! the store tests the element. The printer then runs straight-line code
//! on the diagonal too (`codegen::cuda`'s `closed_clamp`): syrk's product
//! 734 us, covariance's 2,563 -> 1,471 us. Where the statements' reads
//! also stay inside their shared copies at every slot of the box
//! (`codegen::cuda::box_reads`), every tile runs the copy without tests,
//! with a thread's loads shared along each axis: syrk 449 us in all.
//!
//! When is the slot's register dead? Write `p` for the host loops, `b`
//! for the block values, `t` for the thread point (the slot) and `s` for
//! every other schedule value of the band (the sequential tile and step
//! loops, and the schedule below the point band). Let `Img_S` be the
//! points `(p, b, s, t)` of statement `S`, and `Live` the points `(p, b,
//! t)` of every statement that touches the tile's tensor: the registers
//! the tile loads, uses and stores. The printed loop bound at a slot is
//! satisfied by every instance enclosed by the loop at the values of the
//! loops around it; so where it fails, `S` has no instance at `(p, b, s,
//! t)` for those values. `S` runs at the clamped slot only where its own
//! guards hold, so at loop values `(p, b, s)` where `S` has an instance:
//! `(p, b, s) ∈ π(Img_S)`. The register of `t` is then dead if
//!
//! ```text
//!   Q_S = { (p, b, s, t) : (p, b, s) ∈ π(Img_S), (p, b, t) ∈ Live } ⊆ Img_S
//! ```
//!
//! for then `(p, b, t) ∈ Live` would put `(p, b, s, t)` in `Img_S`. In
//! words: at every step where `S` runs in a block, it runs at every live
//! slot of the block. The argument needs the loop to hold every instance
//! of `S` at the values of the loops around it: the printer keeps only
//! the statements isl's AST prints once (trmm's scaling, printed once for
//! its last row and once for the others, corrupted a live register when
//! the first version did not ask). syrk's product qualifies (`j <= i` does not depend
//! on `k`, and the product is the only statement on `C_sum`); symm's
//! `k < i` does not (a slot row runs at some steps and not at others, so
//! its register is live where the bound fails), nor do two statements
//! that write the two triangles of one tensor (each one's triangle is
//! the other's live registers).
//!
//! The statements also satisfy [`super::clamp_safe`]: they write only the
//! tile's element and read nothing the band writes, so the extra run
//! changes nothing but the dead register.

use std::collections::HashSet;

use crate::isl::{ScheduleNode, UnionMap, UnionSet};

use crate::error::Result;
use crate::frontend::ast::Program;
use crate::model::ModelStmt;

/// The schedule maps of a register tile's band, each from the band's
/// instances: `pb` to the host loops and block values, `threads` to the
/// thread point, `steps` to every other schedule value of the band.
pub(super) struct BandMaps {
    pub pb: UnionMap,
    pub threads: UnionMap,
    pub steps: UnionMap,
}

impl BandMaps {
    /// The maps of the tiled band `tile_band` (members `0..nb` on blocks)
    /// and its point band `point_band` (members `0..nt` on threads), with
    /// the host loops `prefix` (None: none) and the projections `blocks`
    /// and `threads` the caller made.
    pub(super) fn new(
        tile_band: &ScheduleNode,
        point_band: &ScheduleNode,
        nb: usize,
        nt: usize,
        prefix: Option<UnionMap>,
        blocks: UnionMap,
        threads: UnionMap,
    ) -> Result<Self> {
        use crate::gpu::mapping::project_members;
        let n_tile = tile_band.band_n_member()? as usize;
        let n_point = point_band.band_n_member()? as usize;
        let tile_steps = project_members(
            &tile_band.band_get_partial_schedule_union_map()?,
            nb,
            n_tile,
            n_tile,
        )?;
        let point_steps = project_members(
            &point_band.band_get_partial_schedule_union_map()?,
            nt,
            n_point,
            n_point,
        )?;
        let below = point_band.get_child(0)?.get_subtree_schedule_union_map()?;
        let steps = tile_steps
            .flat_range_product(point_steps)?
            .flat_range_product(below)?;
        let pb = match prefix {
            Some(p) => p.flat_range_product(blocks)?,
            None => blocks,
        };
        Ok(BandMaps { pb, threads, steps })
    }
}

/// The statements of `candidates` (names) that may run at every slot of
/// the box of tensor `tensor`'s register tile (module documentation).
pub(super) fn slot_closed(
    program: &Program,
    stmts: &[&ModelStmt],
    tensor: &str,
    candidates: &HashSet<String>,
    band_domain: &UnionSet,
    maps: &BandMaps,
) -> Result<HashSet<String>> {
    let mut closed = HashSet::new();
    if candidates.is_empty() {
        return Ok(closed);
    }
    let domain_of = |s: &ModelStmt| -> Result<UnionSet> {
        Ok(UnionSet::from_set(s.domain.copy()?)?.intersect(band_domain.copy()?)?)
    };
    // Live: (p, b) -> t over the statements that touch the tensor.
    let mut touching = UnionSet::empty(band_domain.get_space()?)?;
    for s in stmts {
        if s.accesses(program).iter().any(|a| a.tensor == tensor) {
            touching = touching.union(domain_of(s)?)?;
        }
    }
    let live = maps
        .pb
        .copy()?
        .intersect_domain(touching.copy()?)?
        .reverse()?
        .apply_range(maps.threads.copy()?.intersect_domain(touching)?)?;
    for s in stmts.iter().filter(|s| candidates.contains(&s.name)) {
        let ds = domain_of(s)?;
        if ds.is_empty()? {
            continue;
        }
        let pb = maps.pb.copy()?.intersect_domain(ds.copy()?)?;
        let pbs = pb.copy()?.flat_range_product(maps.steps.copy()?)?;
        // Img_S as a relation (p, b, s) -> t, and the projection
        // (p, b, s) -> (p, b) on the points where S runs.
        let img = pbs
            .copy()?
            .reverse()?
            .apply_range(maps.threads.copy()?.intersect_domain(ds)?)?;
        let project = pbs.reverse()?.apply_range(pb)?;
        let q = project.apply_range(live.copy()?)?;
        if q.is_subset(&img)? {
            closed.insert(s.name.clone());
        }
    }
    Ok(closed)
}
