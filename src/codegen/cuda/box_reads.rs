//! Whether a triangle's diagonal tiles may run the full tile's copy of a
//! register region.
//!
//! The full copy runs every slot of the tile's box without tests. A
//! triangle's diagonal tile takes the other copy, which clamps the slots
//! beyond the triangle onto its bound (`Ctx::closed_clamp`): each clamped
//! slot then loads its own operands from shared memory, where the full
//! copy shares a thread's loads along each axis (syrk's product took 734
//! us on the H200, against 412 us for every tile on the full copy).
//!
//! The full copy is right for a diagonal tile when (1) every statement of
//! the region may run at a slot beyond its loops' bounds into a dead
//! register (`RegisterTile::slot_closed`, printed once), and (2) at such
//! a slot its reads stay inside memory: every read is of the tile's
//! registers or of a shared copy, at an index inside the copy's box. For
//! each dimension of a shared read, the index `sub(args) - offset` is a
//! linear form in the loop iterators (isl's arguments of the statement
//! substituted into the subscript); the block iterators and the
//! parameters must cancel, and then either
//!
//! - no slot moves it: the index is the one a valid instance of the
//!   statement at the same step and block reads (the statement runs at
//!   this step at every live slot, and its guards at the step hold), so it
//!   lies in the box; or
//! - only slots move it, `c + Σ a_s · s` over `0 <= s <= last_s`: its
//!   smallest and largest values over the box lie in `0 .. size - 1`.
//!
//! Anything else (a read from global memory, a slot and a step moving one
//! index together) keeps the clamped copy.
//!
//! Three shapes of the AST are asked for, so that what the copy drops is
//! only the slots' own range: the slot loops' bounds and starts name no
//! step (then a slot beyond them is outside every step's range, and the
//! statement's live slots, which it runs at every step it runs, lie
//! inside), the other loops' bounds and starts name no slot, and no test
//! inside the region names a slot (then where the statement's tests hold
//! at a step, it has instances at that step, and an index no slot moves
//! is the one they read).

use std::collections::{BTreeMap, BTreeSet};

use super::clamp::linear;
use super::Ctx;
use crate::frontend::ast::Affine;
use crate::gpu::registers::RegisterTile;
use crate::isl::ast::{Expr, Node};

type Linear = (BTreeMap<String, i64>, i64);

impl Ctx<'_> {
    /// Whether the diagonal tiles of register tile `regs` may run the full
    /// copy of its region `body`, whose slot loops are `slots` (iterator ->
    /// last slot): see the module documentation.
    pub(super) fn box_safe_region(
        &self,
        regs: &RegisterTile,
        body: &Node,
        slots: &BTreeMap<String, i64>,
    ) -> bool {
        let Some(scope) = self.scope() else {
            return false;
        };
        let mut users = Vec::new();
        let mut steps = BTreeSet::new();
        collect(body, false, &mut users, &mut steps);
        steps.retain(|s| !slots.contains_key(s));
        // The hoisted initialisation and the statements run at the store
        // are not printed in the region (`Ctx::statement`): they run once
        // per register, before and after its loops, under the slot's own
        // test, whichever copy the region takes.
        users.retain(|&(statement, _, _)| {
            regs.init.as_ref().is_none_or(|i| i.statement != statement)
                && !regs.store.iter().any(|e| e.statement == statement)
        });
        let mut shape_ok = true;
        visit(body, &mut |n| match n {
            Node::For {
                iterator,
                init,
                cond,
                ..
            } if slots.contains_key(iterator) => {
                shape_ok &= !names_any(init, steps.iter()) && !names_any(cond, steps.iter());
            }
            // A step loop whose range a slot moves would run, at a slot
            // beyond the bounds, steps no valid instance there runs.
            Node::For { init, cond, .. } => {
                shape_ok &= !names_any(init, slots.keys()) && !names_any(cond, slots.keys());
            }
            Node::If { cond, .. } => shape_ok &= !names_any(cond, slots.keys()),
            _ => {}
        });
        shape_ok
            && !users.is_empty()
            && users.iter().all(|&(statement, args, in_scope)| {
                // A statement outside the shared copies' scope reads
                // global memory.
                if !in_scope || !regs.slot_closed.contains(statement) {
                    return false;
                }
                let Some(s) = self.scop.statements.iter().find(|s| s.name == statement) else {
                    return false;
                };
                let names: BTreeMap<&str, &Expr> =
                    s.iterators.iter().map(String::as_str).zip(args).collect();
                s.accesses(self.program).iter().all(|a| {
                    if a.tensor == regs.tensor {
                        return true;
                    }
                    let key = (statement.to_string(), a.key());
                    let Some((k, subs)) = scope.accesses.get(&key) else {
                        return false;
                    };
                    let array = &scope.arrays[*k];
                    subs.iter().enumerate().all(|(d, sub)| {
                        let (Some(at), Some(off)) = (
                            substituted(sub, &names),
                            array.offset.get(d).and_then(linear),
                        ) else {
                            return false;
                        };
                        let size = array.sizes.get(d).copied().unwrap_or(0);
                        in_box(difference(at, off), slots, &steps, size)
                    })
                })
            })
    }
}

