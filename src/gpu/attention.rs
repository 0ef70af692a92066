//! Attention on tensor cores: recognising, in a kernel that a rolling
//! update made (`repair::rolling`), the chain "score contraction, maps,
//! rolling reduction into a row state, repaired row sums and a repaired
//! contraction with a value tensor", and the block-tiled form that runs it
//! with `mma.sync.m16n8k16` (FlashAttention's loop, printed by
//! `codegen::flash`).
//!
//! The kernel holds every statement of the program, with these roles
//! (`bt` the batch iterators, `i` the row, `j` the rolling loop, `d` the
//! score's reduction, `e` a column of a contraction target; the iterator
//! names must be the same in every statement):
//!
//! * the score `P(bt, i, j) += A(.., i, d) * B(.., j, d)` with f16 or bf16
//!   operands whose last subscript is `d`, on the box `i < R, j < N, d < D`;
//! * maps `X(bt, i, j) = f(..)` reading the score and earlier maps at
//!   `(bt, i, j)`, inputs anywhere, and the iterators;
//! * the rolling predecessor `M(bt, i) = M fr body(..)` (max or min), its
//!   initialisation and its cache `Mp(bt, i) = M(bt, i)`;
//! * targets `X(bt, i) = H(X; Mp, M) + g(..)` (row sums) and
//!   `O(bt, i, e) = H(O; Mp, M) + p(..) * V(.., j, e)` (contractions, `V`
//!   f16 or bf16 with last subscript `e`), each with its initialisation;
//! * epilogue statements over `(bt, i)` or `(bt, i, e)` after the loop.
//!
//! Why the tiled loop computes the same values. The rolling loop over `j`
//! runs in tiles of `N_T` keys: in each tile the predecessor's partial
//! value over the tile is reduced first, combined with the running value
//! (`M' = M fr M_tile`), each target's running value is repaired once
//! (`X = H(X; M, M')`) and the tile's terms are added with the new value
//! (`g(M', c)`). That is the combination of two partial states of the
//! loop that the rewrite proved (`frontend::ast::RollingStates`: Eq. 4
//! moves a term computed with one predecessor value to another, Eq. 5 lets
//! the repair distribute over the target's sum), applied to "the keys
//! before the tile" and "the tile". The score's sum over `d` and the
//! targets' sums over the tile are regrouped (a sum is reorderable), and
//! rows run in parallel: every dependence among the kernel's instances
//! relates two instances of the same row `(bt, i)`, which
//! [`recognise`] checks on the dependences in isl (`D ⊆ R⁻¹ ∘ R` with `R`
//! the projection on the row).
//!
//! Elements outside the rolling statements' domain (a causal or window
//! mask, keys past the end) take no part: their score is the predecessor
//! reducer's identity and their terms are zero. Key tiles with no element
//! in the domain for a block's rows are skipped: a block visits one range
//! of tiles, or, where some block has a gap (BigBird's global columns and
//! window), up to [`MAX_KEY_RUNS`] runs of them, which isl proves to hold
//! every tile with an element and to be disjoint. The element test is left
//! out where a whole tile is inside. All of it is computed from the domain
//! in isl ([`tile_conditions`]).

use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, DType, Expr, ExprKind, Func, Program, Reducer, RollingPred,
    RollingTarget, Statement, TensorRole,
};
use crate::isl::ast::Expr as AstExpr;
use crate::isl::Isl;
use crate::model::{collect_reads, AccessKey, ModelStmt, Scop};

/// Warps of a block.
pub const WARPS: i64 = 4;
/// `mma` row tiles (16 rows) of a warp: the key and value fragments a
/// warp loads from shared memory serve this many of them. One: with two
/// (H100, D = 64) a thread needs 255 registers, two blocks fit a
/// multiprocessor instead of three, and causal prefill was 16% slower
/// (global 2% faster).
pub const WARP_TILES: i64 = 1;
/// Query rows of a block: warp `w`'s tile `t` holds rows
/// `16 (w + WARPS t) ..` of it.
pub const BLOCK_ROWS: i64 = 16 * WARPS * WARP_TILES;

/// Warpgroups of a prefill block with a `wgmma` path (64 rows each, the
/// key and value tiles in shared memory serving all of them). One: with
/// two (128 rows a block, 256 threads, two blocks a multiprocessor; H100,
/// B4 H16 S4096 D64) global prefill took 977-981 us against 963-967 and
/// causal 580-583 against 546-548 (D = 128: 1868 and 1117 us against 1713
/// and 948).
pub const WGMMA_GROUPS: i64 = 1;

/// Whether a prefill kernel of this depth and these value products has a
/// `wgmma` path (see [`Attention::wgmma`]).
fn wgmma_shape(depth: i64, contractions: &[RowContraction]) -> bool {
    WARP_TILES == 1
        && WARPS == 4
        && depth % 64 == 0
        && contractions
            .iter()
            .all(|c| c.width % 64 == 0 && c.width <= 256)
}

/// Query rows of a prefill block: [`BLOCK_ROWS`], or 64 a warpgroup.
fn prefill_block_rows(depth: i64, contractions: &[RowContraction]) -> i64 {
    if wgmma_shape(depth, contractions) {
        64 * WGMMA_GROUPS
    } else {
        BLOCK_ROWS
    }
}

/// Keys of a tile of the rolling loop.
pub const BLOCK_KEYS: i64 = 64;
/// Shared memory a block may use (the H100's opt-in limit).
pub const MAX_SHARED_BYTES: usize = 227 * 1024;
/// Threads of a block.
pub const THREADS: u32 = 32 * WARPS as u32;
/// Warps of a block of a split attention's second kernel (the combination
/// over the slices and the epilogue, a warp per row and column).
pub const COMBINE_WARPS: i64 = 4;
/// Threads of a block of a split attention's second kernel.
pub const COMBINE_THREADS: u32 = 32 * COMBINE_WARPS as u32;
/// Query rows of a block of a split kernel (`gpu::decoding`): one `mma`
/// row tile, which every warp computes on.
pub const SPLIT_ROWS: i64 = 16;
/// Keys of each key tile that one warp of a split kernel takes (warp `w`
/// the keys `16 w ..` of the tile).
pub const SPLIT_WARP_KEYS: i64 = BLOCK_KEYS / WARPS;

/// A read operand of a tile copy: `tensor` at `subscripts` (statement
/// iterators), rows along `row`, its last subscript the contiguous `col`.
#[derive(Debug, Clone)]
pub struct TileOperand {
    pub tensor: String,
    pub subscripts: Vec<Affine>,
    /// The iterator that walks the tile's rows (`i` or `j`).
    pub row: String,
    /// The iterator of the last subscript (`d` or `e`).
    pub col: String,
    /// Rows of the tensor along `row` (zero-filled beyond).
    pub rows: i64,
    /// f16 or bf16.
    pub dtype: DType,
}

/// A repaired row sum `X(bt, i) = H(X; Mp, M) + g`.
#[derive(Debug, Clone)]
pub struct RowSum {
    pub tensor: String,
    /// The initialisation's right side.
    pub init: Expr,
    /// `H` as it reads `X`, the cache and the predecessor.
    pub repair: Expr,
    /// The read of `X` in `repair` (access text).
    pub repair_self: AccessKey,
    /// The term added per key.
    pub term: Expr,
}

/// A repaired contraction `O(bt, i, e) = H(O; Mp, M) + p * V(.., j, e)`.
#[derive(Debug, Clone)]
pub struct RowContraction {
    pub tensor: String,
    /// The column iterator `e` (as the update names it) and its extent.
    pub column: String,
    pub width: i64,
    pub init: Expr,
    pub repair: Expr,
    /// The read of `O` in `repair` (access text).
    pub repair_self: AccessKey,
    /// `p`, the factor per key and row (the A operand, rounded to the
    /// operand type).
    pub weight: Expr,
    pub value: TileOperand,
    /// The program declares the weights in the operand type (a temp of
    /// that dtype, or a cast to it): each weight is rounded once into the
    /// value product, as the program says (FlashAttention's numerics). A
    /// weight declared wider is the sum of its rounding and its rounded
    /// remainder, two products on the tensor cores, so that it keeps the
    /// precision the program declares (spec, "Numerics": a value may be
    /// kept wider than declared, never narrower).
    pub rounded_once: bool,
    /// Each key tile's value products are summed from zero and added to
    /// the accumulators in IEEE f32, instead of chained onto them in the
    /// tensor cores, whose f32 sums are truncated (see
    /// `contraction::Accumulation`): where an epilogue statement stores a
    /// value computed from the contraction as f32 or f64
    /// ([`Attention::with_promotion`]). An f16 store carries its own
    /// rounding, far above the truncations'.
    pub promoted: bool,
}

/// One shared buffer of an attention block (see
/// [`Attention::shared_layout`]): `stages` stages of `stage_len` 16-bit
/// elements from element `start` of the block's dynamic shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedBuffer {
    /// The kernel's pointer to it.
    pub name: String,
    pub start: i64,
    pub stages: i64,
    pub stage_len: i64,
}

impl SharedBuffer {
    /// The element after its last stage.
    pub fn end(&self) -> i64 {
        self.start + self.stages * self.stage_len
    }
}

/// The shared buffers of an attention block, in the order they are laid
/// out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedBuffers {
    pub query: SharedBuffer,
    pub keys: SharedBuffer,
    /// One per value operand (`Attention::contractions`).
    pub values: Vec<SharedBuffer>,
    /// Bytes the dynamic shared memory is aligned to.
    pub align: usize,
}

impl SharedBuffers {
    /// Every buffer, in order.
    pub fn all(&self) -> impl Iterator<Item = &SharedBuffer> {
        [&self.query, &self.keys].into_iter().chain(&self.values)
    }

    /// The element after the last buffer.
    pub fn end(&self) -> i64 {
        self.all().map(SharedBuffer::end).max().unwrap_or(0)
    }
}

/// A recognised attention kernel.
#[derive(Debug, Clone)]
pub struct Attention {
    /// Batch iterators and their extents (one block row per combination).
    pub batch: Vec<(String, i64)>,
    pub row: String,
    pub key: String,
    pub rows: i64,
    pub keys: i64,
    /// Score reduction depth `D` (a multiple of 16).
    pub depth: i64,
    pub dtype: DType,
    /// The score tensor `P` and the operands of its contraction.
    pub score: String,
    pub query: TileOperand,
    pub key_operand: TileOperand,
    /// Maps over `(bt, i, j)` in program order: (tensor, right side).
    pub maps: Vec<(String, Expr)>,
    /// The predecessor `M`, its cache, reducer, initial value and the body
    /// it reduces.
    pub pred: String,
    pub cache: String,
    pub reducer: Reducer,
    pub pred_init: Expr,
    pub pred_body: Expr,
    /// Access texts of the predecessor: as the terms, the weights and the
    /// body read it (its new value in a tile's step), and as the repairs
    /// read its old and its new value.
    pub pred_term: AccessKey,
    pub repair_old: AccessKey,
    pub repair_new: AccessKey,
    pub sums: Vec<RowSum>,
    pub contractions: Vec<RowContraction>,
    /// Epilogue statements (program positions), over `(bt, i)` or
    /// `(bt, i, e)`.
    pub epilogue: Vec<usize>,
    /// Conditions as expressions in the batch iterators, `pf_i0`, `pf_j0`
    /// (a tile's first row and key), and `pf_ei`, `pf_ej` (an element's
    /// row and key): the key tiles a block visits, a tile wholly inside
    /// the domain, an element inside it.
    pub key_tiles: KeyTiles,
    pub full_tile: AstExpr,
    pub element: AstExpr,
    /// A split-k form (`gpu::decoding`): the kernel computes the slices'
    /// local states, a second kernel their combination and the epilogue.
    pub split: Option<Split>,
}

