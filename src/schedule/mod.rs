//! Scheduling: the program-order (canonical) schedule, isl's scheduler under
//! TC's strategies, tiling with TC's imperfectly nested variant, and the
//! legality check every final schedule passes before codegen.
//!
//! Legality: a schedule `σ` respects a dependence relation `D` when every
//! pair is ordered, `∀ (a -> b) ∈ D : σ(a) ≺ σ(b)`. The violated part is
//! `D ∩ { a -> b : σ(a) ⪰ σ(b) }`, computed in isl; it must be empty.

pub mod epilogue;
pub mod fuse;
pub mod host;
pub mod siblings;
pub mod sums;

use crate::deps::Dependences;
use crate::error::{Error, Result};
pub use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, IslPrint, Schedule, ScheduleConstraints, ScheduleNode, ScheduleNodeType};
use crate::model::Scop;

/// How the schedule is found (TC's fusion strategies plus isl's default and
/// plain program order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// isl's scheduler with its default options.
    Isl,
    /// Minimal fusion: every strongly connected component of the dependence
    /// graph is scheduled on its own (isl's `serialize_sccs`).
    Min,
    /// Maximal fusion: clusters are merged whenever the dependences allow,
    /// even where the merged band loses parallelism (isl's
    /// `maximize_coincidence` off).
    Max,
    /// Program order, one loop nest per statement, no scheduler.
    Canonical,
}

