//! Sums into one accumulator fused into one band: an LSTM cell's gates as
//! two products into one tensor (`G +=! X W`, then `G += H U`, issue 35),
//! and with them the accumulator's in-place epilogue (`G = G + bias`),
//! at the top of the schedule or below outer bands (an LSTM step's gates
//! under its loop blocks' host loops, issue 36).
//!
//! isl's scheduler puts the second sum in a loop nest of its own beside
//! the first (its memory-based dependences order every `k` of the first
//! before every `k'` of the second at each element, which a shared band
//! can only express by shifting `k'` by the first's extent), so the
//! accumulator goes through memory between two kernels. Where the shift
//! exceeds the constants it may use (`MAX_CONSTANT_SHIFT`, at realistic
//! sizes), isl fuses them over the element's loops with each reduction in
//! a loop below, a form the contraction recogniser does not take (and the
//! mapping runs each loop across the lanes of a warp). The rewrite takes
//! consecutive children of any sequence of the tree: the first holds
//! `C`'s initialisation `I` and its update `U_1[e, k_1]` (or `I` alone,
//! `U_1` then in the next child), and every child taken holds only further
//! updates `U_j[e, k_j]` of `C` at their own element (a `+=` without `!`:
//! the sum goes on from `U_{j-1}`'s, reading no `C` on its right side)
//! and in-place epilogues `T_t[e]` of `C` (`C(e) = f(C(e), ..)`, reading
//! `C` at no other element), every update before every epilogue in
//! program order and at least two sums in all:
//!
//! ```text
//!   sequence [I, U_1: ..., U_2: ..., .., U_n: ..., T_1: ..., .., T_m: ...]
//!     =>  band [ e_{d_0}, .., e_{d_q}, κ ] { sequence [I, U_1, .., U_n, T_1, .., T_m] }
//! ```
//!
//! with `e_d` the element's subscript `d` and `κ` the reduction index,
//! shifted for `U_j` past the ranges of `U_1 .. U_{j-1}` (`k_j + o_j`,
//! `o_j = hi_{j-1} + o_{j-1} + 1 - lo_j`), `lo_1` for `I` and the last
//! sum's last shifted value for the `T_t`. Each element then runs its
//! initialisation, every step of the first sum, then every step of the
//! next, then its epilogues: the program's order of one element's
//! instances. No statement of the run reads `C` but at its own element
//! (checked), and their other reads are of tensors none of them writes, so
//! no other dependence relates two of them: the element's members are
//! parallel (coincident) and the band permutable.
//!
//! Below outer bands (the sequence of one host step of a loop block, under
//! `band [l + t]` of a wavefront or `band [l], band [t]` of steps) the
//! outer bands stay as they are: an instance `x` is scheduled at `(P(x),
//! n, σ(x), s)`, `P` the outer bands' prefix schedule, `n` the position of
//! the merged child in the sequence (where the run's consecutive children
//! were), `σ` the new band and `s` the statement's position in the
//! program. A dependence `x -> y` with `P(x) ≠ P(y)` is ordered by `P` as
//! before; one with `P(x) = P(y)` and an end outside the run by `n` as
//! before (the other children keep their positions around the run); one
//! with both ends in the run relates one element (see above), which `σ`
//! and `s` order as the program does. A subscript `e_d` that `P` and the
//! members kept before it determine (`[P, e_{d_0}, ..]^{-1} ∘ e_d`
//! single-valued over the run's instances: `t = w - l` under the
//! wavefront's `w = l + t`, `l` and `t` under steps) is left out of the
//! band: it would add a member with one value per value of the others (a
//! grid dimension of empty blocks on the GPU), and the instances it tells
//! apart differ in `P` or in a kept member already, so the order stays
//! the same. The result, top-level or nested, is checked against every
//! dependence all the same (`check_legal`) and kept only where it is
//! legal.
//!
//! On the GPU the band is one kernel: a tensor-core contraction with one
//! reduction loop per sum (`gpu::contraction`'s terms), or else a register
//! tile.