/// The key tiles a block visits, as expressions in the batch iterators
/// and `pf_i0` (the block's first row); `codegen::flash` prints the loop
/// over them.
#[derive(Debug, Clone)]
pub enum KeyTiles {
    /// The tiles from the one holding the block's least key `lo` to the
    /// one holding its greatest `hi`, none where `any` is false. Every
    /// tile between holds an element of the domain for some block, or no
    /// block has a gap in its tiles: nothing is left to skip.
    Range {
        any: AstExpr,
        lo: AstExpr,
        hi: AstExpr,
    },
    /// Two or more runs of consecutive tiles, ascending and apart; the
    /// tiles between them hold no element of the domain for the block's
    /// rows, which isl proved ([`key_runs`]): a window with global
    /// columns (BigBird) visits the global tiles and the window's, not
    /// the dense range from key 0 to the window's end.
    Runs(Vec<KeyRun>),
}

/// One run of a block's key tiles: tile indices (key / [`BLOCK_KEYS`])
/// `first ..= last`, where `any` holds (else the run is empty).
#[derive(Debug, Clone)]
pub struct KeyRun {
    pub any: AstExpr,
    pub first: AstExpr,
    pub last: AstExpr,
}

/// The conditions of a tiled loop ([`tile_conditions`]): see the fields
/// of the same names in [`Attention`].
pub(super) struct TileConditions {
    pub key_tiles: KeyTiles,
    pub full_tile: AstExpr,
    pub element: AstExpr,
}

/// Runs past which a block's key tiles are visited as one range (each
/// run costs a few registers and a comparison a tile).
pub const MAX_KEY_RUNS: usize = 4;

/// A map of an attention that scales the scores by a constant (see
/// [`Attention::score_scale`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreScale {
    /// The map's position in `Attention::maps`.
    pub map: usize,
    /// The constant `c` of `P * c`.
    pub factor: f64,
    /// The map's element as the terms read it (`model::AccessKey`).
    pub scaled: AccessKey,
    /// The predecessor reduces the map by a maximum (or minimum): the
    /// scaling moves out of its per-element loop.
    pub folded: bool,
}

/// The split-k form of an attention (`repair::splitk`): the keys in
/// `slices` slices of `len`, `j = len * s + u`; local states per slice,
/// combined over `s` by the rewrite's repaired combination (Eq. 8).
#[derive(Debug, Clone)]
pub struct Split {
    /// The slice iterator `s`, and `u` (as the local statements name them).
    pub slice: String,
    pub within: String,
    pub slices: i64,
    pub len: i64,
    /// Program positions of the local statements: the predecessor's, the
    /// row sums' and the contractions' (in the order of `sums` and
    /// `contractions`).
    pub pred_local: usize,
    pub sum_locals: Vec<usize>,
    pub con_locals: Vec<usize>,
    /// Program positions of the combination: the global predecessor
    /// `M(bt, i) fr=! M_l(bt, i, s)` and each target's
    /// `X(..) +=! H(X_l(.., s); M_l, M)`, in the same orders.
    pub pred_global: usize,
    pub sum_globals: Vec<usize>,
    pub con_globals: Vec<usize>,
}

impl Split {
    /// Program positions of the local statements (the first kernel's).
    pub fn locals(&self) -> Vec<usize> {
        std::iter::once(self.pred_local)
            .chain(self.sum_locals.iter().copied())
            .chain(self.con_locals.iter().copied())
            .collect()
    }
    /// Program positions of the global combinations (the second kernel's).
    pub fn globals(&self) -> Vec<usize> {
        std::iter::once(self.pred_global)
            .chain(self.sum_globals.iter().copied())
            .chain(self.con_globals.iter().copied())
            .collect()
    }
}

impl Attention {
    /// Each contraction promoted ([`RowContraction::promoted`]) where the
    /// epilogue stores a value computed from it as f32 or f64: following
    /// the epilogue's statements in order, a statement that reads the
    /// contraction's tensor, or a tensor an earlier one computed from it,
    /// computes from it too. The accumulators leave the kernel through the
    /// epilogue only (a split's partial states are the kernel's own, kept
    /// in f32 and summed in f32 before the epilogue).
    pub fn with_promotion(mut self, program: &Program) -> Self {
        let statements: Vec<&crate::frontend::ast::Statement> = self
            .epilogue
            .iter()
            .filter_map(|p| program.statements.get(*p))
            .collect();
        for x in &mut self.contractions {
            let mut from = vec![x.tensor.clone()];
            for st in &statements {
                let mut reads = Vec::new();
                crate::frontend::ast::collect_reads(&st.rhs, &mut reads);
                if reads.iter().any(|(t, _)| from.contains(t)) {
                    let wide = program
                        .tensor(&st.lhs_tensor)
                        .is_some_and(|t| matches!(t.dtype, DType::F32 | DType::F64));
                    x.promoted |= wide;
                    from.push(st.lhs_tensor.clone());
                }
            }
        }
        self
    }

    /// Query rows of a block.
    pub fn block_rows(&self) -> i64 {
        if self.split.is_some() {
            SPLIT_ROWS
        } else {
            prefill_block_rows(self.depth, &self.contractions)
        }
    }
    /// Keys of a key tile one warp computes on.
    pub fn warp_keys(&self) -> i64 {
        if self.split.is_some() {
            SPLIT_WARP_KEYS
        } else {
            BLOCK_KEYS
        }
    }
    /// Tiles of rows.
    pub fn row_tiles(&self) -> i64 {
        (self.rows + self.block_rows() - 1) / self.block_rows()
    }
    /// Blocks along the grid's x: row tiles, times slices in a split.
    pub fn grid_x(&self) -> i64 {
        self.row_tiles() * self.split.as_ref().map_or(1, |s| s.slices)
    }
    /// The first map that scales the scores by a positive constant,
    /// `X(.., i, j) = P(.., i, j) * c` (or `c * P`, or `P / c`), which the
    /// terms read as one multiply-add of the score; folded out of the
    /// predecessor's reduction where that is a maximum (or minimum) of the
    /// map: `c > 0` times the maximum of the scores, since rounding is
    /// monotone, `max_j fl(c s_j) = fl(c max_j s_j)` exactly (for `s / c`,
    /// within one rounding: the repair needs no exact maximum, only the
    /// same value in the terms and the factors).
    pub fn score_scale(&self) -> Option<ScoreScale> {
        let mut element: Vec<Affine> = self.batch.iter().map(|(b, _)| Affine::var(b)).collect();
        element.push(Affine::var(&self.row));
        element.push(Affine::var(&self.key));
        let score = AccessKey::new(&self.score, &element);
        let is_score = |e: &Expr| AccessKey::of_read(e).as_ref() == Some(&score);
        let constant = |e: &Expr| match e.kind {
            ExprKind::Number(v) if v.is_finite() && v > 0.0 => Some(v),
            _ => None,
        };
        let (map, factor) = self.maps.iter().enumerate().find_map(|(k, (_, rhs))| {
            let c = match &rhs.kind {
                ExprKind::Binary(BinOp::Mul, x, y) if is_score(x) => constant(y),
                ExprKind::Binary(BinOp::Mul, x, y) if is_score(y) => constant(x),
                ExprKind::Binary(BinOp::Div, x, y) if is_score(x) => constant(y).map(|c| 1.0 / c),
                _ => None,
            }?;
            Some((k, c))
        })?;
        let scaled = AccessKey::new(&self.maps[map].0, &element);
        let folded = matches!(self.reducer, Reducer::Max | Reducer::Min)
            && AccessKey::of_read(&self.pred_body).as_ref() == Some(&scaled);
        Some(ScoreScale {
            map,
            factor,
            scaled,
            folded,
        })
    }
    /// Combinations of batch values.
    pub fn batches(&self) -> i64 {
        self.batch.iter().map(|(_, e)| *e).product()
    }
    /// Blocks along z of a split attention's second kernel: a warp a
    /// column of the widest contraction.
    pub fn combine_column_blocks(&self) -> i64 {
        let width = self.contractions.iter().map(|c| c.width).max().unwrap_or(1);
        (width + COMBINE_WARPS - 1) / COMBINE_WARPS
    }
    /// Blocks per multiprocessor the kernel's registers are limited for:
    /// four (128 registers a thread) where the depth and the widths are at
    /// most 64 (H100, D = 64, `mma.sync`: 155 registers without the limit,
    /// 128 and 20 bytes of spills with it; global prefill 1620 -> 1589 us,
    /// causal 892 -> 870 us; `wgmma`: 118 registers, and five blocks (96
    /// registers, 16 bytes of spills) were no faster: 948-950 against
    /// 945-952 us), else no limit.
    pub fn min_blocks(&self) -> u32 {
        if self.depth <= 64 && self.contractions.iter().all(|c| c.width <= 64) {
            // The same 128 registers a thread.
            (4 * THREADS / self.threads()).max(1)
        } else {
            1
        }
    }
    /// Whether every tile a block visits is wholly inside the domain: the
    /// whole-tile test, simplified under the visited tiles
    /// ([`tile_conditions`]), is the constant 1, so the kernel needs no
    /// step with element tests.
    pub fn every_tile_whole(&self) -> bool {
        matches!(self.full_tile, AstExpr::Int(1))
    }
    /// Whether the kernel has a `wgmma` path (sm_90a; `mma.sync` on other
    /// devices): prefill (a split kernel's warps share rows, not keys),
    /// the depth and every value width in whole 128-byte swizzle atoms (64
    /// elements), the widths within one instruction's n (256). The warps'
    /// row tiles are then one warpgroup's 64 rows, and the accumulator
    /// layout of `wgmma.m64nN` is that of the `mma.sync` fragments the
    /// softmax step works on.
    pub fn wgmma(&self) -> bool {
        self.split.is_none() && wgmma_shape(self.depth, &self.contractions)
    }
    /// Warps of a block: [`WARPS`], or with a `wgmma` path
    /// [`WGMMA_GROUPS`] warpgroups of four.
    pub fn warps(&self) -> i64 {
        if self.wgmma() {
            4 * WGMMA_GROUPS
        } else {
            WARPS
        }
    }
    /// Threads of a block.
    pub fn threads(&self) -> u32 {
        32 * self.warps() as u32
    }
    /// Elements of a shared row of width `w`: padded by 16 bytes (which
    /// keeps rows 16-byte aligned and spreads the eight rows an `ldmatrix`
    /// reads over all banks), or, with a `wgmma` path, unpadded in atoms of
    /// 64 elements in the 128-byte swizzle (`codegen::flash`, `Emit::tile_at`).
    pub fn pitch(&self, w: i64) -> i64 {
        if self.wgmma() {
            w
        } else {
            w + 8
        }
    }
    /// Stages of the key and value tiles: copies of the next tiles in
    /// flight while the block computes on the current ones. A split kernel
    /// (decoding) only streams the keys and values, so it keeps two tiles
    /// in flight, three stages; prefill computes enough per tile that two
    /// stages hide the copies (and leave shared memory for four blocks a
    /// multiprocessor at D = 64).
    pub fn stages(&self) -> i64 {
        if self.split.is_some() {
            3
        } else {
            2
        }
    }
    /// The shared buffers of a block, one after the other in its dynamic
    /// shared memory: the query tile, [`Self::stages`] stages of the key
    /// tile and of each value operand's tile (in that order, the values
    /// as [`Self::contractions`]). The kernel's pointers, its stages and its
    /// launch size all come from here (and the emulation lays the buffers
    /// out in one array the same way).
    pub fn shared_layout(&self) -> SharedBuffers {
        let mut start = 0;
        let mut buffer = |name: String, stages: i64, rows: i64, width: i64| {
            let b = SharedBuffer {
                name,
                start,
                stages,
                stage_len: rows * self.pitch(width),
            };
            start = b.end();
            b
        };
        let query = buffer("pf_fa_q".into(), 1, self.block_rows(), self.depth);
        let keys = buffer("pf_fa_k".into(), self.stages(), BLOCK_KEYS, self.depth);
        let values = self
            .contractions
            .iter()
            .enumerate()
            .map(|(k, c)| buffer(format!("pf_fa_v{k}"), self.stages(), BLOCK_KEYS, c.width))
            .collect();
        SharedBuffers {
            query,
            keys,
            values,
            // The swizzle's XOR takes the line from address bits 7-9.
            align: if self.wgmma() { 1024 } else { 128 },
        }
    }
    /// Bytes of shared memory a block takes (see [`Self::shared_layout`]);
    /// a split kernel's merge of its warps' states reuses them after the
    /// loop (see [`Self::merge_floats`]).
    pub fn shared_bytes(&self) -> usize {
        let tiles = self.shared_layout().end() * 2;
        tiles.max(self.merge_floats() * 4) as usize
    }
    /// f32 values of a split kernel's merge buffer: [`Self::merge_row_floats`]
    /// for each warp and row of the block.
    pub fn merge_floats(&self) -> i64 {
        if self.split.is_none() {
            return 0;
        }
        WARPS * SPLIT_ROWS * self.merge_row_floats()
    }
    /// f32 values of one warp's row in the merge buffer: the predecessor,
    /// each row sum and each contraction's columns.
    pub fn merge_row_floats(&self) -> i64 {
        1 + self.sums.len() as i64 + self.contractions.iter().map(|c| c.width).sum::<i64>()
    }
}

