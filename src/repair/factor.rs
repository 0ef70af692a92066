//! A factor that does not depend on a sum's index moves out of the sum
//! (Blockbuster's rule of moving a scale past a matrix product, in its
//! simplest form). By distributivity, for a reduction over `k` whose body
//! is a product `P(x, k) · f(x)` (or a quotient `P(x, k) / f(x)`):
//!
//! ```text
//!   T(x) +=! Σ_k P(x, k) · f(x)   =   (Σ_k P(x, k)) · f(x)
//! ```
//!
//! so the statement becomes the sum of `P` and an epilogue that scales each
//! element once. In a product such as covariance's `upper(i, j) +=!
//! c(k, i) * c(k, j) / f32(N - 1)` that is one IEEE division per element
//! instead of one per multiply-add (on the GPU a division costs about ten
//! instructions; the sum is otherwise one FMA a step).
//!
//! Three forms, by what the statement accumulates into:
//! * `T(x) +=! P · f` with `T` stored in its compute type (f32, f64):
//!   `T(x) +=! P; T(x) = T(x) · f` (in place);
//! * `T(x) +=! P · f` with `T` narrower (f16, bf16, f8): a new temp `U` in
//!   the compute type, `U(x) +=! P; T(x) = U(x) · f` (the element is
//!   rounded once, as before);
//! * `T(x) += P · f` (no `!`): `U(x) +=! P; T(x) = T(x) + U(x) · f`.
//!
//! The epilogue must run over exactly the elements the sum reaches: an
//! element whose sum is empty keeps its value in the original (`0` or what
//! it held), while `0 · f` could be NaN (`f` infinite, or `0 / 0`). Its
//! domain is written as the bounding ranges of the sum's elements and the
//! statement's conditions on the left side's indices, and checked in isl
//! to equal the projection of the sum's domain onto the left side; where
//! it does not (a triangle `k < i` leaves row 0 without terms), the
//! statement stays as written. With the new temp and `!`, the temp's
//! elements must also be all of `T`'s initialised ones. Reads before
//! writes are checked on the rewritten program as on any other.
//!
//! The rewrite is inserted right after its statement, so no statement sees
//! the unscaled sum, and `f` reads nothing the sum writes (a reduction may
//! not read its own target), so its value is the same in the epilogue.
//! Numerically the result is a reassociation of the same terms: one
//! rounding of `f` instead of one per term; `--check` compares with the
//! unoptimised program as always.
//!
//! Only sums that are contractions are rewritten (at least two distinct
//! reads that depend on the sum's indices): a row sum `X(r, c) / D` is
//! memory-bound and keeps its form (the row kernels recognise it).

use std::collections::HashSet;

use super::rewrite;
use crate::error::Result;
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, DType, Expr, ExprKind, ExprType, Program, Reducer, Statement, Tensor,
    TensorRole, WhereClause,
};
use crate::isl::{Isl, Set};
use crate::model::{self, Scop};

/// The program with every factor moved out of its sum (`None` where
/// nothing moved), and one line per rewrite or refusal for `--emit deps`.
pub struct Hoisted {
    pub program: Option<Program>,
    pub report: String,
}

impl Hoisted {
    /// Nothing moved, nothing to report.
    pub fn none() -> Hoisted {
        Hoisted {
            program: None,
            report: String::new(),
        }
    }
}

/// One factor of a product, multiplying or dividing.
#[derive(Clone)]
struct Factor {
    expr: Expr,
    divides: bool,
}

