//! Rolling update (Neptune's Algorithm 1): the targets and their reduce
//! predecessors are fused under the rolling loop `j`, each predecessor
//! caches its previous value, and each target is repaired:
//!
//! ```text
//!   for outer o:                       (the predecessors' left indices)
//!     X_r(o) = e_fr ;  X_t(o, ..) = e_f
//!     for j:                           (the rolling loop)
//!       Xp_r(o) = X_r(o)                               cache: X_r^<prev(j)>
//!       X_r(o)  = X_r(o) fr body_r(o, j)               X_r^<j>
//!       X_t(o, ..) = h(X_t, Xp_r, X_r) f g(X_r, C)     (Eq. 7)
//! ```
//!
//! `h` is applied behind the guard `Xp_r == X_r ? X_t : h(..)`, which the
//! proven fixed point `h(t, r, r) = t` justifies; it keeps `-inf - -inf`
//! out of the arithmetic. The repaired program's meaning is this fused
//! order, not body order: [`Layout`] describes it and [`order_tree`] turns
//! it into the schedule that defines the repaired program's dependences.
//!
//! The same construction without the cache and with `X_t = X_t f g(..)`
//! is the naive fusion, whose violated dependences the proof inspects.

use std::collections::{BTreeSet, HashMap};

use super::algebra::Reducer;
use super::chain::Chain;
use super::rewrite::{self, access, assignment, combine, identity};
use super::solve::{Fault, Solution};
use crate::error::{Error, Result};
use crate::frontend::ast::{
    AssignOp, DType, Expr, Program, Reducer as AstReducer, RollingPred, RollingStates,
    RollingTarget, Statement, Tensor, TensorRole, WhereClause,
};
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::IslPrint;
use crate::model::{self, ModelStmt, Scop};

/// A statement of a fused group and its coordinates: `outer` are the
/// statement's iterators that are the group's outer loops (in group order),
/// `rolling` the one that is the rolling loop (none for an init), `inner`
/// the rest, in iterator order.
#[derive(Debug, Clone)]
pub struct Member {
    pub stmt: usize,
    pub outer: Vec<String>,
    pub rolling: Option<String>,
    pub inner: Vec<String>,
}

/// One top-level part of the fused order.
#[derive(Debug, Clone)]
pub enum Item {
    /// A statement as in program order (its init, then its update).
    Plain(usize),
    /// A fused group: the inits, then the rolling loop.
    Group(Vec<Member>),
}

/// What the rewrite made, and the roles of its statements for the proofs.
#[derive(Debug, Clone)]
pub struct Rewritten {
    pub program: Program,
    pub layout: Vec<Item>,
    /// For each new statement, the original statement it comes from and
    /// its rank among those (program order of the naive fusion).
    pub origin: Vec<(usize, usize)>,
    /// New statement indices: predecessors' inits and updates.
    pub pred_stmts: Vec<usize>,
    /// New statement indices of the targets' updates, with the chain each
    /// repairs.
    pub target_updates: Vec<(usize, usize)>,
    /// New statement index of each cache, with the predecessor's (inits,
    /// update) and its cache tensor.
    pub caches: Vec<Cache>,
}

#[derive(Debug, Clone)]
pub struct Cache {
    pub stmt: usize,
    pub pred_init: usize,
    pub pred_update: usize,
    pub tensor: String,
    pub pred_tensor: String,
}

/// The cache tensor of predecessor tensor `x`.
pub fn cache_name(x: &str) -> String {
    format!("{x}_prev")
}

fn ast_reducer(op: AstReducer) -> Reducer {
    match op {
        AstReducer::Sum => Reducer::Sum,
        AstReducer::Prod => Reducer::Prod,
        AstReducer::Max => Reducer::Max,
        AstReducer::Min => Reducer::Min,
    }
}

/// The program's tensors, every shape resolved as the model inferred it and
/// in the model's order, so that the temps a rewrite adds come after them.
pub fn resolved_tensors(program: &Program, scop: &Scop) -> Vec<Tensor> {
    scop.tensors
        .iter()
        .map(|t| Tensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: Some(t.shape.clone()),
            role: program.tensor(&t.name).map(|d| d.role).unwrap_or(t.role),
        })
        .collect()
}

/// The predecessors of a group of `chains`, in program order: every
/// statement some chain's target reads as a predecessor, once.
fn group_preds(chains: &[(Chain, Solution)]) -> Vec<usize> {
    let mut preds: Vec<usize> = Vec::new();
    for (c, _) in chains {
        for p in &c.preds {
            if !preds.contains(&p.stmt) {
                preds.push(p.stmt);
            }
        }
    }
    preds.sort();
    preds
}