pub(super) fn var_list(names: &[String]) -> Vec<Affine> {
    names.iter().map(|n| Affine::var(n)).collect()
}

/// The reads of `e` (tensor, subscripts).
pub(super) fn reads(e: &Expr) -> Vec<(String, Vec<Affine>)> {
    let mut v = Vec::new();
    collect_reads(e, &mut v);
    v
}

/// `e` without the casts around it that the tensor-core paths may drop (a
/// widening of their f16 or bf16 operands). A cast to u8, bool, i64 or an
/// 8-bit float changes the value (`f32(f8e4m3(A(i, k)))` quantises an f16
/// `A`): it stays, so the operand is not a plain read and the statement
/// keeps the ordinary path.
pub(super) fn uncast(e: &Expr) -> &Expr {
    match &e.kind {
        ExprKind::Cast(t, inner) if !t.needs_extra_helpers() => uncast(inner),
        _ => e,
    }
}

/// Whether the weight `w` is declared in `dtype`: a cast to it, or a read
/// of a tensor of that dtype, under any casts that widen it again (`f32(E)`
/// of an f16 `E` is still a value of f16's precision).
pub(super) fn declared_in(program: &Program, w: &Expr, dtype: DType) -> bool {
    match &w.kind {
        ExprKind::Cast(t, _) if *t == dtype => true,
        ExprKind::Cast(DType::F32 | DType::F64, inner) => declared_in(program, inner, dtype),
        ExprKind::Access { tensor, .. } => program.tensor(tensor).is_some_and(|t| t.dtype == dtype),
        _ => false,
    }
}

fn mentions_index(e: &Expr, name: &str) -> bool {
    match &e.kind {
        ExprKind::Index(n) => n == name,
        ExprKind::Access { subscripts, .. } => subscripts.iter().any(|s| s.coeff(name) != 0),
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => mentions_index(a, name),
        ExprKind::Binary(_, a, b) => mentions_index(a, name) || mentions_index(b, name),
        ExprKind::Select(c, a, b) => {
            mentions_index(c, name) || mentions_index(a, name) || mentions_index(b, name)
        }
        ExprKind::Call(_, args) => args.iter().any(|a| mentions_index(a, name)),
        _ => false,
    }
}

/// An operand `X(..)` of a tile copy: its last subscript is exactly `col`,
/// one other subscript exactly `row`, the rest use only `batch`.
fn tile_operand(
    program: &Program,
    tensor: &str,
    subs: &[Affine],
    row: &str,
    col: &str,
    batch: &[String],
) -> Option<TileOperand> {
    let t = program.tensor(tensor)?;
    if !matches!(t.dtype, DType::F16 | DType::BF16) || subs.is_empty() {
        return None;
    }
    let last = subs.len() - 1;
    if subs[last] != Affine::var(col) {
        return None;
    }
    let mut row_dim = None;
    for (k, s) in subs.iter().enumerate().take(last) {
        if *s == Affine::var(row) {
            if row_dim.is_some() {
                return None;
            }
            row_dim = Some(k);
        } else if s
            .names()
            .any(|n| !batch.iter().any(|b| b == n) && !program.is_param(n))
        {
            return None;
        }
    }
    let shape = t.shape.as_ref()?;
    let rows = program.evaluate(&shape[row_dim?])?;
    Some(TileOperand {
        tensor: tensor.to_string(),
        subscripts: subs.to_vec(),
        row: row.to_string(),
        col: col.to_string(),
        rows,
        dtype: t.dtype,
    })
}

/// Whether there is a contraction and each column name stands for one
/// width (the epilogue's elements are laid out by the column).
pub(super) fn one_width_a_column(contractions: &[RowContraction]) -> bool {
    !contractions.is_empty()
        && contractions.iter().all(|c| {
            contractions
                .iter()
                .all(|o| o.column != c.column || o.width == c.width)
        })
}

/// The two operands of a score contraction `P(.., i, j) +=! A(.., i, d) *
/// B(.., j, d)` (casts allowed, the factors in either order) as tiles:
/// the query, whose rows are `row`, and the key operand, whose rows are
/// `key`, both along the contraction's one reduction iterator `d` and of
/// one 16-bit dtype.
pub(super) fn score_operands(
    program: &Program,
    score: &Statement,
    row: &str,
    key: &str,
    batch: &[String],
) -> Option<(TileOperand, TileOperand)> {
    let [depth] = score.reduction_indices.as_slice() else {
        return None;
    };
    let ExprKind::Binary(BinOp::Mul, x, y) = &uncast(&score.rhs).kind else {
        return None;
    };
    let (
        ExprKind::Access {
            tensor: xt,
            subscripts: xs,
        },
        ExprKind::Access {
            tensor: yt,
            subscripts: ys,
        },
    ) = (&uncast(x).kind, &uncast(y).kind)
    else {
        return None;
    };
    let operands = |a: (&String, &Vec<Affine>), b: (&String, &Vec<Affine>)| {
        Some((
            tile_operand(program, a.0, a.1, row, depth, batch)?,
            tile_operand(program, b.0, b.1, key, depth, batch)?,
        ))
    };
    let (query, key_operand) =
        operands((xt, xs), (yt, ys)).or_else(|| operands((yt, ys), (xt, xs)))?;
    (query.dtype == key_operand.dtype).then_some((query, key_operand))
}

/// A repaired target in one of the kernel's two forms.
pub(super) enum TargetForm {
    Sum(RowSum),
    Contraction(RowContraction),
}

/// The iterators' roles, as the predecessor's update names them, and
/// what the targets must agree with.
pub(super) struct Roles<'a> {
    pub(super) program: &'a Program,
    pub(super) batch: &'a [String],
    /// `bt` then `i`: a row.
    pub(super) row_idx: &'a [String],
    pub(super) key: &'a str,
    pub(super) keys: i64,
    pub(super) dtype: DType,
}

/// Program positions of the statements that write `t`.
pub(super) fn writes(program: &Program, t: &str) -> Vec<usize> {
    program
        .statements
        .iter()
        .enumerate()
        .filter(|(_, s)| s.lhs_tensor == t)
        .map(|(k, _)| k)
        .collect()
}

impl Roles<'_> {
    /// A contraction's term `p * V(.., j, e)` as the weight `p` (not
    /// depending on `e`) and the value operand (f16 or bf16 like the
    /// score's, `keys` rows along the key, last subscript `e`).
    pub(super) fn value_product(&self, term: &Expr, column: &str) -> Option<(Expr, TileOperand)> {
        let ExprKind::Binary(BinOp::Mul, a, b) = &term.kind else {
            return None;
        };
        let split = |w: &Expr, v: &Expr| -> Option<(Expr, TileOperand)> {
            let ExprKind::Access { tensor, subscripts } = &uncast(v).kind else {
                return None;
            };
            if mentions_index(w, column) {
                return None;
            }
            let op = tile_operand(
                self.program,
                tensor,
                subscripts,
                self.key,
                column,
                self.batch,
            )?;
            (op.rows == self.keys && op.dtype == self.dtype).then(|| (w.clone(), op))
        };
        split(a, b).or_else(|| split(b, a))
    }

    /// The extent of dimension `dim` of contraction target `tensor`, the
    /// width of its columns: a multiple of 16 up to 256.
    pub(super) fn column_width(&self, tensor: &str, dim: usize) -> Option<i64> {
        let shape = self.program.tensor(tensor)?.shape.as_ref()?;
        let width = self.program.evaluate(shape.get(dim)?)?;
        (width % 16 == 0 && width <= 256).then_some(width)
    }

    /// Target `t` of the rolling update: its update `X = H(X) + g` along
    /// the key and its initialisation (positions), in the form of a row
    /// sum (`X(bt, i)`, `g` an element's term) or of a contraction
    /// (`X(bt, i, e)`, `g = p * V(.., j, e)`); `None` for any other.
    fn target(&self, t: &RollingTarget) -> Option<(TargetForm, usize, usize)> {
        let sts = &self.program.statements;
        if t.reducer != Reducer::Sum {
            return None;
        }
        let tw = writes(self.program, &t.tensor);
        let u = tw
            .iter()
            .copied()
            .find(|&k| sts[k].reduction_indices == [self.key.to_string()])?;
        let n = tw
            .iter()
            .copied()
            .find(|&k| sts[k].reduction_indices.is_empty())?;
        if tw.len() != 2 || sts[u].op != AssignOp::Assign || sts[n].op != AssignOp::Assign {
            return None;
        }
        let ExprKind::Binary(BinOp::Add, a, b) = &sts[u].rhs.kind else {
            return None;
        };
        let term = if **a == t.repair {
            (**b).clone()
        } else if **b == t.repair {
            (**a).clone()
        } else {
            return None;
        };
        let init = sts[n].rhs.clone();
        if !reads(&init).is_empty() || sts[n].lhs_indices != sts[u].lhs_indices {
            return None;
        }
        let lhs = &sts[u].lhs_indices;
        let rows = self.row_idx.len();
        if lhs[..] == self.row_idx[..] {
            let form = TargetForm::Sum(RowSum {
                tensor: t.tensor.clone(),
                init,
                repair: t.repair.clone(),
                repair_self: AccessKey::new(&t.tensor, &var_list(lhs)),
                term,
            });
            return Some((form, u, n));
        }
        if lhs.len() != rows + 1 || lhs[..rows] != self.row_idx[..] {
            return None;
        }
        let column = lhs[rows].clone();
        let (weight, value) = self.value_product(&term, &column)?;
        let width = self.column_width(&t.tensor, rows)?;
        let rounded_once = declared_in(self.program, &weight, self.dtype);
        let form = TargetForm::Contraction(RowContraction {
            tensor: t.tensor.clone(),
            column,
            width,
            init,
            repair: t.repair.clone(),
            repair_self: AccessKey::new(&t.tensor, &var_list(lhs)),
            weight,
            value,
            rounded_once,
            promoted: false,
        });
        Some((form, u, n))
    }
}

