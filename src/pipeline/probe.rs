//! Strategy probing: the steps of a compilation that schedule and map a
//! program more than once and keep one result. Each is a named step of
//! [`super::compile`], in the order it runs them:
//!
//! 1. [`rows_on_chip`] (before the schedule stage decides): maximal fusion,
//!    mapped, against isl's schedule, mapped, for rows kept across lanes
//!    in fewer kernels.
//! 2. [`map_for_race_freedom`] (the gpu stage): where the race proof
//!    refuses the mapping, minimal fusion, then blocks of one thread.
//! 3. [`step_on_host`]: a recurrence the mapping serialised, on the host's
//!    steps (wavefronts first), each step's sums into one accumulator in
//!    one band where that maps.
//! 4. [`choose_by_cost`]: minimal fusion and contraction epilogues, mapped
//!    and weighed by the cost model against the mapping so far.
//!
//! They live in the pipeline, not in `schedule/`, because each choice is
//! made by mapping candidates to the GPU (`gpu` comes after `schedule`).
//! The mapped tree carries a mark where a probe replaced the schedule
//! (`minimal_fusion_for_race_freedom`, `minimal_fusion_by_cost`, ...).

use crate::deps;
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::gpu::{self, GpuOptions};
use crate::isl::Isl;
use crate::model;
use crate::model::count::Counts;
use crate::schedule::{self, Strategy};

use super::mapping::{map_proven, map_unproven, marked, prove, Mapping};
use super::Options;

/// `sched` mapped and proven; where the race proof refuses it, the
/// statements in kernels of their own (minimal fusion), then blocks of one
/// thread, each marked so in the mapped tree; else the refusal.
/// `premapped`, where given, is `sched`'s mapping made already (by
/// `map_unproven` with these options), proven here as `sched`'s would be.
#[allow(clippy::too_many_arguments)]
pub(crate) fn map_for_race_freedom(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    sched: &crate::isl::Schedule,
    premapped: Option<Mapping>,
    strategy: Strategy,
    options: &Options,
    g: &GpuOptions,
) -> Result<Mapping> {
    let file = program.source.as_str();
    let map = |s: crate::isl::Schedule| map_proven(isl, program, scop, deps, s, options, g);
    let blocks = program.statements.iter().any(|s| !s.blocks.is_empty());
    // Last, blocks of one thread, which no mapping of the threads can make
    // race. With loop blocks, in program order (the blocks' loops
    // outermost, no skewing): the fuzzer found a skewed schedule whose
    // register tile over a block's loop lost elements on blocks of one
    // thread.
    let single = |race: Error| -> Result<Mapping> {
        let one = GpuOptions {
            block: vec![1, 1, 1],
            ..g.clone()
        };
        let base = if blocks {
            let order = schedule::canonical(isl, scop)?;
            schedule::annotate_bands(isl, order, deps, &scop.param_prefix)?
        } else {
            sched.copy()?
        };
        let single = marked(isl, base, "single_thread_for_race_freedom")?;
        map_proven(isl, program, scop, deps, single, options, &one).map_err(|_| race)
    };
    // `sched` mapped, or its mapping made already (`premapped`), proven.
    let first = match premapped {
        Some(m) => prove(isl, program, scop, deps, m),
        None => map(sched.copy()?),
    };
    match first {
        Err(race @ Error::Race { .. }) if strategy != Strategy::Min => {
            let min = schedule::compute(isl, scop, deps, Strategy::Min)?;
            schedule::check_legal(file, &min, scop, deps)?;
            match map(marked(isl, min, "minimal_fusion_for_race_freedom")?) {
                Err(Error::Race { .. }) => single(race),
                other => other,
            }
        }
        // Under minimal fusion a program with loop blocks goes to blocks
        // of one thread too, rather than being refused.
        Err(race @ Error::Race { .. }) if blocks => single(race),
        other => other,
    }
}

