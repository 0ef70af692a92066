//! Shared-memory promotion, computed in isl.
//!
//! The promotion point of a kernel is its thread band: everything above it
//! (block loops and sequential tile loops, the *prefix* `c`) is executed
//! by all threads of a block together, everything below by the threads in
//! parallel. For a tensor `T` that the kernel only reads, the elements one
//! block touches below the promotion point for given prefix values are
//!
//! `F(c) = { a : ∃ s. P(s) = c ∧ R(s) = a }`, i.e. `F = R ∘ P⁻¹`,
//!
//! with `P` the prefix schedule and `R` the read relations of `T`. When isl
//! finds a box of fixed size that contains `F(c)` for every `c` (its offset
//! `o(c)` affine in the prefix), the box is copied to a shared array before
//! the thread loops (cooperatively, consecutive threads taking consecutive
//! elements of the innermost dimension, so the global reads coalesce),
//! followed by a barrier, and every read `T[R(s)]` below becomes
//! `T_shared[R(s) - o(P(s))]`.
//!
//! TC's heuristic chooses what to promote: a tensor is promoted when its
//! box fits the shared-memory budget and it is *reused* inside the block
//! (the map `s -> (P(s), R(s))` is not injective: two instances under the
//! same prefix read one element, at different points of the loops below
//! it: two statements reading one element in the same iteration of the
//! same loop run on one thread, and a register serves them) or one of its
//! reads is *not coalesced*
//! (along the loop mapped to `threadIdx.x`, consecutive threads read
//! neither the same element nor consecutive ones). Tensors written in the
//! kernel are not promoted: they stay in global memory.

use std::collections::HashMap;

use crate::isl::{DimType, Id, IdList, Map, MultiId, PwAff, PwMultiAff, ScheduleNode, UnionMap};

use super::GpuOptions;
use crate::error::{Error, Result};
use crate::frontend::ast::{Affine, DType, Program};
use crate::isl::ast::{self, Expr};
use crate::isl::{ast_build_expr_from_pw_aff, val_to_i64, Isl};
use crate::model::{AccessKey, Scop};

/// One promoted tensor.
#[derive(Debug, Clone)]
pub struct Promotion {
    pub tensor: String,
    /// The shared array's C name.
    pub buffer: String,
    pub dtype: DType,
    /// Box extents.
    pub sizes: Vec<i64>,
    /// How the box lies in the shared array: strides, stages, size.
    pub layout: SharedLayout,
    /// Box offset, in the prefix iterators `c0 ..` and the parameters.
    pub offset: Vec<Expr>,
    /// The copy may read four consecutive elements at once (16 bytes, f32):
    /// the box's rows and the tensor's rows are multiples of 4 elements
    /// long and every box starts at a multiple of 4 (checked in isl over
    /// all prefix values), so a group of four is wholly inside the tensor
    /// or wholly outside.
    pub vector4: bool,
}

/// The shared array of one promoted box, as the gpu stage laid it out:
/// the printer declares, indexes and double-buffers the array from these
/// numbers alone, and the kernel's launch record counts [`Self::bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLayout {
    /// Element strides of the shared array, per tensor dimension: in the
    /// tensor's order with the innermost row padded by one element when its
    /// length is a multiple of 32 (threads walking a column then hit
    /// different banks), or as [`Layout::Grouped`] orders and pads them.
    pub pitch: Vec<i64>,
    /// Elements of one copy of the box, padding included: stage `s` starts
    /// at element `s * stage_len`.
    pub stage_len: i64,
    /// Copies of the box: 2 where the scope is double-buffered
    /// ([`Scope::double_buffered`]), else 1.
    pub stages: i64,
    /// Bytes of one element.
    pub element_bytes: usize,
}

impl SharedLayout {
    /// Elements of the whole array (every stage).
    pub fn elements(&self) -> i64 {
        self.stage_len * self.stages
    }

