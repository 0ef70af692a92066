//! A warp (or a block) per row, its threads across the loops of the row:
//! the mapping of kernels whose rows (the parallel members of the kernel
//! band) each run a sequence of loops along the row, some of them reductions (an online
//! softmax's rolling maximum and sum, a layer norm's mean and variance),
//! the others maps (the normalised output).
//!
//! One thread per row, as the generic mapping gives them, reads a row
//! alone: neighbouring threads are a row apart, so every load touches a
//! different line. Here `W` threads take a row (a warp, or for long rows
//! several, see [`width`]; "lanes" below) and lane `l` takes iterations
//! `l, l + W, ..` of every loop of the row, so a warp's loads are
//! consecutive elements.
//!
//! A map loop (its band member coincident: no dependence between its
//! iterations) is simply shared. A reduction loop is split: each lane runs
//! the loop over its share, from the reducers' identities (lane 0 from the
//! state before the loop), and the `W` partial states are then combined
//! with shuffles (and across warps through shared memory). That is a
//! split-k update in `W` slices whose global combination runs on chip
//! (Neptune's Eq. 8), and it is legal for
//! the loop's states only:
//!
//! * a reduction `X op= e` whose right side reads no state of the loop:
//!   the partial results combine with `op` (associative and commutative);
//! * the predecessors, caches and targets of a rolling update
//!   ([`crate::frontend::ast::RollingStates`]), whose repair term `H` was
//!   proven when the update was made: two partial states `a`, `b` combine
//!   as `X = X_a fr X_b` for each predecessor and
//!   `T = H(T_a; X_a, X) f H(T_b; X_b, X)` for each target.
//!
//! Every tensor written in a split loop must be such a state, kept in a
//! thread-private scalar; then every dependence the loop carries is one of
//! a state's chains, which the combination reassembles (the GPU mapping
//! check subtracts exactly those, see `mapping::check_parallel`). Where the
//! private storage does not come out that way, the kernel keeps the warp
//! shape with lane 0 running the row alone.

use crate::isl::{ScheduleNode, ScheduleNodeType};

use crate::error::Result;
use crate::frontend::ast::{DType, Expr, Program, Reducer};
use crate::isl::Isl;
use crate::model::{ModelStmt, Scop, StmtKind};

use super::private::PrivateRegion;

/// Mark prefix of a loop the lanes share: `lanes_K`, `K` indexing the
/// kernel's [`LaneLoop`]s.
pub const MARK: &str = "lanes_";

/// Loops along a row shorter than this leave lanes idle: the generic
/// mapping keeps them.
pub const MIN_STEPS: i64 = 32;

/// How one state of a split loop combines with another lane's.
#[derive(Debug, Clone)]
pub enum State {
    /// `X op= e`, or a rolling update's predecessor `X = X op e`.
    Reduce(Reducer),
    /// A rolling update's cache of predecessor `of` (`Xp = X`): dead after
    /// the loop, not combined.
    Cache { of: String },
    /// A rolling update's target: `T = repair f g(..)`.
    Target { reducer: Reducer, repair: Expr },
}

/// A loop the lanes share.
#[derive(Debug, Clone)]
pub struct LaneLoop {
    /// `None`: a map loop. Else a split reduction loop and its states:
    /// each tensor the loop writes.
    pub states: Option<Vec<(String, State)>>,
    /// The loop's number of iterations over all rows, when constant (each
    /// row runs at most this many).
    pub extent: Option<i64>,
}

impl LaneLoop {
    /// The index `K` of mark `lanes_K`.
    pub fn index(mark: &str) -> Option<usize> {
        mark.strip_prefix(MARK)?.parse().ok()
    }
}

/// Elements of a row each thread takes in the loops of a long row: rows
/// longer than 32 of them get several warps ([`width`]).
pub const ELEMENTS_PER_THREAD: i64 = 32;
/// Most threads on one row.
pub const MAX_WIDTH: u32 = 512;

/// Threads per row: a warp, or for rows of more than
/// `32 * ELEMENTS_PER_THREAD` elements the power of two that gives each
/// about [`ELEMENTS_PER_THREAD`], up to [`MAX_WIDTH`] (a block per row, so
/// each thread keeps few elements and the GPU many rows in flight); the
/// user's threads along x (`--block`) when given.
pub fn width(loops: &[LaneLoop], user: Option<u32>) -> u32 {
    if let Some(w) = user {
        return w;
    }
    let longest = loops.iter().filter_map(|l| l.extent).max().unwrap_or(0);
    if loops.iter().any(|l| l.extent.is_none()) {
        return 32;
    }
    let wanted = (longest + ELEMENTS_PER_THREAD - 1) / ELEMENTS_PER_THREAD;
    let mut w = 32u32;
    while i64::from(w) < wanted && w < MAX_WIDTH {
        w *= 2;
    }
    w
}

