//! Mapping a schedule to CUDA blocks and threads, on the schedule tree.
//!
//! The rules are those of Tensor Comprehensions and PPCG:
//! * each child of a top-level sequence (or set) is one kernel, launched
//!   after the previous one finished; a tree without such a sequence is a
//!   single kernel; below a host loop (`schedule::host`, a band under a
//!   `host_loop_*` mark, run by the host), the same rules hold again, and
//!   its kernels are launched once per iteration;
//! * in a kernel, the outermost band's leading coincident members (at most
//!   three) are tiled; the tile loops of those members map to blocks, the
//!   remaining tile loops run sequentially inside a block, and the point
//!   band's leading coincident members (at most three) map to threads;
//! * a mapped loop is distributed cyclically: block `b` of a grid of `G`
//!   blocks runs iterations `b, b + G, ...`, so grid and block sizes are
//!   independent of the tile sizes and every size is correct.
//!
//! Why this is legal: a member is coincident when every dependence not
//! carried by the bands above has distance zero along it. Instances that
//! differ in a block-mapped member therefore never depend on each other,
//! so the blocks may run in any order or at the same time. Instances that
//! differ in a thread-mapped member are independent within the iteration
//! of the loops above it; the loops above are executed in order by all
//! threads of the block together, separated by barriers.
//!
//! The result keeps every mapping decision in the tree as marks
//! (`kernel_K`, `block_x_D`, `thread_y_D`, ...), one above each
//! single-member band that is mapped, `D` being the band's schedule depth:
//! isl names the loop of schedule dimension `D` `cD`, which is how the
//! printers find the mapped loop in the AST (and know that a member isl
//! generated no loop for, because it has one iteration, is not mapped to
//! some deeper loop).

use crate::isl::{Id, Schedule, ScheduleNode, ScheduleNodeType, Set, UnionMap, UnionSet, Val};

use super::attention::Attention;
use super::GpuOptions;
use crate::deps::Dependences;
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::isl::ast::{self, Expr, Op};
use crate::isl::val_to_i64;
use crate::isl::{ast_build_expr_from_pw_aff, Isl};
use crate::model::{Scop, StmtKind};
use std::collections::HashMap;

mod kernel;

/// CUDA's three axes, innermost first.
pub const AXES: [&str; 3] = ["x", "y", "z"];

/// What was decided for one kernel: its launch and how its body runs.
#[derive(Debug, Clone)]
pub struct KernelPlan {
    /// The mark above the kernel's subtree (`kernel_K`).
    pub mark: String,
    /// Blocks along x, y, z (number of tiles along each block-mapped
    /// member), as expressions in the parameters.
    pub grid: [Expr; 3],
    /// Threads along x, y, z.
    pub block: [u32; 3],
    /// Grid axes x, y, z whose blocks start at the last tile (block `b` of
    /// `G` runs tile `G - 1 - b`): where the last tile holds the most work
    /// (see `gpu::block_order`).
    pub reversed: [bool; 3],
    /// Blocks per multiprocessor its registers are limited for (the second
    /// argument of `__launch_bounds__`), where its engine asks for some.
    pub min_blocks: Option<u32>,
    /// Bytes of dynamic shared memory to launch with.
    pub dynamic_shared: usize,
    /// Bytes of shared memory the kernel declares statically (its shared
    /// copies).
    pub static_shared: usize,
    /// How the kernel's body runs: the cases exclude each other, so the
    /// printer switches on this instead of testing which parts are set.
    pub body: KernelBody,
}

/// The ways a kernel's body runs on the GPU. (A program has a handful of
/// plans, built once: the variants' sizes do not matter.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum KernelBody {
    /// The tree below the kernel's mark, mapped to blocks and threads by
    /// its marks, printed node by node.
    Threads(ThreadPlan),
    /// A rolling attention on tensor cores (see `gpu::attention`; a split
    /// decoding is one with `Attention::split`): printed whole by
    /// `codegen::flash`, the tree below its mark left unmapped.
    Attention(AttentionPlan),
}

/// A kernel that runs an attention, and the kernel launched after it.
#[derive(Debug, Clone)]
pub struct AttentionPlan {
    pub attention: Attention,
    /// The map that scales the scores by a constant, if any.
    pub score_scale: Option<super::attention::ScoreScale>,
    /// A split attention's second kernel (`Attention::split`): the
    /// combination of the slices' local states and the epilogue.
    pub combine: Option<CombineKernel>,
    /// The key and value tiles' copies by the copy engine (`gpu::tma`):
    /// the key operand's, then each value operand's, the kernel's tensor
    /// maps in this order; empty where the threads copy them.
    pub copies: Vec<super::tma::TmaOperand>,
}

/// A split attention's second kernel, which has no subtree of its own: a
/// warp per (row, column), grid x the rows, y the batch combinations, z
/// the columns in groups of [`super::attention::COMBINE_WARPS`]. No
/// shared memory.
#[derive(Debug, Clone)]
pub struct CombineKernel {
    /// The `__global__` function's name (`kernel_K_combine`).
    pub name: String,
    pub grid: [Expr; 3],
    pub block: [u32; 3],
}

impl AttentionPlan {
    /// The plan of attention `a` in kernel `mark` of `program`, with its
    /// second kernel where it is split, and its tiles copied by the copy
    /// engine where `tma` allows it and the tiles do.
    fn new(a: Attention, mark: &str, program: &Program, tma: bool) -> AttentionPlan {
        let copies = if tma {
            super::tma::attention_copies(&a, program)
        } else {
            Vec::new()
        };
        let combine = a.split.is_some().then(|| CombineKernel {
            name: format!("{mark}_combine"),
            grid: [
                Expr::Int(a.rows),
                Expr::Int(a.batches()),
                Expr::Int(a.combine_column_blocks()),
            ],
            block: [super::attention::COMBINE_THREADS, 1, 1],
        });
        AttentionPlan {
            score_scale: a.score_scale(),
            attention: a,
            combine,
            copies,
        }
    }
}

/// What a kernel mapped to blocks and threads keeps where.
#[derive(Debug, Clone, Default)]
pub struct ThreadPlan {
    /// Shared-memory promotions at the thread band (none on tensor
    /// cores: the fragments' pipeline copies its own tiles).
    pub scope: Option<super::promote::Scope>,
    /// The reduction loop of an update statement runs across
    /// `threadIdx.x` (a warp per reduction), rows on y and z.
    pub reduce_x: bool,
    /// A tensor each thread keeps in registers below the block loops.
    pub registers: Option<Registers>,
    /// Tensors each thread keeps in registers inside its thread loops
    /// (the `private` mark; see `gpu::private`). Empty with a register
    /// tile, which owns the registers.
    pub private: Vec<super::private::PrivateRegion>,
    /// A warp or a block per row, its threads across the row's loops (see
    /// `gpu::lanes`): the loops, by the index `K` of their `lanes_K` mark.
    /// `None` in a kernel with such marks: lane 0 runs the rows alone
    /// (`reduce_x` is set either way). Always `None` with a register tile.
    pub lanes: Option<Vec<super::lanes::LaneLoop>>,
    /// The thread axis of the lanes of a row: x (a warp or a block per
    /// row), or y for columns (consecutive rows on x; see
    /// `lanes::LaneAxis`).
    pub lane_axis: super::lanes::LaneAxis,
}

/// How a kernel's register tile is computed.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Registers {
    /// Each thread runs its slots of the tile (see `gpu::registers`).
    Tile(super::registers::RegisterTile),
    /// The tile is a contraction run on tensor cores: its register region
    /// is printed as warp fragments (see `gpu::contraction`).
    TensorCores {
        tile: super::registers::RegisterTile,
        contraction: super::contraction::Contraction,
    },
}

impl Registers {
    /// The register tile, whichever engine computes it.
    pub fn tile(&self) -> &super::registers::RegisterTile {
        match self {
            Registers::Tile(tile) | Registers::TensorCores { tile, .. } => tile,
        }
    }
}

impl KernelPlan {
    /// The plan of kernel `mark` before its mapping: one block of one
    /// thread, nothing promoted.
    pub fn one_thread(mark: String) -> KernelPlan {
        let one = || Expr::Int(1);
        KernelPlan {
            mark,
            grid: [one(), one(), one()],
            block: [1, 1, 1],
            reversed: [false; 3],
            min_blocks: None,
            dynamic_shared: 0,
            static_shared: 0,
            body: KernelBody::Threads(ThreadPlan::default()),
        }
    }

    /// The thread mapping, unless the kernel is printed whole.
    pub fn threads(&self) -> Option<&ThreadPlan> {
        match &self.body {
            KernelBody::Threads(t) => Some(t),
            KernelBody::Attention(_) => None,
        }
    }

    /// The attention the kernel runs, if it is one.
    pub fn attention(&self) -> Option<&Attention> {
        match &self.body {
            KernelBody::Attention(a) => Some(&a.attention),
            KernelBody::Threads(_) => None,
        }
    }

    /// The tensor maps the kernel takes after the arguments (its copies by
    /// the copy engine, `gpu::tma`): a contraction's operands', an
    /// attention's key and value tiles'; empty for most kernels.
    pub fn tensor_maps(&self) -> Vec<super::TensorMap> {
        match &self.body {
            KernelBody::Attention(a) => a.copies.iter().map(|o| o.map.clone()).collect(),
            KernelBody::Threads(_) => self
                .contraction()
                .map(|c| c.copies.maps())
                .unwrap_or_default(),
        }
    }

    /// The kernel's register tile (of either engine), if any.
    pub fn register_tile(&self) -> Option<&super::registers::RegisterTile> {
        self.threads()?.registers.as_ref().map(Registers::tile)
    }

    /// The kernel's contraction on tensor cores, if any.
    pub fn contraction(&self) -> Option<&super::contraction::Contraction> {
        match self.threads()?.registers.as_ref()? {
            Registers::TensorCores { contraction, .. } => Some(contraction),
            Registers::Tile(_) => None,
        }
    }

    /// The register tile, to change (tests that break a plan on purpose).
    pub fn register_tile_mut(&mut self) -> Option<&mut super::registers::RegisterTile> {
        match &mut self.body {
            KernelBody::Threads(ThreadPlan {
                registers: Some(Registers::Tile(tile) | Registers::TensorCores { tile, .. }),
                ..
            }) => Some(tile),
            _ => None,
        }
    }

    /// The contraction, to change (tests that break a plan on purpose).
    pub fn contraction_mut(&mut self) -> Option<&mut super::contraction::Contraction> {
        match &mut self.body {
            KernelBody::Threads(ThreadPlan {
                registers: Some(Registers::TensorCores { contraction, .. }),
                ..
            }) => Some(contraction),
            _ => None,
        }
    }

    /// The attention, to change (tests that break a plan on purpose).
    pub fn attention_mut(&mut self) -> Option<&mut Attention> {
        match &mut self.body {
            KernelBody::Attention(a) => Some(&mut a.attention),
            KernelBody::Threads(_) => None,
        }
    }
}