    /// Bytes of the whole array (every stage).
    pub fn bytes(&self) -> usize {
        self.elements() as usize * self.element_bytes
    }
}

/// How the shared arrays of a kernel lay out their boxes.
#[derive(Debug, Clone)]
pub enum Layout<'a> {
    /// The tensor's own order, the innermost row padded by one element
    /// when its length is a multiple of 32 (a column walk then meets 32
    /// different banks).
    RowMajor,
    /// For register tiles in groups of `width` points per thread: the box
    /// dimension indexed by the first of the `inner` iterators (per
    /// statement, as for `x_iterator`) that indexes one is laid out
    /// innermost, and rows are padded by `width` elements instead of one,
    /// so that a thread's group is contiguous and aligned: a gemm's
    /// `A[i][k]` tile, read along `i` by the threads of `threadIdx.y`,
    /// becomes `A_shared[k][i]`.
    Grouped {
        inner: Vec<&'a HashMap<String, Option<usize>>>,
        width: i64,
    },
}

/// The promotions at one kernel's thread band.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// For each prefix iterator, its value in the outer ones when it is
    /// unique (isl then generates no loop for it).
    pub prefix_values: Vec<Option<Expr>>,
    pub arrays: Vec<Promotion>,
    /// `(statement, model::AccessKey)` -> (array index, the access's
    /// global subscripts).
    pub accesses: HashMap<(String, AccessKey), (usize, Vec<Affine>)>,
}

impl Scope {
    /// Whether every array holds two copies of its box
    /// (`GpuOptions::pipeline`, see [`Self::double_buffer`]): the tile of
    /// the current step of the loop around the promotion point and the
    /// next one (the next step's offsets are the current ones with the
    /// loop's iterator advanced).
    pub fn double_buffered(&self) -> bool {
        self.arrays.first().is_some_and(|a| a.layout.stages == 2)
    }

    /// Whether the arrays can be doubled within `limit` bytes (and there
    /// are some).
    pub fn doubles_within(&self, limit: usize) -> bool {
        !self.arrays.is_empty() && 2 * self.bytes() <= limit
    }

    /// Gives every array a second stage.
    pub fn double_buffer(&mut self) {
        for a in &mut self.arrays {
            a.layout.stages = 2;
        }
    }

    /// Bytes of the shared arrays (every stage of each).
    pub fn bytes(&self) -> usize {
        self.arrays.iter().map(|a| a.layout.bytes()).sum()
    }

    /// The scope without the accesses of `statements` (statements that run
    /// elsewhere: a register tile's store), and without the arrays only
    /// they read, which would be copied at every step for nothing.
    pub fn without_statements(&mut self, statements: &[String]) {
        self.accesses
            .retain(|(stmt, _), _| !statements.iter().any(|s| s == stmt));
        let used: Vec<bool> = (0..self.arrays.len())
            .map(|k| self.accesses.values().any(|(a, _)| *a == k))
            .collect();
        let mut new_index = Vec::with_capacity(used.len());
        let mut next = 0;
        for u in &used {
            new_index.push(next);
            next += usize::from(*u);
        }
        let mut k = 0;
        self.arrays.retain(|_| {
            k += 1;
            used[k - 1]
        });
        for (a, _) in self.accesses.values_mut() {
            *a = new_index[*a];
        }
    }
}

/// The tuple of identifiers `names` over `space` (for `bind`).
pub(super) fn ids(isl: &Isl, space: crate::isl::Space, names: &[String]) -> Result<MultiId> {
    let mut list = IdList::alloc(&isl.ctx, names.len() as i32)?;
    for n in names {
        list = list.add(Id::read_from_str(&isl.ctx, n)?)?;
    }
    Ok(MultiId::from_id_list(space, list)?)
}

