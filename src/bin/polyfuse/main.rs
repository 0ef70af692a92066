//! The `polyfuse` command line: argument parsing and printing only; the
//! work is in the library, which it compiles through as the C ABI does
//! (`polyfuse::session`). Its own modules ([`tune`]: `compare`, `tune`,
//! `cache`; [`sys`]: the signals) are the binary's, not the library's: the
//! library prints nothing and leaves its host's signals alone.

mod sys;
mod tune;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use polyfuse::frontend::ast::Program;
use polyfuse::pipeline::{Dump, Stage};
use polyfuse::runtime::cpu::{self, RunOptions};
use polyfuse::runtime::RunReport;
use polyfuse::schedule::Strategy;
use polyfuse::session::{self, Arch, Session, TunedCache};
use polyfuse::{Error, Options};

/// polyfuse: a polyhedral optimizer for machine-learning kernels.
///
/// A program is a JSON file whose statements are Tensor Comprehensions
/// (see examples/). polyfuse builds its polyhedral model in isl, computes
/// dependences, schedules and tiles it, checks the schedule against the
/// dependences, and generates code.
///
/// Exit status: 0 success, 1 a --check found a mismatch, 2 bad input or an
/// illegal transformation, 3 an environment fault, 4 an internal error.
///
/// Environment: POLYFUSE_SCHEDULE_TIMEOUT (seconds, default 60): a
/// compilation whose schedule isl has not finished by then is stopped and
/// done again with minimal fusion, said on stderr (tune and compare record
/// it as failed). POLYFUSE_CACHE: the compilation cache's file, or `off`.
/// POLYFUSE_CUDA_ARCH: the GPU architecture to compile for instead of the
/// device's (e.g. sm_90 for the paths without wgmma). POLYFUSE_DUMP:
/// stage[,stage...] or all (stages model, repair, deps, schedule, gpu,
/// kernels, cpu, in the order they run): `schedule` and `run` write each
/// such stage's value as text after it to stderr, or with
/// POLYFUSE_DUMP_DIR=DIR to DIR/PROGRAM.STAGE.txt, and compile without the
/// cache's tuned options. CC: the C compiler for the CPU targets (`cc`);
/// POLYFUSE_CFLAGS: its optimisation flags (default `-O2 -march=native`).
/// POLYFUSE_KEEP_SCRATCH=DIR: the CPU targets compile and run their C in
/// a new folder under DIR, kept afterwards (`program.c`, its inputs and
/// outputs), instead of a temporary one.
#[derive(Parser)]
// The version names the build's source fingerprint (the compilation
// cache's key), so a results table says which build it timed.
#[command(
    name = "polyfuse",
    version = concat!(env!("CARGO_PKG_VERSION"), " (source ", env!("POLYFUSE_SOURCE_HASH"), ")"),
    about,
    long_about
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the model, schedule, tile and print the result (the schedule
    /// tree by default).
    Schedule {
        #[command(flatten)]
        common: Common,
        /// What to print.
        #[arg(long, value_enum, default_value = "tree")]
        emit: Emit,
        /// GPU architecture for --emit ptx (sm_90, sm_80, compute_90, ...);
        /// for --emit artifact the devices' architectures to include PTX
        /// for (comma-separated, or `none` for the CUDA source alone).
        #[arg(long, default_value = "sm_90")]
        arch: String,
        /// Print the wall time of each stage of the compilation to stderr
        /// (analysis: model, repair and dependences; schedule; gpu map:
        /// mapping, race proof and the grouping by cost; gpu print; cpu:
        /// the f64 reference, and tiling, AST and C of the CPU kernel,
        /// which --emit cuda, ptx and gpu-tree do not build). Nothing where
        /// the result came from the cache (`--no-cache` to time a
        /// compilation).
        #[arg(long)]
        timings: bool,
    },
    /// Execute the optimised program on random inputs from a fixed seed.
    Run {
        #[command(flatten)]
        common: Common,
        /// Where to run it.
        #[arg(long, value_enum, default_value = "cpu")]
        target: Target,
        /// Also run the unoptimised program in f64 and compare; prints one
        /// line starting with `check: ok` or `check: FAILED`.
        #[arg(long)]
        check: bool,
        /// Time the kernel: median of --runs runs after one warm-up.
        #[arg(long)]
        bench: bool,
        /// Number of timed runs for --bench.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Seed of the input generator.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print one JSON object (program, target, device, check, median_us,
        /// runs, bytes, flops, gb_per_s, tflop_per_s) instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Compare several variants (strategies or option sets) of one program:
    /// kernels, launches, blocks, threads, shared memory, registers,
    /// global-memory bytes, arithmetic intensity, and with --target the
    /// checked time.
    Compare(tune::CompareArgs),
    /// Search the options (tile sizes, block sizes, fusion strategy,
    /// promotion, registers) for the fastest checked variant, by TC's
    /// genetic search or random search, and store it in the cache.
    Tune(tune::TuneArgs),
    /// The compilation cache: list, export, import, clear, path.
    #[command(subcommand)]
    Cache(tune::CacheCommand),
}

#[derive(Args)]
struct Common {
    /// The program (JSON, see the program format).
    file: PathBuf,
    /// Set a parameter: NAME=VALUE (repeatable); overrides the file.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    params: Vec<String>,
    /// Scheduling strategy: isl (isl's scheduler, default options; for a
    /// program a rolling update repaired, and on the GPU for rows that
    /// maximal fusion keeps across lanes in fewer kernels, maximal fusion),
    /// min (minimal fusion), max (maximal fusion; a producer's loop is
    /// also fused into its consumer's where each iteration reads what the
    /// same iteration wrote), canonical (program order).
    #[arg(long, value_parser = parse_strategy)]
    strategy: Option<Strategy>,
    /// Tile sizes for the members of each permutable band, e.g. 32,32,8
    /// (the last size repeats for further members). Default: 32 on the
    /// CPU; on the GPU chosen per kernel (64x64 without a reduction,
    /// 32x32x32 with one, 128x128x16 with a register tile, 1 along z, 8 rows
    /// for warp reductions, 2 for rows on a block; see the README).
    #[arg(long, value_delimiter = ',')]
    tile: Vec<i64>,
    /// Do not tile.
    #[arg(long)]
    no_tile: bool,
    /// GPU: threads per block along x,y,z (e.g. 32,8); default: from the
    /// tile sizes, at most 256 threads (a row that runs across lanes: a
    /// warp, or up to 512 threads for long rows, an online softmax's two
    /// rows of a block tile side by side on y; x sets the threads per
    /// row, a multiple of 32, and such a block then runs one row at a
    /// time when x > 32).
    #[arg(long, value_delimiter = ',')]
    block: Vec<u32>,
    /// GPU: at most this many blocks along x,y,z (blocks then run several
    /// tiles each); default: one block per tile.
    #[arg(long, value_delimiter = ',')]
    grid: Vec<u32>,
    /// GPU: do not promote tiles to shared memory.
    #[arg(long)]
    no_shared: bool,
    /// GPU: keep f16/bf16 contractions (gemm-like statements) and
    /// rolling attention (one FlashAttention-style kernel when polyfuse
    /// chooses the sizes) on the ordinary cores instead of tensor cores
    /// (mma.sync, wgmma).
    #[arg(long)]
    no_tensor_cores: bool,
    /// GPU: a thread's points of a register tile (a gemm's accumulators)
    /// in groups of N consecutive points along each thread axis instead of
    /// points a block apart, and the shared tiles they read laid out so
    /// that a group is contiguous (one 16-byte load for four f32): 1, 2 or
    /// 4; default 1. A tuning choice: `polyfuse tune` tries it.
    #[arg(long, value_name = "N")]
    vector: Option<u32>,
    /// GPU: unroll the step loops of register tiles (a gemm's steps along
    /// k inside one shared tile) where their trip count is a constant.
    /// Default: on for register tiles on the SIMT units whose sizes the
    /// mapping chose (no --tile), off elsewhere.
    #[arg(long, conflicts_with = "no_unroll")]
    unroll: bool,
    /// GPU: do not unroll the step loops of register tiles (see --unroll).
    #[arg(long)]
    no_unroll: bool,
    /// GPU: double-buffer shared tiles along the sequential loop around
    /// them (a gemm's k tiles): the next tile is loaded into registers
    /// while the threads compute on the current one. Doubles the shared
    /// memory. Default: on for register tiles on the SIMT units whose
    /// sizes the mapping chose (no --tile), off elsewhere.
    #[arg(long, conflicts_with = "no_pipeline")]
    pipeline: bool,
    /// GPU: do not double-buffer shared tiles (see --pipeline).
    #[arg(long)]
    no_pipeline: bool,
    /// GPU: split the reduction (k) of a contraction on tensor cores over
    /// N blocks, 1 to 8, that form a thread-block cluster (Hopper): each
    /// block sums its share of k, and the blocks add their partial tiles
    /// in the cluster's shared memory in a fixed order. 1: no split.
    /// Default: split where the output has too few tiles to give every
    /// multiprocessor a block and k is long (a gemm of 128 rows). Kernels
    /// with a batch keep one block per tile.
    #[arg(long, value_name = "N")]
    k_split: Option<u32>,
    /// Keep point loops where tiling put them (no TC-style sinking below
    /// inner tile loops).
    #[arg(long)]
    no_sink: bool,
    /// GPU, default strategy: keep isl's grouping of the statements. By
    /// default polyfuse also maps the program with minimal fusion and takes
    /// that where its cost model expects it to run in at most half the
    /// time (a matrix product fused with what follows it into a kernel
    /// without tiles); `--emit gpu-tree` then shows the mark
    /// `minimal_fusion_by_cost`.
    #[arg(long)]
    no_fusion_by_cost: bool,
    /// GPU: how a loop block's loop that carries a dependence (a
    /// recurrence) runs where the mapping would put it on one thread:
    /// wavefront (the default: the loop on the host, one launch of the
    /// step's parallel kernels per iteration, a wavefront over nested
    /// blocks and a dilated recurrence's chains in one launch where the
    /// dependences allow), steps (the same, one value of each block's
    /// index per launch), serial (one kernel on blocks of one thread).
    /// `--emit gpu-tree` shows the `host_loop_*` marks.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(polyfuse::gpu::Recurrences::NAMES))]
    recurrence: Option<String>,
    /// GPU, default strategy, recurrences on the host's steps: fuse each
    /// step's sums into one accumulator (an LSTM step's gates: the
    /// initialisation, both products and the bias) into one kernel, where
    /// that is legal and maps. The default; the flag is kept for scripts.
    #[arg(long, conflicts_with = "no_fuse_step_sums")]
    fuse_step_sums: bool,
    /// Keep each of a recurrence step's sums in kernels of their own (the
    /// initialisation, each product, the bias).
    #[arg(long)]
    no_fuse_step_sums: bool,
    /// GPU: copy the operand tiles of tensor-core products with every
    /// thread's cp.async, not Hopper's copy engine (TMA, one thread's bulk
    /// tensor copies on mbarriers; the default where the operands allow it:
    /// 2-byte elements, constant extents, rows a multiple of 16 bytes)
    #[arg(long)]
    no_tma: bool,
    /// GPU: store the tiles of tensor-core products from each thread's
    /// registers, not through shared memory (the default where the tile
    /// fits in the pipeline's stages: each thread writes its values there,
    /// then the block copies the tile out a row at a time, 16 bytes a
    /// thread)
    #[arg(long)]
    no_staged_stores: bool,
    /// Algebraic repair of reduction chains (softmax, attention): program
    /// (the file's "schedule" key, or polyfuse's choice without one: rolling
    /// update for long reductions with many rows, split-k for few rows),
    /// off (reductions as written, one pass each, and no factor moved out
    /// of a sum), rolling (rolling update: one pass), split-k (split-k
    /// update in --split slices). Without a rolling or split-k update, a
    /// factor that does not depend on a product's sum index (`/ f32(N -
    /// 1)`, `alpha() *`) is applied once per element after the sum
    /// (`--emit deps` says which).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(polyfuse::repair::Choice::NAMES))]
    repair: Option<String>,
    /// Number of slices of a split-k update (with --repair split-k, which
    /// it implies when given alone); at least 2.
    #[arg(long, value_name = "N")]
    split: Option<i64>,
    /// Without options of the above, the options `tune` stored in the
    /// cache are used (said on stderr); see `polyfuse cache`.
    #[command(flatten)]
    cache: tune::CacheArgs,
}

impl Common {
    /// Whether any option of the schedule was given (then the cache's tuned
    /// options are not consulted).
    fn any_option(&self) -> bool {
        self.strategy.is_some()
            || !self.tile.is_empty()
            || self.no_tile
            || !self.block.is_empty()
            || !self.grid.is_empty()
            || self.no_shared
            || self.no_tensor_cores
            || self.vector.is_some()
            || self.unroll
            || self.no_unroll
            || self.pipeline
            || self.no_pipeline
            || self.k_split.is_some()
            || self.no_sink
            || self.no_fusion_by_cost
            || self.recurrence.is_some()
            || self.no_fuse_step_sums
            || self.no_tma
            || self.no_staged_stores
            || self.repair.is_some()
            || self.split.is_some()
    }

    /// The options the flags give (strategy, sinking, repair; the tile
    /// sizes are [`Common::tile_sizes`]'s), checked against each other.
    fn options(&self, program: &Program) -> Result<Options, Error> {
        let bad = |message: String| Error::Input {
            file: program.source.clone(),
            message,
        };
        if self.split.is_some() && self.repair.as_deref().is_some_and(|r| r != "split-k") {
            return Err(bad(
                "--split sets the slices of a split-k update; it goes with --repair split-k only"
                    .into(),
            ));
        }
        let repair = polyfuse::repair::Choice::from_parts(self.repair.as_deref(), self.split)
            .map_err(|m| bad(format!("--split: {m}")))?;
        if let Some(t) = self.tile.iter().find(|t| **t < 1) {
            return Err(bad(format!("tile size {t} must be at least 1")));
        }
        Ok(Options {
            strategy: self.strategy.unwrap_or(Strategy::Isl),
            sink: !self.no_sink,
            repair,
            dump: dump_from_env()?,
            ..Options::default()
        })
    }

    /// `--tile` or `--no-tile` (empty); None: the target's defaults.
    fn tile_sizes(&self) -> Option<Vec<i64>> {
        if self.no_tile {
            Some(Vec::new())
        } else if self.tile.is_empty() {
            None
        } else {
            Some(self.tile.clone())
        }
    }

    /// The GPU options from the flags (whether tiles are chosen per
    /// kernel is the session's to say).
    fn gpu_options(&self) -> polyfuse::gpu::GpuOptions {
        polyfuse::gpu::GpuOptions {
            block: self.block.clone(),
            grid: self.grid.clone(),
            shared: !self.no_shared,
            tensor_cores: !self.no_tensor_cores,
            vector: self.vector.unwrap_or(1),
            unroll: either(self.unroll, self.no_unroll),
            pipeline: either(self.pipeline, self.no_pipeline),
            k_split: self.k_split,
            fusion_by_cost: !self.no_fusion_by_cost,
            recurrences: self
                .recurrence
                .as_deref()
                .and_then(polyfuse::gpu::Recurrences::parse)
                .unwrap_or(polyfuse::gpu::Recurrences::Wavefront),
            fuse_step_sums: !self.no_fuse_step_sums,
            tma: !self.no_tma,
            staged_stores: !self.no_staged_stores,
            ..Default::default()
        }
    }

    /// The session for `program` under the flags, for `target`; the
    /// cache's tuned options are looked up for `arch`. Its events are
    /// printed on stderr as they happen.
    fn session<'a>(
        &self,
        program: &Program,
        target: session::Target,
        arch: Arch<'a>,
    ) -> Result<Session<'a>, Error> {
        let options = self.options(program)?;
        let source = program.source.clone();
        // A dump asks for a compilation: not the cache's tuned options or
        // compiled program.
        let given = self.any_option() || options.dump.is_some();
        Ok(Session::new(program.clone())
            .options(options, given)
            .tile(self.tile_sizes())
            .target(target)
            .cache(self.cache.path().map(|path| TunedCache {
                path,
                arch,
                program_errors_fail: false,
            }))
            .observe(move |e| eprintln!("{}", e.message(&source))))
    }
}