/// The iterators' roles in a row kernel, as the statement that fixes them
/// names them (the rolling predecessor's update, or a split kernel's
/// global predecessor and score): `bt` the batch iterators, `i` the row,
/// `j` the key. A row is `(bt, i)`, an element `(bt, i, j)`; every other
/// statement must use the same names (the kernel is printed in them).
pub(super) struct RowShape {
    pub(super) batch: Vec<String>,
    pub(super) row: String,
    pub(super) key: String,
    /// `bt` then `i`.
    pub(super) row_idx: Vec<String>,
    /// `bt`, `i` then `j`.
    pub(super) elem_idx: Vec<String>,
}

impl RowShape {
    /// The roles of `row_idx` (`bt` then `i`, at least the row) and `key`.
    pub(super) fn new(row_idx: &[String], key: &str) -> Option<RowShape> {
        let (row, batch) = row_idx.split_last()?;
        let mut elem_idx = row_idx.to_vec();
        elem_idx.push(key.to_string());
        Some(RowShape {
            batch: batch.to_vec(),
            row: row.clone(),
            key: key.to_string(),
            row_idx: row_idx.to_vec(),
            elem_idx,
        })
    }
    /// `(bt, i)` as subscripts.
    pub(super) fn row_subs(&self) -> Vec<Affine> {
        var_list(&self.row_idx)
    }
    /// `(bt, i, j)` as subscripts.
    pub(super) fn elem_subs(&self) -> Vec<Affine> {
        var_list(&self.elem_idx)
    }
    /// Whether a statement over `lhs` is over a row's elements the kernel
    /// holds: `(bt, i)`, or `(bt, i, e)` with `e` a contraction's column.
    fn over_row(&self, lhs: &[String], contractions: &[RowContraction]) -> bool {
        let n = self.row_idx.len();
        lhs == self.row_idx
            || contractions
                .iter()
                .any(|c| lhs.len() == n + 1 && lhs[..n] == self.row_idx[..] && lhs[n] == c.column)
    }
}

/// The score contraction of a row kernel: its program position, its
/// tensor `P` and its two operands as tiles.
pub(super) struct Score {
    pub(super) statement: usize,
    pub(super) tensor: String,
    pub(super) query: TileOperand,
    pub(super) key_operand: TileOperand,
}

impl Score {
    /// The score statement at `position` with its operands ([`score_operands`]).
    pub(super) fn at(program: &Program, position: usize, shape: &RowShape) -> Option<Score> {
        let st = &program.statements[position];
        let (query, key_operand) =
            score_operands(program, st, &shape.row, &shape.key, &shape.batch)?;
        Some(Score {
            statement: position,
            tensor: st.lhs_tensor.clone(),
            query,
            key_operand,
        })
    }
}

/// The extents of a row kernel, all known at compile time.
pub(super) struct Extents {
    /// Batch iterators and their extents.
    pub(super) batch: Vec<(String, i64)>,
    pub(super) rows: i64,
    pub(super) keys: i64,
    /// The score's reduction depth `D`.
    pub(super) depth: i64,
}

/// The extent of dimension `dim` of tensor `t`, where it is known at
/// compile time.
pub(super) fn dim_extent(program: &Program, t: &str, dim: usize) -> Option<i64> {
    program.evaluate(program.tensor(t)?.shape.as_ref()?.get(dim)?)
}

/// The kernel's extents: the batch's and the rows' from `row_state`, a
/// tensor over `(bt, i)`, the keys' from the score `P(bt, i, j)`, the
/// depth from the query's last dimension; `None` where one is unknown at
/// compile time (the tiles, the grid and the shared buffers are sized by
/// them). The depth must be whole `mma` k steps (16) within 256 (the
/// query tile and its fragments are held whole), and the operands must
/// have exactly the kernel's rows and keys: a tile row past a tensor's
/// rows is zero-filled, one inside it is read.
pub(super) fn extents(
    program: &Program,
    shape: &RowShape,
    row_state: &str,
    score: &Score,
) -> Option<Extents> {
    let batch = shape
        .batch
        .iter()
        .enumerate()
        .map(|(k, b)| Some((b.clone(), dim_extent(program, row_state, k)?)))
        .collect::<Option<Vec<_>>>()?;
    let rows = dim_extent(program, row_state, shape.batch.len())?;
    let keys = dim_extent(program, &score.tensor, shape.batch.len() + 1)?;
    let depth = program
        .tensor(&score.query.tensor)
        .and_then(|t| program.evaluate(t.shape.as_ref()?.last()?))?;
    if depth % 16 != 0 || depth > 256 || score.query.rows != rows || score.key_operand.rows != keys
    {
        return None;
    }
    Some(Extents {
        batch,
        rows,
        keys,
        depth,
    })
}

/// A row kernel's repaired targets, in program order of their forms.
#[derive(Default)]
pub(super) struct Targets {
    pub(super) sums: Vec<RowSum>,
    pub(super) contractions: Vec<RowContraction>,
}

impl Targets {
    /// Adds a target in its form.
    pub(super) fn push(&mut self, form: TargetForm) {
        match form {
            TargetForm::Sum(x) => self.sums.push(x),
            TargetForm::Contraction(x) => self.contractions.push(x),
        }
    }
    /// The targets' tensors: the row sums', then the contractions'.
    pub(super) fn tensors(&self) -> impl Iterator<Item = &String> {
        self.sums
            .iter()
            .map(|s| &s.tensor)
            .chain(self.contractions.iter().map(|c| &c.tensor))
    }
}

/// The statements of a row kernel around its reductions.
pub(super) struct Surroundings {
    /// The tensors over `(bt, i, j)` the step computes: the score, then the
    /// maps'.
    pub(super) elementwise: Vec<String>,
    /// Maps over `(bt, i, j)` in program order: (tensor, right side).
    pub(super) maps: Vec<(String, Expr)>,
    /// Epilogue statements (program positions).
    pub(super) epilogue: Vec<usize>,
}

/// A row kernel whose reductions' roles are known: what the rest of its
/// statements are checked against.
pub(super) struct RowKernel<'a> {
    pub(super) program: &'a Program,
    pub(super) shape: &'a RowShape,
    /// The score tensor `P`.
    pub(super) score: &'a str,
    /// The predecessor `M(bt, i)` (a split kernel's global one).
    pub(super) pred: &'a str,
    pub(super) targets: &'a Targets,
}

impl RowKernel<'_> {
    /// Whether `t` is written by a statement of the program (and is then
    /// one of the kernel's registers or shared tiles, not memory).
    fn written_here(&self, t: &str) -> bool {
        self.program.statements.iter().any(|o| o.lhs_tensor == t)
    }

    /// The statements no role took (`used`), in program order, as maps and
    /// the epilogue; `None` where one is neither. A map `X(bt, i, j) =
    /// f(..)` (before position `maps_before`, where given) reads the score
    /// and earlier maps at its own element only, no other tensor the
    /// program writes, and writes a tensor of its own: the step computes it
    /// per element from what it holds. An epilogue statement, after every
    /// used one, over `(bt, i)` or `(bt, i, e)`, reads the row states
    /// `held` only where the kernel holds them ([`Self::held_read_ok`]),
    /// no other tensor the program writes, and writes a tensor of its own
    /// that is none of them: the kernel runs it on its registers after the
    /// loop.
    pub(super) fn surroundings(
        &self,
        used: &[usize],
        maps_before: Option<usize>,
        held: &[String],
    ) -> Option<Surroundings> {
        let elem_subs = self.shape.elem_subs();
        let mut elementwise = vec![self.score.to_string()];
        let (mut maps, mut epilogue) = (Vec::new(), Vec::new());
        let last_used = used.iter().copied().max().unwrap_or(0);
        let one_writer = |t: &str| writes(self.program, t).len() == 1;
        for (position, s) in self.program.statements.iter().enumerate() {
            if used.contains(&position) {
                continue;
            }
            if s.op != AssignOp::Assign || !s.reduction_indices.is_empty() {
                return None;
            }
            if s.lhs_indices == self.shape.elem_idx && maps_before.is_none_or(|p| position < p) {
                let reads_ok = reads(&s.rhs).iter().all(|(t, subs)| {
                    if elementwise.contains(t) {
                        *subs == elem_subs
                    } else {
                        !self.written_here(t)
                    }
                });
                if !reads_ok || !one_writer(&s.lhs_tensor) {
                    return None;
                }
                elementwise.push(s.lhs_tensor.clone());
                maps.push((s.lhs_tensor.clone(), s.rhs.clone()));
            } else if position > last_used
                && self
                    .shape
                    .over_row(&s.lhs_indices, &self.targets.contractions)
            {
                let reads_ok = reads(&s.rhs).iter().all(|(t, subs)| {
                    if held.contains(t) {
                        self.held_read_ok(&s.lhs_indices, t, subs)
                    } else {
                        !self.written_here(t)
                    }
                });
                if !reads_ok || !one_writer(&s.lhs_tensor) || held.contains(&s.lhs_tensor) {
                    return None;
                }
                epilogue.push(position);
            } else {
                return None;
            }
        }
        Some(Surroundings {
            elementwise,
            maps,
            epilogue,
        })
    }

    /// Whether an epilogue statement over `lhs` may read row state `t` at
    /// `subs`: the predecessor and a row sum at the row; a contraction
    /// target at the statement's own column (the kernel holds it by that
    /// column). Any other held state (a cache) is refused.
    fn held_read_ok(&self, lhs: &[String], t: &str, subs: &[Affine]) -> bool {
        if self.targets.sums.iter().any(|x| x.tensor == t) || t == self.pred {
            subs == self.shape.row_subs()
        } else {
            subs == var_list(lhs)
                && self
                    .targets
                    .contractions
                    .iter()
                    .any(|c| c.tensor == t && lhs.last() == Some(&c.column))
        }
    }

    /// Whether what a tile's step evaluates per element besides the maps
    /// (the predecessor's `body`, the row sums' terms, the contractions'
    /// weights) reads the `elementwise` tensors at the element, the
    /// predecessor's state `state` at `state_subs` (where the step holds
    /// it: the row, or a split kernel's cell), and no other tensor the
    /// program writes.
    pub(super) fn step_reads_ok(
        &self,
        elementwise: &[String],
        (state, state_subs): (&str, &[Affine]),
        body: &Expr,
    ) -> bool {
        let elem_subs = self.shape.elem_subs();
        let reads_ok = |e: &Expr| -> bool {
            reads(e).iter().all(|(t, subs)| {
                if elementwise.contains(t) {
                    *subs == elem_subs
                } else if t == state {
                    subs == state_subs
                } else {
                    !self.written_here(t)
                }
            })
        };
        reads_ok(body)
            && self.targets.sums.iter().all(|s| reads_ok(&s.term))
            && self
                .targets
                .contractions
                .iter()
                .all(|c| reads_ok(&c.weight))
    }
}