/// `pa` (over a domain of `names.len()` dimensions) as an AST expression in
/// which those dimensions are the identifiers `names`.
pub fn expr_in(isl: &Isl, pa: PwAff, names: &[String]) -> Result<Expr> {
    let space = pa.get_domain_space()?;
    let bound = pa.bind_domain(ids(isl, space, names)?)?;
    let context = bound.copy()?.domain()?;
    let e = ast_build_expr_from_pw_aff(context, bound)
        .ok_or_else(|| Error::Internal("isl could not print a promotion expression".into()))?;
    ast::expr_from_isl(&e)
}

/// The boolean expression of `set` with its dimensions named `names`,
/// under the program's parameter context.
pub(super) fn set_expr(
    isl: &Isl,
    scop: &crate::model::Scop,
    set: crate::isl::Set,
    names: &[String],
) -> Result<Expr> {
    let set = set.coalesce()?;
    let space = set.get_space()?;
    let bound = set.bind(ids(isl, space, names)?)?;
    let context = crate::isl::Set::universe(bound.get_space()?)?.intersect(scop.context.copy()?)?;
    let bound = bound.gist(context.copy()?)?.from_params()?;
    let context = context.from_params()?;
    let e = crate::isl::ast_build_expr_from_set(context, bound)
        .ok_or_else(|| Error::Internal("isl could not print a condition".into()))?;
    ast::expr_from_isl(&e)
}

/// `pa` as one affine expression, when it is one on its whole domain.
pub fn single_aff(pa: &PwAff) -> Result<Option<crate::isl::Aff>> {
    let domain = pa.copy()?.domain()?;
    let g = pa.copy()?.gist(domain)?;
    if !g.isa_aff()? {
        return Ok(None);
    }
    Ok(Some(g.as_aff()?))
}

/// Coefficient of input dimension `pos` in a single-piece affine `pa`.
pub(super) fn coefficient(pa: &PwAff, pos: i32) -> Result<Option<i64>> {
    let Some(aff) = single_aff(pa)? else {
        return Ok(None);
    };
    Ok(Some(val_to_i64(
        &aff.get_coefficient_val(DimType::In, pos)?,
    )?))
}

/// Whether a read `read` (statement -> tensor) is coalesced along the
/// statement iterator at `x` (the one mapped to `threadIdx.x`): the linear
/// address moves by 0 or 1 element when `x` moves by one.
pub(super) fn coalesced(read: &Map, x: Option<usize>) -> Result<bool> {
    let Some(x) = x else {
        return Ok(false);
    };
    let pma = PwMultiAff::from_map(read.copy()?)?;
    let n = pma.dim(DimType::Out)?;
    let mut coefs = Vec::new();
    for d in 0..n {
        match coefficient(&pma.get_pw_aff(d)?, x as i32)? {
            Some(c) => coefs.push(c),
            None => return Ok(false),
        }
    }
    let Some((last, outer)) = coefs.split_last() else {
        return Ok(true);
    };
    Ok(outer.iter().all(|c| *c == 0) && (*last == 0 || *last == 1))
}

