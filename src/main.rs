//! The `polyfuse` command line: argument parsing and printing only; the
//! work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use polyfuse::runtime::cpu::{self, RunOptions};
use polyfuse::schedule::Strategy;
use polyfuse::{compile, frontend, Error, Options};

/// polyfuse: a polyhedral optimizer for machine-learning kernels.
///
/// A program is a JSON file whose statements are Tensor Comprehensions
/// (see examples/). polyfuse builds its polyhedral model in isl, computes
/// dependences, schedules and tiles it, checks the schedule against the
/// dependences, and generates code.
///
/// Exit status: 0 success, 1 a --check found a mismatch, 2 bad input or an
/// illegal transformation, 3 an environment fault, 4 an internal error.
#[derive(Parser)]
#[command(name = "polyfuse", version, about, long_about)]
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
    },
}

#[derive(Args)]
struct Common {
    /// The program (JSON, see the program format).
    file: PathBuf,
    /// Set a parameter: NAME=VALUE (repeatable); overrides the file.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    params: Vec<String>,
    /// Scheduling strategy: isl (isl's scheduler, default options), min
    /// (minimal fusion), max (maximal fusion), canonical (program order).
    #[arg(long, default_value = "isl", value_parser = parse_strategy)]
    strategy: Strategy,
    /// Tile sizes for the members of each permutable band, e.g. 32,32,8
    /// (the last size repeats for further members).
    #[arg(long, value_delimiter = ',', default_value = "32")]
    tile: Vec<i64>,
    /// Do not tile.
    #[arg(long)]
    no_tile: bool,
    /// GPU: threads per block along x,y,z (e.g. 32,8); default: from the
    /// tile sizes, at most 256 threads.
    #[arg(long, value_delimiter = ',')]
    block: Vec<u32>,
    /// GPU: at most this many blocks along x,y,z (blocks then run several
    /// tiles each); default: one block per tile.
    #[arg(long, value_delimiter = ',')]
    grid: Vec<u32>,
    /// GPU: do not promote tiles to shared memory.
    #[arg(long)]
    no_shared: bool,
    /// Keep point loops where tiling put them (no TC-style sinking below
    /// inner tile loops).
    #[arg(long)]
    no_sink: bool,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| format!("unknown strategy `{s}` (isl, min, max, canonical)"))
}

#[derive(Clone, Copy, ValueEnum)]
enum Emit {
    /// The final schedule tree.
    Tree,
    /// The generated C (prelude and kernel).
    C,
    /// The generated CUDA (not available yet).
    Cuda,
    /// Model, dependences, schedule and C as one JSON document.
    Json,
    /// Flow, anti and output dependences.
    Deps,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    /// The CPU schedule, compiled with the system C compiler.
    Cpu,
    /// The GPU kernels, through NVRTC and the CUDA driver.
    Cuda,
    /// The GPU mapping executed on the CPU: the same mapped and promoted
    /// tree, blocks and threads as loops (what CI checks without a GPU).
    Emulate,
}

fn load(common: &Common) -> Result<(polyfuse::frontend::ast::Program, Options), Error> {
    let mut program = frontend::load_file(&common.file)?;
    let overrides = common
        .params
        .iter()
        .map(|s| frontend::parse_param_override(s))
        .collect::<Result<Vec<_>, _>>()?;
    frontend::apply_param_overrides(&mut program, &overrides)?;
    if let Some(bad) = common.tile.iter().find(|t| **t < 1) {
        return Err(Error::Input {
            file: program.source.clone(),
            message: format!("tile size {bad} must be at least 1"),
        });
    }
    let options = Options {
        strategy: common.strategy,
        tile: if common.no_tile {
            Vec::new()
        } else {
            common.tile.clone()
        },
        sink: !common.no_sink,
        gpu: None,
    };
    if common.block.contains(&0) || common.grid.contains(&0) {
        return Err(Error::Input {
            file: program.source.clone(),
            message: "--block and --grid sizes must be at least 1".into(),
        });
    }
    Ok((program, options))
}

/// The GPU options from the command line.
fn gpu_options(common: &Common) -> polyfuse::gpu::GpuOptions {
    polyfuse::gpu::GpuOptions {
        block: common.block.clone(),
        grid: common.grid.clone(),
        shared: !common.no_shared,
        ..Default::default()
    }
}

fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Schedule { common, emit } => {
            let (program, mut options) = load(&common)?;
            if matches!(emit, Emit::Cuda) {
                options.gpu = Some(gpu_options(&common));
            }
            let compiled = compile(&program, &options)?;
            match emit {
                Emit::Tree => print!("{}", compiled.tree),
                Emit::C => print!("{}", compiled.c_source()),
                Emit::Deps => print!("{}", compiled.deps_text),
                Emit::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&compiled.to_json())
                        .map_err(|e| Error::Internal(e.to_string()))?
                ),
                Emit::Cuda => {
                    if let Some(c) = &compiled.cuda {
                        print!("{}", c.source);
                    }
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
        } => {
            if target == Target::Cuda {
                return Err(Error::Environment(
                    "the CUDA target is not implemented yet; use --target cpu".into(),
                ));
            }
            let (program, mut options) = load(&common)?;
            if target == Target::Emulate {
                options.gpu = Some(gpu_options(&common));
            }
            let mut compiled = compile(&program, &options)?;
            compiled.param_values()?;
            if let Some(emulation) = compiled.emulation_c.clone() {
                compiled.kernel_c = emulation;
            }
            let report = cpu::run(
                &compiled,
                &RunOptions {
                    check,
                    bench_runs: if bench { runs.max(1) } else { 0 },
                    seed,
                },
            )?;
            println!(
                "ran {} on the cpu{} ({} strategy, tile {})",
                program.name,
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
            if let Some(us) = report.median_us {
                println!("time: median {us:.1} us over {} runs", report.runs);
            }
            if let Some(c) = &report.check {
                println!("{}", c.line());
                if !c.ok {
                    return Ok(ExitCode::from(1));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("polyfuse: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
