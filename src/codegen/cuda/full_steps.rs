//! A register tile's step loop split into its full tiles and the last,
//! partial one.
//!
//! Inside a register tile (a gemm's accumulators), isl prints the steps
//! of a reduction tile clipped at the end of the reduction:
//!
//! ```text
//!   for (c3 = 0; c3 <= min(15, K - 1 - c2); c3 += 1)   // k inside a k tile
//! ```
//!
//! Where the reduction's extent is a multiple of the tile, isl prints
//! `c3 <= 15` instead, and the compiler unrolls the constant loop and
//! schedules a thread's loads from shared memory across its steps. With
//! the bound left to run time it does neither: on the H100, 2mm at
//! 2000 x 2500 x 3000 ran at 8.8 TFLOP/s against 26.5 at the nearest
//! sizes on the tile grid (`bench/suite/variants.sh`). Every tile but the
//! last is full, so
//!
//! ```text
//!   for (it = a; it <= min(C, E); it += s) B
//!     ==  if (L <= E) { for (it = a; it <= C; it += s) B }
//!         else        { for (it = a; it <= min(C, E); it += s) B }
//! ```
//!
//! with `L` the last iteration `it <= C` allows, exactly when `E` does not
//! depend on `it` (then `it <= E` holds at every iteration up to `L` if it
//! holds at `L`; the same for `<`). The first loop has a constant trip
//! count. Applied to the AST both the CUDA and its CPU emulation print,
//! so the emulation runs both loops.
//!
//! The same holds for a test on the slots inside the step loop. A product
//! over a triangle in its reduction index (symm's `A(i, k) where k < i`)
//! tests every slot row at every step, `if (c4 >= max(0, c2 + c3 + 1 -
//! c0))`, though only the steps of the tile on the diagonal need it. Such
//! a test `P(s, it)` over the slots `s` (each `0 <= s_o <= S_o`, the tile's
//! box) and the steps `0 <= it <= L` holds everywhere when it holds at the
//! corner where it is tightest (`slot_box::extreme`: for `a >= b`, the
//! minimum of `a` over the box at least the maximum of `b`). That test
//! names only what is fixed outside the step loop, so it joins `L <= E`,
//! and the full copy runs the test's `then` branch without the test. With
//! symm's 128-row tiles, all steps but the eight on the diagonal run so.

use std::collections::BTreeMap;

use super::{constant_trip, slot_box};
use crate::gpu::mapping::parse_mapping_mark;
use crate::isl::ast::{Expr, Node, Op};

/// The last slot of the register tile along each thread axis (`x`, `y`,
/// `z`): a thread loop's iterator runs over at most `0..=last` in the
/// tile's box.
pub(super) type LastSlots = [Option<i64>; 3];

/// `node` with every unmapped loop below a `registers` mark whose bound is
/// a constant clipped by an expression, or whose body tests the slots, split
/// as the module documentation shows.
pub(super) fn split(node: &Node, slots: &LastSlots) -> Node {
    Walk { slots }.walk(node, false, &[])
}

struct Walk<'a> {
    slots: &'a LastSlots,
}

