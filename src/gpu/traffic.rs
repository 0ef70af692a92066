//! Bytes a mapped (or CPU-tiled) schedule moves to and from global
//! memory, from the access relations and the tiles, in isl: the figure the
//! cost model (`gpu::cost`) weighs and `compare` shows.
//!
//! The model: the schedule tree is cut at its *tile points*: on the GPU
//! tree, the `shared` mark of a kernel (where tiles are promoted) or else its
//! first `thread_*` mark (what a block touches per step of its sequential
//! loops); on the CPU tree, the `point` mark below each tile band; where
//! neither is found, the leaf (every statement instance on its own). At a
//! tile point with prefix schedule `P : S[i] -> [t]` and access relation
//! `A : S[i] -> X[e]`, `F = P^-1 . A : [t] -> X[e]` relates each tile to
//! its footprint in tensor X. Each tile is taken to load its read footprint
//! once and store its write footprint once:
//!
//! * tiles: the number of points of dom F (tile origins divided by their
//!   stride), counted by `model::count::estimated_points`: exactly for
//!   boxes and triangles, estimated for sets too coupled to slice cheaply;
//! * footprint: the size of isl's fixed box hull of the range of F
//!   (`isl_map_get_range_simple_fixed_box_hull`): exact for a full tile of
//!   an affine access, an upper bound at partial edge tiles. Where isl finds
//!   no fixed box the whole range is counted once and the figure is marked
//!   inexact (a lower bound). Where a tensor has several accesses, the
//!   smaller of the union's box and the sum of the accesses' own boxes is
//!   taken (two accesses far apart in one tile, as a shifted fused
//!   statement makes, would otherwise count the gap between them);
//! * a temporary whose reads in a tile are all of elements the same tile
//!   writes is served on chip: its reads count nothing.
//!
//! Tile points in different kernels (or loop nests) never share data, so a
//! temporary passed between kernels is written by one and read by the next.

use crate::error::{Error, Result};
use crate::frontend::ast::{Program, TensorRole};
use crate::isl::{IslPrint, Map, ScheduleNode, ScheduleNodeType, Set, UnionMap};
use crate::model::count::Counts;
use crate::model::Scop;

/// The traffic of one tile point: the kernel it is in (the name of the
/// `kernel_K` mark above it, `None` on a CPU tree), bytes read and written
/// per tensor (in `scop.tensors` order), and whether every footprint had a
/// fixed box.
#[derive(Debug, Clone)]
pub struct PointTraffic {
    pub kernel: Option<String>,
    pub tensors: Vec<(u64, u64)>,
    pub exact: bool,
}

impl PointTraffic {
    pub fn bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |s, (r, w)| s.saturating_add(*r).saturating_add(*w))
    }
}

/// The traffic of every tile point of the tree below `root` (a schedule
/// of `scop`'s statements, every parameter fixed by `scop.context`).
pub fn tile_point_traffic(
    scop: &Scop,
    program: &Program,
    root: ScheduleNode,
) -> Result<Vec<PointTraffic>> {
    tile_point_traffic_counted(scop, program, root, &Counts::default())
}

/// [`tile_point_traffic`] with its sets counted through `counts` (the
/// cost model's, shared by every estimate of one compilation).
pub fn tile_point_traffic_counted(
    scop: &Scop,
    program: &Program,
    root: ScheduleNode,
    counts: &Counts,
) -> Result<Vec<PointTraffic>> {
    let mut points = Vec::new();
    tile_points(root, None, &mut points)?;
    let mut out = Vec::new();
    for (node, kernel) in points {
        let prefix = node.get_prefix_schedule_union_map()?;
        let mut here = PointTraffic {
            kernel,
            tensors: vec![(0, 0); scop.tensors.len()],
            exact: true,
        };
        for (ti, t) in scop.tensors.iter().enumerate() {
            let (reads, writes) = accesses(scop, program, &t.name)?;
            let size = t.dtype.size() as u64;
            let per_tile = |acc: &UnionMap| -> Result<Option<Map>> {
                let f = prefix
                    .copy()?
                    .reverse()?
                    .apply_range(acc.copy()?)?
                    .intersect_params(scop.context.copy()?)?
                    .project_out_all_params()?;
                if f.is_empty()? {
                    return Ok(None);
                }
                Ok(Some(Map::from_union_map(f)?))
            };
            // (the union of the accesses per tile, each access per tile)
            let footprints = |accs: &[UnionMap]| -> Result<Option<(Map, Vec<Map>)>> {
                let mut each = Vec::new();
                let mut union: Option<UnionMap> = None;
                for a in accs {
                    if let Some(m) = per_tile(a)? {
                        each.push(m);
                    }
                    union = Some(match union {
                        None => a.copy()?,
                        Some(u) => u.union(a.copy()?)?,
                    });
                }
                match union {
                    Some(u) => Ok(per_tile(&u)?.map(|m| (m, each))),
                    None => Ok(None),
                }
            };
            let w = footprints(&writes)?;
            let r = footprints(&reads)?;
            if let Some((w, each)) = &w {
                let (n, exact) = moved(w, each, counts)?;
                here.exact &= exact;
                here.tensors[ti].1 += n * size;
            }
            if let Some((r, each)) = &r {
                let on_chip = t.role == TensorRole::Temp
                    && match &w {
                        Some((w, _)) => r.is_subset(w)?,
                        None => false,
                    };
                if !on_chip {
                    let (n, exact) = moved(r, each, counts)?;
                    here.exact &= exact;
                    here.tensors[ti].0 += n * size;
                }
            }
        }
        out.push(here);
    }
    Ok(out)
}

