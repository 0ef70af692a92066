//! The `compare`, `tune` and `cache` commands: argument parsing and
//! printing only; the work is in `polyfuse::tune`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use polyfuse::frontend::{self, ast::Program};
use polyfuse::tune::compare::{self, Request};
use polyfuse::tune::{plot, MeasureTarget, Variant};
use polyfuse::Error;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MeasureOn {
    /// The CPU schedule, compiled with the system C compiler.
    Cpu,
    /// The GPU kernels, through NVRTC and the CUDA driver.
    Cuda,
    /// The GPU mapping executed on the CPU.
    Emulate,
}

/// The program and the parameters, shared by `compare` and `tune`.
#[derive(Args)]
pub struct ProgramArgs {
    /// The program (JSON, see the program format).
    pub file: PathBuf,
    /// Set a parameter: NAME=VALUE (repeatable); overrides the file.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
}

impl ProgramArgs {
    pub fn load(&self) -> Result<Program, Error> {
        let mut program = frontend::load_file(&self.file)?;
        let overrides = self
            .params
            .iter()
            .map(|s| frontend::parse_param_override(s))
            .collect::<Result<Vec<_>, _>>()?;
        frontend::apply_param_overrides(&mut program, &overrides)?;
        Ok(program)
    }
}

#[derive(Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub program: ProgramArgs,
    /// A variant: KEY=VALUE pairs separated by commas, e.g.
    /// "strategy=min,tile=64x64,block=32x8" (keys: strategy, tile, sink,
    /// block, grid, shared, registers, reduce; `default` alone is the
    /// default). Repeatable.
    #[arg(long = "variant", value_name = "KEY=VALUE,...")]
    pub variants: Vec<String>,
    /// One variant per strategy, other options at their defaults, e.g.
    /// isl,min,max.
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// A file of variants, one per line (`#` starts a comment line).
    #[arg(long = "variants", value_name = "FILE")]
    pub variants_file: Option<PathBuf>,
    /// Also run every variant with --check and time it here.
    #[arg(long, value_enum)]
    pub target: Option<MeasureOn>,
    /// Timed runs per variant (median) with --target.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Seed of the input generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// GPU architecture for ptxas's registers and spills.
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write a plot of the comparison as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Leave the schedule trees out of the text output.
    #[arg(long)]
    pub no_trees: bool,
}

/// The variants a `compare` asks for, in order: --variant, --strategies,
/// then the file; the strategies isl, min and max when none is given.
fn variants(args: &CompareArgs) -> Result<Vec<Variant>, Error> {
    let bad = |message: String| Error::Input {
        file: "--variant".into(),
        message,
    };
    let mut out = Vec::new();
    for v in &args.variants {
        out.push(Variant::parse(v).map_err(|m| bad(format!("`{v}`: {m}")))?);
    }
    for s in &args.strategies {
        out.push(
            Variant::parse(&format!("strategy={s}"))
                .map_err(|m| bad(format!("--strategies: {m}")))?,
        );
    }
    if let Some(f) = &args.variants_file {
        out.extend(Variant::read_file(f)?);
    }
    if out.is_empty() {
        for s in ["isl", "min", "max"] {
            out.push(Variant::parse(&format!("strategy={s}")).map_err(bad)?);
        }
    }
    Ok(out)
}

pub fn measure_target(on: MeasureOn, device: usize) -> Result<MeasureTarget, Error> {
    Ok(match on {
        MeasureOn::Cpu => MeasureTarget::Cpu,
        MeasureOn::Emulate => MeasureTarget::Emulate,
        MeasureOn::Cuda => {
            polyfuse::runtime::cuda::probe_driver()?;
            MeasureTarget::Cuda(device)
        }
    })
}

pub fn compare(args: CompareArgs) -> Result<ExitCode, Error> {
    let program = args.program.load()?;
    let variants = variants(&args)?;
    let target = args.target.map(|t| measure_target(t, 0)).transpose()?;
    let request = Request {
        variants,
        target,
        arch: args.arch.clone(),
        runs: args.runs.max(1),
        seed: args.seed,
    };
    let cmp = compare::run(&program, &request)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&cmp.to_json())
                .map_err(|e| Error::Internal(e.to_string()))?
        );
    } else {
        print!("{}", cmp.table(!args.no_trees));
    }
    if let Some(path) = &args.svg {
        plot::write_svg(&cmp, path)?;
    }
    // Every variant failed: nothing was compared.
    if cmp.rows.iter().all(|r| r.error.is_some()) {
        eprintln!("polyfuse: no variant of {} compiled", program.name);
        return Ok(ExitCode::from(2));
    }
    if cmp.rows.iter().any(|r| r.check_ok == Some(false)) {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
