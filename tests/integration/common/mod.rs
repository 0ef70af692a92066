//! Helpers that more than one test module uses.

pub mod cli;
pub mod mirror;
pub mod named;
