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

use super::constant_trip;
use crate::gpu::mapping::parse_mapping_mark;
use crate::isl::ast::{Expr, Node};

/// `node` with every unmapped loop below a `registers` mark whose bound is
/// a constant clipped by an expression split as the module documentation
/// shows.
pub(super) fn split(node: &Node) -> Node {
    walk(node, false, &[])
}

fn walk(node: &Node, in_registers: bool, mapped: &[String]) -> Node {
    match node {
        Node::Mark { name, body } => {
            let mut inner = mapped.to_vec();
            if let Some((_, _, iterator)) = parse_mapping_mark(name) {
                inner.push(iterator);
            }
            Node::Mark {
                name: name.clone(),
                body: Box::new(walk(body, in_registers || name == "registers", &inner)),
            }
        }
        Node::For {
            iterator,
            init,
            cond,
            inc,
            body,
        } => {
            let body = walk(body, in_registers, mapped);
            let whole = |cond: &Expr, body: Node| Node::For {
                iterator: iterator.clone(),
                init: init.clone(),
                cond: cond.clone(),
                inc: inc.clone(),
                body: Box::new(body),
            };
            let split = (in_registers && !mapped.contains(iterator))
                .then(|| full_test(iterator, init, cond, inc))
                .flatten();
            match split {
                Some((full_bound, test)) => Node::If {
                    cond: test,
                    then: Box::new(whole(&full_bound, body.clone())),
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
            then: Box::new(walk(then, in_registers, mapped)),
            otherwise: otherwise
                .as_ref()
                .map(|o| Box::new(walk(o, in_registers, mapped))),
        },
        Node::Block(v) => Node::Block(v.iter().map(|c| walk(c, in_registers, mapped)).collect()),
        Node::User { .. } => node.clone(),
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
        let out = split(&registers(clipped("c3")));
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
        assert_eq!(split(&clipped("c3")), clipped("c3"));
        // A loop mapped to threads inside one.
        let mapped = registers(Node::Mark {
            name: "thread_x_3".to_string(),
            body: Box::new(clipped("c3")),
        });
        assert_eq!(split(&mapped), mapped);
        // A clip that names the iterator itself.
        let mut own = clipped("c3");
        if let Node::For { cond, .. } = &mut own {
            *cond = Expr::Op(
                Op::Le,
                vec![id("c3"), Expr::Op(Op::Min, vec![Expr::Int(15), id("c3")])],
            );
        }
        let own = registers(own);
        assert_eq!(split(&own), own);
    }
}
