//! Statements and expressions a repair builds: plain assignments the
//! frontend would also accept in meaning (each with explicit `where`
//! ranges, since a cache `Xp(i) = X(i)` inside the rolling loop has no
//! subscript that would give the loop's range), and the translation of an
//! algebra term back into a typed expression.

use std::collections::HashMap;

use super::algebra::{Math, Reducer, Term};
use crate::error::{Error, Result};
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, DType, Expr, ExprKind, ExprType, Func, Statement, UnOp, WhereClause,
};
use crate::isl::aff_in_params;
use crate::isl::Set;
use crate::model::{ModelStmt, Scop};

/// `tensor(vars...)` read in the tensor's compute type.
pub fn access(tensor: &str, vars: &[String], dtype: DType) -> Expr {
    Expr {
        kind: ExprKind::Access {
            tensor: tensor.to_string(),
            subscripts: vars.iter().map(|v| Affine::var(v)).collect(),
        },
        ty: ExprType::Num(dtype.compute()),
    }
}

pub fn number(v: f64, t: DType) -> Expr {
    Expr {
        kind: ExprKind::Number(v),
        ty: ExprType::Num(t),
    }
}

/// The identity of `f` in type `t`.
pub fn identity(f: Reducer, t: DType) -> Expr {
    match f {
        Reducer::Sum => number(0.0, t),
        Reducer::Prod => number(1.0, t),
        Reducer::Max => Expr {
            kind: ExprKind::Inf { negative: true },
            ty: ExprType::Num(t),
        },
        Reducer::Min => Expr {
            kind: ExprKind::Inf { negative: false },
            ty: ExprType::Num(t),
        },
    }
}

/// `a f b` in type `t`.
pub fn combine(f: Reducer, a: Expr, b: Expr, t: DType) -> Expr {
    let ty = ExprType::Num(t);
    let kind = match f {
        Reducer::Sum => ExprKind::Binary(BinOp::Add, Box::new(a), Box::new(b)),
        Reducer::Prod => ExprKind::Binary(BinOp::Mul, Box::new(a), Box::new(b)),
        Reducer::Max => ExprKind::Call(Func::Max, vec![a, b]),
        Reducer::Min => ExprKind::Call(Func::Min, vec![a, b]),
    };
    Expr { kind, ty }
}

/// The carried value `t` repaired: `same ? t : h(t, r, q)`, with `h` the
/// proven repair over `t`, the predecessors' previous values `r<k>` and
/// their current ones `q<k>` (`solve::Solution::h`), each predecessor
/// `r<k>` of `symbols` read through `pred(r<k>, previous)`, and `same`
/// the test that every predecessor kept its value (`r<k> == q<k>`): there
/// `h(t, r, r) = t` holds exactly, and the guard keeps `-inf - -inf` out
/// of the arithmetic. The rolling update (a cache against the running
/// value) and the split-k combination (a slice's local against the
/// global) both repair so.
pub fn guarded_repair<'s>(
    h: &Term,
    t: DType,
    carried: &Expr,
    symbols: impl Iterator<Item = &'s str>,
    pred: &dyn Fn(&str, bool) -> Option<Expr>,
) -> Result<Expr> {
    let h = from_term(h, t, &|s| {
        if s == "t" {
            Some(carried.clone())
        } else if let Some(k) = s.strip_prefix('r') {
            pred(&format!("r{k}"), true)
        } else if let Some(k) = s.strip_prefix('q') {
            pred(&format!("r{k}"), false)
        } else {
            None
        }
    })?;
    let mut same: Option<Expr> = None;
    for symbol in symbols {
        let (Some(previous), Some(current)) = (pred(symbol, true), pred(symbol, false)) else {
            return Err(Error::Internal(format!("no predecessor {symbol}")));
        };
        let eq = Expr {
            kind: ExprKind::Binary(BinOp::Eq, Box::new(previous), Box::new(current)),
            ty: ExprType::Bool,
        };
        same = Some(match same {
            None => eq,
            Some(a) => Expr {
                kind: ExprKind::Binary(BinOp::And, Box::new(a), Box::new(eq)),
                ty: ExprType::Bool,
            },
        });
    }
    let same = same.ok_or_else(|| Error::Internal("no predecessor".into()))?;
    Ok(Expr {
        kind: ExprKind::Select(Box::new(same), Box::new(carried.clone()), Box::new(h)),
        ty: ExprType::Num(t),
    })
}

/// A typed expression of `term`, each symbol given by `leaf`.
pub fn from_term(term: &Term, t: DType, leaf: &dyn Fn(&str) -> Option<Expr>) -> Result<Expr> {
    let ty = ExprType::Num(t);
    let mut done: Vec<Expr> = Vec::new();
    for n in term.as_ref() {
        let at = |i: &egg::Id| Box::new(done[usize::from(*i)].clone());
        let kind = match n {
            Math::Add([a, b]) => ExprKind::Binary(BinOp::Add, at(a), at(b)),
            Math::Sub([a, b]) => ExprKind::Binary(BinOp::Sub, at(a), at(b)),
            Math::Mul([a, b]) => ExprKind::Binary(BinOp::Mul, at(a), at(b)),
            Math::Div([a, b]) => ExprKind::Binary(BinOp::Div, at(a), at(b)),
            Math::Neg(a) => ExprKind::Unary(UnOp::Neg, at(a)),
            Math::Recip(a) => ExprKind::Binary(BinOp::Div, Box::new(number(1.0, t)), at(a)),
            Math::Exp(a) => ExprKind::Call(Func::Exp, vec![*at(a)]),
            Math::Log(a) => ExprKind::Call(Func::Log, vec![*at(a)]),
            Math::Max([a, b]) => ExprKind::Call(Func::Max, vec![*at(a), *at(b)]),
            Math::Min([a, b]) => ExprKind::Call(Func::Min, vec![*at(a), *at(b)]),
            Math::Symbol(s) => match s.as_str() {
                "zero" => ExprKind::Number(0.0),
                "one" => ExprKind::Number(1.0),
                "ninf" => ExprKind::Inf { negative: true },
                "pinf" => ExprKind::Inf { negative: false },
                other => {
                    leaf(other)
                        .ok_or_else(|| Error::Internal(format!("no value for symbol {other}")))?
                        .kind
                }
            },
        };
        done.push(Expr { kind, ty });
    }
    done.pop()
        .ok_or_else(|| Error::Internal("empty repair term".into()))
}

