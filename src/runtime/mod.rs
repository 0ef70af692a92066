//! Running compiled programs and checking them.
//!
//! [`data`] makes the inputs (a fixed-seed generator, so every run of every
//! target sees the same values) and compares outputs with the reference;
//! [`cpu`] compiles the emitted C with the system C compiler and runs it.

pub mod cpu;
pub mod data;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub check: Option<data::CheckResult>,
    /// Median time of one kernel execution in microseconds (`--bench`).
    pub median_us: Option<f64>,
    pub runs: usize,
}
