//! The work of one execution of a program at its parameter values: the
//! bytes it must move and the arithmetic it must do, whatever the schedule.
//! Both targets divide these by the measured time, so their GB/s and
//! TFLOP/s mean the same thing and compare schedules fairly.
//!
//! * bytes: every input read once and every output written once (element
//!   count × storage size). Temporaries are not counted: a fused schedule
//!   may never store them, and counting them would reward schedules that
//!   do.
//! * flops: Σ over isl statements of |D_S| × the operations of one
//!   instance of S ([`flops_per_instance`]). |D_S| is the exact number of
//!   integer points of the statement's iteration domain with every
//!   parameter fixed ([`count_points`]), so `where` constraints such as a
//!   causal mask `j <= i` are counted exactly, not bounded by a box.

use crate::error::{Error, Result};
use crate::frontend::ast::TensorRole;
use crate::isl::Isl;
use crate::model;
pub use crate::model::count::{count_points, expr_flops, flops_per_instance};
use crate::pipeline::Compiled;

/// Bytes and flops of one execution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Work {
    /// Inputs read once plus outputs written once, in bytes.
    pub bytes: u64,
    /// Arithmetic operations of all statement instances.
    pub flops: u64,
    /// Per isl statement (`S0_init`, `S0`, ...): instances and flops of
    /// one instance, in model order.
    pub statements: Vec<StatementWork>,
}

/// The work of one isl statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementWork {
    pub name: String,
    /// |D_S|: points of the iteration domain at the parameter values.
    pub instances: u64,
    pub flops_per_instance: u64,
}

/// The work of `compiled` at its parameter values (every parameter must
/// have one). The model is rebuilt from the program: `Compiled` holds no
/// isl objects (see `pipeline`).
pub fn measure(compiled: &Compiled) -> Result<Work> {
    compiled.param_values()?;
    let counts = super::cpu::tensor_counts(compiled)?;
    let mut bytes: u64 = 0;
    for (t, n) in compiled.tensors.iter().zip(&counts) {
        if matches!(t.role, TensorRole::Input | TensorRole::Output) {
            bytes = bytes.saturating_add((*n as u64).saturating_mul(t.dtype.size() as u64));
        }
    }
    let isl = Isl::new();
    let scop = model::build(&isl, &compiled.program)?;
    let mut flops: u64 = 0;
    let mut statements = Vec::new();
    for s in &scop.statements {
        let source = compiled.program.statements.get(s.source).ok_or_else(|| {
            Error::Internal(format!("statement {} has no source statement", s.name))
        })?;
        let per = flops_per_instance(source, s.kind);
        let domain = s
            .domain
            .copy()?
            .intersect_params(scop.context.copy()?)?
            .project_out_all_params()?;
        let instances = count_points(&domain).map_err(|e| match e {
            Error::Internal(m) => Error::Internal(format!("counting {}: {m}", s.name)),
            other => other,
        })?;
        flops = flops.saturating_add(instances.saturating_mul(per));
        statements.push(StatementWork {
            name: s.name.clone(),
            instances,
            flops_per_instance: per,
        });
    }
    Ok(Work {
        bytes,
        flops,
        statements,
    })
}
