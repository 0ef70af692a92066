//! Reduction privatization and split-k update (Neptune's Section 4.2 and
//! Algorithm 2).
//!
//! Privatization splits the reduction loop `j ∈ [lo, hi)` of
//! `X(o) f=! e(o, j)` into `K` slices of `B = ⌈(hi - lo) / K⌉`,
//! `j = lo + B·s + u`:
//!
//! ```text
//!   X_local(o, s) f=! e(o, lo + B·s + u)   where s in 0:K, u in 0:B, B·s + u < hi - lo
//!   X(o)          f=! X_local(o, s)        where s in 0:K
//! ```
//!
//! legal for any associative and commutative `f` (empty slices keep the
//! identity). Split-k update privatizes the predecessors and the targets,
//! lets each local target read its slice's local predecessors (so the local
//! part is parallel over `s`), and repairs in the global combination
//! (Eq. 8):
//!
//! ```text
//!   X_t(o, ..) f=! h(X_t_local(o, .., s), X_r_local(o, s), X_r(o))
//! ```
//!
//! The result means what its statements say in program order; no fused
//! order is needed. The dataflow proof checks that the global combination
//! passes `h` the very predecessor value each local target used (the final
//! value of its slice) and the final global value.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::algebra::Reducer;
use super::chain::Chain;
use super::rewrite::{self, access};
use super::solve::Solution;
use super::{Fault, Repaired};
use crate::error::{Error, Result};
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, Expr, ExprKind, ExprType, Program, Reducer as AstReducer, Statement,
    Tensor, TensorRole, WhereClause,
};
use crate::isl::{Isl, IslPrint};
use crate::model::{self, Scop};

/// `a` with variable `v` replaced by `by`.
fn subst_affine(a: &Affine, v: &str, by: &Affine) -> Affine {
    let c = a.coeff(v);
    if c == 0 {
        return a.clone();
    }
    a.sub(&Affine::var(v).scale(c)).add(&by.scale(c))
}

/// An affine form as a typed value expression.
fn affine_expr(program: &Program, a: &Affine, ty: ExprType) -> Expr {
    let leaf = |n: &str| Expr {
        kind: if program.is_param(n) {
            ExprKind::Param(n.to_string())
        } else {
            ExprKind::Index(n.to_string())
        },
        ty,
    };
    let num = |v: f64| Expr {
        kind: ExprKind::Number(v),
        ty,
    };
    let bin = |op, x: Expr, y: Expr| Expr {
        kind: ExprKind::Binary(op, Box::new(x), Box::new(y)),
        ty,
    };
    let mut e = num(a.constant as f64);
    for (n, c) in &a.terms {
        e = bin(BinOp::Add, e, bin(BinOp::Mul, num(*c as f64), leaf(n)));
    }
    e
}

/// `e` with index `v` replaced by the affine form `by` (subscripts and
/// values) and reads of `retarget` tensors sent to their local tensors,
/// indexed by the slice `s` as well.
fn subst_expr(
    program: &Program,
    e: &Expr,
    v: &str,
    by: &Affine,
    retarget: &[(String, String)],
    s: &str,
) -> Expr {
    let go = |x: &Expr| Box::new(subst_expr(program, x, v, by, retarget, s));
    let kind = match &e.kind {
        ExprKind::Index(n) if n == v => return affine_expr(program, by, e.ty),
        ExprKind::Access { tensor, subscripts } => {
            let mut subs: Vec<Affine> = subscripts.iter().map(|a| subst_affine(a, v, by)).collect();
            let mut tensor = tensor.clone();
            if let Some((_, local)) = retarget.iter().find(|(x, _)| *x == tensor) {
                tensor = local.clone();
                subs.push(Affine::var(s));
            }
            ExprKind::Access {
                tensor,
                subscripts: subs,
            }
        }
        ExprKind::Unary(op, a) => ExprKind::Unary(*op, go(a)),
        ExprKind::Cast(t, a) => ExprKind::Cast(*t, go(a)),
        ExprKind::Binary(op, a, b) => ExprKind::Binary(*op, go(a), go(b)),
        ExprKind::Select(c, a, b) => ExprKind::Select(go(c), go(a), go(b)),
        ExprKind::Call(f, args) => ExprKind::Call(
            *f,
            args.iter()
                .map(|x| subst_expr(program, x, v, by, retarget, s))
                .collect(),
        ),
        k => k.clone(),
    };
    Expr { kind, ty: e.ty }
}