/// `POLYFUSE_DUMP` and `POLYFUSE_DUMP_DIR` (see the environment paragraph
/// of `--help`): the stages to dump and where their text goes; `None`
/// where no dump is asked for. The library only hands the text over.
fn dump_from_env() -> Result<Option<Dump>, Error> {
    let Some(list) = std::env::var_os("POLYFUSE_DUMP") else {
        return Ok(None);
    };
    let stages = Stage::parse_list(&list.to_string_lossy()).map_err(|message| Error::Input {
        file: "POLYFUSE_DUMP".into(),
        message,
    })?;
    let Some(dir) = std::env::var_os("POLYFUSE_DUMP_DIR").map(PathBuf::from) else {
        return Ok(Some(Dump::new(stages, |d| {
            eprint!(
                "polyfuse: dump of stage {} ({}):\n{}",
                d.stage, d.program, d.text
            );
            if !d.text.ends_with('\n') {
                eprintln!();
            }
            Ok(())
        })));
    };
    let fault = |path: &std::path::Path, e: std::io::Error| {
        Error::Environment(format!("POLYFUSE_DUMP_DIR: {}: {e}", path.display()))
    };
    std::fs::create_dir_all(&dir).map_err(|e| fault(&dir, e))?;
    Ok(Some(Dump::new(stages, move |d| {
        // The program's name as a file name: anything but letters, digits,
        // `_`, `-` and `.` becomes `_`.
        let name: String = d
            .program
            .chars()
            .map(|c| match c.is_ascii_alphanumeric() || "_-.".contains(c) {
                true => c,
                false => '_',
            })
            .collect();
        let path = dir.join(format!("{name}.{}.txt", d.stage));
        std::fs::write(&path, &d.text).map_err(|e| fault(&path, e))
    })))
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| format!("unknown strategy `{s}` (isl, min, max, canonical)"))
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    /// The final schedule tree.
    Tree,
    /// The schedule tree mapped to the GPU: kernel, block, thread and
    /// reduction marks above the mapped bands.
    GpuTree,
    /// The generated C (prelude and kernel).
    C,
    /// The generated CUDA.
    Cuda,
    /// The CUDA compiled to PTX by NVRTC for --arch (needs NVRTC, not a
    /// GPU or driver).
    Ptx,
    /// Model, dependences, schedule and C as one JSON document.
    Json,
    /// Flow, anti and output dependences.
    Deps,
    /// The compiled GPU program as an ahead-of-time artifact (JSON: the
    /// program, launch records, CUDA source and PTX for each --arch), which
    /// the C ABI loads without compiling (`pf_result_load`).
    Artifact,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Target {
    /// The CPU schedule, compiled with the system C compiler.
    Cpu,
    /// The GPU kernels, through NVRTC and the CUDA driver.
    Cuda,
    /// The GPU mapping executed on the CPU: the same mapped and promoted
    /// tree, blocks and threads as loops (what CI checks without a GPU).
    Emulate,
}

