//! Helpers that more than one test module uses.

pub mod mirror;
pub mod named;
