//! Host-stepped recurrences: the loops of loop blocks that carry a
//! dependence run on the host, and each step's statements run as ordinary,
//! fully parallel kernels.
//!
//! A loop block `{"for": "t in lo:hi", ...}` whose iterations depend on
//! each other (`H(t - 1, k)`) cannot run its `t` loop inside one kernel
//! across blocks (blocks never wait for each other): without host steps the
//! mapping sends it to one block of one thread. Here the schedule becomes
//!
//! ```text
//! sequence
//!   filter: statements before the block     (scheduled as usual)
//!   filter: the block's statements
//!     mark: host_loop_steps
//!       band [t]                            (sequential, on the host)
//!         <the body at one value of t>      (scheduled as usual)
//!   filter: statements after the block
//! ```
//!
//! The gpu stage splits kernels below the host band (each child of the
//! body's sequence is a kernel, as at the top), and codegen prints the
//! band as a host loop around their launches, its iterator passed to
//! every kernel as an argument (`gpu::KernelArg::Step`).
//!
//! The body at one step is scheduled by the strategy on the domain with
//! the host dimensions fixed to fresh parameters `pf_step_j`
//! (`h_j(S) = pf_step_j`), under the dependences inside one step (both
//! ends in that domain, so `h(a) = h(b)`): isl sees no `t` dimension and
//! schedules the step's own loops. The parameters are removed from the
//! result again (a schedule that mentions them is not used).
//!
//! Two transformations give a launch more than one step's work:
//! * **Wavefront.** Two nested blocks `l` (outer) and `t` (inner) whose
//!   dependences have distances `(Δl, Δt)` such as `(1, 0)` and `(0, 1)`
//!   are skewed to `w = f l + t`: the host runs `w`, and a launch runs
//!   every cell `(l, w - f l)` of the diagonal, `l` a parallel dimension
//!   of its kernels. Legal and parallel when every dependence between the
//!   nest's instances is carried by `w` or stays in one cell:
//!   `f Δl + Δt ≥ 1 ∨ (Δl, Δt) = (0, 0)` (checked in isl on the distance
//!   set). The smallest factor `f` from 1 to [`MAX_SKEW`] that passes is
//!   taken (1 for a stacked network; 2 where a layer reads the layer
//!   below one step ahead, distance `(1, -1)`); where none does, the
//!   wavefront is refused with the distances that forbid it, and the nest
//!   is stepped over `l` and `t`.
//! * **Chains.** A block whose carried distances are all at least `d ≥ 2`
//!   (`H(t - d, k)`, a dilated recurrence) has `d` independent chains:
//!   the host runs `s = ⌊(t - lo) / d⌋`, and a launch runs the `d` values
//!   `t = lo + d s + r`, `0 ≤ r < d`, in parallel. Legal because a
//!   dependence `t -> t'` with `t' - t ≥ d` has `s' > s`, and one with
//!   `t' = t` stays in the step. A block with no carried dependence at
//!   all gets no host loop: its index is an ordinary parallel dimension.
//!
//! Whatever was built, the pipeline checks the whole tree against every
//! dependence (`check_legal`) before it is mapped.

use super::Strategy;
use crate::deps::Dependences;
use crate::error::{Error, Result};
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{val_to_i64, Isl, IslPrint, Schedule, Set, UnionMap, UnionSet};
use crate::model::{ModelStmt, Scop};

/// The prefix of every host loop's mark.
pub const MARK_PREFIX: &str = "host_loop_";

/// The largest skew factor a wavefront tries (`w = f l + t`): each step
/// of `f` adds `f - 1` diagonals per layer.
pub const MAX_SKEW: i64 = 4;

/// The prefix of the parameters that stand for the host dimensions while
/// a step's body is scheduled.
const STEP_PARAM: &str = "pf_step_";

/// What one host loop runs per iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HostStep {
    /// One value of the block's index.
    Steps,
    /// One diagonal `w = f l + t` of two nested blocks (the factor `f`).
    Wavefront(i64),
    /// `d` consecutive values of the block's index (`d` chains).
    Chains(i64),
}

