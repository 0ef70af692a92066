//! The `compare`, `tune` and `cache` commands: argument parsing and
//! printing only; the work is in `polyfuse::tune`, the program loaded
//! through `polyfuse::session` as every command loads it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use polyfuse::frontend::ast::Program;
use polyfuse::tune::compare::{self, Request};
use polyfuse::tune::{plot, MeasureTarget, Variant};
use polyfuse::Error;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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
        polyfuse::session::load_program(&self.file, &self.params)
    }
}

#[derive(Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub program: ProgramArgs,
    /// A variant: KEY=VALUE pairs separated by commas, e.g.
    /// "strategy=min,tile=64x64,block=32x8" (keys: strategy, tile, sink,
    /// block, grid, shared, registers, reduce, repair, split, vector,
    /// unroll, pipeline;
    /// `default` alone is the default). Repeatable.
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
        for r in &cmp.rows {
            if let Some(e) = &r.error {
                eprintln!("  {}: {e}", r.variant.label());
            }
        }
        return Ok(ExitCode::from(2));
    }
    if cmp.rows.iter().any(|r| r.check_ok == Some(false)) {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the cache is: `--cache PATH`, `--no-cache`; see `tune::cache`.
#[derive(Args, Clone, Default)]
pub struct CacheArgs {
    /// The compilation cache (SQLite) to use; default: $POLYFUSE_CACHE, else
    /// $XDG_CACHE_HOME/polyfuse/cache.sqlite, else
    /// ~/.cache/polyfuse/cache.sqlite (POLYFUSE_CACHE=off disables it).
    #[arg(long, value_name = "PATH")]
    pub cache: Option<PathBuf>,
    /// Do not read or write the compilation cache.
    #[arg(long)]
    pub no_cache: bool,
}

impl CacheArgs {
    pub fn path(&self) -> Option<PathBuf> {
        polyfuse::tune::cache::location(self.cache.as_deref(), self.no_cache)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchKind {
    /// TC's genetic search: elites, three-parent uniform crossover from
    /// fitness-proportional parents, mutation.
    Genetic,
    /// Uniformly random candidates (the baseline).
    Random,
}

#[derive(Args)]
pub struct TuneArgs {
    #[command(flatten)]
    pub program: ProgramArgs,
    /// Wall-clock budget: seconds, or e.g. 90s, 5m, 1h.
    #[arg(long, default_value = "5m", value_parser = parse_budget)]
    pub budget: std::time::Duration,
    /// Stop after this many candidates.
    #[arg(long, value_name = "N")]
    pub max_candidates: Option<usize>,
    /// The search.
    #[arg(long, value_enum, default_value = "genetic")]
    pub search: SearchKind,
    /// Seed of the search (and of the input generator).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where candidates are measured; default: cuda where a CUDA driver
    /// is found, else cpu.
    #[arg(long, value_enum)]
    pub target: Option<MeasureOn>,
    /// CUDA devices to measure on (e.g. 0,1); default: every visible one.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<usize>,
    /// Candidates per generation.
    #[arg(long, default_value_t = 16)]
    pub population: usize,
    /// Best candidates carried unchanged into the next generation.
    #[arg(long, default_value_t = 2)]
    pub elites: usize,
    /// Probability of redrawing each gene of a child.
    #[arg(long, default_value_t = 0.1)]
    pub mutation: f64,
    /// Timed runs per candidate (median).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Compile threads (default: the CPU's cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Check every candidate with these parameter values instead
    /// (NAME=VALUE, repeatable; compiled with the same options), where the
    /// f64 reference at the tuned sizes would take too long on the CPU, as
    /// for a 4096^3 gemm; times are still measured at the tuned sizes.
    #[arg(long = "check-param", value_name = "NAME=VALUE")]
    pub check_params: Vec<String>,
    /// Print one JSON document (every candidate) instead of the summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// Parses `--budget`: seconds (`300`, `0.5`), or a duration as humantime
/// reads it (`90s`, `5m`, `1h`, `1m30s`, `0.5s`, `2min`, `1h 30m`).
fn parse_budget(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let bad = || format!("budget `{text}`: write seconds or e.g. 90s, 5m, 1h, 1m30s");
    // A bare number is seconds, which humantime would refuse for want of
    // a unit.
    if let Ok(s) = t.parse::<f64>() {
        return if s.is_finite() && s >= 0.0 {
            Ok(std::time::Duration::from_secs_f64(s))
        } else {
            Err(bad())
        };
    }
    humantime::parse_duration(t).map_err(|_| bad())
}

/// `polyfuse tune`: (1) check the arguments, (2) choose where to measure,
/// (3) search with a progress bar, (4) record the times in the cache,
/// (5) report the default and the best.
pub fn tune(args: TuneArgs) -> Result<ExitCode, Error> {
    use polyfuse::tune::search::{self, Search, Settings};
    let program = args.program.load()?;
    check_tune_args(&args, &program)?;
    let on = args.target.unwrap_or_else(|| {
        let on = detected_target();
        eprintln!(
            "polyfuse: tuning on the {} (no --target given)",
            on_device_word(on)
        );
        on
    });
    let (targets, arch) = measure_targets(on, &args.devices)?;
    let check_program = if args.check_params.is_empty() {
        None
    } else {
        Some(polyfuse::session::with_params(
            &program,
            &args.check_params,
        )?)
    };
    let settings = Settings {
        search: match args.search {
            SearchKind::Genetic => Search::Genetic,
            SearchKind::Random => Search::Random,
        },
        seed: args.seed,
        budget: args.budget,
        max_candidates: args.max_candidates,
        population: args.population.max(2),
        elites: args.elites,
        mutation: args.mutation,
        targets,
        runs: args.runs.max(1),
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        check_program,
    };
    let started = std::time::Instant::now();
    let progress = TuneProgress::new(args.max_candidates, started);
    let outcome = search::tune(&program, &settings, &mut |cands, best| {
        progress.show(cands, best)
    })?;
    progress.finish();
    let elapsed = started.elapsed().as_secs_f64();
    let cache_note = record_in_cache(&args, &program, &arch, &outcome)?;
    let report = TuneReport {
        args: &args,
        program: &program,
        on,
        arch: &arch,
        outcome: &outcome,
        elapsed,
        cache_note: cache_note.as_ref(),
    };
    if args.json {
        report.print_json()?;
    } else {
        report.print_text();
    }
    if outcome.best.is_none() {
        return Err(Error::Illegal {
            file: program.source.clone(),
            message: "no candidate compiled and passed its check".into(),
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments `clap` cannot check alone: sizes for every parameter, and a
/// mutation probability.
fn check_tune_args(args: &TuneArgs, program: &Program) -> Result<(), Error> {
    if let Some(bad) = program.params.iter().find(|p| p.value.is_none()) {
        return Err(Error::Input {
            file: program.source.clone(),
            message: format!(
                "parameter {} has no value; tuning needs sizes: give one with --param {}=VALUE",
                bad.name, bad.name
            ),
        });
    }
    if !(0.0..=1.0).contains(&args.mutation) {
        return Err(Error::Input {
            file: "--mutation".into(),
            message: format!("{} is not a probability (0 to 1)", args.mutation),
        });
    }
    Ok(())
}

/// The GPU where a driver and a device are found, else the CPU.
fn detected_target() -> MeasureOn {
    let found = polyfuse::runtime::cuda::probe_driver().is_ok()
        && polyfuse::runtime::cuda::device_count().unwrap_or(0) > 0;
    if found {
        MeasureOn::Cuda
    } else {
        MeasureOn::Cpu
    }
}

fn on_device_word(on: MeasureOn) -> &'static str {
    match on {
        MeasureOn::Cuda => "GPU",
        _ => "CPU",
    }
}

/// What the search measures on, and the architecture the cache keys the
/// times by. On the GPU: the devices asked for (all by default), which
/// must be of one architecture, since times from several would be stored
/// under one of them (issue 33 item 4).
fn measure_targets(on: MeasureOn, asked: &[usize]) -> Result<(Vec<MeasureTarget>, String), Error> {
    match on {
        MeasureOn::Cpu => Ok((vec![MeasureTarget::Cpu], "cpu".to_string())),
        MeasureOn::Emulate => Ok((vec![MeasureTarget::Emulate], "emulate".to_string())),
        MeasureOn::Cuda => {
            polyfuse::runtime::cuda::probe_driver()?;
            let n = polyfuse::runtime::cuda::device_count()?;
            let devices: Vec<usize> = if asked.is_empty() {
                (0..n).collect()
            } else {
                asked.to_vec()
            };
            if devices.is_empty() || devices.iter().any(|d| *d >= n) {
                return Err(Error::Environment(format!(
                    "--devices {:?}: the driver sees {n} CUDA device(s)",
                    devices
                )));
            }
            let arch = polyfuse::runtime::cuda::device_arch(devices[0])?;
            for d in &devices[1..] {
                let other = polyfuse::runtime::cuda::device_arch(*d)?;
                if other != arch {
                    return Err(Error::Input {
                        file: "--devices".into(),
                        message: format!(
                            "device {} is {arch} and device {d} is {other}: tune on devices of one architecture (the cache keys its times by it)",
                            devices[0]
                        ),
                    });
                }
            }
            Ok((devices.into_iter().map(MeasureTarget::Cuda).collect(), arch))
        }
    }
}

/// The search's progress on standard error: a bar on a terminal, and
/// without one (a log file, CI), where the bar draws nothing, a line per
/// generation.
struct TuneProgress {
    bar: indicatif::ProgressBar,
    lines: bool,
    started: std::time::Instant,
}

impl TuneProgress {
    fn new(max_candidates: Option<usize>, started: std::time::Instant) -> Self {
        let bar = indicatif::ProgressBar::with_draw_target(
            max_candidates.map(|n| n as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {pos} candidates {wide_msg}",
        ) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        TuneProgress {
            bar,
            lines: !std::io::IsTerminal::is_terminal(&std::io::stderr()),
            started,
        }
    }

    fn show(&self, cands: &[polyfuse::tune::search::Candidate], best: Option<usize>) {
        self.bar.set_position(cands.len() as u64);
        let best = best.and_then(|b| cands.get(b)).map(|b| {
            format!(
                "best {:.1} us: {}",
                b.time_us.unwrap_or(0.0),
                b.variant.label()
            )
        });
        if self.lines {
            eprintln!(
                "polyfuse tune: {} candidates in {:.0} s{}",
                cands.len(),
                self.started.elapsed().as_secs_f64(),
                best.as_ref().map_or(String::new(), |b| format!(", {b}"))
            );
        }
        if let Some(b) = best {
            self.bar.set_message(b);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Records every checked time in the cache and the best as the tuned
/// options; returns where (path and key), or `None` without a cache or a
/// best candidate.
fn record_in_cache(
    args: &TuneArgs,
    program: &Program,
    arch: &str,
    outcome: &polyfuse::tune::search::Outcome,
) -> Result<Option<(String, String)>, Error> {
    let Some(path) = args.cache.path() else {
        return Ok(None);
    };
    let mut db = polyfuse::tune::cache::Cache::open(&path)?;
    let key = polyfuse::tune::cache::Key::new(program, arch);
    for c in &outcome.candidates {
        if let Some(t) = c.time_us {
            db.record(&key, &c.variant, Some(t), None)?;
        }
    }
    let Some(b) = outcome.best else {
        return Ok(None);
    };
    let best = &outcome.candidates[b];
    let (tuned, time) = db.set_best(
        &key,
        &best.variant,
        best.time_us.unwrap_or(0.0),
        outcome.best_compiled.as_ref(),
    )?;
    if tuned != best.variant {
        eprintln!(
            "polyfuse: the cache keeps the faster {time:.1} us of an earlier run ({})",
            tuned.label()
        );
    }
    Ok(Some((path.display().to_string(), key.key.clone())))
}

/// What `tune` prints at the end, as JSON or as text.
struct TuneReport<'a> {
    args: &'a TuneArgs,
    program: &'a Program,
    on: MeasureOn,
    arch: &'a str,
    outcome: &'a polyfuse::tune::search::Outcome,
    elapsed: f64,
    cache_note: Option<&'a (String, String)>,
}

impl TuneReport<'_> {
    fn print_json(&self) -> Result<(), Error> {
        let outcome = self.outcome;
        let cand = CandidateJson::of;
        let default = &outcome.candidates[outcome.default];
        let best = outcome.best.map(|b| &outcome.candidates[b]);
        let doc = TuneJson {
            program: &self.program.name,
            target: self.on,
            arch: self.arch,
            device: outcome.device.as_deref(),
            search: self.args.search,
            seed: self.args.seed,
            space_size: outcome.space_size,
            seconds: self.elapsed,
            reference_seconds: outcome.reference_seconds,
            default: cand(default),
            best: best.map(cand),
            speedup: match (default.time_us, best.and_then(|b| b.time_us)) {
                (Some(d), Some(b)) if b > 0.0 => Some(d / b),
                _ => None,
            },
            cache: self.cache_note.map(|(path, key)| CacheNote { path, key }),
            candidates: outcome.candidates.iter().map(cand).collect(),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| Error::Internal(e.to_string()))?
        );
        Ok(())
    }

    fn print_text(&self) {
        let outcome = self.outcome;
        let default = &outcome.candidates[outcome.default];
        let best = outcome.best.map(|b| &outcome.candidates[b]);
        let checked = outcome
            .candidates
            .iter()
            .filter(|c| c.time_us.is_some())
            .count();
        println!(
            "tuned {} on {}: {} candidates ({} checked) in {:.1} s, {} search, seed {}, space of {} variants",
            self.program.name,
            outcome.device.as_deref().unwrap_or(on_name(self.on)),
            outcome.candidates.len(),
            checked,
            self.elapsed,
            match self.args.search { SearchKind::Genetic => "genetic", SearchKind::Random => "random" },
            self.args.seed,
            outcome.space_size
        );
        let time = |c: &polyfuse::tune::search::Candidate| match c.time_us {
            Some(t) => format!("{t:.1} us"),
            None => format!("failed ({})", c.error.as_deref().unwrap_or("?")),
        };
        println!(
            "default: {}  {}",
            time(default),
            default.variant.canonical()
        );
        match best {
            Some(b) => println!(
                "best:    {}  {}{}",
                time(b),
                b.variant.canonical(),
                match (default.time_us, b.time_us) {
                    (Some(d), Some(t)) if t > 0.0 => format!("  ({:.2}x the default)", d / t),
                    _ => String::new(),
                }
            ),
            None => println!("best:    none (no candidate passed its check)"),
        }
        if let Some(s) = outcome.reference_seconds {
            println!("(the f64 reference of the check took {s:.1} s before the budget)");
        }
        if let Some((p, k)) = self.cache_note {
            println!("cached in {p} (key {k}, arch {})", self.arch);
        }
    }
}

/// The document of `tune --json`, in this order.
#[derive(serde::Serialize)]
struct TuneJson<'a> {
    program: &'a str,
    target: MeasureOn,
    arch: &'a str,
    device: Option<&'a str>,
    search: SearchKind,
    seed: u64,
    space_size: u64,
    seconds: f64,
    reference_seconds: Option<f64>,
    default: CandidateJson<'a>,
    best: Option<CandidateJson<'a>>,
    speedup: Option<f64>,
    cache: Option<CacheNote<'a>>,
    candidates: Vec<CandidateJson<'a>>,
}

#[derive(serde::Serialize)]
struct CandidateJson<'a> {
    index: usize,
    generation: usize,
    variant: String,
    time_us: Option<f64>,
    error: Option<&'a str>,
}

impl CandidateJson<'_> {
    fn of(c: &polyfuse::tune::search::Candidate) -> CandidateJson<'_> {
        CandidateJson {
            index: c.index,
            generation: c.generation,
            variant: c.variant.canonical(),
            time_us: c.time_us,
            error: c.error.as_deref(),
        }
    }
}

/// Where `tune` stored its result.
#[derive(serde::Serialize)]
struct CacheNote<'a> {
    path: &'a str,
    key: &'a str,
}

fn on_name(on: MeasureOn) -> &'static str {
    match on {
        MeasureOn::Cpu => "cpu",
        MeasureOn::Cuda => "cuda",
        MeasureOn::Emulate => "emulate",
    }
}

#[derive(clap::Subcommand)]
pub enum CacheCommand {
    /// One line per entry: key, program, architecture, parameters, time,
    /// options (`*` marks the tuned ones).
    List {
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Write every entry as JSON lines to FILE (`-`: standard output).
    Export {
        file: PathBuf,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Read entries written by `export` from FILE (`-`: standard input).
    Import {
        file: PathBuf,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Remove every entry.
    Clear {
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Print the cache's location.
    Path {
        #[command(flatten)]
        cache: CacheArgs,
    },
}

pub fn cache(cmd: CacheCommand) -> Result<ExitCode, Error> {
    use polyfuse::tune::cache::Cache;
    let args = match &cmd {
        CacheCommand::List { cache }
        | CacheCommand::Export { cache, .. }
        | CacheCommand::Import { cache, .. }
        | CacheCommand::Clear { cache }
        | CacheCommand::Path { cache } => cache.clone(),
    };
    let path = args.path().ok_or_else(|| {
        Error::Environment(
            "the cache is disabled (--no-cache or POLYFUSE_CACHE=off) or has no location (no HOME)"
                .into(),
        )
    })?;
    match cmd {
        CacheCommand::Path { .. } => println!("{}", path.display()),
        CacheCommand::List { .. } => {
            let Some(db) = Cache::open_existing(&path)? else {
                eprintln!("polyfuse: no cache at {}", path.display());
                return Ok(ExitCode::SUCCESS);
            };
            let mut text = String::new();
            for e in db.list()? {
                text.push_str(&format!(
                    "{} {} {:<12} {:<8} {:<24} {:>12} {}{}\n",
                    if e.tuned { "*" } else { " " },
                    &e.key[..12],
                    e.name,
                    e.arch,
                    e.params,
                    e.time_us
                        .map(|t| format!("{t:.1} us"))
                        .unwrap_or_else(|| "-".into()),
                    e.options,
                    if e.has_artifact { " [compiled]" } else { "" }
                ));
            }
            print_out(&text);
        }
        CacheCommand::Export { file, .. } => {
            let text = match Cache::open_existing(&path)? {
                Some(db) => db.export()?,
                None => String::new(),
            };
            if file.as_os_str() == "-" {
                print_out(&text);
            } else {
                std::fs::write(&file, text).map_err(|e| {
                    Error::Environment(format!("cannot write {}: {e}", file.display()))
                })?;
            }
        }
        CacheCommand::Import { file, .. } => {
            let text = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                    .map_err(|e| Error::Environment(format!("cannot read standard input: {e}")))?;
                s
            } else {
                std::fs::read_to_string(&file).map_err(|e| Error::Input {
                    file: file.display().to_string(),
                    message: format!("cannot read: {e}"),
                })?
            };
            let n = Cache::open(&path)?.import(&text, &file.display().to_string())?;
            println!("imported {n} entries into {}", path.display());
        }
        CacheCommand::Clear { .. } => {
            let n = match Cache::open_existing(&path)? {
                Some(mut db) => db.clear()?,
                None => 0,
            };
            println!("removed {n} entries from {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes to standard output; a reader that went away (`| head`) is not an
/// error.
fn print_out(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::parse_budget;
    use std::time::Duration;

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_budget("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_budget("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_budget("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_budget("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["", "5x", "m", "-1", "5m3", "5 parsecs"] {
            let e = parse_budget(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("budget `{bad}`: write seconds")),
                "{e}"
            );
        }
    }
}