/// Maps `schedule` (legal, untiled) with tile sizes `tile` (the last
/// repeats; empty means tiles of one point). Returns the mapped schedule
/// and one plan per kernel in launch order.
pub fn map(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    schedule: Schedule,
    tile: &[i64],
    opts: &GpuOptions,
) -> Result<(Schedule, Vec<KernelPlan>)> {
    let tile: Vec<i64> = if tile.is_empty() {
        vec![1]
    } else {
        tile.to_vec()
    };
    let root = schedule.get_root()?;
    let kernels = match kernels_of(isl, program, scop, deps, &root, opts)? {
        Kernels::Empty => return Ok((root.get_schedule()?, Vec::new())),
        Kernels::Whole(a) => {
            let name = "kernel_0".to_string();
            let node = root.child(0)?.insert_mark(mark(isl, &name)?)?;
            let attention = AttentionPlan::new(*a, &name, program, opts.tma);
            let a = &attention.attention;
            // The copy engine's barriers: one a stage, 8 bytes each.
            let barriers = if attention.copies.is_empty() {
                0
            } else {
                8 * a.stages() as usize
            };
            // Row tiles along x, last first where the last has the most
            // keys (causal attention).
            let rows_reversed = super::block_order::attention_rows_reversed(a, program);
            let plan = KernelPlan {
                static_shared: barriers,
                grid: [Expr::Int(a.grid_x()), Expr::Int(a.batches()), Expr::Int(1)],
                reversed: [rows_reversed, false, false],
                block: [a.threads(), 1, 1],
                min_blocks: Some(a.min_blocks()),
                dynamic_shared: a.shared_bytes(),
                body: KernelBody::Attention(attention),
                ..KernelPlan::one_thread(name)
            };
            return Ok((node.get_schedule()?, vec![plan]));
        }
        Kernels::Roots(paths) => paths,
    };
    let mut plans = Vec::new();
    let mut node = root;
    for path in kernels {
        let k = node_at(node.root()?, &path)?;
        let (k, plan) = kernel::map_kernel(isl, program, scop, deps, k, plans.len(), &tile, opts)?;
        plans.push(plan);
        node = k;
    }
    Ok((node.get_schedule()?, plans))
}

/// The kernels [`map`] makes of a tree, found before any is mapped.
enum Kernels {
    /// A tree with no statements: no kernel.
    Empty,
    /// A rolling attention, one kernel on tensor cores.
    Whole(Box<Attention>),
    /// One kernel per root, each a path of child positions from the root.
    Roots(Vec<Vec<usize>>),
}

/// The kernels [`map`] makes of the tree at `root` under `opts`, as it
/// finds them before mapping any (the one place that decides them).
fn kernels_of(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    root: &ScheduleNode,
    opts: &GpuOptions,
) -> Result<Kernels> {
    if root.n_children()? == 0 {
        return Ok(Kernels::Empty);
    }
    // A rolling attention runs as one kernel on tensor cores, whatever
    // kernels the tree's sequences would make (`attention`), where the
    // tiles, the block and the grid are polyfuse's to choose (a user's
    // sizes are for the tree's own mapping).
    if opts.tensor_cores && opts.auto_tile && opts.block.is_empty() && opts.grid.is_empty() {
        let found = match super::attention::recognise(isl, program, scop, deps)? {
            Some(a) => Some(a),
            None => super::decoding::recognise(isl, program, scop, deps)?,
        };
        if let Some(a) = found {
            return Ok(Kernels::Whole(Box::new(a)));
        }
    }
    // Each kernel's root, as a path of child positions from the root: a
    // sequence or set with no band above it is split into one kernel (or
    // more) per child, in order (kernel boundaries order a sequence's
    // children; a set's may run in any order).
    let mut kernels = Vec::new();
    kernel_roots(&root.copy()?.child(0)?, vec![0], &mut kernels)?;
    Ok(Kernels::Roots(kernels))
}

/// The number of kernels, so of plans, that [`map`] gives `schedule` under
/// `opts` where it maps it, found without mapping (`map` decides them the
/// same way, in [`kernels_of`]): what `pipeline::probe::choose_by_cost`
/// needs to know before it maps a grouping only to count its kernels.
pub fn kernel_count(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    schedule: &Schedule,
    opts: &GpuOptions,
) -> Result<usize> {
    Ok(
        match kernels_of(isl, program, scop, deps, &schedule.get_root()?, opts)? {
            Kernels::Empty => 0,
            Kernels::Whole(_) => 1,
            Kernels::Roots(paths) => paths.len(),
        },
    )
}

/// Collects the kernel roots under `node` (reached by `path`): `node`
/// itself, or where it is a sequence or set (under marks), the kernel
/// roots below each of its filters.
fn kernel_roots(node: &ScheduleNode, path: Vec<usize>, out: &mut Vec<Vec<usize>>) -> Result<()> {
    let mut inner = node.copy()?;
    let mut inner_path = path.clone();
    let mut host = false;
    while inner.get_type()? == ScheduleNodeType::Mark {
        let name = inner.mark_get_id()?.get_name()?.to_string();
        host |= crate::schedule::host::HostStep::from_mark(&name).is_some();
        inner = inner.child(0)?;
        inner_path.push(0);
    }
    let ty = inner.get_type()?;
    // A host loop's band runs on the host: the kernels are below it.
    if host && ty == ScheduleNodeType::Band && inner.n_children()? > 0 {
        inner_path.push(0);
        return kernel_roots(&inner.child(0)?, inner_path, out);
    }
    if ty == ScheduleNodeType::Sequence || ty == ScheduleNodeType::Set {
        for i in 0..inner.n_children()? {
            // sequence -> filter i -> its subtree
            let filter = inner.copy()?.child(i)?;
            if filter.n_children()? == 0 {
                continue;
            }
            let mut p = inner_path.clone();
            p.extend([i as usize, 0]);
            kernel_roots(&filter.child(0)?, p, out)?;
        }
        return Ok(());
    }
    out.push(path);
    Ok(())
}