/// Computes the promotions at `band` (the kernel's first thread band).
/// `x_iterator` gives, per statement, the position of the iterator mapped
/// to `threadIdx.x` (when the member is a single iterator); `layout`
/// orders and pads the shared arrays' dimensions.
#[allow(clippy::too_many_arguments)]
pub fn promote(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    band: &ScheduleNode,
    kernel: &str,
    x_iterator: &HashMap<String, Option<usize>>,
    layout: &Layout,
    opts: &GpuOptions,
) -> Result<Scope> {
    let depth = band.get_schedule_depth()? as usize;
    let domain = band.get_domain()?;
    let prefix = band
        .get_prefix_schedule_union_map()?
        .intersect_domain(domain.copy()?)?;
    let names: Vec<String> = (0..depth).map(|d| format!("c{d}")).collect();
    let mut scope = Scope::default();
    if !opts.shared || depth == 0 || prefix.is_empty()? {
        return Ok(scope);
    }
    scope.prefix_values = unique_prefix_values(isl, &prefix, depth)?;
    // Reads and writes inside the kernel, per tensor.
    let in_kernel = scop.statements_in(&domain)?;
    let written: Vec<String> = in_kernel
        .iter()
        .map(|s| s.written_tensor())
        .collect::<Result<_>>()?;
    let mut tensors: Vec<String> = Vec::new();
    for s in &in_kernel {
        for a in s.accesses(program) {
            if !a.write && !written.contains(&a.tensor) && !tensors.contains(&a.tensor) {
                tensors.push(a.tensor);
            }
        }
    }
    let mut budget = opts.shared_limit;
    let mut same_point = SamePoint {
        isl,
        band,
        pairs: None,
    };
    for t in tensors {
        let groups = reference_groups(program, &in_kernel, &t, &prefix, &domain)?;
        let several = groups.len() > 1;
        for (g, group) in groups.iter().enumerate() {
            let in_group =
                |stmt: &str, key: &AccessKey| group.iter().any(|(s, a)| s == stmt && a == key);
            let buffer = if several {
                format!("pf_shared_{}_{}_{}", kernel, t, g)
            } else {
                format!("pf_shared_{}_{}", kernel, t)
            };
            promote_group(
                isl,
                &mut same_point,
                program,
                scop,
                &in_kernel,
                &t,
                &in_group,
                buffer,
                &prefix,
                &domain,
                &names,
                x_iterator,
                layout,
                &mut budget,
                &mut scope,
            )?;
        }
    }
    // Asked for, and the doubled arrays fit the budget.
    if opts.pipeline == Some(true) && scope.doubles_within(opts.shared_limit) {
        scope.double_buffer();
    }
    Ok(scope)
}

/// The pairs of instances below a kernel's thread band that run at the
/// same point of its loops ([`loop_points`]), made once per kernel where
/// a promotion first asks for them.
struct SamePoint<'a> {
    isl: &'a Isl,
    band: &'a ScheduleNode,
    pairs: Option<UnionMap>,
}

impl SamePoint<'_> {
    fn pairs(&mut self) -> Result<&UnionMap> {
        if let Some(p) = self.pairs.take() {
            return Ok(self.pairs.insert(p));
        }
        let mut next = 0;
        let points = loop_points(self.isl, self.band, None, &mut next)?;
        Ok(self
            .pairs
            .insert(points.copy()?.apply_range(points.reverse()?)?))
    }
}

/// Whether two instances under one value of `prefix` read one element of
/// `reads` at different points of the loops below it (TC's reuse: the map
/// `s -> (P(s), R(s))` not injective), not counting instances at the same
/// point: a row's sum and maximum read `X(r, c)` in one iteration of one
/// loop, on one thread, which a register serves (the copy to shared
/// memory and its barrier made such a kernel take 52 us instead of 34 on
/// the H200).
fn reused_across_points(
    same_point: &mut SamePoint,
    prefix: &UnionMap,
    reads: &UnionMap,
) -> Result<bool> {
    let at = prefix.copy()?.range_product(reads.copy()?)?;
    if at.is_injective()? {
        return Ok(false);
    }
    let pairs = at.copy()?.apply_range(at.reverse()?)?;
    Ok(!pairs.subtract(same_point.pairs()?.copy()?)?.is_empty()?)
}

