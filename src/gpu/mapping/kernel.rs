//! The mapping of one kernel, as a list of named steps (the strategy of
//! Tensor Comprehensions' mapper), each a function of its own:
//!
//! 1. [`Mapper::rows`]: how the kernel's rows run (a warp per row, rows
//!    across lanes, columns of rows, or none of them), its band's members
//!    in the order the axes take them, and the iterators on `threadIdx.x`
//!    (and `threadIdx.y` with register groups).
//! 2. [`Mapper::tiles`]: the tile sizes, the register tile a thread keeps
//!    its elements in, and whether the band is a contraction on tensor
//!    cores (whose fragments set the sizes).
//! 3. [`Mapper::blocks`]: the band tiled, one block band per grid axis
//!    (the axis's tile count, capped where CUDA or the user limit the
//!    grid, and the order its blocks take the tiles in), and the register
//!    tile's mark.
//! 4. [`Mapper::points`]: below the blocks, the shared-memory promotion,
//!    the register tile finished, then [`Mapper::threads`]: the thread
//!    bands, the private regions, the block's shape and the reduction's
//!    mark.
//! 5. [`tensor_core_plan`]: a contraction's fragments replace the thread
//!    band's plan.
//! 6. The register tile's unrolled steps and the static shared bytes.
//!
//! A kernel with nothing parallel on top runs on one block of one thread.

use crate::isl::{MultiVal, ScheduleNode, ScheduleNodeType, UnionMap, UnionSet, Val};

use super::{
    auto_tile, band_below, elementwise_tile_sizes, finish_register_tile, lane_iterators,
    leading_coincident, mark, mark_reduction, mark_threads, member_tile_of, narrow_reduction,
    order_members, project_members, register_tile_sizes, row_mapping, thread_shape, tile_count,
    x_iterators, KernelBody, KernelPlan, ReductionSite, RegisterBand, Registers, RowMapping,
    ThreadPlan, ThreadShapeOf, AXES, BLOCK_ROWS_PER_TILE, MAX_GRID_YZ,
};
use crate::deps::Dependences;
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::gpu::contraction::Contraction;
use crate::gpu::lanes::{Columns, LaneLoop};
use crate::gpu::registers::RegisterTile;
use crate::gpu::GpuOptions;
use crate::isl::ast::{Expr, Op};
use crate::isl::Isl;
use crate::model::{Scop, StmtKind};
use std::collections::{HashMap, HashSet};

/// Maps the kernel whose subtree starts at `node` (the `index`-th of its
/// tree) with tile sizes `tile`; returns some node of the modified tree
/// and the plan.
#[allow(clippy::too_many_arguments)]
pub(super) fn map_kernel(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    node: ScheduleNode,
    index: usize,
    tile: &[i64],
    opts: &GpuOptions,
) -> Result<(ScheduleNode, KernelPlan)> {
    let m = Mapper {
        isl,
        program,
        scop,
        deps,
        opts,
        tile,
    };
    let name = format!("kernel_{index}");
    let mut node = node.insert_mark(mark(isl, &name)?)?.child(0)?;
    let mut plan = KernelPlan::one_thread(name);
    let kernel_domain = node.get_domain()?;
    while node.get_type()? == ScheduleNodeType::Mark {
        node = node.child(0)?;
    }
    if node.get_type()? != ScheduleNodeType::Band || leading_coincident(&node)? == 0 {
        // Nothing parallel on top: one block of one thread runs it.
        return Ok((node, plan));
    }
    let (node, mut rows) = m.rows(node)?;
    let (node, tiles) = m.tiles(node, &rows, &plan.mark, &kernel_domain)?;
    let Tiles {
        n,
        has_reduction,
        member_tile,
        registers,
        registers_on,
        contraction,
    } = tiles;
    let (node, registers, thread_values) =
        m.blocks(node, rows.nb, n, &member_tile, registers, &mut plan)?;
    // A register tile on the SIMT units whose sizes the mapping chose
    // steps with its step loops unrolled and its shared tiles double
    // buffered. On the H100 (`bench/suite/variants-f32-options.txt`,
    // `variants-simt-off.txt`) both together made gemm 4096^3 4,466 ->
    // 3,942 us, 2mm 4,485 -> 3,251, syrk 1,381 -> 1,162, the MLPs 1.1x
    // faster (unrolling alone made gemm slower: 4,827), but cost symm
    // (5,789 -> 6,078), syr2k (3,129 -> 3,437) and covariance (7,126 ->
    // 7,610), which ran fastest unrolled without the second buffer (5,782,
    // 2,580, 5,678): no rule over the promoted arrays told them apart
    // (two_mm, which gains, and symm promote the same arrays). The
    // options, and `tune`, set them either way.
    let simt_tile = registers.is_some() && contraction.is_none() && opts.auto_tile;
    let mut thread_plan = ThreadPlan::default();
    let node = if node.get_type()? == ScheduleNodeType::Band {
        let points = Points {
            kernel_domain: &kernel_domain,
            thread_values: &thread_values,
            member_tile: &member_tile,
            has_reduction,
            registers_on,
            on_tensor_cores: contraction.is_some(),
            simt_tile,
        };
        m.points(
            node,
            &mut rows,
            registers,
            &points,
            &mut plan,
            &mut thread_plan,
        )?
    } else {
        node
    };
    if let Some(c) = contraction {
        tensor_core_plan(c, &mut plan, &mut thread_plan)?;
    }
    // The register tile's step loops unrolled, as far as its slots on the
    // final block allow.
    if let Some(Registers::Tile(r) | Registers::TensorCores { tile: r, .. }) =
        &mut thread_plan.registers
    {
        let unroll = opts.unroll.unwrap_or(simt_tile);
        r.unrolled_steps = unroll.then(|| r.unrollable_steps(plan.block));
    }
    // The shared copies, and the copy engine's barriers.
    let barriers = match &thread_plan.registers {
        Some(Registers::TensorCores { contraction, .. }) => {
            contraction.copies.barrier_bytes(contraction.stages)
        }
        _ => 0,
    };
    plan.static_shared = thread_plan.scope.as_ref().map_or(0, |s| s.bytes()) + barriers;
    plan.body = KernelBody::Threads(thread_plan);
    Ok((node, plan))
}

