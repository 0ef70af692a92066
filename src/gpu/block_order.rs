//! The order in which a kernel's blocks start along each grid axis.
//!
//! The GPU starts a grid's blocks about in the order of their linear index
//! (`blockIdx.x` fastest, then `y`, then `z`), as multiprocessors free up.
//! Where the work of a tile grows along a block axis, blocks in index
//! order leave the heaviest tiles for the last wave, which then runs with
//! most multiprocessors idle. symm's two products are mirror images: `C +=
//! A(i, k) B(k, j)` over `k < i`, whose row tile `r` runs about `r + 1`
//! times the steps of the first, took 854 us on the H200, and over `k > i`,
//! whose heaviest tiles come first, 570 us, for the same arithmetic.
//!
//! So where a block at the last tile along an axis does clearly more work
//! than one at the first ([`HEAVIER`] times the instances, on average over
//! the blocks of that tile that have any), the axis is launched last tile
//! first: block `b` of `G` takes the tile index `G - 1 - b` (a permutation
//! of the blocks, so every tile still runs once, with or without a grid
//! smaller than the tiles). This is the longest-processing-time-first rule
//! for a work that grows along the axis. A triangle in the output (syrk's
//! `j <= i`) has more blocks at the last row tile, not heavier ones: the
//! average keeps its order (reversed, syr2k took 3% longer on the H200).
//! The decision is the gpu stage's (`KernelPlan::reversed`); the printer
//! only prints the index it gives. An attention kernel's row tiles along x
//! are weighed by the key tiles each visits ([`attention_rows_reversed`]).

use std::collections::HashMap;

use crate::frontend::ast::Program;
use crate::isl::{DimType, Set, UnionMap};

use super::attention::{Attention, KeyTiles, BLOCK_KEYS};

use crate::error::Result;
use crate::isl::val_to_i64;
use crate::model::count::estimated_points;
use crate::model::Scop;

/// How many times the work of a block at the first tile a block at the
/// last tile must have for its axis to start last-first. A plain
/// product's last tile, cut by the end of the tensor, has less; a
/// triangle in the reduction index many times more.
pub const HEAVIER: u64 = 4;

/// Whether the blocks along block member `member` of `blocks` (the
/// instances of a kernel mapped to their block values, one output
/// dimension a block member) should start at the last tile: see the
/// module documentation. `false` where the values are symbolic or a
/// count fails (the order changes nothing a result depends on, so a
/// doubt keeps the index order).
pub fn heaviest_last(scop: &Scop, blocks: &UnionMap, member: usize) -> Result<bool> {
    let blocks = blocks
        .copy()?
        .intersect_params(scop.context.copy()?)?
        .project_out_all_params()?;
    let all = Set::from_union_set(blocks.copy()?.range()?)?;
    let n = all.dim(DimType::Set)? as usize;
    if member >= n || all.is_empty()? || !all.is_bounded()? {
        return Ok(false);
    }
    let values = all
        .copy()?
        .project_out(DimType::Set, member as u32 + 1, (n - member - 1) as u32)?
        .project_out(DimType::Set, 0, member as u32)?;
    let (Ok(lo), Ok(hi)) = (
        val_to_i64(&values.copy()?.dim_min_val(0)?),
        val_to_i64(&values.dim_max_val(0)?),
    ) else {
        return Ok(false);
    };
    if lo == hi {
        return Ok(false);
    }
    let per_block = |v| -> Option<u64> {
        let v = i32::try_from(v).ok()?;
        let tiles = estimated_points(
            &all.copy()
                .ok()?
                .fix_si(DimType::Set, member as u32, v)
                .ok()?,
        )
        .ok()?;
        Some(instances_at(&blocks, member, v)? / tiles.max(1))
    };
    let (Some(first), Some(last)) = (per_block(lo), per_block(hi)) else {
        return Ok(false);
    };
    Ok(last > first.saturating_mul(HEAVIER))
}