/// Whether every tensor of `held` is an f32 temp: the states the kernels
/// keep in registers or shared memory never reach memory, so the program
/// must not expect them there, and they are computed in f32.
pub(super) fn f32_temps<'t>(program: &Program, held: impl IntoIterator<Item = &'t String>) -> bool {
    held.into_iter().all(|t| {
        program
            .tensor(t)
            .is_some_and(|x| x.role == TensorRole::Temp && x.dtype == DType::F32)
    })
}

/// The rolling predecessor's statements and the roles they fix.
struct PredStatements {
    /// Program positions of its update, initialisation and cache.
    update: usize,
    init: usize,
    cache: usize,
    shape: RowShape,
    /// `body` in the update `M = fr(M, body)`.
    body: Expr,
    /// The initialisation's right side.
    init_value: Expr,
}

/// The statements of the rolling predecessor `pred` (a max or min `fr`):
/// `M` written twice, by an update `M(bt, i) = fr(M(bt, i), body)` with
/// one reduction index, the key `j` (`M`'s read on either side), and by an
/// initialisation at `(bt, i)` that reads nothing; its cache written once,
/// `Mp(bt, i) = M(bt, i)`. The update's indices name every role: the
/// tiled loop runs along them.
fn rolling_pred(program: &Program, pred: &RollingPred) -> Option<PredStatements> {
    if !matches!(pred.reducer, Reducer::Max | Reducer::Min) {
        return None;
    }
    let sts = &program.statements;
    let pw = writes(program, &pred.tensor);
    let &update = pw
        .iter()
        .find(|&&k| sts[k].reduction_indices.len() == 1 && sts[k].op == AssignOp::Assign)?;
    let &init = pw
        .iter()
        .find(|&&k| sts[k].reduction_indices.is_empty() && sts[k].op == AssignOp::Assign)?;
    if pw.len() != 2 {
        return None;
    }
    let pst = &sts[update];
    let shape = RowShape::new(&pst.lhs_indices, &pst.reduction_indices[0])?;
    let pred_read = Expr {
        kind: ExprKind::Access {
            tensor: pred.tensor.clone(),
            subscripts: shape.row_subs(),
        },
        ty: pst.rhs.ty,
    };
    let func = if pred.reducer == Reducer::Max {
        Func::Max
    } else {
        Func::Min
    };
    let body = match &pst.rhs.kind {
        ExprKind::Call(f, args) if *f == func && args.len() == 2 => {
            if args[0] == pred_read {
                args[1].clone()
            } else if args[1] == pred_read {
                args[0].clone()
            } else {
                return None;
            }
        }
        _ => return None,
    };
    let init_value = sts[init].rhs.clone();
    if sts[init].lhs_indices != shape.row_idx || !reads(&init_value).is_empty() {
        return None;
    }
    let [cache] = writes(program, &pred.cache)[..] else {
        return None;
    };
    if sts[cache].lhs_indices != shape.row_idx || sts[cache].rhs.kind != pred_read.kind {
        return None;
    }
    Some(PredStatements {
        update,
        init,
        cache,
        shape,
        body,
        init_value,
    })
}

/// The score contraction `P(bt, i, j) +=! A(.., i, d) * B(.., j, d)`: the
/// program's only reduction statement (every other one is the rolling
/// loop's, as assignments), a sum over one index at the element, its
/// operands tiles of one 16-bit dtype ([`score_operands`]).
fn prefill_score(program: &Program, shape: &RowShape) -> Option<Score> {
    let sts = &program.statements;
    let reductions: Vec<usize> = sts
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.op, AssignOp::Reduce { .. }))
        .map(|(k, _)| k)
        .collect();
    let [sc] = reductions[..] else {
        return None;
    };
    let sst = &sts[sc];
    if sst.op
        != (AssignOp::Reduce {
            op: Reducer::Sum,
            init: true,
        })
        || sst.lhs_indices != shape.elem_idx
        || sst.reduction_indices.len() != 1
    {
        return None;
    }
    Score::at(program, sc, shape)
}

/// The rolling targets in their forms ([`Roles::target`]), and the
/// positions of their updates and initialisations; `None` where one has
/// neither form or a column name stands for two widths
/// ([`one_width_a_column`]).
fn rolling_targets(roles: &Roles, targets: &[RollingTarget]) -> Option<(Targets, Vec<usize>)> {
    let mut found = Targets::default();
    let mut positions = Vec::new();
    for t in targets {
        let (form, update, init) = roles.target(t)?;
        found.push(form);
        positions.extend([update, init]);
    }
    one_width_a_column(&found.contractions).then_some((found, positions))
}

/// What a rolling attention's statements say, before the isl checks.
struct RollingForm {
    pred: RollingPred,
    statements: PredStatements,
    score: Score,
    ext: Extents,
    targets: Targets,
    around: Surroundings,
    /// Program positions of the statements with a role: the
    /// predecessor's, the score's and the targets' (the maps and the
    /// epilogue aside).
    used: Vec<usize>,
}

/// The rolling attention of the program's statements, `None` where they
/// are not one: the rolling predecessor fixes the roles of the iterators
/// ([`rolling_pred`]), then the score ([`prefill_score`]), the extents
/// ([`extents`]), the targets ([`rolling_targets`]), the maps and the
/// epilogue ([`RowKernel::surroundings`]) and what the step reads
/// ([`RowKernel::step_reads_ok`]), and the states' types
/// ([`f32_temps`]).
fn rolling_form(program: &Program) -> Option<RollingForm> {
    let rolling = program.rolling.as_ref()?;
    let [pred] = rolling.preds.as_slice() else {
        return None;
    };
    let ps = rolling_pred(program, pred)?;
    let shape = &ps.shape;
    let score = prefill_score(program, shape)?;
    let ext = extents(program, shape, &pred.tensor, &score)?;
    let roles = Roles {
        program,
        batch: &shape.batch,
        row_idx: &shape.row_idx,
        key: &shape.key,
        keys: ext.keys,
        dtype: score.query.dtype,
    };
    let (targets, target_positions) = rolling_targets(&roles, &rolling.targets)?;
    let mut used = vec![ps.update, ps.init, ps.cache, score.statement];
    used.extend(target_positions);
    let kernel = RowKernel {
        program,
        shape,
        score: &score.tensor,
        pred: &pred.tensor,
        targets: &targets,
    };
    let rowwise: Vec<String> = [pred.tensor.clone(), pred.cache.clone()]
        .into_iter()
        .chain(targets.tensors().cloned())
        .collect();
    let around = kernel.surroundings(&used, None, &rowwise)?;
    let row_subs = shape.row_subs();
    if !kernel.step_reads_ok(&around.elementwise, (&pred.tensor, &row_subs), &ps.body)
        || !f32_temps(program, around.elementwise.iter().chain(rowwise.iter()))
    {
        return None;
    }
    Some(RollingForm {
        pred: pred.clone(),
        statements: ps,
        score,
        ext,
        targets,
        around,
        used,
    })
}

impl RollingForm {
    /// The row extent a block's padding rows may be ignored past
    /// ([`padding_rows`]).
    fn padding(&self, program: &Program) -> Option<i64> {
        let evaluated = step_expressions(
            &self.around.maps,
            &self.statements.body,
            &self.targets.sums,
            &self.targets.contractions,
        );
        padding_rows(
            program,
            &self.statements.shape.row,
            self.ext.rows,
            &evaluated,
        )
    }

    /// The kernel, with the tiled loop's `conditions` ([`tile_conditions`]).
    fn plan(self, conditions: TileConditions) -> Attention {
        let TileConditions {
            key_tiles,
            full_tile,
            element,
        } = conditions;
        let (pred, ps) = (self.pred, self.statements);
        let row_subs = ps.shape.row_subs();
        Attention {
            batch: self.ext.batch,
            row: ps.shape.row,
            key: ps.shape.key,
            rows: self.ext.rows,
            keys: self.ext.keys,
            depth: self.ext.depth,
            dtype: self.score.query.dtype,
            score: self.score.tensor,
            query: self.score.query,
            key_operand: self.score.key_operand,
            maps: self.around.maps,
            pred_term: AccessKey::new(&pred.tensor, &row_subs),
            repair_old: AccessKey::new(&pred.cache, &row_subs),
            repair_new: AccessKey::new(&pred.tensor, &row_subs),
            pred: pred.tensor,
            cache: pred.cache,
            reducer: pred.reducer,
            pred_init: ps.init_value,
            pred_body: ps.body,
            sums: self.targets.sums,
            contractions: self.targets.contractions,
            epilogue: self.around.epilogue,
            key_tiles,
            full_tile,
            element,
            split: None,
        }
    }
}

/// Recognises the program as one attention kernel; `None` leaves it to
/// the ordinary mapping. The statements' form ([`rolling_form`]), then in
/// isl the domains and the tiled loop's conditions
/// ([`domain_conditions`]) and the rows' independence ([`within_rows`]),
/// and the launch's limits.
pub fn recognise(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
) -> Result<Option<Attention>> {
    let Some(form) = rolling_form(program) else {
        return Ok(None);
    };
    let (shape, ext) = (&form.statements.shape, &form.ext);
    let Some(conditions) = domain_conditions(
        isl,
        scop,
        program,
        form.statements.update,
        &ext.batch,
        (&shape.row, &shape.key, form.padding(program)),
        [ext.rows, ext.keys, ext.depth],
        &form.targets.contractions,
        &form.around.epilogue,
        &form.used,
        form.score.statement,
    )?
    else {
        return Ok(None);
    };
    if !within_rows(isl, scop, deps, &shape.row_idx)? {
        return Ok(None);
    }
    let attention = form.plan(conditions).with_promotion(program);
    // One block row per batch combination (CUDA's grid y), and the tiles
    // in the shared memory a block may have on the H100.
    if attention.batches() > 65535 || attention.shared_bytes() > MAX_SHARED_BYTES {
        return Ok(None);
    }
    Ok(Some(attention))
}

