//! Thread-private promotion: tensors whose elements belong to one thread
//! each are kept in that thread's registers below the thread loops.
//!
//! Let `N` be the body of a kernel's innermost thread-mapped loop and `P`
//! the prefix schedule at `N` (block loops, sequential tile loops, thread
//! loops: one value of `P` is one iteration of the thread loops, which one
//! thread runs from start to end without interruption). For a tensor `T`
//! with access relations `A` (reads and writes, instances -> elements) the
//! elements one prefix iteration touches are
//!
//! `F = A ∘ P⁻¹ : prefix -> T`.
//!
//! When `F⁻¹` is single-valued, every element of `T` is touched by one
//! prefix iteration only, so no other thread (and no other iteration of
//! this thread) ever sees it: the iteration may work on a private copy.
//! When isl finds a box of fixed size `s` containing `F(p)`, with offset
//! `o(p)` affine in the prefix, and the box is exact (`F(p)` is the whole
//! box inside the tensor), the copy is an array of `∏ s` elements, indexed
//! by `a - o(p)`: it is loaded at the start of the iteration when `T`
//! holds a value from outside the kernel (an input, or a tensor written by
//! another kernel) and stored at the end when a value leaves the kernel (an
//! output, or a tensor read by another kernel). Both happen only in the
//! iterations that touch `T` (the domain of `F`): in another one the box
//! at `o(p)` is not its own (the iteration over the second tile of a
//! reduction loop whose output's reduction stops in the first would
//! store a copy nothing wrote over the output). A reduction's running
//! state (the rolling maximum, sum and output row of an online softmax),
//! a row a thread reads over and over (a query row), and per-iteration
//! temporaries (the previous maximum) then live in registers instead of
//! making a global round trip at every step.
//!
//! This is PPCG's private-memory promotion, at the thread band. Loops
//! that index a non-scalar private array are unrolled by the printer, so
//! the array stays in registers.

use std::collections::HashSet;

use crate::isl::{DimType, Map, ScheduleNode, UnionMap, UnionSet};

use crate::error::Result;
use crate::frontend::ast::{DType, Program, TensorRole};
use crate::isl::ast::Expr;
use crate::isl::{val_to_i64, Isl};
use crate::model::Scop;

/// Most elements one private array may hold (registers per thread).
pub const MAX_ELEMENTS: i64 = 64;
/// Most 32-bit registers all private arrays of a kernel may take.
pub const MAX_REGISTERS: i64 = 160;

/// One tensor kept in per-thread storage.
#[derive(Debug, Clone)]
pub struct PrivateArray {
    pub tensor: String,
    pub dtype: DType,
    /// The array's C name.
    pub buffer: String,
    /// Box extents (all 1: one scalar).
    pub sizes: Vec<i64>,
    /// Box offset, in the prefix iterators `c0 ..` and the parameters.
    pub offset: Vec<Expr>,
    /// Loaded from global memory before the body (a value from outside).
    pub load: bool,
    /// Stored to global memory after the body (a value that leaves).
    pub store: bool,
    /// The prefix iterations that hold a copy, in the prefix iterators and
    /// the parameters, where not all of the region's do (`None`): those
    /// that touch the tensor. Elsewhere the iteration's box (its offset is
    /// defined for every iteration) is elements it neither computes nor
    /// owns, so nothing is loaded or stored there.
    pub owned: Option<Expr>,
}

impl PrivateArray {
    pub fn is_scalar(&self) -> bool {
        self.sizes.iter().all(|s| *s == 1)
    }
}

/// Private arrays declared at one node of a kernel (its mark,
/// `private_<k>`): the thread body, or the body of a sequential loop below
/// it for tensors whose elements live for one iteration of that loop (the
/// score of one key in an attention row).
#[derive(Debug, Clone, Default)]
pub struct PrivateRegion {
    pub mark: String,
    /// Values of the prefix iterators isl generates no loop for (see
    /// `promote::unique_prefix_values`): the offsets may name them.
    pub prefix_values: Vec<Option<Expr>>,
    pub arrays: Vec<PrivateArray>,
}

/// What the search below a thread body carries from node to node.
struct Search<'a> {
    isl: &'a Isl,
    program: &'a Program,
    scop: &'a Scop,
    kernel_domain: UnionSet,
    kernel: &'a str,
    /// Tensors not yet private and not promoted otherwise.
    candidates: Vec<String>,
    /// 32-bit registers taken by the arrays found so far.
    registers: i64,
    regions: Vec<PrivateRegion>,
}

