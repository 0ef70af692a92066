//! Fusing a producer's loop into its consumer's where the consumer reads,
//! at each iteration, what the producer wrote at the same iteration.
//!
//! isl's scheduler, even under maximal fusion, can leave two sibling loops
//! over the same index apart. A rolling update of attention is the case
//! that matters: the scores `T(i, j) = (Q K^T)(i, j) / sqrt(d)` come out of
//! one loop over `j`, and the rolling loop over `j` (max, sum, `P V`) reads
//! them in a second one, so every score of a row goes through memory
//! (4 GB at S = 4096) where one register would do.
//!
//! The rewrite, on sibling children `A`, `B` (in that order) of a sequence
//! whose subtrees are bands `σ_A`, `σ_B` of `n` members each:
//!
//! ```text
//!   sequence [A: band σ_A { a }, B: band σ_B { b }]
//!     =>  band σ_A ∪ σ_B { sequence [A: a, B: b] }
//! ```
//!
//! Let `D` be the dependences (flow, anti, output) from `A`'s instances to
//! `B`'s that share the schedule prefix above the sequence (others are
//! ordered by the loops above and keep their order). Before, every such
//! pair ran `A` first. After, a pair runs in order of `σ`, then `A` before
//! `B`. So the rewrite is legal iff `∀ (a -> b) ∈ D : σ_A(a) ≤ σ_B(b)`,
//! i.e. `D ∩ { a -> b : σ(a) ≻ σ(b) } = ∅`. Pairs inside `A` or inside `B`
//! keep their order: the fused band restricted to `A` is `σ_A`.
//!
//! It is done only where it pays: `A` produces for `B` (some flow
//! dependence in `D`), and every flow dependence in `D` is *aligned*,
//! `σ_A(a) = σ_B(b)`: iteration `t` of `B` reads only what iteration `t` of
//! `A` wrote, so the value can live in a register between them. A band
//! member stays coincident (permutable) when it was in both bands and every
//! dependence in `D` is aligned.
//!
//! A set before `B` (children in any order) offers each of its band
//! children as `A`: the one that fuses goes last and the others are placed
//! before it, which any order allows. The whole result is checked against
//! every dependence again; if that check fails, the schedule is returned
//! as it was.

use crate::deps::Dependences;
use crate::error::Result;
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, IslPrint, Schedule};
use crate::isl::{MultiUnionPwAff, UnionMap};
use crate::model::Scop;

/// `schedule` with every aligned producer loop fused into its consumer's
/// (see the module documentation), or as it was where none is.
pub fn aligned_loops(
    isl: &Isl,
    schedule: Schedule,
    scop: &Scop,
    deps: &Dependences,
) -> Result<Schedule> {
    let fuser = Fuser {
        isl,
        flow: deps.flow.copy()?,
        all: deps.all()?,
    };
    // The local conditions imply legality; checked all the same.
    let fused = rewritten(isl, &schedule, scop, deps, |root| fuser.visit(root, None))?;
    Ok(fused.unwrap_or(schedule))
}

/// `schedule`'s tree rewritten by `rewrite` (true when it changed
/// something), as a schedule, where it changed something and the result
/// respects every dependence; `None` otherwise. The one driver of the tree
/// rewrites here and in `schedule::siblings`.
pub(super) fn rewritten(
    isl: &Isl,
    schedule: &Schedule,
    scop: &Scop,
    deps: &Dependences,
    rewrite: impl FnOnce(&mut Tree) -> Result<bool>,
) -> Result<Option<Schedule>> {
    let mut tree = ScheduleTree::from_isl(&schedule.get_root()?)?;
    if !rewrite(&mut tree.root)? {
        return Ok(None);
    }
    let fused = isl.schedule(&tree.to_isl_text())?;
    Ok(super::check_legal("", &fused, scop, deps)
        .is_ok()
        .then_some(fused))
}

