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
//! them once, or from cache; `Siblings::read_together`). In a sequence,
//! each child between `A` and `B` moves before the fused loop where it has
//! no dependence with `A`, else after it where it has none with `B` (a
//! temp's epilogue `S = T * 2` after `T`'s loop, beside `M`'s), and two
//! of them that swap must have none with each other.
//! The whole result is checked against every dependence again; if that
//! check fails, nothing is fused.

use super::fuse::{band_map, fused_band, prefix_below, rewritten, same_prefix};
use crate::deps::Dependences;
use crate::error::Result;
use crate::isl::tree::{Band, Tree};
use crate::isl::{Isl, IslPrint, Schedule};
use crate::isl::{MultiUnionPwAff, UnionMap, UnionSet};
use crate::model::Scop;

/// `schedule` with every pair of independent sibling loops that read the
/// same elements at the same iterations fused (module documentation);
/// `None` where none is, or where the result fails the dependence check.
pub fn shared_reads(
    isl: &Isl,
    schedule: &Schedule,
    scop: &Scop,
    deps: &Dependences,
) -> Result<Option<Schedule>> {
    let fuser = Siblings {
        isl,
        reads: scop.reads()?,
        all: deps.all()?,
    };
    rewritten(isl, schedule, scop, deps, |root| fuser.visit(root, None))
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
        let ordered = matches!(t, Tree::Sequence(_));
        let changed = match t {
            Tree::Leaf => return Ok(false),
            Tree::Mark(_, c) => return self.visit(c, prefix),
            Tree::Band(b, c) => {
                let inner = prefix_below(self.isl, &b.schedule, prefix)?;
                return self.visit(c, Some(&inner));
            }
            Tree::Set(children) | Tree::Sequence(children) => {
                let mut changed = self.fuse_children(children, ordered, prefix)?;
                for (_, c) in children.iter_mut() {
                    changed |= self.visit(c, prefix)?;
                }
                changed
            }
        };
        // All fused into one: the set or sequence is that child.
        if let Tree::Set(children) | Tree::Sequence(children) = t {
            if children.len() == 1 {
                *t = children.pop().map(|(_, c)| c).unwrap_or(Tree::Leaf);
            }
        }
        Ok(changed)
    }

    /// Fuses band children pairwise, the first with each later one that
    /// qualifies, then the next; in a sequence, the children between two
    /// that fuse go before or after the fused loop ([`Self::place_between`]).
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
                let placed = match ordered {
                    true => self.place_between(children, i, j, prefix)?,
                    false => Some((Vec::new(), Vec::new())),
                };
                let fused = match &placed {
                    Some(_) => self.try_fuse(&children[i], &children[j], prefix)?,
                    None => None,
                };
                let (Some(f), Some((before, after))) = (fused, placed) else {
                    j += 1;
                    continue;
                };
                // The children between go before the fused loop or after
                // it, each list in its order (in a set there are none to
                // place: any order is theirs).
                let between: Vec<_> = children.drain(i + 1..=j).collect();
                children.remove(i);
                let mut run: Vec<(String, Tree)> = Vec::new();
                for k in &before {
                    run.push(between[k - i - 1].clone());
                }
                run.push(f);
                for k in &after {
                    run.push(between[k - i - 1].clone());
                }
                let at = i + before.len();
                children.splice(i..i, run);
                i = at;
                changed = true;
                j = i + 1;
            }
            i += 1;
        }
        Ok(changed)
    }

    /// Where the children strictly between `i` and `j` of a sequence go
    /// when `i` and `j` fuse: before the fused loop those with no
    /// dependence on `i` (they pass it), the others after it where they
    /// have none with `j` (they pass it); a child placed before that came
    /// after one placed after must have no dependence with it (the two
    /// swap). `None` where a child can go neither way.
    fn place_between(
        &self,
        children: &[(String, Tree)],
        i: usize,
        j: usize,
        prefix: Option<&UnionMap>,
    ) -> Result<Option<(Vec<usize>, Vec<usize>)>> {
        let (mut before, mut after): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
        for k in i + 1..j {
            let filter = &children[k].0;
            if self.independent(&children[i].0, filter, prefix)? {
                for m in &after {
                    if !self.independent(&children[*m].0, filter, prefix)? {
                        return Ok(None);
                    }
                }
                before.push(k);
            } else if self.independent(&children[j].0, filter, prefix)? {
                after.push(k);
            } else {
                return Ok(None);
            }
        }
        Ok(Some((before, after)))
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
        let sa = band_map(self.isl, &band_a.schedule)?.intersect_domain(fa.copy()?)?;
        let sb = band_map(self.isl, &band_b.schedule)?.intersect_domain(fb.copy()?)?;
        if !self.read_together(&fa, &sa, &fb, &sb, prefix)? {
            return Ok(None);
        }
        let schedule = MultiUnionPwAff::read_from_str(&self.isl.ctx, &band_a.schedule)?
            .intersect_domain(fa)?
            .union_add(
                MultiUnionPwAff::read_from_str(&self.isl.ctx, &band_b.schedule)?
                    .intersect_domain(fb)?,
            )?
            .text();
        let n = band_a.coincident.len();
        let band = Band {
            schedule,
            permutable: band_a.permutable && band_b.permutable,
            coincident: (0..n)
                .map(|k| band_a.coincident[k] && band_b.coincident[k])
                .collect(),
        };
        Ok(Some(fused_band(self.isl, band, a, b)?))
    }
}
