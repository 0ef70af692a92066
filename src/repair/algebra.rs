//! The algebra of a repair: the reduction body `g`, its inverse in the
//! constant argument, and the repair function `h` of Theorem 4.3,
//!
//! ```text
//!   y = g(r, c)  invertible in c  =>  c = g_c^{-1}(r, y)
//!   h(t, r, r') = g(r', g_c^{-1}(r, t))                         (Eq. 6)
//! ```
//!
//! with `r` a vector (several reduce predecessors at once). Expressions are
//! egg terms over the language [`Math`]: symbols `t` (the target's partial
//! result), `r0, r1, ..` (predecessor values at the previous step), `q0, q1,
//! ..` (the same predecessors at the current step), `c0, c1, ..` (the
//! constant inputs: each maximal subterm of the body that reads no
//! predecessor), and the identities `zero`, `one`, `ninf`, `pinf`.

use egg::{define_language, Id, Language, RecExpr, Symbol};

define_language! {
    /// Real arithmetic with the functions a repair may invert.
    pub enum Math {
        "+" = Add([Id; 2]),
        "-" = Sub([Id; 2]),
        "*" = Mul([Id; 2]),
        "/" = Div([Id; 2]),
        "neg" = Neg(Id),
        "recip" = Recip(Id),
        "exp" = Exp(Id),
        "log" = Log(Id),
        "max" = Max([Id; 2]),
        "min" = Min([Id; 2]),
        Symbol(Symbol),
    }
}

/// A term of [`Math`].
pub type Term = RecExpr<Math>;

/// The reducer `f` of a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reducer {
    Sum,
    Prod,
    Max,
    Min,
}

impl Reducer {
    /// `f(a, b)` as a term node.
    pub fn node(self, a: Id, b: Id) -> Math {
        match self {
            Reducer::Sum => Math::Add([a, b]),
            Reducer::Prod => Math::Mul([a, b]),
            Reducer::Max => Math::Max([a, b]),
            Reducer::Min => Math::Min([a, b]),
        }
    }
    /// The identity element's symbol.
    pub fn identity(self) -> &'static str {
        match self {
            Reducer::Sum => "zero",
            Reducer::Prod => "one",
            Reducer::Max => "ninf",
            Reducer::Min => "pinf",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Reducer::Sum => "+",
            Reducer::Prod => "*",
            Reducer::Max => "max",
            Reducer::Min => "min",
        }
    }
}

/// Copies the subterm of `src` rooted at `at` into `dst`, replacing the
/// symbols `subst` names; returns the new root.
pub fn graft(dst: &mut Term, src: &Term, at: Id, subst: &dyn Fn(&str) -> Option<Id>) -> Id {
    let node = &src[at];
    match node {
        Math::Symbol(s) => match subst(s.as_str()) {
            Some(id) => id,
            None => dst.add(node.clone()),
        },
        _ => {
            let n = node.clone().map_children(|c| graft(dst, src, c, subst));
            dst.add(n)
        }
    }
}

/// The root of a term.
pub fn root(t: &Term) -> Id {
    Id::from(t.as_ref().len() - 1)
}

/// Whether symbol `s` occurs under `at`, and how often.
pub fn occurrences(t: &Term, at: Id, s: &str) -> usize {
    match &t[at] {
        Math::Symbol(x) => usize::from(x.as_str() == s),
        n => n.children().iter().map(|&c| occurrences(t, c, s)).sum(),
    }
}

