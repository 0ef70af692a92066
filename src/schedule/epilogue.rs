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
use crate::isl::{Isl, IslPrint, Schedule};
use crate::model::{ModelStmt, Scop, StmtKind};
use crate::schedule::Strategy;

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
    match groups(isl, program, scop, deps, schedule, false)? {
        Some(g) if g.grouped.contains(&true) => Ok(Some(to_schedule(isl, &g.domain, g.children)?)),
        _ => Ok(None),
    }
}

/// [`contraction_epilogues`]'s sequence, before it is made a schedule.
pub(crate) struct Grouped {
    /// The schedule's domain (isl text).
    pub domain: String,
    /// The top-level children: filter and subtree.
    pub children: Vec<(String, Tree)>,
    /// Whether each child is a contraction's group (the others are the
    /// children of the schedule given, as they were).
    pub grouped: Vec<bool>,
}

/// The children of [`contraction_epilogues`]'s result, each marked as a
/// group or not (none where no group is legal); `None` where the
/// schedule's root is not a sequence. With `lone`, a product
/// without a consumer is a group too (its initialisation in its band, so
/// that its kernel starts the sums in registers instead of reading them
/// from a kernel of their own).
pub(crate) fn groups(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    schedule: &Schedule,
    lone: bool,
) -> Result<Option<Grouped>> {
    let tree = ScheduleTree::from_isl(&schedule.get_root()?)?;
    let Tree::Sequence(mut children) = tree.root.clone() else {
        return Ok(None);
    };
    let mut grouped = vec![false; children.len()];
    let mut stmts = child_statements(isl, scop, &children)?;
    // Where a product's epilogue cannot join it (it also reads a later
    // product), `lone` tries the product alone.
    let modes: &[Consumers] = if lone {
        &[Consumers::Any, Consumers::Skipped]
    } else {
        &[Consumers::AtLeastOne]
    };
    // A group leaves child `i` to the child after it (the group goes to
    // its update's place), which is then looked at in turn.
    let mut i = 0;
    while i < children.len() {
        let mut placed = false;
        for mode in modes {
            let Some((taken, merged)) = group_at(program, scop, &stmts, i, *mode)? else {
                continue;
            };
            let (next, next_grouped) = place(&children, &grouped, &taken, merged);
            let candidate = to_schedule(isl, &tree.domain, next.clone())?;
            if crate::schedule::check_legal(&program.source, &candidate, scop, deps).is_ok() {
                children = next;
                grouped = next_grouped;
                stmts = child_statements(isl, scop, &children)?;
                placed = true;
                break;
            }
        }
        if !placed {
            i += 1;
        }
    }
    Ok(Some(Grouped {
        domain: tree.domain,
        children,
        grouped,
    }))
}

/// [`contraction_epilogues`] with each run of two or more consecutive
/// children between the products (a LayerNorm's mean, variance and
/// normalisation before its product) scheduled together by isl under
/// maximal fusion, as that part would be scheduled on its own (one kernel
/// that keeps each row on chip, `pipeline::probe`'s rows), instead of one
/// kernel per statement. The products are the contractions' groups and
/// the children that hold a product the groups left (see
/// [`is_product`]); runs never cross them, so no product is fused into a
/// kernel that loses its tiles. A run isl cannot schedule stays as it
/// was; the result is checked against every dependence. `None` where
/// there is no product, or no run changes.
pub fn contraction_epilogues_fused_runs(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    schedule: &Schedule,
) -> Result<Option<Schedule>> {
    let Some(g) = groups(isl, program, scop, deps, schedule, true)? else {
        return Ok(None);
    };
    let stmts = child_statements(isl, scop, &g.children)?;
    let boundary: Vec<bool> = (0..g.children.len())
        .map(|k| g.grouped[k] || stmts[k].iter().any(|s| is_product(program, s)))
        .collect();
    if !boundary.contains(&true) {
        return Ok(None);
    }
    let all = deps.all()?;
    let mut children = Vec::new();
    let mut changed = false;
    let mut k = 0;
    while k < g.children.len() {
        let end = (k..g.children.len())
            .find(|j| boundary[*j])
            .unwrap_or(g.children.len());
        if boundary[k] || end - k < 2 {
            children.push(g.children[k].clone());
            k += 1;
            continue;
        }
        let run = &g.children[k..end];
        match fused_run(isl, scop, &all, run)? {
            Some(child) => {
                children.push(child);
                changed = true;
            }
            None => children.extend(run.iter().cloned()),
        }
        k = end;
    }
    if !changed {
        return Ok(None);
    }
    let candidate = to_schedule(isl, &g.domain, children)?;
    if crate::schedule::check_legal(&program.source, &candidate, scop, deps).is_err() {
        return Ok(None);
    }
    Ok(Some(candidate))
}

