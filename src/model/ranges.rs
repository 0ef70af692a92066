//! TC range inference, in isl.
//!
//! Each index variable `x` of a statement gets an interval of values. It
//! comes from an explicit `where x in lo:hi`, or is inferred in rounds: in
//! a round, every subscript `e` (of tensor dimension with extent `E`) that
//! contains exactly one unresolved variable `x` gives the largest set of `x`
//! for which the access stays in bounds whatever the values of the variables
//! resolved before:
//!
//! ```text
//!   good_e(x) = { x | ∀ y ∈ R_y : 0 <= e(x, y) < E }
//!             = ¬ π_x { (x, y) | y ∈ R_y ∧ (e < 0 ∨ e >= E) }
//! ```
//!
//! Sets met in the same round are intersected; a variable never resolved, or
//! resolved to an unbounded set, is an error asking for a `where` clause.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::frontend::ast::{Affine, Program, Statement, WhereClause};
use crate::isl::{aff_in_params, Isl, Set};

use super::{collect_reads, ModelTensor};

pub(super) struct Ctx<'a> {
    pub isl: &'a Isl,
    pub program: &'a Program,
    pub tensors: &'a [ModelTensor],
    pub param_prefix: &'a str,
    pub context: &'a Set,
}

pub(super) enum RangeError {
    /// A message about the statement, for the user.
    User(String),
    /// isl failed: a bug.
    Isl(Error),
}

impl From<Error> for RangeError {
    fn from(e: Error) -> Self {
        RangeError::Isl(e)
    }
}
impl From<crate::isl::LibISLError> for RangeError {
    fn from(e: crate::isl::LibISLError) -> Self {
        RangeError::Isl(e.into())
    }
}

type Ranges = BTreeMap<String, Set>;

/// The range of every index variable of `st`, each a set `[P] -> { [x] }`.
pub(super) fn infer(ctx: &Ctx, st: &Statement) -> Result<Ranges, RangeError> {
    let vars = st.all_indices();
    let is_param = |n: &str| ctx.program.is_param(n);
    let mut resolved: Ranges = BTreeMap::new();
    // A loop block's index is fixed: its range is the block's.
    for b in &st.blocks {
        let s = ctx.isl.set(&format!(
            "{}{{ [x] : {} <= x < {} }}",
            ctx.param_prefix, b.lo, b.hi
        ))?;
        resolved.insert(b.index.clone(), s.intersect_params(ctx.context.copy()?)?);
    }
    for w in &st.wheres {
        if let WhereClause::Range { index, lo, hi } = w {
            if let Some(n) = lo.names().chain(hi.names()).find(|n| !is_param(n)) {
                return Err(RangeError::User(format!(
                    "the range of `{index}` may depend on parameters only, not on `{n}`; write `{index} in lo:hi` with parameters and add the condition as a constraint such as `{index} <= {n}`"
                )));
            }
            let s = ctx
                .isl
                .set(&format!("{}{{ [x] : {lo} <= x < {hi} }}", ctx.param_prefix))?;
            let s = match resolved.remove(index) {
                Some(old) => old.intersect(s)?,
                None => s,
            };
            resolved.insert(index.clone(), s);
        }
    }
    // Accesses that constrain ranges: every read, and the write when its
    // tensor's shape is known.
    let mut accesses: Vec<(String, Vec<Affine>)> = Vec::new();
    if ctx.tensors.iter().any(|t| t.name == st.lhs_tensor) {
        accesses.push((
            st.lhs_tensor.clone(),
            st.lhs_indices.iter().map(|i| Affine::var(i)).collect(),
        ));
    }
    collect_reads(&st.rhs, &mut accesses);
    loop {
        let mut round: Ranges = BTreeMap::new();
        for (tname, subs) in &accesses {
            let Some(t) = ctx.tensors.iter().find(|t| &t.name == tname) else {
                continue; // reported by the caller
            };
            for (d, e) in subs.iter().enumerate() {
                let unresolved: Vec<&str> = e
                    .names()
                    .filter(|n| vars.iter().any(|v| v == n) && !resolved.contains_key(*n))
                    .collect();
                if unresolved.len() != 1 || d >= t.shape.len() {
                    continue;
                }
                let x = unresolved[0];
                let good = in_bounds_range(ctx, x, e, &t.shape[d], &resolved)?;
                let good = match round.remove(x) {
                    Some(old) => old.intersect(good)?,
                    None => good,
                };
                round.insert(x.to_string(), good);
            }
        }
        if round.is_empty() {
            break;
        }
        for (x, s) in round {
            let s = s.intersect_params(ctx.context.copy()?)?.coalesce()?;
            if !s.dim_has_any_lower_bound(crate::isl::DimType::Set, 0)?
                || !s.dim_has_any_upper_bound(crate::isl::DimType::Set, 0)?
            {
                return Err(RangeError::User(format!(
                    "the range of index `{x}` is unbounded; add `where {x} in lo:hi`"
                )));
            }
            resolved.insert(x, s);
        }
    }
    if let Some(x) = vars.iter().find(|v| !resolved.contains_key(*v)) {
        return Err(RangeError::User(format!(
            "cannot infer the range of index `{x}`: no subscript determines it alone; add `where {x} in lo:hi`"
        )));
    }
    Ok(resolved)
}