use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{collect_reads, AssignOp, Program, Reducer};
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, Schedule, ScheduleNodeType, UnionMap};
use crate::model::{ModelStmt, Scop, StmtKind};

/// `schedule` with every run of sums into one accumulator (see the module
/// documentation), in any sequence of the tree, fused into one band, each
/// kept only where the schedule stays legal (`deps`); `None` where none
/// is.
pub fn fuse_sibling_sums(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    schedule: &Schedule,
) -> Result<Option<Schedule>> {
    let tree = ScheduleTree::from_isl(&schedule.get_root()?)?;
    let mut paths = Vec::new();
    sequence_paths(&tree.root, &mut Vec::new(), &mut paths);
    let mut root = tree.root;
    let mut changed = false;
    // The last in pre-order first: a rewrite renumbers the children of its
    // sequence only, so the paths of the sequences before it (its
    // ancestors among them) stay as they are.
    for path in paths.iter().rev() {
        let fusion = Fusion {
            isl,
            program,
            scop,
            deps,
            domain: &tree.domain,
        };
        changed |= fusion.at(&mut root, path)?;
    }
    if !changed {
        return Ok(None);
    }
    Ok(Some(to_schedule(isl, &tree.domain, root)?))
}

/// The path of every sequence in `tree`, in pre-order: for each node on
/// the way, the index of the child taken (0 below a band or mark).
fn sequence_paths(tree: &Tree, path: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    match tree {
        Tree::Leaf => {}
        Tree::Band(_, c) | Tree::Mark(_, c) => {
            path.push(0);
            sequence_paths(c, path, out);
            path.pop();
        }
        Tree::Sequence(ch) | Tree::Set(ch) => {
            if matches!(tree, Tree::Sequence(_)) {
                out.push(path.clone());
            }
            for (i, (_, c)) in ch.iter().enumerate() {
                path.push(i);
                sequence_paths(c, path, out);
                path.pop();
            }
        }
    }
}

/// The node at `path`.
fn node_at<'a>(tree: &'a mut Tree, path: &[usize]) -> Option<&'a mut Tree> {
    let Some((&i, rest)) = path.split_first() else {
        return Some(tree);
    };
    match tree {
        Tree::Leaf => None,
        Tree::Band(_, c) | Tree::Mark(_, c) => node_at(c, rest),
        Tree::Sequence(ch) | Tree::Set(ch) => node_at(&mut ch.get_mut(i)?.1, rest),
    }
}

/// A sequence of `children`, or the only child alone (its filter is the
/// sequence's domain, which the filter or domain above gives already).
fn sequence_of(children: Vec<(String, Tree)>) -> Tree {
    match <[_; 1]>::try_from(children) {
        Ok([(_, only)]) => only,
        Err(children) => Tree::Sequence(children),
    }
}

fn to_schedule(isl: &Isl, domain: &str, root: Tree) -> Result<Schedule> {
    let tree = ScheduleTree {
        domain: domain.to_string(),
        root,
    };
    isl.schedule(&tree.to_isl_text())
}

/// The prefix schedule `P` of the node at `path` of `root`: the outer
/// bands' members, as a map from each instance that reaches the node.
fn prefix_at(isl: &Isl, domain: &str, root: &Tree, path: &[usize]) -> Result<UnionMap> {
    let schedule = to_schedule(isl, domain, root.clone())?;
    let mut node = schedule.get_root()?.child(0)?;
    for &i in path {
        node = match node.get_type()? {
            ScheduleNodeType::Sequence | ScheduleNodeType::Set => node.child(i as i32)?.child(0)?,
            _ => node.child(0)?,
        };
    }
    Ok(node.get_prefix_schedule_union_map()?)
}

/// What a rewrite needs besides the tree.
struct Fusion<'a> {
    isl: &'a Isl,
    program: &'a Program,
    scop: &'a Scop,
    deps: &'a Dependences,
    domain: &'a str,
}

