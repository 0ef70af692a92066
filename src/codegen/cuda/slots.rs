//! A register tile's slot loops: each thread runs its slots of the tile,
//! each slot testing that it is one of the loop's points, or clamped onto
//! the loop's bounds where the gpu stage lets its statements run there
//! into dead registers (the tensor's end: `RegisterTile::clamp_safe`; a
//! triangle's bound in other slots: `RegisterTile::slot_closed`).

use std::fmt::Write;

use super::{slot_point, Ctx, LoopHead, Pending};
use crate::gpu::registers::RegisterTile;
use crate::isl::ast::{Expr, Op};

/// The clamp of a register tile's slot loop (`Ctx::register_slots`): a
/// slot beyond the loop's points runs the statements that allow it at
/// `max(min(slot, upper), lower)`.
pub(super) struct SlotClamp {
    /// The bound, and whether it is the tensor's end (`slot_clamp`: the
    /// statements of `RegisterTile::clamp_safe` run beyond it) or a bound
    /// in other slots (`Ctx::closed_clamp`: those of
    /// `RegisterTile::slot_closed` do).
    upper: Option<(String, bool)>,
    /// A start in other slots (`Ctx::closed_clamp`).
    lower: Option<String>,
}

impl SlotClamp {
    /// The clamped value of slot `slot`, with the tests that it is a point
    /// of the loop added to `tests` for the statements the clamp does not
    /// allow.
    fn value(&self, slot: &str, tests: &mut Vec<SlotTest>) -> String {
        let mut value = slot.to_string();
        if let Some((upper, at_tensor_end)) = &self.upper {
            value = format!("pf_min({value}, {upper})");
            tests.push(SlotTest {
                test: format!("{slot} <= {upper}"),
                at_tensor_end: *at_tensor_end,
            });
        }
        if let Some(lower) = &self.lower {
            value = format!("pf_max({value}, {lower})");
            tests.push(SlotTest {
                test: format!("{slot} >= {lower}"),
                at_tensor_end: false,
            });
        }
        value
    }
}

/// A clamped slot loop's test that the thread's slot is one of the loop's
/// points (`Ctx::register_slots`).
#[derive(Clone)]
pub(super) struct SlotTest {
    test: String,
    /// The clamp is the one at the tensor's end (`slot_clamp`): the
    /// statements of `RegisterTile::clamp_safe` run at clamped slots.
    /// Otherwise it is a bound in other slots or the block values (a
    /// triangle's), and only `RegisterTile::slot_closed` ones do.
    at_tensor_end: bool,
}

/// The bound `B` of a loop condition `iterator <= B` or `iterator < B`
/// (with its comparison), where `B` does not name the iterator.
pub(super) fn upper_bound<'e>(iterator: &str, cond: &'e Expr) -> Option<(Op, &'e Expr)> {
    let Expr::Op(op @ (Op::Le | Op::Lt), a) = cond else {
        return None;
    };
    let [Expr::Id(it), bound] = a.as_slice() else {
        return None;
    };
    (it == iterator && !bound.mentions(iterator)).then_some((*op, bound))
}