/// Whether an attention kernel's row tiles should start at the last one:
/// where the block of the last row tile visits more than [`HEAVIER`] times
/// the key tiles of the first (causal attention: 1 key tile against
/// `S / 64`). The heaviest blocks then start first and the last wave is
/// the lightest, as FlashAttention orders a causal grid. Only a plain
/// range of key tiles with its bounds constant in the parameters is
/// counted (the batch iterators at 0); anything else keeps the order.
pub fn attention_rows_reversed(a: &Attention, program: &Program) -> bool {
    let KeyTiles::Range { any, lo, hi } = &a.key_tiles else {
        return false;
    };
    if a.split.is_some() || a.row_tiles() < 2 {
        return false;
    }
    let params = program.known_params();
    let tiles_at = |row: i64| -> Option<i64> {
        let mut values: HashMap<String, i64> = [any, lo, hi]
            .iter()
            .flat_map(|e| e.ids())
            .map(|id| (id, 0))
            .collect();
        values.extend(params.iter().map(|(k, v)| (k.clone(), *v)));
        values.insert("pf_i0".into(), row);
        if super::eval(any, &values).ok()? == 0 {
            return Some(0);
        }
        let lo = super::eval(lo, &values).ok()?;
        let hi = super::eval(hi, &values).ok()?;
        Some((hi.div_euclid(BLOCK_KEYS) - lo.div_euclid(BLOCK_KEYS) + 1).max(0))
    };
    let last = (a.row_tiles() - 1) * a.block_rows();
    match (tiles_at(0), tiles_at(last)) {
        (Some(first), Some(last)) => last > first.max(1).saturating_mul(HEAVIER as i64),
        _ => false,
    }
}

/// The instances `blocks` sends to value `value` of block member
/// `member`, over all its statements; `None` where one cannot be counted.
fn instances_at(blocks: &UnionMap, member: usize, value: i32) -> Option<u64> {
    let maps = blocks.get_map_list().ok()?;
    let mut total: u64 = 0;
    for k in 0..maps.size().ok()? {
        let map = maps.get_at(k).ok()?;
        let at = map
            .fix_si(DimType::Out, member as u32, value)
            .ok()?
            .domain()
            .ok()?;
        total = total.saturating_add(estimated_points(&at).ok()?);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::Analysed;
    use crate::isl::Isl;

    /// Whether the attention of example `name` at `S = 320` (five row
    /// tiles) runs its row tiles last first.
    fn rows_reversed(name: &str) -> bool {
        let path = format!("{}/examples/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let json = std::fs::read_to_string(path).unwrap();
        let json = json.replacen("\"S\": 32,", "\"S\": 320,", 1);
        assert!(json.contains("\"S\": 320"), "{name}: no S to set");
        let a = Analysed::new(&json);
        let attention = crate::gpu::attention::recognise(&a.isl, &a.program, &a.scop, &a.deps)
            .unwrap()
            .expect("an attention");
        attention_rows_reversed(&attention, &a.program)
    }

    #[test]
    fn causal_attention_starts_at_its_last_row_tile() {
        // Row tile 4 visits 5 key tiles, tile 0 one.
        assert!(rows_reversed("attention_causal"));
        // Every row tile visits every key tile.
        assert!(!rows_reversed("attention_global"));
    }

    #[test]
    fn instances_at_counts_a_triangle_by_rows() {
        let isl = Isl::new();
        // Row tiles of 4 over a triangle `k < i`, i < 10: tile 0 holds
        // 0 + 1 + 2 + 3 instances, tile 2 (rows 8, 9) 8 + 9.
        let m = isl
            .union_map("{ S[i, k] -> [floor(i / 4)] : 0 <= i < 10 and 0 <= k < i }")
            .unwrap();
        assert_eq!(instances_at(&m, 0, 0), Some(6));
        assert_eq!(instances_at(&m, 0, 2), Some(17));
        assert_eq!(instances_at(&m, 0, 3), Some(0));
    }
}
