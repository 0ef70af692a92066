//! Running compiled programs and checking them.
//!
//! [`data`] makes the inputs (a fixed-seed generator, so every run of every
//! target sees the same values) and compares outputs with the reference;
//! [`cpu`] compiles the emitted C with the system C compiler and runs it;
//! [`cuda`] compiles the CUDA with NVRTC and launches it through the
//! driver; [`work`] counts the bytes and flops a run performs, so both
//! targets report rates the same way; [`aot`] saves a compiled program
//! with its PTX as one document and loads it back (it compiles PTX with
//! [`cuda`], so it sits here, after the pipeline whose result it stores).

pub mod cpu;
pub mod cuda;
pub mod data;
pub mod work;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub check: Option<data::CheckResult>,
    /// Median time of one kernel execution in microseconds (`--bench`).
    pub median_us: Option<f64>,
    pub runs: usize,
    /// Where it ran: `cpu`, or the GPU's name and architecture
    /// (`NVIDIA H100 80GB HBM3, sm_90`).
    pub device: String,
    /// Kernel launches of one execution (1 on the CPU; on the GPU, the
    /// kernels whose grid is not empty).
    pub launches: usize,
    /// Bytes and flops of one execution at the run's parameter values.
    pub work: work::Work,
    /// Median time of each kernel in microseconds, in launch order
    /// (`--bench` on the GPU; empty elsewhere).
    pub kernel_us: Vec<(String, f64)>,
}

impl RunReport {
    /// Global-memory throughput of the median run in GB/s (10^9 bytes).
    pub fn gb_per_s(&self) -> Option<f64> {
        self.median_us
            .filter(|us| *us > 0.0)
            .map(|us| self.work.bytes as f64 / (us * 1e3))
    }

    /// Arithmetic throughput of the median run in TFLOP/s (10^12 flops).
    pub fn tflop_per_s(&self) -> Option<f64> {
        self.median_us
            .filter(|us| *us > 0.0)
            .map(|us| self.work.flops as f64 / (us * 1e6))
    }
}
