//! Proofs of a repair function by algebraic equivalence in an e-graph
//! (`egg`), with the rule set below, and a numeric check on random values.
//!
//! For `h` built by Theorem 4.3 the proof goals are (Theorem 4.2):
//!
//! ```text
//!   (Eq. 4)  h(g(r, c), r, r') = g(r', c)
//!   (Eq. 5)  h(x f y, r, r')   = h(x, r, r') f h(y, r, r')
//!   (id)     h(e_f, r, r')     = e_f        the reducer's identity, so the
//!                                           first step may repair the init
//!   (fix)    h(t, r, r)        = t          a step that leaves the
//!                                           predecessors unchanged needs no
//!                                           repair (guards -inf - -inf)
//! ```
//!
//! The rules are those of a field with `exp`/`log` as mutually inverse
//! functions (as a symbolic solver treats them): a term `recip a` assumes
//! `a != 0`, `exp (log a)` assumes `a > 0`. `max`/`min` distribute over a
//! common summand, and over a common factor `exp a` (always positive): the
//! only monotone repairs that are proven for `max` and `min` reducers.

use egg::{rewrite as rw, AstSize, EGraph, Extractor, Rewrite, Runner};

use super::algebra::{self, Math, Reducer, Term};

fn rules() -> Vec<Rewrite<Math, ()>> {
    vec![
        // Normal forms: subtraction and division through inverses.
        rw!("sub-neg"; "(- ?a ?b)" => "(+ ?a (neg ?b))"),
        rw!("div-recip"; "(/ ?a ?b)" => "(* ?a (recip ?b))"),
        // A commutative ring.
        rw!("add-comm"; "(+ ?a ?b)" => "(+ ?b ?a)"),
        rw!("mul-comm"; "(* ?a ?b)" => "(* ?b ?a)"),
        rw!("add-assoc"; "(+ ?a (+ ?b ?c))" => "(+ (+ ?a ?b) ?c)"),
        rw!("add-assoc-r"; "(+ (+ ?a ?b) ?c)" => "(+ ?a (+ ?b ?c))"),
        rw!("mul-assoc"; "(* ?a (* ?b ?c))" => "(* (* ?a ?b) ?c)"),
        rw!("mul-assoc-r"; "(* (* ?a ?b) ?c)" => "(* ?a (* ?b ?c))"),
        rw!("distribute"; "(* ?a (+ ?b ?c))" => "(+ (* ?a ?b) (* ?a ?c))"),
        rw!("factor"; "(+ (* ?a ?b) (* ?a ?c))" => "(* ?a (+ ?b ?c))"),
        rw!("add-zero"; "(+ ?a zero)" => "?a"),
        rw!("mul-one"; "(* ?a one)" => "?a"),
        rw!("mul-zero"; "(* ?a zero)" => "zero"),
        rw!("neg-cancel"; "(+ ?a (neg ?a))" => "zero"),
        rw!("neg-neg"; "(neg (neg ?a))" => "?a"),
        rw!("neg-add"; "(neg (+ ?a ?b))" => "(+ (neg ?a) (neg ?b))"),
        rw!("neg-zero"; "(neg zero)" => "zero"),
        // A field: `recip a` for `a != 0`.
        rw!("recip-cancel"; "(* ?a (recip ?a))" => "one"),
        rw!("recip-recip"; "(recip (recip ?a))" => "?a"),
        rw!("recip-mul"; "(recip (* ?a ?b))" => "(* (recip ?a) (recip ?b))"),
        rw!("recip-one"; "(recip one)" => "one"),
        // exp and log.
        rw!("exp-add"; "(exp (+ ?a ?b))" => "(* (exp ?a) (exp ?b))"),
        rw!("exp-mul"; "(* (exp ?a) (exp ?b))" => "(exp (+ ?a ?b))"),
        rw!("exp-neg"; "(exp (neg ?a))" => "(recip (exp ?a))"),
        rw!("exp-zero"; "(exp zero)" => "one"),
        rw!("exp-log"; "(exp (log ?a))" => "?a"),
        rw!("log-exp"; "(log (exp ?a))" => "?a"),
        rw!("log-mul"; "(log (* ?a ?b))" => "(+ (log ?a) (log ?b))"),
        rw!("log-recip"; "(log (recip ?a))" => "(neg (log ?a))"),
        // Infinities: the identities of max and min absorb finite summands
        // and positive factors.
        rw!("ninf-add"; "(+ ninf ?a)" => "ninf"),
        rw!("pinf-add"; "(+ pinf ?a)" => "pinf"),
        rw!("ninf-exp"; "(* (exp ?a) ninf)" => "ninf"),
        rw!("pinf-exp"; "(* (exp ?a) pinf)" => "pinf"),
        // max and min: commutative, and monotone under a common summand or
        // a common positive factor.
        rw!("max-comm"; "(max ?a ?b)" => "(max ?b ?a)"),
        rw!("min-comm"; "(min ?a ?b)" => "(min ?b ?a)"),
        rw!("max-add"; "(max (+ ?a ?x) (+ ?a ?y))" => "(+ ?a (max ?x ?y))"),
        rw!("add-max"; "(+ ?a (max ?x ?y))" => "(max (+ ?a ?x) (+ ?a ?y))"),
        rw!("min-add"; "(min (+ ?a ?x) (+ ?a ?y))" => "(+ ?a (min ?x ?y))"),
        rw!("add-min"; "(+ ?a (min ?x ?y))" => "(min (+ ?a ?x) (+ ?a ?y))"),
        rw!("max-exp"; "(max (* (exp ?a) ?x) (* (exp ?a) ?y))" => "(* (exp ?a) (max ?x ?y))"),
        rw!("exp-max"; "(* (exp ?a) (max ?x ?y))" => "(max (* (exp ?a) ?x) (* (exp ?a) ?y))"),
        rw!("min-exp"; "(min (* (exp ?a) ?x) (* (exp ?a) ?y))" => "(* (exp ?a) (min ?x ?y))"),
        rw!("exp-min"; "(* (exp ?a) (min ?x ?y))" => "(min (* (exp ?a) ?x) (* (exp ?a) ?y))"),
    ]
}