/// The read and the write relations of tensor `name`, one per access of a
/// statement.
fn accesses(scop: &Scop, program: &Program, name: &str) -> Result<(Vec<UnionMap>, Vec<UnionMap>)> {
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for s in &scop.statements {
        for a in s.accesses(program) {
            if a.tensor != name {
                continue;
            }
            let m = UnionMap::from_map(a.relation.copy()?)?;
            if a.write {
                writes.push(m);
            } else {
                reads.push(m);
            }
        }
    }
    Ok((reads, writes))
}

/// Elements moved for the per-tile footprint `union` of several accesses
/// (`each`): the box hull of the union, or the sum of the accesses' own
/// hulls where that is smaller (accesses far apart in one tile, as a
/// shifted fused statement makes, would otherwise count the gap between
/// them).
fn moved(union: &Map, each: &[Map], counts: &Counts) -> Result<(u64, bool)> {
    let (n, exact) = pairs(union, counts)?;
    if each.len() < 2 {
        return Ok((n, exact));
    }
    let mut sum: u64 = 0;
    let mut all_exact = true;
    for m in each {
        let (k, e) = pairs(m, counts)?;
        sum = sum.saturating_add(k);
        all_exact &= e;
    }
    Ok(if sum < n {
        (sum, all_exact)
    } else {
        (n, exact)
    })
}

/// Σ over tiles of the footprint: (tiles × box size, exact?).
fn pairs(f: &Map, counts: &Counts) -> Result<(u64, bool)> {
    let tiles = count_tiles(f.copy()?.domain()?, counts)?;
    let hull = f.get_range_simple_fixed_box_hull()?;
    if hull.is_valid()? {
        let size = hull.get_size()?;
        let mut n: u64 = 1;
        for d in 0..size.size()? {
            let v = crate::isl::val_to_i64(&size.get_at(d)?)?;
            n = n.saturating_mul(v.max(0) as u64);
        }
        Ok((tiles.saturating_mul(n), true))
    } else {
        Ok((counts.estimated_points(&f.copy()?.range()?)?, false))
    }
}

/// Points of a set of tile origins (strided dimensions count as their
/// quotients: `model::count` compresses them).
fn count_tiles(set: Set, counts: &Counts) -> Result<u64> {
    counts.estimated_points(&set).map_err(|e| match e {
        Error::Internal(m) => Error::Internal(format!("counting tiles of {}: {m}", set.text())),
        other => other,
    })
}

/// The tile points below `node` (see the module comment), in tree order,
/// each with the kernel mark above it.
fn tile_points(
    node: ScheduleNode,
    kernel: Option<String>,
    out: &mut Vec<(ScheduleNode, Option<String>)>,
) -> Result<()> {
    let ty = node.get_type()?;
    let mut kernel = kernel;
    if ty == ScheduleNodeType::Mark {
        let id = node.mark_get_id()?;
        let name = id.get_name()?.to_string();
        if name == "shared" || name.starts_with("thread_") || name == "point" {
            out.push((node, kernel));
            return Ok(());
        }
        if name.starts_with("kernel_") {
            kernel = Some(name);
        }
    }
    let n = node.n_children()?;
    if n == 0 || ty == ScheduleNodeType::Leaf {
        out.push((node, kernel));
        return Ok(());
    }
    for i in 0..n {
        tile_points(node.copy()?.child(i)?, kernel.clone(), out)?;
    }
    Ok(())
}