/// `good_e(x)` of the module comment, for subscript `e` of extent `extent`.
fn in_bounds_range(
    ctx: &Ctx,
    x: &str,
    e: &Affine,
    extent: &Affine,
    resolved: &Ranges,
) -> Result<Set, RangeError> {
    let ys: Vec<&str> = e.names().filter(|n| resolved.contains_key(*n)).collect();
    let mut tuple = vec![x.to_string()];
    tuple.extend(ys.iter().map(|s| s.to_string()));
    let tuple = tuple.join(", ");
    let p = ctx.param_prefix;
    let mut bad = ctx
        .isl
        .set(&format!("{p}{{ [{tuple}] : {e} < 0 or {e} >= {extent} }}"))?;
    for y in &ys {
        let lift = ctx
            .isl
            .map(&format!("{p}{{ [pf_v'] -> [{tuple}] : {y} = pf_v' }}"))?;
        bad = bad.intersect(resolved[*y].copy()?.apply(lift)?)?;
    }
    let project = ctx.isl.map(&format!("{p}{{ [{tuple}] -> [{x}] }}"))?;
    Ok(bad.apply(project)?.complement()?)
}

/// The iteration domain `name[vars]`: the product of the variables' ranges,
/// restricted by the affine `where` constraints among `wheres`.
pub(super) fn domain_of(
    ctx: &Ctx,
    name: &str,
    vars: &[String],
    ranges: &Ranges,
    wheres: &[WhereClause],
) -> Result<Set, Error> {
    let p = ctx.param_prefix;
    let tuple = vars.join(", ");
    let mut dom = ctx.isl.set(&format!("{p}{{ {name}[{tuple}] }}"))?;
    for v in vars {
        let lift = ctx.isl.map(&format!(
            "{p}{{ [pf_v'] -> {name}[{tuple}] : {v} = pf_v' }}"
        ))?;
        dom = dom.intersect(ranges[v].copy()?.apply(lift)?)?;
    }
    for w in wheres {
        if let Some(cond) = w.condition_text(true, &|a| a.to_string()) {
            let c = ctx.isl.set(&format!("{p}{{ {name}[{tuple}] : {cond} }}"))?;
            dom = dom.intersect(c)?;
        }
    }
    // A disjunctive `where` (BigBird's window, global rows and global
    // columns) gives a union of overlapping pieces; isl's dataflow
    // analysis takes a lexicographic maximum over each pair of pieces, so
    // overlapping ones cost it work for instances it finds twice. Disjoint
    // pieces (isl's `make_disjoint`, then merged again where convex) took
    // BigBird's compilation from about 4.3 to 1.7 s of CPU; a domain of
    // one piece is unchanged.
    Ok(dom
        .intersect_params(ctx.context.copy()?)?
        .coalesce()?
        .make_disjoint()?
        .coalesce()?)
}

/// The shape of a temp that the file leaves to inference: the upper bounds
/// of its left-side indices, plus one, as affine forms of the parameters.
pub(super) fn extent_of_lhs(
    ctx: &Ctx,
    st: &Statement,
    ranges: &Ranges,
) -> Result<Vec<Affine>, RangeError> {
    let mut shape = Vec::new();
    for v in &st.lhs_indices {
        let max = ranges[v]
            .copy()?
            .dim_max(0)?
            .gist_params(ctx.context.copy()?)?;
        let not_affine = || {
            RangeError::User(format!(
                "cannot infer the extent of `{}` along `{v}` as one affine expression; declare it in `temps` with a shape",
                st.lhs_tensor
            ))
        };
        if !max.isa_aff()? {
            return Err(not_affine());
        }
        let (c, terms) = aff_in_params(&max.as_aff()?)?;
        let mut a = Affine::constant(c + 1);
        for (name, k) in terms {
            a = a.add(&Affine::var(&name).scale(k));
        }
        shape.push(a);
    }
    Ok(shape)
}