impl Fusion<'_> {
    /// `root` with the runs of sums in the sequence at `path` fused, each
    /// kept only where the whole schedule stays legal; whether one was.
    fn at(&self, root: &mut Tree, path: &[usize]) -> Result<bool> {
        let Some(Tree::Sequence(children)) = node_at(root, path) else {
            return Ok(false);
        };
        let mut children = children.clone();
        // Made where a run is found (most sequences hold none).
        let mut prefix = None;
        let mut changed = false;
        let mut i = 0;
        while i + 1 < children.len() {
            let stmts = statements(self.isl, self.scop, &children)?;
            let Some(run) = run_at(self.program, self.scop, &stmts, i)? else {
                i += 1;
                continue;
            };
            let p = match prefix.take() {
                Some(p) => p,
                None => prefix_at(self.isl, self.domain, root, path)?,
            };
            let merged = merged_child(self.isl, self.program, self.scop, &run, &p)?;
            // A rewrite leaves the outer bands, so the prefix, as they are.
            prefix = Some(p);
            let mut next: Vec<(String, Tree)> = children[..i].to_vec();
            next.push(merged);
            next.extend(children[i + run.count..].iter().cloned());
            let mut candidate = root.clone();
            if let Some(node) = node_at(&mut candidate, path) {
                *node = sequence_of(next.clone());
            }
            let schedule = to_schedule(self.isl, self.domain, candidate.clone())?;
            let legal =
                crate::schedule::check_legal(&self.program.source, &schedule, self.scop, self.deps);
            if legal.is_ok() {
                *root = candidate;
                changed = true;
                if next.len() == 1 {
                    break;
                }
                children = next;
            }
            i += 1;
        }
        Ok(changed)
    }
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

/// A sum of one reduction index whose left side is distinct plain indices
/// and whose right side does not read its own tensor: its reduction range
/// `(lo, hi)` where both are constants. Its iterators are its loop
/// blocks' indices, its left side's and the reduction index (last): at
/// one value of the blocks' indices the element's instances are one per
/// reduction step, whether or not the element names the blocks' indices
/// (an accumulator reused by every step of a block).
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
    let mut named: Vec<&String> = st
        .lhs_indices
        .iter()
        .chain(st.blocks.iter().map(|b| &b.index))
        .collect();
    named.sort();
    named.dedup();
    let mut reads = Vec::new();
    collect_reads(&st.rhs, &mut reads);
    if s.kind != StmtKind::Update
        || !is_sum
        || st.reduction_indices.len() != 1
        || lhs.len() != st.lhs_indices.len()
        || s.iterators.len() != named.len() + 1
        || s.iterators.last() != st.reduction_indices.first()
        || reads.iter().any(|(t, _)| *t == st.lhs_tensor)
    {
        return Ok(None);
    }
    let k = (s.iterators.len() - 1) as i32;
    let (Ok(lo), Ok(hi)) = (
        constant(s.domain.copy()?.dim_min_val(k)),
        constant(s.domain.copy()?.dim_max_val(k)),
    ) else {
        return Ok(None);
    };
    Ok(Some((lo, hi)))
}