impl Walk<'_> {
    fn walk(&self, node: &Node, in_registers: bool, mapped: &[String]) -> Node {
        match node {
            Node::Mark { name, body } => {
                let mut inner = mapped.to_vec();
                if let Some((_, _, iterator)) = parse_mapping_mark(name) {
                    inner.push(iterator);
                }
                Node::Mark {
                    name: name.clone(),
                    body: Box::new(self.walk(body, in_registers || name == "registers", &inner)),
                }
            }
            Node::For {
                iterator,
                init,
                cond,
                inc,
                body,
            } => {
                let body = self.walk(body, in_registers, mapped);
                let whole = |cond: &Expr, body: Node| Node::For {
                    iterator: iterator.clone(),
                    init: init.clone(),
                    cond: cond.clone(),
                    inc: inc.clone(),
                    body: Box::new(body),
                };
                let split = (in_registers && !mapped.contains(iterator))
                    .then(|| self.full_copy(iterator, init, cond, inc, &body))
                    .flatten();
                match split {
                    Some((full_bound, test, full_body)) => Node::If {
                        cond: test,
                        then: Box::new(Node::For {
                            iterator: iterator.clone(),
                            init: match init {
                                Expr::Int(_) => init.clone(),
                                _ => Expr::Int(0),
                            },
                            cond: full_bound,
                            inc: inc.clone(),
                            body: Box::new(full_body),
                        }),
                        otherwise: Some(Box::new(whole(cond, body))),
                    },
                    None => whole(cond, body),
                }
            }
            Node::If {
                cond,
                then,
                otherwise,
            } => Node::If {
                cond: cond.clone(),
                then: Box::new(self.walk(then, in_registers, mapped)),
                otherwise: otherwise
                    .as_ref()
                    .map(|o| Box::new(self.walk(o, in_registers, mapped))),
            },
            Node::Block(v) => Node::Block(
                v.iter()
                    .map(|c| self.walk(c, in_registers, mapped))
                    .collect(),
            ),
            Node::User { .. } => node.clone(),
        }
    }

    /// For a step loop with a constant bound (module documentation): the
    /// bound, the test that selects the full copy, and the full copy's body
    /// (the slot tests that hold at every step dropped); `None` where there
    /// is neither a clip nor such a slot test.
    fn full_copy(
        &self,
        iterator: &str,
        init: &Expr,
        cond: &Expr,
        inc: &Expr,
        body: &Node,
    ) -> Option<(Expr, Expr, Node)> {
        let mut tests = Vec::new();
        // A start that the block or an outer step moves (`max(0, (c0 - c2) +
        // 1)`, the first step of a tile on the diagonal of `k > i`): the full
        // copy starts at 0 where the start is 0.
        let zero = Expr::Int(0);
        let init = match init {
            Expr::Int(_) => init,
            moved if !moved.mentions(iterator) => {
                tests.push(Expr::Op(Op::Eq, vec![moved.clone(), zero.clone()]));
                &zero
            }
            _ => return None,
        };
        let from_start = tests.len();
        let (bound, clip, trips) = constant_trip(iterator, init, cond, inc)?;
        let (Expr::Int(first), Expr::Int(step)) = (init, inc) else {
            return None;
        };
        if trips < 1 {
            return None;
        }
        let last = first + (trips - 1) * step;
        if clip.is_some() {
            let (_, test) = full_test(iterator, init, cond, inc)?;
            tests.push(test);
        }
        let mut full_body = body.clone();
        if *first == 0 {
            let mut inner = Vec::new();
            full_body = self.drop_slot_tests(
                body,
                iterator,
                last,
                &BTreeMap::new(),
                &mut inner,
                &mut tests,
            );
        }
        // A start alone gains nothing: the copy would run the same steps.
        if tests.len() == from_start {
            return None;
        }
        let test = tests
            .into_iter()
            .reduce(|a, b| Expr::Op(Op::And, vec![a, b]))?;
        Some((bound, test, full_body))
    }

    /// `node` without the tests (ifs without an else) that hold for every slot
    /// of the box and every step `0 <= it <= last`, each such test's condition
    /// over the fixed names added to `tests`. `slots` are the thread loops'
    /// iterators on the way with their last slot; `inner` the other loops'
    /// iterators on the way, which a test may not name.
    fn drop_slot_tests(
        &self,
        node: &Node,
        it: &str,
        last: i64,
        slots: &BTreeMap<String, i64>,
        inner: &mut Vec<String>,
        tests: &mut Vec<Expr>,
    ) -> Node {
        match node {
            Node::Mark { name, body } => {
                let mut slots = slots.clone();
                if let Some((true, axis, iterator)) = parse_mapping_mark(name) {
                    let a = (axis as u8).saturating_sub(b'x') as usize;
                    if let Some(Some(l)) = self.slots.get(a) {
                        slots.insert(iterator, *l);
                    }
                }
                Node::Mark {
                    name: name.clone(),
                    body: Box::new(self.drop_slot_tests(body, it, last, &slots, inner, tests)),
                }
            }
            Node::For {
                iterator,
                init,
                cond,
                inc,
                body,
            } => {
                let counted = !slots.contains_key(iterator);
                // A slot loop's start and bound are its slots' tests (the
                // printer runs every slot of the box and tests its point).
                let (init, cond) = if counted {
                    (init.clone(), cond.clone())
                } else {
                    self.slot_bounds(iterator, init, cond, it, last, slots, inner, tests)
                };
                if counted {
                    inner.push(iterator.clone());
                }
                let body = self.drop_slot_tests(body, it, last, slots, inner, tests);
                if counted {
                    inner.pop();
                }
                Node::For {
                    iterator: iterator.clone(),
                    init,
                    cond,
                    inc: inc.clone(),
                    body: Box::new(body),
                }
            }
            Node::If {
                cond,
                then,
                otherwise,
            } => {
                let then = self.drop_slot_tests(then, it, last, slots, inner, tests);
                let names = cond.ids();
                let free = names.iter().all(|n| !inner.contains(n));
                // A test of a slot (a test of the step alone, such as a
                // statement's `c3 <= 15`, cannot hold at every step).
                let moves = names.iter().any(|n| slots.contains_key(n));
                let mut the_box = slots.clone();
                the_box.insert(it.to_string(), last);
                match (otherwise, free && moves) {
                    (None, true) => match everywhere(cond, &the_box) {
                        Some(test) => {
                            if !tests.contains(&test) {
                                tests.push(test);
                            }
                            then
                        }
                        None => Node::If {
                            cond: cond.clone(),
                            then: Box::new(then),
                            otherwise: None,
                        },
                    },
                    _ => Node::If {
                        cond: cond.clone(),
                        then: Box::new(then),
                        otherwise: otherwise.as_ref().map(|o| {
                            Box::new(self.drop_slot_tests(o, it, last, slots, inner, tests))
                        }),
                    },
                }
            }
            Node::Block(v) => Node::Block(
                v.iter()
                    .map(|c| self.drop_slot_tests(c, it, last, slots, inner, tests))
                    .collect(),
            ),
            Node::User { .. } => node.clone(),
        }
    }
}