fn ast_op(f: Reducer) -> AstReducer {
    match f {
        Reducer::Sum => AstReducer::Sum,
        Reducer::Prod => AstReducer::Prod,
        Reducer::Max => AstReducer::Max,
        Reducer::Min => AstReducer::Min,
    }
}

fn reduction(
    position: usize,
    lhs: &str,
    lhs_indices: &[String],
    red: &[String],
    f: Reducer,
    rhs: Expr,
    wheres: Vec<WhereClause>,
) -> Statement {
    let mut st = Statement {
        position,
        text: String::new(),
        lhs_tensor: lhs.to_string(),
        lhs_indices: lhs_indices.to_vec(),
        op: AssignOp::Reduce {
            op: ast_op(f),
            init: true,
        },
        rhs,
        wheres,
        reduction_indices: red.to_vec(),
        blocks: Vec::new(),
    };
    st.text = rewrite::statement_text(&st);
    st
}

/// The local tensor of `x`.
pub fn local_name(x: &str) -> String {
    format!("{x}_local")
}

/// One privatized reduction: its local and global statements, the local
/// tensor, and the slice index name.
struct Private {
    local: Statement,
    global: Statement,
    tensor: Tensor,
}

/// Privatizes statement `k` (reducing over one index) into `factor`
/// slices. `retarget`: reads to redirect to local tensors (split-k), and
/// `body`: the right side to use (the inlined one for a target).
#[allow(clippy::too_many_arguments)]
fn privatize(
    program: &Program,
    scop: &Scop,
    k: usize,
    factor: i64,
    body: &Expr,
    retarget: &[(String, String)],
    global_rhs: Option<Expr>,
    f: Reducer,
) -> Result<Private> {
    let st = &program.statements[k];
    let file = &program.source;
    let illegal = |m: String| Error::Statement {
        file: file.clone(),
        position: st.position + 1,
        text: st.text.clone(),
        message: m,
    };
    if st.reduction_indices.len() != 1 {
        return Err(illegal(
            "privatize: the reduction must run over one index".into(),
        ));
    }
    let j = &st.reduction_indices[0];
    let ms = scop
        .statement(&format!("S{k}"))
        .ok_or_else(|| Error::Internal(format!("no model statement S{k}")))?;
    let ranges = rewrite::ranges(scop, ms)?;
    let (lo, hi) = ranges
        .iter()
        .find_map(|w| match w {
            WhereClause::Range { index, lo, hi } if index == j => Some((lo.clone(), hi.clone())),
            _ => None,
        })
        .ok_or_else(|| Error::Internal("no range of the reduction index".into()))?;
    let n = hi.sub(&lo).as_constant().ok_or_else(|| {
        illegal(format!(
            "privatize: the length of the `{j}` loop is not a constant; give the parameters values"
        ))
    })?;
    if n < factor {
        return Err(illegal(format!(
            "privatize: the `{j}` loop has {n} iterations, fewer than the split factor {factor}"
        )));
    }
    let b = (n + factor - 1) / factor;
    let used: BTreeSet<String> = st.all_indices().into_iter().collect();
    let fresh = |base: String| {
        let mut name = base;
        while used.contains(&name) || program.is_param(&name) {
            name.push('_');
        }
        name
    };
    let s = fresh(format!("{j}_s"));
    let u = fresh(format!("{j}_u"));
    let by = lo.add(&Affine::var(&s).scale(b)).add(&Affine::var(&u));
    let mut wl: Vec<WhereClause> = ranges
        .iter()
        .filter(|w| !matches!(w, WhereClause::Range { index, .. } if index == j))
        .cloned()
        .collect();
    wl.push(WhereClause::Range {
        index: s.clone(),
        lo: Affine::constant(0),
        hi: Affine::constant(factor),
    });
    wl.push(WhereClause::Range {
        index: u.clone(),
        lo: Affine::constant(0),
        hi: Affine::constant(b),
    });
    wl.push(WhereClause::Constraint {
        lhs: by.clone(),
        rel: crate::frontend::ast::Rel::Lt,
        rhs: hi.clone(),
    });
    for w in st.wheres.iter().filter(|w| w.is_condition()) {
        wl.push(w.map_affines(&|a| subst_affine(a, j, &by)));
    }
    let x = &st.lhs_tensor;
    let xl = local_name(x);
    if program.tensor(&xl).is_some() {
        return Err(illegal(format!(
            "privatize needs a tensor `{xl}`; the program already has one"
        )));
    }
    let mt = scop
        .tensor(x)
        .ok_or_else(|| Error::Internal(format!("no tensor {x}")))?;
    let mut shape = mt.shape.clone();
    shape.push(Affine::constant(factor));
    let tensor = Tensor {
        name: xl.clone(),
        dtype: if mt.dtype.is_float() {
            mt.dtype.compute()
        } else {
            mt.dtype
        },
        shape: Some(shape),
        role: TensorRole::Temp,
    };
    let mut lhs_l = st.lhs_indices.clone();
    lhs_l.push(s.clone());
    let local_body = subst_expr(program, body, j, &by, retarget, &s);
    let local = reduction(
        st.position,
        &xl,
        &lhs_l,
        std::slice::from_ref(&u),
        f,
        local_body,
        wl,
    );
    let mut wg: Vec<WhereClause> = ranges
        .iter()
        .filter(|w| !matches!(w, WhereClause::Range { index, .. } if index == j))
        .cloned()
        .collect();
    wg.push(WhereClause::Range {
        index: s.clone(),
        lo: Affine::constant(0),
        hi: Affine::constant(factor),
    });
    let grhs = global_rhs.unwrap_or_else(|| access(&xl, &lhs_l, tensor.dtype));
    let grhs = rename_slice(&grhs, &s);
    let global = reduction(
        st.position,
        x,
        &st.lhs_indices,
        std::slice::from_ref(&s),
        f,
        grhs,
        wg,
    );
    Ok(Private {
        local,
        global,
        tensor,
    })
}