impl HostStep {
    /// The mark above the host loop's band in the mapped tree.
    pub fn mark(self) -> String {
        match self {
            HostStep::Steps => format!("{MARK_PREFIX}steps"),
            HostStep::Wavefront(1) => format!("{MARK_PREFIX}wavefront"),
            HostStep::Wavefront(f) => format!("{MARK_PREFIX}wavefront_{f}"),
            HostStep::Chains(d) => format!("{MARK_PREFIX}chains_{d}"),
        }
    }

    /// The step a mark names, if it is a host loop's.
    pub fn from_mark(name: &str) -> Option<HostStep> {
        match name.strip_prefix(MARK_PREFIX)? {
            "steps" => Some(HostStep::Steps),
            "wavefront" => Some(HostStep::Wavefront(1)),
            rest => match rest.strip_prefix("wavefront_") {
                Some(f) => f.parse().ok().map(HostStep::Wavefront),
                None => rest
                    .strip_prefix("chains_")?
                    .parse()
                    .ok()
                    .map(HostStep::Chains),
            },
        }
    }
}

/// A host-stepped schedule.
pub struct Stepped {
    /// Legal by construction and checked by the caller; bands annotated.
    pub schedule: Schedule,
    /// Why a wavefront was not taken, one line each.
    pub refused: Vec<String>,
}

/// The host-stepped schedule of `scop` under `strategy`, with wavefronts
/// and chains where `skew` allows them; `None` for a program without loop
/// blocks.
pub fn stepped(
    isl: &Isl,
    scop: &Scop,
    deps: &Dependences,
    strategy: Strategy,
    skew: bool,
) -> Result<Option<Stepped>> {
    if scop.statements.iter().all(|s| s.blocks.is_empty()) {
        return Ok(None);
    }
    let mut b = Builder {
        isl,
        scop,
        all: deps.all()?,
        strategy,
        skew,
        refused: Vec::new(),
    };
    let stmts: Vec<&ModelStmt> = scop
        .statements
        .iter()
        .filter(|s| !s.domain.is_empty().unwrap_or(false))
        .collect();
    let root = b.level(&stmts, 0, &[])?;
    let tree = ScheduleTree {
        domain: scop.domain()?.text(),
        root,
    };
    let schedule = isl.schedule(&tree.to_isl_text())?;
    let schedule = super::annotate_bands(isl, schedule, deps, &scop.param_prefix)?;
    Ok(Some(Stepped {
        schedule,
        refused: b.refused,
    }))
}

/// One dimension of the host loops, as a statement's value of it.
#[derive(Clone)]
enum HostDim {
    /// The iterator at this position (a block's index).
    Index(usize),
    /// `f l + t` of the iterators at two positions.
    Skew { outer: usize, inner: usize, f: i64 },
    /// `⌊(i - lo) / d⌋` of the iterator at `pos`.
    Chain { pos: usize, lo: String, d: i64 },
}

impl HostDim {
    /// The dimension's value for `s`, isl text over its iterators.
    fn of(&self, s: &ModelStmt) -> String {
        let it = |k: usize| s.iterators[k].clone();
        match self {
            HostDim::Index(k) => it(*k),
            HostDim::Skew { outer, inner, f } => format!("{f}*{} + {}", it(*outer), it(*inner)),
            HostDim::Chain { pos, lo, d } => format!("floor(({} - ({lo}))/{d})", it(*pos)),
        }
    }
}

struct Builder<'a> {
    isl: &'a Isl,
    scop: &'a Scop,
    all: UnionMap,
    strategy: Strategy,
    skew: bool,
    refused: Vec<String>,
}

fn tuple(s: &ModelStmt) -> String {
    format!("{}[{}]", s.name, s.iterators.join(", "))
}