/// Moves the sum-invariant factors out of every contraction of `program`
/// (modelled as `scop`) where the epilogue's domain is proven right.
pub fn hoist(isl: &Isl, program: &Program, scop: &Scop) -> Result<Hoisted> {
    let mut report = String::new();
    if program.statements.iter().any(|s| !s.blocks.is_empty()) || program.rolling.is_some() {
        return Ok(Hoisted {
            program: None,
            report,
        });
    }
    let mut current = program.clone();
    let mut k = 0;
    let mut current_scop: Option<Scop> = None;
    while k < current.statements.len() {
        let Some(plan) = plan(&current, k) else {
            k += 1;
            continue;
        };
        let s = current_scop.as_ref().unwrap_or(scop);
        // The simplest clauses that give the epilogue its domain: none
        // (the ranges inferred from the left side), the statement's
        // conditions on the left side, then those with explicit ranges.
        let mut proven = None;
        let want = elements(isl, s, &current.statements[k], k)?;
        for wheres in epilogue_wheres(s, &current.statements[k], want.as_ref())? {
            let (Some(candidate), Some(want)) = (plan.apply(&current, k, wheres)?, &want) else {
                continue;
            };
            if let Some(next_scop) = prove(isl, &current, s, &candidate, k, want)? {
                proven = Some((candidate, next_scop));
                break;
            }
        }
        let st = &current.statements[k];
        match proven {
            Some((next, next_scop)) => {
                report.push_str(&format!(
                    "factor: statement {} `{}`: {} moved out of its sum over {} into `{}`\n",
                    st.position + 1,
                    st.text,
                    plan.describe(),
                    st.reduction_indices.join(", "),
                    next.statements[k + 1].text
                ));
                current = next;
                current_scop = Some(next_scop);
                k += 2;
            }
            None => {
                report.push_str(&format!(
                    "factor: statement {} `{}`: {} stays in its sum (no epilogue was proven to run over exactly the sum's elements)\n",
                    st.position + 1,
                    st.text,
                    plan.describe(),
                ));
                k += 1;
            }
        }
    }
    Ok(Hoisted {
        program: current_scop.map(|_| current),
        report,
    })
}

/// What moves out of statement `k`'s sum, where something does.
struct Plan {
    /// The sum's body without the invariant factors.
    body: Expr,
    invariant: Vec<Factor>,
    /// The compute type of the body.
    t: DType,
}

impl Plan {
    fn describe(&self) -> String {
        self.invariant
            .iter()
            .map(|f| {
                format!(
                    "`{} {}`",
                    if f.divides { "/" } else { "*" },
                    rewrite::expr_text(&f.expr)
                )
            })
            .collect::<Vec<_>>()
            .join(" and ")
    }

    /// `value` scaled by the invariant factors, in order.
    fn scale(&self, value: Expr) -> Expr {
        self.invariant.iter().fold(value, |acc, f| {
            let op = if f.divides { BinOp::Div } else { BinOp::Mul };
            binary(op, acc, f.expr.clone(), self.t)
        })
    }

    /// The program with statement `k` split into its sum and an epilogue
    /// with clauses `wheres` (see the module's three forms).
    fn apply(
        &self,
        program: &Program,
        k: usize,
        wheres: Vec<WhereClause>,
    ) -> Result<Option<Program>> {
        let st = &program.statements[k];
        let AssignOp::Reduce { init, .. } = st.op else {
            return Ok(None);
        };
        let Some(target) = program.tensor(&st.lhs_tensor) else {
            return Ok(None);
        };
        let in_place = init && target.dtype == self.t;
        let mut next = program.clone();
        let mut sum = st.clone();
        sum.rhs = self.body.clone();
        let lhs = st.lhs_indices.clone();
        let epilogue_rhs = if in_place {
            self.scale(rewrite::access(&st.lhs_tensor, &lhs, target.dtype))
        } else {
            let temp = fresh_name(program, &format!("{}_sum", st.lhs_tensor));
            next.tensors.push(Tensor {
                name: temp.clone(),
                dtype: self.t,
                shape: target.shape.clone(),
                role: TensorRole::Temp,
            });
            sum.lhs_tensor = temp.clone();
            sum.op = AssignOp::Reduce {
                op: Reducer::Sum,
                init: true,
            };
            let scaled = self.scale(rewrite::access(&temp, &lhs, self.t));
            if init {
                scaled
            } else {
                let old = rewrite::access(&st.lhs_tensor, &lhs, target.dtype);
                binary(BinOp::Add, old, scaled, self.t)
            }
        };
        sum.text = rewrite::statement_text(&sum);
        let epilogue = rewrite::assignment(k + 1, &st.lhs_tensor, &lhs, &[], epilogue_rhs, wheres);
        next.statements[k] = sum;
        next.statements.insert(k + 1, epilogue);
        for (i, s) in next.statements.iter_mut().enumerate() {
            s.position = i;
        }
        Ok(Some(next))
    }
}

