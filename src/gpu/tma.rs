//! Hopper's copy engine (TMA) for the operand tiles of a `wgmma`
//! contraction: one thread asks for a whole box of a tensor, the engine
//! writes it into shared memory in the swizzle the `wgmma` descriptors
//! read (`gpu::contraction::SharedTile`), fills what lies past the
//! tensor's extents with zeros, and counts the bytes it wrote on the
//! stage's mbarrier, which the consumers wait on. The threads issue no
//! 16-byte copies and compute no chunk addresses: on one H200 (f16
//! 4096^3, the tiles polyfuse picks, `bench/experiments/tma`) a kernel
//! written by hand this way took 206 us against 221 us for the `cp.async`
//! kernel polyfuse emitted.
//!
//! The copy engine reads a tensor through a map (`TensorMap`) that the
//! launcher encodes from the buffer's address; the kernel only says which
//! box. So the decision here needs what the map needs, known when the
//! kernel is compiled:
//!
//! - the operand is the tensor's element at subscripts that are exactly the
//!   row iterator (`m` for A, `n` for B, coefficient 1) along one dimension,
//!   exactly `k` along another, and free of `m`, `n` and `k` elsewhere (a
//!   batch index is fixed in a block);
//! - the contiguous dimension is `k` (K-major) or the row's (MN-major), as
//!   the shared layout has it;
//! - the tensor's extents are constants, its rows 16-byte multiples, its
//!   rank at most 5, its elements the contraction's 2-byte type;
//! - the domain's `k` covers the tensor's dimension along `k` exactly: the
//!   engine fills zeros only past the tensor, so a box that ran past the
//!   domain but inside the tensor would add products the statement does
//!   not have. Rows past the domain are harmless: they reach only
//!   accumulators that nothing stores (see `gpu::contraction`).
//!
//! Anything else keeps the `cp.async` copies, as does a contraction whose
//! reduction is split over a cluster or that has further sums, and one
//! whose blocks hold every k tile at once (`Contraction::whole_k`, the
//! latency regime): there all threads issue their copies side by side,
//! where one producer would issue every box alone (H200, f16 128 x 1024 x
//! 1024, 16 stages: 4.5 us with `cp.async`, 4.7 and 4.8 us with TMA).

use super::attention::{Attention, TileOperand};
use super::contraction::{narrow, Contraction, Operand};
use super::TensorMap;
use crate::frontend::ast::{Affine, DType, Program};

/// How a contraction's operand tiles reach shared memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Copies {
    /// Every thread copies 16-byte chunks with `cp.async`.
    #[default]
    CpAsync,
    /// The copy engine, one map per operand (A, then B): the kernel's
    /// tensor maps in this order.
    Tma(Box<[TmaOperand; 2]>),
}

impl Copies {
    /// The tensor maps the kernel takes (A's, then B's), or none.
    pub fn maps(&self) -> Vec<TensorMap> {
        match self {
            Copies::CpAsync => Vec::new(),
            Copies::Tma(ops) => ops.iter().map(|o| o.map.clone()).collect(),
        }
    }

    /// Bytes of the kernel's mbarriers for `stages` stages (a full and an
    /// empty one each, 8 bytes), declared statically beside the tiles.
    pub fn barrier_bytes(&self, stages: i64) -> usize {
        match self {
            Copies::CpAsync => 0,
            Copies::Tma(_) => 16 * stages as usize,
        }
    }

    /// The operands' copies, where the copy engine makes them.
    pub fn tma(&self) -> Option<&[TmaOperand; 2]> {
        match self {
            Copies::CpAsync => None,
            Copies::Tma(ops) => Some(ops),
        }
    }
}

/// One operand's copies: its map, where its row and `k` lie among the
/// map's dimensions, and the boxes of one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmaOperand {
    pub map: TensorMap,
    /// The map dimension (contiguous first) the row iterator runs along.
    pub row_dim: usize,
    /// The map dimension `k` runs along.
    pub k_dim: usize,
    /// Boxes of one stage: 1 for a K-major tile (one box of every row and
    /// the k tile); an MN-major tile's `rows / span` groups of `span`
    /// columns, each its own box, the next `box_len` elements further in
    /// the stage and `span` further along the row dimension.
    pub boxes: i64,
    /// Elements of one box.
    pub box_len: i64,
}