/// The prefix below band `schedule` (isl text): `prefix`, then the band's
/// members.
pub(super) fn prefix_below(
    isl: &Isl,
    schedule: &str,
    prefix: Option<&UnionMap>,
) -> Result<UnionMap> {
    let own = band_map(isl, schedule)?;
    Ok(match prefix {
        Some(p) => p.copy()?.flat_range_product(own)?,
        None => own,
    })
}

/// Band schedule `schedule` (isl text) as a map.
pub(super) fn band_map(isl: &Isl, schedule: &str) -> Result<UnionMap> {
    Ok(UnionMap::from_multi_union_pw_aff(
        MultiUnionPwAff::read_from_str(&isl.ctx, schedule)?,
    )?)
}

/// The pairs of `d` whose instances share the prefix schedule `prefix`
/// (all of `d` at the root).
pub(super) fn same_prefix(d: UnionMap, prefix: Option<&UnionMap>) -> Result<UnionMap> {
    Ok(match prefix {
        Some(p) => d.intersect(p.copy()?.apply_range(p.copy()?.reverse()?)?)?,
        None => d,
    })
}

struct Fuser<'a> {
    isl: &'a Isl,
    flow: UnionMap,
    all: UnionMap,
}

impl Fuser<'_> {
    /// Fuses in `t` and below; `prefix` maps each instance to the band
    /// members above `t`. True when something was fused.
    fn visit(&self, t: &mut Tree, prefix: Option<&UnionMap>) -> Result<bool> {
        match t {
            Tree::Leaf => Ok(false),
            Tree::Mark(_, c) => self.visit(c, prefix),
            Tree::Band(b, c) => {
                let inner = prefix_below(self.isl, &b.schedule, prefix)?;
                self.visit(c, Some(&inner))
            }
            Tree::Set(children) => {
                let mut changed = false;
                for (_, c) in children.iter_mut() {
                    changed |= self.visit(c, prefix)?;
                }
                Ok(changed)
            }
            Tree::Sequence(children) => {
                let mut changed = self.fuse_sequence(children, prefix)?;
                for (_, c) in children.iter_mut() {
                    changed |= self.visit(c, prefix)?;
                }
                // All fused into one: the sequence is that child (its
                // filter holds every instance that reaches it).
                if children.len() == 1 {
                    *t = children.pop().map(|(_, c)| c).unwrap_or(Tree::Leaf);
                }
                Ok(changed)
            }
        }
    }

    /// Fuses adjacent children of one sequence, left to right; a fused
    /// child may take in the next one too.
    fn fuse_sequence(
        &self,
        children: &mut Vec<(String, Tree)>,
        prefix: Option<&UnionMap>,
    ) -> Result<bool> {
        let mut changed = false;
        let mut i = 0;
        while i + 1 < children.len() {
            if !matches!(children[i + 1].1, Tree::Band(..)) {
                i += 1;
                continue;
            }
            let consumer = children[i + 1].clone();
            match children[i].1.clone() {
                Tree::Band(..) => {
                    if let Some(f) = self.try_fuse(&children[i], &consumer, prefix)? {
                        children[i] = f;
                        children.remove(i + 1);
                        changed = true;
                        continue;
                    }
                }
                Tree::Set(members) => {
                    let outer = self.isl.union_set(&children[i].0)?;
                    let mut done = None;
                    for (k, (filter, sub)) in members.iter().enumerate() {
                        if !matches!(sub, Tree::Band(..)) {
                            continue;
                        }
                        let filter = self.isl.union_set(filter)?.intersect(outer.copy()?)?.text();
                        if let Some(f) = self.try_fuse(&(filter, sub.clone()), &consumer, prefix)? {
                            done = Some((k, f));
                            break;
                        }
                    }
                    if let Some((k, f)) = done {
                        // The set's other children first (any order is
                        // theirs), then the fused loop.
                        let mut spliced = Vec::new();
                        for (j, (filter, sub)) in members.into_iter().enumerate() {
                            if j != k {
                                let filter = self
                                    .isl
                                    .union_set(&filter)?
                                    .intersect(outer.copy()?)?
                                    .text();
                                spliced.push((filter, sub));
                            }
                        }
                        let at = i + spliced.len();
                        spliced.push(f);
                        children.splice(i..i + 2, spliced);
                        i = at;
                        changed = true;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        Ok(changed)
    }

    /// `a` and `b` (filter, band subtree) as one band over a sequence of
    /// both, where that is legal and aligned (module documentation).
    fn try_fuse(
        &self,
        a: &(String, Tree),
        b: &(String, Tree),
        prefix: Option<&UnionMap>,
    ) -> Result<Option<(String, Tree)>> {
        let (Tree::Band(band_a, _), Tree::Band(band_b, _)) = (&a.1, &b.1) else {
            return Ok(None);
        };
        if band_a.coincident.len() != band_b.coincident.len() {
            return Ok(None);
        }
        let fa = self.isl.union_set(&a.0)?;
        let fb = self.isl.union_set(&b.0)?;
        let between = |d: &UnionMap| -> Result<UnionMap> {
            let d = d
                .copy()?
                .intersect_domain(fa.copy()?)?
                .intersect_range(fb.copy()?)?;
            same_prefix(d, prefix)
        };
        let flow = between(&self.flow)?;
        if flow.is_empty()? {
            return Ok(None);
        }
        let sigma_a = MultiUnionPwAff::read_from_str(&self.isl.ctx, &band_a.schedule)?
            .intersect_domain(fa.copy()?)?;
        let sigma_b = MultiUnionPwAff::read_from_str(&self.isl.ctx, &band_b.schedule)?
            .intersect_domain(fb.copy()?)?;
        let sigma_mupa = sigma_a.union_add(sigma_b)?;
        let schedule = sigma_mupa.text();
        let sigma = UnionMap::from_multi_union_pw_aff(sigma_mupa)?;
        // Pairs of instances at the same point of the fused band.
        let same = sigma.copy()?.apply_range(sigma.copy()?.reverse()?)?;
        if !flow.is_subset(&same)? {
            return Ok(None);
        }
        let all = between(&self.all)?;
        let reversed = all
            .copy()?
            .intersect(sigma.copy()?.lex_gt_union_map(sigma)?)?;
        if !reversed.is_empty()? {
            return Ok(None);
        }
        let aligned = all.is_subset(&same)?;
        let n = band_a.coincident.len();
        let band = Band {
            schedule,
            permutable: band_a.permutable && band_b.permutable && (n == 1 || aligned),
            coincident: (0..n)
                .map(|k| band_a.coincident[k] && band_b.coincident[k] && aligned)
                .collect(),
        };
        Ok(Some(fused_band(self.isl, band, a, b)?))
    }
}

/// Children `a` and `b` (filter, band subtree) of a set or sequence as one
/// child: `band` over a sequence of `a`'s subtree and then `b`'s (their
/// own sequences' children spliced in, each filter restricted to its
/// child's), on the union of both filters. Shared by the producer fusion
/// here and the sibling fusion (`schedule::siblings`).
pub(super) fn fused_band(
    isl: &Isl,
    band: Band,
    a: &(String, Tree),
    b: &(String, Tree),
) -> Result<(String, Tree)> {
    let fa = isl.union_set(&a.0)?;
    let fb = isl.union_set(&b.0)?;
    let mut parts = Vec::new();
    for (filter, outer, sub) in [(&a.0, &fa, &a.1), (&b.0, &fb, &b.1)] {
        let Tree::Band(_, sub) = sub else {
            parts.push((filter.clone(), sub.clone()));
            continue;
        };
        match &**sub {
            Tree::Sequence(inner) => {
                for (f, t) in inner {
                    let f = isl.union_set(f)?.intersect(outer.copy()?)?.text();
                    parts.push((f, t.clone()));
                }
            }
            other => parts.push((filter.clone(), other.clone())),
        }
    }
    let filter = fa.union(fb)?.text();
    Ok((filter, Tree::Band(band, Box::new(Tree::Sequence(parts)))))
}
