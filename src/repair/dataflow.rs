//! The proof by dependences of a rolling update.
//!
//! Before the rewrite: the naive fusion (the group fused under the rolling
//! loop, no cache, no repair) has the dependences `D` of its program order
//! `θ`. The fused order `σ` violates `V = D ∩ { a -> b : σ(a) ⪰ σ(b) }`.
//! Every pair of `V` must run from a predecessor's instance (init or update
//! of `X_r`) to a target's update: the "tag" dependences the repair
//! compensates (Neptune's Theorem 4.5). Anything else refuses the fusion.
//!
//! After the rewrite: the repaired program's dependences `D'` are computed
//! under `σ` (its meaning). The value-based flow `F'` must feed each target
//! update at `(o, j)`
//! * from the predecessor update at `(o, j)`: `X_r^<j>` for `r'`;
//! * through the cache, from the predecessor update at `(o, prev(j))`, or
//!   its init where `j` is the first step: `X_r^<prev(j)>` for `r`:
//!
//! ```text
//!   F'|U->T                 = { U[o, j] -> T[o, .., j] }
//!   F'|W->C ∘ F'|C->T       = lexmax_U { U[o, j'] -> T[o, .., j] : j' < j }
//!                             ∪ { I[o] -> T[o, .., j] : no such j' }
//! ```
//!
//! so `h` receives exactly the arguments Theorem 4.4 assumes.

use std::fmt::Write;

use super::rolling::{Item, Member, Rewritten};
use crate::deps::{self, Dependences};
use crate::error::{Error, Result};
use crate::isl::{Isl, IslPrint, Schedule, UnionMap};
use crate::model::Scop;

/// `{ S[..] }` filter over the model statements of new statements `ks`.
fn stmt_names(scop: &Scop, ks: &[usize]) -> Vec<(String, Vec<String>)> {
    scop.statements
        .iter()
        .filter(|s| ks.contains(&s.source))
        .map(|s| (s.name.clone(), s.iterators.clone()))
        .collect()
}

fn pairs_between(isl: &Isl, scop: &Scop, from: &[usize], to: &[usize]) -> Result<UnionMap> {
    let mut parts = Vec::new();
    for (a, ai) in stmt_names(scop, from) {
        for (b, bi) in stmt_names(scop, to) {
            let ai: Vec<String> = ai.iter().map(|v| format!("a_{v}")).collect();
            let bi: Vec<String> = bi.iter().map(|v| format!("b_{v}")).collect();
            parts.push(format!("{a}[{}] -> {b}[{}]", ai.join(", "), bi.join(", ")));
        }
    }
    isl.union_map(&format!("{}{{ {} }}", scop.param_prefix, parts.join("; ")))
}

/// The violated dependences of the naive fusion, checked to be the ones a
/// repair compensates. Returns the report lines.
pub fn naive_fusion(
    isl: &Isl,
    file: &str,
    scop: &Scop,
    theta: &Schedule,
    sigma: &Schedule,
    rw: &Rewritten,
    repaired: bool,
) -> Result<String> {
    // Only the violated pairs are printed; the rest is checked (the
    // flattened order's flow: the same relation, found faster).
    let d = deps::compute_flat(scop, theta)?;
    // The naive fusion has no caches: their instances (dead copies in the
    // shared layout) are left out of every relation.
    let caches: Vec<usize> = rw.caches.iter().map(|c| c.stmt).collect();
    let mut kept = scop.domain()?;
    for (name, iters) in stmt_names(scop, &caches) {
        let c = isl.union_set(&format!(
            "{}{{ {name}[{}] }}",
            scop.param_prefix,
            iters.join(", ")
        ))?;
        kept = kept.subtract(c)?;
    }
    let s = sigma.get_map()?.intersect_domain(scop.domain()?)?;
    let not_before = s.copy()?.lex_ge_union_map(s)?;
    let targets: Vec<usize> = rw.target_updates.iter().map(|(k, _)| *k).collect();
    let compensated = if repaired {
        pairs_between(isl, scop, &rw.pred_stmts, &targets)?
    } else {
        isl.union_map(&format!("{}{{ }}", scop.param_prefix))?
    };
    let mut out = String::new();
    for (kind, rel) in [("flow", &d.flow), ("anti", &d.anti), ("output", &d.output)] {
        let violated = rel
            .copy()?
            .intersect_domain(kept.copy()?)?
            .intersect_range(kept.copy()?)?
            .intersect(not_before.copy()?)?
            .coalesce()?;
        if violated.is_empty()? {
            continue;
        }
        let rest = violated.copy()?.subtract(compensated.copy()?)?;
        if !rest.is_empty()? {
            return Err(Error::Illegal {
                file: file.to_string(),
                message: format!(
                    "{}: the fusion reverses the {kind} dependence {}, which no repair compensates",
                    if repaired {
                        "rolling update"
                    } else {
                        "fusion without repair"
                    },
                    rest.coalesce()?.text()
                ),
            });
        }
        let _ = writeln!(
            out,
            "  violated {kind} (predecessor -> target, compensated by h): {}",
            violated.text()
        );
    }
    if out.is_empty() {
        out.push_str("  none violated (the fusion is legal without repair)\n");
    }
    Ok(out)
}

