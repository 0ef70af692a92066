//! Bounds of a slot loop's condition over all of a register tile's slots.
//!
//! A register region is printed twice when every counted thread loop of a
//! full tile runs all its slots (`Ctx::full_tile_test`): once without the
//! slots' bound tests, for the full tiles, once with them. A loop whose
//! condition names only its own iterator, the block iterators and the
//! parameters holds for every slot when it holds at the last one. A
//! triangular output (syrk's `C(i, j) where j <= i`) bounds one slot loop
//! by another slot's iterator as well: `c5 <= min(63, (c0 - c1) + c4)`.
//! The tile is full when the bound holds at the slots where it is tightest:
//! for `it <= E(s)` over the box `0 <= s_o <= S_o` of the other slots, when
//! `it`'s last slot is at most `min_s E(s)`. For a linear `E` the minimum
//! sits at a corner (`s_o = 0` where `E` grows with `s_o`, `S_o` where it
//! falls); a minimum of linear forms has the minimum of their minima. Only
//! the diagonal tiles then keep the tests (on the H100, syrk's per-slot
//! tests made every tile run 4x as long as the full square's).
//!
//! [`extreme`] bounds an expression over the box from the side asked for,
//! never from the wrong one: where it cannot be exact (the maximum of a
//! minimum), it gives a bound that is safe for the test it is used in.

use std::collections::BTreeMap;

use super::clamp::linear;
use crate::isl::ast::{Expr, Op};

/// A bound of `e` over the box `0 <= s <= slots[s]` of the slot iterators:
/// at most its minimum (`lowest`) or at least its maximum (otherwise), in
/// the names `e` has besides the slots. `None` where `e` is neither
/// linear in the slots nor a minimum or maximum of such forms.
pub(super) fn extreme(e: &Expr, slots: &BTreeMap<String, i64>, lowest: bool) -> Option<Expr> {
    match e {
        // min over the box of min(a, b) = min(min a, min b); and
        // max over the box of min(a, b) <= min(max a, max b).
        // max over the box of max(a, b) = max(max a, max b); and
        // min over the box of max(a, b) >= max(min a, min b).
        Expr::Op(op @ (Op::Min | Op::Max), args) => {
            let args = args
                .iter()
                .map(|a| extreme(a, slots, lowest))
                .collect::<Option<Vec<_>>>()?;
            Some(Expr::Op(*op, args))
        }
        _ => {
            let (terms, mut constant) = linear(e)?;
            let mut rest = BTreeMap::new();
            for (name, k) in terms {
                match slots.get(&name) {
                    // The corner: the slot's smallest value where the
                    // term pulls towards the side asked for, else its
                    // largest.
                    Some(&last) => constant += if (k > 0) == lowest { 0 } else { k * last },
                    None => {
                        rest.insert(name, k);
                    }
                }
            }
            Some(from_linear(rest, constant))
        }
    }
}

/// The expression of a linear form.
fn from_linear(terms: BTreeMap<String, i64>, constant: i64) -> Expr {
    let mut sum: Option<Expr> = None;
    for (name, k) in terms {
        let term = match k {
            1 => Expr::Id(name),
            -1 => Expr::Op(Op::Neg, vec![Expr::Id(name)]),
            k => Expr::Op(Op::Mul, vec![Expr::Int(k), Expr::Id(name)]),
        };
        sum = Some(match sum {
            None => term,
            Some(s) => Expr::Op(Op::Add, vec![s, term]),
        });
    }
    match sum {
        None => Expr::Int(constant),
        Some(s) if constant == 0 => s,
        Some(s) => Expr::Op(Op::Add, vec![s, Expr::Int(constant)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Expr {
        Expr::Id(s.to_string())
    }

    fn eval(e: &Expr, env: &BTreeMap<&str, i64>) -> i64 {
        match e {
            Expr::Int(c) => *c,
            Expr::Id(s) => env[s.as_str()],
            Expr::Op(op, a) => {
                let v: Vec<i64> = a.iter().map(|x| eval(x, env)).collect();
                match op {
                    Op::Add => v[0] + v[1],
                    Op::Sub => v[0] - v[1],
                    Op::Neg => -v[0],
                    Op::Mul => v[0] * v[1],
                    Op::Min => *v.iter().min().unwrap(),
                    Op::Max => *v.iter().max().unwrap(),
                    _ => unreachable!(),
                }
            }
        }
    }

    /// syrk's bound `min(63, (c0 - c1) + c4)` over `0 <= c4 <= 63`: its
    /// minimum is at `c4 = 0`, and the bounds from both sides hold against
    /// every slot, for block origins on, below and far below the diagonal.
    #[test]
    fn triangle_bounds_hold_against_every_slot() {
        let bound = Expr::Op(
            Op::Min,
            vec![
                Expr::Int(63),
                Expr::Op(
                    Op::Add,
                    vec![Expr::Op(Op::Sub, vec![id("c0"), id("c1")]), id("c4")],
                ),
            ],
        );
        let slots: BTreeMap<String, i64> = [("c4".to_string(), 63)].into_iter().collect();
        let low = extreme(&bound, &slots, true).unwrap();
        let high = extreme(&bound, &slots, false).unwrap();
        for (c0, c1) in [(0, 0), (64, 0), (640, 64), (64, 64)] {
            let mut env: BTreeMap<&str, i64> = [("c0", c0), ("c1", c1)].into_iter().collect();
            let values: Vec<i64> = (0..=63)
                .map(|c4| {
                    env.insert("c4", c4);
                    eval(&bound, &env)
                })
                .collect();
            env.remove("c4");
            assert_eq!(eval(&low, &env), *values.iter().min().unwrap());
            assert!(eval(&high, &env) >= *values.iter().max().unwrap());
        }
        // Full below the diagonal only: the last slot 63 is within the
        // tightest bound when c0 - c1 >= 63.
        let env: BTreeMap<&str, i64> = [("c0", 64), ("c1", 0)].into_iter().collect();
        assert!(eval(&low, &env) >= 63);
        let env: BTreeMap<&str, i64> = [("c0", 64), ("c1", 64)].into_iter().collect();
        assert!(eval(&low, &env) < 63);
    }

    /// A slot with a negative coefficient takes its last value for the
    /// minimum; a maximum of forms bounds its minimum from below.
    #[test]
    fn corners_follow_the_sign() {
        let slots: BTreeMap<String, i64> = [("s".to_string(), 10)].into_iter().collect();
        // N - s: smallest at s = 10.
        let e = Expr::Op(Op::Sub, vec![id("N"), id("s")]);
        let env: BTreeMap<&str, i64> = [("N", 100)].into_iter().collect();
        assert_eq!(eval(&extreme(&e, &slots, true).unwrap(), &env), 90);
        assert_eq!(eval(&extreme(&e, &slots, false).unwrap(), &env), 100);
        // max(s - 5, 5 - s) over 0..=10: minimum 0; the bound is at most 0.
        let e = Expr::Op(
            Op::Max,
            vec![
                Expr::Op(Op::Sub, vec![id("s"), Expr::Int(5)]),
                Expr::Op(Op::Sub, vec![Expr::Int(5), id("s")]),
            ],
        );
        let env = BTreeMap::new();
        assert!(eval(&extreme(&e, &slots, true).unwrap(), &env) <= 0);
        // Not linear in the slot: no bound.
        let e = Expr::Op(Op::FloorDiv, vec![id("s"), Expr::Int(2)]);
        assert_eq!(extreme(&e, &slots, true), None);
    }
}