impl Walk<'_> {
    /// A slot loop's start and bound in the full copy: a start that moves
    /// with the step or the other slots (`max(0, c2 + c3 + 1 - c0)`, a
    /// triangle in the reduction index) becomes 0 where it is 0 over the
    /// whole box; a bound `s <= min(C, E)` with a moving `E` becomes
    /// `s <= C` where `E >= C` over the whole box. Each such fact joins
    /// `tests`; anything else stays as isl printed it.
    #[allow(clippy::too_many_arguments)]
    fn slot_bounds(
        &self,
        slot: &str,
        init: &Expr,
        cond: &Expr,
        it: &str,
        last: i64,
        slots: &BTreeMap<String, i64>,
        inner: &[String],
        tests: &mut Vec<Expr>,
    ) -> (Expr, Expr) {
        let mut the_box = slots.clone();
        the_box.remove(slot);
        the_box.insert(it.to_string(), last);
        // What moves with the step or the other slots. (A bound in the
        // other slots alone is also the whole tile's, `full_tile_test`;
        // tested again per step it made syr2k 1.45x faster on the H100,
        // 2,970 against 2,030 us, for reasons not analysed.)
        let usable = |e: &Expr| {
            let names = e.ids();
            !e.mentions(slot)
                && names.iter().all(|n| !inner.contains(n))
                && names.iter().any(|n| the_box.contains_key(n))
        };
        let add = |t: Expr, tests: &mut Vec<Expr>| {
            if !tests.contains(&t) {
                tests.push(t);
            }
        };
        let mut new_init = init.clone();
        if usable(init) {
            let low = slot_box::extreme(init, &the_box, true);
            let high = slot_box::extreme(init, &the_box, false);
            if let (Some(low), Some(high)) = (low, high) {
                add(Expr::Op(Op::Ge, vec![low, Expr::Int(0)]), tests);
                add(Expr::Op(Op::Le, vec![high, Expr::Int(0)]), tests);
                new_init = Expr::Int(0);
            }
        }
        let mut new_cond = cond.clone();
        if let Expr::Op(op @ (Op::Le | Op::Lt), a) = cond {
            if let [Expr::Id(s), Expr::Op(Op::Min, m)] = a.as_slice() {
                if let ([Expr::Int(c), e] | [e, Expr::Int(c)], true) = (m.as_slice(), s == slot) {
                    if usable(e) {
                        if let Some(low) = slot_box::extreme(e, &the_box, true) {
                            add(Expr::Op(Op::Ge, vec![low, Expr::Int(*c)]), tests);
                            new_cond = Expr::Op(*op, vec![Expr::Id(s.clone()), Expr::Int(*c)]);
                        }
                    }
                }
            }
        }
        (new_init, new_cond)
    }
}