impl TmaOperand {
    /// Bytes one stage's boxes write, the zero fill included: what the
    /// stage's mbarrier expects.
    pub fn stage_bytes(&self) -> i64 {
        self.boxes * self.box_len * 2
    }

    /// Elements of a box along the row dimension (the span between boxes).
    pub fn span(&self) -> i64 {
        i64::from(self.map.boxes[self.row_dim])
    }
}

/// The copies of `c`'s operand tiles: the copy engine where both operands
/// allow it (see the module doc), else `cp.async`.
pub fn copies(c: &Contraction, program: &Program) -> Copies {
    if !c.wgmma || c.split != 1 || !c.terms.is_empty() || c.whole_k {
        return Copies::CpAsync;
    }
    let Ok(k_extent) = super::eval(&c.extents[2], &program.known_params()) else {
        return Copies::CpAsync;
    };
    let iterators = [c.m.as_str(), c.n.as_str()];
    let operand = |x: &Operand, row: &str, rows: i64| {
        let shape = known_shape(program, &x.tensor, c.dtype)?;
        let (row_pos, k_pos) = row_and_k(&x.subscripts, shape.len(), row, &c.k, &iterators)?;
        if shape[k_pos] != k_extent {
            return None;
        }
        map_operand(x, c.dtype, &shape, [row_pos, k_pos], rows, c.tile[2])
    };
    match (
        operand(&c.a, &c.m, c.tile[0]),
        operand(&c.b, &c.n, c.tile[1]),
    ) {
        (Some(a), Some(b)) => Copies::Tma(Box::new([a, b])),
        _ => Copies::CpAsync,
    }
}

/// The copies of an attention kernel's key and value tiles (`a`'s key
/// operand, then each contraction's value operand; `codegen::flash`) by
/// the copy engine, where the kernel runs on `wgmma` and every such
/// operand allows it: as for a product's K-major operand (module doc),
/// with the tile's row iterator (`j`) for the row and its column iterator
/// (`d`, `e`) for `k`; a tile of [`BLOCK_KEYS`] rows is one box per
/// 64-column atom. Rows past the tensor are zeros, as the threads' copies
/// fill them; the columns are the operand's own width. Empty: the
/// threads copy.
///
/// [`BLOCK_KEYS`]: super::attention::BLOCK_KEYS
pub fn attention_copies(a: &Attention, program: &Program) -> Vec<TmaOperand> {
    if !a.wgmma() {
        return Vec::new();
    }
    let tiles = std::iter::once((&a.key_operand, a.depth))
        .chain(a.contractions.iter().map(|c| (&c.value, c.width)));
    let mut copies = Vec::new();
    for (x, width) in tiles {
        match attention_tile(x, width, a.dtype, program) {
            Some(op) => copies.push(op),
            None => return Vec::new(),
        }
    }
    copies
}

/// The map and boxes of one key or value tile of `width` columns.
fn attention_tile(
    x: &TileOperand,
    width: i64,
    dtype: DType,
    program: &Program,
) -> Option<TmaOperand> {
    let shape = known_shape(program, &x.tensor, dtype)?;
    let rank = shape.len();
    let (row_pos, col_pos) = row_and_k(&x.subscripts, rank, &x.row, &x.col, &[])?;
    if col_pos != rank - 1 || width % 64 != 0 {
        return None;
    }
    let (dims, strides) = dims_and_strides(&shape)?;
    let rows = super::attention::BLOCK_KEYS;
    let mut boxes = vec![1u32; rank];
    boxes[0] = 64;
    boxes[rank - 1 - row_pos] = rows as u32;
    Some(TmaOperand {
        map: TensorMap {
            tensor: x.tensor.clone(),
            dtype,
            dims,
            strides,
            boxes,
            swizzle: 128,
        },
        row_dim: rank - 1 - row_pos,
        k_dim: 0,
        boxes: width / 64,
        box_len: rows * 64,
    })
}