/// What every step reads: the program, its model and dependences, the
/// options and the user's tile sizes.
struct Mapper<'a> {
    isl: &'a Isl,
    program: &'a Program,
    scop: &'a Scop,
    deps: &'a Dependences,
    opts: &'a GpuOptions,
    tile: &'a [i64],
}

/// How the kernel's rows run and its band's shape (step 1).
struct Rows {
    /// The update statement whose reduction loop a warp's lanes share.
    reduction: Option<String>,
    site: Option<ReductionSite>,
    /// Rows across lanes: the loops the lanes walk (taken by the private
    /// regions where they fit).
    lane_loops: Option<Vec<LaneLoop>>,
    lanes: bool,
    /// Threads of a row along x.
    lane_width: u32,
    columns: Option<Columns>,
    /// Rows of a block tile side by side on y.
    row_groups: u32,
    /// Leading coincident members, and members on blocks (and threads).
    lc: usize,
    nb: usize,
    /// The iterators on `threadIdx.x` (and `threadIdx.y`), each with the
    /// dimension it indexes.
    x_iterator: HashMap<String, Option<usize>>,
    y_iterator: Option<HashMap<String, Option<usize>>>,
}

/// The tile sizes and what a thread keeps in registers (step 2).
struct Tiles {
    /// Members of the band to tile.
    n: usize,
    has_reduction: bool,
    /// The size of each member's tile.
    member_tile: Vec<i64>,
    registers: Option<RegisterTile>,
    /// Whether the kernel keeps elements in registers at all.
    registers_on: bool,
    contraction: Option<Contraction>,
}

/// What the point band's mapping (step 4) reads of the steps before.
struct Points<'a> {
    kernel_domain: &'a UnionSet,
    /// The instances at their thread values (the point band's partial
    /// schedule on the block members).
    thread_values: &'a UnionMap,
    member_tile: &'a [i64],
    has_reduction: bool,
    registers_on: bool,
    on_tensor_cores: bool,
    simt_tile: bool,
}