/// Whether the band of every kernel of `schedule` has the shape whose rows
/// may run across lanes (`lanes::candidate`): a necessary condition for
/// the mapping's lanes, checked without mapping.
pub fn kernels_have_lane_rows(program: &Program, scop: &Scop, schedule: &Schedule) -> Result<bool> {
    let root = schedule.get_root()?;
    if root.n_children()? == 0 {
        return Ok(false);
    }
    let mut kernels = Vec::new();
    kernel_roots(&root.copy()?.child(0)?, vec![0], &mut kernels)?;
    for path in kernels {
        let mut node = node_at(root.copy()?, &path)?;
        while node.get_type()? == ScheduleNodeType::Mark {
            node = node.child(0)?;
        }
        if node.get_type()? != ScheduleNodeType::Band
            || super::lanes::candidate(program, scop, &node)?.is_none()
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The node reached from `node` by the child positions `path`.
fn node_at(mut node: ScheduleNode, path: &[usize]) -> Result<ScheduleNode> {
    for &i in path {
        node = node.child(i as i32)?;
    }
    Ok(node)
}

fn mark(isl: &Isl, name: &str) -> Result<Id> {
    Ok(Id::read_from_str(&isl.ctx, name)?)
}

/// Number of leading coincident members of a band.
pub fn leading_coincident(band: &ScheduleNode) -> Result<usize> {
    let n = band.band_n_member()?;
    let mut k = 0;
    while k < n && band.band_member_get_coincident(k)? {
        k += 1;
    }
    Ok(k as usize)
}

/// How a kernel's rows run (the first of `map_kernel`'s steps): a warp per
/// row with its lanes across the reduction (`warp_reduction`), rows across
/// lanes (`lanes::candidate`), or columns of rows along x
/// (`lanes::column_rows`); none of them for other bands.
struct RowMapping {
    /// The kernel's band, maybe with marks on its lane loops or its
    /// members with one instance moved above it.
    band: ScheduleNode,
    /// The update statement whose reduction loop a warp's lanes share.
    reduction: Option<String>,
    site: Option<ReductionSite>,
    lane_loops: Option<Vec<super::lanes::LaneLoop>>,
    /// Threads of a row along x.
    lane_width: u32,
    columns: Option<super::lanes::Columns>,
    /// Rows of a block tile side by side on y.
    row_groups: u32,
}

/// The rows of the kernel whose band is `node` (see [`RowMapping`]).
fn row_mapping(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    node: ScheduleNode,
    opts: &GpuOptions,
) -> Result<RowMapping> {
    // A warp per row, its lanes across the reduction, where
    // `warp_reduction` says so; the members with one instance may then
    // have moved to a band of their own above the rows.
    // Columns first (`lanes::column_rows`): a reduction down a tensor's
    // rows, which a warp per row would read a row apart.
    let column_rows = if opts.reduce && opts.auto_tile && opts.block.is_empty() {
        super::lanes::column_rows(program, scop, &node)?
    } else {
        None
    };
    let warp = if column_rows.is_some() {
        None
    } else {
        warp_reduction(program, scop, deps, &node, opts)?
    };
    let warped = warp.is_some();
    let mut node = node;
    let (reduction, site) = match warp {
        Some(w) => {
            node = w.band;
            (Some(w.update), Some(w.site))
        }
        None => (None, None),
    };
    // Otherwise a warp per row, its lanes across the row's loops, where
    // `lanes::candidate` says so.
    let mut lane_loops = None;
    let mut lane_width = 32;
    let mut columns: Option<super::lanes::Columns> = None;
    if !warped
        && column_rows.is_none()
        && opts.reduce
        && opts
            .block
            .first()
            .is_none_or(|x| *x % 32 == 0 && *x <= super::lanes::MAX_WIDTH)
    {
        if let Some(loops) = super::lanes::candidate(program, scop, &node)? {
            node = super::lanes::mark_loops(isl, node)?;
            lane_width = super::lanes::width(&loops, opts.block.first().copied());
            lane_loops = Some(loops);
        }
    }
    if let Some((band, loops, c)) = column_rows {
        node = super::lanes::mark_loops(isl, band)?;
        lane_width = c.lanes;
        lane_loops = Some(loops);
        columns = Some(c);
    }
    let lanes = lane_loops.is_some();
    // Rows whose loops split a rolling update (an online softmax).
    let rolling_rows = lane_loops.as_ref().is_some_and(|loops| {
        loops.iter().any(|l| {
            l.states.as_ref().is_some_and(|s| {
                s.iter()
                    .any(|(_, st)| matches!(st, super::lanes::State::Target { .. }))
            })
        })
    });
    // Rows on whole blocks: how many run side by side on y.
    let row_groups = if lanes && lane_width > 32 && columns.is_none() {
        block_row_groups(lane_width, rolling_rows, opts)
    } else {
        1
    };
    Ok(RowMapping {
        band: node,
        reduction,
        site,
        lane_loops,
        lane_width,
        columns,
        row_groups,
    })
}

/// The kernel band `node` with its parallel members in the order blocks
/// take them (the second of `map_kernel`'s steps): the outer members
/// folded while more than three are parallel (`fold_outer_members`), else
/// the innermost three moved to the front; with `free_x` (no warp or lanes
/// own x), the member that coalesces the most accesses on x. Gives the
/// band, its leading parallel members and how many go on blocks.
fn order_members(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    node: ScheduleNode,
    free_x: bool,
    opts: &GpuOptions,
) -> Result<(ScheduleNode, usize, usize)> {
    let mut node = node;
    let mut lc = leading_coincident(&node)?;
    while lc > 3 && node.band_get_permutable()? {
        match fold_outer_members(isl, node.copy()?)? {
            Some(folded) => {
                node = folded;
                lc -= 1;
            }
            None => break,
        }
    }
    let nb = lc.min(3);
    if lc > 3 && node.band_get_permutable()? {
        // Blocks take the innermost three parallel members (the last one,
        // usually the tensors' contiguous dimension, on x); the outer ones
        // run inside each block. A permutable band may be permuted.
        node = move_to_front(node, lc - 3, lc)?;
    }
    if free_x && opts.auto_tile && nb >= 2 && node.band_get_permutable()? {
        // The innermost parallel member goes to x unless another one
        // coalesces more of the kernel's memory accesses.
        if let Some(x) = coalescing_member(program, scop, &node, nb)? {
            let order: Vec<usize> = (0..nb)
                .filter(|m| *m != x)
                .chain([x])
                .chain(nb..node.band_n_member()? as usize)
                .collect();
            node = permute_members(node, &order)?;
        }
    }
    Ok((node, lc, nb))
}

/// The tile sizes of a band with a register tile whose sizes the mapping
/// chooses: large register tiles (`big`, 128 x 128) where they still give
/// every multiprocessor a block, 64 x 64 where those do, else `small`
/// (the sizes without registers). `nb` members go on blocks.
fn register_tile_sizes(
    node: &ScheduleNode,
    nb: usize,
    big: Vec<i64>,
    small: Vec<i64>,
) -> Result<Vec<i64>> {
    let extents: Vec<Option<i64>> = (0..nb)
        .map(|i| member_extent(node, i))
        .collect::<Result<_>>()?;
    // The tiles that hold instances (a triangle's half of the box),
    // else the box's tiles.
    let blocks = |tiles: &[i64]| -> Option<i64> {
        if let Ok(Some(b)) = occupied_tiles(node, &tiles[..nb]) {
            return Some(b);
        }
        let mut b = 1i64;
        for (i, e) in extents.iter().enumerate() {
            b = b.saturating_mul((e.as_ref()? + tiles[i] - 1) / tiles[i]);
        }
        Some(b)
    };
    let medium: Vec<i64> = big
        .iter()
        .enumerate()
        .map(|(i, t)| if i < nb && *t > 1 { 64 } else { *t })
        .collect();
    // A tile wider than its member's values (rounded up to a warp)
    // would leave most of its threads' slots empty: a 56 x 56
    // convolution's plane on 128 x 128 tiles ran 2.2x slower than on
    // 32 x 32 ones without registers (H100, depthwise_conv).
    let fits = |tiles: &[i64]| {
        (0..nb).all(|i| tiles[i] <= 1 || extents[i].is_none_or(|e| tiles[i] <= (e + 31) / 32 * 32))
    };
    Ok(match (blocks(&big), blocks(&medium)) {
        (Some(b), _) if b >= ENOUGH_REGISTER_BLOCKS && fits(&big) => big,
        (None, _) if fits(&big) => big,
        (_, Some(m)) if m >= ENOUGH_REGISTER_BLOCKS && fits(&medium) => medium,
        _ => small,
    })
}

/// The tile sizes of an elementwise band (no reduction member, no
/// register tile, no rows on lanes, the default 32 x 8 threads: no block
/// the user gave) whose first `nb` members map to
/// blocks: the default 64 x 64 tiles (16 elements a thread of the 32 x 8
/// block) where an average launch has [`ENOUGH_ELEMENTWISE_BLOCKS`] of
/// them, else 32 x 32 (4 a thread) where those are enough, else 8 x 32
/// (one element a thread). A small launch on large tiles leaves most of
/// the machine idle and runs each thread's elements one after the other,
/// each waiting on its loads: a stacked LSTM's cell update (4 cells of 64
/// x 256 a launch under the wavefront's host loop) had 16 blocks on 132
/// multiprocessors. Tiles are counted as [`occupied_tiles`] counts them
/// (under host loops, those of an average launch); where they cannot be
/// counted (symbolic sizes) the default stays.
pub(super) fn elementwise_tile_sizes(
    node: &ScheduleNode,
    nb: usize,
    tiles: Vec<i64>,
) -> Result<Vec<i64>> {
    if nb < 2 || tiles[nb - 2] != ELEMENTWISE_TILE || tiles[nb - 1] != ELEMENTWISE_TILE {
        return Ok(tiles);
    }
    let with = |y: i64, x: i64| {
        let mut t = tiles.clone();
        t[nb - 2] = y;
        t[nb - 1] = x;
        t
    };
    for candidate in [tiles.clone(), with(32, 32)] {
        match occupied_tiles(node, &candidate[..nb])? {
            Some(b) if b < ENOUGH_ELEMENTWISE_BLOCKS => {}
            _ => return Ok(candidate),
        }
    }
    Ok(with(8, 32))
}

/// Blocks an elementwise kernel should have before it takes larger
/// tiles: two 256-thread blocks for each of the H100's 132
/// multiprocessors.
const ENOUGH_ELEMENTWISE_BLOCKS: i64 = 264;

/// The default tile of an elementwise band's two block members
/// ([`auto_tile`]), which [`elementwise_tile_sizes`] shrinks for small
/// launches.
const ELEMENTWISE_TILE: i64 = 64;

/// What decides a kernel's threads per block (`thread_shape`).
struct ThreadShapeOf {
    /// A register tile (the mapping's 16 x 16 threads).
    registers: bool,
    /// The band has a sequential member.
    has_reduction: bool,
    /// A warp per row, its lanes across the reduction.
    warp_rows: bool,
    /// Rows across lanes (`lanes::candidate` or columns).
    lanes: bool,
    lane_width: u32,
    row_groups: u32,
    columns: Option<super::lanes::Columns>,
}

/// A kernel's threads per block (x, y, z) and how its rows sit on them.
struct ThreadShape {
    block: [u32; 3],
    /// `Some` where the lanes run along y (columns).
    lane_axis: Option<super::lanes::LaneAxis>,
    /// The reduction (or the row's loops) runs across `threadIdx.x`.
    reduce_x: bool,
}

/// The threads per block of a kernel whose thread-mapped members have
/// tiles `tiles` (one of `map_kernel`'s steps; see [`ThreadShapeOf`]).
fn thread_shape(of: ThreadShapeOf, tiles: &[i64], opts: &GpuOptions) -> ThreadShape {
    let nt = tiles.len();
    let mut lane_axis = None;
    let mut reduce_x = false;
    let mut block = if of.registers && opts.block.is_empty() && nt >= 2 {
        [16, 16, 1]
    } else if opts.auto_tile && opts.block.is_empty() && nt >= 2 && !of.has_reduction {
        [32, 8, 1]
    } else {
        thread_block(tiles, opts)
    };
    if let Some(c) = of.columns.filter(|_| of.lanes) {
        // Consecutive rows (columns of the tensors) along x, each
        // on `c.lanes` threads along y.
        block = [c.rows, c.lanes, 1];
        lane_axis = Some(super::lanes::LaneAxis::Y(c));
        reduce_x = true;
    } else if of.lanes && of.lane_width > 32 {
        // A row on `lane_width` threads along x, the block tile's
        // rows side by side along y (see [`block_row_groups`]).
        block = [of.lane_width, of.row_groups, 1];
        reduce_x = true;
    } else if of.warp_rows || of.lanes {
        // Rows on y (and z), the reduction on x: a warp per row.
        block = if opts.block.is_empty() {
            // 256 threads: 8 warps, one row each at a time.
            let rows = thread_block(tiles, opts);
            let y = rows[0].min(8);
            [32, y, rows[1].min(8 / y).max(1)]
        } else {
            // The user's rows per block (x is 32: checked above).
            let user = GpuOptions {
                block: opts.block.iter().skip(1).copied().collect(),
                ..opts.clone()
            };
            let rows = thread_block(tiles, &user);
            [32, rows[0], rows[1]]
        };
        // The lanes share the row's loops (marked already); other
        // statements run on lane 0.
        reduce_x = true;
    }
    ThreadShape {
        block,
        lane_axis,
        reduce_x,
    }
}

/// The reduction loop of `update` below the rows' thread loops (`node`,
/// the band below them) under a `reduce_x` mark, the kernel's other
/// statements ordered around it: where a sequence below the rows holds it
/// (`ReductionSite::Below`), its child; else the band's first member, the
/// other statements (the reduction's initialisation) before it.
fn mark_reduction(
    isl: &Isl,
    scop: &Scop,
    node: ScheduleNode,
    update: &str,
    site: Option<ReductionSite>,
    kernel: &str,
) -> Result<ScheduleNode> {
    let mut node = node;
    match site {
        Some(ReductionSite::Below(k)) => {
            // The sequence below the rows already orders the
            // other statements around the reduction loop.
            if node.get_type()? != ScheduleNodeType::Sequence {
                return Err(Error::Internal(format!(
                    "{}: no sequence above the reduction loop",
                    kernel
                )));
            }
            node = node.child(k as i32)?.child(0)?;
        }
        _ => {
            // The other statements (the reduction's
            // initialisation) run before the reduction loop of
            // the update.
            let others = node.get_domain()?.subtract(crate::isl::UnionSet::from_set(
                scop.statement(update)
                    .ok_or_else(|| Error::Internal(format!("no statement {update}")))?
                    .domain
                    .copy()?,
            )?)?;
            if node.band_n_member()? > 1 {
                node = node.band_split(1)?;
            }
            if !others.is_empty()? {
                node = node.order_before(others)?;
            }
        }
    }
    let depth = node.get_schedule_depth()?;
    Ok(node.insert_mark(mark(isl, &format!("reduce_x_{depth}"))?)?)
}

/// The first `nt` members of the point band `node`, each in a band of its
/// own under a mark naming its thread axis: the innermost on x, or on y
/// where `rows_on_x` (a warp's lanes or a row's take x), or, for
/// `columns`, the innermost row member on x and an outer one on z. Gives
/// the node below the last.
fn mark_threads(
    isl: &Isl,
    node: ScheduleNode,
    nt: usize,
    columns: bool,
    rows_on_x: bool,
) -> Result<ScheduleNode> {
    let mut node = node;
    for j in 0..nt {
        if j + 1 < nt {
            node = node.band_split(1)?;
        }
        let axis = match columns {
            // The innermost row member on x, an outer one on z
            // (y is the lanes').
            true if j + 1 == nt => 0,
            true => 2,
            false => nt - 1 - j + usize::from(rows_on_x),
        };
        let depth = node.get_schedule_depth()?;
        if columns && axis == 0 {
            // Shows the decision in `--emit gpu-tree`; the
            // printers take it from the plan (`lane_axis`).
            node = node.insert_mark(mark(isl, super::lanes::COLUMNS_MARK)?)?;
            node = node.child(0)?;
        }
        node = node.insert_mark(mark(isl, &format!("thread_{}_{depth}", AXES[axis]))?)?;
        node = node.child(0)?.child(0)?;
    }
    Ok(node)
}

/// The point band of a register tile's kernel and what its last step
/// needs (`finish_register_tile`).
struct RegisterBand<'a> {
    node: ScheduleNode,
    /// Members on blocks (and threads).
    nb: usize,
    /// The kernel's instances to their thread point.
    thread_values: &'a UnionMap,
    kernel_domain: &'a UnionSet,
    on_tensor_cores: bool,
}

/// The register tile's last step in `map_kernel`: the point band's
/// sequential members first, so that each step works on all of a
/// thread's registers ((k, i, j) instead of (i, j, k)), with a `nosync`
/// mark where no dependence they carry crosses threads; the epilogue
/// statements that run where the registers are stored (on the SIMT
/// units), which then leave the shared copies' statements. Gives the node
/// below the sequential members and the tile.
#[allow(clippy::too_many_arguments)]
fn finish_register_tile(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    band: RegisterBand<'_>,
    mut tile: super::registers::RegisterTile,
    scope: Option<&mut super::promote::Scope>,
    thread_tiles: &[i64],
    vector: u32,
) -> Result<(ScheduleNode, Registers)> {
    let RegisterBand {
        mut node,
        nb,
        thread_values,
        kernel_domain,
        on_tensor_cores,
    } = band;
    let m = node.band_n_member()? as usize;
    node = move_to_front(node, nb, m)?;
    node = node.band_split((m - nb) as i32)?;
    if !super::registers::carries_cross_thread_dependences(&node, thread_values, deps)? {
        node = node.insert_mark(mark(isl, "nosync")?)?.child(0)?;
    }
    node = node.child(0)?;
    let promoted: Vec<String> = scope
        .iter()
        .flat_map(|s| s.arrays.iter().map(|a| a.tensor.clone()))
        .collect();
    let store = if on_tensor_cores {
        Vec::new()
    } else {
        super::registers::store_statements(
            isl,
            program,
            scop,
            deps,
            kernel_domain,
            &tile,
            &promoted,
        )?
    };
    if let Some(scope) = scope {
        let moved: Vec<String> = store.iter().map(|e| e.statement.clone()).collect();
        scope.without_statements(&moved);
    }
    tile.thread_tiles = thread_tiles.to_vec();
    tile.vector = vector;
    tile.store = store;
    Ok((node, Registers::Tile(tile)))
}

/// The first `n` tile sizes of `tile` (the last one repeats).
fn member_tile_of(tile: &[i64], n: usize) -> Vec<i64> {
    (0..n).map(|i| tile[i.min(tile.len() - 1)]).collect()
}

/// Number of tiles along the single-member band `node` whose tile size is
/// `size`: `(max - min) / size + 1` over the instances reaching it, as an
/// expression in the parameters.
fn tile_count(scop: &Scop, node: &ScheduleNode, size: i64) -> Result<Expr> {
    // The member's values at one value of the loops above it (host loops,
    // outer block bands): its loop starts at their least, and each block
    // strides over them by the grid, so the grid needs the widest span at
    // any one prefix, `max_p (hi(p) - lo(p))`, the largest delta of
    // `R⁻¹ ∘ R` with `R = { p -> v }`. A wavefront's cells (`l + t = w`)
    // span at most L values on each diagonal, not the T values of `t`
    // overall; without outer loops this is `hi - lo` as before.
    let (prefix, member) = prefix_and_member(node)?;
    let at_prefix = prefix.reverse()?.apply_range(member)?;
    let spans = at_prefix
        .copy()?
        .reverse()?
        .apply_range(at_prefix)?
        .deltas()?;
    if spans.is_empty()? {
        return Ok(Expr::Int(0));
    }
    let set = Set::from_union_set(spans)?;
    let to_expr = |pa| -> Result<Expr> {
        let e = ast_build_expr_from_pw_aff(scop.context.copy()?, pa)
            .ok_or_else(|| Error::Internal("isl could not print a grid bound".into()))?;
        ast::expr_from_isl(&e)
    };
    let span = to_expr(set.dim_max(0)?)?;
    Ok(Expr::Op(
        Op::Add,
        vec![
            Expr::Op(Op::FloorDiv, vec![span, Expr::Int(size)]),
            Expr::Int(1),
        ],
    ))
}

/// Threads per block: the options' sizes, or the tile sizes of the
/// thread-mapped members (innermost on x) up to 256 threads in all.
fn thread_block(tiles: &[i64], opts: &GpuOptions) -> [u32; 3] {
    let mut block = [1u32; 3];
    let nt = tiles.len();
    if !opts.block.is_empty() {
        // Validated by `GpuOptions::validate`; axes the kernel does not map
        // keep one thread.
        for (axis, b) in block.iter_mut().enumerate().take(nt) {
            *b = opts.block.get(axis).copied().unwrap_or(1).max(1);
        }
    } else {
        let mut budget: u32 = 256;
        for (axis, b) in block.iter_mut().enumerate().take(nt) {
            let t = tiles[nt - 1 - axis].clamp(1, 1024) as u32;
            *b = t.min(budget).max(1);
            budget = (budget / *b).max(1);
        }
    }
    block
}

/// Checks in isl that the mapping of `schedule` runs no two dependent
/// instances in parallel.
///
/// For every mapped single-member band `b` (under a `block_*` or
/// `thread_*` mark) with prefix schedule `P` (all loops above it) and
/// dependences `D` (flow, anti and output), the instances that run in
/// parallel are those with the same prefix and different values of `b`.
/// The mapping is legal when no dependence relates two of them:
///
/// `D ∩ (P⁻¹ ∘ P) \ (b⁻¹ ∘ b) = ∅`
///
/// (pairs with different prefixes are ordered by the loops above, which
/// every thread of a block executes together, separated by barriers; and
/// block-mapped bands sit at the top, where the prefix is empty).
pub fn check_parallel(
    program: &Program,
    schedule: &Schedule,
    scop: &Scop,
    deps: &crate::deps::Dependences,
) -> Result<()> {
    let all = deps.all()?;
    // A loop mapped as a reduction may reorder exactly these.
    let reorderable = scop.reorderable_pairs()?;
    fn rec(
        node: ScheduleNode,
        all: &UnionMap,
        reorderable: &UnionMap,
        program: &Program,
        scop: &Scop,
    ) -> Result<()> {
        let file = program.source.as_str();
        if node.get_type()? == ScheduleNodeType::Mark {
            let name = node.mark_get_id()?.get_name()?.to_string();
            if super::lanes::LaneLoop::index(&name).is_some() {
                let band = node.get_child(0)?;
                if !lane_loop_violations(&band, all, program, scop, true)?.is_empty()? {
                    // The same set, as the error has always printed it.
                    let violated = lane_loop_violations(&band, all, program, scop, false)?;
                    return Err(Error::Illegal {
                        file: file.to_string(),
                        message: format!(
                            "illegal GPU mapping: the loop the lanes of a warp share ({name}) runs dependent instances in parallel: {}",
                            crate::isl::IslPrint::text(&violated.coalesce()?)
                        ),
                    });
                }
            }
            let reduce = name.starts_with("reduce_");
            if name.starts_with("block_") || name.starts_with("thread_") || reduce {
                let band = node.get_child(0)?;
                let violations = |fast: bool| -> Result<UnionMap> {
                    let mut violated = match fast {
                        true => pairs_differing_only_at(all, &band)?,
                        false => all.copy()?.intersect(differ_only_from(&band)?)?,
                    };
                    if reduce {
                        violated = violated.subtract(reorderable.copy()?)?;
                    }
                    Ok(violated)
                };
                if !violations(true)?.is_empty()? {
                    // The same set, as the error has always printed it.
                    let violated = violations(false)?;
                    let what = if reduce {
                        "the reduction loop mapped to threadIdx.x".to_string()
                    } else {
                        format!(
                            "the loop mapped to {}",
                            mapped_index(&name).unwrap_or(name.clone())
                        )
                    };
                    return Err(Error::Illegal {
                        file: file.to_string(),
                        message: format!(
                            "illegal GPU mapping: {what} runs dependent instances in parallel: {}",
                            crate::isl::IslPrint::text(&violated.coalesce()?)
                        ),
                    });
                }
            }
        }
        let n = node.n_children()?;
        for i in 0..n {
            rec(node.get_child(i)?, all, reorderable, program, scop)?;
        }
        Ok(())
    }
    rec(schedule.get_root()?, &all, &reorderable, program, scop)
}

/// The dependences `all` that the loop `band`, shared by the lanes of a
/// warp (`gpu::lanes`), breaks. A map loop runs its iterations in
/// parallel; a split reduction loop (its member not coincident) too,
/// except for the chains of its states, which the lanes' combination
/// reassembles: the pairs of its instances that access one element of a
/// tensor which a statement of the loop writes at one element per row
/// (per value of the loops above).
fn lane_loop_violations(
    band: &ScheduleNode,
    all: &UnionMap,
    program: &Program,
    scop: &Scop,
    fast: bool,
) -> Result<UnionMap> {
    // One set, two ways (`pairs_differing_only_at`).
    let violated = match fast {
        true => pairs_differing_only_at(all, band)?,
        false => all.copy()?.intersect(differ_only_from(band)?)?,
    };
    if band.band_member_get_coincident(0)? {
        return Ok(violated);
    }
    let inside = band.get_domain()?;
    let prefix = band
        .get_prefix_schedule_union_map()?
        .intersect_domain(inside.copy()?)?;
    let same_prefix = prefix.copy()?.apply_range(prefix.reverse()?)?;
    let stmts = scop.statements_in(&inside)?;
    let mut states = UnionMap::empty(all.get_space()?)?;
    for s in &stmts {
        let w = UnionMap::from_map(s.write.copy()?)?;
        let own = crate::isl::UnionSet::from_set(s.domain.copy()?)?;
        let row = same_prefix
            .copy()?
            .intersect_domain(own.copy()?)?
            .intersect_range(own)?;
        if !row.is_subset(&w.copy()?.apply_range(w.reverse()?)?)? {
            continue;
        }
        // Every access of the loop to the state's tensor.
        let written = s.written_tensor()?;
        let mut touch = UnionMap::empty(all.get_space()?)?;
        for t in &stmts {
            for a in t
                .accesses(program)
                .into_iter()
                .filter(|a| a.tensor == written)
            {
                touch = touch.union(UnionMap::from_map(a.relation.copy()?)?)?;
            }
        }
        states = states.union(touch.copy()?.apply_range(touch.reverse()?)?)?;
    }
    Ok(violated.subtract(states)?)
}

/// The prefix schedule of `band` (the loops above it) and its partial
/// schedule, both on the instances that reach it.
pub fn prefix_and_member(band: &ScheduleNode) -> Result<(UnionMap, UnionMap)> {
    let domain = band.get_domain()?;
    let prefix = band
        .get_prefix_schedule_union_map()?
        .intersect_domain(domain.copy()?)?;
    let member = band
        .band_get_partial_schedule_union_map()?
        .intersect_domain(domain)?;
    Ok((prefix, member))
}

/// `blockIdx.x` for a mark `block_x_D`, `threadIdx.y` for `thread_y_D`.
pub fn mapped_index(mark: &str) -> Option<String> {
    let (kind, rest) = if let Some(r) = mark.strip_prefix("block_") {
        ("blockIdx", r)
    } else {
        ("threadIdx", mark.strip_prefix("thread_")?)
    };
    let axis = rest.split('_').next()?;
    Some(format!("{kind}.{axis}"))
}

/// The mapping a mark stands for: (thread?, axis, name of the AST loop).
pub fn parse_mapping_mark(mark: &str) -> Option<(bool, char, String)> {
    let (thread, rest) = if let Some(r) = mark.strip_prefix("block_") {
        (false, r)
    } else {
        (true, mark.strip_prefix("thread_")?)
    };
    let (axis, depth) = rest.split_once('_')?;
    let axis = axis.chars().next()?;
    let depth: usize = depth.parse().ok()?;
    Some((thread, axis, format!("c{depth}")))
}

/// Per statement, the position of its iterator that the lanes of a row
/// walk (`threadIdx.x`): the one of the row's loop below the kernel band
/// `band` that holds it (`gpu::lanes`); `rows`' for a statement outside
/// every loop (an initialisation, which a row runs once).
fn lane_iterators(
    scop: &Scop,
    band: &ScheduleNode,
    rows: HashMap<String, Option<usize>>,
) -> Result<HashMap<String, Option<usize>>> {
    fn walk(
        scop: &Scop,
        node: &ScheduleNode,
        out: &mut HashMap<String, Option<usize>>,
    ) -> Result<()> {
        if node.get_type()? == ScheduleNodeType::Band {
            for (s, it) in x_iterators(scop, node, 0)? {
                out.insert(s, it);
            }
            return Ok(());
        }
        for i in 0..node.n_children()? {
            walk(scop, &node.get_child(i)?, out)?;
        }
        Ok(())
    }
    let mut out = rows;
    walk(scop, &band.get_child(0)?, &mut out)?;
    Ok(out)
}

/// For each statement, the position of the iterator that band member
/// `member` of `band` runs along, when the member is that single iterator
/// (coefficient 1, no other term): the iterator mapped to `threadIdx.x`.
pub(super) fn x_iterators(
    scop: &Scop,
    band: &ScheduleNode,
    member: usize,
) -> Result<HashMap<String, Option<usize>>> {
    let partial = band.band_get_partial_schedule_union_map()?;
    let mut out = HashMap::new();
    for s in &scop.statements {
        let m = partial
            .copy()?
            .intersect_domain(crate::isl::UnionSet::from_set(s.domain.copy()?)?)?;
        if m.is_empty()? {
            continue;
        }
        let pma = crate::isl::PwMultiAff::from_map(crate::isl::Map::from_union_map(m)?)?;
        let pa = pma.get_pw_aff(member as i32)?;
        let mut found = None;
        if let Some(aff) = super::promote::single_aff(&pa)? {
            let mut ones = Vec::new();
            let mut others = false;
            for i in 0..s.iterators.len() {
                let c = val_to_i64(&aff.get_coefficient_val(crate::isl::DimType::In, i as i32)?)?;
                if c == 1 {
                    ones.push(i);
                } else if c != 0 {
                    others = true;
                }
            }
            if ones.len() == 1 && !others {
                found = Some(ones[0]);
            }
        }
        out.insert(s.name.clone(), found);
    }
    Ok(out)
}

/// The parallel member among the band's first `nb` that `threadIdx.x`
/// should take instead of the innermost one (`nb - 1`), when that member
/// coalesces strictly more of the kernel's memory traffic.
///
/// A warp's 32 lanes differ in the member on x only, so an access is
/// coalesced along a member when its address moves by 0 (every lane reads
/// one element) or 1 element per step of the member's iterator
/// ([`super::promote::coalesced`]); any other access splits a warp's
/// request into up to 32 transactions. Each member is charged the element
/// bytes of the accesses it does not coalesce, over the statements with the
/// most iterators (the ones inside the kernel's innermost loops, which run
/// the most instances). An update's own accumulator is left out: it is
/// read and written once per step of its reduction at one element, which
/// stays in a register or private copy across the steps.
///
/// The schedule's innermost member (usually the tensors' contiguous
/// dimension) wins ties. A statement whose member is not a single iterator
/// leaves the order as it is. Permuting parallel members of a permutable
/// band keeps every dependence satisfied: all of them have distance zero
/// on each such member.
///
/// Split-k partials show why: `O_local(h, d, s) += E(h, s*512 + j) *
/// V(h, s*512 + j, d)` has parallel members (h, d, s); with the slice `s`
/// on x, a warp reads 32 rows of `V` 128 KB apart, while with `d` on x it
/// reads one row's consecutive halves and a single `E`.
fn coalescing_member(
    program: &Program,
    scop: &Scop,
    band: &ScheduleNode,
    nb: usize,
) -> Result<Option<usize>> {
    let stmts = scop.statements_in(&band.get_domain()?)?;
    let deepest = stmts.iter().map(|s| s.iterators.len()).max().unwrap_or(0);
    let mut costs = Vec::with_capacity(nb);
    for m in 0..nb {
        let iterators = x_iterators(scop, band, m)?;
        let mut cost = 0usize;
        for s in stmts.iter().filter(|s| s.iterators.len() == deepest) {
            let Some(pos) = iterators.get(&s.name).copied().flatten() else {
                return Ok(None);
            };
            let written = s.written_tensor()?;
            for a in s.accesses(program) {
                if s.kind == StmtKind::Update && a.tensor == written {
                    continue;
                }
                if !super::promote::coalesced(a.relation, Some(pos))? {
                    cost += scop.tensor(&a.tensor).map_or(4, |t| t.dtype.size());
                }
            }
        }
        costs.push(cost);
    }
    let innermost = nb - 1;
    let best = (0..nb)
        .min_by_key(|m| (costs[*m], *m != innermost))
        .unwrap_or(innermost);
    Ok((best != innermost).then_some(best))
}

/// Where the reduction loop that a warp's lanes share is, relative to the
/// kernel's band of parallel members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReductionSite {
    /// The band's member right after its parallel ones.
    Member,
    /// The single member of the band below child `k` of the sequence under
    /// the band (the scheduler fused statements without the reduction,
    /// such as its initialisation and a consumer of its result, into the
    /// band, and put the reduction loop in a band of its own).
    Below(usize),
}

