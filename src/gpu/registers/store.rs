//! Epilogue statements of a register tile run where its registers are
//! stored, after the region's sequential loops.
//!
//! A product's epilogue (`H(b, f) = silu(Z(b, f) + b1(f))` after
//! `Z(b, f) +=! X(b, d) * W1(d, f)`, or the `T = T · f` that
//! `repair::factor` moves out of a sum) is fused by the scheduler into the
//! product's band at the last step of the reduction. Printed there, it
//! sits inside the unrolled step loop behind a test of the last step, for
//! every register slot: the kernel's code and register pressure grow (the
//! f32 MLP's product with its SiLU used 255 registers), and its operands
//! are promoted to shared memory and copied at every step. Run once per
//! element after the loops, where the registers are stored, it costs what
//! a tensor-core epilogue costs.
//!
//! Why moving is legal. Let `E` be the set of such statements and `K` the
//! kernel's instances. Every statement of `E` reads the tile's tensor `T`
//! only at its own element, through subscripts that are a permutation of
//! its iterators (so its instances are in bijection with elements), and
//! runs on every element of `T` (its domain's image is all of `T`). The
//! register tile's element map sends each instance to the thread that owns
//! its element (every access to `T` in the kernel goes through it), so the
//! statement runs on the same thread, only later: after every instance of
//! the region, in program order per element. Running an instance later
//! keeps every dependence into it. A dependence out of it would break
//! only if its sink ran in between; so
//!
//! * no dependence leads from `E` to `K \ E`: `D ∩ (E → K \ E) = ∅`;
//! * within `E`, every dependence relates instances of the same element,
//!   from an earlier statement of the program to a later one (the order in
//!   which the store runs them);
//! * every instance of a statement of `E` is in the kernel;
//! * the tensors `E` writes other than `T` are not promoted in the kernel
//!   (a promoted copy would be written back over them), and the tensors
//!   `E` reads other than `T` are not written in the kernel (their values
//!   in global memory are final).
//!
//! Where any statement of the kernel that assigns `T` (not a reduction
//! step) fails these conditions, none is moved.

use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{Affine, Program};
use crate::isl::{Isl, UnionMap, UnionSet};
use crate::model::{ModelStmt, Scop, StmtKind};

use super::RegisterTile;

/// One statement run at the store of a register tile (see the module
/// documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatement {
    /// The model statement (`S1`).
    pub statement: String,
    /// For each of its iterators, the dimension of the tile's element it
    /// equals: the store binds iterator `i` to `pf_g{element_dims[i]}`.
    pub element_dims: Vec<usize>,
}

/// The statements of the kernel (`kernel`, its instances) that run at the
/// store of `tile`, in program order; empty where none may.
/// `promoted`: the tensors the kernel copies to shared memory.
pub fn store_statements(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    kernel: &UnionSet,
    tile: &RegisterTile,
    promoted: &[String],
) -> Result<Vec<StoreStatement>> {
    let stmts = scop.statements_in(kernel)?;
    let t = &tile.tensor;
    let touches = |s: &ModelStmt| s.accesses(program).iter().any(|a| &a.tensor == t);
    let mut moved: Vec<&ModelStmt> = stmts
        .iter()
        .copied()
        .filter(|s| s.kind == StmtKind::Assign && touches(s))
        .collect();
    moved.sort_by_key(|s| s.source);
    if moved.is_empty() {
        return Ok(Vec::new());
    }
    let written_in_kernel: Vec<String> = stmts
        .iter()
        .map(|s| program.statements[s.source].lhs_tensor.clone())
        .collect();
    let mut out = Vec::new();
    for s in &moved {
        let Some(dims) = element_dims(program, s, t) else {
            return Ok(Vec::new());
        };
        let st = &program.statements[s.source];
        if st.lhs_tensor != *t && promoted.contains(&st.lhs_tensor) {
            return Ok(Vec::new());
        }
        let reads_written = s.accesses(program).iter().any(|a| {
            !a.write && &a.tensor != t && written_in_kernel.iter().any(|w| w == &a.tensor)
        });
        if reads_written || !wholly_in(scop, s, kernel)? || !covers_the_tensor(isl, scop, s, t)? {
            return Ok(Vec::new());
        }
        out.push(StoreStatement {
            statement: s.name.clone(),
            element_dims: dims,
        });
    }
    if !dependences_allow(program, scop, deps, kernel, &moved, t)? {
        return Ok(Vec::new());
    }
    Ok(out)
}