/// Where the mapping `mapped` runs a recurrence on blocks of one thread
/// (`gpu::mapping::serial_recurrence`) and the options allow it, the
/// host-stepped schedule (`schedule::host`: the carrying loops on the
/// host, with wavefronts and chains where `GpuOptions::recurrences` asks
/// for them and the dependences allow), checked against every dependence,
/// mapped and proven like any other; where that fails, with plain steps;
/// else `mapped` as it is. Gives the mapping and, when host-stepped, what
/// was built.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_on_host(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    mapped: Mapping,
    strategy: Strategy,
    options: &Options,
    g: &GpuOptions,
) -> Result<(Mapping, Option<schedule::host::Stepped>)> {
    // (The probe's isl operations are not made for a program without
    // loop blocks: they can change how isl prints its sets later.)
    let blocks = program.statements.iter().any(|s| !s.blocks.is_empty());
    if !blocks
        || g.recurrences == gpu::Recurrences::Serial
        || !gpu::mapping::serial_recurrence(program, scop, &mapped.schedule, &mapped.plans)?
    {
        return Ok((mapped, None));
    }
    let skews: &[bool] = match g.recurrences {
        gpu::Recurrences::Wavefront => &[true, false],
        _ => &[false],
    };
    let mut refused = Vec::new();
    for &skew in skews {
        let Some(stepped) = schedule::host::stepped(isl, scop, deps, strategy, skew)? else {
            break;
        };
        if let Err(e) = schedule::check_legal(&program.source, &stepped.schedule, scop, deps) {
            refused.push(format!("host steps refused: {e}"));
            continue;
        }
        // With `GpuOptions::fuse_step_sums`, under the default strategy, a
        // step's sums into one accumulator (an LSTM step's gates: `G +=! H
        // W; G += H' U; G = G + b`) share one band, so one kernel
        // (`schedule::sums`, legal or not made); where that mapping is
        // refused, the steps as isl scheduled them.
        let fused = match strategy {
            Strategy::Isl if g.fuse_step_sums => {
                schedule::sums::fuse_sibling_sums(isl, program, scop, deps, &stepped.schedule)?
            }
            _ => None,
        };
        // (A mapping of the fused band that the gpu stage refuses for what
        // it cannot map falls back the same way.)
        let candidates = fused
            .into_iter()
            .map(|s| (s, true))
            .chain([(stepped.schedule.copy()?, false)]);
        for (schedule, fused) in candidates {
            match map_proven(isl, program, scop, deps, schedule, options, g) {
                Ok(m) => {
                    let mut stepped = stepped;
                    refused.append(&mut stepped.refused);
                    stepped.refused = refused;
                    return Ok((m, Some(stepped)));
                }
                Err(e @ (Error::Race { .. } | Error::Illegal { .. })) => {
                    let what = if fused {
                        "sums in one band"
                    } else {
                        "host steps"
                    };
                    refused.push(format!("{what} refused: {e}"));
                }
                Err(e @ (Error::Input { .. } | Error::Statement { .. })) if fused => {
                    refused.push(format!("sums in one band refused: {e}"));
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok((mapped, None))
}

/// How much faster (by the cost model) another grouping must be expected
/// to run before it replaces the default one: the model ranks by orders of
/// magnitude, not by percent.
const COST_MARGIN: f64 = 0.5;

/// The default mapping, or the cheapest of the other groupings where the
/// cost model (`gpu::cost`) expects it to take less than [`COST_MARGIN`]
/// of the default's time (a product fused with its consumers into a
/// kernel that loses its tiles, issue 32): minimal fusion, and minimal
/// fusion with each product's epilogue in its band
/// (`schedule::epilogue`), the latter also with the statements between
/// the products fused as they would be alone, marked
/// `minimal_fusion_by_cost`, `contraction_epilogues_by_cost` or
/// `contraction_epilogues_fused_runs_by_cost` in the mapped tree. The
/// epilogues' grouping is verified against the dependences once more here
/// (a group found illegal is left out inside `contraction_epilogues`); the
/// fused runs' is verified inside `contraction_epilogues_fused_runs`. Where the default cannot
/// be estimated (symbolic sizes) or no other grouping can be mapped, the
/// default stays. Gives the chosen mapping with its estimate, when one was
/// made.
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose_by_cost(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    default: Mapping,
    options: &Options,
    g: &GpuOptions,
    counts: &Counts,
) -> Result<(Mapping, Option<gpu::cost::Estimate>)> {
    let machine = gpu::cost::Machine::H100;
    // The default's estimate is made where a candidate is weighed against
    // it, not before: where no candidate is (one statement, or minimal
    // fusion in as many kernels), it is only wanted with
    // `GpuOptions::estimate`, and `compile` then makes the same one of the
    // same mapping. Without it the default stays, as the estimate gives
    // none where a size has no value.
    // One statement has one grouping: minimal fusion and the epilogues'
    // would schedule it again (a fifth of a gemm's compile time) to find
    // the default's.
    if !gpu::cost::estimable(program) || program.statements.len() < 2 {
        return Ok((default, None));
    }
    let Ok(min) = schedule::compute(isl, scop, deps, Strategy::Min) else {
        return Ok((default, None));
    };
    schedule::check_legal(&program.source, &min, scop, deps)?;
    // Minimal fusion, and minimal fusion with each contraction's
    // pointwise consumers in its band (`schedule::epilogue`: the gpu stage
    // runs them as the epilogue of one tensor-core kernel).
    let mut candidates = Vec::new();
    // Groupings already weighed (the default's, the epilogues'): one
    // equal to them would map to the same kernels, and the same estimate
    // never wins by the margin.
    let mut seen = vec![default.source.copy()?];
    if let Some(fused) = schedule::epilogue::contraction_epilogues(isl, program, scop, deps, &min)?
    {
        schedule::check_legal(&program.source, &fused, scop, deps)?;
        // (The default's own schedule where isl fused each epilogue alike:
        // a product and its bias and activation.)
        if !plain_is_any(&fused, &seen)? {
            seen.push(fused.copy()?);
            candidates.push((marked(isl, fused, "contraction_epilogues_by_cost")?, false));
        }
    }
    // The same with the statements between the products fused as they
    // would be alone (a normalisation before its product in one kernel
    // instead of one a statement). A program without such statements (a
    // lone product) gives the epilogues' grouping again.
    if let Some(runs) =
        schedule::epilogue::contraction_epilogues_fused_runs(isl, program, scop, deps, &min)?
    {
        if !plain_is_any(&runs, &seen)? {
            candidates.push((
                marked(isl, runs, "contraction_epilogues_fused_runs_by_cost")?,
                false,
            ));
        }
    }
    // Minimal fusion in as many kernels as the default is the same
    // grouping: nothing to weigh.
    candidates.push((marked(isl, min, "minimal_fusion_by_cost")?, true));
    let mut best: (Mapping, Option<gpu::cost::Estimate>) = (default, None);
    let mut chosen = false;
    // A candidate is mapped and weighed first, and proven only where it
    // wins: the proof is most of a mapping's time.
    for (candidate, grouping_only) in candidates {
        // Its kernels are counted before it is mapped (`map` finds them
        // the same way before it maps any; where counting fails, so does
        // the mapping, which skips the candidate below).
        if grouping_only
            && !chosen
            && gpu::mapping::kernel_count(isl, program, scop, deps, &candidate, g)
                .is_ok_and(|n| n == best.0.plans.len())
        {
            continue;
        }
        let Ok(alt) = map_unproven(isl, program, scop, deps, candidate, options, g) else {
            continue;
        };
        if grouping_only && alt.plans.len() == best.0.plans.len() && !chosen {
            continue;
        }
        let e = gpu::cost::estimate(scop, program, &alt.schedule, &alt.plans, &machine, counts)?;
        if let Some(e) = e {
            let best_seconds = match &best.1 {
                Some(b) => b.seconds(),
                None => {
                    let Some(b) = gpu::cost::estimate(
                        scop,
                        program,
                        &best.0.schedule,
                        &best.0.plans,
                        &machine,
                        counts,
                    )?
                    else {
                        // (Not reached: the sizes all have values.)
                        return Ok((best.0, None));
                    };
                    best.1.insert(b).seconds()
                }
            };
            let bar = if chosen { 1.0 } else { COST_MARGIN };
            if e.seconds() < bar * best_seconds {
                let Ok(alt) = prove(isl, program, scop, deps, alt) else {
                    continue;
                };
                best = (alt, Some(e));
                chosen = true;
            }
        }
    }
    Ok(best)
}

/// Whether `schedule` is plainly equal to one of `seen`.
fn plain_is_any(schedule: &crate::isl::Schedule, seen: &[crate::isl::Schedule]) -> Result<bool> {
    for s in seen {
        if schedule.plain_is_equal(s)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The maximal-fusion schedule of `program`, when it maps to fewer GPU
/// kernels than isl's schedule, each of which runs its rows across the
/// lanes of a warp
/// or block (`gpu::lanes`: every tensor a row's loops write is a state the
/// lanes combine, the row's other data stays in registers). isl's
/// scheduler separates a row's reduction from the statements that use its
/// result (layer norm's output after its mean and variance), so a second
/// kernel reads every row from memory again; maximal fusion keeps the row
/// on chip between them. Options that turn the lanes off (`reduce`, a
/// block that is no multiple of 32) leave isl's schedule. Gives it in a
/// [`RowsProbe`], with its mapping, or else isl's schedule and mapping
/// where the probe made them.
pub(crate) fn rows_on_chip(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    options: &Options,
    gpu_options: &GpuOptions,
) -> Result<RowsProbe> {
    if !gpu_options.reduce || gpu_options.validate().is_err() {
        return Ok(RowsProbe::default());
    }
    let probe = max_rows(isl, program, scop, deps, options, gpu_options)?;
    if probe.fused.is_some() {
        return Ok(probe);
    }
    sibling_rows(isl, program, scop, deps, options, gpu_options, probe)
}

/// [`rows_on_chip`]'s first try: maximal fusion.
fn max_rows(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    options: &Options,
    gpu_options: &GpuOptions,
) -> Result<RowsProbe> {
    let max = schedule::compute(isl, scop, deps, Strategy::Max)?;
    if !gpu::mapping::kernels_have_lane_rows(program, scop, &max)? {
        return Ok(RowsProbe::default());
    }
    // (`map_unproven`: the options are valid, so it maps as
    // `gpu::mapping::map` does.)
    let kernels = |sched: crate::isl::Schedule| -> Result<Mapping> {
        map_unproven(isl, program, scop, deps, sched, options, gpu_options)
    };
    let fused = kernels(max.copy()?)?;
    if fused.plans.is_empty()
        || fused
            .plans
            .iter()
            .any(|k| k.threads().is_none_or(|t| t.lanes.is_none()))
    {
        return Ok(RowsProbe::default());
    }
    // Fewer kernels than isl's schedule, or as many where some of isl's
    // run their rows without lanes (a row a thread: isl fused the row's
    // loops into one that no lane splits).
    let isl_schedule = schedule::compute(isl, scop, deps, Strategy::Isl)?;
    let isl_mapped = kernels(isl_schedule.copy()?)?;
    let isl_on_lanes = isl_mapped
        .plans
        .iter()
        .all(|k| k.threads().is_some_and(|t| t.lanes.is_some()));
    let better = fused.plans.len() < isl_mapped.plans.len()
        || (fused.plans.len() == isl_mapped.plans.len() && !isl_on_lanes);
    Ok(match better {
        true => RowsProbe {
            fused: Some((max, fused)),
            isl: None,
            siblings: false,
        },
        false => RowsProbe {
            fused: None,
            isl: Some((isl_schedule, Some(isl_mapped))),
            siblings: false,
        },
    })
}

/// [`rows_on_chip`]'s second try: isl's schedule with its independent
/// sibling loops that read the same data fused (`schedule::siblings`: a
/// row's sum and its maximum, each a kernel of its own that reads every
/// row, in one loop), where that gives fewer kernels than isl's schedule,
/// every one of them with its rows across lanes. `probe` is the first
/// try's result, whose schedule and mapping of isl's are reused.
fn sibling_rows(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    options: &Options,
    gpu_options: &GpuOptions,
    probe: RowsProbe,
) -> Result<RowsProbe> {
    let kernels = |sched: crate::isl::Schedule| -> Result<Mapping> {
        map_unproven(isl, program, scop, deps, sched, options, gpu_options)
    };
    // isl's schedule, made here where the first try did not: kept in the
    // probe either way, so that `compile` does not make it again.
    let (isl_schedule, isl_mapped) = match probe.isl {
        Some(made) => made,
        None => (schedule::compute(isl, scop, deps, Strategy::Isl)?, None),
    };
    let unfused = |isl_mapped| -> Result<RowsProbe> {
        Ok(RowsProbe {
            fused: None,
            isl: Some((isl_schedule.copy()?, isl_mapped)),
            siblings: false,
        })
    };
    // Rows split first, so that a row whose reduction isl put in its
    // `(r, c)` band and one whose loop runs below its `r` band (a temp's
    // sum and its epilogue) meet as bands of one member each.
    let split = rows_split(scop, isl_schedule.copy()?)?;
    let Some(fused) = schedule::siblings::shared_reads(isl, &split, scop, deps)? else {
        return unfused(isl_mapped);
    };
    let Ok(mapped) = kernels(fused.copy()?) else {
        return unfused(isl_mapped);
    };
    let isl_mapped = match isl_mapped {
        Some(m) => m,
        None => kernels(isl_schedule.copy()?)?,
    };
    let on_lanes = mapped
        .plans
        .iter()
        .all(|k| k.threads().is_some_and(|t| t.lanes.is_some()));
    Ok(
        match on_lanes && mapped.plans.len() < isl_mapped.plans.len() {
            true => RowsProbe {
                fused: Some((fused, mapped)),
                isl: None,
                siblings: true,
            },
            false => unfused(Some(isl_mapped))?,
        },
    )
}

/// `schedule` with each kernel band of parallel members and one
/// reduction member (isl's `(r, c)` band over a row's initialisations and
/// updates) split into its rows and the reduction loop below them, the
/// initialisations before that loop (`gpu::lanes::split_rows`), so that
/// siblings fuse on their rows and then on their loops, and the rows go
/// across lanes with both siblings' states in one loop. Legal as any reordering is: the mapped
/// schedule is checked against every dependence.
fn rows_split(scop: &model::Scop, schedule: crate::isl::Schedule) -> Result<crate::isl::Schedule> {
    use crate::isl::ScheduleNodeType as T;
    let split = |band: &crate::isl::ScheduleNode| -> Result<Option<crate::isl::ScheduleNode>> {
        if band.get_type()? != T::Band
            || band.band_n_member()? as usize != gpu::mapping::leading_coincident(band)? + 1
        {
            return Ok(None);
        }
        gpu::lanes::split_rows(scop, band)
    };
    let top = schedule.get_root()?.child(0)?;
    match top.get_type()? {
        T::Band => Ok(match split(&top)? {
            Some(rows) => rows.get_schedule()?,
            None => schedule,
        }),
        T::Set | T::Sequence => {
            let mut node = top;
            for i in 0..node.n_children()? {
                let band = node.child(i)?.child(0)?;
                node = match split(&band)? {
                    Some(rows) => rows.parent()?.parent()?,
                    None => band.parent()?.parent()?,
                };
            }
            Ok(node.get_schedule()?)
        }
        _ => Ok(schedule),
    }
}

/// What [`rows_on_chip`] found: the fused schedule where it chose one
/// (maximal fusion, or isl's with sibling loops fused), with its mapping,
/// else isl's schedule (as `compile` would make it: `schedule::compute`
/// under `Strategy::Isl`), with its mapping where the probe made one; not
/// yet proven, for `compile` to take rather than make them again.
#[derive(Default)]
pub(crate) struct RowsProbe {
    pub fused: Option<(crate::isl::Schedule, Mapping)>,
    /// isl's schedule, with its mapping where the probe made one.
    pub isl: Option<(crate::isl::Schedule, Option<Mapping>)>,
    /// `fused` is isl's schedule with sibling loops fused, not maximal
    /// fusion.
    pub siblings: bool,
}