/// A kernel band whose reduction runs across the lanes of a warp.
struct WarpReduction {
    /// The band of the rows (at most two parallel members), possibly below
    /// a band of the members with one instance.
    band: ScheduleNode,
    /// The update statement whose reduction loop the lanes share.
    update: String,
    site: ReductionSite,
}

/// Whether the kernel band `band` maps its reduction to the lanes of a
/// warp, a row (an instance of the parallel members) per warp: when the
/// band has one parallel member, or two with few rows and a long reduction
/// ([`few_rows_long_reduction`]), as it is; else when at most two of its
/// parallel members have more than one instance and these rows have few
/// instances or a streaming reduction ([`streaming_reduction`]). In the
/// second case the members of one instance (a batch of one, a single query
/// row) move to a band of their own above the rows: they must not take
/// the rows' tile sizes or thread axes (x belongs to the lanes, so only y
/// and z are left for rows), and isl generates no loop for them. A single
/// row member left that way is not taken as one parallel member is: its
/// reduction may read along the rows (a vector times a matrix, `y(0, j) +=
/// x(0, k) * B(k, j)`), which threads read coalesced and lanes would not.
fn warp_reduction(
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    band: &ScheduleNode,
    opts: &GpuOptions,
) -> Result<Option<WarpReduction>> {
    let lc = leading_coincident(band)?;
    if lc == 0
        || !opts.reduce
        || opts.block.first().is_some_and(|x| *x != 32)
        || !band.band_get_permutable()?
    {
        return Ok(None);
    }
    if lc == 1 || (lc == 2 && few_rows_long_reduction(program, scop, band)?) {
        if let Some((site, update)) = reduction_site(scop, deps, band, lc, false)? {
            return Ok(Some(WarpReduction {
                band: band.copy()?,
                update,
                site,
            }));
        }
    }
    // Members of one instance, but at least one row left.
    let mut units = Vec::new();
    for i in 0..lc {
        if units.len() + 1 < lc && member_extent(band, i)? == Some(1) {
            units.push(i);
        }
    }
    let rows = lc - units.len();
    if rows > 2 {
        return Ok(None);
    }
    let rows_band = if units.is_empty() {
        band.copy()?
    } else {
        let n = band.band_n_member()? as usize;
        let order: Vec<usize> = units
            .iter()
            .copied()
            .chain((0..n).filter(|i| !units.contains(i)))
            .collect();
        permute_members(band.copy()?, &order)?
            .band_split(units.len() as i32)?
            .child(0)?
    };
    // A reduction of several loops would run on one lane: the lanes share
    // a single loop.
    let Some((site, update)) = reduction_site(scop, deps, &rows_band, rows, true)? else {
        return Ok(None);
    };
    let (reduction, r) = match site {
        ReductionSite::Member => (rows_band.copy()?, rows),
        ReductionSite::Below(k) => (band_below(&rows_band, k)?, 0),
    };
    let warp = few_rows_long_reduction(program, scop, &rows_band)?
        || streaming_reduction(program, scop, &rows_band, rows, &reduction, r, &update)?;
    Ok(warp.then_some(WarpReduction {
        band: rows_band,
        update,
        site,
    }))
}

