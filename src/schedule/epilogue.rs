//! Fusing a contraction's pointwise consumers into the contraction's band,
//! so that the gpu stage can run them as the epilogue of one tensor-core
//! kernel.
//!
//! A product followed by anything (`acc +=! A B; D = f16(tanh(acc +
//! bias))`) is scheduled by isl, at realistic sizes, with the reduction
//! loop `k` in a band of its own below the element loops, a form the
//! contraction recogniser (`gpu::contraction`) does not take; minimal
//! fusion gives each statement a kernel of its own, so the accumulator goes
//! through memory twice and its initialisation is a kernel too. The
//! rewrite, on consecutive children of the top-level sequence that hold
//! `C`'s initialisation `I`, the update `U[e, k]` and consumers `T_1..T_n`
//! (each an assignment over `C`'s element space that reads `C` at its own
//! element, its iterators a permutation `π_t` of `C`'s subscripts):
//!
//! ```text
//!   sequence [I: ..., U: ..., T_1: ..., T_n: ...]
//!     =>  band [ e_0, .., e_{r-1}, κ ] { sequence [I, U, T_1, .., T_n] }
//! ```
//!
//! with `e_d` the element's subscript `d` (`π_t` applied for `T_t`) and `κ`
//! the reduction index for `U`, its least value for `I` and its greatest
//! for the `T_t`. Every instance keeps its element; within an element, `I`
//! runs before every `U` and the `T_t` after the last, in program order
//! among themselves: the order the program gives the instances of one
//! element. Dependences between different elements are not all respected
//! by construction (a consumer may read other elements), so the result is
//! checked against every dependence by the caller, and used only where
//! the cost model prefers it.

use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{collect_reads, AssignOp, Program, Reducer};
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, Schedule};
use crate::model::{ModelStmt, Scop, StmtKind};

/// `schedule` (whose root's child is a sequence of one statement per
/// child, as minimal fusion gives) with every contraction's
/// initialisation, update and pointwise consumers fused into one band (see
/// the module documentation), each group kept only where the schedule
/// stays legal (`deps`); `None` where no group is, or where a reduction's
/// bounds are not constants.
pub fn contraction_epilogues(
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
    let mut single = single_statements(isl, scop, &children)?;
    let mut i = 0;
    while i < children.len() {
        let Some((taken, merged)) = group_at(program, scop, &single, i)? else {
            i += 1;
            continue;
        };
        // The group at the place of its initialisation; the children it
        // skipped over after it, in their order.
        let mut next: Vec<(String, Tree)> = children[..i].to_vec();
        next.push(merged);
        next.extend(
            children
                .iter()
                .enumerate()
                .skip(i)
                .filter(|(k, _)| !taken.contains(k))
                .map(|(_, c)| c.clone()),
        );
        let candidate = to_schedule(isl, &tree.domain, next.clone())?;
        if crate::schedule::check_legal(&program.source, &candidate, scop, deps).is_ok() {
            children = next;
            single = single_statements(isl, scop, &children)?;
            changed = true;
        }
        i += 1;
    }
    if !changed {
        return Ok(None);
    }
    Ok(Some(to_schedule(isl, &tree.domain, children)?))
}

/// The statement of each child, where it holds exactly one.
fn single_statements<'a>(
    isl: &Isl,
    scop: &'a Scop,
    children: &[(String, Tree)],
) -> Result<Vec<Option<&'a ModelStmt>>> {
    let mut single = Vec::new();
    for (filter, _) in children {
        let stmts = scop.statements_in(&isl.union_set(filter)?)?;
        single.push(match stmts.as_slice() {
            [s] => Some(*s),
            _ => None,
        });
    }
    Ok(single)
}

/// The schedule of a sequence of `children` (one alone needs no
/// sequence around it).
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

/// A group found: the children it takes, and the child (filter and
/// subtree) that replaces them.
type Group = (Vec<usize>, (String, Tree));

