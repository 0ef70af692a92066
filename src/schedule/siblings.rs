//! Sibling fusion: independent loops that read the same data at the same
//! iterations share one loop (Blockbuster's first rule, Inductor's fusion
//! of nodes that share reads).
//!
//! isl's scheduler fuses along dependences only; two reductions of the
//! same rows (`S(r) +=! X(r, c)`, `M(r) max=! X(r, c)`) have none between
//! them, so even maximal fusion leaves them in two loop nests, and on the
//! GPU in two kernels that each read all of `X`.
//!
//! The rewrite, on two children `A`, `B` of a set or a sequence whose
//! subtrees are bands `σ_A`, `σ_B` of `n` members each:
//!
//! ```text
//!   [A: band σ_A { a }, B: band σ_B { b }]
//!     =>  band σ_A ∪ σ_B { sequence [A: a, B: b] }
//! ```
//!
//! Legal when no dependence joins an instance of `A` and one of `B` that
//! share the schedule prefix above them, in either direction (`D_AB = D_BA
//! = ∅`): the fused band orders only pairs of `A` with `B`, and none of
//! those is constrained; pairs inside `A` or inside `B` keep their order,
//! as the fused band restricted to either is its own. Parallelism is kept
//! for the same reason: a member coincident in both bands stays
//! coincident. Done only where it pays: `A` and `B` read the same
//! elements at the same points of the fused band (the fused loop reads
//! them once, or from cache; `Siblings::read_together`). In a sequence, children between `A` and `B`
//! are first moved before `A`, each only where it has no dependence with
//! the children it passes (then any order of them is the program's).
//! The whole result is checked against every dependence again; if that
//! check fails, the schedule is returned as it was.

use crate::deps::Dependences;
use crate::error::Result;
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, IslPrint, Schedule};
use crate::model::Scop;
use isl_rs::{MultiUnionPwAff, UnionMap, UnionSet};

/// `schedule` with every pair of independent sibling loops that read the
/// same elements at the same iterations fused (module documentation), or
/// as it was where none is.
pub fn shared_reads(
    isl: &Isl,
    schedule: Schedule,
    scop: &Scop,
    deps: &Dependences,
) -> Result<Schedule> {
    let mut tree = ScheduleTree::from_isl(&schedule.get_root()?)?;
    let fuser = Siblings {
        isl,
        reads: scop.reads()?,
        all: deps.all()?,
    };
    if !fuser.visit(&mut tree.root, None)? {
        return Ok(schedule);
    }
    let fused = isl.schedule(&tree.to_isl_text())?;
    match super::check_legal("", &fused, scop, deps) {
        Ok(()) => Ok(fused),
        Err(_) => Ok(schedule),
    }
}

struct Siblings<'a> {
    isl: &'a Isl,
    reads: UnionMap,
    all: UnionMap,
}