/// The global right side is built with the slice index named `@s`; give it
/// its real name.
fn rename_slice(e: &Expr, s: &str) -> Expr {
    super::chain::rename_indices(e, &|n| (n == "@s").then(|| s.to_string()))
}

/// The statements not involved keep their order; those that read what the
/// rewritten statements write come after them.
fn partition(program: &Program, involved: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let first = *involved.iter().min().unwrap_or(&0);
    let last = *involved.iter().max().unwrap_or(&0);
    let mut written: BTreeSet<String> = involved
        .iter()
        .map(|k| program.statements[*k].lhs_tensor.clone())
        .collect();
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for (k, st) in program.statements.iter().enumerate() {
        if involved.contains(&k) {
            continue;
        }
        let mut reads = Vec::new();
        model::collect_reads(&st.rhs, &mut reads);
        let depends = reads.iter().any(|(t, _)| written.contains(t));
        if k < first || (k < last && !depends) {
            before.push(k);
        } else {
            if depends {
                written.insert(st.lhs_tensor.clone());
            }
            after.push(k);
        }
    }
    (before, after)
}

fn assemble(
    program: &Program,
    scop: &Scop,
    before: &[usize],
    middle: Vec<Statement>,
    after: &[usize],
    new_tensors: Vec<Tensor>,
) -> Program {
    let mut statements: Vec<Statement> = before
        .iter()
        .map(|k| program.statements[*k].clone())
        .collect();
    statements.extend(middle);
    statements.extend(after.iter().map(|k| program.statements[*k].clone()));
    let mut tensors = super::rolling::resolved_tensors(program, scop);
    tensors.extend(new_tensors);
    Program {
        name: program.name.clone(),
        source: program.source.clone(),
        params: program.params.clone(),
        tensors,
        statements,
        schedule: None,
        rolling: None,
    }
}

