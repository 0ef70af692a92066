//! The one front door (issue 31): a program, its parameter values and
//! options in, a [`Compilation`] out. The command line (`schedule`, `run`,
//! `compare`, `tune`) and the C ABI both compile through [`Session`], so the
//! steps around [`crate::compile`] exist once: parameter overrides and
//! directives, the GPU options a target implies, the tuned options `tune`
//! stored in the cache, and the watch that replaces a schedule isl does not
//! finish by minimal fusion.
//!
//! The library prints nothing: what happened on the way (a tuned
//! configuration used, a cache skipped, a compilation still running or
//! replaced) comes back as [`Event`]s in the result, and, as it happens, to
//! an observer the caller may give ([`Session::observe`]): the command line
//! prints them on stderr, the C ABI hands them to its log callback.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::frontend::{self, ast::Program};
use crate::gpu::GpuOptions;
use crate::pipeline::{compile_watched, Compiled, Options, Watch, WatchEvent};
use crate::tune::CacheUse;

/// A program file with `NAME=VALUE` overrides of its parameters (the
/// command line's `FILE --param ...`).
pub fn load_program(file: &Path, params: &[String]) -> Result<Program> {
    let program = frontend::load_file(file)?;
    with_params(&program, params)
}

/// `NAME=VALUE` texts as parameter values.
pub fn parse_params(params: &[String]) -> Result<Vec<(String, i64)>> {
    params
        .iter()
        .map(|s| frontend::parse_param_override(s))
        .collect()
}

/// `program` with `NAME=VALUE` overrides of its parameters applied.
pub fn with_params(program: &Program, params: &[String]) -> Result<Program> {
    let overrides = parse_params(params)?;
    let mut program = program.clone();
    frontend::apply_param_overrides(&mut program, &overrides)?;
    Ok(program)
}

/// Where the compiled program runs, which decides whether it is mapped to
/// the GPU.
#[derive(Debug, Clone, Default)]
pub enum Target {
    /// The CPU schedule and its C.
    #[default]
    Cpu,
    /// The GPU mapping under these options (CUDA, or its emulation on the
    /// CPU). Their `auto_tile` is the session's to set: on where no tile
    /// sizes were given ([`Session::tile`]).
    Gpu(GpuOptions),
}

/// The architecture the tuning cache keys options by.
pub enum Arch<'a> {
    /// Known up front (`cpu`, `emulate`, `sm_90`).
    Known(String),
    /// Asked only where the cache would be consulted (a device is queried
    /// only then). A failure is the compilation's error: the command line
    /// runs on that device next, which would fail the same way.
    Required(Box<dyn FnOnce() -> Result<String> + 'a>),
    /// Asked as above; a failure skips the cache, said by
    /// [`Event::CacheNotUsed`] with [`CacheFault::Arch`] (the C ABI, whose
    /// result may run elsewhere).
    Optional(Box<dyn FnOnce() -> Result<String> + 'a>),
}

/// The tuning cache a session consults (the options `polyfuse tune`
/// stored, and compiled programs).
pub struct TunedCache<'a> {
    /// The SQLite file; a file that does not exist is no cache.
    pub path: PathBuf,
    pub arch: Arch<'a>,
    /// Whether a program the tuned options cannot compile (bad input, an
    /// illegal schedule) fails the compilation, as it would under any
    /// options (the C ABI), or is said and the cache skipped (the command
    /// line).
    pub program_errors_fail: bool,
}

/// Why the cache was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheFault {
    /// The architecture could not be learnt ([`Arch::Optional`]).
    Arch,
    /// The cache could not be read, or its options not compiled.
    Cache,
}

/// Something the caller may want to say: nothing went wrong, or polyfuse
/// did something other than asked and says what.
#[derive(Debug)]
pub enum Event {
    /// Tuned options from the cache were used, for architecture `arch`.
    Tuned { used: CacheUse, arch: String },
    /// The cache was not used, and why.
    CacheNotUsed { fault: CacheFault, error: Error },
    /// The watched compilation's notice or fallback.
    Watch(WatchEvent),
}

impl Event {
    /// The line polyfuse prints (and logs) for the event, for the program
    /// `source`.
    pub fn message(&self, source: &str) -> String {
        match self {
            Event::Tuned { used, arch } => used.message(arch),
            Event::CacheNotUsed { error, .. } => format!("polyfuse: cache not used: {error}"),
            Event::Watch(w) => w.message(source),
        }
    }

    /// Whether polyfuse did something other than asked (a warning), rather
    /// than saying what it did (a notice).
    pub fn is_warning(&self) -> bool {
        match self {
            Event::Tuned { .. } | Event::Watch(WatchEvent::StillCompiling(_)) => false,
            Event::CacheNotUsed { .. } | Event::Watch(WatchEvent::FellBack(_)) => true,
        }
    }
}

/// Where a compiled program came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled now under the session's options.
    Compiled,
    /// Compiled now under tuned options from the cache.
    TunedOptions,
    /// The compiled program itself came from the cache.
    CachedProgram,
}