/// `{ U[..] -> T[..] : same outer coordinates and rolling relation }`.
fn coordinate_map(
    isl: &Isl,
    scop: &Scop,
    from: &Member,
    to: &Member,
    rolling_rel: Option<&str>,
) -> Result<UnionMap> {
    let names_a = stmt_names(scop, &[from.stmt]);
    let names_b = stmt_names(scop, &[to.stmt]);
    let (Some((a, ai)), Some((b, bi))) = (names_a.first(), names_b.first()) else {
        return Err(Error::Internal(
            "group member without a model statement".into(),
        ));
    };
    let mut cons: Vec<String> = from
        .outer
        .iter()
        .zip(&to.outer)
        .map(|(x, y)| format!("a_{x} = b_{y}"))
        .collect();
    if let (Some(rel), Some(x), Some(y)) = (rolling_rel, &from.rolling, &to.rolling) {
        cons.push(format!("a_{x} {rel} b_{y}"));
    }
    let ai: Vec<String> = ai.iter().map(|v| format!("a_{v}")).collect();
    let bi: Vec<String> = bi.iter().map(|v| format!("b_{v}")).collect();
    let text = format!(
        "{}{{ {a}[{}] -> {b}[{}] : {} }}",
        scop.param_prefix,
        ai.join(", "),
        bi.join(", "),
        if cons.is_empty() {
            "true".to_string()
        } else {
            cons.join(" and ")
        }
    );
    Ok(isl
        .union_map(&text)?
        .intersect_domain(scop.domain()?)?
        .intersect_range(scop.domain()?)?)
}

/// The dependences of the repaired program under its fused order, and the
/// check that each target's `h` reads `X_r^<prev(j)>` and `X_r^<j>`.
pub fn repaired(
    isl: &Isl,
    file: &str,
    scop: &Scop,
    sigma: &Schedule,
    rw: &Rewritten,
) -> Result<(Dependences, String)> {
    let d = deps::compute(scop, sigma)?;
    let members: Vec<&Member> = rw
        .layout
        .iter()
        .flat_map(|i| match i {
            Item::Group(m) => m.iter().collect::<Vec<_>>(),
            Item::Plain(_) => Vec::new(),
        })
        .collect();
    let member = |k: usize| {
        members
            .iter()
            .find(|m| m.stmt == k)
            .copied()
            .ok_or_else(|| Error::Internal(format!("statement {k} is not in the group")))
    };
    let flow_between = |from: &[usize], to: &[usize]| -> Result<UnionMap> {
        Ok(d.flow
            .copy()?
            .intersect(pairs_between(isl, scop, from, to)?)?
            .coalesce()?)
    };
    let mut out = String::new();
    for (t, _) in &rw.target_updates {
        let tm = member(*t)?;
        let tst = &rw.program.statements[*t];
        let mut reads = Vec::new();
        crate::model::collect_reads(&tst.rhs, &mut reads);
        for c in &rw.caches {
            if !reads.iter().any(|(x, _)| *x == c.pred_tensor) {
                continue;
            }
            let um = member(c.pred_update)?;
            let im = member(c.pred_init)?;
            // r' = X_r^<j>.
            let cur = flow_between(&[c.pred_init, c.pred_update], &[*t])?;
            let want_cur = coordinate_map(isl, scop, um, tm, Some("="))?;
            if !cur.is_equal(&want_cur)? {
                return Err(Error::Illegal {
                    file: file.to_string(),
                    message: format!(
                        "rolling update: `{}` does not read {} at the current step: its flow is {}, the repair needs {}",
                        tst.text,
                        c.pred_tensor,
                        cur.text(),
                        want_cur.text()
                    ),
                });
            }
            // r = X_r^<prev(j)>, through the cache.
            let into_cache = flow_between(&[c.pred_init, c.pred_update], &[c.stmt])?;
            let from_cache = flow_between(&[c.stmt], &[*t])?;
            let prev = into_cache.apply_range(from_cache)?.coalesce()?;
            let earlier = coordinate_map(isl, scop, um, tm, Some("<"))?;
            let last_earlier = earlier.reverse()?.lexmax()?.reverse()?;
            let first_steps = want_cur.range()?.subtract(last_earlier.copy()?.range()?)?;
            let from_init =
                coordinate_map(isl, scop, im, tm, None)?.intersect_range(first_steps)?;
            let want_prev = last_earlier.union(from_init)?.coalesce()?;
            if !prev.is_equal(&want_prev)? {
                return Err(Error::Illegal {
                    file: file.to_string(),
                    message: format!(
                        "rolling update: `{}` does not read {} at the previous step (the cached value h needs): it gets {}, the repair needs {}",
                        tst.text,
                        c.pred_tensor,
                        if prev.is_empty()? { "nothing".to_string() } else { prev.text() },
                        want_prev.text()
                    ),
                });
            }
            let _ = writeln!(
                out,
                "  proved: `{}` reads {}^<j> = {}\n          and {}^<prev(j)> through {} = {}",
                tst.text,
                c.pred_tensor,
                cur.text(),
                c.pred_tensor,
                c.tensor,
                prev.text()
            );
        }
    }
    Ok((d, out))
}