fn reducer_of(st: &Statement) -> Result<Reducer> {
    match st.op {
        AssignOp::Reduce {
            op: AstReducer::Sum,
            ..
        } => Ok(Reducer::Sum),
        AssignOp::Reduce {
            op: AstReducer::Prod,
            ..
        } => Ok(Reducer::Prod),
        AssignOp::Reduce {
            op: AstReducer::Max,
            ..
        } => Ok(Reducer::Max),
        AssignOp::Reduce {
            op: AstReducer::Min,
            ..
        } => Ok(Reducer::Min),
        AssignOp::Assign => Err(Error::Internal("not a reduction".into())),
    }
}

/// The `privatize` step on its own: one reduction into local and global.
pub fn privatize_step(
    program: &Program,
    scop: &Scop,
    tensor: &str,
    factor: i64,
) -> Result<Repaired> {
    let k = program
        .statements
        .iter()
        .position(|s| s.lhs_tensor == tensor && matches!(s.op, AssignOp::Reduce { init: true, .. }))
        .ok_or_else(|| Error::Input {
            file: program.source.clone(),
            message: format!(
                "`schedule`: privatize: no reduction `{tensor}(..) op=! ..` writes `{tensor}`"
            ),
        })?;
    let st = &program.statements[k];
    let p = privatize(
        program,
        scop,
        k,
        factor,
        &st.rhs,
        &[],
        None,
        reducer_of(st)?,
    )?;
    let (before, after) = partition(program, &[k]);
    let mut report = format!("repair: privatize {tensor} into {factor} slices\n");
    let _ = writeln!(report, "  local:  {}", p.local.text);
    let _ = writeln!(report, "  global: {}", p.global.text);
    let out = assemble(
        program,
        scop,
        &before,
        vec![p.local, p.global],
        &after,
        vec![p.tensor],
    );
    Ok(Repaired {
        program: out,
        order: None,
        report,
    })
}

