//! Sums into one accumulator fused into one band: an LSTM cell's gates as
//! two products into one tensor (`G +=! X W`, then `G += H U`, issue 35).
//!
//! isl's scheduler puts the second sum in a loop nest of its own beside
//! the first (its memory-based dependences order every `k` of the first
//! before every `k'` of the second at each element, which a shared band
//! can only express by shifting `k'` by the first's extent), so the
//! accumulator goes through memory between two kernels. Where the shift
//! exceeds the constants it may use (`MAX_CONSTANT_SHIFT`, at realistic
//! sizes), isl fuses them over the element's loops with each reduction in
//! a loop below, a form the contraction recogniser does not take (and the
//! mapping runs each loop across the lanes of a warp). The rewrite, on
//! consecutive children of the top-level sequence where the first holds
//! exactly `C`'s initialisation `I`, its update `U_1[e, k_1]` and any
//! number of further updates and each following one exactly a further
//! update `U_j[e, k_j]` of `C` at its own element (a `+=` without `!`: the
//! sum goes on from `U_{j-1}`'s):
//!
//! ```text
//!   sequence [I, U_1: ..., U_2: ..., .., U_n: ...]
//!     =>  band [ e_0, .., e_{r-1}, κ ] { sequence [I, U_1, .., U_n] }
//! ```
//!
//! with `e_d` the element's subscript `d` and `κ` the reduction index,
//! shifted for `U_j` past the ranges of `U_1 .. U_{j-1}` (`k_j + o_j`,
//! `o_j = hi_{j-1} + o_{j-1} + 1 - lo_j`), and `lo_1` for `I`. Each element
//! then runs its initialisation, every step of the first sum, then every
//! step of the next: the program's order of one element's instances, and
//! no other dependence relates these statements (each writes and reads `C`
//! at its element only; their other reads are of tensors none of them
//! writes). The result is checked against every dependence all the same,
//! and kept only where it is legal.
//!
//! On the GPU the band is one kernel: a tensor-core contraction with one
//! reduction loop per sum (`gpu::contraction`'s terms), or else a register
//! tile.

use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{AssignOp, Program, Reducer};
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, Schedule};
use crate::model::{ModelStmt, Scop, StmtKind};

/// `schedule` with every run of sums into one accumulator (see the module
/// documentation) fused into one band, each kept only where the schedule
/// stays legal (`deps`); `None` where none is, or where the top of the
/// tree is no sequence.
pub fn fuse_sibling_sums(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    schedule: &Schedule,
) -> Result<Option<Schedule>> {
    let tree = ScheduleTree::from_isl(&schedule.get_root()?)?;
    let Tree::Sequence(mut children) = tree.root.clone() else {
        return Ok(None);
    };
    let mut changed = false;
    let mut i = 0;
    while i + 1 < children.len() {
        let stmts = statements(isl, scop, &children)?;
        let Some((count, merged)) = run_at(program, scop, &stmts, i)? else {
            i += 1;
            continue;
        };
        let mut next: Vec<(String, Tree)> = children[..i].to_vec();
        next.push(merged);
        next.extend(children[i + count..].iter().cloned());
        let candidate = to_schedule(isl, &tree.domain, next.clone())?;
        if crate::schedule::check_legal(&program.source, &candidate, scop, deps).is_ok() {
            children = next;
            changed = true;
        }
        i += 1;
    }
    if !changed {
        return Ok(None);
    }
    Ok(Some(to_schedule(isl, &tree.domain, children)?))
}

/// The statements of each child.
fn statements<'a>(
    isl: &Isl,
    scop: &'a Scop,
    children: &[(String, Tree)],
) -> Result<Vec<Vec<&'a ModelStmt>>> {
    children
        .iter()
        .map(|(filter, _)| scop.statements_in(&isl.union_set(filter)?))
        .collect()
}

/// The schedule of a sequence of `children` (one alone needs no sequence
/// around it).
fn to_schedule(isl: &Isl, domain: &str, children: Vec<(String, Tree)>) -> Result<Schedule> {
    let root = match <[_; 1]>::try_from(children) {
        Ok([(_, only)]) => only,
        Err(children) => Tree::Sequence(children),
    };
    let tree = ScheduleTree {
        domain: domain.to_string(),
        root,
    };
    isl.schedule(&tree.to_isl_text())
}