/// Makes tensors private below `node`, the body of the innermost thread
/// loop of a kernel whose instances are `kernel_domain`: at `node` itself,
/// and at the body of each sequential loop below it for tensors that are
/// not private further out. `exclude`: tensors promoted otherwise (shared
/// memory). Returns the node at the same position (a `private_<k>` mark
/// when one was inserted there) and the regions, outer first.
pub fn insert_regions(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    node: ScheduleNode,
    kernel_domain: &UnionSet,
    kernel: &str,
    exclude: &HashSet<String>,
) -> Result<(ScheduleNode, Vec<PrivateRegion>)> {
    let mut candidates: Vec<String> = Vec::new();
    for s in scop.statements_in(kernel_domain)? {
        for a in s.accesses(program) {
            if !candidates.contains(&a.tensor) && !exclude.contains(&a.tensor) {
                candidates.push(a.tensor);
            }
        }
    }
    let mut search = Search {
        isl,
        program,
        scop,
        kernel_domain: kernel_domain.copy()?,
        kernel,
        candidates,
        registers: 0,
        regions: Vec::new(),
    };
    let node = visit(&mut search, node)?;
    Ok((node, search.regions))
}

/// Tries `node`, then the loops below it; returns to `node`'s position.
fn visit(search: &mut Search, node: ScheduleNode) -> Result<ScheduleNode> {
    let mark = format!("private_{}", search.regions.len());
    let region = promote(search, &node, &mark)?;
    let marked = !region.arrays.is_empty();
    let mut node = node;
    if marked {
        search.regions.push(region);
        let id = crate::isl::Id::read_from_str(&search.isl.ctx, &mark)?;
        node = node.insert_mark(id)?.child(0)?;
    }
    node = descend(search, node)?;
    if marked {
        node = node.parent()?;
    }
    Ok(node)
}

/// Visits the body of every band below `node` (through sequences, sets,
/// filters and marks); returns to `node`'s position.
fn descend(search: &mut Search, node: ScheduleNode) -> Result<ScheduleNode> {
    use crate::isl::ScheduleNodeType as T;
    if search.candidates.is_empty() {
        return Ok(node);
    }
    match node.get_type()? {
        T::Band => visit(search, node.child(0)?)?.parent().map_err(Into::into),
        T::Sequence | T::Set | T::Filter | T::Mark => {
            let mut node = node;
            for i in 0..node.n_children()? {
                node = descend(search, node.child(i)?)?.parent()?;
            }
            Ok(node)
        }
        _ => Ok(node),
    }
}