/// Where the reduction loop below the `lc` parallel members of `band` is,
/// with its update statement, when the lanes of a warp may share it (see
/// [`reduction_candidate`]): the band's next member, or the only loop in
/// the sequence under a band of parallel members only, a band of one
/// non-coincident member with no loop below it and beside it only
/// statements without loops (the initialisation, a consumer of the
/// result), which run on lane 0. `single`: the band's reduction members
/// must be one loop (otherwise the lanes take the first and each runs the
/// others).
fn reduction_site(
    scop: &Scop,
    deps: &Dependences,
    band: &ScheduleNode,
    lc: usize,
    single: bool,
) -> Result<Option<(ReductionSite, String)>> {
    let n = band.band_n_member()? as usize;
    if lc < n {
        if single && n > lc + 1 {
            return Ok(None);
        }
        return Ok(reduction_candidate(scop, deps, band, lc)?.map(|u| (ReductionSite::Member, u)));
    }
    let sequence = band.get_child(0)?;
    if sequence.get_type()? != ScheduleNodeType::Sequence {
        return Ok(None);
    }
    let mut found = None;
    for k in 0..sequence.n_children()? {
        let filter = sequence.get_child(k)?;
        if !contains_band(&filter)? {
            continue;
        }
        let inner = filter.get_child(0)?;
        if found.is_some()
            || inner.get_type()? != ScheduleNodeType::Band
            || inner.band_n_member()? != 1
            || inner.band_member_get_coincident(0)?
            || contains_band(&inner.get_child(0)?)?
        {
            return Ok(None);
        }
        match reduction_candidate(scop, deps, &inner, 0)? {
            Some(update) => found = Some((ReductionSite::Below(k as usize), update)),
            None => return Ok(None),
        }
    }
    Ok(found)
}