/// The plan for statement `k`: a sum (with or without `!`) in a float
/// compute type whose body is a product with at least one factor free of
/// the sum's indices, the rest a contraction.
fn plan(program: &Program, k: usize) -> Option<Plan> {
    let st = &program.statements[k];
    if !matches!(
        st.op,
        AssignOp::Reduce {
            op: Reducer::Sum,
            ..
        }
    ) || st.reduction_indices.is_empty()
    {
        return None;
    }
    let ExprType::Num(t) = st.rhs.ty else {
        return None;
    };
    if !t.is_float() || !program.tensor(&st.lhs_tensor)?.dtype.is_float() {
        return None;
    }
    // Duplicate left indices would make the epilogue's domain a diagonal.
    let distinct: HashSet<&String> = st.lhs_indices.iter().collect();
    if distinct.len() != st.lhs_indices.len() {
        return None;
    }
    let mut all = Vec::new();
    factors(&st.rhs, false, &mut all)?;
    let moves = |f: &Factor| !mentions_any(&f.expr, &st.reduction_indices);
    let invariant: Vec<Factor> = all.iter().filter(|f| moves(f)).cloned().collect();
    let variant: Vec<Factor> = all.iter().filter(|f| !moves(f)).cloned().collect();
    if invariant.is_empty() || variant.is_empty() {
        return None;
    }
    // A contraction: two distinct reads that move with the sum's indices.
    let mut reads = Vec::new();
    for f in &variant {
        model::collect_reads(&f.expr, &mut reads);
    }
    let moving: HashSet<model::AccessKey> = reads
        .iter()
        .filter(|(_, subs)| {
            subs.iter().any(|a| {
                a.names()
                    .any(|n| st.reduction_indices.iter().any(|r| r == n))
            })
        })
        .map(|(t, subs)| model::AccessKey::new(t, subs))
        .collect();
    if moving.len() < 2 {
        return None;
    }
    let mut body: Option<Expr> = None;
    for f in variant.iter().filter(|f| !f.divides) {
        body = Some(match body {
            None => f.expr.clone(),
            Some(b) => binary(BinOp::Mul, b, f.expr.clone(), t),
        });
    }
    let mut body = body.unwrap_or_else(|| rewrite::number(1.0, t));
    for f in variant.iter().filter(|f| f.divides) {
        body = binary(BinOp::Div, body, f.expr.clone(), t);
    }
    Some(Plan { body, invariant, t })
}

/// The factors of `e` as a product: the operands of `*` and the numerator
/// of `/` recursively, a divisor as one dividing factor. Every `*` and `/`
/// must compute in the same float type as the whole; `None` otherwise.
fn factors(e: &Expr, divides: bool, out: &mut Vec<Factor>) -> Option<()> {
    match &e.kind {
        ExprKind::Binary(op @ (BinOp::Mul | BinOp::Div), a, b) => {
            let ExprType::Num(t) = e.ty else { return None };
            if !t.is_float() {
                return None;
            }
            factors(a, divides, out)?;
            if *op == BinOp::Mul {
                factors(b, divides, out)
            } else if divides {
                // `x / (a / b)`: keep the inner quotient whole.
                out.push(Factor {
                    expr: (**b).clone(),
                    divides: false,
                });
                Some(())
            } else {
                out.push(Factor {
                    expr: (**b).clone(),
                    divides: true,
                });
                Some(())
            }
        }
        _ => {
            out.push(Factor {
                expr: e.clone(),
                divides,
            });
            Some(())
        }
    }
}

/// Whether `e` mentions one of `names` (as a value or in a subscript).
fn mentions_any(e: &Expr, names: &[String]) -> bool {
    let hit = |n: &str| names.iter().any(|x| x == n);
    match &e.kind {
        ExprKind::Index(n) => hit(n),
        ExprKind::Access { subscripts, .. } => {
            subscripts.iter().any(|a: &Affine| a.names().any(hit))
        }
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => mentions_any(a, names),
        ExprKind::Binary(_, a, b) => mentions_any(a, names) || mentions_any(b, names),
        ExprKind::Select(c, a, b) => {
            mentions_any(c, names) || mentions_any(a, names) || mentions_any(b, names)
        }
        ExprKind::Call(_, args) => args.iter().any(|a| mentions_any(a, names)),
        ExprKind::Number(_) | ExprKind::Inf { .. } | ExprKind::Param(_) => false,
    }
}