/// A condition over the fixed names that implies `cond` at every point of
/// the box `0 <= v <= the_box[v]`: for `a >= b`, the least `a` at least
/// the greatest `b` (`slot_box::extreme` bounds each from the safe side);
/// a conjunction term by term. `None` for any other condition.
fn everywhere(cond: &Expr, the_box: &BTreeMap<String, i64>) -> Option<Expr> {
    let Expr::Op(op, a) = cond else {
        return None;
    };
    let low = |e: &Expr| slot_box::extreme(e, the_box, true);
    let high = |e: &Expr| slot_box::extreme(e, the_box, false);
    match (op, a.as_slice()) {
        (Op::And, [x, y]) => Some(Expr::Op(
            Op::And,
            vec![everywhere(x, the_box)?, everywhere(y, the_box)?],
        )),
        (Op::Ge, [x, y]) => Some(Expr::Op(Op::Ge, vec![low(x)?, high(y)?])),
        (Op::Gt, [x, y]) => Some(Expr::Op(Op::Gt, vec![low(x)?, high(y)?])),
        (Op::Le, [x, y]) => Some(Expr::Op(Op::Le, vec![high(x)?, low(y)?])),
        (Op::Lt, [x, y]) => Some(Expr::Op(Op::Lt, vec![high(x)?, low(y)?])),
        _ => None,
    }
}

/// For a loop `it = a; it <= min(C, E); it += s` (or `<`) with constants
/// `a`, `s > 0`, `C` and at least one iteration: the constant bound
/// `it <= C` and the test that the clip `E` allows every iteration up to
/// the last one `C` allows (`L <= E`). None for any other loop, and where
/// `E` names the iterator.
fn full_test(iterator: &str, init: &Expr, cond: &Expr, inc: &Expr) -> Option<(Expr, Expr)> {
    let (bound, Some(rest), trips) = constant_trip(iterator, init, cond, inc)? else {
        return None;
    };
    let (Expr::Int(first), Expr::Int(step)) = (init, inc) else {
        return None;
    };
    let Expr::Op(op, args) = &rest else {
        return None;
    };
    let [_, clip] = args.as_slice() else {
        return None;
    };
    if trips < 1 || clip.mentions(iterator) {
        return None;
    }
    let last = first + (trips - 1) * step;
    Some((bound, Expr::Op(*op, vec![Expr::Int(last), clip.clone()])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isl::ast::Op;

    fn id(s: &str) -> Expr {
        Expr::Id(s.to_string())
    }

    /// `for (it = 0; it <= min(15, -c2 + 2999); it += 1) S(it)`.
    fn clipped(it: &str) -> Node {
        Node::For {
            iterator: it.to_string(),
            init: Expr::Int(0),
            cond: Expr::Op(
                Op::Le,
                vec![
                    id(it),
                    Expr::Op(
                        Op::Min,
                        vec![
                            Expr::Int(15),
                            Expr::Op(
                                Op::Add,
                                vec![Expr::Op(Op::Neg, vec![id("c2")]), Expr::Int(2999)],
                            ),
                        ],
                    ),
                ],
            ),
            inc: Expr::Int(1),
            body: Box::new(Node::User {
                statement: "S0".to_string(),
                args: vec![id(it)],
            }),
        }
    }

    fn registers(body: Node) -> Node {
        Node::Mark {
            name: "registers".to_string(),
            body: Box::new(body),
        }
    }

    #[test]
    fn a_clipped_step_loop_in_registers_gets_a_full_copy() {
        let out = split(&registers(clipped("c3")), &[None; 3]);
        let Node::Mark { body, .. } = out else {
            panic!("mark lost");
        };
        let Node::If {
            cond,
            then,
            otherwise,
        } = *body
        else {
            panic!("not split: {body:?}");
        };
        // 15 <= -c2 + 2999: the last step of the constant bound is allowed.
        let Expr::Op(Op::Le, args) = &cond else {
            panic!("{cond:?}");
        };
        assert_eq!(args[0], Expr::Int(15));
        assert!(args[1].mentions("c2"));
        let Node::For { cond: full, .. } = *then else {
            panic!("full copy is not a loop");
        };
        assert_eq!(full, Expr::Op(Op::Le, vec![id("c3"), Expr::Int(15)]));
        assert_eq!(otherwise.map(|o| *o), Some(clipped("c3")));
    }

    #[test]
    fn loops_outside_registers_mapped_or_self_clipped_stay() {
        // Outside a register tile.
        assert_eq!(split(&clipped("c3"), &[None; 3]), clipped("c3"));
        // A loop mapped to threads inside one.
        let mapped = registers(Node::Mark {
            name: "thread_x_3".to_string(),
            body: Box::new(clipped("c3")),
        });
        assert_eq!(split(&mapped, &[None; 3]), mapped);
        // A clip that names the iterator itself.
        let mut own = clipped("c3");
        if let Node::For { cond, .. } = &mut own {
            *cond = Expr::Op(
                Op::Le,
                vec![id("c3"), Expr::Op(Op::Min, vec![Expr::Int(15), id("c3")])],
            );
        }
        let own = registers(own);
        assert_eq!(split(&own, &[None; 3]), own);
    }
}
