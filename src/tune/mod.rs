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
//!   cache of tuned options and compiled programs.

pub mod artifact;
pub mod cache;
pub mod canon;
pub mod compare;
pub mod plot;
pub mod ptxas;
//pub mod search;
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
    let opts = cpu::RunOptions {
        check: true,
        bench_runs: runs,
        seed,
    };
    match target {
        MeasureTarget::Cpu => cpu::run(compiled, &opts),
        MeasureTarget::Emulate => {
            let mut c = compiled.clone();
            if let Some(e) = &c.emulation_c {
                c.kernel_c = e.clone();
            }
            cpu::run(&c, &opts)
        }
        MeasureTarget::Cuda(device) => crate::runtime::cuda::run_on(compiled, &opts, device),
    }
}
