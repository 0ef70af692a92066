//! One compilation, end to end: program -> model -> dependences -> schedule
//! (strategy, tiling, sinking, legality) -> C. Everything isl is created and
//! dropped inside [`compile`]; the result is plain data.

use std::collections::HashMap;

pub mod aot;
mod proxy;
mod watch;
pub use watch::{compile_watched, compile_within, unfinished, Watch, WatchEvent};

use crate::codegen::{self, c::Boxes};
use crate::deps;
use crate::error::{Error, Result};
use crate::frontend::ast::{Affine, Program, WhereClause};
use crate::gpu::{self, CudaProgram, GpuOptions};
use crate::isl::{aff_in_params, Isl, IslPrint};
use crate::model::{self, ModelTensor};
use crate::repair;
use crate::schedule::{self, ScheduleTree, Strategy};

/// Options of one compilation.
#[derive(Debug, Clone)]
pub struct Options {
    pub strategy: Strategy,
    /// Tile sizes for the members of each permutable band (the last one
    /// repeats); empty: no tiling.
    pub tile: Vec<i64>,
    /// TC's imperfectly nested tiling: sink point bands below inner tile
    /// bands.
    pub sink: bool,
    /// Also map the tiled tree to the GPU (`--target cuda`, `--emit cuda`,
    /// and the CPU emulation of the mapped tree).
    pub gpu: Option<crate::gpu::GpuOptions>,
    /// The algebraic repair applied: the program's (its `schedule` key or
    /// the automatic choice) or an override.
    pub repair: repair::Choice,
    /// Build the CPU kernel: the tiled and sunk schedule (`Compiled::tree`),
    /// checked against the dependences, and its C (`Compiled::kernel_c`).
    /// Off for a caller that uses only the GPU side (`schedule --emit
    /// cuda`): that stage was up to a third of such a compilation (causal
    /// attention: 520 of 1450 ms). The f64 reference is built either way
    /// (a GPU run's check needs it).
    pub cpu_kernel: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strategy: Strategy::Isl,
            tile: vec![32],
            sink: true,
            gpu: None,
            repair: repair::Choice::Program,
            cpu_kernel: true,
        }
    }
}

/// What a compilation produced. Serde stores it in the cache
/// (`tune::artifact`) without what the caller has (the program) and what
/// describes one run of the compiler (its estimate, notes and timings),
/// so a cache hit rebuilds it without isl.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Compiled {
    #[serde(skip)]
    pub program: Program,
    pub tensors: Vec<ModelTensor>,
    /// The final schedule tree (after tiling and sinking); without
    /// [`Options::cpu_kernel`], the schedule before tiling.
    pub tree: ScheduleTree,
    /// The schedule before tiling.
    pub untiled_tree: ScheduleTree,
    /// `flow:`, `anti:`, `output:` lines.
    pub deps_text: String,
    /// The dependences and the model as isl text, for `--emit json`.
    pub deps_json: deps::Text,
    pub model_json: model::Description,
    /// The optimised kernel, `pf_kernel` (C, without the prelude); empty
    /// without [`Options::cpu_kernel`].
    pub kernel_c: String,
    /// The f64 reference `pf_reference`, when every parameter has a value.
    pub reference_c: Option<String>,
    /// The mapped schedule tree, when [`Options::gpu`] asked for it.
    pub gpu_tree: Option<ScheduleTree>,
    /// The GPU program, when [`Options::gpu`] asked for it.
    pub cuda: Option<crate::gpu::CudaProgram>,
    /// The cost model's estimate of the GPU program (`gpu::cost`), when
    /// `GpuOptions::estimate` asked for it and every size is known.
    #[serde(skip)]
    pub gpu_estimate: Option<crate::gpu::cost::Estimate>,
    /// The mapped and promoted tree as C for the CPU (`pf_kernel`, blocks
    /// and threads as loops), when [`Options::gpu`] asked for it.
    pub emulation_c: Option<String>,
    /// What the GPU mapping tried and refused, one line each (a wavefront
    /// the dependences forbid); the command line prints them as notes.
    #[serde(skip)]
    pub gpu_notes: Vec<String>,
    /// Wall time of each stage of the compilation that made this result,
    /// in order (`schedule --timings` prints them); empty for a result
    /// read back from the cache or an artifact.
    #[serde(skip)]
    pub timings: Vec<StageTime>,
}