/// Split-k update of `targets` into `factor` slices.
pub fn split_k(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    targets: &[String],
    factor: i64,
    fault: Fault,
) -> Result<Repaired> {
    let chains = super::chains(isl, program, scop, targets, "split-k update", fault)?;
    let mut preds: Vec<usize> = chains
        .iter()
        .flat_map(|(c, _)| c.preds.iter().map(|p| p.stmt))
        .collect();
    preds.sort();
    preds.dedup();
    let mut report = format!(
        "repair: split-k update of {} into {factor} slices\n",
        targets.join(", ")
    );
    report.push_str(&super::describe_chains(program, &chains));
    let mut locals = Vec::new();
    let mut globals = Vec::new();
    let mut tensors = Vec::new();
    let mut retarget = Vec::new();
    for &p in &preds {
        let st = &program.statements[p];
        let pr = privatize(
            program,
            scop,
            p,
            factor,
            &st.rhs,
            &[],
            None,
            reducer_of(st)?,
        )?;
        retarget.push((st.lhs_tensor.clone(), local_name(&st.lhs_tensor)));
        locals.push(pr.local);
        globals.push(pr.global);
        tensors.push(pr.tensor);
    }
    let mut t_locals = Vec::new();
    let mut t_globals = Vec::new();
    for (c, sol) in &chains {
        let grhs = repaired_combination(program, scop, c, sol)?;
        let pr = privatize(
            program,
            scop,
            c.target,
            factor,
            &c.body,
            &retarget,
            Some(grhs),
            c.reducer,
        )?;
        t_locals.push(pr.local);
        t_globals.push(pr.global);
        tensors.push(pr.tensor);
    }
    let mut involved: Vec<usize> = preds.clone();
    involved.extend(chains.iter().map(|(c, _)| c.target));
    // Inlined maps nothing else reads are dropped.
    let inlined: BTreeSet<usize> = chains
        .iter()
        .flat_map(|(c, _)| c.inlined.iter().copied())
        .collect();
    for &m in &inlined {
        let t = &program.statements[m].lhs_tensor;
        let read_elsewhere = program.statements.iter().enumerate().any(|(k, s)| {
            if involved.contains(&k) || inlined.contains(&k) {
                return false;
            }
            let mut reads = Vec::new();
            model::collect_reads(&s.rhs, &mut reads);
            reads.iter().any(|(x, _)| x == t)
        });
        if !read_elsewhere {
            involved.push(m);
        }
    }
    let (before, after) = partition(program, &involved);
    let mut middle = locals;
    middle.extend(globals);
    middle.extend(t_locals);
    middle.extend(t_globals);
    let out = assemble(program, scop, &before, middle, &after, tensors);
    report.push_str("split program (program order):\n");
    for (k, st) in out.statements.iter().enumerate() {
        let _ = writeln!(report, "  {k}: {}", st.text);
    }
    report.push_str(&dataflow_proof(isl, &out, &chains, program)?);
    Ok(Repaired {
        program: out,
        order: None,
        report,
    })
}

/// `guard ? t_local : h(t_local, r_local, r_global)` over the slice index
/// `@s` (renamed by the caller): the global combination of Eq. 8.
fn repaired_combination(program: &Program, scop: &Scop, c: &Chain, sol: &Solution) -> Result<Expr> {
    let dtypes = rewrite::dtypes(scop);
    let st = &program.statements[c.target];
    let t = dtypes[&st.lhs_tensor].compute();
    let mut lhs_l = st.lhs_indices.clone();
    lhs_l.push("@s".into());
    let t_local = access(&local_name(&st.lhs_tensor), &lhs_l, dtypes[&st.lhs_tensor]);
    let pred = |symbol: &str, local: bool| -> Option<Expr> {
        let p = c.preds.iter().find(|p| p.symbol == symbol)?;
        let dt = dtypes[&p.tensor];
        Some(if local {
            let mut subs = p.target_subscripts.clone();
            subs.push("@s".into());
            access(&local_name(&p.tensor), &subs, dt.compute())
        } else {
            access(&p.tensor, &p.target_subscripts, dt)
        })
    };
    rewrite::guarded_repair(
        &sol.h,
        t,
        &t_local,
        c.preds.iter().map(|p| p.symbol.as_str()),
        &pred,
    )
}