impl Strategy {
    pub fn parse(s: &str) -> Option<Strategy> {
        Some(match s {
            "isl" => Strategy::Isl,
            "min" => Strategy::Min,
            "max" => Strategy::Max,
            "canonical" => Strategy::Canonical,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Isl => "isl",
            Strategy::Min => "min",
            Strategy::Max => "max",
            Strategy::Canonical => "canonical",
        }
    }
}

/// The program-order schedule (`model::order`), under the name the
/// strategies know it by.
pub use crate::model::order::program_order as canonical;

/// Largest constant term isl's scheduler may put in a schedule dimension.
pub const MAX_CONSTANT_SHIFT: i32 = 256;

/// A schedule from isl's scheduler under `strategy`, with all dependences as
/// validity, proximity and coincidence constraints.
pub fn compute(isl: &Isl, scop: &Scop, deps: &Dependences, strategy: Strategy) -> Result<Schedule> {
    if strategy == Strategy::Canonical {
        let s = canonical(isl, scop)?;
        return annotate_bands(isl, s, deps, &scop.param_prefix);
    }
    match constraints(isl, scop, deps, strategy)?.compute_schedule() {
        Ok(s) => Ok(s),
        // isl's scheduler gives up on some programs ("unable to carry
        // dependences": a reduction over two indices bounded by a third,
        // `Y(i) +=! X(j, k) where k <= i` with `i` longer than `k`, under
        // the bounded constant shifts). The program order is always a
        // legal schedule: it is used instead, its bands annotated.
        Err(e) if e.to_string().contains("unable to carry dependences") => {
            let s = canonical(isl, scop)?;
            annotate_bands(isl, s, deps, &scop.param_prefix)
        }
        Err(e) => Err(e.into()),
    }
}

/// isl's options for `strategy` set on the context, and the schedule
/// constraints: every dependence as validity, proximity and coincidence.
fn constraints(
    isl: &Isl,
    scop: &Scop,
    deps: &Dependences,
    strategy: Strategy,
) -> Result<ScheduleConstraints> {
    set_options(isl, strategy)?;
    constraints_on(scop.domain()?, scop.context.copy()?, deps.all()?)
}

/// isl's scheduler options for `strategy`, set on the context.
fn set_options(isl: &Isl, strategy: Strategy) -> Result<()> {
    use crate::isl::Options;
    let ctx = &isl.ctx;
    // Max fusion keeps isl's incremental clustering (scheduling whole
    // components at once can take minutes on a chain of two gemms) but
    // stops preferring parallelism over fusion when merging clusters.
    let (serialize, maximize_coincidence) = match strategy {
        Strategy::Min => (1, 1),
        Strategy::Max => (0, 0),
        _ => (0, 1),
    };
    Options::set_schedule_serialize_sccs(ctx, serialize)?;
    Options::set_schedule_whole_component(ctx, 0)?;
    Options::set_schedule_maximize_coincidence(ctx, maximize_coincidence)?;
    Options::set_schedule_outer_coincidence(ctx, 1)?;
    // Constant shifts are bounded. Parameters with values are pinned in the
    // context, so unbounded shifts can take the sizes' magnitude (layernorm
    // at D = 4096 had its row sum shifted by 4095, unlike at small D), and
    // the integer programs with such constants took 25 s instead of 3 s on
    // attention at S = 4096.
    Options::set_schedule_max_constant_term(ctx, MAX_CONSTANT_SHIFT)?;
    Ok(())
}

/// The schedule constraints of `domain` under `context`: every pair of
/// `all` as validity, proximity and coincidence.
fn constraints_on(
    domain: crate::isl::UnionSet,
    context: crate::isl::Set,
    all: crate::isl::UnionMap,
) -> Result<ScheduleConstraints> {
    Ok(ScheduleConstraints::on_domain(domain)?
        .set_context(context)?
        .set_validity(all.copy()?)?
        .set_proximity(all.copy()?)?
        .set_coincidence(all)?)
}

/// isl's schedule of `domain` (a part of `scop`'s instances, possibly
/// over more parameters) under the dependences `all` between them, with
/// `strategy`'s options (not `Canonical`, which needs no scheduler);
/// `None` where isl's scheduler gives up ("unable to carry dependences").
pub fn compute_on(
    isl: &Isl,
    scop: &Scop,
    domain: crate::isl::UnionSet,
    all: crate::isl::UnionMap,
    strategy: Strategy,
) -> Result<Option<Schedule>> {
    set_options(isl, strategy)?;
    let sc = constraints_on(domain, scop.context.copy()?, all)?;
    match sc.compute_schedule() {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.to_string().contains("unable to carry dependences") => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Marks each band of `schedule` permutable and its members coincident
/// where the dependences allow: restricted to pairs with equal outer
/// schedule, all distances of the band are `>= 0` (permutable) and a
/// member's distances are all `0` (coincident).
pub fn annotate_bands(
    isl: &Isl,
    schedule: Schedule,
    deps: &Dependences,
    param_prefix: &str,
) -> Result<Schedule> {
    mark_bands(isl, schedule, deps, param_prefix, false)
}

/// [`annotate_bands`], but each flag set to exactly what the dependences
/// allow: a flag they do not allow is cleared. For a schedule computed on
/// another program of the same shape (a proxy at smaller sizes), whose
/// flags hold for that program's dependences, not necessarily for these.
pub fn reannotate_bands(
    isl: &Isl,
    schedule: Schedule,
    deps: &Dependences,
    param_prefix: &str,
) -> Result<Schedule> {
    mark_bands(isl, schedule, deps, param_prefix, true)
}

fn mark_bands(
    isl: &Isl,
    schedule: Schedule,
    deps: &Dependences,
    param_prefix: &str,
    exact: bool,
) -> Result<Schedule> {
    let all = deps.all()?;
    let root = schedule.get_root()?;
    let root = walk(root, &mut |node| {
        if node.get_type()? != ScheduleNodeType::Band {
            return Ok(node);
        }
        let prefix = node.get_prefix_schedule_union_map()?;
        let same_outer = prefix.copy()?.apply_range(prefix.reverse()?)?;
        let partial = node.band_get_partial_schedule_union_map()?;
        let inner = all.copy()?.intersect(same_outer)?;
        let inner = inner
            .intersect_domain(partial.copy()?.domain()?)?
            .intersect_range(partial.copy()?.domain()?)?;
        let n = node.band_n_member()?;
        let mut node = node;
        if inner.is_empty()? {
            node = node.band_set_permutable(1)?;
            for i in 0..n {
                node = node.band_member_set_coincident(i, 1)?;
            }
            return Ok(node);
        }
        let dist = inner
            .apply_domain(partial.copy()?)?
            .apply_range(partial)?
            .deltas()?;
        let space = (0..n)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let check = |cond: &str| -> Result<bool> {
            let s = isl.union_set(&format!("{param_prefix}{{ [{space}] : {cond} }}"))?;
            Ok(dist.is_subset(&s)?)
        };
        let nonneg: Vec<String> = (0..n).map(|i| format!("d{i} >= 0")).collect();
        if check(&nonneg.join(" and "))? {
            node = node.band_set_permutable(1)?;
        } else if exact {
            node = node.band_set_permutable(0)?;
        }
        for i in 0..n {
            if check(&format!("d{i} = 0"))? {
                node = node.band_member_set_coincident(i, 1)?;
            } else if exact {
                node = node.band_member_set_coincident(i, 0)?;
            }
        }
        Ok(node)
    })?;
    Ok(root.get_schedule()?)
}

/// Applies `f` to every node, pre-order, and returns the root.
fn walk(
    node: ScheduleNode,
    f: &mut dyn FnMut(ScheduleNode) -> Result<ScheduleNode>,
) -> Result<ScheduleNode> {
    let mut node = f(node)?;
    let n = node.n_children()?;
    for i in 0..n {
        node = walk(node.child(i)?, f)?.parent()?;
    }
    Ok(node)
}

/// Tiles every permutable band (and every single-member band, for which
/// strip-mining is always legal) with `sizes` (the last size repeats for
/// extra members). The tile band gets a `tile` mark, the point band a
/// `point` mark.
pub fn tile(isl: &Isl, schedule: Schedule, sizes: &[i64]) -> Result<Schedule> {
    if sizes.is_empty() {
        return Ok(schedule);
    }
    fn rec(isl: &Isl, node: ScheduleNode, sizes: &[i64]) -> Result<ScheduleNode> {
        let mut node = node;
        if node.get_type()? == ScheduleNodeType::Band {
            let n = node.band_n_member()?;
            if node.band_get_permutable()? || n == 1 {
                let mut mv = crate::isl::MultiVal::zero(node.band_get_space()?)?;
                for i in 0..n {
                    let s = sizes[(i as usize).min(sizes.len() - 1)];
                    mv = mv.set_val(i, crate::isl::Val::int_from_si(&isl.ctx, s)?)?;
                }
                node = node.band_tile(mv)?;
                node = node.insert_mark(crate::isl::Id::read_from_str(&isl.ctx, "tile")?)?;
                // mark -> tile band -> point band
                node = node.child(0)?.child(0)?;
                node = node.insert_mark(crate::isl::Id::read_from_str(&isl.ctx, "point")?)?;
                node = node.child(0)?;
                // recurse below the point band
                let k = node.n_children()?;
                for i in 0..k {
                    node = rec(isl, node.child(i)?, sizes)?.parent()?;
                }
                // back to the tile mark
                return Ok(node.parent()?.parent()?.parent()?);
            }
        }
        let k = node.n_children()?;
        for i in 0..k {
            node = rec(isl, node.child(i)?, sizes)?.parent()?;
        }
        Ok(node)
    }
    let root = rec(isl, schedule.get_root()?, sizes)?;
    Ok(root.get_schedule()?)
}

/// TC's imperfectly nested tiling: a point band of parallel (coincident)
/// members whose child is a sequence (or set) in which some branch is tiled
/// again is pushed into every branch,
/// below the inner tile and point bands (`T1 P1 seq[A; T2 P2]` becomes
/// `T1 seq[P1 A; T2 P2 P1]`), so every tile loop sits outside every point
/// loop. Only coincident members move: their dependence distance is zero
/// within the band, so moving them inward cannot reverse a dependence.
/// Legality is still checked afterwards like any other schedule.
pub fn sink_point_bands(isl: &Isl, tree: Tree) -> Result<Tree> {
    Ok(match tree {
        Tree::Mark(m, inner) if m == "point" => match *inner {
            Tree::Band(p, child) => match *child {
                Tree::Sequence(ch) | Tree::Set(ch)
                    if p.coincident.iter().all(|c| *c) && ch.iter().any(|(_, c)| is_tiled(c)) =>
                {
                    let mut out = Vec::new();
                    for (filter, c) in ch {
                        let restricted = restrict_band(isl, &p, &filter)?;
                        let point = |rest: Tree| {
                            Tree::Mark(
                                "point".into(),
                                Box::new(Tree::Band(restricted.clone(), Box::new(rest))),
                            )
                        };
                        let sub = match c {
                            Tree::Mark(t, tb) if t == "tile" && is_tiled_band(&tb) => {
                                let Tree::Band(tband, pm) = *tb else {
                                    unreachable!()
                                };
                                let Tree::Mark(_, pb) = *pm else {
                                    unreachable!()
                                };
                                let Tree::Band(pband, rest) = *pb else {
                                    unreachable!()
                                };
                                let rest = sink_point_bands(isl, *rest)?;
                                Tree::Mark(
                                    "tile".into(),
                                    Box::new(Tree::Band(
                                        tband,
                                        Box::new(Tree::Mark(
                                            "point".into(),
                                            Box::new(Tree::Band(pband, Box::new(point(rest)))),
                                        )),
                                    )),
                                )
                            }
                            other => point(sink_point_bands(isl, other)?),
                        };
                        out.push((filter, sub));
                    }
                    Tree::Sequence(out)
                }
                other => Tree::Mark(
                    m,
                    Box::new(Tree::Band(p, Box::new(sink_point_bands(isl, other)?))),
                ),
            },
            other => Tree::Mark(m, Box::new(sink_point_bands(isl, other)?)),
        },
        Tree::Mark(m, c) => Tree::Mark(m, Box::new(sink_point_bands(isl, *c)?)),
        Tree::Band(b, c) => Tree::Band(b, Box::new(sink_point_bands(isl, *c)?)),
        Tree::Sequence(ch) => Tree::Sequence(
            ch.into_iter()
                .map(|(f, c)| Ok((f, sink_point_bands(isl, c)?)))
                .collect::<Result<_>>()?,
        ),
        Tree::Set(ch) => Tree::Set(
            ch.into_iter()
                .map(|(f, c)| Ok((f, sink_point_bands(isl, c)?)))
                .collect::<Result<_>>()?,
        ),
        Tree::Leaf => Tree::Leaf,
    })
}

/// `mark tile -> band -> mark point -> band`.
fn is_tiled_band(t: &Tree) -> bool {
    match t {
        Tree::Band(_, c) => {
            matches!(&**c, Tree::Mark(p, pb) if p == "point" && matches!(&**pb, Tree::Band(..)))
        }
        _ => false,
    }
}

fn is_tiled(t: &Tree) -> bool {
    matches!(t, Tree::Mark(m, b) if m == "tile" && is_tiled_band(b))
}

fn restrict_band(isl: &Isl, band: &Band, filter: &str) -> Result<Band> {
    let mupa = crate::isl::MultiUnionPwAff::read_from_str(&isl.ctx, &band.schedule)?;
    let f = isl.union_set(filter)?;
    Ok(Band {
        schedule: mupa.intersect_domain(f)?.text(),
        permutable: band.permutable,
        coincident: band.coincident.clone(),
    })
}

/// Checks `schedule` against every dependence; the error names the kind of
/// dependence and the instance pairs it would reverse.
pub fn check_legal(file: &str, schedule: &Schedule, scop: &Scop, deps: &Dependences) -> Result<()> {
    if is_legal(schedule, scop, deps)? {
        return Ok(());
    }
    // Only a violation computes the instance pairs, for the message.
    let sigma = schedule.get_map()?.intersect_domain(scop.domain()?)?;
    let not_before = sigma.copy()?.lex_ge_union_map(sigma)?;
    for (kind, d) in [
        ("flow", &deps.flow),
        ("anti", &deps.anti),
        ("output", &deps.output),
    ] {
        let violated = d.copy()?.intersect(not_before.copy()?)?;
        if !violated.is_empty()? {
            return Err(Error::Illegal {
                file: file.to_string(),
                message: format!(
                    "illegal schedule: it reverses the {kind} dependence {}",
                    violated.coalesce()?.text()
                ),
            });
        }
    }
    Err(Error::Internal(
        "a schedule the fast test refuses reverses no dependence".into(),
    ))
}

/// Whether `schedule` respects every dependence: [`check_legal`] without
/// its message, for a candidate that may be dropped (a proxy's schedule),
/// whose reversed instance pairs would cost more to print than to find.
///
/// Fast test: the dependences mapped into schedule time, `{ σ(a) -> σ(b)
/// : (a -> b) ∈ D }`, meet `⪰` nowhere. Where every statement's schedule
/// has the same space this is one map; otherwise the instance pairs that
/// run in the wrong order are computed.
pub fn is_legal(schedule: &Schedule, scop: &Scop, deps: &Dependences) -> Result<bool> {
    let sigma = schedule.get_map()?.intersect_domain(scop.domain()?)?;
    for d in [&deps.flow, &deps.anti, &deps.output] {
        let times = d
            .copy()?
            .apply_domain(sigma.copy()?)?
            .apply_range(sigma.copy()?)?;
        if times.is_empty()? {
            continue;
        }
        if times.isa_map()? {
            let m = times.as_map()?;
            let ge = crate::isl::Map::lex_ge(m.get_space()?.domain()?)?;
            if !m.intersect(ge)?.is_empty()? {
                return Ok(false);
            }
            continue;
        }
        let not_before = sigma.copy()?.lex_ge_union_map(sigma.copy()?)?;
        if !d.copy()?.intersect(not_before)?.is_empty()? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Root node type helper used by tests.
pub fn root_child_type(s: &Schedule) -> Result<ScheduleNodeType> {
    let r = s.get_root()?;
    if r.n_children()? == 0 {
        return Ok(ScheduleNodeType::Leaf);
    }
    Ok(r.child(0)?.get_type()?)
}