/// What a session produced.
#[derive(Debug)]
pub struct Compilation {
    pub compiled: Compiled,
    /// The options it was compiled under: the session's, the tuned ones,
    /// or minimal fusion after a fallback.
    pub options: Options,
    pub origin: Origin,
    /// What happened on the way, in order.
    pub events: Vec<Event>,
}

/// One compilation of one program, set up step by step (see the module's
/// documentation).
pub struct Session<'a> {
    program: Program,
    params: Vec<(String, i64)>,
    directives: Option<serde_json::Value>,
    options: Options,
    /// Tile sizes given by the caller (empty: no tiling); None: the
    /// defaults (32 on the CPU, chosen per kernel on the GPU).
    tile: Option<Vec<i64>>,
    target: Target,
    /// Whether the caller chose any option (then tuned options are not
    /// looked up).
    options_given: bool,
    cache: Option<TunedCache<'a>>,
    /// The watch; None: the default one, with `POLYFUSE_SCHEDULE_TIMEOUT`'s
    /// fallback, read only where a compilation runs.
    watch: Option<Watch>,
    /// Replaces the default watch's fallback.
    fallback: Option<std::time::Duration>,
    observer: Option<Observer<'a>>,
}

/// A caller's function told of each event as it happens.
type Observer<'a> = Box<dyn FnMut(&Event) + 'a>;

/// The events of one compilation: kept, and told to the observer.
struct Log<'a> {
    observer: Option<Observer<'a>>,
    events: Vec<Event>,
}

impl Log<'_> {
    fn say(&mut self, event: Event) {
        if let Some(o) = self.observer.as_mut() {
            o(&event);
        }
        self.events.push(event);
    }
}

impl<'a> Session<'a> {
    /// A session for `program` under the default options, on the CPU,
    /// without a cache, watched as `POLYFUSE_SCHEDULE_TIMEOUT` says.
    pub fn new(program: Program) -> Session<'a> {
        Session {
            program,
            params: Vec::new(),
            directives: None,
            options: Options::default(),
            tile: None,
            target: Target::Cpu,
            options_given: false,
            cache: None,
            watch: None,
            fallback: None,
            observer: None,
        }
    }

    /// Parameter values that override the program's, applied at
    /// [`Session::compile`].
    pub fn params(mut self, params: &[(String, i64)]) -> Self {
        self.params = params.to_vec();
        self
    }

    /// Transformation directives that replace the program's `schedule`
    /// key (None keeps it).
    pub fn directives(mut self, directives: Option<serde_json::Value>) -> Self {
        self.directives = directives;
        self
    }

    /// The options (strategy, sinking, repair); their tile sizes are
    /// [`Session::tile`]'s. `given`: the caller chose some (then the
    /// cache's tuned options are not used).
    pub fn options(mut self, options: Options, given: bool) -> Self {
        self.options = options;
        self.options_given = given;
        self
    }

    /// Whether the compilation builds the CPU kernel
    /// ([`Options::cpu_kernel`]); a caller that prints only the GPU side
    /// turns it off. Applies to the session's options, not to a program
    /// the cache holds (that one has it).
    pub fn cpu_kernel(mut self, build: bool) -> Self {
        self.options.cpu_kernel = build;
        self
    }

    /// Tile sizes (empty: no tiling); None: the target's defaults.
    pub fn tile(mut self, sizes: Option<Vec<i64>>) -> Self {
        self.tile = sizes;
        self
    }

    pub fn target(mut self, target: Target) -> Self {
        self.target = target;
        self
    }

    /// The tuning cache to consult; None: none.
    pub fn cache(mut self, cache: Option<TunedCache<'a>>) -> Self {
        self.cache = cache;
        self
    }

    /// The watch instead of the one `POLYFUSE_SCHEDULE_TIMEOUT` sets.
    pub fn watch(mut self, watch: Watch) -> Self {
        self.watch = Some(watch);
        self
    }

    /// The default watch, with a schedule isl has not finished after
    /// `after` replaced by minimal fusion (instead of
    /// `POLYFUSE_SCHEDULE_TIMEOUT`'s time); None: that time.
    pub fn fallback_after(mut self, after: Option<std::time::Duration>) -> Self {
        self.fallback = after;
        self
    }

    /// Told of each event as it happens (a notice that a compilation is
    /// still running is worth something only then).
    pub fn observe(mut self, observer: impl FnMut(&Event) + 'a) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    /// The program as it will be compiled: parameters and directives
    /// applied.
    pub fn program(&self) -> Result<Program> {
        let mut program = self.program.clone();
        frontend::apply_param_overrides(&mut program, &self.params)?;
        if let Some(d) = &self.directives {
            program.schedule = Some(d.clone());
        }
        Ok(program)
    }

    /// The options of a compilation: the tile sizes and the GPU mapping
    /// the target implies.
    fn compile_options(&self) -> Options {
        let mut options = self.options.clone();
        options.tile = self.tile.clone().unwrap_or_else(|| vec![32]);
        if let Target::Gpu(gpu) = &self.target {
            options.gpu = Some(GpuOptions {
                auto_tile: self.tile.is_none(),
                ..gpu.clone()
            });
        }
        options
    }

    /// The program's dependences as text (no schedule is computed).
    pub fn dependences(&self) -> Result<String> {
        crate::pipeline::dependences(&self.program()?, &self.compile_options())
    }

    /// Compiles: under tuned options from the cache where it has some and
    /// no option was given, else under the session's, watched.
    pub fn compile(mut self) -> Result<Compilation> {
        let program = self.program()?;
        let mut options = self.compile_options();
        let mut log = Log {
            observer: self.observer.take(),
            events: Vec::new(),
        };
        let gpu = options.gpu.is_some();
        let cache = self.cache.take().filter(|_| !self.options_given);
        if let Some(cache) = cache {
            if let Some((compiled, used, arch)) = tuned(&program, gpu, cache, &mut log)? {
                let origin = if used.hit {
                    Origin::CachedProgram
                } else {
                    Origin::TunedOptions
                };
                let options = used.variant.options(gpu);
                log.say(Event::Tuned { used, arch });
                return Ok(Compilation {
                    compiled,
                    options,
                    origin,
                    events: log.events,
                });
            }
        }
        let watch = match self.watch {
            Some(w) => w,
            None => {
                let mut w = Watch::from_env()?;
                if let Some(after) = self.fallback {
                    w.fallback = after;
                }
                w
            }
        };
        let compiled =
            compile_watched(&program, &mut options, watch, |w| log.say(Event::Watch(w)))?;
        Ok(Compilation {
            compiled,
            options,
            origin: Origin::Compiled,
            events: log.events,
        })
    }
}