/// Each instance below `node` to its point in the loops on its path from
/// `node`: for every band on the way, the band's number in the walk and its
/// members' values (`above` holds those of the bands above). Two instances
/// share a point when they run in the same iteration of the same loops
/// (statements of one sequence inside one loop); sequences and filters add
/// nothing, and points of different loops differ in a band's number or in
/// their length.
fn loop_points(
    isl: &Isl,
    node: &ScheduleNode,
    above: Option<&UnionMap>,
    next: &mut i64,
) -> Result<UnionMap> {
    use crate::isl::ScheduleNodeType as T;
    let domain = node.get_domain()?;
    let here = match node.get_type()? {
        T::Band => {
            let number = crate::isl::UnionSet::read_from_str(&isl.ctx, &format!("{{ [{next}] }}"))?;
            *next += 1;
            let id = UnionMap::from_domain_and_range(domain.copy()?, number)?;
            let values = node
                .band_get_partial_schedule_union_map()?
                .intersect_domain(domain.copy()?)?;
            let point = id.flat_range_product(values)?;
            Some(match above {
                Some(a) => a
                    .copy()?
                    .intersect_domain(domain.copy()?)?
                    .flat_range_product(point)?,
                None => point,
            })
        }
        _ => above.map(|a| a.copy()).transpose()?,
    };
    let n = node.n_children()?;
    if n == 0 {
        return Ok(match here {
            Some(p) => p.intersect_domain(domain)?,
            // No band on the way: every instance at the one point.
            None => UnionMap::from_domain_and_range(
                domain,
                crate::isl::UnionSet::read_from_str(&isl.ctx, "{ [] }")?,
            )?,
        });
    }
    let mut all: Option<UnionMap> = None;
    for i in 0..n {
        let part = loop_points(isl, &node.get_child(i)?, here.as_ref(), next)?;
        all = Some(match all {
            Some(a) => a.union(part)?,
            None => part,
        });
    }
    all.ok_or_else(|| Error::Internal("a schedule node without children".into()))
}

/// The dimensions of a box that `footprint` (prefix -> elements) spans
/// though it reads one element along them at each prefix value: there the
/// element as a function of the prefix, which may take a remainder. isl's
/// box hull offsets are affine in the prefix, so where a block member
/// folds two loops into one (`fold_outer_members`: a cell and a gate as
/// `4 a + g`), the gate `g = c mod 4` is spanned whole: a stacked LSTM's
/// products copied all four gates' weights to shared memory at every k
/// step for the one their block computes. Exact: the map from the prefix
/// to that dimension is single-valued.
fn fixed_dimensions(footprint: &Map, sizes: &[i64]) -> Result<Vec<Option<PwAff>>> {
    let rank = sizes.len() as u32;
    let mut fixed = Vec::with_capacity(sizes.len());
    for (d, &size) in sizes.iter().enumerate() {
        let d = d as u32;
        if size <= 1 {
            fixed.push(None);
            continue;
        }
        let along = footprint
            .copy()?
            .project_out(DimType::Out, d + 1, rank - d - 1)?
            .project_out(DimType::Out, 0, d)?;
        if !along.is_single_valued()? {
            fixed.push(None);
            continue;
        }
        fixed.push(Some(PwMultiAff::from_map(along)?.get_pw_aff(0)?));
    }
    Ok(fixed)
}