/// The extents of `tensor`, where they are constants and its elements
/// are `dtype` (2-byte).
fn known_shape(program: &Program, tensor: &str, dtype: DType) -> Option<Vec<i64>> {
    let t = program.tensor(tensor)?;
    if t.dtype != dtype || !matches!(dtype, DType::F16 | DType::BF16) {
        return None;
    }
    t.shape
        .as_ref()?
        .iter()
        .map(|a| program.evaluate(a))
        .collect()
}

/// Where `row` and `k` stand among `subscripts` (a tensor of `rank`
/// dimensions): each exactly its iterator (coefficient 1, `k` without an
/// offset), neither in any other subscript, and no other subscript naming
/// one of `iterators` (a batch index is fixed in a block).
fn row_and_k(
    subscripts: &[Affine],
    rank: usize,
    row: &str,
    k: &str,
    iterators: &[&str],
) -> Option<(usize, usize)> {
    if !(2..=5).contains(&rank) || subscripts.len() != rank {
        return None;
    }
    let unit = |a: &Affine, v: &str| a.terms.len() == 1 && a.coeff(v) == 1;
    let row_pos = subscripts.iter().position(|s| unit(s, row))?;
    let k_pos = subscripts
        .iter()
        .position(|s| unit(s, k) && s.constant == 0)?;
    let others_free = subscripts.iter().enumerate().all(|(i, s)| {
        i == row_pos
            || i == k_pos
            || s.names()
                .all(|n| n != row && n != k && !iterators.contains(&n))
    });
    (row_pos != k_pos && others_free).then_some((row_pos, k_pos))
}

/// A row-major tensor of 2-byte elements with extents `shape` as a map's
/// dimensions (the contiguous one first: shape position p is map dimension
/// rank - 1 - p) and byte strides, where a map can describe it: every
/// extent positive, every stride a multiple of 16 under 2^40.
fn dims_and_strides(shape: &[i64]) -> Option<(Vec<u64>, Vec<u64>)> {
    let rank = shape.len();
    let dims: Vec<u64> = shape.iter().rev().map(|&e| e.max(0) as u64).collect();
    let mut strides = Vec::with_capacity(rank.saturating_sub(1));
    let mut bytes = 2u64;
    for d in &dims[..rank.saturating_sub(1)] {
        bytes = bytes.checked_mul(*d)?;
        strides.push(bytes);
    }
    if dims.contains(&0) || strides.iter().any(|s| s % 16 != 0 || *s >= 1 << 40) {
        return None;
    }
    Some((dims, strides))
}

