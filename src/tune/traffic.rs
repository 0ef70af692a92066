//! Bytes a schedule moves to and from global memory, from the access
//! relations and the tiles, in isl.
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
//!   stride, then counted exactly, as `runtime::work` counts domains);
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
use crate::frontend::ast::TensorRole;
use crate::isl::{DimType, Isl, IslPrint, Map, ScheduleNode, ScheduleNodeType, Set, UnionMap};
use crate::model::{self, Scop};
use crate::pipeline::Compiled;
use crate::runtime::work::count_points;

/// Global-memory traffic of one execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traffic {
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// False where a footprint had no fixed box (see the module comment).
    pub exact: bool,
    /// Per tensor: name, bytes read, bytes written.
    pub tensors: Vec<(String, u64, u64)>,
}

impl Traffic {
    pub fn bytes(&self) -> u64 {
        self.read_bytes.saturating_add(self.write_bytes)
    }
}

/// The traffic of `compiled`'s GPU tree when it has one, else of its CPU
/// tree. Every parameter must have a value.
pub fn measure(compiled: &Compiled) -> Result<Traffic> {
    compiled.param_values()?;
    let isl = Isl::new();
    let scop = model::build(&isl, &compiled.program)?;
    let tree = compiled.gpu_tree.as_ref().unwrap_or(&compiled.tree);
    let schedule = isl.schedule(&tree.to_isl_text())?;
    let mut points = Vec::new();
    tile_points(schedule.get_root()?, &mut points)?;
    let mut traffic = Traffic {
        exact: true,
        tensors: compiled
            .tensors
            .iter()
            .map(|t| (t.name.clone(), 0, 0))
            .collect(),
        ..Default::default()
    };
    for node in &points {
        let prefix = node.get_prefix_schedule_union_map()?;
        for (ti, t) in compiled.tensors.iter().enumerate() {
            let (reads, writes) = accesses(&scop, compiled, &t.name)?;
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
                let (n, exact) = moved(w, each)?;
                traffic.exact &= exact;
                traffic.tensors[ti].2 += n * size;
            }
            if let Some((r, each)) = &r {
                let on_chip = t.role == TensorRole::Temp
                    && match &w {
                        Some((w, _)) => r.is_subset(w)?,
                        None => false,
                    };
                if !on_chip {
                    let (n, exact) = moved(r, each)?;
                    traffic.exact &= exact;
                    traffic.tensors[ti].1 += n * size;
                }
            }
        }
    }
    traffic.read_bytes = traffic.tensors.iter().map(|t| t.1).sum();
    traffic.write_bytes = traffic.tensors.iter().map(|t| t.2).sum();
    Ok(traffic)
}

/// The read and the write relations of tensor `name`, one per access of a
/// statement.
fn accesses(
    scop: &Scop,
    compiled: &Compiled,
    name: &str,
) -> Result<(Vec<UnionMap>, Vec<UnionMap>)> {
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for s in &scop.statements {
        for a in s.accesses(&compiled.program) {
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
fn moved(union: &Map, each: &[Map]) -> Result<(u64, bool)> {
    let (n, exact) = pairs(union)?;
    if each.len() < 2 {
        return Ok((n, exact));
    }
    let mut sum: u64 = 0;
    let mut all_exact = true;
    for m in each {
        let (k, e) = pairs(m)?;
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
fn pairs(f: &Map) -> Result<(u64, bool)> {
    let tiles = count_tiles(f.copy()?.domain()?)?;
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
        Ok((count_points(&f.copy()?.range()?)?, false))
    }
}

/// Points of a set of tile origins: each strided dimension is divided by
/// its stride first, so the count needs no slicing along empty values.
fn count_tiles(set: Set) -> Result<u64> {
    let n = set.dim(DimType::Set)?;
    if n == 0 {
        return Ok(if set.is_empty()? { 0 } else { 1 });
    }
    let mut from = Vec::new();
    let mut to = Vec::new();
    let mut strided = false;
    for d in 0..n {
        let s = crate::isl::val_to_i64(&set.get_stride(d)?)?;
        from.push(format!("x{d}"));
        if s > 1 {
            strided = true;
            to.push(format!("floor((x{d})/{s})"));
        } else {
            to.push(format!("x{d}"));
        }
    }
    let set = if strided {
        let text = format!("{{ [{}] -> [{}] }}", from.join(", "), to.join(", "));
        let isl_map = Map::read_from_str(&set.get_ctx(), &text)
            .map_err(|e| Error::Internal(format!("stride map {text}: {e:?}")))?;
        set.apply(isl_map)?
    } else {
        set
    };
    count_points(&set).map_err(|e| match e {
        Error::Internal(m) => Error::Internal(format!("counting tiles of {}: {m}", set.text())),
        other => other,
    })
}

/// The tile points below `node` (see the module comment), in tree order.
fn tile_points(node: ScheduleNode, out: &mut Vec<ScheduleNode>) -> Result<()> {
    let ty = node.get_type()?;
    if ty == ScheduleNodeType::Mark {
        let id = node.mark_get_id()?;
        let name = id.get_name()?.to_string();
        if name == "shared" || name.starts_with("thread_") || name == "point" {
            out.push(node);
            return Ok(());
        }
    }
    let n = node.n_children()?;
    if n == 0 || ty == ScheduleNodeType::Leaf {
        out.push(node);
        return Ok(());
    }
    for i in 0..n {
        tile_points(node.copy()?.child(i)?, out)?;
    }
    Ok(())
}