impl Compiled {
    /// Parameter values in file order; errors when one is symbolic.
    pub fn param_values(&self) -> Result<Vec<i64>> {
        self.program
            .params
            .iter()
            .map(|p| {
                p.value.ok_or_else(|| Error::Input {
                    file: self.program.source.clone(),
                    message: format!(
                        "parameter {} has no value; give it one (`--param {}=VALUE` on the command line, `pf_context_set_param_value` in the C ABI)",
                        p.name, p.name
                    ),
                })
            })
            .collect()
    }

    /// The complete C source: prelude and kernel.
    pub fn c_source(&self) -> String {
        format!("{}\n{}", codegen::c::prelude(&self.program), self.kernel_c)
    }

    /// The document of `--emit json`.
    pub fn to_json(&self) -> EmitJson<'_> {
        EmitJson {
            name: &self.program.name,
            model: &self.model_json,
            dependences: &self.deps_json,
            schedule: &self.tree,
            schedule_text: self.tree.to_string(),
            c: self.c_source(),
        }
    }
}

/// The document of `--emit json`, in this order.
#[derive(serde::Serialize)]
pub struct EmitJson<'a> {
    name: &'a str,
    model: &'a model::Description,
    dependences: &'a deps::Text,
    schedule: &'a ScheduleTree,
    schedule_text: String,
    c: String,
}

/// What every compilation computes before scheduling: the model of the
/// user's program, the repair, and the dependences of the program that is
/// scheduled (the repaired one where there is one).
struct Analysis {
    original: model::Scop,
    repaired: Option<repair::Repaired>,
    /// Without a repair: the program with its sums' invariant factors
    /// moved out (`repair::factor`), where any moved; and what moved.
    factored: repair::factor::Hoisted,
    /// The repair's steps (size-free: targets by name, split factors).
    steps: Vec<repair::Step>,
    /// The options with the repair's tile sizes, where it chose some.
    options: Options,
    scop: model::Scop,
    /// The defining order the dependences were computed under.
    order: isl_rs::Schedule,
    deps: deps::Dependences,
}

impl Analysis {
    fn new(isl: &Isl, program: &Program, options: &Options) -> Result<Analysis> {
        let original = model::build(isl, program)?;
        model::check_reads_written(isl, program, &original)?;
        // Repair (rolling / split-k update) from the `schedule` key, or
        // chosen automatically; the repaired program comes with its
        // defining order.
        let steps = repair::steps_for(isl, program, &original, options.repair)?;
        Analysis::with_steps(isl, program, original, options, steps)
    }

    /// The analysis of `program` (modelled as `original`) repaired by
    /// `steps`: the proxy of `proxy::schedule_at_proxy_sizes` takes the
    /// real program's steps, not a choice made again at its own sizes.
    fn with_steps(
        isl: &Isl,
        program: &Program,
        original: model::Scop,
        options: &Options,
        steps: Vec<repair::Step>,
    ) -> Result<Analysis> {
        let applied =
            repair::apply_with_dependences(isl, program, &original, &steps, repair::Fault::None)?;
        let (repaired, proven) = match applied {
            Some((r, deps)) => (Some(r), deps),
            None => (None, None),
        };
        let mut options = options.clone();
        if let Some(t) = repair::tile_sizes(&steps) {
            options.tile = t;
        }
        // A factor out of a sum, where no repair took the program (a
        // repair's own rewrites stay as they are) and the user did not
        // ask for the program as written (`--repair off`).
        let factored = if repaired.is_none() && options.repair != repair::Choice::Off {
            repair::factor::hoist(isl, program, &original)?
        } else {
            repair::factor::Hoisted::none()
        };
        let scop = match (&repaired, &factored.program) {
            (Some(r), _) => model::build(isl, &r.program)?,
            (None, Some(p)) => model::build(isl, p)?,
            (None, None) => model::build(isl, program)?,
        };
        let order = match repaired.as_ref().and_then(|r| r.order.as_ref()) {
            Some(tree) => isl.schedule(&tree.to_isl_text())?,
            None => schedule::canonical(isl, &scop)?,
        };
        // The repair's proof computed the same dependences: the same
        // program, modelled alike, in the same order.
        let deps = match proven {
            Some(d) => d,
            None => deps::compute(&scop, &order)?,
        };
        Ok(Analysis {
            original,
            repaired,
            factored,
            steps,
            options,
            scop,
            order,
            deps,
        })
    }