/// The band below child `k` of the sequence under `band`.
fn band_below(band: &ScheduleNode, k: usize) -> Result<ScheduleNode> {
    Ok(band.get_child(0)?.get_child(k as i32)?.get_child(0)?)
}

/// Whether `node` or a node below it is a band.
pub(super) fn contains_band(node: &ScheduleNode) -> Result<bool> {
    if node.get_type()? == ScheduleNodeType::Band {
        return Ok(true);
    }
    for i in 0..node.n_children()? {
        if contains_band(&node.get_child(i)?)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the reduction of `update` (member `r` of `reduction`, which is
/// `band` or a band below it) below the `lc` parallel members of `band`
/// streams an operand: `update` reads a tensor the band does not write
/// whose subscripts depend on every parallel member with more than one
/// instance, and whose last (contiguous) subscript moves with the
/// reduction loop and with no parallel member; the reduction has at least
/// [`STREAMING_STEPS`] steps. Each element of such an operand feeds one
/// output only: register or shared tiles find nothing to reuse, the kernel
/// is bound by reading it, and what counts is reading it coalesced. A
/// thread per output walks a row of it alone (consecutive threads a row
/// apart); a warp per output, its lanes across the reduction, reads
/// consecutive elements. That is attention decoding's QK^T with one query
/// per head (`K(b, h, j, d)`, the keys read once). A contraction's
/// operands each miss a parallel member (gemm's `A(i, k)` misses `j`,
/// `B(k, j)` misses `i`): they are reused, and keep their register and
/// tensor-core tiles.
fn streaming_reduction(
    program: &Program,
    scop: &Scop,
    band: &ScheduleNode,
    lc: usize,
    reduction: &ScheduleNode,
    r: usize,
    update: &str,
) -> Result<bool> {
    if member_extent(reduction, r)?.is_none_or(|steps| steps < STREAMING_STEPS) {
        return Ok(false);
    }
    let Some(stmt) = scop.statement(update) else {
        return Ok(false);
    };
    let Some(along) = x_iterators(scop, reduction, r)?
        .get(update)
        .copied()
        .flatten()
    else {
        return Ok(false);
    };
    // The statement iterator of each parallel member, and whether the
    // member has more than one instance.
    let mut parallel = Vec::new();
    for m in 0..lc {
        let Some(pos) = x_iterators(scop, band, m)?.get(update).copied().flatten() else {
            return Ok(false);
        };
        parallel.push((pos, member_extent(band, m)? != Some(1)));
    }
    let written: Vec<String> = scop
        .statements_in(&band.get_domain()?)?
        .iter()
        .map(|s| s.written_tensor())
        .collect::<Result<_>>()?;
    for a in stmt.accesses(program) {
        if a.write || written.contains(&a.tensor) {
            continue;
        }
        let pma = crate::isl::PwMultiAff::from_map(a.relation.copy()?)?;
        let rank = pma.dim(crate::isl::DimType::Out)?;
        if rank == 0 {
            continue;
        }
        let last = pma.get_pw_aff(rank - 1)?;
        let moves = |pos: usize| -> Result<Option<bool>> {
            Ok(super::promote::coefficient(&last, pos as i32)?.map(|c| c != 0))
        };
        let mut streams = moves(along)? == Some(true);
        for &(pos, many) in &parallel {
            streams &= moves(pos)? == Some(false);
            if many {
                streams &= reads_along(a.relation, pos)?;
            }
        }
        if streams {
            return Ok(true);
        }
    }
    Ok(false)
}

/// See [`streaming_reduction`]: a step for every lane of a warp.
const STREAMING_STEPS: i64 = 32;

/// Whether `band` (two leading parallel members, then a reduction member)
/// has at most [`FEW_ROWS`] parallel instances, a reduction of at least
/// [`LONG_REDUCTION`] steps, and no reuse across its parallel members:
/// every read of a tensor the band does not write depends on the iterators
/// of both (a contraction's operands each miss one, and keep their register
/// and tensor-core tiles). That is the shape of the partial reductions of a
/// split-k update (heads x slices, each slice hundreds of keys long): one
/// thread per instance leaves most of the GPU idle and reads with a
/// stride, while a warp per instance reads consecutive elements.
fn few_rows_long_reduction(program: &Program, scop: &Scop, band: &ScheduleNode) -> Result<bool> {
    if band.band_n_member()? < 3 {
        return Ok(false);
    }
    let (Some(a), Some(b), Some(r)) = (
        member_extent(band, 0)?,
        member_extent(band, 1)?,
        member_extent(band, 2)?,
    ) else {
        return Ok(false);
    };
    if a.saturating_mul(b) > FEW_ROWS || r < LONG_REDUCTION {
        return Ok(false);
    }
    let stmts = scop.statements_in(&band.get_domain()?)?;
    let written: Vec<String> = stmts
        .iter()
        .map(|s| s.written_tensor())
        .collect::<Result<_>>()?;
    for m in 0..2 {
        let iterators = x_iterators(scop, band, m)?;
        for s in stmts.iter().filter(|s| s.kind == StmtKind::Update) {
            let Some(pos) = iterators.get(&s.name).copied().flatten() else {
                return Ok(false);
            };
            for a in s.accesses(program) {
                if a.write || written.contains(&a.tensor) {
                    continue;
                }
                if !reads_along(a.relation, pos)? {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// Whether the access `relation` (affine) moves with iterator `pos`: some
/// subscript has a non-zero coefficient on it. A subscript that is not one
/// affine expression counts as not moving (no claim is made).
pub(super) fn reads_along(relation: &crate::isl::Map, pos: usize) -> Result<bool> {
    let pma = crate::isl::PwMultiAff::from_map(relation.copy()?)?;
    for d in 0..pma.dim(crate::isl::DimType::Out)? {
        if super::promote::coefficient(&pma.get_pw_aff(d)?, pos as i32)?.is_some_and(|c| c != 0) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// See [`few_rows_long_reduction`]: about one warp per row fills the H100
/// (132 multiprocessors x 32 resident warps) once.
const FEW_ROWS: i64 = 4096;
const LONG_REDUCTION: i64 = 256;

/// The update statement whose reduction loop is member `r` of `band`, when
/// that loop may run across threads: the band holds one update statement
/// (and possibly its initialisation), whose right side does not read the
/// tensor it reduces into, and every dependence between two instances that
/// differ only from member `r` on is a dependence of that update on itself
/// through the element it accumulates into. Such instances may run in any
/// order and be combined at the end, the reducer being associative and
/// commutative; the initialisation is ordered before them.
fn reduction_candidate(
    scop: &Scop,
    deps: &Dependences,
    band: &ScheduleNode,
    r: usize,
) -> Result<Option<String>> {
    let domain = band.get_domain()?;
    let mut update = None;
    for s in scop.statements_in(&domain)? {
        match s.kind {
            StmtKind::Update if update.is_none() => update = Some(s),
            StmtKind::Init => {}
            _ => return Ok(None),
        }
    }
    let Some(update) = update else {
        return Ok(None);
    };
    if !update.is_reorderable_reduction_step()? {
        return Ok(None);
    }
    let updates = crate::isl::UnionSet::from_set(update.domain.copy()?)?;
    let partial = band
        .band_get_partial_schedule_union_map()?
        .intersect_domain(updates.copy()?)?;
    let prefix = band
        .get_prefix_schedule_union_map()?
        .intersect_domain(updates.copy()?)?;
    // Split the band's schedule into the members before r and member r.
    let n = band.band_n_member()? as usize;
    let outer = project_members(&partial, 0, r, n)?;
    let member = project_members(&partial, r, r + 1, n)?;
    let same_outer = prefix.copy()?.range_product(outer.copy()?)?;
    let same_outer = same_outer.copy()?.apply_range(same_outer.reverse()?)?;
    let same_member = member.copy()?.apply_range(member.reverse()?)?;
    let parallel = same_outer.subtract(same_member)?;
    let write = UnionMap::from_map(update.write.copy()?)?;
    let same_element = write.copy()?.apply_range(write.reverse()?)?;
    let bad = deps
        .all()?
        .intersect_domain(updates.copy()?)?
        .intersect_range(updates.copy()?)?
        .intersect(parallel)?
        .subtract(same_element)?;
    // Inside a loop block the initialisation can run again after updates
    // (`Y(i) min=! X(j)` in a block: each iteration starts over). The
    // lanes would fold the updates of several initialisations into one:
    // no reduction site where an update precedes its own statement's
    // initialisation in the same iteration of the loops outside member r.
    if let Some(init) = scop.statement(&format!("{}_init", update.name)) {
        let inits = crate::isl::UnionSet::from_set(init.domain.copy()?)?;
        let partial = band.band_get_partial_schedule_union_map()?;
        let prefix = band.get_prefix_schedule_union_map()?;
        let outer = prefix.range_product(project_members(&partial, 0, r, n)?)?;
        let same_outer = outer.copy()?.apply_range(outer.reverse()?)?;
        let again = deps
            .all()?
            .intersect_domain(updates)?
            .intersect_range(inits)?
            .intersect(same_outer)?;
        if !again.is_empty()? {
            return Ok(None);
        }
    }
    Ok(if bad.is_empty()? {
        Some(update.name.clone())
    } else {
        None
    })
}

/// The number of tiles of sizes `tiles` (the band's first members) that
/// hold at least one instance: the points `⌊s / t⌋` of the band's
/// partial schedule `s` over its domain, counted (`model::count`). None
/// where they cannot be counted exactly (symbolic sizes).
fn occupied_tiles(band: &ScheduleNode, tiles: &[i64]) -> Result<Option<i64>> {
    let n = band.band_n_member()? as usize;
    let nb = tiles.len();
    let (prefix, member) = prefix_and_member(band)?;
    let members = project_members(&member, 0, nb, n)?;
    // Under host loops (a recurrence's steps) each launch runs the tiles
    // of one step: count (step, tile) pairs and divide by the steps, the
    // tiles an average launch has (a wavefront's diagonal, not every
    // cell's tile over the whole recurrence).
    let np = band.get_schedule_depth()? as usize;
    let values = if np > 0 {
        prefix.flat_range_product(members)?
    } else {
        members
    }
    .range()?;
    if values.is_empty()? {
        return Ok(Some(0));
    }
    let ps: Vec<String> = (0..np).map(|i| format!("p{i}")).collect();
    let xs: Vec<String> = (0..nb).map(|i| format!("x{i}")).collect();
    let ys: Vec<String> = (0..nb).map(|i| format!("y{i}")).collect();
    let conds: Vec<String> = (0..nb)
        .map(|i| format!("y{i} = floor(x{i} / {})", tiles[i]))
        .collect();
    let ctx = values.get_ctx();
    let to_tiles = crate::isl::UnionMap::read_from_str(
        &ctx,
        &format!(
            "{{ [{}] -> [{}] : {} }}",
            ps.iter().chain(&xs).cloned().collect::<Vec<_>>().join(", "),
            ps.iter().chain(&ys).cloned().collect::<Vec<_>>().join(", "),
            conds.join(" and ")
        ),
    )?;
    let set = Set::from_union_set(values.apply(to_tiles)?)?;
    // Unbounded where the sizes are symbolic.
    if !set.copy()?.is_bounded()? {
        return Ok(None);
    }
    let count = |s: &Set| {
        crate::model::count::count_points(s)
            .ok()
            .and_then(|c| i64::try_from(c).ok())
    };
    let Some(pairs) = count(&set) else {
        return Ok(None);
    };
    if np == 0 {
        return Ok(Some(pairs));
    }
    let steps = set.project_out(crate::isl::DimType::Set, np as u32, nb as u32)?;
    Ok(count(&steps).map(|s| pairs / s.max(1)))
}

/// Members `lo..hi` of a band's partial schedule (of `n` members).
pub fn project_members(partial: &UnionMap, lo: usize, hi: usize, n: usize) -> Result<UnionMap> {
    let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let keep: Vec<String> = names[lo..hi].to_vec();
    let ctx = partial.get_ctx();
    let proj = crate::isl::UnionMap::read_from_str(
        &ctx,
        &format!("{{ [{}] -> [{}] }}", names.join(", "), keep.join(", ")),
    )?;
    Ok(partial.copy()?.apply_range(proj)?)
}

/// Rows of a block tile when each row runs on all the threads of a block
/// (`gpu::lanes`, rows longer than 1024): the block runs them one after
/// the other. Measured on the H100 at 16384 x 4096 f32 (50 runs each):
/// the fused softmax took 196.2 us with 2 rows, 203.7 with 4, 211.0 with
/// 8 and 218.5 with 16, layer norm 211.5, 239.6 and 229.0 with 2, 4 and
/// 8. One row leaves the rows' thread loop out of isl's AST, which then
/// repeats the row's shared and private copies in each part of the row
/// (257.1 and 354.1 us).
const BLOCK_ROWS_PER_TILE: i64 = 2;

/// Thread groups along y of a block whose rows each take `lane_width`
/// threads (wider than a warp): the block tile's rows run side by side,
/// one group each, for rows whose loops split a rolling update
/// (`rolling`), where the block stays at 512 threads or fewer and the user
/// chose no block (`--block` with x > 32 runs the rows one after the
/// other). A group's barriers are its own (`codegen::cuda::lanes::barrier`:
/// `bar.sync` on barrier `1 + threadIdx.y` for `lane_width` threads), so
/// a group whose row is past the tensor's rows (the last tile) leaves the
/// loop without stalling the other.
///
/// Measured on the H100 at 16384 x 4096 f32 (100 runs, one call): the
/// fused softmax 195.5 -> 188.9 us and the softmax with its exponentials
/// named 195.0 -> 188.8 us (with [`promote`]'s shared copy left out for
/// rows side by side, which alone gained nothing measurable); layer norm
/// (two plain sums and the output, 85 registers a thread) 210.6 -> 249.7
/// us: two rows of 128 threads need 256 x 88 registers, so two blocks (4
/// rows) fit a multiprocessor where five single rows did. Its rows stay
/// one after the other.
///
/// [`promote`]: super::promote::promote
fn block_row_groups(lane_width: u32, rolling: bool, opts: &GpuOptions) -> u32 {
    let rows = BLOCK_ROWS_PER_TILE as u32;
    if rolling && opts.block.is_empty() && opts.pipeline != Some(true) && lane_width * rows <= 512 {
        rows
    } else {
        1
    }
}

/// The GPU's default tile size of member `i` of a band whose first `nb`
/// members map to blocks (member `nb - 1` on x) and whose first `lc` are
/// parallel: 32 along x and y (square tiles keep both the reads and the
/// writes of a transposition coalesced through shared memory; measured on
/// the H100, 32x8 tiles cost the transposition a quarter of its
/// bandwidth), one point along z and further parallel members (their
/// loops stay inside the block, and small outer extents such as a batch
/// no longer waste whole tiles), 32 along reduction members (the depth of
/// a shared-memory tile); a kernel whose rows each run on a warp
/// (`row_tile`) takes 8 rows per block, one per warp, and one whose rows
/// each run on a whole block [`BLOCK_ROWS_PER_TILE`] rows, one after the
/// other. A band without reduction members (elementwise work, a
/// transposition) takes 64 x 64 tiles on 32 x 8 threads (measured on the
/// H100 at 16384 x 4096 f32: the transposition from 71% to 79% of the copy
/// bandwidth, scale-and-add from 88% to 90%). A kernel with a register
/// tile takes 128 x 128 tiles with a reduction depth of 16 (8 x 8
/// registers per thread of a 16 x 16 block; measured on the H100 for gemm
/// f32 4096^3 with 16-byte copies: 25.7 TFLOP/s, against 24.6 with
/// 128 x 64 x 16 and 24.3 with 64 x 128 x 16).
fn auto_tile(
    i: usize,
    nb: usize,
    lc: usize,
    has_reduction: bool,
    row_tile: Option<i64>,
    register_tiles: bool,
) -> i64 {
    if let Some(rows) = row_tile {
        // The rows along the innermost parallel member.
        return if i + 1 == lc { rows } else { 1 };
    }
    if i >= lc {
        return if register_tiles { 16 } else { 32 };
    }
    if i >= nb {
        return 1;
    }
    match (nb - 1 - i, register_tiles) {
        (0 | 1, true) => 128,
        (0 | 1, false) if !has_reduction && nb >= 2 => ELEMENTWISE_TILE,
        (0 | 1, false) => 32,
        _ => 1,
    }
}

/// The permutable band `node` with its two outermost members, both
/// coincident, folded into one, `E·a + (b - lo)`, where one of them (`b`)
/// takes values in a constant range `lo..lo + E` over the band's
/// instances; `None` where neither does. The map `(a, b) -> E·a + b - lo`
/// is injective on those instances, so the folded member tells the same
/// instances apart, and it carries no dependence (both members have
/// distance 0 on every dependence the band sees, so their combination
/// does): mapped to one block axis, it runs every pair on its own block.
/// Blocks have three axes; a band with more parallel members than that
/// (a wavefront's cells, `t` on the diagonal `l + t = w`, beside a gate,
/// a row and a column) would otherwise run its outer members one after
/// another inside each block.
fn fold_outer_members(isl: &Isl, node: ScheduleNode) -> Result<Option<ScheduleNode>> {
    let n = node.band_n_member()?;
    if n < 2 || !node.band_member_get_coincident(0)? || !node.band_member_get_coincident(1)? {
        return Ok(None);
    }
    // `scaled` is the member `a`, `ranged` the member `b` whose values lie
    // in `lo..=hi` (the inner one where both do).
    let (scaled, ranged, lo, hi) = match (member_range(&node, 1)?, member_range(&node, 0)?) {
        (Some((lo, hi)), _) => (0, 1, lo, hi),
        (None, Some((lo, hi))) => (1, 0, lo, hi),
        (None, None) => return Ok(None),
    };
    let partial = node.band_get_partial_schedule()?;
    let domain = node.get_domain()?;
    let constant = |v: i64| -> Result<crate::isl::UnionPwAff> {
        Ok(crate::isl::UnionPwAff::val_on_domain(
            domain.copy()?,
            Val::int_from_si(&isl.ctx, v)?,
        )?)
    };
    let folded = partial
        .get_union_pw_aff(scaled)?
        .intersect_domain(domain.copy()?)?
        .scale_val(Val::int_from_si(&isl.ctx, hi - lo + 1)?)?
        .add(
            partial
                .get_union_pw_aff(ranged)?
                .intersect_domain(domain.copy()?)?
                .sub(constant(lo)?)?,
        )?;
    let mut coincident = Vec::new();
    for k in 1..n {
        coincident.push(node.band_member_get_coincident(k)?);
    }
    let partial = partial
        .set_union_pw_aff(1, folded)?
        .drop_dims(crate::isl::DimType::Out, 0, 1)?;
    let mut node = node.delete()?.insert_partial_schedule(partial)?;
    node = node.band_set_permutable(1)?;
    for (k, c) in coincident.into_iter().enumerate() {
        node = node.band_member_set_coincident(k as i32, i32::from(c))?;
    }
    Ok(Some(node))
}

/// The least and greatest value of band member `i` over the instances
/// reaching the band, where both are constants.
fn member_range(band: &ScheduleNode, i: usize) -> Result<Option<(i64, i64)>> {
    let values = member_values(band, i)?;
    if values.is_empty()? {
        return Ok(None);
    }
    constant_bounds(values)
}

/// The values band member `i` takes over the instances reaching the band.
fn member_values(band: &ScheduleNode, i: usize) -> Result<UnionSet> {
    let n = band.band_n_member()? as usize;
    Ok(project_members(
        &band
            .band_get_partial_schedule_union_map()?
            .intersect_domain(band.get_domain()?)?,
        i,
        i + 1,
        n,
    )?
    .range()?)
}

/// The least and greatest of the (non-empty) `values` of one member,
/// where both are constants.
fn constant_bounds(values: UnionSet) -> Result<Option<(i64, i64)>> {
    let set = Set::from_union_set(values)?;
    let hi = set.copy()?.dim_max_val(0);
    let lo = set.dim_min_val(0);
    Ok(match (hi, lo) {
        (Ok(hi), Ok(lo)) if hi.is_int()? && lo.is_int()? => {
            Some((val_to_i64(&lo)?, val_to_i64(&hi)?))
        }
        _ => None,
    })
}

/// Permutes the members of the permutable band `node` so that members
/// `lo..hi` come first, in order, followed by the others in order; every
/// member keeps its coincidence flag.
fn move_to_front(node: ScheduleNode, lo: usize, hi: usize) -> Result<ScheduleNode> {
    let n = node.band_n_member()? as usize;
    let order: Vec<usize> = (lo..hi)
        .chain((0..n).filter(|i| *i < lo || *i >= hi))
        .collect();
    permute_members(node, &order)
}

/// The permutable band `node` with member `order[k]` at position `k`;
/// every member keeps its coincidence flag.
fn permute_members(node: ScheduleNode, order: &[usize]) -> Result<ScheduleNode> {
    let partial = node.band_get_partial_schedule()?;
    let mut permuted = partial.copy()?;
    let mut coincident = Vec::new();
    for (k, &from) in order.iter().enumerate() {
        permuted = permuted.set_union_pw_aff(k as i32, partial.get_union_pw_aff(from as i32)?)?;
        coincident.push(node.band_member_get_coincident(from as i32)?);
    }
    let mut node = node.delete()?.insert_partial_schedule(permuted)?;
    node = node.band_set_permutable(1)?;
    for (k, c) in coincident.into_iter().enumerate() {
        node = node.band_member_set_coincident(k as i32, i32::from(c))?;
    }
    Ok(node)
}

/// The number of values band member `i` takes over the instances reaching
/// the band, when the parameters fix it. (Its values are projected once,
/// for the emptiness and the bounds: the mapping asks this of most bands
/// several times.)
pub fn member_extent(band: &ScheduleNode, i: usize) -> Result<Option<i64>> {
    let values = member_values(band, i)?;
    if values.is_empty()? {
        return Ok(Some(0));
    }
    Ok(constant_bounds(values)?.map(|(lo, hi)| hi - lo + 1))
}

/// Pairs of instances below the band `band` that agree on every loop above
/// it and differ in the band's value: `(P⁻¹ ∘ P) \ (b⁻¹ ∘ b)`, with `P`
/// the prefix schedule and `b` the band's partial schedule. Mapping the
/// band to parallel hardware runs exactly these pairs at the same time.
pub fn differ_only_from(band: &ScheduleNode) -> Result<UnionMap> {
    let (prefix, member) = prefix_and_member(band)?;
    let same_prefix = prefix.copy()?.apply_range(prefix.reverse()?)?;
    let same_member = member.copy()?.apply_range(member.reverse()?)?;
    Ok(same_prefix.subtract(same_member)?)
}

/// The pairs of `pairs` that [`differ_only_from`] `band` holds, `pairs ∩
/// ((P⁻¹ ∘ P) \ (b⁻¹ ∘ b))`, computed as `(pairs ∩ (P⁻¹ ∘ P)) \ (b⁻¹ ∘
/// b)`: the same set, but the difference is taken from the few pairs of
/// `pairs` (the dependences) rather than from every two instances of the
/// band with one prefix. isl may write it with other pieces than
/// `pairs.intersect(differ_only_from(band))`: an error that prints it
/// should print that one.
pub fn pairs_differing_only_at(pairs: &UnionMap, band: &ScheduleNode) -> Result<UnionMap> {
    let (prefix, member) = prefix_and_member(band)?;
    let same_prefix = pairs.copy()?.intersect(same_value_on(pairs, &prefix)?)?;
    let same_member = same_value_on(&same_prefix, &member)?;
    Ok(same_prefix.subtract(same_member)?)
}

/// `f⁻¹ ∘ f` (the pairs `a -> b` with one value of `f`) on the pairs of
/// statements that `pairs` relates alone: one join of `f`'s map of `S`
/// with that of `T` per space `S -> T` of `pairs`, rather than of every
/// statement's with every other's (quadratic in the statements: a chain of
/// 80 spent most of its mapping on them). Every pair of `pairs` is in one
/// of those spaces, so `pairs ∩ (f⁻¹ ∘ f)` and `pairs \ (f⁻¹ ∘ f)` are the
/// same sets with this in place of `f⁻¹ ∘ f`.
pub fn same_value_on(pairs: &UnionMap, f: &UnionMap) -> Result<UnionMap> {
    let maps = pairs.get_map_list()?;
    let mut same = UnionMap::empty(pairs.get_space()?)?;
    for i in 0..maps.size()? {
        let space = maps.get_at(i)?.get_space()?;
        let of = |s: crate::isl::Space| -> Result<UnionMap> {
            let set = crate::isl::UnionSet::from_set(Set::universe(s)?)?;
            Ok(f.copy()?.intersect_domain(set)?)
        };
        let from = of(space.copy()?.domain()?)?;
        let to = of(space.range()?)?;
        same = same.union(from.apply_range(to.reverse()?)?)?;
    }
    Ok(same)
}

/// Blocks a kernel with register tiles should have before it takes the
/// large (128 x 128) tiles, counting only tiles that hold instances: the
/// H100's 132 multiprocessors run two such blocks each (about 110
/// registers a thread, 256 threads), so about 264 blocks fill the machine
/// once; with far fewer, much of it idles (the f32 MLP's second product
/// had 128 blocks: 0.48 waves in Nsight Compute; syrk's triangle 136 of
/// its box's 256). Measured on the H100 (bench/RESULTS.md): 2048 x 2048
/// outputs (256 full tiles) stay faster with the large tiles.
const ENOUGH_REGISTER_BLOCKS: i64 = 256;

/// CUDA's limit on `gridDim.y` and `gridDim.z`.
const MAX_GRID_YZ: i64 = 65_535;

/// Whether a statement of `domain` reduces into an f16, bf16 or 8-bit float
/// tensor.
fn narrow_reduction(scop: &Scop, domain: &crate::isl::UnionSet) -> Result<bool> {
    for s in scop.statements_in(domain)? {
        if s.kind != crate::model::StmtKind::Update {
            continue;
        }
        let t = s.written_tensor()?;
        if scop.tensor(&t).is_some_and(|t| t.dtype.is_narrow_float()) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Threads below which a kernel that runs a loop block's iterations is
/// taken to serialise its recurrence (an LSTM's batch rows as its only
/// parallel loop: 64 threads for the whole network).
const FEW_THREADS: i64 = 2048;

/// Whether a kernel of `schedule` (mapped, with `plans`) runs instances of
/// statements in loop blocks on blocks of one thread, or on fewer than
/// [`FEW_THREADS`] threads in all at the program's sizes: a recurrence
/// that the mapping could only serialise (its step loop in the kernel,
/// carrying a dependence), which host steps (`schedule::host`) run in
/// parallel instead.
pub fn serial_recurrence(
    program: &Program,
    scop: &Scop,
    schedule: &Schedule,
    plans: &[KernelPlan],
) -> Result<bool> {
    let values = program.known_params();
    let few = |plan: &KernelPlan| -> bool {
        if plan.block == [1, 1, 1] {
            return true;
        }
        let mut threads: i64 = plan.block.iter().map(|b| i64::from(*b)).product();
        for g in &plan.grid {
            match super::eval(g, &values) {
                Ok(v) => threads = threads.saturating_mul(v.max(0)),
                Err(_) => return false,
            }
        }
        threads < FEW_THREADS
    };
    let rec = |node: ScheduleNode| walk_serial(node, scop, plans, &few);
    rec(schedule.get_root()?)
}

fn walk_serial(
    node: ScheduleNode,
    scop: &Scop,
    plans: &[KernelPlan],
    few: &dyn Fn(&KernelPlan) -> bool,
) -> Result<bool> {
    {
        if node.get_type()? == ScheduleNodeType::Mark {
            let name = node.mark_get_id()?.get_name()?.to_string();
            if let Some(plan) = plans.iter().find(|p| p.mark == name) {
                if !few(plan) {
                    return Ok(false);
                }
                let domain = node.get_domain()?;
                return Ok(scop
                    .statements_in(&domain)?
                    .iter()
                    .any(|s| !s.blocks.is_empty()));
            }
        }
        for i in 0..node.n_children()? {
            if walk_serial(node.get_child(i)?, scop, plans, few)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod occupied_tiles_tests {
    use super::*;
    use crate::gpu::test_support::Analysed;
    use crate::schedule::{self, Strategy};

    /// The first band of isl's schedule of `json` and the tiles of
    /// 128 x 128 over its first two members that hold instances.
    fn occupied(json: &str) -> Option<i64> {
        let a = Analysed::new(json);
        let sched = schedule::compute(&a.isl, &a.scop, &a.deps, Strategy::Isl).unwrap();
        let mut node = sched.get_root().unwrap();
        while node.get_type().unwrap() != ScheduleNodeType::Band {
            node = node.child(0).unwrap();
        }
        occupied_tiles(&node, &[128, 128]).unwrap()
    }

    fn rows(condition: &str) -> String {
        format!(
            r#"{{"name": "t", "params": {{"N": 300}},
                "inputs": {{"A": {{"dtype": "f32", "shape": ["N", "N"]}}}},
                "outputs": {{"C": {{"dtype": "f32", "shape": ["N"]}}}},
                "body": ["C(i) +=! A(i, j){condition}"]}}"#
        )
    }

    #[test]
    fn a_triangle_holds_instances_in_six_of_its_boxs_nine_tiles() {
        // 300 = 2 x 128 + 44: three tiles a side; j <= i leaves the three
        // tiles above the diagonal empty.
        assert_eq!(occupied(&rows("")), Some(9));
        assert_eq!(occupied(&rows(" where j <= i")), Some(6));
    }
}

#[cfg(test)]
mod unroll_tests {
    use super::*;
    use crate::gpu::registers::MAX_UNROLLED_UPDATES;
    use crate::gpu::test_support::Analysed;

    const GEMM: &str = r#"{"name": "g", "params": {"M": 256, "N": 256, "K": 64},
        "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]},
                   "B": {"dtype": "f32", "shape": ["K", "N"]}},
        "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
        "body": ["C(i, j) +=! A(i, k) * B(k, j)"]}"#;

    /// The register tile's steps unrolled with `unroll`, and its slots.
    fn unrolled(unroll: Option<bool>) -> (Option<i64>, i64) {
        let options = GpuOptions {
            unroll,
            block: vec![16, 16],
            ..GpuOptions::default()
        };
        let plans = Analysed::new(GEMM).plans(&[64, 64, 16], &options);
        let (plan, tile) = plans
            .iter()
            .find_map(|p| Some((p, p.register_tile()?)))
            .expect("a register tile");
        let slots = tile.counts(plan.block).iter().product();
        (tile.unrolled_steps, slots)
    }

    #[test]
    fn a_register_tiles_step_loops_unroll_within_the_update_budget() {
        // 64 x 64 on 16 x 16 threads: 16 slots a thread, 64 steps.
        let (steps, slots) = unrolled(Some(true));
        assert_eq!(slots, 16);
        assert_eq!(steps, Some(MAX_UNROLLED_UPDATES / 16));
        assert_eq!(unrolled(Some(false)).0, None);
        // Sizes given: unrolled on request only.
        assert_eq!(unrolled(None).0, None);
    }
}