/// A sum of one reduction index, outside loop blocks, whose left side is
/// distinct plain indices: its reduction range `(lo, hi)` where both are
/// constants.
fn sum_range(program: &Program, s: &ModelStmt) -> Result<Option<(i64, i64)>> {
    let st = &program.statements[s.source];
    let is_sum = matches!(
        st.op,
        AssignOp::Reduce {
            op: Reducer::Sum,
            ..
        }
    );
    let mut lhs = st.lhs_indices.clone();
    lhs.sort();
    lhs.dedup();
    if s.kind != StmtKind::Update
        || !is_sum
        || st.reduction_indices.len() != 1
        || !st.blocks.is_empty()
        || lhs.len() != st.lhs_indices.len()
        || s.iterators.len() != lhs.len() + 1
    {
        return Ok(None);
    }
    let k = st.lhs_indices.len() as i32;
    let (Ok(lo), Ok(hi)) = (
        constant(s.domain.copy()?.dim_min_val(k)),
        constant(s.domain.copy()?.dim_max_val(k)),
    ) else {
        return Ok(None);
    };
    Ok(Some((lo, hi)))
}

/// The run of sums that starts at child `i`: how many children it takes
/// and the child that replaces them.
fn run_at(
    program: &Program,
    scop: &Scop,
    stmts: &[Vec<&ModelStmt>],
    i: usize,
) -> Result<Option<(usize, (String, Tree))>> {
    // The first child: an initialisation, its update, and (where isl
    // fused them already, each with a loop of its own below the element's)
    // further updates.
    let mut first_child: Vec<&ModelStmt> = stmts[i].clone();
    first_child.sort_by_key(|s| (s.source, s.kind != StmtKind::Init));
    let [init, first, rest @ ..] = first_child.as_slice() else {
        return Ok(None);
    };
    let (init, first) = (*init, *first);
    if init.kind != StmtKind::Init || init.source != first.source {
        return Ok(None);
    }
    let Some(range) = sum_range(program, first)? else {
        return Ok(None);
    };
    let tensor = &program.statements[first.source].lhs_tensor;
    let rank = program.statements[first.source].lhs_indices.len();
    // A further update of the same tensor, with no initialisation of its
    // own: its reduction range.
    let further = |u: &ModelStmt| -> Result<Option<(i64, i64)>> {
        let st = &program.statements[u.source];
        if &st.lhs_tensor != tensor
            || scop.statement(&format!("{}_init", u.name)).is_some()
            || st.lhs_indices.len() != rank
        {
            return Ok(None);
        }
        sum_range(program, u)
    };
    let mut sums: Vec<(&ModelStmt, (i64, i64))> = vec![(first, range)];
    for u in rest {
        match further(u)? {
            Some(r) => sums.push((*u, r)),
            None => return Ok(None),
        }
    }
    // The following children: one further update each.
    let mut count = 1;
    for child in &stmts[i + 1..] {
        let [u] = child.as_slice() else { break };
        let Some(r) = further(u)? else { break };
        sums.push((*u, r));
        count += 1;
    }
    if sums.len() < 2 {
        return Ok(None);
    }
    let p = &scop.param_prefix;
    let tuple = |s: &ModelStmt| format!("{}[{}]", s.name, s.iterators.join(", "));
    // The shift of each sum's reduction index.
    let mut shifts = Vec::new();
    let mut end = range.0 - 1;
    for (_, (lo, hi)) in &sums {
        let shift = end + 1 - lo;
        shifts.push(shift);
        end = hi + shift;
    }
    let mut members = Vec::new();
    for d in 0..=rank {
        let mut parts = Vec::new();
        let init_v = if d < rank {
            program.statements[init.source].lhs_indices[d].clone()
        } else {
            range.0.to_string()
        };
        parts.push(format!("{} -> [({init_v})]", tuple(init)));
        for ((s, _), shift) in sums.iter().zip(&shifts) {
            let st = &program.statements[s.source];
            let v = if d < rank {
                st.lhs_indices[d].clone()
            } else {
                format!("{} + ({shift})", st.reduction_indices[0])
            };
            parts.push(format!("{} -> [({v})]", tuple(s)));
        }
        members.push(format!("{{ {} }}", parts.join("; ")));
    }
    let band = Band {
        schedule: format!("{p}[{}]", members.join(", ")),
        permutable: true,
        coincident: (0..=rank).map(|d| d < rank).collect(),
    };
    let all: Vec<&ModelStmt> = std::iter::once(init)
        .chain(sums.iter().map(|(s, _)| *s))
        .collect();
    let inner: Vec<(String, Tree)> = all
        .iter()
        .map(|s| (format!("{p}{{ {} }}", tuple(s)), Tree::Leaf))
        .collect();
    let filter = format!(
        "{p}{{ {} }}",
        all.iter().map(|s| tuple(s)).collect::<Vec<_>>().join("; ")
    );
    let merged = Tree::Band(band, Box::new(Tree::Sequence(inner)));
    Ok(Some((count, (filter, merged))))
}