/// A statement of a region: its name, isl's arguments, and whether it
/// is inside the scope of the shared copies (below a `shared` mark).
type User<'n> = (&'n str, &'n [Expr], bool);

/// The statements and the loop iterators of `n`.
fn collect<'n>(
    n: &'n Node,
    in_scope: bool,
    users: &mut Vec<User<'n>>,
    loops: &mut BTreeSet<String>,
) {
    let mut in_scope = in_scope;
    match n {
        Node::User { statement, args } => users.push((statement, args, in_scope)),
        Node::For { iterator, .. } => {
            loops.insert(iterator.clone());
        }
        Node::Mark { name, .. } if name == "shared" => in_scope = true,
        _ => {}
    }
    n.children()
        .into_iter()
        .for_each(|c| collect(c, in_scope, users, loops));
}

/// Whether `e` names any of `names`.
fn names_any<'a>(e: &Expr, mut names: impl Iterator<Item = &'a String>) -> bool {
    names.any(|n| e.mentions(n))
}

/// Calls `f` on every node of `n`.
fn visit(n: &Node, f: &mut dyn FnMut(&Node)) {
    f(n);
    n.children().into_iter().for_each(|c| visit(c, f));
}

/// `sub` with each statement iterator replaced by isl's argument for it,
/// as a linear form in the loop iterators and parameters.
fn substituted(sub: &Affine, names: &BTreeMap<&str, &Expr>) -> Option<Linear> {
    let mut terms = BTreeMap::new();
    let mut constant = sub.constant;
    for (name, k) in &sub.terms {
        match names.get(name.as_str()) {
            Some(arg) => {
                let (t, c) = linear(arg)?;
                constant += k * c;
                for (n, v) in t {
                    *terms.entry(n).or_insert(0) += k * v;
                }
            }
            None => *terms.entry(name.clone()).or_insert(0) += k,
        }
    }
    terms.retain(|_, v| *v != 0);
    Some((terms, constant))
}

fn difference((mut terms, c): Linear, (off, d): Linear) -> Linear {
    for (n, v) in off {
        *terms.entry(n).or_insert(0) -= v;
    }
    terms.retain(|_, v| *v != 0);
    (terms, c - d)
}

/// Whether the shared index `index` stays in `0 .. size` at every slot of
/// the box (module documentation).
fn in_box(
    (terms, c): Linear,
    slots: &BTreeMap<String, i64>,
    steps: &BTreeSet<String>,
    size: i64,
) -> bool {
    let moved_by_slot = terms.keys().any(|n| slots.contains_key(n));
    let moved_by_step = terms.keys().any(|n| steps.contains(n));
    if terms
        .keys()
        .any(|n| !slots.contains_key(n) && !steps.contains(n))
    {
        return false;
    }
    match (moved_by_slot, moved_by_step) {
        (false, _) => true,
        (true, true) => false,
        (true, false) => {
            let (mut lo, mut hi) = (c, c);
            for (n, a) in &terms {
                let span = a * slots[n];
                lo += span.min(0);
                hi += span.max(0);
            }
            lo >= 0 && hi < size
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lin(terms: &[(&str, i64)], c: i64) -> Linear {
        (terms.iter().map(|(n, v)| (n.to_string(), *v)).collect(), c)
    }

    /// syrk's reads: the row `c1 + c5` of a box at `c1` (a slot over the
    /// box's 64 rows), the step `c2 + c3` of a box at `c2` (a step), and
    /// what must be refused: a row past the box, a block iterator that
    /// does not cancel, a slot and a step together.
    #[test]
    fn indices_over_the_box() {
        let slots: BTreeMap<String, i64> = [("c4".to_string(), 63), ("c5".to_string(), 63)].into();
        let steps: BTreeSet<String> = ["c3".to_string()].into();
        let row = difference(lin(&[("c1", 1), ("c5", 1)], 0), lin(&[("c1", 1)], 0));
        assert!(in_box(row.clone(), &slots, &steps, 64));
        assert!(!in_box(row, &slots, &steps, 63));
        let step = difference(lin(&[("c2", 1), ("c3", 1)], 0), lin(&[("c2", 1)], 0));
        assert!(in_box(step, &slots, &steps, 16));
        let shifted = lin(&[("c5", 1)], 1);
        assert!(!in_box(shifted, &slots, &steps, 64));
        let uncancelled = lin(&[("c0", 1), ("c5", 1)], 0);
        assert!(!in_box(uncancelled, &slots, &steps, 64));
        let both = lin(&[("c3", 1), ("c5", 1)], 0);
        assert!(!in_box(both, &slots, &steps, 128));
        let falling = lin(&[("c5", -1)], 63);
        assert!(in_box(falling, &slots, &steps, 64));
    }
}
