//! Code generation: isl's AST builder turns the final schedule tree into
//! loops ([`crate::isl::ast`]), and printers turn the loops and the statements'
//! computations ([`expr`]) into source ([`c`]).

pub mod c;
pub mod cuda;
pub mod expr;
pub mod flash;
pub mod mma;
pub mod race;

use crate::error::{Error, Result};
use crate::isl::{ast_build_node_from_schedule, Schedule};
use crate::model::Scop;

/// The loops of `schedule`, as plain data.
pub fn build_ast(scop: &Scop, schedule: &Schedule) -> Result<crate::isl::ast::Node> {
    let node = ast_build_node_from_schedule(scop.context.copy()?, schedule.copy()?)
        .ok_or_else(|| Error::Internal("isl could not build an AST for the schedule".into()))?;
    crate::isl::ast::from_isl(&node)
}
