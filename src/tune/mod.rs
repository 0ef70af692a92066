//! Comparing, tuning and caching schedules (TC's autotuner and compilation
//! cache, section 6 of the paper).
//!
//! * [`variant`]: one point of the option space and its text form;
//! * [`compare`]: variants side by side (`polyfuse compare`), with
//!   [`traffic`] (global-memory bytes from isl), [`ptxas`] (registers and
//!   spills) and [`plot`] (the SVG);
//! * [`search`]: the search space and the genetic and random searches of
//!   `polyfuse tune`;
//! * [`canon`] and [`cache`]: the program's canonical form and the SQLite
//!   cache of tuned options and compiled programs; [`artifact`], a compiled
//!   program as the cache stores it, and [`aot`], one document with it and
//!   its PTX (`--emit artifact`, the C ABI's `pf_result_save`).

pub mod aot;
pub mod artifact;
pub mod cache;
pub mod canon;
pub mod compare;
pub mod plot;
pub mod ptxas;
pub mod search;
pub mod traffic;
pub mod variant;

pub use variant::{Tile, Variant};

use crate::error::Result;
use crate::pipeline::Compiled;
use crate::runtime::{cpu, RunReport};

/// Where a candidate is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeasureTarget {
    /// The CPU schedule through the C compiler.
    Cpu,
    /// The GPU mapping emulated on the CPU (blocks and threads as loops).
    Emulate,
    /// CUDA device `n`.
    Cuda(usize),
}

impl MeasureTarget {
    pub fn name(self) -> &'static str {
        match self {
            MeasureTarget::Cpu => "cpu",
            MeasureTarget::Emulate => "emulate",
            MeasureTarget::Cuda(_) => "cuda",
        }
    }

    /// Whether the compilation needs the GPU mapping.
    pub fn gpu(self) -> bool {
        self != MeasureTarget::Cpu
    }
}

/// Runs `compiled` with `--check` and, when `runs` > 0, `--bench`.
pub fn measure(
    compiled: &Compiled,
    target: MeasureTarget,
    runs: usize,
    seed: u64,
) -> Result<RunReport> {
    measure_with(compiled, target, runs, seed, true, None, None)
}

/// [`measure`], with the check only when `check`; on a GPU, checked
/// against `reference` (the f64 outputs of
/// `runtime::cpu::reference_outputs` for `seed`) when given.
pub fn measure_with(
    compiled: &Compiled,
    target: MeasureTarget,
    runs: usize,
    seed: u64,
    check: bool,
    reference: Option<&crate::runtime::cuda::Reference>,
    give_up_after_us: Option<f64>,
) -> Result<RunReport> {
    let opts = cpu::RunOptions {
        check,
        bench_runs: runs,
        seed,
    };
    match target {
        MeasureTarget::Cpu => cpu::run(compiled, &opts),
        MeasureTarget::Emulate => cpu::run_emulated(compiled, &opts),
        MeasureTarget::Cuda(device) => crate::runtime::cuda::run_checked_within(
            compiled,
            &opts,
            device,
            reference,
            give_up_after_us,
        ),
    }
}

/// How a compiled program came from the cache.
#[derive(Debug, Clone)]
pub struct CacheUse {
    pub variant: Variant,
    pub time_us: Option<f64>,
    /// The compiled program itself was cached (no compilation ran).
    pub hit: bool,
    pub path: std::path::PathBuf,
}

impl CacheUse {
    /// The line `schedule`, `run` and the C ABI print on stderr.
    pub fn message(&self, arch: &str) -> String {
        format!(
            "polyfuse: using tuned options from the cache {} ({}{}){}",
            self.path.display(),
            self.variant.label(),
            match self.time_us {
                Some(t) => format!(", {t:.1} us on {arch}"),
                None => String::new(),
            },
            if self.hit {
                "; compiled program from the cache"
            } else {
                ""
            }
        )
    }
}

/// The program compiled under the options `tune` stored for it in the cache
/// at `path` (architecture `arch`; with the GPU mapping when `gpu`), when
/// there are any: from the cached compiled program when its names match,
/// else compiled now and stored for the next time. None when the cache
/// file does not exist or holds no tuned options for the program.
pub fn compile_tuned(
    program: &crate::frontend::ast::Program,
    arch: &str,
    gpu: bool,
    path: &std::path::Path,
) -> Result<Option<(Compiled, CacheUse)>> {
    let Some(mut db) = cache::Cache::open_existing(path)? else {
        return Ok(None);
    };
    let key = cache::Key::new(program, arch);
    let Some((variant, time_us)) = db.best(&key)? else {
        return Ok(None);
    };
    let mut used = CacheUse {
        variant: variant.clone(),
        time_us,
        hit: true,
        path: path.to_path_buf(),
    };
    if let Some(c) = db.compiled(&key, &variant, program)? {
        if c.cuda.is_some() == gpu {
            return Ok(Some((c, used)));
        }
    }
    let compiled = crate::pipeline::compile(program, &variant.options(gpu))?;
    db.record(&key, &variant, None, Some(&compiled))?;
    used.hit = false;
    Ok(Some((compiled, used)))
}