    /// `flow:`, `anti:`, `output:` lines, after the repair's report; for a
    /// program with loop blocks, then the distances over the blocks'
    /// indices.
    fn deps_text(&self, isl: &Isl, program: &Program) -> Result<String> {
        let text = match (&self.repaired, &self.factored.program) {
            (Some(r), _) => format!(
                "{}dependences of the repaired program:\n{}",
                r.report,
                self.deps.describe()
            ),
            (None, Some(_)) => format!(
                "{}dependences of the program with its factors moved:\n{}",
                self.factored.report,
                self.deps.describe()
            ),
            (None, None) => format!("{}{}", self.factored.report, self.deps.describe()),
        };
        let fixed = program.params.iter().all(|p| p.value.is_some());
        Ok(text + &self.deps.describe_carried(isl, &self.scop, fixed)?)
    }
}

/// The dependences of `program` under `options` as `--emit deps` prints
/// them, without scheduling (which can take long, and they do not depend
/// on it).
pub fn dependences(program: &Program, options: &Options) -> Result<String> {
    let isl = Isl::new();
    Analysis::new(&isl, program, options)?.deps_text(&isl, program)
}

/// The wall time of one stage of [`compile`].
#[derive(Debug, Clone, PartialEq)]
pub struct StageTime {
    /// `analysis` (model, repair, dependences), `schedule`, `gpu map`
    /// (mapping, race proof, the grouping by cost), `gpu print`, `cpu`
    /// (the CPU kernel where [`Options::cpu_kernel`] asks for it: tiling,
    /// the AST, C; the f64 reference).
    pub stage: &'static str,
    pub seconds: f64,
}

/// A stopwatch that records one [`StageTime`] per lap.
struct Stopwatch {
    last: std::time::Instant,
    laps: Vec<StageTime>,
}