/// The conditions of `st`'s `where` clauses; with `only_lhs`, those that
/// do not name a reduction index (they hold for its initialisation too).
fn conditions(st: &Statement, only_lhs: bool) -> Vec<WhereClause> {
    st.wheres
        .iter()
        .filter(|w| {
            w.is_condition()
                && (!only_lhs
                    || w.names()
                        .iter()
                        .all(|n| !st.reduction_indices.iter().any(|r| r == n)))
        })
        .cloned()
        .collect()
}

/// The fused group of a rolling update: the program with the targets'
/// inlined maps substituted into their other readers too
/// ([`inline_into_readers`]), the chains, and the group's coordinates.
struct Group<'a> {
    program: &'a Program,
    scop: &'a Scop,
    chains: &'a [(Chain, Solution)],
    dtypes: HashMap<String, DType>,
    /// Predecessors and targets (program positions), and the maps the
    /// targets' bodies took in.
    preds: Vec<usize>,
    targets: Vec<usize>,
    inlined: BTreeSet<usize>,
    /// Per target: its variable of each outer coordinate of the group.
    target_outer: Vec<Vec<String>>,
}

/// The statements the rewrite makes, in the order it makes them.
#[derive(Default)]
struct Fused {
    statements: Vec<Statement>,
    origin: Vec<(usize, usize)>,
    members_init: Vec<Member>,
    members_roll: Vec<Member>,
    pred_stmts: Vec<usize>,
    target_updates: Vec<(usize, usize)>,
    caches: Vec<Cache>,
    new_tensors: Vec<Tensor>,
    states: RollingStates,
}

impl Fused {
    /// Appends `st`, made from statement `source` as its `rank`-th
    /// (program order of the naive fusion); returns its index.
    fn push(&mut self, st: Statement, source: usize, rank: usize) -> usize {
        self.statements.push(st);
        self.origin.push((source, rank));
        self.statements.len() - 1
    }
}