fn runner(terms: &[&Term]) -> (Runner<Math, ()>, Vec<egg::Id>) {
    let mut runner = Runner::default()
        .with_iter_limit(12)
        .with_node_limit(40_000)
        .with_time_limit(std::time::Duration::from_secs(3));
    let mut ids = Vec::new();
    for t in terms {
        runner = runner.with_expr(t);
    }
    runner = runner.run(&rules());
    for r in &runner.roots {
        ids.push(*r);
    }
    (runner, ids)
}

/// Whether `a = b` follows from the rules.
pub fn equivalent(a: &Term, b: &Term) -> bool {
    let (runner, ids) = runner(&[a, b]);
    let eg: &EGraph<Math, ()> = &runner.egraph;
    eg.find(ids[0]) == eg.find(ids[1])
}

/// The smallest term equal to `t` under the rules.
pub fn simplify(t: &Term) -> Term {
    let (runner, ids) = runner(&[t]);
    let ex = Extractor::new(&runner.egraph, AstSize);
    ex.find_best(ids[0]).1
}

/// One proof goal: its name, both sides, and whether it was proven.
#[derive(Debug, Clone)]
pub struct Goal {
    pub name: &'static str,
    pub lhs: Term,
    pub rhs: Term,
    pub proven: bool,
    /// Largest relative difference of the two sides on random values.
    pub numeric_error: f64,
}

impl Goal {
    pub fn describe(&self) -> String {
        format!(
            "{} {}: {} = {} (random values: max rel. diff {:.1e})",
            if self.proven { "proved" } else { "FAILED" },
            self.name,
            self.lhs,
            self.rhs,
            self.numeric_error
        )
    }
}