/// The domain checks and conditions of the tiled loop: every statement of
/// the rolling loop (but the score's) on the same set `V` of `(bt, i, j)`
/// (a contraction target's on `V × [0, E)`), the score, the row
/// initialisations and the epilogue on boxes; then, from `V`, the key range
/// of a block's rows, whether a tile is wholly inside `V`, and the test of
/// one element.
#[allow(clippy::too_many_arguments)]
fn domain_conditions(
    isl: &Isl,
    scop: &Scop,
    program: &Program,
    pred_update: usize,
    batch_ext: &[(String, i64)],
    (row, key, padding): (&str, &str, Option<i64>),
    [rows, keys, depth]: [i64; 3],
    contractions: &[RowContraction],
    epilogue: &[usize],
    used: &[usize],
    score: usize,
) -> Result<Option<TileConditions>> {
    let pre = &scop.param_prefix;
    let Some(pstmt) = scop.statements.iter().find(|s| s.source == pred_update) else {
        return Ok(None);
    };
    let batch: Vec<String> = batch_ext.iter().map(|(b, _)| b.clone()).collect();
    let mut elem = batch.clone();
    elem.push(row.to_string());
    elem.push(key.to_string());
    let anon = |s: &ModelStmt, its: &[String]| domain_on(isl, scop, s, its);
    let boxed = |extra: &[(String, i64)]| boxed_set(isl, scop, batch_ext, extra);
    // `V` on an anonymous tuple [bt, i, j].
    let Some(v) = anon(pstmt, &elem)? else {
        return Ok(None);
    };
    for s in &scop.statements {
        let st = &program.statements[s.source];
        let ok = if s.source == score {
            // The score on the whole box (the update and its init).
            let mut its = elem.clone();
            let mut extra = vec![(row.to_string(), rows), (key.to_string(), keys)];
            if s.kind == crate::model::StmtKind::Update {
                its.push(st.reduction_indices[0].clone());
                extra.push((st.reduction_indices[0].clone(), depth));
            }
            match anon(s, &its)? {
                Some(d) => d.is_equal(&boxed(&extra)?)?,
                None => false,
            }
        } else if st.reduction_indices.len() == 1 || st.lhs_indices == elem {
            // The rolling loop and the maps: on V, or V × [0, E).
            let mut its = st.lhs_indices.clone();
            if let Some(c) = contractions.iter().find(|c| its.last() == Some(&c.column)) {
                its.push(key.to_string());
                match anon(s, &its)? {
                    Some(d) => {
                        let col = isl.map(&format!(
                            "{pre}{{ [{}] -> [{}] : 0 <= {} < {} }}",
                            elem.join(", "),
                            its.join(", "),
                            c.column,
                            c.width
                        ))?;
                        d.is_equal(&v.copy()?.apply(col)?)?
                    }
                    None => false,
                }
            } else {
                if st.lhs_indices != elem {
                    its.push(key.to_string());
                }
                match anon(s, &its)? {
                    Some(d) => d.is_equal(&v)?,
                    None => false,
                }
            }
        } else if used.contains(&s.source) || epilogue.contains(&s.source) {
            // Row initialisations and the epilogue: boxes.
            let its = st.lhs_indices.clone();
            let mut extra = vec![(row.to_string(), rows)];
            if its.len() > batch.len() + 1 {
                let c = &its[batch.len() + 1];
                let Some(w) = contractions.iter().find(|x| &x.column == c) else {
                    return Ok(None);
                };
                extra.push((c.clone(), w.width));
            }
            match anon(s, &its)? {
                Some(d) => d.is_equal(&boxed(&extra)?)?,
                None => false,
            }
        } else {
            false
        };
        if !ok {
            return Ok(None);
        }
    }
    Ok(Some(tile_conditions(
        isl,
        scop,
        v,
        &batch,
        row,
        key,
        prefill_block_rows(depth, contractions),
        padding,
    )?))
}

/// Statement `s`'s domain, under the program's context, on the anonymous
/// tuple `its` (its iterators in another order); `None` where `its` are
/// not its iterators.
pub(super) fn domain_on(
    isl: &Isl,
    scop: &Scop,
    s: &ModelStmt,
    its: &[String],
) -> Result<Option<crate::isl::Set>> {
    if s.iterators.len() != its.len() || its.iter().any(|i| !s.iterators.contains(i)) {
        return Ok(None);
    }
    let m = isl.map(&format!(
        "{}{{ {}[{}] -> [{}] }}",
        scop.param_prefix,
        s.name,
        s.iterators.join(", "),
        its.join(", ")
    ))?;
    Ok(Some(
        s.domain
            .copy()?
            .intersect_params(scop.context.copy()?)?
            .apply(m)?,
    ))
}

/// The box `0 <= x < e` over the batch iterators, then `extents`, as a set
/// on that tuple under the program's context.
pub(super) fn boxed_set(
    isl: &Isl,
    scop: &Scop,
    batch_ext: &[(String, i64)],
    extents: &[(String, i64)],
) -> Result<crate::isl::Set> {
    let all: Vec<&(String, i64)> = batch_ext.iter().chain(extents.iter()).collect();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    let mut cons: Vec<String> = all.iter().map(|(n, e)| format!("0 <= {n} < {e}")).collect();
    if cons.is_empty() {
        cons.push("0 = 0".into());
    }
    Ok(isl
        .set(&format!(
            "{}{{ [{}] : {} }}",
            scop.param_prefix,
            names.join(", "),
            cons.join(" and ")
        ))?
        .intersect_params(scop.context.copy()?)?)
}

/// Whether every dependence relates two instances of one row: `D ⊆ R⁻¹ ∘
/// R` with `R` the projection of every statement on `row_idx` (`bt, i`).
pub(super) fn within_rows(
    isl: &Isl,
    scop: &Scop,
    deps: &Dependences,
    row_idx: &[String],
) -> Result<bool> {
    let mut pieces = Vec::new();
    for s in &scop.statements {
        if !row_idx.iter().all(|i| s.iterators.contains(i)) {
            return Ok(false);
        }
        pieces.push(format!(
            "{}[{}] -> [{}]",
            s.name,
            s.iterators.join(", "),
            row_idx.join(", ")
        ));
    }
    let rowmap = isl.union_map(&format!("{}{{ {} }}", scop.param_prefix, pieces.join("; ")))?;
    let same = rowmap.copy()?.apply_range(rowmap.reverse()?)?;
    Ok(deps.all()?.subtract(same)?.is_empty()?)
}

/// What a tile's step evaluates per element: the maps, the predecessor's
/// body, the row sums' terms and the contractions' weights.
pub(super) fn step_expressions<'e>(
    maps: &'e [(String, Expr)],
    pred_body: &'e Expr,
    sums: &'e [RowSum],
    contractions: &'e [RowContraction],
) -> Vec<&'e Expr> {
    maps.iter()
        .map(|(_, e)| e)
        .chain(std::iter::once(pred_body))
        .chain(sums.iter().map(|s| &s.term))
        .chain(contractions.iter().map(|c| &c.weight))
        .collect()
}

/// The row extent past which a block's last row tile holds padding rows
/// the full-tile test may ignore, or `None` where it may not.
///
/// A padding row (`i >= rows`) is computed and never stored: its query
/// row is zero-filled, and rows never mix (an `mma` row of the scores and
/// of the value product depends on that row of its A operand alone; a
/// row's reductions run over its own four lanes; the warps' states are
/// joined row by row), so whatever its values, nothing stored depends on
/// them. It may then take the step without the domain's mask, which lets
/// a tile whose real rows are wholly inside the domain skip the element
/// test (decoding with one query: 15 padding rows in every 16-row tile),
/// provided that nothing the step evaluates reads memory at a place that
/// depends on the row (it would be read past the tensor for a padding
/// row): the maps, the predecessor's body, the row sums' terms and the
/// contractions' weights read no input at a row-dependent subscript.
pub(super) fn padding_rows(
    program: &Program,
    row: &str,
    rows: i64,
    evaluated: &[&Expr],
) -> Option<i64> {
    let row_free = evaluated.iter().all(|e| {
        input_reads(program, e)
            .iter()
            .all(|(_, subs)| subs.iter().all(|a| !a.terms.contains_key(row)))
    });
    row_free.then_some(rows)
}

/// The reads of `e` of tensors no statement writes (inputs, in memory:
/// everything a statement writes is one of the attention kernel's
/// registers or shared tiles).
pub fn input_reads(program: &Program, e: &Expr) -> Vec<(String, Vec<Affine>)> {
    let mut v = reads(e);
    v.retain(|(t, _)| !program.statements.iter().any(|s| &s.lhs_tensor == t));
    v
}

/// The conditions of the tiled loop over `v`, a set of `[bt, i, j]`
/// (`batch` names the `bt`): the key tiles a block of `block_rows` rows
/// visits (in `bt` and `pf_i0`: see [`KeyTiles`]), whether the tile at
/// `pf_i0, pf_j0` is wholly inside `v` (its rows below `padding` only,
/// where given: see [`padding_rows`]), and whether element `pf_ei, pf_ej`
/// is.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_conditions(
    isl: &Isl,
    scop: &Scop,
    v: crate::isl::Set,
    batch: &[String],
    row: &str,
    key: &str,
    block_rows: i64,
    padding: Option<i64>,
) -> Result<TileConditions> {
    let pre = &scop.param_prefix;
    let mut elem = batch.to_vec();
    elem.push(row.to_string());
    elem.push(key.to_string());
    // Tiles: [bt, i, j] -> [bt, i0, j0] with i0 <= i < i0 + R_T and
    // j0 <= j < j0 + N_T.
    let mut tile_names = batch.to_vec();
    tile_names.push("pf_i0".into());
    tile_names.push("pf_j0".into());
    let tiles = isl.map(&format!(
        "{pre}{{ [{}] -> [{}] : pf_i0 <= {row} < pf_i0 + {block_rows} and pf_j0 <= {key} < pf_j0 + {BLOCK_KEYS} }}",
        elem.join(", "),
        tile_names.join(", ")
    ))?;
    let any = v.copy()?.apply(tiles.copy()?)?;
    // The points of a tile outside V that count: all of them, or those of
    // real rows (padding rows take the whole tile's step harmlessly).
    let mut outside = v.copy()?.complement()?;
    if let Some(rows) = padding {
        outside = outside.intersect(isl.set(&format!(
            "{pre}{{ [{}] : {row} < {rows} }}",
            elem.join(", ")
        ))?)?;
    }
    let outside = outside.apply(tiles)?;
    let full = any.copy()?.subtract(outside)?;
    // The key range of a block: [bt, i0] -> [bt, i, j] for the rows of
    // the block, restricted to V, then its j.
    let mut block_names = batch.to_vec();
    block_names.push("pf_i0".into());
    let nb = block_names.len() as u32;
    let block_keys = isl
        .map(&format!(
            "{pre}{{ [{}] -> [{}] : pf_i0 <= {row} < pf_i0 + {block_rows} }}",
            block_names.join(", "),
            elem.join(", ")
        ))?
        .intersect_range(v.copy()?)?
        .project_out(crate::isl::DimType::Out, 0, nb)?;
    let aligned = isl.set(&format!(
        "{pre}{{ [{}] : pf_i0 mod {block_rows} = 0 }}",
        block_names.join(", ")
    ))?;
    let mut element_names = batch.to_vec();
    element_names.push("pf_ei".into());
    element_names.push("pf_ej".into());
    let element = super::promote::set_expr(isl, scop, v, &element_names)?;
    // A tile's test is only evaluated at the tiles a block visits, so it
    // is simplified under them: where every visited tile is whole (global
    // attention over keys a multiple of the tile, a block-sparse mask), it
    // is `1` and the kernel has no step with the element test (H100, B4
    // H16 S4096 D64 global prefill, that step edited out of the kernel:
    // 821-826 against 847-852 us; never run, its code still cost the loop).
    let (key_tiles, visited) = match key_runs(isl, pre, &block_keys, &aligned)? {
        Some(runs) => runs.printed(isl, scop, &block_names, &aligned)?,
        None => key_range(isl, scop, key, block_keys, aligned, &block_names)?,
    };
    let full = full.gist(visited)?;
    let full_tile = super::promote::set_expr(isl, scop, full, &tile_names)?;
    Ok(TileConditions {
        key_tiles,
        full_tile,
        element,
    })
}