/// Whether `s` is the initialisation or update of a product-like sum: a
/// sum over at least one reduction index into a tensor of two or more
/// dimensions (a matrix product, a batched matrix-vector product). Row
/// statistics (a sum into one value a row) are not.
fn is_product(program: &Program, s: &ModelStmt) -> bool {
    let st = &program.statements[s.source];
    matches!(s.kind, StmtKind::Init | StmtKind::Update)
        && matches!(
            st.op,
            AssignOp::Reduce {
                op: Reducer::Sum,
                ..
            }
        )
        && !st.reduction_indices.is_empty()
        && st.lhs_indices.len() >= 2
}

/// The children `run` as one child: their instances scheduled by isl
/// under maximal fusion with the dependences among them (`all`
/// restricted to them); `None` where isl gives up.
fn fused_run(
    isl: &Isl,
    scop: &Scop,
    all: &crate::isl::UnionMap,
    run: &[(String, Tree)],
) -> Result<Option<(String, Tree)>> {
    let mut domain: Option<crate::isl::UnionSet> = None;
    for (filter, _) in run {
        let f = isl.union_set(filter)?.intersect(scop.domain()?)?;
        domain = Some(match domain {
            None => f,
            Some(d) => d.union(f)?,
        });
    }
    let Some(domain) = domain else {
        return Ok(None);
    };
    let inside = all
        .copy()?
        .intersect_domain(domain.copy()?)?
        .intersect_range(domain.copy()?)?;
    let filter = domain.text();
    let Some(s) = crate::schedule::compute_on(isl, scop, domain, inside, Strategy::Max)? else {
        return Ok(None);
    };
    let tree = ScheduleTree::from_isl(&s.get_root()?)?;
    Ok(Some((filter, tree.root)))
}

/// `children` (marked `grouped`) with those `taken` replaced by the group
/// `merged`, at the place of its update (`taken[1]`): the children it
/// skipped over between its initialisation and its update before it,
/// those after the update after it, in their order.
fn place(
    children: &[(String, Tree)],
    grouped: &[bool],
    taken: &[usize],
    merged: (String, Tree),
) -> (Vec<(String, Tree)>, Vec<bool>) {
    let at = taken[1];
    let mut next = Vec::new();
    let mut next_grouped = Vec::new();
    let mut merged = Some(merged);
    for (k, child) in children.iter().enumerate() {
        if k > at {
            if let Some(m) = merged.take() {
                next.push(m);
                next_grouped.push(true);
            }
        }
        if !taken.contains(&k) {
            next.push(child.clone());
            next_grouped.push(grouped[k]);
        }
    }
    if let Some(m) = merged {
        next.push(m);
        next_grouped.push(true);
    }
    (next, next_grouped)
}

/// Which consumers a group takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consumers {
    /// Every pointwise consumer, and at least one.
    AtLeastOne,
    /// Every pointwise consumer, or none where there is none.
    Any,
    /// None: the product alone, its initialisation in its band.
    Skipped,
}

/// The statements of each child.
fn child_statements<'a>(
    isl: &Isl,
    scop: &'a Scop,
    children: &[(String, Tree)],
) -> Result<Vec<Vec<&'a ModelStmt>>> {
    children
        .iter()
        .map(|(filter, _)| scop.statements_in(&isl.union_set(filter)?))
        .collect()
}