/// The candidates that may be private at `node`.
fn promote(search: &mut Search, node: &ScheduleNode, mark: &str) -> Result<PrivateRegion> {
    let (isl, program, scop, kernel) = (search.isl, search.program, search.scop, search.kernel);
    let kernel_domain = search.kernel_domain.copy()?;
    let mut region = PrivateRegion {
        mark: mark.to_string(),
        ..Default::default()
    };
    let depth = node.get_schedule_depth()? as usize;
    let domain = node.get_domain()?;
    if depth == 0 || domain.is_empty()? {
        return Ok(region);
    }
    let prefix = node
        .get_prefix_schedule_union_map()?
        .intersect_domain(domain.copy()?)?;
    let names: Vec<String> = (0..depth).map(|d| format!("c{d}")).collect();
    let outside = scop.domain()?.subtract(domain.copy()?)?;
    for t in search.candidates.clone() {
        let Some(tensor) = scop.tensor(&t) else {
            continue;
        };
        // Every access to `t` in the program, and the writes alone.
        let mut all = UnionMap::empty(prefix.get_space()?)?;
        let mut writes = UnionMap::empty(prefix.get_space()?)?;
        for s in &scop.statements {
            for a in s.accesses(program) {
                if a.tensor == t {
                    let rel = UnionMap::from_map(a.relation.copy()?)?
                        .intersect_domain(UnionSet::from_set(s.domain.copy()?)?)?;
                    if a.write {
                        writes = writes.union(rel.copy()?)?;
                    }
                    all = all.union(rel)?;
                }
            }
        }
        // Accessed in the kernel only below `node` (the thread body).
        let in_this_kernel = all.copy()?.intersect_domain(kernel_domain.copy()?)?;
        let here = all.copy()?.intersect_domain(domain.copy()?)?;
        if !in_this_kernel.is_subset(&here)? || here.is_empty()? {
            continue;
        }
        // Something to gain: an element is accessed more than once (by
        // two instances, or read and written by one).
        let once = here.is_injective()?
            && scop
                .statements_in(&domain)?
                .iter()
                .all(|s| s.accesses(program).iter().filter(|a| a.tensor == t).count() <= 1);
        if once {
            continue;
        }
        let f = Map::from_union_map(prefix.copy()?.reverse()?.apply_range(here.copy()?)?)?;
        if !f.copy()?.reverse()?.is_single_valued()? {
            continue;
        }
        let hull = f.get_range_simple_fixed_box_hull()?;
        if !hull.is_valid()? {
            continue;
        }
        let size = hull.get_size()?;
        let rank = tensor.shape.len();
        let mut sizes = Vec::new();
        for d in 0..rank {
            sizes.push(val_to_i64(&size.get_at(d as i32)?)?);
        }
        let len: i64 = sizes.iter().product();
        if len > MAX_ELEMENTS || len <= 0 {
            continue;
        }
        let written_here = !writes
            .copy()?
            .intersect_domain(domain.copy()?)?
            .is_empty()?;
        if !written_here && len == 1 {
            // One element read in one iteration: the compiler keeps it in
            // a register already (the reads are the same load); a private
            // copy only adds a guarded load.
            continue;
        }
        let words = len * (tensor.dtype.size() as i64 / 4).max(1);
        if search.registers + words > MAX_REGISTERS {
            continue;
        }
        // Exact: the box inside the tensor is what the iteration touches.
        let offset_ma = hull.get_offset()?;
        let mut deltas = Map::universe(f.get_space()?)?;
        for (d, s) in sizes.iter().enumerate() {
            deltas = deltas
                .lower_bound_si(DimType::Out, d as u32, 0)?
                .upper_bound_si(DimType::Out, d as u32, (*s - 1) as i32)?;
        }
        let boxed = Map::from_multi_aff(offset_ma.copy()?)?
            .sum(deltas)?
            .intersect_domain(f.copy()?.domain()?)?
            .intersect_range(super::registers::tensor_elements(isl, scop, &t)?)?
            .intersect_params(scop.context.copy()?)?;
        let f_in_context = f.copy()?.intersect_params(scop.context.copy()?)?;
        if !boxed.is_subset(&f_in_context)? {
            continue;
        }
        let outside_writes = !writes
            .copy()?
            .intersect_domain(outside.copy()?)?
            .is_empty()?;
        let outside_reads = !all
            .copy()?
            .subtract(writes.copy()?)?
            .intersect_domain(outside.copy()?)?
            .is_empty()?;
        let written_here = !writes
            .copy()?
            .intersect_domain(domain.copy()?)?
            .is_empty()?;
        let load = tensor.role == TensorRole::Input || outside_writes;
        let store = written_here && (tensor.role == TensorRole::Output || outside_reads);
        if store && !load {
            // Every element of the box must be written here, or the store
            // would put back values nobody computed.
            let w = Map::from_union_map(
                prefix
                    .copy()?
                    .reverse()?
                    .apply_range(writes.copy()?.intersect_domain(domain.copy()?)?)?,
            )?
            .intersect_params(scop.context.copy()?)?;
            if !boxed.is_subset(&w)? {
                continue;
            }
        }
        let mut offset = Vec::new();
        for d in 0..rank {
            let pa = crate::isl::PwAff::from_aff(offset_ma.get_at(d as i32)?)?;
            offset.push(super::promote::expr_in(isl, pa, &names)?);
        }
        // The iterations that touch `t`, where not all of the region's do.
        let iterations = crate::isl::Set::from_union_set(prefix.copy()?.range()?)?
            .intersect_params(scop.context.copy()?)?;
        let touching = f_in_context.domain()?;
        let owned = if iterations.is_subset(&touching)? {
            None
        } else {
            let condition = touching.gist(iterations)?;
            Some(super::promote::set_expr(isl, scop, condition, &names)?)
        };
        search.registers += words;
        search.candidates.retain(|c| c != &t);
        region.arrays.push(PrivateArray {
            buffer: format!("pf_priv_{kernel}_{t}"),
            tensor: t,
            dtype: tensor.dtype,
            sizes,
            offset,
            load,
            store,
            owned,
        });
    }
    if !region.arrays.is_empty() {
        region.prefix_values = super::promote::unique_prefix_values(isl, &prefix, depth)?;
    }
    Ok(region)
}