impl Group<'_> {
    fn file(&self) -> &String {
        &self.program.source
    }

    fn dtype(&self, t: &str) -> Result<DType> {
        self.dtypes
            .get(t)
            .copied()
            .ok_or_else(|| Error::Internal(format!("no tensor {t}")))
    }

    fn model_stmt(&self, name: String) -> Result<&ModelStmt> {
        self.scop
            .statement(&name)
            .ok_or_else(|| Error::Internal(format!("no model statement {name}")))
    }

    /// Checks that every predecessor has the first one's outer loops (as
    /// many left indices): the group runs them under one set of loops.
    fn check_outer_loops(&self) -> Result<()> {
        let first_pred = &self.program.statements[self.preds[0]];
        let n_outer = first_pred.lhs_indices.len();
        for &p in &self.preds {
            let ps = &self.program.statements[p];
            if ps.lhs_indices.len() != n_outer {
                return Err(Error::Illegal {
                    file: self.file().clone(),
                    message: format!(
                        "rolling update: predecessors `{}` and `{}` have different outer loops",
                        first_pred.text, ps.text
                    ),
                });
            }
        }
        Ok(())
    }

    /// Per target, its variable of each outer coordinate of the group:
    /// the subscripts at which it reads the group's first predecessor.
    /// Every target must read that predecessor, and read each of its
    /// predecessors with the same variables.
    fn outer_of_targets(&self) -> Result<Vec<Vec<String>>> {
        let (program, preds) = (self.program, &self.preds);
        let first_pred = &program.statements[preds[0]];
        let mut target_outer: Vec<Vec<String>> = Vec::new();
        for (c, _) in self.chains {
            let p0 = c
                .preds
                .iter()
                .find(|p| p.stmt == preds[0])
                .or(c.preds.first())
                .ok_or_else(|| Error::Internal("chain without predecessor".into()))?;
            // Map the chain's first predecessor to the group's first one.
            if p0.stmt != preds[0] {
                return Err(Error::Illegal {
                    file: self.file().clone(),
                    message: format!(
                        "rolling update: the targets do not share their first predecessor `{}`",
                        first_pred.text
                    ),
                });
            }
            target_outer.push(p0.target_subscripts.clone());
            for p in &c.preds {
                let set_a: BTreeSet<&String> = p.target_subscripts.iter().collect();
                let set_b: BTreeSet<&String> = p0.target_subscripts.iter().collect();
                if set_a != set_b {
                    return Err(Error::Illegal {
                        file: self.file().clone(),
                        message: format!(
                            "rolling update: `{}` reads its predecessors with different indices",
                            program.statements[c.target].text
                        ),
                    });
                }
            }
        }
        Ok(target_outer)
    }

    /// Outer coordinate k of predecessor p: the left index of p at the
    /// position where the first target reads p with the variable that is
    /// coordinate k.
    fn pred_outer(&self, p: usize) -> Result<Vec<String>> {
        let ps = &self.program.statements[p];
        if p == self.preds[0] {
            return Ok(ps.lhs_indices.clone());
        }
        let (c, _) = &self.chains[0];
        let pr = c
            .preds
            .iter()
            .find(|x| x.stmt == p)
            .ok_or_else(|| Error::Illegal {
                file: self.file().clone(),
                message: "rolling update: every target of one group must read every predecessor"
                    .into(),
            })?;
        self.target_outer[0]
            .iter()
            .map(|v| {
                let at = pr
                    .target_subscripts
                    .iter()
                    .position(|x| x == v)
                    .ok_or_else(|| Error::Internal("predecessor coordinate".into()))?;
                Ok(ps.lhs_indices[at].clone())
            })
            .collect()
    }

    /// The cache tensor of predecessor tensor `xr`, a new temp of its
    /// type and shape; an error where the program already has a tensor of
    /// that name.
    fn new_cache(&self, fused: &mut Fused, xr: &str) -> Result<String> {
        let cache = cache_name(xr);
        if self.program.tensor(&cache).is_some() {
            return Err(Error::Illegal {
                file: self.file().clone(),
                message: format!(
                    "rolling update needs a tensor `{cache}`; the program already has one"
                ),
            });
        }
        let shape = self
            .scop
            .tensor(xr)
            .ok_or_else(|| Error::Internal(format!("no tensor {xr}")))?
            .shape
            .clone();
        fused.new_tensors.push(Tensor {
            name: cache.clone(),
            dtype: self.dtype(xr)?,
            shape: Some(shape),
            role: TensorRole::Temp,
        });
        Ok(cache)
    }

    /// Predecessor `p`'s statements: its initialisation to the reducer's
    /// identity, before the rolling loop; in the loop its cache `Xp = X`
    /// (a new temp, the value before step `j`) and its update `X = X fr
    /// body`.
    fn push_pred(&self, fused: &mut Fused, p: usize) -> Result<()> {
        let (program, scop) = (self.program, self.scop);
        let ps = &program.statements[p];
        let AssignOp::Reduce { op, .. } = ps.op else {
            return Err(Error::Internal("predecessor is not a reduction".into()));
        };
        let f = ast_reducer(op);
        let xr = &ps.lhs_tensor;
        let t = self.dtype(xr)?.compute();
        let outer = self.pred_outer(p)?;
        let jp = ps.reduction_indices[0].clone();
        // init
        let mut w = rewrite::ranges(scop, self.model_stmt(format!("S{p}_init"))?)?;
        w.extend(conditions(ps, true));
        let init = assignment(ps.position, xr, &ps.lhs_indices, &[], identity(f, t), w);
        let k_init = fused.push(init, p, 0);
        fused.pred_stmts.push(k_init);
        fused.members_init.push(Member {
            stmt: k_init,
            outer: outer.clone(),
            rolling: None,
            inner: vec![],
        });
        let mut w = rewrite::ranges(scop, self.model_stmt(format!("S{p}"))?)?;
        w.extend(conditions(ps, false));
        // cache
        let cache = self.new_cache(fused, xr)?;
        let cached = assignment(
            ps.position,
            &cache,
            &ps.lhs_indices,
            &ps.reduction_indices,
            access(xr, &ps.lhs_indices, self.dtype(xr)?),
            w.clone(),
        );
        let k_cache = fused.push(cached, p, 1);
        fused.members_roll.push(Member {
            stmt: k_cache,
            outer: outer.clone(),
            rolling: Some(jp.clone()),
            inner: vec![],
        });
        // update
        let rhs = combine(
            f,
            access(xr, &ps.lhs_indices, self.dtype(xr)?),
            ps.rhs.clone(),
            t,
        );
        let update = assignment(
            ps.position,
            xr,
            &ps.lhs_indices,
            &ps.reduction_indices,
            rhs,
            w,
        );
        let k_upd = fused.push(update, p, 2);
        fused.pred_stmts.push(k_upd);
        fused.members_roll.push(Member {
            stmt: k_upd,
            outer,
            rolling: Some(jp),
            inner: vec![],
        });
        fused.states.preds.push(RollingPred {
            tensor: xr.clone(),
            reducer: op,
            cache: cache.clone(),
        });
        fused.caches.push(Cache {
            stmt: k_cache,
            pred_init: k_init,
            pred_update: k_upd,
            tensor: cache,
            pred_tensor: xr.clone(),
        });
        Ok(())
    }

    /// The value target `c` carries into step `j` (`xt_read`, its read
    /// of itself), repaired: `h(X_t, Xp, X)` (the proven `sol.h`, its
    /// previous predecessor values read from the caches) behind the guard
    /// `Xp == X ? X_t : h(..)`, which the fixed point `h(t, r, r) = t`
    /// justifies and which keeps `-inf - -inf` out of the arithmetic.
    fn repaired_carry(
        &self,
        c: &Chain,
        sol: &Solution,
        xt_read: &Expr,
        t: DType,
        fault: Fault,
    ) -> Result<Expr> {
        let pred_read = |symbol: &str, previous: bool| -> Option<Expr> {
            let p = c.preds.iter().find(|p| p.symbol == symbol)?;
            let tensor = if previous && fault != Fault::OmitCache {
                cache_name(&p.tensor)
            } else {
                p.tensor.clone()
            };
            Some(access(
                &tensor,
                &p.target_subscripts,
                self.dtypes[&p.tensor],
            ))
        };
        rewrite::guarded_repair(
            &sol.h,
            t,
            xt_read,
            c.preds.iter().map(|p| p.symbol.as_str()),
            &pred_read,
        )
    }

    /// Chain `ci`'s target statements: its initialisation to the
    /// reducer's identity, before the rolling loop, and in the loop its
    /// update `X_t = carried f g(..)` (Eq. 7), the carried value repaired
    /// ([`Self::repaired_carry`]) or, in the naive fusion, `X_t` itself.
    fn push_target(
        &self,
        fused: &mut Fused,
        ci: usize,
        repaired: bool,
        fault: Fault,
    ) -> Result<()> {
        let (c, sol) = &self.chains[ci];
        let outer = &self.target_outer[ci];
        let ts = &self.program.statements[c.target];
        let xt = &ts.lhs_tensor;
        let t = self.dtype(xt)?.compute();
        let inner_init: Vec<String> = ts
            .lhs_indices
            .iter()
            .filter(|v| !outer.contains(v))
            .cloned()
            .collect();
        let mut w = rewrite::ranges(self.scop, self.model_stmt(format!("S{}_init", c.target))?)?;
        w.extend(conditions(ts, true));
        let init = assignment(
            ts.position,
            xt,
            &ts.lhs_indices,
            &[],
            identity(c.reducer, t),
            w,
        );
        let k_init = fused.push(init, c.target, 0);
        fused.members_init.push(Member {
            stmt: k_init,
            outer: outer.clone(),
            rolling: None,
            inner: inner_init.clone(),
        });
        let mut w = rewrite::ranges(self.scop, self.model_stmt(format!("S{}", c.target))?)?;
        w.extend(conditions(ts, false));
        let xt_read = access(xt, &ts.lhs_indices, self.dtype(xt)?);
        let carried = if repaired {
            self.repaired_carry(c, sol, &xt_read, t, fault)?
        } else {
            xt_read.clone()
        };
        if let AssignOp::Reduce { op, .. } = ts.op {
            fused.states.targets.push(RollingTarget {
                tensor: xt.clone(),
                reducer: op,
                repair: carried.clone(),
            });
        }
        let rhs = combine(c.reducer, carried, c.body.clone(), t);
        let update = assignment(
            ts.position,
            xt,
            &ts.lhs_indices,
            &ts.reduction_indices,
            rhs,
            w,
        );
        let k_upd = fused.push(update, c.target, 1);
        fused.target_updates.push((k_upd, ci));
        fused.members_roll.push(Member {
            stmt: k_upd,
            outer: outer.clone(),
            rolling: Some(c.rolling.clone()),
            inner: inner_init,
        });
        Ok(())
    }

    /// The other statements, in program order, as those before the group
    /// and those after it: an inlined map whose result nothing else reads
    /// is dropped; a statement before the first predecessor, or before the
    /// last target and reading nothing the group writes, stays before; the
    /// rest (those that read what the group writes, directly or through
    /// each other) go after.
    fn others_around(&self) -> (Vec<usize>, Vec<usize>) {
        let (program, preds, targets) = (self.program, &self.preds, &self.targets);
        let first = preds[0];
        let last = *targets.iter().max().unwrap_or(&first);
        let in_group = |k: usize| preds.contains(&k) || targets.contains(&k);
        let mut written: BTreeSet<String> = (0..program.statements.len())
            .filter(|&k| in_group(k))
            .map(|k| program.statements[k].lhs_tensor.clone())
            .collect();
        let mut before = Vec::new();
        let mut after = Vec::new();
        for (k, st) in program.statements.iter().enumerate() {
            if in_group(k) {
                continue;
            }
            if self.inlined.contains(&k)
                && !read_elsewhere(program, &st.lhs_tensor, targets, &self.inlined)
            {
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

    /// The rewritten program: the statements before the group as they
    /// were, the group (inits, then the rolling loop), the statements after
    /// it; the tensors as the model resolved them, then the caches.
    fn finish(&self, mut fused: Fused, repaired: bool) -> Rewritten {
        let (before, after) = self.others_around();
        let mut group: Vec<Member> = std::mem::take(&mut fused.members_init);
        group.extend(std::mem::take(&mut fused.members_roll));
        let mut layout = Vec::new();
        for k in before {
            let plain = fused.push(self.program.statements[k].clone(), k, 0);
            layout.push(Item::Plain(plain));
        }
        layout.push(Item::Group(group));
        for k in after {
            let plain = fused.push(self.program.statements[k].clone(), k, 0);
            layout.push(Item::Plain(plain));
        }
        let mut tensors = resolved_tensors(self.program, self.scop);
        tensors.extend(fused.new_tensors);
        let program = self.program;
        let out = Program {
            name: program.name.clone(),
            source: program.source.clone(),
            params: program.params.clone(),
            tensors,
            statements: fused.statements,
            schedule: None,
            rolling: repaired.then_some(fused.states),
        };
        Rewritten {
            program: out,
            layout,
            origin: fused.origin,
            pred_stmts: fused.pred_stmts,
            target_updates: fused.target_updates,
            caches: fused.caches,
        }
    }
}

/// Rolling update of the `chains` (targets sharing their predecessors)
/// with their proven repairs. `repaired = false` builds the naive fusion.
/// The steps: the group's predecessors ([`group_preds`]) and its outer
/// coordinates ([`Group::check_outer_loops`], [`Group::outer_of_targets`]),
/// each predecessor's statements ([`Group::push_pred`]), each target's
/// ([`Group::push_target`]), then the other statements around the group
/// ([`Group::finish`]).
pub fn rewrite(
    program: &Program,
    scop: &Scop,
    chains: &[(Chain, Solution)],
    repaired: bool,
    fault: Fault,
) -> Result<Rewritten> {
    let dtypes = rewrite::dtypes(scop);
    let preds = group_preds(chains);
    let targets: Vec<usize> = chains.iter().map(|(c, _)| c.target).collect();
    let inlined: BTreeSet<usize> = chains
        .iter()
        .flat_map(|(c, _)| c.inlined.iter().copied())
        .collect();
    // Maps the targets inline and other statements read too go into those
    // readers as well, so that nothing reads them after the group.
    let inlined_program = inline_into_readers(program, &targets, &inlined);
    let mut group = Group {
        program: &inlined_program,
        scop,
        chains,
        dtypes,
        preds,
        targets,
        inlined,
        target_outer: Vec::new(),
    };
    group.check_outer_loops()?;
    group.target_outer = group.outer_of_targets()?;
    let mut fused = Fused::default();
    for &p in &group.preds {
        group.push_pred(&mut fused, p)?;
    }
    for ci in 0..chains.len() {
        group.push_target(&mut fused, ci, repaired, fault)?;
    }
    Ok(group.finish(fused, repaired))
}

/// `program` with each inlined map (`inlined`, maps the targets' bodies
/// took in) also substituted into the other statements that read it, where
/// that is exact: the map is a plain assignment without `where` clauses
/// into an f32 or f64 temp (no rounding to a narrower type is skipped),
/// whose right side reads only inputs and tensors whose writers all come
/// before it (their values are final when it runs, so also when a later
/// reader runs), and every such reader reads it at plain, distinct index
/// variables (`Y(r, c) = E(r, c) / S(r)` becomes `Y(r, c) = exp(X(r, c) -
/// M(r)) / S(r)`). Then nothing reads the map's tensor after the group and
/// the map is dropped with the others (a rolling group computes its
/// predecessors' final values only at its end, so a map of them between
/// the group and its readers would be a second pass over each row).
fn inline_into_readers(program: &Program, targets: &[usize], inlined: &BTreeSet<usize>) -> Program {
    let mut out = program.clone();
    for &k in inlined {
        let map = &program.statements[k];
        let temp = program.tensor(&map.lhs_tensor).is_some_and(|t| {
            t.role == TensorRole::Temp && matches!(t.dtype, DType::F32 | DType::F64)
        });
        if map.op != AssignOp::Assign || !map.wheres.is_empty() || !temp {
            continue;
        }
        let mut reads = Vec::new();
        model::collect_reads(&map.rhs, &mut reads);
        let settled = reads.iter().all(|(t, _)| {
            program
                .statements
                .iter()
                .enumerate()
                .all(|(w, st)| st.lhs_tensor != *t || w < k)
        });
        if !settled {
            continue;
        }
        // The readers, each reading the map's tensor at plain variables.
        let readers: Vec<usize> = (0..program.statements.len())
            .filter(|r| !targets.contains(r) && !inlined.contains(r))
            .filter(|&r| {
                let mut rs = Vec::new();
                model::collect_reads(&out.statements[r].rhs, &mut rs);
                rs.iter().any(|(t, _)| *t == map.lhs_tensor)
            })
            .collect();
        let plain = |st: &Statement| {
            let mut rs = Vec::new();
            model::collect_reads(&st.rhs, &mut rs);
            rs.iter()
                .filter(|(t, _)| *t == map.lhs_tensor)
                .all(|(_, subs)| match super::chain::plain_vars(subs) {
                    Some(vars) => {
                        let distinct: BTreeSet<&String> = vars.iter().collect();
                        vars.len() == map.lhs_indices.len() && distinct.len() == vars.len()
                    }
                    None => false,
                })
        };
        if readers
            .iter()
            .any(|&r| out.statements[r].lhs_tensor == map.lhs_tensor || !plain(&out.statements[r]))
        {
            continue;
        }
        for r in readers {
            let st = &mut out.statements[r];
            st.rhs = substitute_map(&st.rhs, map);
            st.text = rewrite::statement_text(st);
        }
    }
    out
}

/// `e` with every read of `map`'s tensor (at plain variables) replaced by
/// `map`'s right side, its left indices renamed to those variables.
fn substitute_map(e: &Expr, map: &Statement) -> Expr {
    super::chain::map_accesses(
        e,
        &mut |read, tensor, subscripts| match super::chain::plain_vars(subscripts) {
            Some(vars) if tensor == map.lhs_tensor => {
                super::chain::rename_indices(&map.rhs, &|n| {
                    map.lhs_indices
                        .iter()
                        .position(|i| i == n)
                        .map(|p| vars[p].clone())
                })
            }
            _ => read.clone(),
        },
    )
}

/// Whether a statement other than the targets and the inlined maps reads
/// `tensor`.
fn read_elsewhere(
    program: &Program,
    tensor: &str,
    targets: &[usize],
    inlined: &BTreeSet<usize>,
) -> bool {
    program.statements.iter().enumerate().any(|(k, st)| {
        if targets.contains(&k) || inlined.contains(&k) {
            return false;
        }
        let mut reads = Vec::new();
        model::collect_reads(&st.rhs, &mut reads);
        reads.iter().any(|(t, _)| t == tensor)
    })
}

/// isl names and iterators of the model statements of new statement `k`.
fn model_names(scop: &Scop, k: usize) -> Vec<(String, Vec<String>)> {
    scop.statements
        .iter()
        .filter(|s| s.source == k)
        .map(|s| (s.name.clone(), s.iterators.clone()))
        .collect()
}

fn band(prefix: &str, members: &[Vec<(String, Vec<String>, String)>]) -> Band {
    let parts: Vec<String> = members
        .iter()
        .map(|m| {
            let maps: Vec<String> = m
                .iter()
                .map(|(name, iters, e)| format!("{name}[{}] -> [({e})]", iters.join(", ")))
                .collect();
            format!("{{ {} }}", maps.join("; "))
        })
        .collect();
    Band {
        schedule: format!("{prefix}[{}]", parts.join(", ")),
        permutable: false,
        coincident: vec![false; members.len()],
    }
}

fn filter(prefix: &str, stmts: &[(String, Vec<String>)]) -> String {
    let parts: Vec<String> = stmts
        .iter()
        .map(|(n, it)| format!("{n}[{}]", it.join(", ")))
        .collect();
    format!("{prefix}{{ {} }}", parts.join("; "))
}

/// A band over `vars` of one statement (leaf when empty).
fn own_band(prefix: &str, name: &str, iters: &[String], vars: &[String]) -> Tree {
    if vars.is_empty() {
        return Tree::Leaf;
    }
    let members: Vec<Vec<(String, Vec<String>, String)>> = vars
        .iter()
        .map(|v| vec![(name.to_string(), iters.to_vec(), v.clone())])
        .collect();
    Tree::Band(band(prefix, &members), Box::new(Tree::Leaf))
}

/// The fused order of `layout` over the model `scop` of the rewritten
/// program: the schedule that defines its meaning.
pub fn order_tree(scop: &Scop, layout: &[Item]) -> Result<ScheduleTree> {
    let pre = &scop.param_prefix;
    let mut top = Vec::new();
    for item in layout {
        match item {
            Item::Plain(k) => {
                for (name, iters) in model_names(scop, *k) {
                    let t = own_band(pre, &name, &iters, &iters);
                    top.push((filter(pre, &[(name, iters)]), t));
                }
            }
            Item::Group(members) => {
                let named: Vec<(&Member, String, Vec<String>)> = members
                    .iter()
                    .flat_map(|m| {
                        model_names(scop, m.stmt)
                            .into_iter()
                            .map(move |(n, it)| (m, n, it))
                    })
                    .collect();
                let all: Vec<(String, Vec<String>)> = named
                    .iter()
                    .map(|(_, n, it)| (n.clone(), it.clone()))
                    .collect();
                let mut seq = Vec::new();
                for (m, n, it) in named.iter().filter(|(m, ..)| m.rolling.is_none()) {
                    seq.push((
                        filter(pre, &[(n.clone(), it.clone())]),
                        own_band(pre, n, it, &m.inner),
                    ));
                }
                let rolling: Vec<&(&Member, String, Vec<String>)> =
                    named.iter().filter(|(m, ..)| m.rolling.is_some()).collect();
                let roll_band = band(
                    pre,
                    &[rolling
                        .iter()
                        .map(|(m, n, it)| {
                            (n.clone(), it.clone(), m.rolling.clone().unwrap_or_default())
                        })
                        .collect()],
                );
                let inner_seq: Vec<(String, Tree)> = rolling
                    .iter()
                    .map(|(m, n, it)| {
                        (
                            filter(pre, &[(n.clone(), it.clone())]),
                            own_band(pre, n, it, &m.inner),
                        )
                    })
                    .collect();
                let roll_filter: Vec<(String, Vec<String>)> = rolling
                    .iter()
                    .map(|(_, n, it)| (n.clone(), it.clone()))
                    .collect();
                seq.push((
                    filter(pre, &roll_filter),
                    Tree::Band(roll_band, Box::new(Tree::Sequence(inner_seq))),
                ));
                let n_outer = members.first().map(|m| m.outer.len()).unwrap_or(0);
                let body = Tree::Sequence(seq);
                let tree = if n_outer == 0 {
                    body
                } else {
                    let outer: Vec<Vec<(String, Vec<String>, String)>> = (0..n_outer)
                        .map(|d| {
                            named
                                .iter()
                                .map(|(m, n, it)| (n.clone(), it.clone(), m.outer[d].clone()))
                                .collect()
                        })
                        .collect();
                    Tree::Band(band(pre, &outer), Box::new(body))
                };
                top.push((filter(pre, &all), tree));
            }
        }
    }
    Ok(ScheduleTree {
        domain: scop.domain()?.text(),
        root: Tree::Sequence(top),
    })
}

/// The program order of the naive fusion: every new statement where its
/// original statement was, one loop nest each.
pub fn original_order_tree(scop: &Scop, origin: &[(usize, usize)]) -> Result<ScheduleTree> {
    let pre = &scop.param_prefix;
    let mut ks: Vec<usize> = (0..origin.len()).collect();
    ks.sort_by_key(|&k| origin[k]);
    let mut top = Vec::new();
    for k in ks {
        for (name, iters) in model_names(scop, k) {
            let t = own_band(pre, &name, &iters, &iters);
            top.push((filter(pre, &[(name, iters)]), t));
        }
    }
    Ok(ScheduleTree {
        domain: scop.domain()?.text(),
        root: Tree::Sequence(top),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::ast::{BinOp, ExprKind};
    use crate::isl::Isl;

    /// A row softmax whose sum `S` is rolled over its row maximum `M`
    /// (`E`, the map `S` reads, is read by `Y` too); `extra_temps` adds
    /// temps (JSON members).
    fn softmax(extra_temps: &str) -> Program {
        let json = format!(
            r#"{{"name": "softmax", "params": {{"R": 8, "C": 32}},
                "inputs": {{"X": {{"dtype": "f32", "shape": ["R", "C"]}}}},
                "outputs": {{"Y": {{"dtype": "f32", "shape": ["R", "C"]}}}},
                "temps": {{"M": {{"dtype": "f32", "shape": ["R"]}},
                          "E": {{"dtype": "f32", "shape": ["R", "C"]}},
                          "S": {{"dtype": "f32", "shape": ["R"]}} {extra_temps}}},
                "body": ["M(i) max=! X(i, j)",
                         "E(i, j) = exp(X(i, j) - M(i))",
                         "S(i) +=! E(i, j)",
                         "Y(i, j) = E(i, j) / S(i)"]}}"#
        );
        crate::frontend::load_str(&json, "unit test").unwrap()
    }

    /// The rolling update of `S` in `program`, repaired or naive.
    fn rolled(program: &Program, repaired: bool) -> Result<Rewritten> {
        let isl = Isl::new();
        let scop = model::build(&isl, program).unwrap();
        let targets = ["S".to_string()];
        let chains = super::super::chains(
            &isl,
            program,
            &scop,
            &targets,
            "rolling update",
            Fault::None,
        )
        .unwrap();
        rewrite(program, &scop, &chains, repaired, Fault::None)
    }

    fn writes(p: &Program, k: usize) -> &str {
        &p.statements[k].lhs_tensor
    }

    #[test]
    fn the_group_caches_its_predecessor_and_repairs_its_target() {
        let rw = rolled(&softmax(""), true).unwrap();
        let p = &rw.program;
        // One cache, of M, written in the rolling loop.
        let [cache] = rw.caches.as_slice() else {
            panic!("one cache: {:?}", rw.caches);
        };
        assert_eq!(
            (cache.tensor.as_str(), cache.pred_tensor.as_str()),
            ("M_prev", "M")
        );
        assert_eq!(writes(p, cache.stmt), "M_prev");
        assert_eq!(writes(p, cache.pred_init), "M");
        assert_eq!(writes(p, cache.pred_update), "M");
        assert!(p
            .tensor("M_prev")
            .is_some_and(|t| t.role == TensorRole::Temp));
        // The group (inits, then cache, predecessor and target in the
        // loop), then Y; E went into its readers.
        let [Item::Group(group), Item::Plain(y)] = rw.layout.as_slice() else {
            panic!("a group then Y: {:?}", rw.layout);
        };
        let written: Vec<&str> = group.iter().map(|m| writes(p, m.stmt)).collect();
        assert_eq!(written, ["M", "S", "M_prev", "M", "S"]);
        assert!(group[..2].iter().all(|m| m.rolling.is_none()));
        assert!(group[2..].iter().all(|m| m.rolling.as_deref() == Some("j")));
        assert_eq!(writes(p, *y), "Y");
        assert!(p.statements.iter().all(|s| s.lhs_tensor != "E"));
        // The target's update carries its repaired value behind the guard
        // `M_prev == M ? S : h(..)`, which the rolling states record.
        let [(update, 0)] = rw.target_updates.as_slice() else {
            panic!("one target update: {:?}", rw.target_updates);
        };
        let ExprKind::Binary(BinOp::Add, carried, _) = &p.statements[*update].rhs.kind else {
            panic!("S = carried + term: {:?}", p.statements[*update].rhs);
        };
        assert!(matches!(carried.kind, ExprKind::Select(..)));
        let states = p.rolling.as_ref().expect("rolling states");
        assert_eq!(states.preds[0].cache, "M_prev");
        assert_eq!(states.targets[0].repair, **carried);
        assert_eq!(rw.origin.len(), p.statements.len());
    }

    #[test]
    fn the_naive_fusion_carries_the_target_unrepaired() {
        let rw = rolled(&softmax(""), false).unwrap();
        let p = &rw.program;
        assert!(p.rolling.is_none());
        let (update, _) = rw.target_updates[0];
        let ExprKind::Binary(BinOp::Add, carried, _) = &p.statements[update].rhs.kind else {
            panic!("S = S + term: {:?}", p.statements[update].rhs);
        };
        assert!(matches!(&carried.kind, ExprKind::Access { tensor, .. } if tensor == "S"));
    }

    #[test]
    fn a_cache_name_the_program_already_has_is_refused() {
        let taken = r#", "M_prev": {"dtype": "f32", "shape": ["R"]}"#;
        let err = rolled(&softmax(taken), true).unwrap_err();
        assert!(err.to_string().contains("needs a tensor `M_prev`"), "{err}");
    }
}