/// Every symbol under `at` that starts with `prefix`.
pub fn symbols_with_prefix(t: &Term, prefix: &str) -> Vec<String> {
    let mut out: Vec<String> = t
        .as_ref()
        .iter()
        .filter_map(|n| match n {
            Math::Symbol(s) if s.as_str().starts_with(prefix) => Some(s.as_str().to_string()),
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Solves `y = g` for the symbol `c`, which must occur exactly once in `g`:
/// walks from the root to `c`, undoing each operation on the way
/// (`+`, `-`, `*`, `/`, `neg`, `recip`, `exp`, `log`). Returns the term of
/// `c` in `y` and the other symbols of `g`, or why no inverse exists.
pub fn invert(g: &Term, c: &str, y: &str) -> Result<Term, String> {
    let n = occurrences(g, root(g), c);
    if n == 0 {
        return Err(format!("`{c}` does not occur in g"));
    }
    if n > 1 {
        return Err(format!(
            "g uses the constant input {c} {n} times, so it is not invertible in it (as in (c - x)^2)"
        ));
    }
    let mut out = Term::default();
    let mut acc = out.add(Math::Symbol(Symbol::from(y)));
    let mut at = root(g);
    loop {
        let here = g[at].clone();
        let side = |i: Id| occurrences(g, i, c) > 0;
        let copy = |out: &mut Term, i: Id| graft(out, g, i, &|_| None);
        match here {
            Math::Symbol(_) => break,
            Math::Add([a, b]) => {
                let (inner, other) = if side(a) { (a, b) } else { (b, a) };
                let o = copy(&mut out, other);
                acc = out.add(Math::Sub([acc, o]));
                at = inner;
            }
            Math::Sub([a, b]) => {
                if side(a) {
                    let o = copy(&mut out, b);
                    acc = out.add(Math::Add([acc, o]));
                    at = a;
                } else {
                    let o = copy(&mut out, a);
                    acc = out.add(Math::Sub([o, acc]));
                    at = b;
                }
            }
            Math::Mul([a, b]) => {
                let (inner, other) = if side(a) { (a, b) } else { (b, a) };
                let o = copy(&mut out, other);
                acc = out.add(Math::Div([acc, o]));
                at = inner;
            }
            Math::Div([a, b]) => {
                if side(a) {
                    let o = copy(&mut out, b);
                    acc = out.add(Math::Mul([acc, o]));
                    at = a;
                } else {
                    let o = copy(&mut out, a);
                    acc = out.add(Math::Div([o, acc]));
                    at = b;
                }
            }
            Math::Neg(a) => {
                acc = out.add(Math::Neg(acc));
                at = a;
            }
            Math::Recip(a) => {
                acc = out.add(Math::Recip(acc));
                at = a;
            }
            Math::Exp(a) => {
                acc = out.add(Math::Log(acc));
                at = a;
            }
            Math::Log(a) => {
                acc = out.add(Math::Exp(acc));
                at = a;
            }
            Math::Max(_) | Math::Min(_) => {
                return Err(format!(
                    "g takes a max or min of the constant input {c}, which is not invertible"
                ))
            }
        }
    }
    // The last node added is `acc`: the root of the inverse.
    debug_assert_eq!(root(&out), acc);
    Ok(out)
}

/// `h(t, r, r') = g(r', g_c^{-1}(r, t))` for the constant symbol `c`:
/// `g` with every `r<k>` renamed `q<k>` and `c` replaced by its inverse.
pub fn repair_function(g: &Term, c: &str) -> Result<Term, String> {
    let inverse = invert(g, c, "t")?;
    let mut h = Term::default();
    let inv_root = graft(&mut h, &inverse, root(&inverse), &|_| None);
    let c_owned = c.to_string();
    let mut renamed: Vec<(String, Id)> = Vec::new();
    for r in symbols_with_prefix(g, "r") {
        let q = format!("q{}", &r[1..]);
        let id = h.add(Math::Symbol(Symbol::from(q.as_str())));
        renamed.push((r, id));
    }
    graft(&mut h, g, root(g), &|s| {
        if s == c_owned {
            Some(inv_root)
        } else {
            renamed.iter().find(|(r, _)| r == s).map(|(_, id)| *id)
        }
    });
    Ok(h)
}

/// `term` with symbol `s` replaced by the term `by`.
pub fn substitute(term: &Term, s: &str, by: &Term) -> Term {
    let mut out = Term::default();
    let by_root = graft(&mut out, by, root(by), &|_| None);
    graft(&mut out, term, root(term), &|x| (x == s).then_some(by_root));
    out
}

/// `term` with symbols renamed by `rename`.
pub fn rename(term: &Term, rename: &dyn Fn(&str) -> Option<String>) -> Term {
    let mut out = Term::default();
    let mut ids: Vec<(String, Id)> = Vec::new();
    for n in term.as_ref() {
        if let Math::Symbol(s) = n {
            if let Some(to) = rename(s.as_str()) {
                if ids.iter().all(|(k, _)| k != s.as_str()) {
                    let id = out.add(Math::Symbol(Symbol::from(to.as_str())));
                    ids.push((s.as_str().to_string(), id));
                }
            }
        }
    }
    graft(&mut out, term, root(term), &|x| {
        ids.iter().find(|(k, _)| k == x).map(|(_, id)| *id)
    });
    out
}

/// `f(a, b)` of two terms.
pub fn combine(f: Reducer, a: &Term, b: &Term) -> Term {
    let mut out = Term::default();
    let x = graft(&mut out, a, root(a), &|_| None);
    let y = graft(&mut out, b, root(b), &|_| None);
    out.add(f.node(x, y));
    out
}

/// The value of `term` at `env` (a symbol's value, `None` when unknown).
pub fn eval(term: &Term, env: &dyn Fn(&str) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = Vec::with_capacity(term.as_ref().len());
    for n in term.as_ref() {
        let at = |i: &Id| v[usize::from(*i)];
        let x = match n {
            Math::Add([a, b]) => at(a) + at(b),
            Math::Sub([a, b]) => at(a) - at(b),
            Math::Mul([a, b]) => at(a) * at(b),
            Math::Div([a, b]) => at(a) / at(b),
            Math::Neg(a) => -at(a),
            Math::Recip(a) => 1.0 / at(a),
            Math::Exp(a) => at(a).exp(),
            Math::Log(a) => at(a).ln(),
            Math::Max([a, b]) => at(a).max(at(b)),
            Math::Min([a, b]) => at(a).min(at(b)),
            Math::Symbol(s) => match s.as_str() {
                "zero" => 0.0,
                "one" => 1.0,
                "ninf" => f64::NEG_INFINITY,
                "pinf" => f64::INFINITY,
                other => env(other)?,
            },
        };
        v.push(x);
    }
    v.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(s: &str) -> Term {
        s.parse().unwrap()
    }

    #[test]
    fn inverse_of_softmax_body() {
        // y = exp(c - r)  =>  c = log(y) + r
        let inv = invert(&term("(exp (- c0 r0))"), "c0", "t").unwrap();
        assert_eq!(inv.to_string(), "(+ (log t) r0)");
    }

    #[test]
    fn square_is_not_invertible() {
        let e = invert(&term("(* (- c0 r0) (- c0 r0))"), "c0", "t").unwrap_err();
        assert!(e.contains("2 times"), "{e}");
    }

    #[test]
    fn max_of_constant_is_not_invertible() {
        assert!(invert(&term("(max c0 r0)"), "c0", "t").is_err());
    }

    #[test]
    fn repair_function_of_softmax_body() {
        let h = repair_function(&term("(exp (- c0 r0))"), "c0").unwrap();
        assert_eq!(h.to_string(), "(exp (- (+ (log t) r0) q0))");
        let v = eval(&h, &|s| match s {
            "t" => Some(2.0),
            "r0" => Some(1.0),
            "q0" => Some(3.0),
            _ => None,
        })
        .unwrap();
        assert!((v - 2.0 * (1.0f64 - 3.0).exp()).abs() < 1e-12);
    }
}