/// The key tiles of a block as one range ([`KeyTiles::Range`]) from its
/// keys `block_keys` (`[bt, i0] -> [j]`), and the tiles visited, a set of
/// `[bt, i0, j0]` at aligned rows: the aligned key tiles from the one
/// holding its least key to the one holding its greatest (those of `j0`
/// with `j0 <= some key` and `j0 >= some key - (N_T - 1)`).
fn key_range(
    isl: &Isl,
    scop: &Scop,
    key: &str,
    block_keys: crate::isl::Map,
    aligned: crate::isl::Set,
    block_names: &[String],
) -> Result<(KeyTiles, crate::isl::Set)> {
    let pre = &scop.param_prefix;
    let nt = BLOCK_KEYS;
    let toward = |cmp: &str| {
        isl.map(&format!(
            "{pre}{{ [{key}] -> [pf_j0] : pf_j0 {cmp} and pf_j0 mod {nt} = 0 }}"
        ))
    };
    let visited = block_keys
        .copy()?
        .apply_range(toward(&format!("<= {key}"))?)?
        .intersect(
            block_keys
                .copy()?
                .apply_range(toward(&format!(">= {key} - {}", nt - 1))?)?,
        )?
        .intersect_domain(aligned)?
        .wrap()?
        .flatten()?;
    let lo = block_keys.copy()?.dim_min(0)?;
    let hi = block_keys.copy()?.dim_max(0)?;
    let some = block_keys.domain()?;
    let key_tiles = KeyTiles::Range {
        any: super::promote::set_expr(isl, scop, some, block_names)?,
        lo: super::promote::expr_in(isl, lo, block_names)?,
        hi: super::promote::expr_in(isl, hi, block_names)?,
    };
    Ok((key_tiles, visited))
}

/// A block's runs of key tiles, in isl: each run's first and last tile,
/// maps from an aligned block `[bt, i0]` to a tile index `[kt]`, single
/// valued, on the blocks that have the run.
struct Runs {
    runs: Vec<(crate::isl::Map, crate::isl::Map)>,
    /// Their union: `[bt, i0] -> [kt]` for every tile of every run.
    visited: crate::isl::Map,
}

/// The runs of consecutive key tiles that hold an element of the domain
/// for an aligned block's rows, from its keys `block_keys` (`[bt, i0] ->
/// [j]`): `None` where every block's tiles are one run (nothing to skip),
/// where there are more than [`MAX_KEY_RUNS`], or where isl does not
/// prove them exact.
///
/// With `T` the tiles that hold an element, a run starts at a tile of `T`
/// whose predecessor is not in `T` and ends at one whose successor is not;
/// the first run starts at the least start, each run ends at the least end
/// at or after its start, and the next one starts at the least start after
/// that end. The proof: the runs are pairwise disjoint (no tile is
/// visited twice, which would add its terms twice) and their union holds
/// `T` (the tiles skipped hold no element, so skipping them drops
/// nothing).
fn key_runs(
    isl: &Isl,
    pre: &str,
    block_keys: &crate::isl::Map,
    aligned: &crate::isl::Set,
) -> Result<Option<Runs>> {
    let m = |text: &str| isl.map(&format!("{pre}{{ {text} }}"));
    let t = block_keys
        .copy()?
        .apply_range(m(&format!(
            "[j] -> [kt] : {BLOCK_KEYS} kt <= j < {BLOCK_KEYS} kt + {BLOCK_KEYS}"
        ))?)?
        .intersect_domain(aligned.copy()?)?;
    let starts = t
        .copy()?
        .subtract(t.copy()?.apply_range(m("[k] -> [k + 1]")?)?)?;
    let ends = t
        .copy()?
        .subtract(t.copy()?.apply_range(m("[k] -> [k - 1]")?)?)?;
    let mut runs = Vec::new();
    let mut first = starts.copy()?.lexmin()?;
    while !first.is_empty()? {
        if runs.len() == MAX_KEY_RUNS {
            return Ok(None);
        }
        let last = first
            .copy()?
            .apply_range(m("[k] -> [l] : l >= k")?)?
            .intersect(ends.copy()?)?
            .lexmin()?;
        let next = last
            .copy()?
            .apply_range(m("[k] -> [l] : l > k")?)?
            .intersect(starts.copy()?)?
            .lexmin()?;
        runs.push((first, last));
        first = next;
    }
    if runs.len() < 2 {
        return Ok(None);
    }
    let mut visited = t.copy()?.subtract(t.copy()?)?;
    for (first, last) in &runs {
        let run = first
            .copy()?
            .apply_range(m("[k] -> [l] : l >= k")?)?
            .intersect(last.copy()?.apply_range(m("[k] -> [l] : l <= k")?)?)?;
        if !visited.copy()?.intersect(run.copy()?)?.is_empty()? {
            return Ok(None);
        }
        visited = visited.union(run)?;
    }
    if !t.is_subset(&visited)? {
        return Ok(None);
    }
    Ok(Some(Runs { runs, visited }))
}