/// Checks in isl, on the split program's value-based flow `F` (program
/// order), that each global target instance at slice `s` receives the
/// local predecessor value its local target used, and the final global
/// predecessor value:
///
/// ```text
///   dom F|P_local->T_global = dom F|P_local->T_local     (the same instances)
///   dom F|P_global->T_global = last instance of P_global per outer point
/// ```
fn dataflow_proof(
    isl: &Isl,
    split: &Program,
    chains: &[(Chain, Solution)],
    original: &Program,
) -> Result<String> {
    let scop = model::build(isl, split)?;
    let order = crate::model::order::program_order(isl, &scop)?;
    let d = crate::deps::compute(&scop, &order)?;
    let stmt_of = |tensor: &str| -> Vec<String> {
        split
            .statements
            .iter()
            .enumerate()
            .filter(|(_, s)| s.lhs_tensor == tensor)
            .flat_map(|(k, _)| [format!("S{k}"), format!("S{k}_init")])
            .filter(|n| scop.statement(n).is_some())
            .collect()
    };
    let select = |from: &[String], to: &[String]| -> Result<crate::isl::UnionMap> {
        let mut parts = Vec::new();
        for a in from {
            for b in to {
                let (Some(sa), Some(sb)) = (scop.statement(a), scop.statement(b)) else {
                    continue;
                };
                let ai: Vec<String> = sa.iterators.iter().map(|v| format!("a_{v}")).collect();
                let bi: Vec<String> = sb.iterators.iter().map(|v| format!("b_{v}")).collect();
                parts.push(format!("{a}[{}] -> {b}[{}]", ai.join(", "), bi.join(", ")));
            }
        }
        let pairs = isl.union_map(&format!("{}{{ {} }}", scop.param_prefix, parts.join("; ")))?;
        Ok(d.flow.copy()?.intersect(pairs)?.coalesce()?)
    };
    let file = &split.source;
    let mut out = String::from("split program (dependences in program order):\n");
    for (c, _) in chains {
        let xt = &original.statements[c.target].lhs_tensor;
        let t_local: Vec<String> = stmt_of(&local_name(xt));
        let t_global: Vec<String> = stmt_of(xt)
            .into_iter()
            .filter(|n| !n.ends_with("_init"))
            .collect();
        for p in &c.preds {
            let p_local = stmt_of(&local_name(&p.tensor));
            let p_global = stmt_of(&p.tensor);
            let used_locally = select(&p_local, &t_local)?.domain()?;
            let passed = select(&p_local, &t_global)?.domain()?;
            // A slice without instances passes the predecessor's init and
            // a local target that is the identity e_f, which h keeps
            // (the proven identity goal): only init instances may differ.
            let inits: Vec<String> = p_local
                .iter()
                .filter(|n| n.ends_with("_init"))
                .cloned()
                .collect();
            let mut init_set = crate::isl::UnionSet::empty_ctx(&isl.ctx)?;
            for n in &inits {
                if let Some(st) = scop.statement(n) {
                    init_set =
                        init_set.union(crate::isl::UnionSet::from_set(st.domain.copy()?)?)?;
                }
            }
            let extra = passed.copy()?.subtract(used_locally.copy()?)?;
            if !used_locally.is_subset(&passed)? || !extra.is_subset(&init_set)? {
                return Err(Error::Illegal {
                    file: file.clone(),
                    message: format!(
                        "split-k update: the global combination of {xt} passes h other values of {} than the local reductions used: {} against {}",
                        local_name(&p.tensor),
                        passed.text(),
                        used_locally.text()
                    ),
                });
            }
            let final_global = select(&p_global, &t_global)?.domain()?;
            let gname = p_global
                .iter()
                .find(|n| !n.ends_with("_init"))
                .cloned()
                .unwrap_or_default();
            let g = scop
                .statement(&gname)
                .ok_or_else(|| Error::Internal("no global predecessor".into()))?;
            let n_outer = g.iterators.len() - 1;
            let outer: Vec<String> = g.iterators[..n_outer].to_vec();
            let last = isl
                .union_map(&format!(
                    "{}{{ {gname}[{}] -> [{}] }}",
                    scop.param_prefix,
                    g.iterators.join(", "),
                    outer.join(", ")
                ))?
                .intersect_domain(crate::isl::UnionSet::from_set(g.domain.copy()?)?)?
                .reverse()?
                .lexmax()?
                .range()?;
            if !final_global.is_equal(&last)? {
                return Err(Error::Illegal {
                    file: file.clone(),
                    message: format!(
                        "split-k update: the global combination of {xt} does not read the final {}: it reads {}",
                        p.tensor,
                        final_global.text()
                    ),
                });
            }
            let _ = writeln!(
                out,
                "  proved: {xt}'s combination passes h the {} values its local reduction used ({})\n          and the final {} ({})",
                local_name(&p.tensor),
                passed.text(),
                p.tensor,
                final_global.text()
            );
        }
    }
    Ok(out)
}
