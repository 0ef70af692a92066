//! The isl boundary: a context that owns every isl object made through it,
//! the few bindings isl-rs lacks (the AST builder, printing that frees what
//! isl allocates), and small constructors from isl's text syntax.
//!
//! isl-rs wraps each object as an owned value that frees itself on drop; the
//! only rule left to us is that no object outlives its [`Isl`] context.
//! polyfuse keeps that rule by running each compilation inside one function
//! that creates the context and returns only plain Rust data ([`ast`]: isl's
//! AST as such data, which the gpu stage's plans and every printer share).

pub mod ast;
mod ffi;
pub mod tree;

pub use ffi::{
    ast_build_expr_from_pw_aff, ast_build_expr_from_set, ast_build_node_from_schedule,
    ast_node_type, schedule_yaml, version, Abort, IslPrint,
};
/// isl's types, as the rest of polyfuse names them: every stage reaches isl
/// through this module (`tests/integration/architecture.rs` holds that no
/// file outside `src/isl/` names `isl_rs`), so the binding is one place.
pub use isl_rs::{
    ASTExpr, ASTExprOpType, ASTExprType, ASTNode, ASTNodeType, Aff, Context, DimType, Id, IdList,
    LibISLError, LocalSpace, Map, MultiAff, MultiId, MultiUnionPwAff, MultiVal, Options, Point,
    PwAff, PwMultiAff, Schedule, ScheduleConstraints, ScheduleNode, ScheduleNodeType, Set, Space,
    UnionAccessInfo, UnionMap, UnionPwAff, UnionSet, Val,
};

use crate::error::{Error, Result};
use std::sync::Arc;

/// One isl context with polyfuse's options. Dropped last: see the module
/// comment.
pub struct Isl {
    pub ctx: Context,
    /// The abort handle the creating thread had installed, if any; the
    /// context is registered with it for its whole life.
    abort: Option<Arc<Abort>>,
}

impl Isl {
    pub fn new() -> Isl {
        let ctx = Context::alloc();
        // ISL_ON_ERROR_CONTINUE: errors come back as values, never abort,
        // and are reported by polyfuse, not printed by isl.
        let _ = isl_rs::Options::set_on_error(&ctx, 1);
        ffi::keep_strides_unscaled(&ctx);
        let abort = ffi::register_with_current_abort(ctx.ptr);
        Isl { ctx, abort }
    }

    pub fn set(&self, text: &str) -> Result<Set> {
        Set::read_from_str(&self.ctx, text).map_err(|e| parse_error("set", text, e))
    }
    pub fn map(&self, text: &str) -> Result<Map> {
        Map::read_from_str(&self.ctx, text).map_err(|e| parse_error("map", text, e))
    }
    pub fn union_set(&self, text: &str) -> Result<UnionSet> {
        UnionSet::read_from_str(&self.ctx, text).map_err(|e| parse_error("union set", text, e))
    }
    pub fn union_map(&self, text: &str) -> Result<UnionMap> {
        UnionMap::read_from_str(&self.ctx, text).map_err(|e| parse_error("union map", text, e))
    }
    pub fn schedule(&self, text: &str) -> Result<Schedule> {
        Schedule::read_from_str(&self.ctx, text).map_err(|e| parse_error("schedule", text, e))
    }
}

impl Drop for Isl {
    fn drop(&mut self) {
        // Before the context is freed (fields drop after this), so that an
        // abort never reaches a freed context.
        if let Some(a) = &self.abort {
            a.unregister(self.ctx.ptr);
        }
    }
}

impl Default for Isl {
    fn default() -> Self {
        Isl::new()
    }
}

fn parse_error(what: &str, text: &str, e: isl_rs::LibISLError) -> Error {
    Error::Internal(format!("isl could not read {what} `{text}`: {e:?}"))
}

/// The first `dims` coordinates of an integer point (a sampled element,
/// a distance), as integers.
pub fn coordinates(p: &isl_rs::Point, dims: u32) -> Result<Vec<i64>> {
    (0..dims as i32)
        .map(|d| val_to_i64(&p.get_coordinate_val(DimType::Set, d)?))
        .collect()
}

/// Value of an integer isl value; isl values here are sizes and bounds that
/// fit in an i64.
pub fn val_to_i64(v: &Val) -> Result<i64> {
    let den = v.get_den_si()?;
    if den != 1 {
        return Err(Error::Internal("expected an integer isl value".into()));
    }
    Ok(v.get_num_si()?)
}

/// The affine function `aff` of the parameters as `(constant, [(name,
/// coefficient)])`; errors when it depends on set dimensions or divisions.
pub fn aff_in_params(aff: &isl_rs::Aff) -> Result<(i64, Vec<(String, i64)>)> {
    let c = val_to_i64(&aff.get_constant_val()?)?;
    let n = aff.dim(DimType::Param)?;
    let mut terms = Vec::new();
    for i in 0..n {
        let v = val_to_i64(&aff.get_coefficient_val(DimType::Param, i)?)?;
        if v != 0 {
            terms.push((aff.get_dim_name(DimType::Param, i as u32)?.to_string(), v));
        }
    }
    Ok((c, terms))
}
