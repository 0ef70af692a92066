//! The test that a register tile is full: its region is then printed
//! without the slots' tests (the compiler keeps a thread's operands in
//! registers across its slots), the other tiles keep them. Where the
//! region may run over the whole box (`box_reads`), every tile takes that
//! copy.

use std::collections::BTreeMap;

use super::{parse_mapping_mark, slot_box, upper_bound, Ctx};
use crate::gpu::registers::RegisterTile;
use crate::isl::ast::{Expr, Node, Op};

/// The test that a register tile is full (`Ctx::full_tile_test`), and the
/// slot loops (iterator and start: isl may print loops of one iterator
/// with different starts) whose start it covers: their slots need no test
/// of it.
pub(super) struct FullTile {
    pub(super) test: String,
    pub(super) starts: Vec<(String, Expr)>,
    /// Every tile runs this copy (`box_reads`): no other is printed.
    pub(super) whole_box: bool,
}

impl Ctx<'_> {
    /// The test that every counted thread loop of `body` runs all its
    /// registers: each loop's condition at the last register of the last
    /// thread (`R * B - 1`), when the condition names nothing but its own
    /// iterator, the block iterators and the parameters (then it holds for
    /// all smaller values too: isl's loop conditions are upper bounds).
    /// A bound or start that names other slots is tested where it is
    /// tightest over them (`slot_box`).
    pub(super) fn full_tile_test(&self, regs: &RegisterTile, body: &Node) -> Option<FullTile> {
        let counts = regs.counts(self.plan.block);
        let nt = regs.thread_dims;
        let allowed = &regs.block_iterators;
        let mut tests = Vec::new();
        let mut starts = Vec::new();
        let mut ok = true;
        let subst =
            |e: &Expr, name: &str, v: i64| e.replace_ids(&|s| (s == name).then_some(Expr::Int(v)));
        type Found = Vec<(String, char, Expr, Expr)>;
        fn visit(n: &Node, mapped: &[(String, char)], found: &mut Found) {
            match n {
                Node::For {
                    iterator,
                    init,
                    cond,
                    body,
                    ..
                } => {
                    if let Some((_, a)) = mapped.iter().find(|(m, _)| m == iterator) {
                        found.push((iterator.clone(), *a, init.clone(), cond.clone()));
                    }
                    visit(body, mapped, found);
                }
                Node::Mark { name, body } => {
                    let mut m = mapped.to_vec();
                    if let Some((true, a, it)) = parse_mapping_mark(name) {
                        m.push((it, a));
                    }
                    visit(body, &m, found);
                }
                Node::If {
                    then, otherwise, ..
                } => {
                    visit(then, mapped, found);
                    if let Some(e) = otherwise {
                        visit(e, mapped, found);
                    }
                }
                Node::Block(v) => v.iter().for_each(|c| visit(c, mapped, found)),
                Node::User { .. } => {}
            }
        }
        let mut found = Vec::new();
        visit(body, &[], &mut found);
        if found.is_empty() {
            return None;
        }
        // The last slot of each counted thread loop.
        let last_slot = |axis: char| {
            let axis = (axis as u8).saturating_sub(b'x') as usize;
            let b = i64::from(self.plan.block[axis.min(2)]);
            counts[nt - 1 - axis.min(nt - 1)] * b - 1
        };
        let slots: BTreeMap<String, i64> = found
            .iter()
            .map(|(it, axis, _, _)| (it.clone(), last_slot(*axis)))
            .collect();
        // Where the region may run over the whole box (`box_reads`: a slot
        // beyond any bound or start of its loops holds a dead register,
        // and its reads stay in the shared copies), every tile takes the
        // copy without tests: a triangle's diagonal, the tensor's end.
        if self.box_safe_region(regs, body, &slots) {
            let starts = found
                .into_iter()
                .filter(|(_, _, init, _)| init != &Expr::Int(0))
                .map(|(iterator, _, init, _)| (iterator, init))
                .collect();
            return Some(FullTile {
                test: "1".to_string(),
                starts,
                whole_box: true,
            });
        }
        let outer = |n: &String| allowed.contains(n) || self.params.contains(n);
        for (iterator, axis, init, cond) in found {
            let last = last_slot(axis);
            // A start that other slots move (an upper triangle,
            // `c5 >= max(0, (c0 - c1) + c4)`): every slot is past it when
            // its largest value over them is at most 0. A start in other
            // names (a sequential loop's) keeps the slot's own test.
            if let Some(test) = self.start_test(regs, &iterator, &init, &slots) {
                if !tests.contains(&test) {
                    tests.push(test);
                }
                starts.push((iterator.clone(), init.clone()));
            }
            let names = cond.ids();
            let test = if names.iter().all(|n| n == &iterator || outer(n)) {
                self.e(&subst(&cond, &iterator, last))
            } else if names
                .iter()
                .all(|n| n == &iterator || outer(n) || slots.contains_key(n))
            {
                // Bounded by another slot too (a triangle): the test at
                // the slots where the bound is tightest (`slot_box`).
                let mut others = slots.clone();
                others.remove(&iterator);
                match self.triangle_test(&iterator, &cond, last, &others) {
                    Some(test) => test,
                    None => {
                        ok = false;
                        break;
                    }
                }
            } else {
                ok = false;
                break;
            };
            // A loop printed twice (`full_steps`) is tested once.
            if !tests.contains(&test) {
                tests.push(test);
            }
        }
        (ok && !tests.is_empty()).then(|| FullTile {
            test: tests.join(" && "),
            starts,
            whole_box: false,
        })
    }

    /// The test that the start `init` of slot loop `iterator` of tile
    /// `regs` is at most 0 for every value of the other slots, when it
    /// names other slots and nothing but them, the tile's block iterators
    /// and the parameters.
    fn start_test(
        &self,
        regs: &RegisterTile,
        iterator: &str,
        init: &Expr,
        slots: &BTreeMap<String, i64>,
    ) -> Option<String> {
        let mut others = slots.clone();
        others.remove(iterator);
        let names = init.ids();
        let outer = |n: &String| regs.block_iterators.contains(n) || self.params.contains(n);
        if names.iter().all(outer) || !names.iter().all(|n| outer(n) || others.contains_key(n)) {
            return None;
        }
        let highest = slot_box::extreme(init, &others, false)?;
        Some(self.e(&Expr::Op(Op::Le, vec![highest, Expr::Int(0)])))
    }

    /// The test that the upper bound `cond` of the slot loop `iterator`
    /// holds at its last slot `last` for every value of the other slots
    /// (`slot_box`): `last <= min over the box of E` for `iterator <= E`.
    fn triangle_test(
        &self,
        iterator: &str,
        cond: &Expr,
        last: i64,
        others: &BTreeMap<String, i64>,
    ) -> Option<String> {
        let (op, bound) = upper_bound(iterator, cond)?;
        let lowest = slot_box::extreme(bound, others, true)?;
        Some(self.e(&Expr::Op(op, vec![Expr::Int(last), lowest])))
    }
}