/// The group that starts at child `i` (an initialisation, then its
/// update, then at least one consumer among the later children, up to
/// one that touches the accumulator otherwise): the children it takes and
/// the child that replaces them.
fn group_at(
    program: &Program,
    scop: &Scop,
    single: &[Option<&ModelStmt>],
    i: usize,
) -> Result<Option<Group>> {
    let (Some(Some(init)), Some(Some(update))) = (single.get(i), single.get(i + 1)) else {
        return Ok(None);
    };
    let st = &program.statements[update.source];
    let is_sum = matches!(
        st.op,
        AssignOp::Reduce {
            op: Reducer::Sum,
            ..
        }
    );
    if init.kind != StmtKind::Init
        || update.kind != StmtKind::Update
        || init.source != update.source
        || !is_sum
        || st.reduction_indices.len() != 1
        || !st.blocks.is_empty()
    {
        return Ok(None);
    }
    let rank = st.lhs_indices.len();
    let k_pos = rank as u32;
    let (Ok(k_lo), Ok(k_hi)) = (
        constant(update.domain.copy()?.dim_min_val(k_pos as i32)),
        constant(update.domain.copy()?.dim_max_val(k_pos as i32)),
    ) else {
        return Ok(None);
    };
    // The consumers, each with the element subscript per member.
    let mut consumers: Vec<(&ModelStmt, Vec<String>)> = Vec::new();
    let mut taken = vec![i, i + 1];
    for (j, next) in single.iter().enumerate().skip(i + 2) {
        let Some(t) = next else { break };
        match element_of(program, t, &st.lhs_tensor, rank) {
            Some(subs) => {
                consumers.push((t, subs));
                taken.push(j);
            }
            None if touches(program, t, &st.lhs_tensor) => break,
            None => {}
        }
    }
    if consumers.is_empty() {
        return Ok(None);
    }
    let p = &scop.param_prefix;
    let tuple = |s: &ModelStmt| format!("{}[{}]", s.name, s.iterators.join(", "));
    let mut members = Vec::new();
    for d in 0..=rank {
        let mut parts = Vec::new();
        let (init_v, update_v) = if d < rank {
            (st.lhs_indices[d].clone(), st.lhs_indices[d].clone())
        } else {
            (k_lo.to_string(), st.reduction_indices[0].clone())
        };
        parts.push(format!("{} -> [({init_v})]", tuple(init)));
        parts.push(format!("{} -> [({update_v})]", tuple(update)));
        for (t, subs) in &consumers {
            let v = if d < rank {
                subs[d].clone()
            } else {
                k_hi.to_string()
            };
            parts.push(format!("{} -> [({v})]", tuple(t)));
        }
        members.push(format!("{{ {} }}", parts.join("; ")));
    }
    let band = Band {
        schedule: format!("{p}[{}]", members.join(", ")),
        permutable: true,
        coincident: (0..=rank).map(|d| d < rank).collect(),
    };
    let all: Vec<&ModelStmt> = [init, update]
        .into_iter()
        .copied()
        .chain(consumers.iter().map(|(t, _)| *t))
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
    Ok(Some((taken, (filter, merged))))
}

/// Whether statement `t` reads or writes tensor `c` (an initialisation
/// only writes).
fn touches(program: &Program, t: &ModelStmt, c: &str) -> bool {
    let st = &program.statements[t.source];
    let mut reads = Vec::new();
    if t.kind != StmtKind::Init {
        collect_reads(&st.rhs, &mut reads);
    }
    st.lhs_tensor == c || reads.iter().any(|(tensor, _)| tensor == c)
}

/// For a consumer `t` of tensor `c` (rank `rank`): an assignment over as
/// many iterators as `c` has dimensions, with no `where` of its own, that
/// reads `c` only at subscripts which are its iterators in some order (in
/// place, `c(e) = f(c(e))`, at its own element); those subscripts (the
/// iterator of each of `c`'s dimensions). A loop block's index counts as
/// one of the iterators (`schedule::sums` fuses an epilogue under the
/// block's host loops); here the contraction is outside blocks
/// (`group_at`), and the result is checked against the dependences either
/// way.
pub(crate) fn element_of(
    program: &Program,
    t: &ModelStmt,
    c: &str,
    rank: usize,
) -> Option<Vec<String>> {
    let st = &program.statements[t.source];
    if t.kind != StmtKind::Assign
        || st.op != AssignOp::Assign
        || t.iterators.len() != rank
        || !st.wheres.is_empty()
    {
        return None;
    }
    let mut reads = Vec::new();
    collect_reads(&st.rhs, &mut reads);
    let mut subs: Option<Vec<String>> = None;
    for (_, s) in reads.iter().filter(|(tensor, _)| tensor == c) {
        let names: Option<Vec<String>> = s
            .iter()
            .map(|a| {
                let (name, coeff) = a.terms.iter().next()?;
                (a.terms.len() == 1 && *coeff == 1 && a.constant == 0).then(|| name.clone())
            })
            .collect();
        let names = names?;
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != rank || subs.as_ref().is_some_and(|s| *s != names) {
            return None;
        }
        subs = Some(names);
    }
    if st.lhs_tensor == c && subs.as_ref() != Some(&st.lhs_indices) {
        return None;
    }
    subs
}