/// For each iterator of `s`, the dimension of `t`'s element it is, where
/// every access of `s` to `t` has the same subscripts, each a distinct
/// iterator and every iterator one of them; `None` otherwise.
fn element_dims(program: &Program, s: &ModelStmt, t: &str) -> Option<Vec<usize>> {
    let accesses = s.accesses(program);
    let mut to_t = accesses.iter().filter(|a| a.tensor == t);
    let first = to_t.next()?;
    if to_t.any(|a| a.subscripts != first.subscripts) || first.subscripts.len() != s.iterators.len()
    {
        return None;
    }
    let mut dims = vec![usize::MAX; s.iterators.len()];
    for (d, sub) in first.subscripts.iter().enumerate() {
        let i = s.iterators.iter().position(|it| *sub == Affine::var(it))?;
        if dims[i] != usize::MAX {
            return None;
        }
        dims[i] = d;
    }
    Some(dims)
}

/// Whether every instance of `s` (in the program's context) is one of the
/// kernel's: the store runs the statement on every element of its tile,
/// so none of its instances may belong to another kernel.
fn wholly_in(scop: &Scop, s: &ModelStmt, kernel: &UnionSet) -> Result<bool> {
    let all = UnionSet::from_set(s.domain.copy()?.intersect_params(scop.context.copy()?)?)?;
    let here = all.copy()?.intersect(kernel.copy()?)?;
    Ok(all.is_subset(&here)?)
}

/// Whether `s`'s instances, through its access to `t`, are every element
/// of `t` (in the program's context).
fn covers_the_tensor(isl: &Isl, scop: &Scop, s: &ModelStmt, t: &str) -> Result<bool> {
    let Some(access) = std::iter::once(&s.write)
        .chain(&s.reads)
        .find(|m| m.get_tuple_name(crate::isl::DimType::Out).ok() == Some(t))
    else {
        return Ok(false);
    };
    let image = access
        .copy()?
        .intersect_domain(s.domain.copy()?)?
        .range()?
        .intersect_params(scop.context.copy()?)?;
    let all = super::tensor_elements(isl, scop, t)?;
    Ok(image.is_equal(&all)?)
}

/// The dependence conditions of the module documentation: none from a
/// moved statement to an instance of the kernel that is not moved; among
/// the moved ones, only from an earlier statement to a later one at the
/// same element of `t`.
fn dependences_allow(
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    kernel: &UnionSet,
    moved: &[&ModelStmt],
    t: &str,
) -> Result<bool> {
    let mut moved_domain = UnionSet::empty(kernel.get_space()?)?;
    let mut element = UnionMap::empty(kernel.get_space()?)?;
    for s in moved {
        moved_domain = moved_domain.union(UnionSet::from_set(s.domain.copy()?)?)?;
        let access = s
            .accesses(program)
            .into_iter()
            .find(|a| a.tensor == t)
            .map(|a| a.relation.copy());
        if let Some(a) = access {
            element = element.union(UnionMap::from_map(a?.intersect_domain(s.domain.copy()?)?)?)?;
        }
    }
    let moved_domain = moved_domain.intersect(kernel.copy()?)?;
    let rest = kernel.copy()?.subtract(moved_domain.copy()?)?;
    let all = deps.all()?.intersect_domain(moved_domain.copy()?)?;
    if !all.copy()?.intersect_range(rest)?.is_empty()? {
        return Ok(false);
    }
    let within = all.intersect_range(moved_domain)?;
    let maps = within.get_map_list()?;
    let position = |name: &str| scop.statement(name).map(|s| s.source);
    for k in 0..maps.size()? {
        let m = maps.get_at(k)?;
        let from = m.get_tuple_name(crate::isl::DimType::In)?;
        let to = m.get_tuple_name(crate::isl::DimType::Out)?;
        match (position(from), position(to)) {
            (Some(a), Some(b)) if a < b => {}
            _ => return Ok(false),
        }
        let same_element = UnionMap::from_map(m)?
            .apply_domain(element.copy()?)?
            .apply_range(element.copy()?)?;
        let deltas = same_element.deltas()?;
        if !deltas.is_empty()? && !deltas_are_zero(deltas)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether every point of `deltas` (a set of difference vectors) is 0.
fn deltas_are_zero(deltas: UnionSet) -> Result<bool> {
    let sets = deltas.get_set_list()?;
    for k in 0..sets.size()? {
        let s = sets.get_at(k)?;
        let n = s.dim(crate::isl::DimType::Set)?;
        let mut zero = crate::isl::Set::universe(s.get_space()?)?;
        for d in 0..n {
            zero = zero.fix_si(crate::isl::DimType::Set, d as u32, 0)?;
        }
        if !s.is_subset(&zero)? {
            return Ok(false);
        }
    }
    Ok(true)
}
