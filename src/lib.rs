//! polyfuse: a polyhedral optimizer for machine-learning kernels.
//!
//! The pipeline runs in one direction (see `DESIGN.md` of the project):
//! frontend -> model -> deps -> schedule -> codegen -> runtime.
//! [`compile`] drives it for one program and returns plain data; isl objects
//! never leave it.

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
pub mod sys;
pub mod tune;

pub use error::{Error, Result};
pub use pipeline::{compile, Compiled, Options};
