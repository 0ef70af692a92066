//! Algebraic repair (Neptune's rolling and split-k update).
pub mod algebra;
pub mod chain;
pub mod prove;
