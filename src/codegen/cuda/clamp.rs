//! A partial register tile's slots clamped onto the tensor.
//!
//! A block whose tile is cut by the end of a tensor (2000 rows in tiles
//! of 128) runs the register region's copy with bound tests: each of a
//! thread's slots tests its loop's bound, and the compiler branches
//! around every slot's loads and updates (`if (c4 <= min(127, 1999 -
//! c0))` inside the unrolled slot loops). On the H100 those blocks ran
//! several times as long as full ones, and as the last wave they set the
//! kernel's time: the f32 MLP at 2000 rows took 4.2 ms against 1.5 ms at
//! 2048 (`bench/suite/variants.sh`).
//!
//! Along a thread axis where the tile's element is `b + t` (block origin
//! plus slot) and the loop's bound is the tensor's last index `n - 1 - b`,
//! a slot beyond the bound holds an element outside the tensor: its
//! register is never stored (the store tests the element) and no
//! statement owns it. Such a slot can run the statements that allow it
//! (`RegisterTile::clamp_safe`: they write only the register and read
//! nothing the kernel writes) at the clamped point `min(slot, n - 1 - b)`,
//! a valid point, into its own dead register, without a test; the other
//! statements test the slot. The slots then run straight-line code, as in
//! a full tile.

use std::collections::BTreeMap;

use super::{upper_bound, Ctx};
use crate::gpu::registers::RegisterTile;
use crate::isl::ast::{Expr, Op};

/// A linear form: coefficients by identifier, and a constant.
type Linear = (BTreeMap<String, i64>, i64);

impl Ctx<'_> {
    /// The bound (printed) to clamp the slots of the register tile's
    /// thread dimension `dim` to, for its loop `iterator` with condition
    /// `cond`, where a slot beyond the condition is outside the tensor
    /// (module documentation): `it <= X` (or `it < X`, then `X - 1`)
    /// with `X` the tensor's last index along the element's dimension
    /// minus the block's origin, or the minimum of that and constants no
    /// slot exceeds (`slots - 1` or more), or such a constant alone. None
    /// for any other condition.
    pub(super) fn slot_clamp(
        &self,
        regs: &RegisterTile,
        dim: usize,
        slots: i64,
        iterator: &str,
        cond: &Expr,
    ) -> Option<String> {
        let (op, bound) = upper_bound(iterator, cond)?;
        let shift = if op == Op::Lt { 1 } else { 0 };
        let last = self.last_index(regs, dim)?;
        let extent_bound =
            |e: &Expr| linear(e).is_some_and(|(terms, c)| terms == last.0 && c - shift == last.1);
        let never_binds = |e: &Expr| matches!(e, Expr::Int(c) if c - shift >= slots - 1);
        let ok = match bound {
            Expr::Op(Op::Min, args) => {
                args.iter().any(extent_bound)
                    && args.iter().all(|e| extent_bound(e) || never_binds(e))
            }
            // A constant no slot exceeds: the test always holds, though
            // the compiler cannot know it (it does not know the block's
            // size), and would branch around every slot.
            e => extent_bound(e) || never_binds(e),
        };
        ok.then(|| match op {
            Op::Le => self.e(bound),
            _ => format!("({}) - 1", self.e(bound)),
        })
    }

    /// `n - 1 - b` as a linear form in the AST's names: `n` the extent of
    /// the tensor dimension whose element is `pf_b<dim> + pf_t<dim>`, `b`
    /// the block iterator of `dim`. None where no dimension's element is
    /// that sum.
    fn last_index(&self, regs: &RegisterTile, dim: usize) -> Option<Linear> {
        let block = regs.block_iterators.get(dim)?;
        let element: BTreeMap<String, i64> = [(format!("pf_b{dim}"), 1), (format!("pf_t{dim}"), 1)]
            .into_iter()
            .collect();
        let d = regs
            .element
            .iter()
            .position(|e| linear(e) == Some((element.clone(), 0)))?;
        let extent = &self.scop.tensor(&regs.tensor)?.shape[d];
        let known = self.program.known_params();
        let mut terms = BTreeMap::new();
        let mut constant = extent.constant - 1;
        for (name, k) in &extent.terms {
            match known.get(name) {
                Some(v) => constant += k * v,
                None => *terms.entry(name.clone()).or_insert(0) += k,
            }
        }
        *terms.entry(block.clone()).or_insert(0) -= 1;
        terms.retain(|_, k| *k != 0);
        Some((terms, constant))
    }
}

/// `e` as a linear form, where it is one (sums, differences, negations
/// and products by constants of identifiers and constants).
pub(super) fn linear(e: &Expr) -> Option<Linear> {
    let scaled = |(t, c): Linear, k: i64| -> Linear {
        (t.into_iter().map(|(n, v)| (n, v * k)).collect(), c * k)
    };
    let sum = |(mut t, c): Linear, (u, d): Linear| -> Linear {
        for (n, v) in u {
            *t.entry(n).or_insert(0) += v;
        }
        t.retain(|_, v| *v != 0);
        (t, c + d)
    };
    match e {
        Expr::Int(c) => Some((BTreeMap::new(), *c)),
        Expr::Id(s) => Some(([(s.clone(), 1)].into_iter().collect(), 0)),
        Expr::Op(Op::Add, a) => {
            let [x, y] = a.as_slice() else { return None };
            Some(sum(linear(x)?, linear(y)?))
        }
        Expr::Op(Op::Sub, a) => {
            let [x, y] = a.as_slice() else { return None };
            Some(sum(linear(x)?, scaled(linear(y)?, -1)))
        }
        Expr::Op(Op::Neg, a) => {
            let [x] = a.as_slice() else { return None };
            Some(scaled(linear(x)?, -1))
        }
        Expr::Op(Op::Mul, a) => match a.as_slice() {
            [Expr::Int(k), x] | [x, Expr::Int(k)] => Some(scaled(linear(x)?, *k)),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Expr {
        Expr::Id(s.to_string())
    }

    #[test]
    fn linear_forms_of_isl_bounds() {
        // -c0 + 1999
        let e = Expr::Op(
            Op::Add,
            vec![Expr::Op(Op::Neg, vec![id("c0")]), Expr::Int(1999)],
        );
        assert_eq!(
            linear(&e),
            Some(([("c0".to_string(), -1)].into_iter().collect(), 1999))
        );
        // 2 * (N - c1) - 1
        let e = Expr::Op(
            Op::Sub,
            vec![
                Expr::Op(
                    Op::Mul,
                    vec![Expr::Int(2), Expr::Op(Op::Sub, vec![id("N"), id("c1")])],
                ),
                Expr::Int(1),
            ],
        );
        let (terms, c) = linear(&e).unwrap();
        assert_eq!((terms["N"], terms["c1"], c), (2, -2, -1));
        // A minimum is not linear.
        assert_eq!(linear(&Expr::Op(Op::Min, vec![id("a"), id("b")])), None);
        // Terms that cancel are dropped.
        let e = Expr::Op(Op::Sub, vec![id("a"), id("a")]);
        assert_eq!(linear(&e), Some((BTreeMap::new(), 0)));
    }
}