/// The proof goals of Theorem 4.2 (and the two side conditions of the
/// module comment) for `h` against body `g` and reducer `f`.
pub fn goals(f: Reducer, g: &Term, h: &Term) -> Vec<Goal> {
    let t = |s: &str| -> Term { s.parse().expect("a symbol") };
    // Eq. 4: h(g(r, c), r, r') = g(r', c).
    let eq4_lhs = algebra::substitute(h, "t", g);
    let eq4_rhs = algebra::rename(g, &|s| s.strip_prefix('r').map(|k| format!("q{k}")));
    // Eq. 5: h(x f y) = h(x) f h(y).
    let x = t("x");
    let y = t("y");
    let eq5_lhs = algebra::substitute(h, "t", &algebra::combine(f, &x, &y));
    let eq5_rhs = algebra::combine(
        f,
        &algebra::substitute(h, "t", &x),
        &algebra::substitute(h, "t", &y),
    );
    // The identity: h(e, r, r') = e.
    let e = t(f.identity());
    let id_lhs = algebra::substitute(h, "t", &e);
    // The fixed point: h(t, r, r) = t.
    let fix_lhs = algebra::rename(h, &|s| s.strip_prefix('q').map(|k| format!("r{k}")));
    let mut out = Vec::new();
    for (name, lhs, rhs) in [
        ("Eq. 4  h(g(r,c),r,r') = g(r',c)", eq4_lhs, eq4_rhs),
        (
            "Eq. 5  h(x f y,r,r') = h(x,r,r') f h(y,r,r')",
            eq5_lhs,
            eq5_rhs,
        ),
        ("identity  h(e_f,r,r') = e_f", id_lhs, e.clone()),
        ("fixed point  h(t,r,r) = t", fix_lhs, t("t")),
    ] {
        let proven = equivalent(&lhs, &rhs);
        let numeric_error = numeric_difference(&lhs, &rhs);
        out.push(Goal {
            name,
            lhs,
            rhs,
            proven,
            numeric_error,
        });
    }
    out
}

/// Largest relative difference of `a` and `b` over random positive values
/// of their symbols (a fixed seed; pairs where either side is not finite
/// are skipped).
pub fn numeric_difference(a: &Term, b: &Term) -> f64 {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut worst = 0.0f64;
    for _ in 0..64 {
        let mut values: Vec<(String, f64)> = Vec::new();
        let mut value_of = |s: &str| -> f64 {
            if let Some((_, v)) = values.iter().find(|(k, _)| k == s) {
                return *v;
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = 0.25 + 2.0 * ((state >> 11) as f64 / (1u64 << 53) as f64);
            values.push((s.to_string(), v));
            v
        };
        let mut env_values = Vec::new();
        for s in algebra::symbols_with_prefix(a, "")
            .into_iter()
            .chain(algebra::symbols_with_prefix(b, ""))
        {
            let v = value_of(&s);
            env_values.push((s, v));
        }
        let env = |s: &str| env_values.iter().find(|(k, _)| k == s).map(|(_, v)| *v);
        let (Some(x), Some(y)) = (algebra::eval(a, &env), algebra::eval(b, &env)) else {
            return f64::INFINITY;
        };
        if !x.is_finite() || !y.is_finite() {
            if x != y {
                return f64::INFINITY;
            }
            continue;
        }
        let d = (x - y).abs() / x.abs().max(y.abs()).max(1e-30);
        worst = worst.max(d);
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::algebra::repair_function;

    fn term(s: &str) -> Term {
        s.parse().unwrap()
    }

    #[test]
    fn softmax_repair_is_proven() {
        let g = term("(exp (- c0 r0))");
        let h = repair_function(&g, "c0").unwrap();
        for goal in goals(Reducer::Sum, &g, &h) {
            assert!(goal.proven, "{}", goal.describe());
            assert!(goal.numeric_error < 1e-12, "{}", goal.describe());
        }
        assert_eq!(simplify(&h).to_string(), "(* t (exp (+ r0 (neg q0))))");
    }

    #[test]
    fn flipped_sign_is_refused() {
        // A wrong h: exp(r' - r) * t instead of exp(r - r') * t.
        let g = term("(exp (- c0 r0))");
        let wrong = term("(* t (exp (- q0 r0)))");
        let gs = goals(Reducer::Sum, &g, &wrong);
        assert!(!gs[0].proven, "{}", gs[0].describe());
        assert!(gs[0].numeric_error > 1e-3);
    }

    #[test]
    fn max_against_non_monotone_g_is_refused() {
        // max= c / r: h(t, r, r') = t * r / r', not monotone in t unless
        // r / r' > 0, which nothing here proves.
        let g = term("(/ c0 r0)");
        let h = repair_function(&g, "c0").unwrap();
        let gs = goals(Reducer::Max, &g, &h);
        assert!(gs[0].proven, "{}", gs[0].describe());
        assert!(!gs[1].proven, "{}", gs[1].describe());
    }
}