impl Mapper<'_> {
    /// Step 1: the rows, the members' order and the thread iterators.
    fn rows(&self, node: ScheduleNode) -> Result<(ScheduleNode, Rows)> {
        let (isl, program, scop, opts) = (self.isl, self.program, self.scop, self.opts);
        let RowMapping {
            band,
            reduction,
            site,
            lane_loops,
            lane_width,
            columns,
            row_groups,
        } = row_mapping(isl, program, scop, self.deps, node, opts)?;
        let lanes = lane_loops.is_some();
        let (mut node, lc, nb) =
            order_members(isl, program, scop, band, site.is_none() && !lanes, opts)?;
        let x_iterator = match site {
            Some(ReductionSite::Member) => x_iterators(scop, &node, lc)?,
            Some(ReductionSite::Below(k)) => x_iterators(scop, &band_below(&node, k)?, 0)?,
            // Rows across lanes: `threadIdx.x` walks each row's loops.
            None if lanes && columns.is_none() => {
                lane_iterators(scop, &node, x_iterators(scop, &node, nb - 1)?)?
            }
            None => x_iterators(scop, &node, nb - 1)?,
        };
        // With register groups (`GpuOptions::vector`), the iterator on
        // `threadIdx.y` too: a shared tile's dimension that it indexes is
        // laid out innermost when `threadIdx.x` indexes none.
        let y_iterator = match site {
            None if opts.vector > 1 && nb >= 2 => Some(x_iterators(scop, &node, nb - 2)?),
            _ => None,
        };
        if site == Some(ReductionSite::Member) {
            node = node.band_split(lc as i32)?;
        }
        if !node.band_get_permutable()? && (lc as i32) < node.band_n_member()? {
            // The coincident prefix is permutable on its own (all its
            // distances are zero); tile only that part.
            node = node.band_split(lc as i32)?;
        }
        let rows = Rows {
            reduction,
            site,
            lane_loops,
            lanes,
            lane_width,
            columns,
            row_groups,
            lc,
            nb,
            x_iterator,
            y_iterator,
        };
        Ok((node, rows))
    }

    /// Step 2: the tile sizes, the register tile and the contraction of
    /// the band `node` of kernel `kernel` (whose instances are
    /// `kernel_domain`).
    fn tiles(
        &self,
        node: ScheduleNode,
        rows: &Rows,
        kernel: &str,
        kernel_domain: &UnionSet,
    ) -> Result<(ScheduleNode, Tiles)> {
        let (isl, program, scop, opts) = (self.isl, self.program, self.scop, self.opts);
        let (lc, nb) = (rows.lc, rows.nb);
        let n = node.band_n_member()? as usize;
        let has_reduction =
            (0..n).any(|i| !node.band_member_get_coincident(i as i32).unwrap_or(false));
        // Rows per block tile where a warp or a block runs each row.
        let row_tile = if let Some(c) = rows.columns {
            Some(i64::from(c.rows))
        } else if rows.lanes && rows.lane_width > 32 {
            Some(BLOCK_ROWS_PER_TILE)
        } else if rows.reduction.is_some() || rows.lanes {
            Some(8)
        } else {
            None
        };
        let sizes_for = |register_tiles: bool| -> Vec<i64> {
            (0..n)
                .map(|i| {
                    if opts.auto_tile {
                        auto_tile(i, nb, lc.min(n), has_reduction, row_tile, register_tiles)
                    } else {
                        self.tile[i.min(self.tile.len() - 1)]
                    }
                })
                .collect()
        };
        let mut member_tile = sizes_for(false);
        // The register tile of the band tiled by `member_tile`, if any
        // (whether a thread owns elements is independent of the sizes).
        let register_tile = |node: &ScheduleNode, member_tile: &[i64]| {
            let trial = tile_band(isl, node.copy()?, member_tile)?;
            let point = trial.get_child(0)?;
            let tiles = &member_tile[..nb];
            crate::gpu::registers::candidate(
                isl, program, scop, &trial, &point, nb, nb, tiles, kernel,
            )
        };
        // A reduction into an f16 or bf16 element is kept in an f32
        // register across the steps of the loops that carry it even with
        // registers off (`GpuOptions::registers`): in memory it would be
        // rounded at every step of a sequential tile loop (tbmm_bf16 with
        // `registers=off` failed its check at 6.4e-1).
        let registers_on = opts.registers || narrow_reduction(scop, kernel_domain)?;
        let registers = if registers_on && rows.reduction.is_none() && nb < n && lc >= nb {
            register_tile(&node, &member_tile)?
        } else {
            None
        };
        if registers.is_some() && opts.auto_tile {
            member_tile = register_tile_sizes(&node, nb, sizes_for(true), sizes_for(false))?;
        }
        let contraction = match &registers {
            Some(r) if opts.tensor_cores && nb >= 2 && n == nb + 1 => {
                self.contraction(&node, r, nb, n)?
            }
            _ => None,
        };
        if let Some(c) = &contraction {
            member_tile = vec![1; nb - 2];
            member_tile.extend(c.tile);
        }
        // The register tile's element map, at the final tile sizes (isl
        // simplifies it with the tiles' bounds: a member with a single
        // tile at the trial sizes loses its block term).
        let registers = match registers {
            Some(_) => register_tile(&node, &member_tile)?,
            None => None,
        };
        let contraction = contraction.filter(|_| registers.is_some());
        // (On the 32 x 8 threads `thread_shape` gives such a band; a block
        // the user gave keeps the default tiles.)
        if registers.is_none()
            && opts.auto_tile
            && opts.block.is_empty()
            && !has_reduction
            && row_tile.is_none()
            && nb >= 2
        {
            member_tile = elementwise_tile_sizes(&node, nb, member_tile)?;
        }
        let tiles = Tiles {
            n,
            has_reduction,
            member_tile,
            registers,
            registers_on,
            contraction,
        };
        Ok((node, tiles))
    }

    /// A contraction of f16 or bf16 operands in the band `node` (`nb`
    /// block members of `n`) with register tile `r`: it runs on tensor
    /// cores, with the tile sizes and warps of its fragments.
    fn contraction(
        &self,
        node: &ScheduleNode,
        r: &RegisterTile,
        nb: usize,
        n: usize,
    ) -> Result<Option<Contraction>> {
        let opts = self.opts;
        // No block size given: the recognition picks the warps (0).
        let threads: u32 = if opts.block.is_empty() {
            0
        } else {
            opts.block.iter().product()
        };
        let user = (!opts.auto_tile).then(|| {
            let t = member_tile_of(self.tile, n);
            ([t[n - 3], t[n - 2], t[n - 1]], threads)
        });
        let mut c = crate::gpu::contraction::recognise(
            self.isl,
            self.program,
            self.scop,
            self.deps,
            node,
            nb,
            user,
            opts.k_split,
        )?;
        // The tests' pipeline depth (`GpuOptions::wgmma_stages`).
        if let (Some(stages), Some(c)) = (opts.wgmma_stages, c.as_mut()) {
            if c.wgmma && !c.whole_k {
                c.stages = stages;
                c.check_stages()?;
            }
        }
        // An initialisation left inside the loops has no fragment form.
        let init_inside = r.init.is_none()
            && self
                .scop
                .statements_in(&node.get_domain()?)?
                .iter()
                .any(|s| s.kind == StmtKind::Init);
        Ok(c.filter(|_| !init_inside).map(|mut c| {
            if opts.chained_accumulation {
                c.accumulation = crate::gpu::contraction::Accumulation::Chained;
            }
            if opts.tma {
                c.copies = crate::gpu::tma::copies(&c, self.program);
            }
            if opts.staged_stores {
                if let Some(t) = self.program.tensor(&c.stored) {
                    c.stores = crate::gpu::stores::choose(&c, t.dtype);
                }
            }
            c
        }))
    }

    /// Step 3: the band `node` (`n` members, `nb` on blocks) tiled by
    /// `member_tile`, a block band per grid axis under its mark (the
    /// plan's grid and block order), and the register tile's mark. Returns
    /// the node below the sequential tile loops, the register tile with
    /// its block iterators and prefix values, and the instances' thread
    /// values.
    fn blocks(
        &self,
        node: ScheduleNode,
        nb: usize,
        n: usize,
        member_tile: &[i64],
        mut registers: Option<RegisterTile>,
        plan: &mut KernelPlan,
    ) -> Result<(ScheduleNode, Option<RegisterTile>, UnionMap)> {
        let (isl, scop) = (self.isl, self.scop);
        let mut node = tile_band(isl, node, member_tile)?;
        // The instances at their block values, for the order of the
        // blocks: the long sequential loops are a register tile's, and
        // only there can the blocks' work differ enough for the order to
        // matter.
        let block_values = match &registers {
            Some(_) => Some(
                project_members(
                    &node.band_get_partial_schedule_union_map()?,
                    0,
                    nb.min(n),
                    n,
                )?
                .intersect_domain(node.get_domain()?)?,
            ),
            None => None,
        };
        let thread_values = project_members(
            &node.get_child(0)?.band_get_partial_schedule_union_map()?,
            0,
            nb.min(n),
            n,
        )?;
        if nb < n {
            node = node.band_split(nb as i32)?;
        }
        // Block bands: one member each, under a mark naming its axis.
        let mut block_iterators = Vec::new();
        for (j, &size) in member_tile.iter().enumerate().take(nb) {
            if j + 1 < nb {
                node = node.band_split(1)?;
            }
            let axis = nb - 1 - j;
            plan.grid[axis] = self.grid_extent(&node, size, axis)?;
            if let Some(values) = &block_values {
                plan.reversed[axis] = crate::gpu::block_order::heaviest_last(scop, values, j)?;
            }
            let depth = node.get_schedule_depth()?;
            block_iterators.push(format!("c{depth}"));
            node = node.insert_mark(mark(isl, &format!("block_{}_{depth}", AXES[axis]))?)?;
            node = node.child(0)?.child(0)?; // mark -> band -> below
        }
        if let Some(r) = registers.as_mut() {
            r.block_iterators = block_iterators;
            let depth = node.get_schedule_depth()? as usize;
            let prefix = node
                .get_prefix_schedule_union_map()?
                .intersect_domain(node.get_domain()?)?;
            r.prefix_values = crate::gpu::promote::unique_prefix_values(isl, &prefix, depth)?;
            node = node.insert_mark(mark(isl, "registers")?)?.child(0)?;
        }
        if nb < n {
            node = node.child(0)?; // past the sequential tile loops
        }
        Ok((node, registers, thread_values))
    }

    /// The grid's extent along `axis` for the block band `node` of tiles
    /// of `size`: its tile count, at most the user's grid there and, along
    /// y and z, CUDA's limit of 65,535 blocks where the count may exceed
    /// it (the block loops stride by the grid, so a smaller grid runs
    /// every tile; a batch folded with the channels can exceed it).
    fn grid_extent(&self, node: &ScheduleNode, size: i64, axis: usize) -> Result<Expr> {
        let count = tile_count(self.scop, node, size)?;
        let within =
            |e: &Expr| crate::gpu::eval(e, &HashMap::new()).is_ok_and(|v| v <= MAX_GRID_YZ);
        let limit = (axis > 0 && !within(&count)).then_some(MAX_GRID_YZ);
        let cap = match (self.opts.grid.get(axis).map(|c| i64::from(*c)), limit) {
            (Some(c), Some(l)) => Some(c.min(l)),
            (c, l) => c.or(l),
        };
        Ok(match cap {
            Some(cap) => Expr::Op(Op::Min, vec![count, Expr::Int(cap)]),
            None => count,
        })
    }

    /// Step 4: the point band `node`: the promotion point (shared tiles),
    /// the register tile finished, then the threads.
    fn points(
        &self,
        node: ScheduleNode,
        rows: &mut Rows,
        registers: Option<RegisterTile>,
        p: &Points,
        plan: &mut KernelPlan,
        thread_plan: &mut ThreadPlan,
    ) -> Result<ScheduleNode> {
        let (isl, program, scop, opts) = (self.isl, self.program, self.scop, self.opts);
        let layout = match (&registers, &rows.y_iterator) {
            (Some(_), Some(y)) if !p.on_tensor_cores => crate::gpu::promote::Layout::Grouped {
                inner: vec![&rows.x_iterator, y],
                width: i64::from(opts.vector),
            },
            _ => crate::gpu::promote::Layout::RowMajor,
        };
        // Rows side by side (see [`block_row_groups`]) read their inputs
        // into the lanes' registers (`codegen::cuda::lanes` row caches) or
        // straight from memory: a shared copy of the block tile would only
        // be paid for (layer norm's rows, one at a time, keep it: they
        // lost 211 -> 233 us without it on the H100).
        // Columns read each element once, down the rows: nothing to share.
        let promote_opts = GpuOptions {
            shared: opts.shared && rows.row_groups == 1 && rows.columns.is_none(),
            pipeline: Some(opts.pipeline.unwrap_or(p.simt_tile)),
            ..opts.clone()
        };
        thread_plan.scope = Some(crate::gpu::promote::promote(
            isl,
            program,
            scop,
            &node,
            &plan.mark,
            &rows.x_iterator,
            &layout,
            &promote_opts,
        )?);
        let mut node = node.insert_mark(mark(isl, "shared")?)?.child(0)?;
        if let Some(r) = registers {
            let (below, tile) = finish_register_tile(
                isl,
                program,
                scop,
                self.deps,
                RegisterBand {
                    node,
                    nb: rows.nb,
                    thread_values: p.thread_values,
                    kernel_domain: p.kernel_domain,
                    on_tensor_cores: p.on_tensor_cores,
                },
                r,
                thread_plan.scope.as_mut(),
                &p.member_tile[..rows.nb],
                opts.vector,
            )?;
            node = below;
            thread_plan.registers = Some(tile);
        }
        let nt = leading_coincident(&node)?.min(3);
        if nt > 0 {
            node = self.threads(node, nt, rows, p, plan, thread_plan)?;
        }
        Ok(node)
    }

    /// The thread bands (the first `nt` members of `node`), the private
    /// regions below them, the block's shape and the reduction's mark.
    fn threads(
        &self,
        mut node: ScheduleNode,
        nt: usize,
        rows: &mut Rows,
        p: &Points,
        plan: &mut KernelPlan,
        thread_plan: &mut ThreadPlan,
    ) -> Result<ScheduleNode> {
        let (isl, scop) = (self.isl, self.scop);
        if (nt as i32) < node.band_n_member()? {
            node = node.band_split(nt as i32)?;
        }
        node = mark_threads(
            isl,
            node,
            nt,
            rows.columns.is_some(),
            rows.reduction.is_some() || rows.lanes,
        )?;
        if p.registers_on && rows.reduction.is_none() && thread_plan.registers.is_none() {
            // Below the thread loops: what one thread owns stays in its
            // registers.
            let exclude: HashSet<String> = thread_plan
                .scope
                .iter()
                .flat_map(|s| s.arrays.iter().map(|a| a.tensor.clone()))
                .collect();
            let (below, regions) = crate::gpu::private::insert_regions(
                isl,
                self.program,
                scop,
                node,
                p.kernel_domain,
                &plan.mark,
                &exclude,
            )?;
            node = below;
            if let Some(loops) = rows.lane_loops.take() {
                let fits = crate::gpu::lanes::storage_fits(scop, &node, &regions, &loops)?;
                thread_plan.lanes = fits.then_some(loops);
            }
            thread_plan.private = regions;
        }
        let shape = thread_shape(
            ThreadShapeOf {
                registers: thread_plan.registers.is_some(),
                has_reduction: p.has_reduction,
                warp_rows: rows.reduction.is_some(),
                lanes: rows.lanes,
                lane_width: rows.lane_width,
                row_groups: rows.row_groups,
                columns: rows.columns,
            },
            &p.member_tile[..nt],
            self.opts,
        );
        plan.block = shape.block;
        if let Some(axis) = shape.lane_axis {
            thread_plan.lane_axis = axis;
        }
        thread_plan.reduce_x |= shape.reduce_x;
        if let Some(update) = &rows.reduction {
            node = mark_reduction(isl, scop, node, update, rows.site, &plan.mark)?;
            thread_plan.reduce_x = true;
        }
        Ok(node)
    }
}