fn binary(op: BinOp, a: Expr, b: Expr, t: DType) -> Expr {
    Expr {
        kind: ExprKind::Binary(op, Box::new(a), Box::new(b)),
        ty: ExprType::Num(t),
    }
}

/// `base`, or `base2`, `base3`, ... the first name no tensor has.
fn fresh_name(program: &Program, base: &str) -> String {
    let taken = |n: &str| program.tensor(n).is_some() || program.is_param(n);
    if !taken(base) {
        return base.to_string();
    }
    (2..)
        .map(|i| format!("{base}{i}"))
        .find(|n| !taken(n))
        .unwrap_or_default()
}

/// The elements statement `k`'s sum reaches: its domain projected onto the
/// left side's indices.
fn elements(isl: &Isl, scop: &Scop, st: &Statement, k: usize) -> Result<Option<Set>> {
    let Some(update) = scop.statement(&format!("S{k}")) else {
        return Ok(None);
    };
    let map = format!(
        "{}{{ S{k}[{}] -> [{}] }}",
        scop.param_prefix,
        update.iterators.join(", "),
        st.lhs_indices.join(", ")
    );
    Ok(Some(update.domain.copy()?.apply(isl.map(&map)?)?))
}

/// Candidate clauses for the epilogue, simplest first: none, the
/// statement's conditions on the left side only, and those with each left
/// index in the bounding range of the sum's elements (where the range is
/// affine in the parameters). Which one gives the right domain is proven.
/// Without clauses the epilogue is a plain consumer at its own element,
/// which the contraction's epilogue fusion (`schedule::epilogue`) takes.
fn epilogue_wheres(
    scop: &Scop,
    st: &Statement,
    elements: Option<&Set>,
) -> Result<Vec<Vec<WhereClause>>> {
    let conditions = model::lhs_only_wheres(st);
    let mut out = vec![Vec::new()];
    if !conditions.is_empty() {
        out.push(conditions.clone());
    }
    if let Some(set) = elements {
        if let Ok(mut ranges) = rewrite::ranges_of(scop, set, &st.lhs_indices) {
            ranges.extend(conditions);
            out.push(ranges);
        }
    }
    Ok(out)
}

/// The rewritten program's model where the epilogue's domain is the sum's
/// elements (and, with a new temp and `!`, the target's initialised
/// elements are the same set); `None` otherwise.
fn prove(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    next: &Program,
    k: usize,
    want: &Set,
) -> Result<Option<Scop>> {
    let st = &program.statements[k];
    let Ok(next_scop) = model::build(isl, next) else {
        return Ok(None);
    };
    if model::check_reads_written(isl, next, &next_scop).is_err() {
        return Ok(None);
    }
    let as_elements = |name: &str| -> Result<Option<Set>> {
        let Some(s) = next_scop.statement(name) else {
            return Ok(None);
        };
        let map = format!(
            "{}{{ {name}[{}] -> [{}] }}",
            next_scop.param_prefix,
            s.iterators.join(", "),
            st.lhs_indices.join(", ")
        );
        Ok(Some(s.domain.copy()?.apply(isl.map(&map)?)?))
    };
    let Some(epilogue) = as_elements(&format!("S{}", k + 1))? else {
        return Ok(None);
    };
    if !epilogue.is_equal(want)? {
        return Ok(None);
    }
    let temp_with_init = next.statements[k].lhs_tensor != st.lhs_tensor
        && matches!(st.op, AssignOp::Reduce { init: true, .. });
    if temp_with_init {
        let Some(init) = scop.statement(&format!("S{k}_init")) else {
            return Ok(None);
        };
        let map = format!(
            "{}{{ S{k}_init[{}] -> [{}] }}",
            scop.param_prefix,
            init.iterators.join(", "),
            st.lhs_indices.join(", ")
        );
        let initialised = init.domain.copy()?.apply(isl.map(&map)?)?;
        if !initialised.is_equal(want)? {
            return Ok(None);
        }
    }
    Ok(Some(next_scop))
}