impl Builder<'_> {
    /// The tree of `stmts`, which share their first `depth` blocks, whose
    /// host dimensions `fixed` are set by the loops above: a sequence of
    /// the runs of statements outside deeper blocks and of the blocks.
    fn level(&mut self, stmts: &[&ModelStmt], depth: usize, fixed: &[HostDim]) -> Result<Tree> {
        let mut children = Vec::new();
        let mut k = 0;
        while k < stmts.len() {
            let run = match stmts[k].blocks.get(depth) {
                Some(block) => stmts[k..]
                    .iter()
                    .take_while(|t| t.blocks.get(depth).is_some_and(|b| b.id == block.id))
                    .count(),
                None => stmts[k..]
                    .iter()
                    .take_while(|t| t.blocks.len() == depth)
                    .count(),
            };
            let group = &stmts[k..k + run];
            let child = if stmts[k].blocks.len() > depth {
                self.block(group, depth, fixed)?
            } else {
                self.run(group, depth, fixed, &[])?
            };
            children.push((self.filter(group), child));
            k += run;
        }
        Ok(Tree::Sequence(children))
    }

    fn filter(&self, group: &[&ModelStmt]) -> String {
        let tuples: Vec<String> = group.iter().map(|s| tuple(s)).collect();
        format!("{}{{ {} }}", self.scop.param_prefix, tuples.join("; "))
    }

    /// A band over the host dimension `dim` of `group`, under its mark.
    fn host_band(
        &mut self,
        group: &[&ModelStmt],
        dim: &HostDim,
        step: HostStep,
        child: Tree,
    ) -> Tree {
        let member: Vec<String> = group
            .iter()
            .map(|s| format!("{} -> [({})]", tuple(s), dim.of(s)))
            .collect();
        Tree::Mark(
            step.mark(),
            Box::new(Tree::Band(
                Band {
                    schedule: format!("{}[{{ {} }}]", self.scop.param_prefix, member.join("; ")),
                    permutable: false,
                    coincident: vec![false],
                },
                Box::new(child),
            )),
        )
    }

    /// The tree of a block at `depth` (its statements `group`): a
    /// wavefront, chains, one parallel dimension, or one step per value.
    fn block(&mut self, group: &[&ModelStmt], depth: usize, fixed: &[HostDim]) -> Result<Tree> {
        let plain_at = |n: usize| group.iter().all(|s| s.blocks.len() == n);
        let inner_id = group[0].blocks.get(depth + 1).map(|b| b.id);
        let nest = plain_at(depth + 2)
            && group
                .iter()
                .all(|s| s.blocks.get(depth + 1).map(|b| b.id) == inner_id);
        if self.skew && nest {
            match self.wavefront_factor(group, depth)? {
                Ok(f) => {
                    let dim = HostDim::Skew {
                        outer: depth,
                        inner: depth + 1,
                        f,
                    };
                    let mut fixed = fixed.to_vec();
                    fixed.push(dim.clone());
                    // The pinned `w` leaves `l` free: the cells of one
                    // diagonal.
                    let body = self.run(group, depth + 2, &fixed, &[depth])?;
                    return Ok(self.host_band(group, &dim, HostStep::Wavefront(f), body));
                }
                Err(why) => self.refused.push(why),
            }
        }
        if self.skew && plain_at(depth + 1) {
            match self.min_carried_distance(group, depth)? {
                // No carried dependence: the index is a parallel dimension.
                None => return self.run(group, depth + 1, fixed, &[depth]),
                Some(d) if d >= 2 => {
                    let dim = HostDim::Chain {
                        pos: depth,
                        lo: group[0].blocks[depth].lo.to_string(),
                        d,
                    };
                    let mut inner = fixed.to_vec();
                    inner.push(dim.clone());
                    let body = self.run(group, depth + 1, &inner, &[depth])?;
                    return Ok(self.host_band(group, &dim, HostStep::Chains(d), body));
                }
                Some(_) => {}
            }
        }
        let dim = HostDim::Index(depth);
        let mut inner = fixed.to_vec();
        inner.push(dim.clone());
        let body = self.level(group, depth + 1, &inner)?;
        Ok(self.host_band(group, &dim, HostStep::Steps, body))
    }

    /// The distances over the iterators at `dims` of the dependences
    /// between instances of `group`.
    fn distances(&self, group: &[&ModelStmt], dims: &[usize]) -> Result<UnionSet> {
        let p = &self.scop.param_prefix;
        let to: Vec<String> = group
            .iter()
            .map(|s| {
                let v: Vec<&str> = dims.iter().map(|d| s.iterators[*d].as_str()).collect();
                format!("{} -> [{}]", tuple(s), v.join(", "))
            })
            .collect();
        let h = self.isl.union_map(&format!("{p}{{ {} }}", to.join("; ")))?;
        let mut domain = UnionSet::empty(self.scop.context.get_space()?)?;
        for s in group {
            domain = domain.union(UnionSet::from_set(s.domain.copy()?)?)?;
        }
        Ok(self
            .all
            .copy()?
            .intersect_domain(domain.copy()?)?
            .intersect_range(domain)?
            .apply_domain(h.copy()?)?
            .apply_range(h)?
            .deltas()?)
    }

    /// The smallest factor `f ≤ MAX_SKEW` by which the nest at `depth`,
    /// `depth + 1` may be skewed to `w = f l + t` (see the module comment),
    /// or why none may.
    fn wavefront_factor(
        &self,
        group: &[&ModelStmt],
        depth: usize,
    ) -> Result<std::result::Result<i64, String>> {
        let dist = self.distances(group, &[depth, depth + 1])?;
        let mut bad = None;
        for f in 1..=MAX_SKEW {
            let forbidden = self
                .isl
                .union_set(&format!("{{ [a, b] : {f}a + b <= 0 }}"))?
                .subtract(self.isl.union_set("{ [0, 0] }")?)?;
            let b = dist.copy()?.intersect(forbidden)?;
            if b.is_empty()? {
                return Ok(Ok(f));
            }
            bad = Some(b);
        }
        let bad = bad.map(|b| b.coalesce().map(|b| b.text())).transpose()?;
        let s = &group[0];
        let (l, t) = (&s.iterators[depth], &s.iterators[depth + 1]);
        Ok(Err(format!(
            "no wavefront over ({l}, {t}): for every skew f*{l} + {t} with 1 <= f <= {MAX_SKEW}, the dependences of distance {} are neither carried by it nor inside one cell",
            bad.unwrap_or_default()
        )))
    }

    /// The smallest distance of a dependence carried by the block at
    /// `depth`, `None` where it carries none (the smallest over all sizes
    /// where they are symbolic).
    fn min_carried_distance(&self, group: &[&ModelStmt], depth: usize) -> Result<Option<i64>> {
        let dist = self.distances(group, &[depth])?;
        let carried = dist.intersect(self.isl.union_set("{ [a] : a > 0 }")?)?;
        if carried.is_empty()? {
            return Ok(None);
        }
        let min = Set::from_union_set(carried)?.dim_min_val(0)?;
        Ok(Some(val_to_i64(&min).unwrap_or(1)))
    }

    /// The tree of one run of statements outside deeper blocks, at one
    /// value of the host dimensions `fixed`, with the iterators at `free`
    /// (below `depth`, not fixed by a host loop) leading their loops.
    fn run(
        &mut self,
        group: &[&ModelStmt],
        depth: usize,
        fixed: &[HostDim],
        free: &[usize],
    ) -> Result<Tree> {
        if self.strategy != Strategy::Canonical {
            if let Some(t) = self.scheduled(group, fixed)? {
                return Ok(t);
            }
        }
        Ok(self.in_order(group, depth, free))
    }

    /// Program order inside a step: a sequence of the statements, each
    /// under one band over its iterators `free` and from `depth` on.
    fn in_order(&self, group: &[&ModelStmt], depth: usize, free: &[usize]) -> Tree {
        let p = &self.scop.param_prefix;
        let children = group
            .iter()
            .map(|s| {
                let own: Vec<&String> = free
                    .iter()
                    .map(|k| &s.iterators[*k])
                    .chain(s.iterators[depth..].iter())
                    .collect();
                let child = if own.is_empty() {
                    Tree::Leaf
                } else {
                    let members: Vec<String> = own
                        .iter()
                        .map(|i| format!("{{ {} -> [({i})] }}", tuple(s)))
                        .collect();
                    Tree::Band(
                        Band {
                            schedule: format!("{p}[{}]", members.join(", ")),
                            permutable: false,
                            coincident: vec![false; own.len()],
                        },
                        Box::new(Tree::Leaf),
                    )
                };
                (format!("{p}{{ {} }}", tuple(s)), child)
            })
            .collect();
        Tree::Sequence(children)
    }

    /// isl's schedule of `group` at one value of the host dimensions,
    /// without the step parameters; `None` where isl gives up or its
    /// schedule mentions them.
    fn scheduled(&self, group: &[&ModelStmt], fixed: &[HostDim]) -> Result<Option<Tree>> {
        let params = self.params_with_steps(fixed.len());
        let mut domain: Option<UnionSet> = None;
        for s in group {
            let pins: Vec<String> = fixed
                .iter()
                .enumerate()
                .map(|(j, d)| format!("{} = {STEP_PARAM}{j}", d.of(s)))
                .collect();
            let pinned = if pins.is_empty() {
                s.domain.copy()?
            } else {
                self.isl
                    .set(&format!(
                        "{params}{{ {} : {} }}",
                        tuple(s),
                        pins.join(" and ")
                    ))?
                    .intersect(s.domain.copy()?)?
            };
            let d = UnionSet::from_set(pinned)?;
            domain = Some(match domain {
                None => d,
                Some(u) => u.union(d)?,
            });
        }
        let domain = domain.ok_or_else(|| Error::Internal("a run without statements".into()))?;
        let inside = self
            .all
            .copy()?
            .intersect_domain(domain.copy()?)?
            .intersect_range(domain.copy()?)?;
        let Some(s) = super::compute_on(self.isl, self.scop, domain, inside, self.strategy)? else {
            return Ok(None);
        };
        let tree = ScheduleTree::from_isl(&s.get_root()?)?;
        Ok(strip_steps(tree.root))
    }

    /// `[P, pf_step_0, ...] -> `: the program's parameters and `n` steps.
    fn params_with_steps(&self, n: usize) -> String {
        let mut names: Vec<String> = self
            .scop
            .param_prefix
            .trim()
            .trim_end_matches("->")
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        names.extend((0..n).map(|j| format!("{STEP_PARAM}{j}")));
        if names.is_empty() {
            String::new()
        } else {
            format!("[{}] -> ", names.join(", "))
        }
    }
}