/// The statement of child `k`, where it holds exactly one.
fn single<'a>(stmts: &[Vec<&'a ModelStmt>], k: usize) -> Option<&'a ModelStmt> {
    match stmts.get(k).map(|v| v.as_slice()) {
        Some([s]) => Some(*s),
        _ => None,
    }
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
/// one that touches the accumulator otherwise; as `mode` says): the children it takes
/// (the initialisation's, the update's, then the consumers') and the child
/// that replaces them.
fn group_at(
    program: &Program,
    scop: &Scop,
    stmts: &[Vec<&ModelStmt>],
    i: usize,
    mode: Consumers,
) -> Result<Option<Group>> {
    let Some(init) = single(stmts, i) else {
        return Ok(None);
    };
    if init.kind != StmtKind::Init {
        return Ok(None);
    }
    // The update: the next child, or a later one where the children in
    // between neither read nor write the accumulator (minimal fusion may
    // place an initialisation early, before the statements that make the
    // product's operands); those children then run before the group.
    let acc = &program.statements[init.source].lhs_tensor;
    let mut u = i + 1;
    while let Some(between) = stmts.get(u) {
        if between
            .iter()
            .any(|s| s.source == init.source || touches(program, s, acc))
        {
            break;
        }
        u += 1;
    }
    let Some(update) = single(stmts, u) else {
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
    let mut taken = vec![i, u];
    for j in u + 1..stmts.len() {
        if mode == Consumers::Skipped {
            break;
        }
        let Some(t) = single(stmts, j) else { break };
        match element_of(program, t, &st.lhs_tensor, rank) {
            Some(subs) => {
                consumers.push((t, subs));
                taken.push(j);
            }
            None if touches(program, t, &st.lhs_tensor) => break,
            None => {}
        }
    }
    if consumers.is_empty() && mode == Consumers::AtLeastOne {
        return Ok(None);
    }
    // Outside `AtLeastOne` (the fused runs' groups), only products: a
    // row's statistic stays with the run it belongs to.
    if mode != Consumers::AtLeastOne && !is_product(program, update) {
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

    /// `json`'s program, its model, dependences and minimal-fusion
    /// schedule, given to `f`.
    fn with_min<R>(
        json: &str,
        f: impl FnOnce(&Isl, &Program, &Scop, &Dependences, &Schedule) -> R,
    ) -> R {
        let program = load_str(json, "p.json").unwrap();
        let isl = Isl::new();
        let scop = crate::model::build(&isl, &program).unwrap();
        let order = crate::schedule::canonical(&isl, &scop).unwrap();
        let deps = crate::deps::compute(&scop, &order).unwrap();
        let min =
            crate::schedule::compute(&isl, &scop, &deps, crate::schedule::Strategy::Min).unwrap();
        f(&isl, &program, &scop, &deps, &min)
    }

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
        with_min(json, |isl, program, scop, deps, min| {
            let fused = contraction_epilogues(isl, program, scop, deps, min)
                .unwrap()
                .expect("a group");
            crate::schedule::check_legal("p.json", &fused, scop, deps).unwrap();
            let text = fused.get_root().unwrap().text();
            // The consumer's member along `m` is its second iterator (`i`).
            assert!(text.contains("S1[j, i] -> [(i)]"), "{text}");
            assert!(text.contains("S1[j, i] -> [(55)]"), "{text}");
            let tree = ScheduleTree::from_isl(&fused.get_root().unwrap()).unwrap();
            assert!(matches!(tree.root, Tree::Band(..)), "{text}");
        });
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
        with_min(json, |isl, program, scop, deps, min| {
            // The group is found (the consumer reads `acc` at its element)...
            let stmts = child_statements(isl, scop, &{
                let tree = ScheduleTree::from_isl(&min.get_root().unwrap()).unwrap();
                match tree.root {
                    Tree::Sequence(c) => c,
                    other => panic!("{other:?}"),
                }
            })
            .unwrap();
            let at = (0..stmts.len())
                .position(|k| single(&stmts, k).is_some_and(|s| s.name == "S1_init"))
                .unwrap();
            assert!(group_at(program, scop, &stmts, at, Consumers::AtLeastOne)
                .unwrap()
                .is_some());
            // ...and refused by the dependences.
            assert!(contraction_epilogues(isl, program, scop, deps, min)
                .unwrap()
                .is_none());
        });
    }

    /// A LayerNorm before a product whose accumulator minimal fusion
    /// initialises early (before the normalisation that makes its
    /// operand): the group still forms, at its update's place, and the
    /// normalisation's four statements become one child of the sequence
    /// (one band over the rows), beside the product's; the result is
    /// legal. Without a product nothing is fused.
    #[test]
    fn the_statements_before_a_product_are_fused_as_one_run() {
        let json = r#"{"name": "p", "params": {"M": 30, "N": 26, "K": 50},
            "inputs": {"X": {"dtype": "f32", "shape": ["M", "K"]},
                       "W": {"dtype": "f32", "shape": ["K", "N"]}},
            "outputs": {"Y": {"dtype": "f32", "shape": ["M", "N"]}},
            "temps": {"mu": {"dtype": "f32", "shape": ["M"]},
                      "var": {"dtype": "f32", "shape": ["M"]},
                      "Xn": {"dtype": "f32", "shape": ["M", "K"]},
                      "acc": {"dtype": "f32", "shape": ["M", "N"]}},
            "body": ["mu(m) +=! X(m, k) / K",
                     "var(m) +=! (X(m, k) - mu(m)) * (X(m, k) - mu(m)) / K",
                     "Xn(m, k) = (X(m, k) - mu(m)) * rsqrt(var(m) + 1e-5)",
                     "acc(m, n) +=! Xn(m, k) * W(k, n)",
                     "Y(m, n) = tanh(acc(m, n))"]}"#;
        with_min(json, |isl, program, scop, deps, min| {
            let runs = contraction_epilogues_fused_runs(isl, program, scop, deps, min)
                .unwrap()
                .expect("a run fused");
            crate::schedule::check_legal("p.json", &runs, scop, deps).unwrap();
            let tree = ScheduleTree::from_isl(&runs.get_root().unwrap()).unwrap();
            let Tree::Sequence(children) = &tree.root else {
                panic!("{tree:?}");
            };
            assert_eq!(children.len(), 2, "{children:?}");
            let normalisation = isl.union_set(&children[0].0).unwrap();
            let names: Vec<String> = scop
                .statements_in(&normalisation)
                .unwrap()
                .iter()
                .map(|s| s.name.clone())
                .collect();
            for s in ["S0_init", "S0", "S1_init", "S1", "S2"] {
                assert!(names.contains(&s.to_string()), "{names:?}");
            }
            assert!(matches!(children[0].1, Tree::Band(..)), "{children:?}");
            let product = isl.union_set(&children[1].0).unwrap();
            assert_eq!(scop.statements_in(&product).unwrap().len(), 3);
        });
        let alone = r#"{"name": "p", "params": {"M": 30, "K": 50},
            "inputs": {"X": {"dtype": "f32", "shape": ["M", "K"]}},
            "outputs": {"Y": {"dtype": "f32", "shape": ["M", "K"]}},
            "temps": {"mu": {"dtype": "f32", "shape": ["M"]},
                      "var": {"dtype": "f32", "shape": ["M"]}},
            "body": ["mu(m) +=! X(m, k) / K",
                     "var(m) +=! (X(m, k) - mu(m)) * (X(m, k) - mu(m)) / K",
                     "Y(m, k) = (X(m, k) - mu(m)) * rsqrt(var(m) + 1e-5)"]}"#;

        with_min(alone, |isl, alone, scop, deps, min| {
            assert!(
                contraction_epilogues_fused_runs(isl, alone, scop, deps, min)
                    .unwrap()
                    .is_none()
            );
        });
    }

    /// Two products whose epilogue reads both (an FFN's gate and up
    /// projections, `H = silu(G) U`): the epilogue cannot join the first
    /// product's band (it reads the second product), so with the runs
    /// fused the first product is grouped alone with its initialisation,
    /// the second with the epilogue; no product's initialisation is left a
    /// child of its own, and the result is legal.
    #[test]
    fn a_product_whose_epilogue_reads_a_later_product_is_grouped_alone() {
        let json = r#"{"name": "p", "params": {"M": 30, "N": 26, "K": 50},
            "inputs": {"X": {"dtype": "f32", "shape": ["M", "K"]},
                       "Wg": {"dtype": "f32", "shape": ["K", "N"]},
                       "Wu": {"dtype": "f32", "shape": ["K", "N"]}},
            "outputs": {"H": {"dtype": "f32", "shape": ["M", "N"]}},
            "temps": {"G": {"dtype": "f32", "shape": ["M", "N"]},
                      "U": {"dtype": "f32", "shape": ["M", "N"]}},
            "body": ["G(m, n) +=! X(m, k) * Wg(k, n)",
                     "U(m, n) +=! X(m, k) * Wu(k, n)",
                     "H(m, n) = G(m, n) * sigmoid(G(m, n)) * U(m, n)"]}"#;
        with_min(json, |isl, program, scop, deps, min| {
            let g = groups(isl, program, scop, deps, min, true)
                .unwrap()
                .expect("a sequence");
            let names = |k: usize| -> Vec<String> {
                let f = isl.union_set(&g.children[k].0).unwrap();
                let mut n: Vec<String> = scop
                    .statements_in(&f)
                    .unwrap()
                    .iter()
                    .map(|s| s.name.clone())
                    .collect();
                n.sort();
                n
            };
            let all: Vec<Vec<String>> = (0..g.children.len()).map(names).collect();
            assert_eq!(g.grouped, vec![true, true], "{all:?}");
            assert_eq!(all[0], ["S0", "S0_init"], "{all:?}");
            assert_eq!(all[1], ["S1", "S1_init", "S2"], "{all:?}");
            let s = to_schedule(isl, &g.domain, g.children.clone()).unwrap();
            crate::schedule::check_legal("p.json", &s, scop, deps).unwrap();
            // Without `lone` the first product has no epilogue it can take:
            // only the second is grouped.
            let plain = groups(isl, program, scop, deps, min, false)
                .unwrap()
                .expect("a sequence");
            assert_eq!(plain.grouped.iter().filter(|g| **g).count(), 1);
        });
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
        with_min(json, |isl, program, scop, deps, min| {
            assert!(contraction_epilogues(isl, program, scop, deps, min)
                .unwrap()
                .is_none());
        });
    }
}