/// The map and boxes of operand `x` of `dtype` (tensor extents `shape`,
/// the row and `k` at subscripts `[row_pos, k_pos]`, a tile of `rows`
/// rows by `tk`), or `None` where the copy engine cannot copy its tile
/// (see the module doc).
fn map_operand(
    x: &Operand,
    dtype: DType,
    shape: &[i64],
    [row_pos, k_pos]: [usize; 2],
    rows: i64,
    tk: i64,
) -> Option<TmaOperand> {
    let rank = shape.len();
    let contiguous = if x.k_contiguous { k_pos } else { row_pos };
    if contiguous != rank - 1 {
        return None;
    }
    let dim = |p: usize| rank - 1 - p;
    let (dims, strides) = dims_and_strides(shape)?;
    // The box: a K-major tile is one box of `rows` lines of the k tile
    // (64 elements, the 128-byte swizzle); an MN-major one a box of `tk`
    // lines of `span` row elements per group of `span` rows.
    let span = if x.k_contiguous {
        rows
    } else if narrow(x, rows) {
        32
    } else {
        64
    };
    let line = if x.k_contiguous { tk } else { span };
    if rows % span != 0 || rows > 256 || tk > 256 || !matches!(line, 32 | 64) {
        return None;
    }
    let mut boxes = vec![1u32; rank];
    boxes[dim(row_pos)] = span as u32;
    boxes[dim(k_pos)] = tk as u32;
    Some(TmaOperand {
        map: TensorMap {
            tensor: x.tensor.clone(),
            dtype,
            dims,
            strides,
            boxes,
            swizzle: (line * 2) as u32,
        },
        row_dim: dim(row_pos),
        k_dim: dim(k_pos),
        boxes: rows / span,
        box_len: span * tk,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::Analysed;
    use crate::gpu::GpuOptions;

    /// A product `body` of f16 operands `A` (`a_shape`) and `B` (`b_shape`)
    /// into an f32 `C` of `c_shape`, at `params` (a JSON object's members).
    fn program(params: &str, shapes: [&str; 3], body: &str) -> String {
        format!(
            r#"{{"name": "mm", "params": {{ {params} }},
                "inputs": {{"A": {{"dtype": "f16", "shape": {}}},
                           "B": {{"dtype": "f16", "shape": {}}}}},
                "outputs": {{"C": {{"dtype": "f32", "shape": {}}}}},
                "body": ["{body}"]}}"#,
            shapes[0], shapes[1], shapes[2]
        )
    }

    // A long reduction: the stages are refilled (not `whole_k`).
    const MNK: &str = r#""M": 1024, "N": 1024, "K": 4000"#;
    const ROW_MAJOR: [&str; 3] = [r#"["M", "K"]"#, r#"["K", "N"]"#, r#"["M", "N"]"#];
    const GEMM: &str = "C(i, j) +=! A(i, k) * B(k, j)";

    /// The contraction of `json`'s kernels under the automatic tiles (the
    /// `wgmma` tiles), unsplit, with the copy engine on or off.
    fn contraction(json: &str, tma: bool) -> Contraction {
        let options = GpuOptions {
            auto_tile: true,
            tma,
            // Unsplit: a split reduction keeps the threads' copies.
            k_split: Some(1),
            ..GpuOptions::default()
        };
        Analysed::new(json)
            .plans(&[32], &options)
            .into_iter()
            .find_map(|p| p.contraction().cloned())
            .expect("a contraction on tensor cores")
    }

    #[test]
    fn a_row_major_product_copies_both_operands_by_the_engine() {
        let c = contraction(&program(MNK, ROW_MAJOR, GEMM), true);
        assert!(c.wgmma && !c.whole_k);
        let [a, b] = c.copies.tma().expect("copied by the engine").clone();
        let [tm, tn, tk] = c.tile;
        // A (M x K, K-major): dimensions k then i; one box of the tile's
        // rows and the k tile, in the 128-byte swizzle.
        assert_eq!((a.map.tensor.as_str(), a.map.dtype), ("A", DType::F16));
        assert_eq!(
            (a.map.dims.clone(), a.map.strides.clone()),
            (vec![4000, 1024], vec![8000])
        );
        assert_eq!((a.k_dim, a.row_dim, a.boxes), (0, 1, 1));
        assert_eq!(a.map.boxes, vec![tk as u32, tm as u32]);
        assert_eq!(a.map.swizzle, 128);
        // B (K x N, MN-major): dimensions j then k; a box per group of
        // columns the swizzle's line holds.
        assert_eq!(
            (b.map.dims.clone(), b.map.strides.clone()),
            (vec![1024, 4000], vec![2048])
        );
        assert_eq!((b.k_dim, b.row_dim), (1, 0));
        let span = if tn == 32 { 32 } else { 64 };
        assert_eq!(b.map.boxes, vec![span as u32, tk as u32]);
        assert_eq!((b.boxes, b.map.swizzle), (tn / span, 2 * span as u32));
        // What a stage's barrier expects: both tiles, zero fill included.
        assert_eq!(a.stage_bytes() + b.stage_bytes(), (tm + tn) * tk * 2);
        assert_eq!(c.copies.maps(), vec![a.map, b.map]);
    }

    #[test]
    fn the_plan_counts_the_barriers_and_says_what_the_engine_copies() {
        let options = GpuOptions {
            auto_tile: true,
            k_split: Some(1),
            ..GpuOptions::default()
        };
        let plans = Analysed::new(&program(MNK, ROW_MAJOR, GEMM)).plans(&[32], &options);
        let plan = plans
            .iter()
            .find(|p| p.contraction().is_some())
            .expect("a contraction");
        let c = plan.contraction().unwrap();
        // A full and an empty barrier a stage, 8 bytes each, static.
        assert_eq!(c.copies.barrier_bytes(c.stages), 16 * c.stages as usize);
        assert_eq!(plan.static_shared, 16 * c.stages as usize);
        assert_eq!(plan.tensor_maps(), c.copies.maps());
        let text = plan.to_string();
        assert!(
            text.contains("copies by the copy engine (TMA): A dims [4000, 1024] box [64, "),
            "{text}"
        );
    }

    #[test]
    fn blocks_that_hold_every_k_tile_keep_the_threads_copies() {
        // 160 of k: every block's three k tiles at once (the latency
        // regime), its copies issued by all threads side by side.
        let json = program(r#""M": 256, "N": 192, "K": 160"#, ROW_MAJOR, GEMM);
        let c = contraction(&json, true);
        assert!(c.wgmma && c.whole_k);
        assert_eq!(c.copies, Copies::CpAsync);
    }

    #[test]
    fn without_the_engine_the_threads_copy() {
        let c = contraction(&program(MNK, ROW_MAJOR, GEMM), false);
        assert!(c.wgmma);
        assert_eq!(c.copies, Copies::CpAsync);
    }

    #[test]
    fn rows_off_sixteen_bytes_keep_the_threads_copies() {
        // A's rows are 2 * 1001 bytes: no map can describe them.
        let json = program(r#""M": 1024, "N": 1024, "K": 4001"#, ROW_MAJOR, GEMM);
        let c = contraction(&json, true);
        assert!(c.wgmma);
        assert_eq!(c.copies, Copies::CpAsync);
    }

    #[test]
    fn a_reduction_over_part_of_a_tensor_keeps_the_threads_copies() {
        // k runs over 100 of A's 160 columns: a box past k = 100 would read
        // elements of A that the statement does not sum, and the engine
        // fills zeros only past the tensor.
        let json = program(
            MNK,
            ROW_MAJOR,
            "C(i, j) +=! A(i, k) * B(k, j) where k < 100",
        );
        let c = contraction(&json, true);
        assert!(c.wgmma);
        assert_eq!(c.copies, Copies::CpAsync);
    }

    #[test]
    fn a_batch_index_is_a_dimension_of_box_one() {
        let json = program(
            r#""Z": 3, "M": 1024, "N": 1024, "K": 160"#,
            [
                r#"["Z", "M", "K"]"#,
                r#"["Z", "K", "N"]"#,
                r#"["Z", "M", "N"]"#,
            ],
            "C(z, i, j) +=! A(z, i, k) * B(z, k, j)",
        );
        let c = contraction(&json, true);
        let [a, b] = c.copies.tma().expect("copied by the engine").clone();
        assert_eq!(a.map.dims, vec![160, 1024, 3]);
        assert_eq!(a.map.strides, vec![320, 320 * 1024]);
        assert_eq!(a.map.boxes[2], 1);
        assert_eq!(b.map.dims, vec![1024, 160, 3]);
        assert_eq!(b.map.boxes[2], 1);
    }

    #[test]
    fn an_mn_major_a_is_boxed_along_its_rows() {
        // A stored k-major-last (K x M): m is contiguous.
        let json = program(
            MNK,
            [r#"["K", "M"]"#, r#"["K", "N"]"#, r#"["M", "N"]"#],
            "C(i, j) +=! A(k, i) * B(k, j)",
        );
        let c = contraction(&json, true);
        if !c.wgmma {
            return; // no wgmma tile for two MN-major operands here
        }
        let [a, _] = c.copies.tma().expect("copied by the engine").clone();
        assert_eq!((a.row_dim, a.k_dim), (0, 1));
        assert_eq!(a.map.dims, vec![1024, 4000]);
        assert_eq!(a.boxes, c.tile[0] / 64);
    }
}
