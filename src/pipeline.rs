//! One compilation, end to end, as a list of named stages, each a value
//! the next takes (see [`compile`]):
//!
//! 1. `model` ([`analysis::Model`]): the user's program as isl sets and
//!    maps.
//! 2. `repair` ([`analysis::Repaired`]): the repair's rewrite, or the
//!    sums' factors moved out; the program scheduled from here on, its
//!    model and defining order.
//! 3. `deps` ([`analysis::Analysis`]): that program's dependences.
//! 4. `schedule` ([`stages::Scheduled`]): its schedule before tiling.
//! 5. `gpu` ([`stages::Mapped`]): the schedule mapped and proven.
//! 6. `kernels` ([`stages::Kernels`]): the CUDA program and its
//!    emulation.
//! 7. `cpu` ([`stages::CpuKernel`]): the tiled CPU kernel's C and the
//!    f64 reference.
//!
//! Strategy probing ([`probe`]), which schedules and maps a program more
//! than once to choose among schedules, runs as named steps inside the
//! `schedule` and `gpu` stages. `POLYFUSE_DUMP` asks for a stage's value
//! as text after it ([`dump`]). Everything isl is created and dropped
//! inside [`compile`]; the result is plain data.

mod analysis;
pub mod dump;
mod mapping;
mod probe;
mod proxy;
mod stages;
mod watch;
pub use dump::{Dump, Stage, StageDump};
pub use watch::{compile_watched, compile_within, unfinished, Watch, WatchEvent};

use crate::codegen;
use crate::deps;
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::isl::Isl;
use crate::model::{self, ModelTensor};
use crate::repair;
use crate::schedule::{ScheduleTree, Strategy};

use analysis::{Analysis, Model, Repaired};
use stages::{CpuKernel, Kernels, Mapped, Scheduled};

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
    /// The stages whose values are handed to a sink as text after they
    /// are made (`POLYFUSE_DUMP`); none by default.
    pub dump: Option<Dump>,
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
            dump: None,
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

/// The dependences of `program` under `options` as `--emit deps` prints
/// them, without scheduling (which can take long, and they do not depend
/// on it): the first three stages, dumped where `options` ask.
pub fn dependences(program: &Program, options: &Options) -> Result<String> {
    let isl = Isl::new();
    let mut run = Run::new(program, options);
    let analysis = run.analyse(&isl, program, options)?;
    analysis.deps_text(&isl, program)
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

/// A compilation's bookkeeping around its stages: the stopwatch, and the
/// dumps `Options::dump` asks for (their formatting not timed).
struct Run<'a> {
    watch: Stopwatch,
    dump: Option<&'a Dump>,
    program: &'a str,
}

impl<'a> Run<'a> {
    fn new(program: &'a Program, options: &'a Options) -> Run<'a> {
        Run {
            watch: Stopwatch::new(),
            dump: options.dump.as_ref(),
            program: &program.name,
        }
    }

    /// `stage`'s value as `text` gives it, to the dump's sink where it
    /// asks for the stage; the time it takes is left out of the stage
    /// timings.
    fn dump(&mut self, stage: Stage, text: impl FnOnce() -> Result<String>) -> Result<()> {
        let start = std::time::Instant::now();
        dump::emit(self.dump, self.program, stage, text)?;
        self.watch.last += start.elapsed();
        Ok(())
    }

    /// The stages every compilation runs: model, repair, dependences.
    fn analyse(&mut self, isl: &Isl, program: &Program, options: &Options) -> Result<Analysis> {
        let model = Model::build(isl, program)?;
        self.dump(Stage::Model, || Ok(model.dump()))?;
        let repaired = Repaired::choose(isl, program, model, options)?;
        self.dump(Stage::Repair, || repaired.dump())?;
        let analysis = Analysis::of(repaired)?;
        self.dump(Stage::Deps, || Ok(analysis.dump()))?;
        Ok(analysis)
    }
}

/// Compiles `program` under `options`: the stages in order (see the
/// module's comment), each value dumped where `options.dump` asks for it.
pub fn compile(program: &Program, options: &Options) -> Result<Compiled> {
    let isl = Isl::new();
    let mut run = Run::new(program, options);
    let analysis = run.analyse(&isl, program, options)?;
    let deps_text = analysis.deps_text(&isl, program)?;
    run.watch.lap("analysis");
    // The rows probe runs inside: see `Scheduled::new`.
    let mut scheduled = Scheduled::new(&isl, program, &analysis)?;
    run.dump(Stage::Schedule, || Ok(scheduled.dump()))?;
    run.watch.lap("schedule");
    let kernels = match &analysis.options().gpu {
        Some(g) => {
            // The race, host-step and cost probes run inside.
            let mapped = Mapped::new(&isl, program, &analysis, &mut scheduled, g)?;
            run.dump(Stage::Gpu, || Ok(mapped.dump()))?;
            run.watch.lap("gpu map");
            let kernels = Kernels::print(program, &analysis, mapped)?;
            run.dump(Stage::Kernels, || Ok(kernels.dump()))?;
            run.watch.lap("gpu print");
            Some(kernels)
        }
        None => {
            for stage in [Stage::Gpu, Stage::Kernels] {
                run.dump(stage, || Ok("none: the target is the CPU\n".into()))?;
            }
            None
        }
    };
    let cpu = CpuKernel::new(
        &isl,
        program,
        &analysis,
        scheduled.schedule,
        &scheduled.untiled_tree,
    )?;
    run.dump(Stage::Cpu, || Ok(cpu.dump()))?;
    run.watch.lap("cpu");
    let scop = analysis.scop();
    Ok(Compiled {
        program: analysis.repaired.program(program).clone(),
        tensors: scop.tensors.clone(),
        tree: cpu.tree,
        untiled_tree: scheduled.untiled_tree,
        deps_text,
        deps_json: analysis.deps.text(),
        model_json: scop.describe(),
        kernel_c: cpu.kernel_c,
        reference_c: cpu.reference_c,
        gpu_tree: kernels.as_ref().map(|k| k.tree.clone()),
        gpu_estimate: kernels.as_ref().and_then(|k| k.estimate.clone()),
        gpu_notes: kernels
            .as_ref()
            .map(|k| k.notes.clone())
            .unwrap_or_default(),
        emulation_c: kernels.as_ref().map(|k| k.emulation.clone()),
        cuda: kernels.map(|k| k.cuda),
        timings: run.watch.laps,
    })
}
