//! SolveRepairFuncH and ValidateHCommutative of Neptune's Algorithm 1: for
//! each constant input `c` of `g` in turn, build `h` by Theorem 4.3, reduce
//! it to its smallest equal term, and keep the first one that mentions no
//! constant input (a repair may only use `t`, `r` and `r'`) and whose proof
//! goals (Eq. 4, Eq. 5, identity, fixed point) all hold in the e-graph and
//! on random values.

use super::algebra::{self, Term};
use super::chain::Chain;
use super::prove::{self, Goal};

/// A proven repair function.
#[derive(Debug, Clone)]
pub struct Solution {
    /// `h(t, r, r')` over `t`, `r<k>` (previous) and `q<k>` (current).
    pub h: Term,
    /// The constant input `g` was inverted in.
    pub inverted_in: String,
    pub goals: Vec<Goal>,
}

impl Solution {
    pub fn describe(&self) -> String {
        let mut s = format!(
            "  h(t, r, r') = {}   (g inverted in {})\n",
            self.h, self.inverted_in
        );
        for g in &self.goals {
            s.push_str(&format!("  {}\n", g.describe()));
        }
        s
    }
}

/// How a repair may be deliberately wrong: the tests' way to show that the
/// proofs refuse a wrong repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// `h` with its previous and current predecessor values swapped (the
    /// sign of `r - r'` flipped in softmax).
    FlipSign,
    /// The rolling update reads the predecessor's current value where `h`
    /// needs the cached previous one.
    OmitCache,
    /// The fusion without any repair: the violated dependences are then
    /// compensated by nothing and must refuse it.
    NoRepair,
}

/// Finds and proves `h` for `chain`, or says why none is found.
pub fn solve(chain: &Chain, fault: Fault) -> Result<Solution, String> {
    let mut reasons = Vec::new();
    for c in chain.constants.keys() {
        if algebra::occurrences(&chain.g, algebra::root(&chain.g), c) == 0 {
            continue;
        }
        let h = match algebra::repair_function(&chain.g, c) {
            Ok(h) => prove::simplify(&h),
            Err(why) => {
                reasons.push(why);
                continue;
            }
        };
        if !algebra::symbols_with_prefix(&h, "c").is_empty() {
            reasons.push(format!(
                "inverting g in {c} leaves h = {h}, which still reads a constant input"
            ));
            continue;
        }
        let h = match fault {
            Fault::FlipSign => algebra::rename(&h, &|s| {
                if let Some(k) = s.strip_prefix('r') {
                    Some(format!("q{k}"))
                } else {
                    s.strip_prefix('q').map(|k| format!("r{k}"))
                }
            }),
            _ => h,
        };
        let goals = prove::goals(chain.reducer, &chain.g, &h);
        if let Some(bad) = goals.iter().find(|g| !g.proven || g.numeric_error > 1e-9) {
            reasons.push(format!("h = {h} fails a proof goal: {}", bad.describe()));
            continue;
        }
        return Ok(Solution {
            h,
            inverted_in: c.clone(),
            goals,
        });
    }
    if reasons.is_empty() {
        reasons.push("g has no constant input to invert".into());
    }
    Err(format!(
        "no repair function h for g = {} with reducer {}: {}",
        chain.g,
        chain.reducer.name(),
        reasons.join("; ")
    ))
}
