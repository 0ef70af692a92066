//! Split-k update and reduction privatization (in progress).
use super::{Fault, Repaired};
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::isl::Isl;
use crate::model::Scop;

pub fn split_k(
    _isl: &Isl,
    program: &Program,
    _scop: &Scop,
    _targets: &[String],
    _factor: i64,
    _fault: Fault,
) -> Result<Repaired> {
    Err(Error::Input {
        file: program.source.clone(),
        message: "split-k is not available yet".into(),
    })
}

pub fn privatize_step(
    _isl: &Isl,
    program: &Program,
    _scop: &Scop,
    _tensor: &str,
    _factor: i64,
) -> Result<Repaired> {
    Err(Error::Input {
        file: program.source.clone(),
        message: "privatize is not available yet".into(),
    })
}