/// An integer from isl's value, where it is one.
fn constant(v: std::result::Result<isl_rs::Val, isl_rs::LibISLError>) -> Result<i64> {
    let v = v?;
    if !v.is_int()? {
        return Err(crate::error::Error::Internal("not an integer".into()));
    }
    crate::isl::val_to_i64(&v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::load_str;
    use crate::isl::IslPrint;

    /// One LSTM cell's gates: two products into `G`, then a consumer of
    /// other elements of `G` (the gates' columns).
    fn gates(i: i64, h: i64, second: &str) -> String {
        format!(
            r#"{{"name": "p", "params": {{"B": 20, "I": {i}, "H": {h}}},
            "inputs": {{"X": {{"dtype": "f16", "shape": ["B", "I"]}},
                       "W": {{"dtype": "f16", "shape": ["I", "2*H"]}},
                       "Hp": {{"dtype": "f16", "shape": ["B", "H"]}},
                       "U": {{"dtype": "f16", "shape": ["H", "2*H"]}}}},
            "outputs": {{"Y": {{"dtype": "f32", "shape": ["B", "H"]}}}},
            "temps": {{"G": {{"dtype": "f32", "shape": ["B", "2*H"]}}}},
            "body": ["G(b, n) +=! X(b, k) * W(k, n)",
                     "{second}",
                     "Y(b, h) = sigmoid(G(b, h)) * tanh(G(b, h + H))"]}}"#
        )
    }

    fn isl_and_fused(json: &str) -> (Option<String>, String) {
        let program = load_str(json, "p.json").unwrap();
        let isl = Isl::new();
        let scop = crate::model::build(&isl, &program).unwrap();
        let order = crate::schedule::canonical(&isl, &scop).unwrap();
        let deps = crate::deps::compute(&scop, &order).unwrap();
        let sched =
            crate::schedule::compute(&isl, &scop, &deps, crate::schedule::Strategy::Isl).unwrap();
        let before = sched.get_root().unwrap().text();
        let fused = fuse_sibling_sums(&isl, &program, &scop, &deps, &sched).unwrap();
        let fused = fused.map(|f| {
            crate::schedule::check_legal("p.json", &f, &scop, &deps).unwrap();
            f.get_root().unwrap().text()
        });
        (fused, before)
    }

    /// The second sum's `k` follows the first's (`I` of them) in one band
    /// over `(b, n, κ)`, whether isl left the sums in loop nests of their
    /// own (the shift fits its constants) or fused them with a loop each
    /// below the element's (I = 300 is past `MAX_CONSTANT_SHIFT`).
    #[test]
    fn two_sums_into_the_gates_share_one_band() {
        for (i, shift) in [(24, "24 + k"), (300, "300 + k")] {
            let json = gates(i, 16, "G(b, n) += Hp(b, k) * U(k, n)");
            let (fused, before) = isl_and_fused(&json);
            let fused = fused.unwrap_or_else(|| panic!("I = {i}: not fused:\n{before}"));
            assert!(
                fused.contains(&format!("S1[b, n, k] -> [({shift})]")),
                "{fused}"
            );
            assert!(fused.contains("S0_init[b, n] -> [(0)]"), "{fused}");
            assert!(fused.contains("S0[b, n, k] -> [(k)]"), "{fused}");
        }
    }

    /// A second `+=!` starts the accumulator over: no run of sums, nothing
    /// changes.
    #[test]
    fn a_second_initialisation_is_no_further_sum() {
        let json = gates(24, 16, "G(b, n) +=! Hp(b, k) * U(k, n)");
        assert!(isl_and_fused(&json).0.is_none());
    }
}