/// `tree` with the step parameters taken out of every band's and filter's
/// parameter list; `None` where one is used by more than the list.
fn strip_steps(tree: Tree) -> Option<Tree> {
    Some(match tree {
        Tree::Leaf => Tree::Leaf,
        Tree::Band(b, c) => Tree::Band(
            Band {
                schedule: strip_text(&b.schedule)?,
                ..b
            },
            Box::new(strip_steps(*c)?),
        ),
        Tree::Mark(m, c) => Tree::Mark(m, Box::new(strip_steps(*c)?)),
        Tree::Sequence(ch) => Tree::Sequence(strip_children(ch)?),
        Tree::Set(ch) => Tree::Set(strip_children(ch)?),
    })
}

fn strip_children(ch: Vec<(String, Tree)>) -> Option<Vec<(String, Tree)>> {
    ch.into_iter()
        .map(|(f, t)| Some((strip_text(&f)?, strip_steps(t)?)))
        .collect()
}

/// isl text `[P, pf_step_0] -> rest` as `[P] -> rest`; `None` where `rest`
/// mentions a step parameter.
fn strip_text(text: &str) -> Option<String> {
    let (params, rest) = match text.strip_prefix('[').and_then(|t| t.split_once("] -> ")) {
        Some((params, rest)) => (params, rest),
        None => ("", text),
    };
    if rest.contains(STEP_PARAM) {
        return None;
    }
    let kept: Vec<&str> = params
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.starts_with(STEP_PARAM))
        .collect();
    Some(if kept.is_empty() {
        rest.to_string()
    } else {
        format!("[{}] -> {rest}", kept.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_parameters_leave_the_text() {
        assert_eq!(
            strip_text("[T, N, pf_step_0] -> [{ S1[t, i] -> [(i)] }]").as_deref(),
            Some("[T, N] -> [{ S1[t, i] -> [(i)] }]")
        );
        assert_eq!(
            strip_text("[pf_step_0] -> { S1[t] }").as_deref(),
            Some("{ S1[t] }")
        );
        assert_eq!(
            strip_text("[N, pf_step_0] -> { S1[t] : t = pf_step_0 }"),
            None
        );
    }

    #[test]
    fn marks_name_their_step() {
        for s in [
            HostStep::Steps,
            HostStep::Wavefront(1),
            HostStep::Wavefront(2),
            HostStep::Chains(4),
        ] {
            assert_eq!(HostStep::from_mark(&s.mark()), Some(s));
        }
        assert_eq!(HostStep::from_mark("kernel_0"), None);
    }
}