/// `where v in lo:hi` for every iterator of `s`: the bounds of its domain
/// (isl's `dim_min`/`dim_max`, affine in the parameters).
pub fn ranges(scop: &Scop, s: &ModelStmt) -> Result<Vec<WhereClause>> {
    ranges_of(scop, &s.domain, &s.iterators)
}

/// `where v in lo:hi` for every dimension `v` of `set` (named by
/// `names`, in order): its bounds, each one affine piece in the
/// parameters (an internal error otherwise).
pub fn ranges_of(scop: &Scop, set: &Set, names: &[String]) -> Result<Vec<WhereClause>> {
    let mut out = Vec::new();
    for (pos, v) in names.iter().enumerate() {
        let bound = |pa: crate::isl::PwAff| -> Result<Affine> {
            let pa = pa.gist_params(scop.context.copy()?)?;
            if !pa.isa_aff()? {
                return Err(Error::Internal(format!(
                    "the range of `{v}` is not one affine piece in the parameters; fix the parameters for a repair"
                )));
            }
            let (c, terms) = aff_in_params(&pa.as_aff()?)?;
            let mut a = Affine::constant(c);
            for (n, k) in terms {
                a = a.add(&Affine::var(&n).scale(k));
            }
            Ok(a)
        };
        let lo = bound(set.copy()?.dim_min(pos as i32)?)?;
        let hi = bound(set.copy()?.dim_max(pos as i32)?)?.add(&Affine::constant(1));
        out.push(WhereClause::Range {
            index: v.clone(),
            lo,
            hi,
        });
    }
    Ok(out)
}

/// An assignment statement over `lhs_indices` and then `extra` indices.
pub fn assignment(
    position: usize,
    lhs_tensor: &str,
    lhs_indices: &[String],
    extra: &[String],
    rhs: Expr,
    wheres: Vec<WhereClause>,
) -> Statement {
    let mut st = Statement {
        position,
        text: String::new(),
        lhs_tensor: lhs_tensor.to_string(),
        lhs_indices: lhs_indices.to_vec(),
        op: AssignOp::Assign,
        rhs,
        wheres,
        reduction_indices: extra.to_vec(),
        blocks: Vec::new(),
    };
    st.text = statement_text(&st);
    st
}

/// TC-like text of a statement, for messages and `--emit`.
pub fn statement_text(st: &Statement) -> String {
    let op = match st.op {
        AssignOp::Assign => "=".to_string(),
        AssignOp::Reduce { op, init } => {
            format!("{}={}", op.symbol(), if init { "!" } else { "" })
        }
    };
    let mut s = format!(
        "{}({}) {op} {}",
        st.lhs_tensor,
        st.lhs_indices.join(", "),
        expr_text(&st.rhs)
    );
    let clauses: Vec<String> = st
        .wheres
        .iter()
        .map(|w| match w {
            WhereClause::Range { index, lo, hi } => format!("{index} in {lo}:{hi}"),
            cond => cond
                .condition_text(false, &|a| a.to_string())
                .unwrap_or_default(),
        })
        .collect();
    if !clauses.is_empty() {
        s.push_str(" where ");
        s.push_str(&clauses.join(", "));
    }
    s
}

/// TC-like text of an expression.
pub fn expr_text(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Number(v) => format!("{v}"),
        ExprKind::Inf { negative } => if *negative { "-inf" } else { "inf" }.into(),
        ExprKind::Index(n) | ExprKind::Param(n) => n.clone(),
        ExprKind::Access { tensor, subscripts } => format!(
            "{tensor}({})",
            subscripts
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ExprKind::Unary(UnOp::Neg, a) => format!("-{}", expr_text(a)),
        ExprKind::Unary(UnOp::Not, a) => format!("!{}", expr_text(a)),
        ExprKind::Binary(op, a, b) => {
            format!("({} {} {})", expr_text(a), op.symbol(), expr_text(b))
        }
        ExprKind::Select(c, a, b) => {
            format!("({} ? {} : {})", expr_text(c), expr_text(a), expr_text(b))
        }
        ExprKind::Call(f, args) => format!(
            "{}({})",
            f.name(),
            args.iter().map(expr_text).collect::<Vec<_>>().join(", ")
        ),
        ExprKind::Cast(t, a) => format!("{t}({})", expr_text(a)),
    }
}

/// Dtypes of the program's tensors by name.
pub fn dtypes(scop: &Scop) -> HashMap<String, DType> {
    scop.tensors
        .iter()
        .map(|t| (t.name.clone(), t.dtype))
        .collect()
}