/// The states of a reduction loop whose statements are `stmts`, when the
/// lanes may split it (see the module doc), else `None`.
pub fn loop_states(
    program: &Program,
    stmts: &[&ModelStmt],
) -> Result<Option<Vec<(String, State)>>> {
    let mut written: Vec<String> = Vec::new();
    for s in stmts {
        let t = s.written_tensor()?;
        if written.contains(&t) {
            // Two statements writing one tensor in the loop: no single
            // state to combine.
            return Ok(None);
        }
        written.push(t);
    }
    let rolling = program.rolling.as_ref();
    let mut states = Vec::new();
    for s in stmts {
        let st = &program.statements[s.source];
        let t = &st.lhs_tensor;
        // The tensors of the loop the right side reads.
        let reads: Vec<String> = s
            .accesses(program)
            .into_iter()
            .skip(1)
            .map(|a| a.tensor)
            .filter(|r| written.contains(r))
            .collect();
        let only = |allowed: &[&str]| reads.iter().all(|r| allowed.contains(&r.as_str()));
        let pred = rolling.and_then(|r| r.preds.iter().find(|p| &p.tensor == t));
        let cache = rolling.and_then(|r| r.preds.iter().find(|p| &p.cache == t));
        let target = rolling.and_then(|r| r.targets.iter().find(|x| &x.tensor == t));
        let state = match (s.kind, st.op) {
            (StmtKind::Update, crate::frontend::ast::AssignOp::Reduce { op, .. }) => {
                if !s.is_reorderable_reduction_step()? || !reads.iter().all(|r| r == t) {
                    return Ok(None);
                }
                State::Reduce(op)
            }
            (StmtKind::Assign, _) => {
                if let Some(p) = pred {
                    if !only(&[t.as_str()]) {
                        return Ok(None);
                    }
                    State::Reduce(p.reducer)
                } else if let Some(p) = cache {
                    if !only(&[p.tensor.as_str()]) || !written.contains(&p.tensor) {
                        return Ok(None);
                    }
                    State::Cache {
                        of: p.tensor.clone(),
                    }
                } else if let Some(x) = target {
                    // The target reads itself, its predecessors and their
                    // caches, all of which must be states of this loop.
                    let r = rolling.expect("a target comes with its rolling states");
                    let mut allowed: Vec<&str> = vec![t.as_str()];
                    for p in &r.preds {
                        if !written.contains(&p.tensor) || !written.contains(&p.cache) {
                            return Ok(None);
                        }
                        allowed.push(&p.tensor);
                        allowed.push(&p.cache);
                    }
                    if !only(&allowed) {
                        return Ok(None);
                    }
                    State::Target {
                        reducer: x.reducer,
                        repair: x.repair.clone(),
                    }
                } else {
                    return Ok(None);
                }
            }
            _ => return Ok(None),
        };
        states.push((t.clone(), state));
    }
    Ok(Some(states))
}

/// The loops of the kernel band `band`'s rows, in visiting order, when the
/// rows (its members, all parallel, at most two) go across lanes: below it
/// only sequences, sets and filters over single-member loops with no loop
/// inside, at least [`MIN_STEPS`] steps each where the length is known,
/// at least one of them a reduction the lanes may split ([`loop_states`]).
pub fn candidate(
    program: &Program,
    scop: &Scop,
    band: &ScheduleNode,
) -> Result<Option<Vec<LaneLoop>>> {
    let n = band.band_n_member()? as usize;
    if n == 0 || n > 2 || !band.band_get_permutable()? {
        return Ok(None);
    }
    for i in 0..n {
        if !band.band_member_get_coincident(i as i32)? {
            return Ok(None);
        }
    }
    let mut loops = Vec::new();
    if !walk(program, scop, &band.get_child(0)?, &mut loops)? {
        return Ok(None);
    }
    Ok(loops.iter().any(|l| l.states.is_some()).then_some(loops))
}

