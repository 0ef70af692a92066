//! The gpu stage's mapping as the pipeline drives it: a schedule mapped
//! to kernels ([`map_unproven`]) and proven ([`prove`]) before anything is
//! printed.

use crate::deps;
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::gpu::{self, GpuOptions};
use crate::isl::Isl;
use crate::model;
use crate::schedule;

use super::Options;

/// A mapping the gpu stage made (and, once [`prove`]n, proved): the
/// mapped schedule (checked against every dependence like the CPU
/// schedule, and race-free) and one plan per kernel.
pub(crate) struct Mapping {
    pub schedule: crate::isl::Schedule,
    pub plans: Vec<gpu::mapping::KernelPlan>,
    /// The schedule this is the mapping of, as [`map_unproven`] took it:
    /// a probe's candidate equal to it maps the same, so it need not be
    /// mapped again to be weighed (`probe::choose_by_cost`).
    pub source: crate::isl::Schedule,
}

/// Maps `schedule` and proves the mapping: legal, parallel where it says
/// so, and race-free (with the barriers it left out of step loops back in
/// where that makes the proof go through).
pub(crate) fn map_proven(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    schedule: crate::isl::Schedule,
    options: &Options,
    gpu_options: &GpuOptions,
) -> Result<Mapping> {
    let unproven = map_unproven(isl, program, scop, deps, schedule, options, gpu_options)?;
    prove(isl, program, scop, deps, unproven)
}

/// The gpu stage's mapping of `schedule` and its plans, not yet proven
/// (what the cost model weighs; [`prove`] before anything is printed).
pub(crate) fn map_unproven(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    schedule: crate::isl::Schedule,
    options: &Options,
    gpu_options: &GpuOptions,
) -> Result<Mapping> {
    gpu_options.validate().map_err(|message| Error::Input {
        file: program.source.clone(),
        message,
    })?;
    let source = schedule.copy()?;
    let (mapped, plans) = gpu::mapping::map(
        isl,
        program,
        scop,
        deps,
        schedule,
        &options.tile,
        gpu_options,
    )?;
    Ok(Mapping {
        schedule: mapped,
        plans,
        source,
    })
}

/// `mapped` checked: legal, parallel where it says so, and race-free (with
/// the barriers it left out of step loops back in where that makes the
/// proof go through).
pub(crate) fn prove(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    mapped: Mapping,
) -> Result<Mapping> {
    let Mapping {
        schedule: mapped,
        plans,
        source,
    } = mapped;
    schedule::check_legal(&program.source, &mapped, scop, deps)?;
    gpu::mapping::check_parallel(program, &mapped, scop, deps)?;
    // A mapping the race proof refuses is never printed: with the barriers
    // it left out of step loops back in, or not at all.
    let mapped = match gpu::race::prove(program, scop, &mapped, &plans) {
        Ok(()) => mapped,
        Err(refused) => match gpu::race::with_barriers(isl, &mapped)? {
            Some(synced) if gpu::race::prove(program, scop, &synced, &plans).is_ok() => synced,
            _ => return Err(refused),
        },
    };
    Ok(Mapping {
        schedule: mapped,
        plans,
        source,
    })
}

/// `schedule` with mark `name` below its root (above everything), so that
/// `--emit gpu-tree` says why the schedule is what it is.
pub(crate) fn marked(
    isl: &Isl,
    schedule: crate::isl::Schedule,
    name: &str,
) -> Result<crate::isl::Schedule> {
    let root = schedule.get_root()?;
    Ok(match root.n_children()? {
        0 => schedule,
        _ => root
            .child(0)?
            .insert_mark(crate::isl::Id::read_from_str(&isl.ctx, name)?)?
            .get_schedule()?,
    })
}