/// A run of sums found in a sequence: how many children it takes, and its
/// statements.
struct Run<'a> {
    count: usize,
    init: &'a ModelStmt,
    /// Each sum with its reduction range.
    sums: Vec<(&'a ModelStmt, (i64, i64))>,
    /// The in-place epilogues, each with its subscript of each of the
    /// accumulator's dimensions.
    epilogues: Vec<(&'a ModelStmt, Vec<String>)>,
}

/// The role of a statement in a run of sums into one accumulator.
enum Role {
    /// A further sum into the accumulator (its reduction range).
    Sum((i64, i64)),
    /// An in-place epilogue (its subscript of each dimension).
    Epilogue(Vec<String>),
}

/// The run of sums that starts at child `i`, if one does: the first
/// child holds the initialisation and the first sum (or the
/// initialisation alone, the first sum then in the next child), every
/// child taken holds only further sums and in-place epilogues, and in
/// program order every sum comes before every epilogue.
fn run_at<'a>(
    program: &Program,
    scop: &Scop,
    stmts: &[Vec<&'a ModelStmt>],
    i: usize,
) -> Result<Option<Run<'a>>> {
    let mut head: Vec<&ModelStmt> = stmts[i].clone();
    let mut count = 1;
    if matches!(head.as_slice(), [s] if s.kind == StmtKind::Init) && i + 1 < stmts.len() {
        head.extend(stmts[i + 1].iter().copied());
        count = 2;
    }
    head.sort_by_key(|s| (s.source, s.kind != StmtKind::Init));
    let [init, first, rest @ ..] = head.as_slice() else {
        return Ok(None);
    };
    let (init, first) = (*init, *first);
    if init.kind != StmtKind::Init || init.source != first.source {
        return Ok(None);
    }
    let Some(range) = sum_range(program, first)? else {
        return Ok(None);
    };
    let mut taken: Vec<(&ModelStmt, Role)> = Vec::new();
    for u in rest {
        match role(program, scop, first, u)? {
            Some(r) => taken.push((*u, r)),
            None => return Ok(None),
        }
    }
    // The following children, each taken whole or not at all.
    'children: for child in &stmts[i + count..] {
        let mut roles = Vec::new();
        for u in child {
            match role(program, scop, first, u)? {
                Some(r) => roles.push((*u, r)),
                None => break 'children,
            }
        }
        taken.extend(roles);
        count += 1;
    }
    taken.sort_by_key(|(s, _)| s.source);
    let mut sums: Vec<(&ModelStmt, (i64, i64))> = vec![(first, range)];
    let mut epilogues = Vec::new();
    for (s, r) in taken {
        match r {
            Role::Sum(_) if !epilogues.is_empty() => return Ok(None),
            Role::Sum(r) => sums.push((s, r)),
            Role::Epilogue(subs) => epilogues.push((s, subs)),
        }
    }
    if sums.len() < 2 {
        return Ok(None);
    }
    Ok(Some(Run {
        count,
        init,
        sums,
        epilogues,
    }))
}

/// The role of `u` in a run whose first sum is `first`: a further sum
/// into its tensor at its own element, with no initialisation of its own
/// (a `+=`), or an in-place epilogue of that tensor.
fn role(program: &Program, scop: &Scop, first: &ModelStmt, u: &ModelStmt) -> Result<Option<Role>> {
    let f = &program.statements[first.source];
    let st = &program.statements[u.source];
    let rank = f.lhs_indices.len();
    if st.lhs_tensor != f.lhs_tensor || st.lhs_indices.len() != rank {
        return Ok(None);
    }
    if u.kind == StmtKind::Update {
        if scop.statement(&format!("{}_init", u.name)).is_some() {
            return Ok(None);
        }
        return Ok(sum_range(program, u)?.map(Role::Sum));
    }
    Ok(crate::schedule::epilogue::element_of(program, u, &f.lhs_tensor, rank).map(Role::Epilogue))
}

/// Each statement of `run` as isl's tuple `S[i, ..]`, with its subscript
/// of each of the accumulator's dimensions.
fn elements<'a>(program: &Program, run: &Run<'a>) -> Vec<(&'a ModelStmt, Vec<String>)> {
    let lhs = |s: &ModelStmt| program.statements[s.source].lhs_indices.clone();
    std::iter::once((run.init, lhs(run.init)))
        .chain(run.sums.iter().map(|(s, _)| (*s, lhs(s))))
        .chain(run.epilogues.iter().cloned())
        .collect()
}

fn tuple(s: &ModelStmt) -> String {
    format!("{}[{}]", s.name, s.iterators.join(", "))
}