/// Promotes one group of reads of tensor `t` (those `in_group` accepts):
/// its box, when it is reused or read uncoalesced and fits what is left of
/// `budget`, becomes array `buffer` of `scope`.
#[allow(clippy::too_many_arguments)]
fn promote_group(
    isl: &Isl,
    same_point: &mut SamePoint,
    program: &Program,
    scop: &Scop,
    in_kernel: &[&crate::model::ModelStmt],
    t: &str,
    in_group: &dyn Fn(&str, &AccessKey) -> bool,
    buffer: String,
    prefix: &UnionMap,
    domain: &crate::isl::UnionSet,
    names: &[String],
    x_iterator: &HashMap<String, Option<usize>>,
    layout: &Layout,
    budget: &mut usize,
    scope: &mut Scope,
) -> Result<()> {
    let tensor = scop
        .tensor(t)
        .ok_or_else(|| Error::Internal(format!("unknown tensor {t}")))?;
    let mut reads = UnionMap::empty(prefix.get_space()?)?;
    let mut all_coalesced = true;
    for s in in_kernel {
        for a in s.accesses(program) {
            if !a.write && a.tensor == t && in_group(&s.name, &a.key()) {
                reads = reads.union(UnionMap::from_map(a.relation.copy()?)?)?;
                let x = x_iterator.get(&s.name).copied().flatten();
                all_coalesced &= coalesced(a.relation, x)?;
            }
        }
    }
    let reads = reads.intersect_domain(domain.copy()?)?;
    let reused = reused_across_points(same_point, prefix, &reads)?;
    if !reused && all_coalesced {
        return Ok(());
    }
    let footprint = Map::from_union_map(prefix.copy()?.reverse()?.apply_range(reads)?)?;
    let hull = footprint.get_range_simple_fixed_box_hull()?;
    if !hull.is_valid()? {
        return Ok(());
    }
    let size = hull.get_size()?;
    let rank = tensor.shape.len();
    let mut sizes = Vec::new();
    for d in 0..rank {
        sizes.push(val_to_i64(&size.get_at(d as i32)?)?);
    }
    let fixed = fixed_dimensions(&footprint, &sizes)?;
    for (d, f) in fixed.iter().enumerate() {
        if f.is_some() {
            sizes[d] = 1;
        }
    }
    let (inner, pad) = match layout {
        Layout::RowMajor => (rank.saturating_sub(1), 1),
        Layout::Grouped { inner, width } => {
            let indexed = |it: &HashMap<String, Option<usize>>| {
                indexed_dimension(program, in_kernel, t, in_group, it)
            };
            let mut found = None;
            for it in inner {
                if let Some(d) = indexed(it)? {
                    found = Some(d);
                    break;
                }
            }
            (found.unwrap_or(rank.saturating_sub(1)), *width)
        }
    };
    let column_walk = matches!(
        indexed_dimension(program, in_kernel, t, in_group, x_iterator)?,
        Some(d) if d != inner
    );
    // Dimensions from the outermost to the innermost of the layout.
    let order: Vec<usize> = (0..rank)
        .filter(|d| *d != inner)
        .chain((rank > 0).then_some(inner))
        .collect();
    let mut pitch = vec![1i64; rank];
    let mut len = 1i64;
    for (k, &d) in order.iter().enumerate().rev() {
        pitch[d] = len;
        let mut extent = sizes[d];
        // A column walk over rows of pitch p meets gcd(p, 32) threads per
        // bank: rows a multiple of 32 long are padded by the layout's
        // width, and even rows that `threadIdx.x` walks down (it indexes
        // an outer dimension of the box) by one: syrk's `A(j, k)` tile,
        // 16 long, read down `j`, had 8-way conflicts (H100: syrk 2048
        // 9.6 -> 2.9 ms, tbmm 358 -> 207 us; gemm's `A(i, k)`, which
        // `threadIdx.x` does not index, keeps its rows: padded, 4% slower).
        if k + 1 == rank
            && rank > 1
            && (extent % 32 == 0 || (pad == 1 && extent % 2 == 0 && column_walk))
        {
            extent += pad;
        }
        len = len.saturating_mul(extent);
    }
    let bytes = len as usize * tensor.dtype.size();
    if len <= 0 || bytes > *budget {
        return Ok(());
    }
    *budget -= bytes;
    let offset_ma = hull.get_offset()?;
    let mut offset = Vec::new();
    for (d, f) in fixed.into_iter().enumerate() {
        let pa = match f {
            Some(pa) => pa,
            None => PwAff::from_aff(offset_ma.get_at(d as i32)?)?,
        };
        offset.push(expr_in(isl, pa, names)?);
    }
    let vector4 = rank >= 1
        && tensor.dtype == DType::F32
        && sizes[rank - 1] % 4 == 0
        && matches!(program.evaluate(&tensor.shape[rank - 1]), Some(v) if v % 4 == 0)
        && {
            let last = PwAff::from_aff(offset_ma.get_at(rank as i32 - 1)?)?;
            let image = crate::isl::Set::from_union_set(prefix.copy()?.range()?)?;
            last.mod_val(crate::isl::Val::int_from_si(&isl.ctx, 4)?)?
                .non_zero_set()?
                .intersect(image)?
                .is_empty()?
        };
    let index = scope.arrays.len();
    scope.arrays.push(Promotion {
        tensor: t.to_string(),
        buffer,
        dtype: tensor.dtype,
        sizes,
        layout: SharedLayout {
            pitch,
            stage_len: len,
            stages: 1,
            element_bytes: tensor.dtype.size(),
        },
        offset,
        vector4,
    });
    // Every read of `t`: the shared element is `R(s) - o(P(s))`, the
    // global subscripts minus the offset, which the copy computed for
    // the current prefix (`pf_o<array>_<dim>` in the generated code).
    for s in in_kernel {
        for a in s.accesses(program) {
            if !a.write && a.tensor == t && in_group(&s.name, &a.key()) {
                let key = (s.name.clone(), a.key());
                scope.accesses.insert(key, (index, a.subscripts));
            }
        }
    }
    Ok(())
}

