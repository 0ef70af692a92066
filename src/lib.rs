//! polyfuse: a polyhedral optimizer for machine-learning kernels.
//!
//! A compilation runs in one direction, stage by stage, each stage's value
//! the next one's input ([`compile`]; `pipeline`'s comment lists the
//! values): frontend (the typed program), then model, repair, deps,
//! schedule, gpu, codegen, and runtime, which runs what [`compile`]
//! returns ([`Compiled`], plain data: isl objects never leave it).
//! `POLYFUSE_DUMP` prints a stage's value after it (`pipeline::dump`).
//! [`session`] is the front door the command line and the C ABI compile
//! through (parameters, options, the tuning cache, the watch); [`tune`]
//! compares, tunes and caches compiled programs.
//!
//! No module imports a later one (`tests/integration/architecture.rs`), with one
//! exception to the run order: the repair proves its rewrites with the
//! dependence analysis, so `deps` sits below `repair` among the modules
//! though the compiler runs it (again) on the repaired program. `isl` (the
//! boundary, and isl's trees as plain data) and `error` serve them all.

pub mod capi;
pub mod codegen;
pub mod deps;
pub mod error;
pub mod frontend;
pub mod gpu;
pub mod isl;
pub mod model;
pub mod pipeline;
pub mod repair;
pub mod runtime;
pub mod schedule;
pub mod session;
pub mod tune;

pub use error::{Error, Result};
pub use pipeline::{compile, Compiled, Options};