/// The accumulator's dimensions the band keeps: each `d` whose subscript
/// the prefix `P` and the subscripts kept before it leave free (see the
/// module documentation).
fn kept_dimensions(
    isl: &Isl,
    scop: &Scop,
    elements: &[(&ModelStmt, Vec<String>)],
    prefix: &UnionMap,
) -> Result<Vec<usize>> {
    let p = &scop.param_prefix;
    let map = |dims: &[usize]| -> Result<UnionMap> {
        let parts: Vec<String> = elements
            .iter()
            .map(|(s, e)| {
                let v: Vec<&str> = dims.iter().map(|d| e[*d].as_str()).collect();
                format!("{} -> [{}]", tuple(s), v.join(", "))
            })
            .collect();
        isl.union_map(&format!("{p}{{ {} }}", parts.join("; ")))
    };
    let rank = elements[0].1.len();
    let prefix = prefix.copy()?.intersect_domain(map(&[])?.domain()?)?;
    let mut kept = Vec::new();
    for d in 0..rank {
        let known = prefix.copy()?.range_product(map(&kept)?)?;
        let determined = known.reverse()?.apply_range(map(&[d])?)?;
        if !determined.is_single_valued()? {
            kept.push(d);
        }
    }
    Ok(kept)
}

/// The child that replaces the run's children: the band over the kept
/// element dimensions and `κ`, above a sequence of the run's statements.
fn merged_child(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    run: &Run,
    prefix: &UnionMap,
) -> Result<(String, Tree)> {
    let elements = elements(program, run);
    let kept = kept_dimensions(isl, scop, &elements, prefix)?;
    let p = &scop.param_prefix;
    // The shift of each sum's reduction index, and the last shifted value.
    let mut shifts = Vec::new();
    let mut end = run.sums[0].1 .0 - 1;
    for (_, (lo, hi)) in &run.sums {
        let shift = end + 1 - lo;
        shifts.push(shift);
        end = hi + shift;
    }
    let kappa = |s: &ModelStmt| -> String {
        if s.kind == StmtKind::Init {
            return run.sums[0].1 .0.to_string();
        }
        match run
            .sums
            .iter()
            .zip(&shifts)
            .find(|((u, _), _)| u.name == s.name)
        {
            Some(((u, _), shift)) => format!(
                "{} + ({shift})",
                program.statements[u.source].reduction_indices[0]
            ),
            None => end.to_string(),
        }
    };
    let mut members = Vec::new();
    for d in kept.iter().map(Some).chain([None]) {
        let parts: Vec<String> = elements
            .iter()
            .map(|(s, e)| {
                let v = d.map_or_else(|| kappa(s), |d| e[*d].clone());
                format!("{} -> [({v})]", tuple(s))
            })
            .collect();
        members.push(format!("{{ {} }}", parts.join("; ")));
    }
    let band = Band {
        schedule: format!("{p}[{}]", members.join(", ")),
        permutable: true,
        coincident: (0..=kept.len()).map(|d| d < kept.len()).collect(),
    };
    let inner: Vec<(String, Tree)> = elements
        .iter()
        .map(|(s, _)| (format!("{p}{{ {} }}", tuple(s)), Tree::Leaf))
        .collect();
    let filter = format!(
        "{p}{{ {} }}",
        elements
            .iter()
            .map(|(s, _)| tuple(s))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok((filter, Tree::Band(band, Box::new(Tree::Sequence(inner)))))
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

    /// An RNN step's gates under its loop block: `G +=! X W`, `G += H U`,
    /// `G = G + c`, then a consumer of two elements of `G` (no epilogue).
    fn recurrent_gates(second: &str) -> String {
        format!(
            r#"{{"name": "p", "params": {{"T": 5, "B": 4, "I": 24, "H": 16}},
            "inputs": {{"X": {{"dtype": "f32", "shape": ["T", "B", "I"]}},
                       "W": {{"dtype": "f32", "shape": ["I", "H"]}},
                       "U": {{"dtype": "f32", "shape": ["H", "H"]}},
                       "c": {{"dtype": "f32", "shape": ["H"]}},
                       "H0": {{"dtype": "f32", "shape": ["B", "H"]}}}},
            "outputs": {{"Hs": {{"dtype": "f32", "shape": ["T+1", "B", "H"]}}}},
            "temps": {{"G": {{"dtype": "f32", "shape": ["T+1", "B", "H"]}}}},
            "body": ["Hs(t, b, h) = H0(b, h) where t in 0:1",
                     {{"for": "t in 1:T+1", "body": [
                        "G(t, b, n) +=! X(t - 1, b, k) * W(k, n)",
                        "{second}",
                        "G(t, b, n) = G(t, b, n) + c(n)",
                        "Hs(t, b, h) = tanh(G(t, b, h)) * G(t, b, H - 1 - h)"]}}]}}"#
        )
    }

    /// The host-stepped schedule of `json` (one step a value of `t`), and
    /// that schedule with its sums fused where they are (its text and
    /// tree).
    fn stepped_and_fused(json: &str) -> (String, Option<(String, Tree)>) {
        let program = load_str(json, "p.json").unwrap();
        let isl = Isl::new();
        let scop = crate::model::build(&isl, &program).unwrap();
        let order = crate::schedule::canonical(&isl, &scop).unwrap();
        let deps = crate::deps::compute(&scop, &order).unwrap();
        let strategy = crate::schedule::Strategy::Isl;
        let stepped = crate::schedule::host::stepped(&isl, &scop, &deps, strategy, true)
            .unwrap()
            .unwrap();
        let before = stepped.schedule.get_root().unwrap().text();
        let fused = fuse_sibling_sums(&isl, &program, &scop, &deps, &stepped.schedule).unwrap();
        let fused = fused.map(|f| {
            crate::schedule::check_legal("p.json", &f, &scop, &deps).unwrap();
            let root = f.get_root().unwrap();
            (root.text(), ScheduleTree::from_isl(&root).unwrap().root)
        });
        (before, fused)
    }

    /// The first band whose child is a sequence of leaves (a fused run).
    fn fused_band(tree: &Tree) -> Option<&Band> {
        match tree {
            Tree::Band(b, c) => match c.as_ref() {
                Tree::Sequence(ch) if ch.iter().all(|(_, t)| *t == Tree::Leaf) => Some(b),
                c => fused_band(c),
            },
            Tree::Mark(_, c) => fused_band(c),
            Tree::Sequence(ch) | Tree::Set(ch) => ch.iter().find_map(|(_, c)| fused_band(c)),
            Tree::Leaf => None,
        }
    }

    /// Below the host loop over `t` the initialisation, both sums and the
    /// bias share one band over `(b, n, κ)`: `t`, which the host band
    /// fixes, is no member of it (one value per step).
    #[test]
    fn sums_under_a_host_loop_share_one_band_without_its_index() {
        let json = recurrent_gates("G(t, b, n) += Hs(t - 1, b, j) * U(j, n)");
        let (before, fused) = stepped_and_fused(&json);
        let (text, tree) = fused.unwrap_or_else(|| panic!("not fused:\n{before}"));
        assert!(text.contains("host_loop_steps"), "{text}");
        let band = fused_band(&tree).unwrap_or_else(|| panic!("{text}"));
        assert_eq!(band.coincident, [true, true, false], "{text}");
        for member in [
            "S1_init[t, b, n] -> [(0)]",
            "S1[t, b, n, k] -> [(k)]",
            "S2[t, b, n, j] -> [(24 + j)]",
            "S3[t, b, n] -> [(39)]",
        ] {
            assert!(band.schedule.contains(member), "{member}: {text}");
        }
        assert!(!band.schedule.contains("-> [(t)]"), "{text}");
    }

    /// The second sum reads the accumulator (the last step's gates): not
    /// a run, nothing changes.
    #[test]
    fn a_sum_that_reads_its_accumulator_is_not_fused() {
        let first = r#""Hs(t, b, h) = H0(b, h) where t in 0:1","#;
        let json = recurrent_gates("G(t, b, n) += G(t - 1, b, j) * U(j, n)").replace(
            first,
            &format!(r#"{first} "G(t, b, h) = H0(b, h) where t in 0:1","#),
        );
        let (before, fused) = stepped_and_fused(&json);
        assert!(fused.is_none(), "{before}");
    }

    /// A second `+=!` starts the accumulator over: no run of sums, nothing
    /// changes.
    #[test]
    fn a_second_initialisation_is_no_further_sum() {
        let json = gates(24, 16, "G(b, n) +=! Hp(b, k) * U(k, n)");
        assert!(isl_and_fused(&json).0.is_none());
    }
}