/// `schedule --timings`: one line a stage, then the total.
fn print_timings(source: &str, timings: &[polyfuse::pipeline::StageTime]) {
    if timings.is_empty() {
        eprintln!("polyfuse: {source}: timings: none (the result came from the cache)");
        return;
    }
    for t in timings {
        eprintln!("timing: {:<10} {:>9.1} ms", t.stage, t.seconds * 1e3);
    }
    let total: f64 = timings.iter().map(|t| t.seconds).sum();
    eprintln!("timing: {:<10} {:>9.1} ms", "total", total * 1e3);
}

fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Schedule {
            common,
            emit,
            arch,
            timings,
        } => {
            let program = session::load_program(&common.file, &common.params)?;
            let gpu = matches!(
                emit,
                Emit::Cuda | Emit::Ptx | Emit::GpuTree | Emit::Artifact
            );
            let (target, cache_arch) = match emit {
                // The dependences need no schedule (none is computed) and
                // no mapping.
                Emit::Deps => (session::Target::Cpu, "cpu"),
                // An artifact's list of architectures: the first keys the
                // cache.
                Emit::Artifact => (
                    session::Target::Gpu(common.gpu_options()),
                    arch.split(',').next().unwrap_or("sm_90"),
                ),
                _ if gpu => (session::Target::Gpu(common.gpu_options()), arch.as_str()),
                _ => (session::Target::Cpu, "cpu"),
            };
            // Only the GPU side is printed: no CPU kernel is built.
            let gpu_only = matches!(emit, Emit::Cuda | Emit::Ptx | Emit::GpuTree);
            let session = common
                .session(&program, target, Arch::Known(cache_arch.into()))?
                .cpu_kernel(!gpu_only);
            if matches!(emit, Emit::Deps) {
                print!("{}", session.dependences()?);
                return Ok(ExitCode::SUCCESS);
            }
            let compiled = session.compile()?.compiled;
            if timings {
                print_timings(&program.source, &compiled.timings);
            }
            match emit {
                Emit::Tree => print!("{}", compiled.tree),
                Emit::C => print!("{}", compiled.c_source()),
                Emit::Deps => print!("{}", compiled.deps_text),
                Emit::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&compiled.to_json())
                        .map_err(|e| Error::Internal(e.to_string()))?
                ),
                Emit::GpuTree => {
                    if let Some(t) = &compiled.gpu_tree {
                        print!("{t}");
                    }
                    for note in &compiled.gpu_notes {
                        eprintln!("polyfuse: note: {note}");
                    }
                }
                Emit::Cuda => {
                    if let Some(c) = &compiled.cuda {
                        print!("{}", c.source);
                    }
                }
                Emit::Artifact => {
                    let source = polyfuse::tune::aot::Source {
                        text: std::fs::read_to_string(&common.file).map_err(|e| Error::Input {
                            file: program.source.clone(),
                            message: e.to_string(),
                        })?,
                        name: program.source.clone(),
                        params: session::parse_params(&common.params)?,
                        directives: None,
                    };
                    let archs: Vec<String> = if arch == "none" {
                        Vec::new()
                    } else {
                        arch.split(',').map(|a| a.trim().to_string()).collect()
                    };
                    let doc = polyfuse::tune::aot::save(&source, &compiled, "cuda", None, &archs)?;
                    println!("{doc}");
                }
                Emit::Ptx => {
                    let c = compiled.cuda.as_ref().ok_or_else(|| {
                        Error::Environment("this build produces no CUDA to compile".into())
                    })?;
                    print!(
                        "{}",
                        polyfuse::runtime::cuda::compile_ptx(&c.source, &arch)?
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            common,
            target,
            check,
            bench,
            runs,
            seed,
            json,
        } => {
            if target == Target::Cuda {
                // Fail before compiling on a machine without a driver.
                polyfuse::runtime::cuda::probe_driver()?;
            }
            let program = session::load_program(&common.file, &common.params)?;
            let (mapping, cache_arch) = match target {
                Target::Cpu => (session::Target::Cpu, Arch::Known("cpu".into())),
                Target::Emulate => (
                    session::Target::Gpu(common.gpu_options()),
                    Arch::Known("emulate".into()),
                ),
                // The device is asked only when a cache could answer.
                Target::Cuda => (
                    session::Target::Gpu(common.gpu_options()),
                    Arch::Required(Box::new(|| polyfuse::runtime::cuda::device_arch(0))),
                ),
            };
            let session::Compilation {
                compiled, options, ..
            } = common.session(&program, mapping, cache_arch)?.compile()?;
            compiled.param_values()?;
            let run_options = RunOptions {
                check,
                bench_runs: if bench { runs.max(1) } else { 0 },
                seed,
            };
            let report = match target {
                Target::Cuda => polyfuse::runtime::cuda::run(&compiled, &run_options)?,
                Target::Emulate => cpu::run_emulated(&compiled, &run_options)?,
                Target::Cpu => cpu::run(&compiled, &run_options)?,
            };
            if json {
                print_json(&program.name, target, &report)?;
            } else {
                print_report(&program.name, target, &options, &report);
            }
            match &report.check {
                Some(c) if !c.ok => Ok(ExitCode::from(1)),
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Compare(args) => tune::compare(args),
        Command::Tune(args) => tune::tune(args),
        Command::Cache(cmd) => tune::cache(cmd),
    }
}

/// The lines of `run`: what ran where, the time with its rates, the check.
fn print_report(name: &str, target: Target, options: &Options, report: &RunReport) {
    if target == Target::Cuda {
        println!(
            "ran {name} on the gpu ({}; {} kernel{})",
            report.device,
            report.launches,
            if report.launches == 1 { "" } else { "s" }
        );
    } else {
        println!(
            "ran {name} on the cpu{} ({} strategy, tile {})",
            if target == Target::Emulate {
                ", emulating the gpu mapping"
            } else {
                ""
            },
            options.strategy.name(),
            if options.tile.is_empty() {
                "off".to_string()
            } else {
                options
                    .tile
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        );
    }
    if let Some(us) = report.median_us {
        println!(
            "time: median {us:.1} us over {} runs ({:.1} GB/s, {:.3} TFLOP/s)",
            report.runs,
            report.gb_per_s().unwrap_or(0.0),
            report.tflop_per_s().unwrap_or(0.0)
        );
    }
    // Per kernel, where there are several: which one the time goes to.
    if report.kernel_us.len() > 1 {
        let total: f64 = report.kernel_us.iter().map(|(_, t)| t).sum();
        for (k, t) in &report.kernel_us {
            let share = if total > 0.0 { 100.0 * t / total } else { 0.0 };
            println!("  {k}: median {t:.1} us ({share:.0}%)");
        }
    }
    if let Some(c) = &report.check {
        println!("{}", c.line());
    }
}

/// The document of `run --json`: the same facts as [`print_report`], in
/// this order.
#[derive(serde::Serialize)]
struct RunJson<'a> {
    program: &'a str,
    target: Target,
    device: &'a str,
    check: Option<CheckJson<'a>>,
    median_us: Option<f64>,
    runs: usize,
    launches: usize,
    bytes: u64,
    flops: u64,
    gb_per_s: Option<f64>,
    tflop_per_s: Option<f64>,
    kernels: Vec<KernelTime<'a>>,
}

/// The check of `run --json`. JSON has no infinity: an error that is not
/// finite (a NaN where the reference has a number, an element never
/// written) is null, as serde_json writes every non-finite number.
#[derive(serde::Serialize)]
struct CheckJson<'a> {
    ok: bool,
    max_rel_error: f64,
    /// The declared-precision run's error, which sets the bound where
    /// twice it exceeds the dtype's.
    declared_rel_error: f64,
    tensor: Option<&'a str>,
    index: Option<usize>,
    outputs: Vec<OutputJson<'a>>,
}