impl Siblings<'_> {
    /// Fuses in `t` and below; `prefix` maps each instance to the band
    /// members above `t`. True when something was fused.
    fn visit(&self, t: &mut Tree, prefix: Option<&UnionMap>) -> Result<bool> {
        match t {
            Tree::Leaf => Ok(false),
            Tree::Mark(_, c) => self.visit(c, prefix),
            Tree::Band(b, c) => {
                let own = band_map(self.isl, &b.schedule)?;
                let inner = match prefix {
                    Some(p) => p.copy()?.flat_range_product(own)?,
                    None => own,
                };
                self.visit(c, Some(&inner))
            }
            Tree::Set(_) | Tree::Sequence(_) => {
                let ordered = matches!(t, Tree::Sequence(_));
                let (Tree::Set(children) | Tree::Sequence(children)) = t else {
                    return Ok(false);
                };
                let mut changed = self.fuse_children(children, ordered, prefix)?;
                for (_, c) in children.iter_mut() {
                    changed |= self.visit(c, prefix)?;
                }
                if children.len() == 1 {
                    *t = children.pop().map(|(_, c)| c).unwrap_or(Tree::Leaf);
                }
                Ok(changed)
            }
        }
    }

    /// Fuses band children pairwise, the first with each later one that
    /// qualifies, then the next; in a sequence, the children between two
    /// that fuse move before the first where they may.
    fn fuse_children(
        &self,
        children: &mut Vec<(String, Tree)>,
        ordered: bool,
        prefix: Option<&UnionMap>,
    ) -> Result<bool> {
        let mut changed = false;
        let mut i = 0;
        while i < children.len() {
            let mut j = i + 1;
            while j < children.len() {
                let between_moves = !ordered || self.movable_before(children, i, j, prefix)?;
                match between_moves {
                    true => match self.try_fuse(&children[i], &children[j], prefix)? {
                        Some(f) => {
                            children.remove(j);
                            if ordered {
                                // The children between go before the fused
                                // loop, in their order.
                                let moved: Vec<_> = children.drain(i + 1..j).collect();
                                let n = moved.len();
                                children.splice(i..i, moved);
                                i += n;
                            }
                            children[i] = f;
                            changed = true;
                            j = i + 1;
                        }
                        None => j += 1,
                    },
                    false => j += 1,
                }
            }
            i += 1;
        }
        Ok(changed)
    }

    /// Whether every child strictly between `i` and `j` of a sequence may
    /// run before child `i`: no dependence joins it with `i` or with any
    /// child between them.
    fn movable_before(
        &self,
        children: &[(String, Tree)],
        i: usize,
        j: usize,
        prefix: Option<&UnionMap>,
    ) -> Result<bool> {
        for k in i + 1..j {
            for m in i..k {
                if !self.independent(&children[m].0, &children[k].0, prefix)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// No dependence between an instance of filter `a` and one of `b` at
    /// the same prefix, in either direction.
    fn independent(&self, a: &str, b: &str, prefix: Option<&UnionMap>) -> Result<bool> {
        let (fa, fb) = (self.isl.union_set(a)?, self.isl.union_set(b)?);
        for (x, y) in [(&fa, &fb), (&fb, &fa)] {
            let d = self
                .all
                .copy()?
                .intersect_domain(x.copy()?)?
                .intersect_range(y.copy()?)?;
            if !same_prefix(d, prefix)?.is_empty()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether `A` (filter `fa`, band map `sa`) and `B` read the same
    /// data at the same iterations: with `R_X = { p -> x : ∃ i ∈ X :
    /// (prefix(i), σ_X(i)) = p ∧ i reads x }` (each point of the fused
    /// band to the elements its instances read), `R_A ∩ R_B` is not empty
    /// and holds every element both read: `ran(R_A ∩ R_B) = ran R_A ∩ ran
    /// R_B`. A sum and a maximum of `X(r, c)` over each row `r` qualify;
    /// bicg's `s(j) += r(i) A(i, j)` beside `q(i) += A(i, j) p(j)` does
    /// not (they meet on `A`'s diagonal only: one reads by columns, the
    /// other by rows).
    fn read_together(
        &self,
        fa: &UnionSet,
        sa: &UnionMap,
        fb: &UnionSet,
        sb: &UnionMap,
        prefix: Option<&UnionMap>,
    ) -> Result<bool> {
        let reads_at = |f: &UnionSet, s: &UnionMap| -> Result<UnionMap> {
            let point = match prefix {
                Some(p) => p
                    .copy()?
                    .intersect_domain(f.copy()?)?
                    .flat_range_product(s.copy()?)?,
                None => s.copy()?,
            };
            Ok(point
                .reverse()?
                .apply_range(self.reads.copy()?.intersect_domain(f.copy()?)?)?)
        };
        let (ra, rb) = (reads_at(fa, sa)?, reads_at(fb, sb)?);
        let both = ra.copy()?.intersect(rb.copy()?)?;
        if both.is_empty()? {
            return Ok(false);
        }
        Ok(both
            .range()?
            .is_equal(&ra.range()?.intersect(rb.range()?)?)?)
    }

    /// `a` and `b` (filter, band subtree) as one band over a sequence of
    /// both, where they are independent and read an element at the same
    /// point of their bands.
    fn try_fuse(
        &self,
        a: &(String, Tree),
        b: &(String, Tree),
        prefix: Option<&UnionMap>,
    ) -> Result<Option<(String, Tree)>> {
        let (Tree::Band(band_a, _), Tree::Band(band_b, _)) = (&a.1, &b.1) else {
            return Ok(None);
        };
        if band_a.coincident.len() != band_b.coincident.len()
            || !self.independent(&a.0, &b.0, prefix)?
        {
            return Ok(None);
        }
        let fa = self.isl.union_set(&a.0)?;
        let fb = self.isl.union_set(&b.0)?;
        let sigma_a = MultiUnionPwAff::read_from_str(&self.isl.ctx, &band_a.schedule)?
            .intersect_domain(fa.copy()?)?;
        let sigma_b = MultiUnionPwAff::read_from_str(&self.isl.ctx, &band_b.schedule)?
            .intersect_domain(fb.copy()?)?;
        let sigma_mupa = sigma_a.union_add(sigma_b)?;
        let schedule = sigma_mupa.text();
        if !self.read_together(
            &fa,
            &band_on(&band_a.schedule, &fa, self.isl)?,
            &fb,
            &band_on(&band_b.schedule, &fb, self.isl)?,
            prefix,
        )? {
            return Ok(None);
        }
        let n = band_a.coincident.len();
        let band = Band {
            schedule,
            permutable: band_a.permutable && band_b.permutable,
            coincident: (0..n)
                .map(|k| band_a.coincident[k] && band_b.coincident[k])
                .collect(),
        };
        Ok(Some(super::fuse::fused_band(self.isl, band, a, b)?))
    }
}

/// The band schedule `schedule` on the instances of filter `f`, as a map.
fn band_on(schedule: &str, f: &UnionSet, isl: &Isl) -> Result<UnionMap> {
    Ok(band_map(isl, schedule)?.intersect_domain(f.copy()?)?)
}

fn band_map(isl: &Isl, schedule: &str) -> Result<UnionMap> {
    Ok(UnionMap::from_multi_union_pw_aff(
        MultiUnionPwAff::read_from_str(&isl.ctx, schedule)?,
    )?)
}

/// The pairs of `d` whose instances share the prefix schedule (all of `d`
/// at the root).
fn same_prefix(d: UnionMap, prefix: Option<&UnionMap>) -> Result<UnionMap> {
    Ok(match prefix {
        Some(p) => d.intersect(p.copy()?.apply_range(p.copy()?.reverse()?)?)?,
        None => d,
    })
}