/// The reads of tensor `t` in the kernel's statements `in_kernel`, in
/// groups that share one shared array, each read as `(statement, access
/// text)`. Reads start in groups of their own (one per distinct access)
/// and two groups merge where the box of their union is no larger than
/// their two boxes together: `A(i, k)` and `A(i, k + 1)` share a box,
/// while syrk's `A(i, k)` and `A(j, k)` (row tiles of different blocks
/// of rows) keep two, which is what fits, where their union's box spans
/// every row between the two tiles. The tensor is only read in the
/// kernel, so two copies of one element are never out of step.
fn reference_groups(
    program: &Program,
    in_kernel: &[&crate::model::ModelStmt],
    t: &str,
    prefix: &UnionMap,
    domain: &crate::isl::UnionSet,
) -> Result<Vec<Vec<(String, AccessKey)>>> {
    let mut groups: Vec<(Vec<(String, AccessKey)>, UnionMap)> = Vec::new();
    for s in in_kernel {
        for a in s.accesses(program) {
            if a.write || a.tensor != t {
                continue;
            }
            let key = (s.name.clone(), a.key());
            if groups.iter().any(|(g, _)| g.contains(&key)) {
                continue;
            }
            let rel = UnionMap::from_map(a.relation.copy()?)?.intersect_domain(domain.copy()?)?;
            groups.push((vec![key], rel));
        }
    }
    let box_size = |reads: &UnionMap| -> Result<Option<i64>> {
        let f = prefix.copy()?.reverse()?.apply_range(reads.copy()?)?;
        if f.is_empty()? {
            return Ok(Some(0));
        }
        let hull = Map::from_union_map(f)?.get_range_simple_fixed_box_hull()?;
        if !hull.is_valid()? {
            return Ok(None);
        }
        let size = hull.get_size()?;
        let mut n = 1i64;
        for d in 0..size.size()? {
            n = n.saturating_mul(val_to_i64(&size.get_at(d)?)?);
        }
        Ok(Some(n))
    };
    // Greedy: merge the first pair whose union costs nothing, until none.
    'merge: loop {
        for i in 0..groups.len() {
            for j in i + 1..groups.len() {
                let union = groups[i].1.copy()?.union(groups[j].1.copy()?)?;
                let merged = match (
                    box_size(&union)?,
                    box_size(&groups[i].1)?,
                    box_size(&groups[j].1)?,
                ) {
                    (Some(u), Some(a), Some(b)) => u <= a.saturating_add(b),
                    // Without a box for a part, keep the tensor whole, as
                    // before groups (its union may still have one).
                    _ => true,
                };
                if merged {
                    let (keys, _) = groups.remove(j);
                    groups[i].0.extend(keys);
                    groups[i].1 = union;
                    continue 'merge;
                }
            }
        }
        break;
    }
    Ok(groups.into_iter().map(|(g, _)| g).collect())
}