#[derive(serde::Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    dtype: polyfuse::frontend::ast::DType,
    max_rel_error: f64,
    declared_rel_error: f64,
    bound: f64,
}

#[derive(serde::Serialize)]
struct KernelTime<'a> {
    kernel: &'a str,
    median_us: f64,
}

/// `run --json`: one object with the same facts as [`print_report`].
fn print_json(name: &str, target: Target, report: &RunReport) -> Result<(), Error> {
    let check = report.check.as_ref().map(|c| CheckJson {
        ok: c.ok,
        max_rel_error: c.max_rel_err,
        declared_rel_error: c.declared_rel_err,
        tensor: c.worst.as_ref().map(|(t, _)| t.as_str()),
        index: c.worst.as_ref().map(|(_, i)| *i),
        outputs: c
            .per_output
            .iter()
            .map(|o| OutputJson {
                name: &o.name,
                dtype: o.dtype,
                max_rel_error: o.error,
                declared_rel_error: o.declared,
                bound: o.bound,
            })
            .collect(),
    });
    let doc = RunJson {
        program: name,
        target,
        device: &report.device,
        check,
        median_us: report.median_us,
        runs: report.runs,
        launches: report.launches,
        bytes: report.work.bytes,
        flops: report.work.flops,
        gb_per_s: report.gb_per_s(),
        tflop_per_s: report.tflop_per_s(),
        kernels: report
            .kernel_us
            .iter()
            .map(|(kernel, median_us)| KernelTime {
                kernel,
                median_us: *median_us,
            })
            .collect(),
    };
    println!(
        "{}",
        serde_json::to_string(&doc).map_err(|e| Error::Internal(e.to_string()))?
    );
    Ok(())
}

fn main() -> ExitCode {
    sys::default_sigpipe();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("polyfuse: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// A switch and its `--no-` form: `Some(true)`, `Some(false)`, or `None`
/// (neither given: the mapping decides).
fn either(on: bool, off: bool) -> Option<bool> {
    match (on, off) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}