/// The program compiled under the tuned options of `cache`, how they were
/// used and the architecture they were looked up for; None where the
/// cache has none or is skipped (said to `log`).
fn tuned(
    program: &Program,
    gpu: bool,
    cache: TunedCache<'_>,
    log: &mut Log<'_>,
) -> Result<Option<(Compiled, CacheUse, String)>> {
    if !cache.path.is_file() {
        return Ok(None);
    }
    let arch = match cache.arch {
        Arch::Known(a) => a,
        Arch::Required(ask) => ask()?,
        Arch::Optional(ask) => match ask() {
            Ok(a) => a,
            Err(error) => {
                log.say(Event::CacheNotUsed {
                    fault: CacheFault::Arch,
                    error,
                });
                return Ok(None);
            }
        },
    };
    match crate::tune::compile_tuned(program, &arch, gpu, &cache.path) {
        Ok(Some((compiled, used))) => Ok(Some((compiled, used, arch))),
        Ok(None) => Ok(None),
        Err(
            e @ (Error::Input { .. }
            | Error::Statement { .. }
            | Error::Illegal { .. }
            | Error::Race { .. }),
        ) if cache.program_errors_fail => Err(e),
        Err(error) => {
            log.say(Event::CacheNotUsed {
                fault: CacheFault::Cache,
                error,
            });
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax() -> Program {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/softmax.json");
        frontend::load_file(Path::new(path)).unwrap()
    }

    #[test]
    fn a_gpu_target_without_tile_sizes_chooses_them_per_kernel() {
        let s = Session::new(softmax()).target(Target::Gpu(GpuOptions::default()));
        let o = s.compile_options();
        assert_eq!(o.tile, vec![32]);
        assert!(o.gpu.as_ref().is_some_and(|g| g.auto_tile));
        let o = s.tile(Some(vec![16])).compile_options();
        assert_eq!(o.tile, vec![16]);
        assert!(o.gpu.is_some_and(|g| !g.auto_tile));
    }

    #[test]
    fn events_come_back_and_reach_the_observer_as_they_happen() {
        let mut seen = Vec::new();
        // A notice at once: every compilation takes longer than nothing.
        let watch = Watch {
            notice: std::time::Duration::ZERO,
            fallback: std::time::Duration::from_secs(600),
        };
        let c = Session::new(softmax())
            .params(&[("N".into(), 9)])
            .watch(watch)
            .observe(|e| seen.push(e.message("softmax")))
            .compile()
            .unwrap();
        assert!(matches!(
            c.events[..],
            [Event::Watch(WatchEvent::StillCompiling(_))]
        ));
        assert!(!c.events[0].is_warning());
        assert_eq!(seen, [c.events[0].message("softmax")]);
        assert_eq!(c.origin, Origin::Compiled);
    }

    #[test]
    fn a_missing_cache_is_no_cache_and_the_arch_is_not_asked() {
        let cache = TunedCache {
            path: PathBuf::from("/nonexistent/polyfuse-cache.sqlite"),
            arch: Arch::Required(Box::new(|| panic!("asked"))),
            program_errors_fail: false,
        };
        let c = Session::new(softmax())
            .params(&[("N".into(), 9)])
            .cache(Some(cache))
            .compile()
            .unwrap();
        assert_eq!(c.origin, Origin::Compiled);
        assert!(c.events.is_empty());
    }
}