/// An integer from isl's value, where it is one.
fn constant(v: std::result::Result<crate::isl::Val, crate::isl::LibISLError>) -> Result<i64> {
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

    /// `acc +=! A B; D = f16(tanh(acc + bias))` under minimal fusion: three
    /// children become one band over `(m, n, k)`, which the dependences
    /// allow.
    #[test]
    fn a_product_and_its_epilogue_share_one_band() {
        let json = r#"{"name": "p", "params": {"M": 40, "N": 24, "K": 56},
            "inputs": {"A": {"dtype": "f16", "shape": ["M", "K"]},
                       "B": {"dtype": "f16", "shape": ["K", "N"]},
                       "bias": {"dtype": "f16", "shape": ["N"]}},
            "outputs": {"D": {"dtype": "f16", "shape": ["N", "M"]}},
            "temps": {"acc": {"dtype": "f32", "shape": ["M", "N"]}},
            "body": ["acc(m, n) +=! f32(A(m, k)) * f32(B(k, n))",
                     "D(j, i) = f16(tanh(acc(i, j) + f32(bias(j))))"]}"#;
        let program = load_str(json, "p.json").unwrap();
        let isl = Isl::new();
        let scop = crate::model::build(&isl, &program).unwrap();
        let order = crate::schedule::canonical(&isl, &scop).unwrap();
        let deps = crate::deps::compute(&scop, &order).unwrap();
        let min =
            crate::schedule::compute(&isl, &scop, &deps, crate::schedule::Strategy::Min).unwrap();
        let fused = contraction_epilogues(&isl, &program, &scop, &deps, &min)
            .unwrap()
            .expect("a group");
        crate::schedule::check_legal("p.json", &fused, &scop, &deps).unwrap();
        let text = fused.get_root().unwrap().text();
        // The consumer's member along `m` is its second iterator (`i`).
        assert!(text.contains("S1[j, i] -> [(i)]"), "{text}");
        assert!(text.contains("S1[j, i] -> [(55)]"), "{text}");
        let tree = ScheduleTree::from_isl(&fused.get_root().unwrap()).unwrap();
        assert!(matches!(tree.root, Tree::Band(..)), "{text}");
    }

    /// A consumer that overwrites an operand of the product (`D` read as
    /// `D(m, k)` by other elements' steps) cannot join the band: the
    /// dependences refuse the group, and nothing changes.
    #[test]
    fn a_group_the_dependences_refuse_is_left_out() {
        let json = r#"{"name": "p", "params": {"N": 24},
            "inputs": {"X": {"dtype": "f32", "shape": ["N", "N"]},
                       "B": {"dtype": "f32", "shape": ["N", "N"]}},
            "outputs": {"D": {"dtype": "f32", "shape": ["N", "N"]}},
            "temps": {"acc": {"dtype": "f32", "shape": ["N", "N"]}},
            "body": ["D(m, n) = X(m, n)",
                     "acc(m, n) +=! D(m, k) * B(k, n)",
                     "D(i, j) = acc(i, j) * 2"]}"#;
        let program = load_str(json, "p.json").unwrap();
        let isl = Isl::new();
        let scop = crate::model::build(&isl, &program).unwrap();
        let order = crate::schedule::canonical(&isl, &scop).unwrap();
        let deps = crate::deps::compute(&scop, &order).unwrap();
        let min =
            crate::schedule::compute(&isl, &scop, &deps, crate::schedule::Strategy::Min).unwrap();
        // The group is found (the consumer reads `acc` at its element)...
        let single = single_statements(&isl, &scop, &{
            let tree = ScheduleTree::from_isl(&min.get_root().unwrap()).unwrap();
            match tree.root {
                Tree::Sequence(c) => c,
                other => panic!("{other:?}"),
            }
        })
        .unwrap();
        let at = single
            .iter()
            .position(|s| s.is_some_and(|s| s.name == "S1_init"))
            .unwrap();
        assert!(group_at(&program, &scop, &single, at).unwrap().is_some());
        // ...and refused by the dependences.
        assert!(contraction_epilogues(&isl, &program, &scop, &deps, &min)
            .unwrap()
            .is_none());
    }

    /// A consumer that reads the accumulator at another element is not an
    /// epilogue: nothing changes.
    #[test]
    fn a_consumer_of_other_elements_stays_apart() {
        let json = r#"{"name": "p", "params": {"M": 40, "N": 24, "K": 56},
            "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]},
                       "B": {"dtype": "f32", "shape": ["K", "N"]}},
            "outputs": {"D": {"dtype": "f32", "shape": ["M", "N"]}},
            "temps": {"acc": {"dtype": "f32", "shape": ["M", "N"]}},
            "body": ["acc(m, n) +=! A(m, k) * B(k, n)",
                     "D(i, j) = acc(i, 0) + acc(i, j)"]}"#;
        let program = load_str(json, "p.json").unwrap();
        let isl = Isl::new();
        let scop = crate::model::build(&isl, &program).unwrap();
        let order = crate::schedule::canonical(&isl, &scop).unwrap();
        let deps = crate::deps::compute(&scop, &order).unwrap();
        let min =
            crate::schedule::compute(&isl, &scop, &deps, crate::schedule::Strategy::Min).unwrap();
        assert!(contraction_epilogues(&isl, &program, &scop, &deps, &min)
            .unwrap()
            .is_none());
    }
}