impl Runs {
    /// The runs as [`KeyTiles::Runs`] in `block_names` (simplified for
    /// aligned blocks, the only ones a kernel has), and the tiles visited
    /// as a set of `[bt, i0, j0]`.
    fn printed(
        self,
        isl: &Isl,
        scop: &Scop,
        block_names: &[String],
        aligned: &crate::isl::Set,
    ) -> Result<(KeyTiles, crate::isl::Set)> {
        let mut out = Vec::new();
        for (first, last) in self.runs {
            // Merged while the rows are still known to be aligned (a run
            // of blocks `0, 64` and `128 ..` is one interval of them).
            let any = first.copy()?.domain()?.coalesce()?.gist(aligned.copy()?)?;
            let first = first.dim_min(0)?.coalesce()?.gist(aligned.copy()?)?;
            let last = last.dim_min(0)?.coalesce()?.gist(aligned.copy()?)?;
            out.push(KeyRun {
                any: super::promote::set_expr(isl, scop, any, block_names)?,
                first: super::promote::expr_in(isl, first, block_names)?,
                last: super::promote::expr_in(isl, last, block_names)?,
            });
        }
        let visited = self
            .visited
            .apply_range(isl.map(&format!(
                "{}{{ [kt] -> [pf_j0] : pf_j0 = {BLOCK_KEYS} kt }}",
                scop.param_prefix
            ))?)?
            .wrap()?
            .flatten()?;
        Ok((KeyTiles::Runs(out), visited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::Analysed;

    /// The rolling body of an attention over `b, h` (the global one of
    /// `examples/attention_causal.json`, without its mask).
    const BODY: [&str; 7] = [
        "P(b, h, i, j) +=! Q(b, h, i, d) * K(b, h, j, d)",
        "T(b, h, i, j) = P(b, h, i, j) * 0.25",
        "M(b, h, i) max=! T(b, h, i, j)",
        "E(b, h, i, j) = exp(T(b, h, i, j) - M(b, h, i))",
        "L(b, h, i) +=! E(b, h, i, j)",
        "O(b, h, i, d) +=! E(b, h, i, j) * V(b, h, j, d)",
        "Y(b, h, i, d) = O(b, h, i, d) / L(b, h, i)",
    ];

    /// An attention program with `S` keys and rows of depth `D`, operands
    /// of `dtype` (K laid out as `k_shape`), the temp named `narrow` (if
    /// any of `T` and `E`) in f16, and `body`, repaired into a rolling
    /// update of `L` and `O`.
    fn program(s: i64, d: i64, dtype: &str, k_shape: &str, narrow: &str, body: &[&str]) -> String {
        let temp_dtype = |t: &str| if t == narrow { "f16" } else { "f32" };
        let (t_dtype, e_dtype) = (temp_dtype("T"), temp_dtype("E"));
        let body: Vec<String> = body.iter().map(|l| format!("\"{l}\"")).collect();
        format!(
            r#"{{"name": "att", "params": {{"B": 1, "H": 2, "S": {s}, "D": {d}}},
                "inputs": {{"Q": {{"dtype": "{dtype}", "shape": ["B", "H", "S", "D"]}},
                           "K": {{"dtype": "{dtype}", "shape": {k_shape}}},
                           "V": {{"dtype": "{dtype}", "shape": ["B", "H", "S", "D"]}}}},
                "outputs": {{"Y": {{"dtype": "f16", "shape": ["B", "H", "S", "D"]}}}},
                "temps": {{"P": {{"dtype": "f32", "shape": ["B", "H", "S", "S"]}},
                          "T": {{"dtype": "{t_dtype}", "shape": ["B", "H", "S", "S"]}},
                          "M": {{"dtype": "f32", "shape": ["B", "H", "S"]}},
                          "E": {{"dtype": "{e_dtype}", "shape": ["B", "H", "S", "S"]}},
                          "L": {{"dtype": "f32", "shape": ["B", "H", "S"]}},
                          "O": {{"dtype": "f32", "shape": ["B", "H", "S", "D"]}}}},
                "body": [{}],
                "schedule": [{{"rolling-update": ["L", "O"]}}]}}"#,
            body.join(", ")
        )
    }

    const K_ROWS: &str = r#"["B", "H", "S", "D"]"#;

    fn recognised(json: &str) -> (Analysed, Option<Attention>) {
        let a = Analysed::new(json);
        let found = recognise(&a.isl, &a.program, &a.scop, &a.deps).unwrap();
        (a, found)
    }

    fn names<T>(xs: &[T], name: impl Fn(&T) -> &str) -> Vec<&str> {
        xs.iter().map(name).collect()
    }

    #[test]
    fn a_global_attention_is_recognised_with_its_roles_and_sizes() {
        let (a, found) = recognised(&program(128, 32, "f16", K_ROWS, "", &BODY));
        let att = found.expect("recognised");
        assert_eq!(att.batch, vec![("b".to_string(), 1), ("h".to_string(), 2)]);
        assert_eq!((att.row.as_str(), att.key.as_str()), ("i", "j"));
        assert_eq!((att.rows, att.keys, att.depth), (128, 128, 32));
        assert_eq!(att.dtype, DType::F16);
        assert_eq!(att.score, "P");
        assert_eq!(att.query.tensor, "Q");
        assert_eq!(att.key_operand.tensor, "K");
        assert_eq!(names(&att.maps, |m| &m.0), ["T"]);
        assert_eq!(att.pred, "M");
        assert_eq!(att.reducer, Reducer::Max);
        assert_eq!(names(&att.sums, |s| &s.tensor), ["L"]);
        let [o] = att.contractions.as_slice() else {
            panic!("one contraction: {:?}", att.contractions);
        };
        assert_eq!(
            (o.tensor.as_str(), o.column.as_str(), o.width),
            ("O", "d", 32)
        );
        assert_eq!(o.value.tensor, "V");
        // E is an f32 temp: the weights are kept wider than the operands.
        assert!(!o.rounded_once);
        assert_eq!(att.epilogue, vec![a.writer("Y")]);
        assert!(att.split.is_none());
        // 128 keys in whole tiles of 64, no mask: no element test.
        assert!(att.every_tile_whole());
        // Depth 32 is no whole swizzle atom: mma.sync's 64-row blocks.
        assert!(!att.wgmma());
        assert_eq!(att.block_rows(), BLOCK_ROWS);
        // Its shared buffers, one after the other: the query tile, then
        // two stages of the key and of the value tile, rows padded by 8.
        let l = att.shared_layout();
        let tile = BLOCK_KEYS * (32 + 8);
        assert_eq!((l.query.start, l.query.stages), (0, 1));
        assert_eq!(l.query.stage_len, BLOCK_ROWS * (32 + 8));
        assert_eq!(
            (l.keys.start, l.keys.stages, l.keys.stage_len),
            (l.query.end(), 2, tile)
        );
        assert_eq!(l.values.len(), 1);
        assert_eq!(
            (l.values[0].start, l.values[0].stage_len),
            (l.keys.end(), tile)
        );
        assert_eq!(l.end(), l.values[0].end());
        assert_eq!(l.align, 128);
        assert_eq!(att.shared_bytes(), 2 * l.end() as usize);
    }

    #[test]
    fn a_causal_mask_is_recognised_with_an_element_test() {
        // The mask of `examples/attention_causal.json`.
        let body: Vec<String> = BODY
            .iter()
            .enumerate()
            .map(|(k, l)| match k {
                1..=5 => format!("{l} where j <= i"),
                _ => l.to_string(),
            })
            .collect();
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(128, 32, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        assert!(!att.every_tile_whole());
        assert_eq!(names(&att.maps, |m| &m.0), ["T"]);
    }

    /// `e` at the values `env` gives its names (a test's reading of the
    /// conditions the kernel prints).
    fn eval(e: &AstExpr, env: &std::collections::HashMap<&str, i64>) -> i64 {
        use crate::isl::ast::Op;
        let AstExpr::Op(op, args) = e else {
            return match e {
                AstExpr::Int(v) => *v,
                AstExpr::Id(n) => env[n.as_str()],
                AstExpr::Op(..) => unreachable!(),
            };
        };
        let v: Vec<i64> = args.iter().map(|a| eval(a, env)).collect();
        let b = |x: bool| i64::from(x);
        match op {
            Op::And => b(v.iter().all(|x| *x != 0)),
            Op::Or => b(v.iter().any(|x| *x != 0)),
            Op::Max => *v.iter().max().unwrap(),
            Op::Min => *v.iter().min().unwrap(),
            Op::Neg => -v[0],
            Op::Add => v[0] + v[1],
            Op::Sub => v[0] - v[1],
            Op::Mul => v[0] * v[1],
            Op::Div | Op::PosDiv => v[0] / v[1],
            Op::FloorDiv => v[0].div_euclid(v[1]),
            Op::PosRem | Op::ZeroRem => v[0] % v[1],
            Op::Select => {
                if v[0] != 0 {
                    v[1]
                } else {
                    v[2]
                }
            }
            Op::Eq => b(v[0] == v[1]),
            Op::Le => b(v[0] <= v[1]),
            Op::Lt => b(v[0] < v[1]),
            Op::Ge => b(v[0] >= v[1]),
            Op::Gt => b(v[0] > v[1]),
            Op::Call => panic!("a call in a condition: {e:?}"),
        }
    }

    /// The key tiles the kernel visits for the block of batch (0, 0) whose
    /// first row is `i0`, in the order it visits them.
    fn visited_tiles(att: &Attention, i0: i64) -> Vec<i64> {
        let env: std::collections::HashMap<&str, i64> =
            [("b", 0), ("h", 0), ("pf_i0", i0)].into_iter().collect();
        match &att.key_tiles {
            KeyTiles::Range { any, lo, hi } => match eval(any, &env) {
                0 => vec![],
                _ => (eval(lo, &env) / BLOCK_KEYS..=eval(hi, &env) / BLOCK_KEYS).collect(),
            },
            KeyTiles::Runs(runs) => runs
                .iter()
                .filter(|r| eval(&r.any, &env) != 0)
                .flat_map(|r| eval(&r.first, &env)..=eval(&r.last, &env))
                .collect(),
        }
    }

    /// BigBird's body: a window of `w` keys either side, `g` global rows
    /// and columns.
    fn bigbird_body(w: i64, g: i64) -> Vec<String> {
        let mask = format!("(j >= i - {w} && j <= i + {w}) || j < {g} || i < {g}");
        BODY.iter()
            .enumerate()
            .map(|(k, l)| match k {
                1..=5 => format!("{l} where {mask}"),
                _ => l.to_string(),
            })
            .collect()
    }

    #[test]
    fn bigbird_visits_the_global_tiles_and_the_windows_not_the_gap_between() {
        let (s, w, g) = (300, 9, 5);
        let body = bigbird_body(w, g);
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(s, 32, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        let KeyTiles::Runs(runs) = &att.key_tiles else {
            panic!("one range of key tiles: {:?}", att.key_tiles);
        };
        assert_eq!(runs.len(), 2);
        // Rows 192..255 read keys 0..4 (tile 0) and 183..264 (tiles 2 to
        // 4): tile 1 is skipped. The first blocks' windows reach tile 0.
        assert_eq!(visited_tiles(&att, 0), [0, 1, 2, 3, 4]);
        assert_eq!(visited_tiles(&att, 64), [0, 1, 2]);
        assert_eq!(visited_tiles(&att, 192), [0, 2, 3, 4]);
        assert_eq!(visited_tiles(&att, 256), [0, 3, 4]);
        // Every block visits exactly the tiles that hold an element of
        // the domain for its rows, once each, in order.
        let inside = |i: i64, j: i64| (j >= i - w && j <= i + w) || j < g || i < g;
        for i0 in (0..s).step_by(BLOCK_ROWS as usize) {
            let holding: Vec<i64> = (0..(s + BLOCK_KEYS - 1) / BLOCK_KEYS)
                .filter(|t| {
                    (i0..(i0 + BLOCK_ROWS).min(s)).any(|i| {
                        (t * BLOCK_KEYS..((t + 1) * BLOCK_KEYS).min(s)).any(|j| inside(i, j))
                    })
                })
                .collect();
            assert_eq!(visited_tiles(&att, i0), holding, "block {i0}");
        }
        // A window narrower than a tile and a global column of 5 keys: no
        // tile of a block past the global rows is whole.
        assert!(!att.every_tile_whole());
    }

    #[test]
    fn tiles_without_a_gap_stay_one_range() {
        // Causal: every block's tiles from 0 to its diagonal hold keys.
        let body: Vec<String> = BODY
            .iter()
            .enumerate()
            .map(|(k, l)| match k {
                1..=5 => format!("{l} where j <= i"),
                _ => l.to_string(),
            })
            .collect();
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(300, 32, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        assert!(matches!(att.key_tiles, KeyTiles::Range { .. }));
        assert_eq!(visited_tiles(&att, 192), [0, 1, 2, 3]);
        // BigBird with global tokens as wide as the window's reach: the
        // window of every block touches the global tiles, no gap.
        let body = bigbird_body(64, 64);
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(160, 32, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        assert!(matches!(att.key_tiles, KeyTiles::Range { .. }));
    }

    #[test]
    fn block_aligned_bigbird_visits_whole_tiles_only() {
        // The benchmark's shape at 640 keys: a window of 64 either side and
        // 128 global rows and columns. Past the global rows a block reads
        // tiles 0 and 1 (whole), and its window's three tiles (the middle
        // one whole).
        let body = bigbird_body(64, 128);
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(640, 64, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        assert!(matches!(&att.key_tiles, KeyTiles::Runs(r) if r.len() == 2));
        assert_eq!(visited_tiles(&att, 320), [0, 1, 4, 5, 6]);
        assert_eq!(visited_tiles(&att, 576), [0, 1, 8, 9]);
        assert_eq!(visited_tiles(&att, 128), [0, 1, 2, 3]);
    }

    #[test]
    fn renamed_iterators_take_the_roles_they_play() {
        let body: Vec<String> = BODY
            .iter()
            .map(|l| {
                l.replace("i,", "r,")
                    .replace("i)", "r)")
                    .replace("j", "c")
                    .replace("d)", "t)")
            })
            .collect();
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(64, 16, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        assert_eq!((att.row.as_str(), att.key.as_str()), ("r", "c"));
        assert_eq!(att.contractions[0].column, "t");
    }

    #[test]
    fn a_weight_cast_to_the_operand_type_is_rounded_once() {
        let mut body = BODY;
        body[5] = "O(b, h, i, d) +=! f16(E(b, h, i, j)) * V(b, h, j, d)";
        let (_, found) = recognised(&program(64, 16, "f16", K_ROWS, "", &body));
        let att = found.expect("recognised");
        assert!(att.contractions[0].rounded_once);
    }

    #[test]
    fn f32_operands_have_no_score_tiles() {
        let (a, found) = recognised(&program(64, 16, "f32", K_ROWS, "", &BODY));
        assert!(found.is_none());
        // The roles are found; the score's operands are what is refused.
        let rolling = a.program.rolling.as_ref().unwrap();
        let ps = rolling_pred(&a.program, &rolling.preds[0]).expect("the predecessor");
        assert!(prefill_score(&a.program, &ps.shape).is_none());
    }

    #[test]
    fn a_depth_off_the_mma_steps_is_refused() {
        let (a, found) = recognised(&program(64, 8, "f16", K_ROWS, "", &BODY));
        assert!(found.is_none());
        let rolling = a.program.rolling.as_ref().unwrap();
        let ps = rolling_pred(&a.program, &rolling.preds[0]).expect("the predecessor");
        let score = prefill_score(&a.program, &ps.shape).expect("the score");
        assert!(extents(&a.program, &ps.shape, "M", &score).is_none());
    }

    #[test]
    fn a_transposed_key_operand_is_refused() {
        let mut body = BODY;
        body[0] = "P(b, h, i, j) +=! Q(b, h, i, d) * K(b, h, d, j)";
        let k_cols = r#"["B", "H", "D", "S"]"#;
        let (_, found) = recognised(&program(64, 16, "f16", k_cols, "", &body));
        assert!(found.is_none());
    }

    #[test]
    fn weights_in_a_16_bit_temp_are_inlined_and_rounded_once() {
        // The repair inlines E into its readers (it is no map of the
        // kernel): an f16 E is a weight declared in the operand type.
        let (_, found) = recognised(&program(64, 16, "f16", K_ROWS, "E", &BODY));
        let att = found.expect("recognised");
        assert_eq!(names(&att.maps, |m| &m.0), ["T"]);
        assert!(att.contractions[0].rounded_once);
    }

    #[test]
    fn a_map_in_a_16_bit_temp_is_refused() {
        // The step keeps T in registers, in f32: a temp the program
        // declares f16 would be a value the program never rounded.
        let (a, found) = recognised(&program(64, 16, "f16", K_ROWS, "T", &BODY));
        assert!(found.is_none());
        assert!(!f32_temps(&a.program, [&"T".to_string()]));
        assert!(f32_temps(&a.program, [&"M".to_string(), &"L".to_string()]));
    }
}