impl Ctx<'_> {
    /// A thread loop of a register tile: each thread runs its slots of the
    /// tile (`slot_point`: the thread's index, then a block's width apart,
    /// or in groups), each slot testing that its point is an iteration of
    /// the loop, or, in a tile cut by the end of the tensor, clamped onto
    /// the tensor (`slot_clamp`). `above` are the mappings pending above
    /// this one, `p` this loop's.
    pub(super) fn register_slots(
        &self,
        regs: &RegisterTile,
        above: &[Pending],
        p: &Pending,
        head: &LoopHead<'_>,
        depth: usize,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let LoopHead {
            iterator,
            init: n_init,
            printed: [init, _, _],
            body,
            ..
        } = *head;
        let axis = (p.1 as u8).saturating_sub(b'x') as usize;
        let nt = regs.thread_dims;
        let count = regs.counts(self.plan.block)[nt - 1 - axis.min(nt - 1)];
        let b = self.plan.block[axis.min(2)];
        let r = format!("pf_r{}", p.1);
        // Thread mappings of the tile above this one that
        // lost their loop stay pending for the statements
        // below: each runs on the thread and slot that own
        // its element (`owned_statement`), not on index 0,
        // along the axes where the element moves
        // (`RegisterTile::owned_axes`).
        let owned_axes = regs.owned_axes();
        let (lost, others): (Vec<Pending>, Vec<Pending>) = above
            .iter()
            .cloned()
            .partition(|q| q.0 && owned_axes.contains(&q.1));
        let tested_for_tile = self
            .full_tile
            .is_some_and(|t| t.starts.iter().any(|(s, e)| s == iterator && e == n_init));
        let clamp = self.slot_loop_clamp(
            regs,
            head,
            nt - 1 - axis.min(nt - 1),
            count * i64::from(b),
            tested_for_tile,
        );
        let mut guard = self.guard(&others);
        if let Some(SlotClamp {
            upper: Some((upper, _)),
            lower,
            ..
        }) = &clamp
        {
            let start = lower.as_deref().unwrap_or(init);
            let any = format!("{start} <= {upper}");
            guard = if guard.is_empty() {
                any
            } else {
                format!("{guard} && {any}")
            };
        }
        if !guard.is_empty() {
            let _ = writeln!(out, "{pad}if ({guard})");
        }
        self.t.thread_loop(self, p.1, b, true, &pad, out);
        self.t.unroll(&pad, out);
        let tid = self.t.thread_index(p.1);
        let _ = writeln!(out, "{pad}for (int {r} = 0; {r} < {count}; {r}++) {{");
        let w = regs.group(self.plan.block, nt - 1 - axis.min(nt - 1));
        let point = slot_point(&tid, &r, i64::from(b), w);
        let mut slot_tests = self.slot_tests.to_vec();
        let value = match &clamp {
            Some(c) => {
                let slot = format!("pf_slot_{iterator}");
                let _ = writeln!(out, "{pad}  const pf_i {slot} = {point};");
                c.value(&slot, &mut slot_tests)
            }
            None => point,
        };
        let _ = writeln!(out, "{pad}  const pf_i {iterator} = {value};");
        let guard = self.slot_iteration_test(head, clamp.as_ref(), tested_for_tile);
        let _ = writeln!(out, "{pad}  if ({guard}) {{");
        let mut slot_loops = self.slot_loops.to_vec();
        slot_loops.push(iterator.to_string());
        let inner = Ctx {
            slot_tests: &slot_tests,
            slot_loops: &slot_loops,
            nosync: false,
            ..*self
        };
        inner.node(body, depth + 2, &lost, true, out);
        let _ = writeln!(out, "{pad}  }}");
        let _ = writeln!(out, "{pad}}}");
    }

    /// The clamp of a slot loop with head `head` along the tile's thread
    /// dimension `dim` of `slots` slots, in a tile not known to be full:
    /// onto the tensor's end (`slot_clamp`), or onto a bound or a start in
    /// other slots (`closed_clamp`; a start the full tile's test covered
    /// excepted). In a partial tile, a slot beyond the loop's bound runs
    /// the statements that allow it at the clamped point; the others test
    /// the slot (`SlotTest`).
    fn slot_loop_clamp(
        &self,
        regs: &RegisterTile,
        head: &LoopHead<'_>,
        dim: usize,
        slots: i64,
        tested_for_tile: bool,
    ) -> Option<SlotClamp> {
        if self.full_tile.is_some() || head.inc != &Expr::Int(1) {
            return None;
        }
        let at_end = self.slot_clamp(regs, dim, slots, head.iterator, head.cond);
        let closed = self.closed_clamp(regs, head.iterator, head.init, head.cond);
        let upper = match (at_end, &closed) {
            (Some(u), _) => Some((u, true)),
            (None, Some((Some(u), _))) => Some((u.clone(), false)),
            _ => None,
        };
        let lower = closed.and_then(|(_, l)| l).filter(|_| !tested_for_tile);
        (upper.is_some() || lower.is_some()).then_some(SlotClamp { upper, lower })
    }

    /// The test that a thread's slot is one of the loop's iterations: from
    /// its start, on its stride, within its condition. A full tile holds
    /// the condition for all its slots (`full_tile`), and the starts its
    /// test covered (`tested_for_tile`); a clamped slot is within what
    /// the clamp covers, where the loop has an iteration at all.
    fn slot_iteration_test(
        &self,
        head: &LoopHead<'_>,
        clamp: Option<&SlotClamp>,
        tested_for_tile: bool,
    ) -> String {
        let [init, cond, inc] = &head.printed;
        let iterator = head.iterator;
        let mut tests = Vec::new();
        let lower_clamped = clamp.is_some_and(|c| c.lower.is_some());
        if head.init != &Expr::Int(0) && !tested_for_tile && !lower_clamped {
            tests.push(format!("{iterator} >= {init}"));
        }
        if head.inc != &Expr::Int(1) {
            tests.push(format!(
                "({iterator} - ({init})) - ({inc}) * pf_floord({iterator} - ({init}), {inc}) == 0"
            ));
        }
        if clamp.is_none_or(|c| c.upper.is_none()) && self.full_tile.is_none() {
            tests.push(cond.to_string());
        }
        if tests.is_empty() {
            "1".to_string()
        } else {
            tests.join(" && ")
        }
    }

    /// The clamp of the slot loop `iterator` (start `init`, condition
    /// `cond`) of a tile whose gpu stage let statements run at any slot
    /// beyond the loop's points (`RegisterTile::slot_closed`: where the
    /// loop has no point, the slot's register is dead): onto its bound
    /// `it <= B` and, where it is not 0, its start. Only where the start
    /// or the bound names another slot (a triangle's diagonal tile, whose
    /// slots each test their own bound): a bound in the block values or a
    /// constant is one test for all of a thread's slots along the loop,
    /// and there the slots beyond it skip their work. None where the tile
    /// has no such statement or the bounds are of another form.
    fn closed_clamp(
        &self,
        regs: &RegisterTile,
        iterator: &str,
        init: &Expr,
        cond: &Expr,
    ) -> Option<(Option<String>, Option<String>)> {
        if regs.slot_closed.is_empty() || init.mentions(iterator) {
            return None;
        }
        let (op, bound) = upper_bound(iterator, cond)?;
        let names_a_slot = |e: &Expr| self.slot_loops.iter().any(|s| e.mentions(s));
        let upper = names_a_slot(bound).then(|| match op {
            Op::Le => self.e(bound),
            _ => format!("({}) - 1", self.e(bound)),
        });
        let lower = names_a_slot(init).then(|| self.e(init));
        (upper.is_some() || lower.is_some()).then_some((upper, lower))
    }

    /// `guard` and the tests that the thread's slots of a clamped register
    /// tile are points, those that `statement` must pass (all of them for
    /// `None`): a statement runs at a clamped slot where the tile's gpu
    /// stage allows it (`RegisterTile::clamp_safe` at the tensor's end,
    /// `RegisterTile::slot_closed` for any other bound).
    pub(super) fn with_slot_tests(&self, guard: String, statement: Option<&str>) -> String {
        let allowed = |t: &SlotTest| {
            let Some((regs, s)) = self.regs.zip(statement) else {
                return false;
            };
            if t.at_tensor_end {
                regs.clamp_safe.contains(s)
            } else {
                regs.slot_closed.contains(s)
            }
        };
        let tests: Vec<&str> = self
            .slot_tests
            .iter()
            .filter(|t| !allowed(t))
            .map(|t| t.test.as_str())
            .collect();
        if tests.is_empty() {
            return guard;
        }
        let slots = tests.join(" && ");
        if guard.is_empty() {
            slots
        } else {
            format!("{guard} && {slots}")
        }
    }
}