/// The dimension of tensor `t` that the iterator `it` (a position per
/// statement) indexes in every read of `t` by the statements `stmts`: the
/// single subscript whose coefficient of that iterator is not zero, the
/// same dimension in all reads. `None` when a read has no such iterator,
/// several subscripts use it, or reads disagree.
fn indexed_dimension(
    program: &Program,
    stmts: &[&crate::model::ModelStmt],
    t: &str,
    in_group: &dyn Fn(&str, &AccessKey) -> bool,
    it: &HashMap<String, Option<usize>>,
) -> Result<Option<usize>> {
    let mut found: Option<usize> = None;
    for s in stmts {
        for a in s.accesses(program) {
            if a.write || a.tensor != t || !in_group(&s.name, &a.key()) {
                continue;
            }
            let Some(pos) = it.get(&s.name).copied().flatten() else {
                return Ok(None);
            };
            let pma = PwMultiAff::from_map(a.relation.copy()?)?;
            let mut dims = Vec::new();
            for d in 0..pma.dim(DimType::Out)? {
                match coefficient(&pma.get_pw_aff(d)?, pos as i32)? {
                    Some(0) => {}
                    Some(_) => dims.push(d as usize),
                    None => return Ok(None),
                }
            }
            match (dims.as_slice(), found) {
                ([d], None) => found = Some(*d),
                ([d], Some(f)) if *d == f => {}
                _ => return Ok(None),
            }
        }
    }
    Ok(found)
}

/// For each iterator `c<d>` of the prefix schedule `prefix` (of `depth`
/// dimensions, restricted to the instances below the node), its value in
/// the outer ones and the parameters when it has a single one: isl then
/// generates no loop for it, and code below the node that names it must
/// define it.
pub fn unique_prefix_values(
    isl: &Isl,
    prefix: &UnionMap,
    depth: usize,
) -> Result<Vec<Option<Expr>>> {
    let names: Vec<String> = (0..depth).map(|d| format!("c{d}")).collect();
    let mut out = Vec::new();
    if depth == 0 || prefix.is_empty()? {
        return Ok(out);
    }
    let image = crate::isl::Set::from_union_set(prefix.copy()?.range()?)?;
    for d in 0..depth {
        let m = Map::from_range(image.copy()?.project_out(
            DimType::Set,
            (d + 1) as u32,
            (depth - d - 1) as u32,
        )?)?
        .move_dims(DimType::In, 0, DimType::Out, 0, d as u32)?;
        let lo = m.copy()?.lexmin_pw_multi_aff()?;
        let hi = m.lexmax_pw_multi_aff()?;
        out.push(if lo.is_equal(&hi)? {
            Some(expr_in(isl, lo.get_pw_aff(0)?, &names[..d])?)
        } else {
            None
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(stage_len: i64, dtype: DType) -> Promotion {
        Promotion {
            tensor: "A".into(),
            buffer: "pf_shared_A".into(),
            dtype,
            sizes: vec![16, 64],
            layout: SharedLayout {
                pitch: vec![stage_len / 16, 1],
                stage_len,
                stages: 1,
                element_bytes: dtype.size(),
            },
            offset: Vec::new(),
            vector4: false,
        }
    }

    #[test]
    fn a_double_buffered_scope_counts_both_stages_of_every_array() {
        let mut scope = Scope {
            arrays: vec![array(16 * 65, DType::F32), array(16 * 64, DType::F16)],
            ..Scope::default()
        };
        assert!(!scope.double_buffered());
        assert_eq!(scope.bytes(), 16 * 65 * 4 + 16 * 64 * 2);
        assert!(scope.doubles_within(2 * scope.bytes()));
        assert!(!scope.doubles_within(2 * scope.bytes() - 1));
        scope.double_buffer();
        assert!(scope.double_buffered());
        assert_eq!(scope.arrays[0].layout.elements(), 2 * 16 * 65);
        assert_eq!(scope.bytes(), 2 * (16 * 65 * 4 + 16 * 64 * 2));
        // No arrays: nothing to double.
        assert!(!Scope::default().doubles_within(usize::MAX));
        assert!(!Scope::default().double_buffered());
    }
}
