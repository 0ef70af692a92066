//! polyfuse: a polyhedral optimizer for machine-learning kernels.
//!
//! The pipeline runs in one direction (see `DESIGN.md` of the project):
//! frontend -> model -> deps -> repair -> schedule -> gpu -> codegen, which
//! [`compile`] drives for one program, returning plain data ([`Compiled`];
//! isl objects never leave it), and runtime, which runs what it returns.
//! [`session`] is the front door the command line and the C ABI compile
//! through (parameters, options, the tuning cache, the watch).
//! The repair proves its rewrites against the dependences, so `deps`
//! comes before it. No stage imports a later one (`tests/architecture.rs`);
//! `isl` (the boundary, and isl's trees as plain data) and `error` serve
//! them all.

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