impl Stopwatch {
    fn new() -> Stopwatch {
        Stopwatch {
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    fn lap(&mut self, stage: &'static str) {
        let now = std::time::Instant::now();
        self.laps.push(StageTime {
            stage,
            seconds: (now - self.last).as_secs_f64(),
        });
        self.last = now;
    }
}

/// Compiles `program` under `options`.
pub fn compile(program: &Program, options: &Options) -> Result<Compiled> {
    let file = program.source.as_str();
    let mut watch = Stopwatch::new();
    let isl = Isl::new();
    let analysis = Analysis::new(&isl, program, options)?;
    let deps_text = analysis.deps_text(&isl, program)?;
    watch.lap("analysis");
    let Analysis {
        original,
        repaired,
        factored,
        steps,
        options,
        scop,
        order,
        deps,
    } = analysis;
    let options = &options;
    let program_k = match (&repaired, &factored.program) {
        (Some(r), _) => &r.program,
        (None, Some(p)) => p,
        (None, None) => program,
    };
    // A rolling update fuses a chain of reductions into one pass over each
    // row; isl's scheduler would then split the row's consumers (a
    // softmax's output, attention's division) into a kernel of their own,
    // which reads the row again from memory. Maximal fusion keeps them in
    // the row's loop, where the GPU keeps the row on chip (`gpu::lanes`).
    //
    // Without a rolling update the same holds for a chain of plain row
    // reductions and maps (layer norm): on the GPU, maximal fusion is
    // chosen where it gives fewer kernels than isl's schedule and every one
    // of them keeps its rows across lanes ([`rows_on_chip`]). A split-k
    // repair keeps isl's schedule of its symbolic sizes (scheduling its
    // pinned sizes a second time cost seconds, and its partial reductions
    // are no rows of lanes).
    //
    // The probe's schedule, where it chose maximal fusion, is the one used
    // below; where maximal fusion cannot be mapped, isl's schedule stays
    // (and reports its own errors).
    //
    // Not for a program with loop blocks: the probe schedules the whole
    // program twice more with its sizes pinned, which for a recurrence
    // takes tens of seconds (a stacked LSTM at T = 256, H = 256: 30 s),
    // and its steps' rows run on the host's steps anyway.
    let blocks = program_k.statements.iter().any(|s| !s.blocks.is_empty());
    let probe = match (options.strategy, &options.gpu) {
        (Strategy::Isl, Some(gpu)) if repaired.is_none() && !blocks => {
            rows_on_chip(&isl, program_k, &scop, &deps, options, gpu).unwrap_or_default()
        }
        _ => RowsProbe::default(),
    };
    let RowsProbe {
        fused: fused_rows,
        isl: probed_isl,
    } = probe;
    let rows_fused = fused_rows.is_some();
    // The mapping (not yet proven) of the schedule chosen below where the
    // probe made it already: the same schedule mapped under the same
    // options, as `map_for_race_freedom` would map it first.
    let mut premapped: Option<Mapped> = None;
    let strategy = match options.strategy {
        Strategy::Isl if program_k.rolling.is_some() || rows_fused => Strategy::Max,
        s => s,
    };
    let sched = if options.strategy == Strategy::Canonical {
        if repaired.is_some() {
            schedule::annotate_bands(&isl, order, &deps, &scop.param_prefix)?
        } else {
            schedule::compute(&isl, &scop, &deps, strategy)?
        }
    } else {
        // A repaired program, and one with loop blocks, is scheduled with
        // its sizes symbolic (see `schedule_symbolic`); others with the
        // sizes they have. (A stacked LSTM at T = 256, H = 256 took 26 s
        // with its sizes pinned, 0.9 s without.)
        let order = repaired.as_ref().map(|r| r.order.as_ref());
        let proxy = match &repaired {
            Some(r) if !blocks => proxy::schedule_at_proxy_sizes(
                &isl,
                &proxy::Real {
                    program,
                    repaired: &r.program,
                    steps: &steps,
                    scop: &scop,
                    deps: &deps,
                    options,
                },
                strategy,
            ),
            _ => None,
        };
        let symbolic = proxy.or_else(|| {
            (repaired.is_some() || blocks).then_some(())?;
            let s = schedule_symbolic(&isl, program_k, order.flatten(), strategy)?;
            let s = s.intersect_domain(scop.domain().ok()?).ok()?;
            // Valid for every size, so for these; checked all the same.
            schedule::check_legal(file, &s, &scop, &deps).ok()?;
            Some(s)
        });
        match (symbolic, fused_rows) {
            (Some(s), _) => s,
            (None, Some((s, mapped))) => {
                premapped = Some(mapped);
                s
            }
            // The probe computed isl's schedule as this would, and mapped
            // it.
            (None, None) => match probed_isl.filter(|_| strategy == Strategy::Isl) {
                Some((s, mapped)) => {
                    premapped = Some(mapped);
                    s
                }
                None => schedule::compute(&isl, &scop, &deps, strategy)?,
            },
        }
    };
    // Maximal fusion also takes in a producer's loop that isl left beside
    // its consumer's (attention's scores beside its rolling loop). Not
    // where maximal fusion was chosen for its rows across lanes: a map
    // fused into a reduction's loop leaves that loop no lane split (a
    // row's `t = f(x)` then `s += t` ran a row a thread, 5 kernels' worth
    // of time in one).
    let sched = if strategy == Strategy::Max && !rows_fused {
        schedule::fuse::aligned_loops(&isl, sched, &scop, &deps)?
    } else {
        sched
    };
    // Under the default strategy, sums into one accumulator that isl left
    // in loop nests of their own (an LSTM cell's `G +=! X W; G += H U`)
    // share one band: one kernel, the accumulator never in memory between
    // them (`schedule::sums`; kept only where legal).
    let sched = match strategy {
        Strategy::Isl if repaired.is_none() && !blocks => {
            schedule::sums::fuse_sibling_sums(&isl, program_k, &scop, &deps, &sched)?
                .unwrap_or(sched)
        }
        _ => sched,
    };
    schedule::check_legal(file, &sched, &scop, &deps)?;
    let untiled_tree = ScheduleTree::from_isl(&sched.get_root()?)?;
    watch.lap("schedule");
    let gpu = match &options.gpu {
        Some(g) => {
            let mapped = map_for_race_freedom(
                &isl, program_k, &scop, &deps, &sched, premapped, strategy, options, g,
            )?;
            // Recurrences the mapping serialised run on the host's steps.
            let (mapped, stepped) =
                step_on_host(&isl, program_k, &scop, &deps, mapped, strategy, options, g)?;
            // The grouping by cost (issue 32): under the default strategy,
            // minimal fusion where the model expects it to be faster (not
            // for loop blocks: minimal fusion at pinned sizes is as slow as
            // the probe above, and the model counts no host loop).
            let (mapped, estimate) = match (options.strategy, &repaired) {
                (Strategy::Isl, None) if g.fusion_by_cost && !blocks => {
                    choose_by_cost(&isl, program_k, &scop, &deps, mapped, options, g)?
                }
                _ => (mapped, None),
            };
            let estimate = match estimate {
                None if g.estimate => gpu::cost::estimate(
                    &scop,
                    program_k,
                    &mapped.schedule,
                    &mapped.plans,
                    &gpu::cost::Machine::H100,
                )?,
                e => e.filter(|_| g.estimate),
            };
            let notes = stepped.map(|s| s.refused).unwrap_or_default();
            watch.lap("gpu map");
            let printed = print_gpu(program_k, &scop, mapped)?;
            watch.lap("gpu print");
            Some((printed, estimate, notes))
        }
        None => None,
    };
    let (tree, kernel_c) = if options.cpu_kernel {
        cpu_kernel(&isl, program_k, &scop, &deps, sched, options)?
    } else {
        (untiled_tree.clone(), String::new())
    };
    let values = program.known_params();
    let reference_c = if values.len() == program.params.len() {
        // The reference is the original program's, whatever was repaired.
        let boxes = bounding_boxes(&original, &values)?;
        Some(codegen::c::reference(program, &original, &boxes))
    } else {
        None
    };
    watch.lap("cpu");
    Ok(Compiled {
        program: program_k.clone(),
        tensors: scop.tensors.clone(),
        tree,
        untiled_tree,
        deps_text,
        deps_json: deps.text(),
        model_json: scop.describe(),
        kernel_c,
        reference_c,
        gpu_tree: gpu.as_ref().map(|g| g.0 .0.clone()),
        cuda: gpu.as_ref().map(|g| g.0 .1.clone()),
        gpu_estimate: gpu.as_ref().and_then(|g| g.1.clone()),
        gpu_notes: gpu.as_ref().map(|g| g.2.clone()).unwrap_or_default(),
        emulation_c: gpu.map(|g| g.0 .2),
        timings: watch.laps,
    })
}

/// The CPU kernel of `sched`: tiled and sunk as `options` say, checked
/// against the dependences (as every schedule codegen sees), and printed
/// as C; with its schedule tree.
fn cpu_kernel(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    sched: isl_rs::Schedule,
    options: &Options,
) -> Result<(ScheduleTree, String)> {
    let tiled = schedule::tile(isl, sched, &options.tile)?;
    let mut tree = ScheduleTree::from_isl(&tiled.get_root()?)?;
    if options.sink && !options.tile.is_empty() {
        tree.root = schedule::sink_point_bands(isl, tree.root)?;
    }
    let final_schedule = isl.schedule(&tree.to_isl_text())?;
    schedule::check_legal(&program.source, &final_schedule, scop, deps)?;
    let ast = codegen::build_ast(scop, &final_schedule)?;
    Ok((tree, codegen::c::kernel(program, scop, &ast)))
}

/// isl's schedule for `program` with every parameter symbolic (`>= 1`),
/// or `None` where that model cannot be built.
///
/// Why: a parameter with a value is pinned in the context, and isl then
/// folds it into every constraint (`j <= 4095`). The scheduler's integer
/// programs with such constants can need very many cutting planes: causal
/// attention took 4 s at S = 256 and minutes at S = 4096. A schedule valid
/// for all sizes is valid for the pinned ones (the caller intersects its
/// domain and checks it against the pinned dependences). It is used for
/// repaired programs only: isl fuses differently without the sizes (gemm's
/// initialisation leaves the k band), and the programs a repair writes are
/// the ones whose integer programs grow (isl's operation quota does not
/// catch it: few pivots, each on huge integers).
fn schedule_symbolic(
    isl: &Isl,
    program: &Program,
    order: Option<&ScheduleTree>,
    strategy: Strategy,
) -> Option<isl_rs::Schedule> {
    if program.params.iter().all(|p| p.value.is_none()) {
        return None;
    }
    let mut symbolic = program.clone();
    for p in &mut symbolic.params {
        p.value = None;
    }
    // A repair writes its statements' ranges with the sizes' values
    // (`i in 0:4096`); a bound equal to one parameter's value alone is read
    // as that parameter here.
    let mut by_value: HashMap<i64, Vec<&str>> = HashMap::new();
    for p in &program.params {
        if let Some(v) = p.value {
            by_value.entry(v).or_default().push(p.name.as_str());
        }
    }
    for st in &mut symbolic.statements {
        for w in &mut st.wheres {
            if let WhereClause::Range { hi, .. } = w {
                if let Some(name) = hi.as_constant().and_then(|c| match by_value.get(&c) {
                    Some(names) if names.len() == 1 => Some(names[0]),
                    _ => None,
                }) {
                    *hi = Affine::var(name);
                }
            }
        }
    }
    let scop = model::build(isl, &symbolic).ok()?;
    let order = match order {
        Some(tree) => {
            let mut tree = tree.clone();
            tree.domain = scop.domain().ok()?.text();
            isl.schedule(&tree.to_isl_text()).ok()?
        }
        None => schedule::canonical(isl, &scop).ok()?,
    };
    // Only the scheduler sees these dependences (its result is checked
    // against the pinned ones, which are printed).
    let deps = deps::compute_flat(&scop, &order).ok()?;
    schedule::compute(isl, &scop, &deps, strategy).ok()
}

/// A mapping the gpu stage made and proved: the mapped schedule (checked
/// against every dependence like the CPU schedule, and race-free) and one
/// plan per kernel.
struct Mapped {
    schedule: isl_rs::Schedule,
    plans: Vec<gpu::mapping::KernelPlan>,
}

/// Maps `schedule` and proves the mapping: legal, parallel where it says
/// so, and race-free (with the barriers it left out of step loops back in
/// where that makes the proof go through).
fn map_proven(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    schedule: isl_rs::Schedule,
    options: &Options,
    gpu_options: &GpuOptions,
) -> Result<Mapped> {
    let unproven = map_unproven(isl, program, scop, deps, schedule, options, gpu_options)?;
    prove(isl, program, scop, deps, unproven)
}

/// The gpu stage's mapping of `schedule` and its plans, not yet proven
/// (what the cost model weighs; [`prove`] before anything is printed).
fn map_unproven(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    schedule: isl_rs::Schedule,
    options: &Options,
    gpu_options: &GpuOptions,
) -> Result<Mapped> {
    gpu_options.validate().map_err(|message| Error::Input {
        file: program.source.clone(),
        message,
    })?;
    let (mapped, plans) = gpu::mapping::map(
        isl,
        program,
        scop,
        deps,
        schedule,
        &options.tile,
        gpu_options,
    )?;
    Ok(Mapped {
        schedule: mapped,
        plans,
    })
}

/// `mapped` checked: legal, parallel where it says so, and race-free (with
/// the barriers it left out of step loops back in where that makes the
/// proof go through).
fn prove(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    mapped: Mapped,
) -> Result<Mapped> {
    let Mapped {
        schedule: mapped,
        plans,
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
    Ok(Mapped {
        schedule: mapped,
        plans,
    })
}

/// The GPU side of a compilation from its proven mapping: the mapped tree,
/// its CUDA, and its C emulation.
fn print_gpu(
    program: &Program,
    scop: &model::Scop,
    mapped: Mapped,
) -> Result<(ScheduleTree, CudaProgram, String)> {
    let tree = ScheduleTree::from_isl(&mapped.schedule.get_root()?)?;
    let ast = codegen::build_ast(scop, &mapped.schedule)?;
    let (cuda, emulation) = codegen::cuda::program(program, scop, &ast, &mapped.plans)?;
    Ok((tree, cuda, emulation))
}

/// `sched` mapped and proven; where the race proof refuses it, the
/// statements in kernels of their own (minimal fusion), then blocks of one
/// thread, each marked so in the mapped tree; else the refusal.
/// `premapped`, where given, is `sched`'s mapping made already (by
/// `map_unproven` with these options), proven here as `sched`'s would be.
#[allow(clippy::too_many_arguments)]
fn map_for_race_freedom(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    sched: &isl_rs::Schedule,
    premapped: Option<Mapped>,
    strategy: Strategy,
    options: &Options,
    g: &GpuOptions,
) -> Result<Mapped> {
    let file = program.source.as_str();
    let map = |s: isl_rs::Schedule| map_proven(isl, program, scop, deps, s, options, g);
    let blocks = program.statements.iter().any(|s| !s.blocks.is_empty());
    // Last, blocks of one thread, which no mapping of the threads can make
    // race. With loop blocks, in program order (the blocks' loops
    // outermost, no skewing): the fuzzer found a skewed schedule whose
    // register tile over a block's loop lost elements on blocks of one
    // thread.
    let single = |race: Error| -> Result<Mapped> {
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
fn step_on_host(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    mapped: Mapped,
    strategy: Strategy,
    options: &Options,
    g: &GpuOptions,
) -> Result<(Mapped, Option<schedule::host::Stepped>)> {
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
        match map_proven(
            isl,
            program,
            scop,
            deps,
            stepped.schedule.copy()?,
            options,
            g,
        ) {
            Ok(m) => {
                let mut stepped = stepped;
                refused.append(&mut stepped.refused);
                stepped.refused = refused;
                return Ok((m, Some(stepped)));
            }
            Err(e @ (Error::Race { .. } | Error::Illegal { .. })) => {
                refused.push(format!("host steps refused: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    Ok((mapped, None))
}

/// `schedule` with mark `name` below its root (above everything), so that
/// `--emit gpu-tree` says why the schedule is what it is.
fn marked(isl: &Isl, schedule: isl_rs::Schedule, name: &str) -> Result<isl_rs::Schedule> {
    let root = schedule.get_root()?;
    Ok(match root.n_children()? {
        0 => schedule,
        _ => root
            .child(0)?
            .insert_mark(isl_rs::Id::read_from_str(&isl.ctx, name)?)?
            .get_schedule()?,
    })
}

/// How much faster (by the cost model) another grouping must be expected
/// to run before it replaces the default one: the model ranks by orders of
/// magnitude, not by percent.
const COST_MARGIN: f64 = 0.5;

/// The default mapping, or the cheapest of two other groupings where the
/// cost model (`gpu::cost`) expects it to take less than [`COST_MARGIN`]
/// of the default's time (a product fused with its consumers into a
/// kernel that loses its tiles, issue 32): minimal fusion, and minimal
/// fusion with each product's epilogue in its band
/// (`schedule::epilogue`), marked `minimal_fusion_by_cost` or
/// `contraction_epilogues_by_cost` in the mapped tree. The second is
/// verified against the dependences once more here (a group found illegal
/// is left out inside `contraction_epilogues`). Where the default cannot
/// be estimated (symbolic sizes) or no other grouping can be mapped, the
/// default stays. Gives the chosen mapping with its estimate, when one was
/// made.
fn choose_by_cost(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    default: Mapped,
    options: &Options,
    g: &GpuOptions,
) -> Result<(Mapped, Option<gpu::cost::Estimate>)> {
    let machine = gpu::cost::Machine::H100;
    // The default's estimate is made where a candidate is weighed against
    // it, not before: where no candidate is (one statement, or minimal
    // fusion in as many kernels), it is only wanted with
    // `GpuOptions::estimate`, and `compile` then makes the same one of the
    // same mapping. Without it the default stays, as the estimate gives
    // none where a size has no value.
    if !gpu::cost::estimable(program) {
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
    if let Some(fused) = schedule::epilogue::contraction_epilogues(isl, program, scop, deps, &min)?
    {
        schedule::check_legal(&program.source, &fused, scop, deps)?;
        candidates.push((marked(isl, fused, "contraction_epilogues_by_cost")?, false));
    }
    // Minimal fusion in as many kernels as the default is the same
    // grouping: nothing to weigh.
    candidates.push((marked(isl, min, "minimal_fusion_by_cost")?, true));
    let mut best: (Mapped, Option<gpu::cost::Estimate>) = (default, None);
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
        if let Some(e) = gpu::cost::estimate(scop, program, &alt.schedule, &alt.plans, &machine)? {
            let best_seconds = match &best.1 {
                Some(b) => b.seconds(),
                None => {
                    let Some(b) = gpu::cost::estimate(
                        scop,
                        program,
                        &best.0.schedule,
                        &best.0.plans,
                        &machine,
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
fn rows_on_chip(
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
    let max = schedule::compute(isl, scop, deps, Strategy::Max)?;
    if !gpu::mapping::kernels_have_lane_rows(program, scop, &max)? {
        return Ok(RowsProbe::default());
    }
    // (`map_unproven`: the options are valid, so it maps as
    // `gpu::mapping::map` does.)
    let kernels = |sched: isl_rs::Schedule| -> Result<Mapped> {
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
        },
        false => RowsProbe {
            fused: None,
            isl: Some((isl_schedule, isl_mapped)),
        },
    })
}

/// What [`rows_on_chip`] found: the maximal-fusion schedule where it
/// chose it, else isl's schedule where it computed it (as `compile` would:
/// `schedule::compute` under `Strategy::Isl`), each with its mapping, not
/// yet proven, for `compile` to take rather than make them again.
#[derive(Default)]
struct RowsProbe {
    fused: Option<(isl_rs::Schedule, Mapped)>,
    isl: Option<(isl_rs::Schedule, Mapped)>,
}

/// Integer bounds of each statement's iterators (all parameters fixed by
/// the context). Statements with an empty domain are left out.
fn bounding_boxes(scop: &model::Scop, values: &HashMap<String, i64>) -> Result<Boxes> {
    let mut boxes = Boxes::new();
    for s in &scop.statements {
        if s.domain.is_empty()? {
            continue;
        }
        let mut b = Vec::new();
        for pos in 0..s.iterators.len() as i32 {
            let lo = fixed_value(s.domain.copy()?.dim_min(pos)?, scop, values)?;
            let hi = fixed_value(s.domain.copy()?.dim_max(pos)?, scop, values)?;
            b.push((lo, hi));
        }
        boxes.insert(s.name.clone(), b);
    }
    Ok(boxes)
}

fn fixed_value(
    pa: isl_rs::PwAff,
    scop: &model::Scop,
    values: &HashMap<String, i64>,
) -> Result<i64> {
    let pa = pa.gist_params(scop.context.copy()?)?;
    if !pa.isa_aff()? {
        return Err(Error::Internal(format!(
            "bound {} is not one affine piece",
            pa.text()
        )));
    }
    let (c, terms) = aff_in_params(&pa.as_aff()?)?;
    let mut v = c;
    for (name, k) in terms {
        v += k * values
            .get(&name)
            .ok_or_else(|| Error::Internal(format!("parameter {name} has no value")))?;
    }
    Ok(v)
}