fn walk(
    program: &Program,
    scop: &Scop,
    node: &ScheduleNode,
    loops: &mut Vec<LaneLoop>,
) -> Result<bool> {
    use ScheduleNodeType as T;
    match node.get_type()? {
        T::Leaf => Ok(true),
        T::Sequence | T::Set | T::Filter => {
            for i in 0..node.n_children()? {
                if !walk(program, scop, &node.get_child(i)?, loops)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        T::Band => {
            if node.band_n_member()? != 1 || super::mapping::contains_band(&node.get_child(0)?)? {
                return Ok(false);
            }
            let extent = super::mapping::member_extent(node, 0)?;
            if extent.is_some_and(|e| e < MIN_STEPS) {
                return Ok(false);
            }
            let states = if node.band_member_get_coincident(0)? {
                None
            } else {
                let stmts = scop.statements_in(&node.get_domain()?)?;
                match loop_states(program, &stmts)? {
                    Some(states) => Some(states),
                    None => return Ok(false),
                }
            };
            loops.push(LaneLoop { states, extent });
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Marks every loop below the kernel band `band` `lanes_K`, in the order
/// [`candidate`] visits (and numbers) them. Returns the band.
pub fn mark_loops(isl: &Isl, band: ScheduleNode) -> Result<ScheduleNode> {
    let mut next = 0;
    let below = mark_below(isl, band.child(0)?, &mut next)?;
    Ok(below.parent()?)
}

fn mark_below(isl: &Isl, node: ScheduleNode, next: &mut usize) -> Result<ScheduleNode> {
    use ScheduleNodeType as T;
    match node.get_type()? {
        T::Sequence | T::Set | T::Filter => {
            let mut node = node;
            for i in 0..node.n_children()? {
                node = mark_below(isl, node.child(i)?, next)?.parent()?;
            }
            Ok(node)
        }
        T::Band => {
            let id = crate::isl::Id::read_from_str(&isl.ctx, &format!("{MARK}{next}"))?;
            *next += 1;
            // mark -> band; return to the mark's position.
            Ok(node.insert_mark(id)?)
        }
        _ => Ok(node),
    }
}

/// Whether the private storage the kernel got (`regions`, outer first)
/// lets the lanes split its reduction loops: every state of a split loop
/// a private scalar of f32 or f64 (the shuffles move 32- and 64-bit
/// values) in a region outside the loops, no cache of one stored after
/// the kernel, and no tensor private outside the loops written inside a
/// map loop (each lane would hold only its share of it).
pub fn storage_fits(
    scop: &Scop,
    tree: &ScheduleNode,
    regions: &[PrivateRegion],
    loops: &[LaneLoop],
) -> Result<bool> {
    // The private arrays of the regions above a node, by walking the tree.
    fn rec(
        scop: &Scop,
        node: &ScheduleNode,
        regions: &[PrivateRegion],
        loops: &[LaneLoop],
        outer: &mut Vec<usize>,
    ) -> Result<bool> {
        let mut pushed = false;
        if node.get_type()? == ScheduleNodeType::Mark {
            let name = node.mark_get_id()?.get_name()?.to_string();
            if let Some(k) = regions.iter().position(|r| r.mark == name) {
                outer.push(k);
                pushed = true;
            }
            let arrays = || {
                outer
                    .iter()
                    .flat_map(|k| regions[*k].arrays.iter())
                    .collect::<Vec<_>>()
            };
            let lane_loop = LaneLoop::index(&name).and_then(|k| loops.get(k));
            if lane_loop.is_some() && arrays().iter().any(|a| !a.is_scalar()) {
                // Arrays indexed along the row: a lane holds its share.
                return Ok(false);
            }
            if let Some(LaneLoop { states: None, .. }) = lane_loop {
                let written: Vec<String> = scop
                    .statements_in(&node.get_domain()?)?
                    .iter()
                    .map(|s| s.written_tensor())
                    .collect::<Result<_>>()?;
                if arrays().iter().any(|a| written.contains(&a.tensor)) {
                    return Ok(false);
                }
            } else if let Some(LaneLoop {
                states: Some(states),
                ..
            }) = lane_loop
            {
                let arrays = arrays();
                for (tensor, state) in states {
                    // Scalars: checked for every array above.
                    let Some(a) = arrays.iter().find(|a| &a.tensor == tensor) else {
                        return Ok(false);
                    };
                    if !matches!(a.dtype, DType::F32 | DType::F64) {
                        return Ok(false);
                    }
                    if matches!(state, State::Cache { .. }) && a.store {
                        return Ok(false);
                    }
                }
            }
        }
        for i in 0..node.n_children()? {
            if !rec(scop, &node.get_child(i)?, regions, loops, outer)? {
                return Ok(false);
            }
        }
        if pushed {
            outer.pop();
        }
        Ok(true)
    }
    rec(scop, tree, regions, loops, &mut Vec::new())
}

/// The thread axis the lanes of a row take.
///
/// Rows across lanes read consecutive elements when the loops of a row run
/// along the tensors' contiguous dimension (a softmax over the last
/// dimension, `X(r, c)` with the row `r` and the loop over `c`): a warp's
/// lanes take consecutive iterations, [`LaneAxis::X`]. A column reduction
/// (`Mx(c) max=! X(r, c)`: the "row" of the kernel band is a column `c`,
/// its loop runs down the rows `r`) reads with the stride of a whole row
/// that way, one element per 32-byte sector. There the consecutive rows of
/// the band go to consecutive threads of `threadIdx.x` and the lanes to
/// `threadIdx.y`, [`LaneAxis::Y`]: a warp then reads `block.x` consecutive
/// elements of each of `32 / block.x` rows, whole sectors, and the lanes'
/// partial states are combined through shared memory (no warp holds the
/// lanes of one row, so no shuffle can).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LaneAxis {
    /// A warp (or block) per row, its lanes along `threadIdx.x`.
    #[default]
    X,
    /// Consecutive rows along `threadIdx.x` ([`Columns::rows`] per block),
    /// the lanes of each along `threadIdx.y` ([`Columns::lanes`]).
    Y(Columns),
}

/// The block of a kernel whose rows are columns ([`LaneAxis::Y`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns {
    /// Rows of the kernel band per block (its innermost member's tile), on
    /// `threadIdx.x`: a divisor of the member's extent, so every block's
    /// tile is full and every thread of a block reaches the barriers of
    /// the lanes' combination (a thread without a row would leave them).
    pub rows: u32,
    /// Lanes per row, on `threadIdx.y` (a power of two).
    pub lanes: u32,
}

impl Columns {
    /// The element of a split loop's part array (one per state, `rows x
    /// lanes` elements in shared memory) that holds the partial state of
    /// lane `lane` of the block's row `row` (a thread's `threadIdx.y` and
    /// `threadIdx.x`): `lane * rows + row`. The same text is C for the
    /// printer (`codegen::cuda::lanes`) and an isl affine expression for
    /// the race proof (`gpu::race::columns`), so the two read one layout.
    pub fn part_element(&self, lane: &str, row: &str) -> String {
        format!("({lane}) * {} + ({row})", self.rows)
    }
}

/// Mark above the thread band of a kernel whose rows are columns
/// ([`LaneAxis::Y`]); it decides nothing.
pub const COLUMNS_MARK: &str = "columns_on_x";

/// Blocks below which a column kernel takes narrower tiles: about two per
/// multiprocessor of an H100 (132), so that every one has work and a
/// block's combination overlaps another's loads.
const COLUMN_BLOCKS: i64 = 256;
/// Threads of a column kernel's block.
const COLUMN_THREADS: u32 = 512;

/// The column shape of the kernel band `band` (its `lc` leading members
/// parallel; the rows' loops `loops`, from [`candidate`]), when its reads
/// of tensors the kernel does not write coalesce along the band's
/// innermost member (contiguous, or the same element for every row) for
/// more bytes than along the loops the lanes share (see [`LaneAxis`]),
/// and one of them is streamed: contiguous along the rows, moving with
/// the loop and every row member of more than one instance (each element
/// read for one row only, as `X(r, c)` in `S(c) +=! X(r, c)`; a product's
/// operands are reused instead). `None` keeps the lanes along x.
///
/// The rows per block `b` are a divisor of the member's extent `C` (a
/// constant), at most 32 and a multiple of the 32-byte sector's elements
/// (else covering at least one sector; `C` itself where `C <= 32`): the largest that still gives
/// [`COLUMN_BLOCKS`] blocks, else the smallest (the most blocks); where no
/// divisor covers a sector, the largest divisor from 2 (a warp per row
/// reads one useful element a sector, these `b`). The
/// lanes are the power of two that leaves each about
/// [`ELEMENTS_PER_THREAD`] steps of the longest loop, at most
/// [`COLUMN_THREADS`]` / b`. Where no divisor fits, the lanes stay on x.
pub fn columns(
    program: &Program,
    scop: &Scop,
    band: &ScheduleNode,
    loops: &[LaneLoop],
) -> Result<Option<Columns>> {
    let lc = band.band_n_member()? as usize;
    if lc == 0 {
        return Ok(None);
    }
    let Some(extent) = super::mapping::member_extent(band, lc - 1)? else {
        return Ok(None);
    };
    let rows_at = super::mapping::x_iterators(scop, band, lc - 1)?;
    // Each row member with more than one instance, by its iterators.
    let mut members = Vec::new();
    for m in 0..lc {
        if super::mapping::member_extent(band, m)? != Some(1) {
            members.push(super::mapping::x_iterators(scop, band, m)?);
        }
    }
    let stmts = scop.statements_in(&band.get_domain()?)?;
    // Boxes: no statement's loops depend on its row, so no guard that
    // differs between the threads of a block encloses the barriers of the
    // lanes' loops (the rows of a block take different values).
    for s in &stmts {
        if !s.domain.is_box()? {
            return Ok(None);
        }
    }
    let written: Vec<String> = stmts
        .iter()
        .map(|s| s.written_tensor())
        .collect::<Result<_>>()?;
    // Bytes read contiguously along the rows and along the lanes, over the
    // statements of every loop below the band.
    let (mut along_rows, mut along_lanes, mut element) = (0usize, 0usize, 0usize);
    let mut streams = false;
    let mut bands = Vec::new();
    loop_bands(&band.get_child(0)?, &mut bands)?;
    for lane_band in &bands {
        let lanes_at = super::mapping::x_iterators(scop, lane_band, 0)?;
        for s in scop.statements_in(&lane_band.get_domain()?)? {
            let (Some(r), Some(l)) = (
                rows_at.get(&s.name).copied().flatten(),
                lanes_at.get(&s.name).copied().flatten(),
            ) else {
                return Ok(None);
            };
            for a in s.accesses(program).into_iter().skip(1) {
                if written.contains(&a.tensor) {
                    continue;
                }
                // Coalesced along an axis: the address moves by one
                // element a step, or not at all (every thread of the axis
                // reads one element: atax's `tmp(i)` beside `A(i, j)`).
                let bytes = scop.tensor(&a.tensor).map_or(4, |t| t.dtype.size());
                if super::promote::coalesced(a.relation, Some(r))? {
                    along_rows += bytes;
                }
                if contiguous(a.relation, r)? {
                    element = element.max(bytes);
                    // A streamed operand: each element feeds one row, read
                    // once (it moves with every row member and the loop).
                    // A contraction's operands each miss a row member
                    // (gemm's `B(k, j)` misses `i`): reused, they keep
                    // their register and tensor-core tiles.
                    let mut every = super::mapping::reads_along(a.relation, l)?;
                    for its in &members {
                        match its.get(&s.name).copied().flatten() {
                            Some(pos) => every &= super::mapping::reads_along(a.relation, pos)?,
                            None => every = false,
                        }
                    }
                    streams |= every;
                }
                if super::promote::coalesced(a.relation, Some(l))? {
                    along_lanes += bytes;
                }
            }
        }
    }
    if along_rows <= along_lanes || !streams {
        return Ok(None);
    }
    let sector = (32 / element).max(1) as i64;
    let divisors: Vec<i64> = (1..=32)
        .filter(|d| extent % d == 0 && (*d >= 2 || *d == extent))
        .collect();
    // Whole sectors: a multiple of the sector keeps every block's rows on
    // sector boundaries (25 rows of f32 at N = 8000 put a block's rows
    // across four sectors where 16 take two, and gemver's column pass ran
    // at a quarter of the bandwidth); a divisor that only covers a sector
    // is the next choice.
    let aligned: Vec<i64> = divisors
        .iter()
        .copied()
        .filter(|d| *d % sector == 0 || *d == extent)
        .collect();
    let whole: Vec<i64> = if aligned.is_empty() {
        divisors
            .iter()
            .copied()
            .filter(|d| *d >= sector || *d == extent)
            .collect()
    } else {
        aligned
    };
    let rows = match (whole.first(), divisors.last()) {
        (Some(&smallest), _) => whole
            .iter()
            .rev()
            .find(|d| extent / **d >= COLUMN_BLOCKS)
            .copied()
            .unwrap_or(smallest),
        // No divisor covers a sector: still `d` useful elements a
        // sector, where a warp per row reads one.
        (None, Some(&largest)) => largest,
        (None, None) => return Ok(None),
    };
    let longest = loops.iter().filter_map(|l| l.extent).max().unwrap_or(0);
    if loops.iter().any(|l| l.extent.is_none()) {
        return Ok(None);
    }
    let wanted = (longest + ELEMENTS_PER_THREAD - 1) / ELEMENTS_PER_THREAD;
    let most = COLUMN_THREADS / rows as u32;
    let mut lanes = 1u32;
    while i64::from(lanes) < wanted && lanes * 2 <= most {
        lanes *= 2;
    }
    Ok(Some(Columns {
        rows: rows as u32,
        lanes,
    }))
}

/// The rows of the kernel band `band` (its `lc` leading members
/// parallel, at most two) with their loops below them: `band` itself
/// where its members are all parallel, or, for a band of `lc` parallel
/// members and one reduction member (`S(c) +=! X(r, c)` scheduled as one
/// band over `(c, r)`), the band split after its parallel members, the
/// reduction member a loop below them, and the initialisations (whose
/// value on that member is a constant) taken out of it and ordered before
/// it: isl's `order_before`, then the initialisations' copy of the loop
/// (one iteration) deleted. `None` where the band has another shape. The
/// pipeline checks the mapped schedule against every dependence
/// (`schedule::check_legal`), so this reordering is proven like any
/// other.
pub fn split_rows(scop: &Scop, band: &ScheduleNode) -> Result<Option<ScheduleNode>> {
    let n = band.band_n_member()? as usize;
    let lc = super::mapping::leading_coincident(band)?;
    if lc == 0 || lc > 2 || !band.band_get_permutable()? {
        return Ok(None);
    }
    let rows = if n == lc {
        band.copy()?
    } else if n == lc + 1 {
        let inner = band.copy()?.band_split(lc as i32)?.child(0)?;
        let domain = inner.get_domain()?;
        let mut inits = crate::isl::UnionSet::empty(domain.get_space()?)?;
        for s in scop.statements_in(&domain)? {
            if s.kind == StmtKind::Init {
                inits = inits.union(crate::isl::UnionSet::from_set(s.domain.copy()?)?)?;
            }
        }
        let inits = inits.intersect(domain.copy()?)?;
        if inits.is_empty()? {
            inner.parent()?
        } else if inits.is_equal(&domain)? {
            return Ok(None);
        } else {
            // sequence { filter(inits) -> loop; filter(rest) -> loop }
            let sequence = inner.order_before(inits)?.parent()?.parent()?;
            if sequence.get_type()? != ScheduleNodeType::Sequence {
                return Ok(None);
            }
            let init_loop = sequence.child(0)?.child(0)?;
            if init_loop.get_type()? != ScheduleNodeType::Band {
                return Ok(None);
            }
            init_loop.delete()?.parent()?.parent()?.parent()?
        }
    } else {
        return Ok(None);
    };
    Ok((rows.get_type()? == ScheduleNodeType::Band).then_some(rows))
}

/// The rows band of the kernel band `band` when it is a column reduction
/// ([`LaneAxis::Y`]), with the rows' loops and the block: the rows as
/// [`split_rows`] gives them; the band kept as it was where the result is
/// no column reduction.
pub fn column_rows(
    program: &Program,
    scop: &Scop,
    band: &ScheduleNode,
) -> Result<Option<(ScheduleNode, Vec<LaneLoop>, Columns)>> {
    let Some(rows) = split_rows(scop, band)? else {
        return Ok(None);
    };
    let Some(loops) = candidate(program, scop, &rows)? else {
        return Ok(None);
    };
    Ok(columns(program, scop, &rows, &loops)?.map(|c| (rows, loops, c)))
}

/// The bands below `node` (the loops of a row, as [`candidate`] accepted
/// them: single-member bands under sequences, sets and filters).
fn loop_bands(node: &ScheduleNode, out: &mut Vec<ScheduleNode>) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Band {
        out.push(node.copy()?);
        return Ok(());
    }
    for i in 0..node.n_children()? {
        loop_bands(&node.get_child(i)?, out)?;
    }
    Ok(())
}

/// Whether the access `relation` runs along its tensor's contiguous
/// dimension with statement iterator `pos`: the last subscript moves by
/// one element per step, the others not at all.
fn contiguous(relation: &crate::isl::Map, pos: usize) -> Result<bool> {
    let pma = crate::isl::PwMultiAff::from_map(relation.copy()?)?;
    let n = pma.dim(crate::isl::DimType::Out)?;
    if n == 0 {
        return Ok(false);
    }
    for d in 0..n {
        let want = if d + 1 == n { 1 } else { 0 };
        if super::promote::coefficient(&pma.get_pw_aff(d)?, pos as i32)? != Some(want) {
            return Ok(false);
        }
    }
    Ok(true)
}