/// The band `node` tiled by `member_tile`.
fn tile_band(isl: &Isl, node: ScheduleNode, member_tile: &[i64]) -> Result<ScheduleNode> {
    let mut sizes = MultiVal::zero(node.band_get_space()?)?;
    for (i, s) in member_tile.iter().enumerate() {
        sizes = sizes.set_val(i as i32, Val::int_from_si(&isl.ctx, *s)?)?;
    }
    Ok(node.band_tile(sizes)?)
}

/// Step 5: contraction `c`'s fragments replace the thread band's loops
/// and the generic shared tiles (the region copies its own through its
/// `cp.async` pipeline).
fn tensor_core_plan(
    c: Contraction,
    plan: &mut KernelPlan,
    thread_plan: &mut ThreadPlan,
) -> Result<()> {
    plan.block = [c.threads(), 1, 1];
    if c.split > 1 {
        // The blocks of one tile's split reduction, one cluster.
        plan.grid[2] = Expr::Int(c.split);
    }
    thread_plan.scope = None;
    plan.min_blocks = Some(c.min_blocks());
    plan.dynamic_shared = c.shared_bytes();
    let tile = match thread_plan.registers.take() {
        Some(Registers::Tile(tile)) => tile,
        _ => {
            return Err(Error::Internal(format!(
                "{}: a contraction without its register tile",
                plan.mark
            )))
        }
    };
    thread_plan.registers = Some(Registers::TensorCores {
        tile,
        contraction: c,
    });
    Ok(())
}
