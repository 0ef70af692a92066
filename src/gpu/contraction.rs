//! Contractions on tensor cores: recognising `C[m, n] += A[m, k] * B[k, n]`
//! in the polyhedral form of a kernel, and the warp tiling that runs it with
//! `mma.sync.m16n8k16` (f16 or bf16 operands, f32 accumulators).
//!
//! A kernel is a contraction when, in its outermost band (before tiling):
//!
//! * the band has two or three coincident members (they map to blocks)
//!   followed by one that is not (the reduction); with three, the first is
//!   a batch whose tiles have one point;
//! * its instances are those of an update statement `S` (and the
//!   `S_init` of its `+=!`), whose right side, casts aside, is the product
//!   of two reads of f16 (or two of bf16) tensors, and of any further
//!   sums of such products into `S`'s element without an initialisation
//!   of their own (`G +=! X W; G += H U`, scheduled into one band by
//!   `schedule::sums`), each then a reduction loop of its own on the same
//!   accumulators ([`Contraction::terms`]);
//! * on `S`, each band member is exactly one iterator: `m`, `n` and `k`
//!   (`k` a reduction index of `S`; `b` for a batch), so a schedule point
//!   is an iteration;
//! * `S`'s domain is a box from 0: `0 <= m < E_m, 0 <= n < E_n, 0 <= k <
//!   E_k` (and `0 <= b < E_b`);
//! * `A`'s subscripts use `m` and `k` (each in exactly one dimension, with
//!   coefficient 1, never `n`), `B`'s `k` and `n`; the last (contiguous)
//!   dimension of each is one of the two, so eight consecutive elements of
//!   a tile row are 16 consecutive bytes;
//! * every dependence among the kernel's instances relates two instances of
//!   the same `(b, m, n)`: `D ∩ (T⁻¹ ∘ T)ᶜ = ∅` with `T` the projection on
//!   `(b, m, n)`. The accumulator chain of one element is then the only order
//!   to keep, so the elements may be spread over the lanes of warps in the
//!   fragments' layout instead of the thread band's, and the steps of one
//!   chain may be regrouped into sums of 16 products (a sum is a
//!   reorderable reduction, as for warp reductions).
//!
//! Partial tiles need no test inside the fragment loops: past the
//! reduction's end the operands' tiles hold zeros, and past `m` or `n`
//! they hold zeros or (an MN-major operand's whole chunks,
//! `codegen::mma`'s `read_row`) copies of elements inside, whose products
//! land only in accumulator elements outside the domain. The epilogue
//! reads the accumulator only at its own element and stores only elements
//! inside the domain, so those are never used.

use crate::isl::{PwMultiAff, ScheduleNode};

use super::attention::uncast;
use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{Affine, AssignOp, BinOp, DType, ExprKind, Program, Reducer, Statement};
use crate::isl::ast::{self, Expr};
use crate::isl::{ast_build_expr_from_pw_aff, DimType, Isl};
use crate::model::{ModelStmt, Scop, StmtKind};

/// The widest automatic wgmma tile (columns) of a promoted contraction
/// (`Accumulation::Promoted`).
const PROMOTED_WGMMA_N: i64 = 128;

/// Rows, columns and depth of one `mma.sync` instruction.
pub const MMA_M: i64 = 16;
pub const MMA_N: i64 = 8;
pub const MMA_K: i64 = 16;

/// One operand of the contraction.
#[derive(Debug, Clone)]
pub struct Operand {
    pub tensor: String,
    /// Subscripts in the statement's iterators.
    pub subscripts: Vec<Affine>,
    /// Whether the reduction index `k` runs along the last (contiguous)
    /// dimension; otherwise `m` (for `A`) or `n` (for `B`) does.
    pub k_contiguous: bool,
}

/// A recognised contraction and the warp tiling chosen for it.
#[derive(Debug, Clone)]
pub struct Contraction {
    /// The update statement (model name).
    pub statement: String,
    /// The statement's iterators playing `m`, `n` and `k`.
    pub m: String,
    pub n: String,
    pub k: String,
    /// Iterators of the outer parallel members (a batch), tile size 1:
    /// one value per block.
    pub batch: Vec<String>,
    /// Operand type: f16 or bf16.
    pub dtype: DType,
    pub a: Operand,
    pub b: Operand,
    /// Extents of the domain box along `m`, `n`, `k`, in the parameters.
    pub extents: [Expr; 3],
    /// Tile sizes along `m`, `n`, `k`.
    pub tile: [i64; 3],
    /// Warps along `m` and `n`; each warp owns a `tile[0] / warps[0]` by
    /// `tile[1] / warps[1]` piece of the block's tile.
    pub warps: [i64; 2],
    /// Shared-memory stages of the copy pipeline along `k` (at least 2).
    pub stages: i64,
    /// Every k tile of a block has a stage of its own (`stages` is the
    /// block's count of k tiles): all its copies are issued at the start
    /// and no stage is refilled, so the block waits for global memory once
    /// (see `latency_stages`). The pipeline's loops are then not unrolled:
    /// a block that runs its code once spends its time fetching
    /// instructions, not on the address arithmetic unrolling saves.
    pub whole_k: bool,
    /// Blocks the reduction along `k` is split over (1: none). The `S`
    /// blocks of one output tile form a thread-block cluster (grid `z`,
    /// Hopper): each sums the products of its own range of k tiles, the
    /// partial tiles meet in the cluster's distributed shared memory, and
    /// each block adds up, in rank order, the partials of the accumulators
    /// it owns and applies the epilogue to them (see `codegen::mma`).
    ///
    /// Why this is legal: the only dependences among the kernel's
    /// instances are the accumulator chains of single output elements
    /// (checked by [`recognise`]), and a chain is a sum. Splitting it into
    /// `S` partial sums added afterwards regroups the sum, as the
    /// fragments' sums of 16 products already do: the split-k update of
    /// a plain reduction, whose repair is the identity (`h(t, r, r') = t`).
    pub split: i64,
    /// The tile is whole warpgroups of 64 rows and whole swizzle atoms of
    /// both operands (see `wgmma_fits`): on sm_90a the kernel
    /// runs `wgmma` (Hopper's warpgroup instructions), elsewhere
    /// `mma.sync` with the same tiles and threads.
    pub wgmma: bool,
    /// Statements applied to each output element after its reduction, in
    /// order, on the accumulator before the store (bias, activation,
    /// scale, cast).
    pub epilogue: Vec<Epilogue>,
    /// The tensor the region stores: the update's own, or, where the
    /// epilogue ends by writing the element's value into another tensor
    /// and the update's tensor is a temp that nothing else reads (`acc
    /// +=! f32(A) * f32(B); D = f16(tanh(acc + bias))`), that tensor: the
    /// accumulator then never reaches memory, and keeps the precision its
    /// temp declares until the last statement converts it.
    pub stored: String,
    /// Further sums into the same accumulator after the update (an LSTM
    /// cell's `G +=! X W; G += H U`, scheduled in one band by
    /// `schedule::sums`), in program order: each runs a reduction loop of
    /// its own over its own operands, on the same accumulators, after the
    /// loops before it, before the epilogue. Their operands have the
    /// update's types and layouts (the same shared buffers, fragments and
    /// descriptors), their element box is the update's, and the
    /// reduction is not split (`split` is 1).
    pub terms: Vec<Term>,
    /// How the products reach the f32 accumulators (see [`Accumulation`]).
    pub accumulation: Accumulation,
    /// How the operand tiles reach shared memory (`gpu::tma`): decided by
    /// the mapping once the tile is final.
    pub copies: super::tma::Copies,
    /// How the results leave the registers (`gpu::stores`): decided by
    /// the mapping once the tile is final.
    pub stores: super::stores::Stores,
}

/// How a contraction's products are summed into its f32 accumulators.
///
/// The tensor cores' f32 accumulation is not IEEE f32 addition: inside one
/// `mma` or `wgmma` the products and the incoming accumulator are aligned to
/// the largest exponent and the sum is truncated, not rounded to nearest.
/// Chained over a long reduction (k / 16 instructions on one accumulator)
/// the truncations add up with one sign. The spec's numerics hold a value
/// stored as f32 to twice the error of the declared-precision run, whose
/// f32 sum rounds each step to nearest. Measured on the H200: an LSTM
/// cell's f32 cell state (gates from two f16 products of k = 1024) had 3.3
/// times that run's error, an f16 gemm into f32 at k = 8192 2.4 times.
/// A value rounded to f16 or bf16 before it is stored carries that
/// rounding's error (2^-11 or 2^-8), far above the truncations' (about
/// k / 16 units of 2^-24), so only an f32 result needs the IEEE sum.
///
/// A model of the truncation (terms aligned to the largest and cut after
/// 24 to 26 bits, the sum cut to 24; `bench/tc-model.c`, 20,000 outputs at
/// k = 2048, 8192 and 32768) gives the chained sum 1.1 to 5.7 times the
/// sequential f32 sum's largest error, and sums promoted every 16, 64,
/// 256 or 512 of k 0.08 to 0.41 times (every 1024, up to 0.65; every
/// 2048, up to 1.1): a sum of short sums is more accurate than the
/// sequential sum the declared-precision run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulation {
    /// Every instruction adds onto the running accumulators.
    Chained,
    /// Each run of `k_tiles` k tiles (the block's k tiles counted from
    /// its first) sums its products into a second register set started
    /// from zero (wgmma's scale-d 0, or zeroed before `mma.sync`); at the
    /// run's end that set is added to the accumulators by ordinary (IEEE,
    /// round to nearest) f32 additions: the truncation touches sums of at
    /// most one run's products. What FP8 GEMMs call promotion. The wgmma
    /// engine waits for the run's last group before adding it, so the
    /// tensor cores drain once a run; a longer run drains less often.
    Promoted { k_tiles: i64 },
}

/// The longest run of k a promoted contraction sums before an IEEE add,
/// as a multiple of the square root of the reduction's length.
///
/// Why a root: a run of `r` products chains `r / 16` truncating
/// instructions, each off by up to a unit in the last place of the run's
/// partial sum (about `sqrt(r)` products' size), with one sign; the runs'
/// signs differ, so over `k / r` runs the truncations add as a random
/// walk, about `sqrt(k) * r / 16` units of a product's size. The
/// declared-precision run's sequential f32 sum rounds `k` times to nearest
/// on partial sums of `sqrt(k)`: about `k` such units. Their ratio grows
/// as `r / sqrt(k)`, so a run bounded by `c * sqrt(k)` keeps the tensor
/// cores' sum a fixed fraction of the declared run's error at every k.
///
/// Measured in the emulation (`pf_emu_tc_sum`, f16 products into an f32
/// temp then `tanh(acc + bias)`, 130 x 264, 31 seeds; the check's ratio
/// of errors, largest and mean): k 200, runs of 64 1.06 and 0.59, runs
/// of 128 1.32 and 0.75, chained 2.40 (failed) and 0.96; k 512, runs of
/// 64 0.55 and 0.33, 128 0.84 and 0.50, 256 1.66 and 0.81; k 1024, runs of
/// 128 0.77 and 0.39. The check admits 2: a run of at most `4 sqrt(k)`
/// (a power of two) keeps the worst seed about half of that.
const RUN_PER_ROOT_K: f64 = 4.0;

/// The shortest run: one wgmma k tile. A reduction no longer than this is
/// one chain (k 64 chained: at most 1.2 times the declared run's error
/// over the emulation's seeds).
const MIN_PROMOTED_RUN_K: i64 = 64;

/// A run's elements of k for a reduction of `k_sums` (unknown: the
/// shortest, which holds at every k).
fn promoted_run_k(k_sums: Option<i64>) -> i64 {
    let Some(k) = k_sums else {
        return MIN_PROMOTED_RUN_K;
    };
    let bound = (RUN_PER_ROOT_K * (k.max(1) as f64).sqrt()) as i64;
    let mut run = MIN_PROMOTED_RUN_K;
    while run * 2 <= bound {
        run *= 2;
    }
    run
}

impl Accumulation {
    /// Whether a contraction whose region stores a value of dtype
    /// `stored_dtype`, over `k_sums` elements of k in all (the update's
    /// and its further terms' reductions, where known), needs its sums
    /// promoted: where the stored value is f32 or wider, so that the
    /// tensor cores' truncation would reach memory, and the reduction is
    /// longer than one run ([`promoted_run_k`]). A reduction within one
    /// run would be one run promoted: the same truncated sums, for a
    /// second register set and a narrower tile.
    pub fn promotes(stored_dtype: DType, k_sums: Option<i64>) -> bool {
        matches!(stored_dtype, DType::F32 | DType::F64)
            && k_sums.is_none_or(|k| k > promoted_run_k(k_sums))
    }

    /// The accumulation of such a contraction with k tiles of `tile_k`:
    /// runs of [`promoted_run_k`] elements, at least one k tile.
    pub fn for_stored(stored_dtype: DType, k_sums: Option<i64>, tile_k: i64) -> Self {
        if Self::promotes(stored_dtype, k_sums) {
            Accumulation::Promoted {
                k_tiles: (promoted_run_k(k_sums) / tile_k.max(1)).max(1),
            }
        } else {
            Accumulation::Chained
        }
    }

    pub fn is_promoted(self) -> bool {
        matches!(self, Accumulation::Promoted { .. })
    }
}

/// A further sum into the accumulator ([`Contraction::terms`]).
#[derive(Debug, Clone)]
pub struct Term {
    pub statement: String,
    /// Its iterators playing `m`, `n` and `k`, and the batch members.
    pub m: String,
    pub n: String,
    pub k: String,
    pub batch: Vec<String>,
    pub a: Operand,
    pub b: Operand,
    /// Its extent along `k`, in the parameters.
    pub k_extent: Expr,
}

/// One epilogue statement: `C[e] = f(C[e], inputs)` over the element space.
#[derive(Debug, Clone)]
pub struct Epilogue {
    pub statement: String,
    /// Its iterators playing the batch members, `m` and `n`, in band order.
    pub iterators: Vec<String>,
    /// The update's element in its iterators: the subscripts at which it
    /// reads (and, in place, writes) the accumulator.
    pub element: Vec<String>,
}

/// One operand's tile in shared memory, as one engine lays it out (see
/// [`Contraction::shared_tiles`]): `stages` stages of `stage_len` 16-bit
/// elements from element `start` on. The copies walk a stage as `lines`
/// lines of `chunks_per_line` 16-byte chunks (rows of a K-major operand,
/// k of an MN-major one), whatever the engine; the engine places line `l`
/// at `l * line_len` (the padded pitch for `mma.sync`, the swizzle's line
/// for `wgmma`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedTile {
    pub start: i64,
    pub stages: i64,
    pub stage_len: i64,
    pub lines: i64,
    pub chunks_per_line: i64,
    pub line_len: i64,
    /// How a `wgmma` descriptor names the tile (the `wgmma` engine's).
    pub descriptor: Option<Descriptor>,
}

/// The fields of a `wgmma` descriptor of an operand's tile other than its
/// start address, in bytes. K-major operands: LBO unused (16), 8-row
/// groups 1024 bytes apart (SBO); MN-major: 64-row groups `tk` lines of
/// 128 bytes apart; a narrow one (the 64-byte swizzle, 32 wide, see
/// [`narrow`]): the tile's one group `tk` lines of 64 bytes long, 8-line
/// groups 512 bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub lbo: i64,
    pub sbo: i64,
    /// Bytes of a line of the swizzle: 128, or 64 for a narrow tile.
    pub swizzle: i64,
}

/// The descriptor's fields of operand `x`'s tile of `rows` rows and a k
/// tile of `tk`.
fn descriptor(x: &Operand, rows: i64, tk: i64) -> Descriptor {
    if narrow(x, rows) {
        Descriptor {
            lbo: tk * 64,
            sbo: 512,
            swizzle: 64,
        }
    } else {
        Descriptor {
            lbo: if x.k_contiguous { 16 } else { tk * 128 },
            sbo: 1024,
            swizzle: 128,
        }
    }
}

impl SharedTile {
    /// The element after the buffer's last stage.
    pub fn end(&self) -> i64 {
        self.start + self.stages * self.stage_len
    }
}

/// Both operands' shared tiles for one engine, and the alignment of the
/// memory they are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedTiles {
    pub a: SharedTile,
    pub b: SharedTile,
    /// Bytes the dynamic shared memory is aligned to.
    pub align: usize,
}

/// Padding of each shared row, in elements (16 bytes).
pub const SHARED_ROW_PAD: i64 = 8;

/// `(rows, pitch)` of one stage of operand `x` with `r` rows and a k tile
/// of `tk`, in the padded (`mma.sync`) layout: the larger of a kernel's
/// two layouts, so its size bounds a stage's shared memory.
fn padded_layout(x: &Operand, r: i64, tk: i64) -> (i64, i64) {
    if x.k_contiguous {
        (r, tk + SHARED_ROW_PAD)
    } else {
        (tk, r + SHARED_ROW_PAD)
    }
}

impl Contraction {
    /// `(rows, pitch)` of one stage of operand `x` with `r` rows in the
    /// tile, in the padded (`mma.sync`) layout.
    fn layout(&self, x: &Operand, r: i64) -> (i64, i64) {
        padded_layout(x, r, self.tile[2])
    }

    /// The operands' shared tiles as engine `wgmma` (else `mma.sync`)
    /// lays them out in the kernel's dynamic shared memory: A's stages,
    /// then B's. `codegen::mma` declares, fills and reads the buffers from
    /// these numbers, and the launch's bytes ([`Self::shared_bytes`]) are
    /// theirs.
    pub fn shared_tiles(&self, wgmma: bool) -> SharedTiles {
        let a = self.shared_tile(&self.a, self.tile[0], wgmma, 0);
        let b = self.shared_tile(&self.b, self.tile[1], wgmma, a.end());
        SharedTiles {
            a,
            b,
            // The swizzle's XOR takes the row from address bits 7-9: the
            // stages start on 1024-byte boundaries.
            align: if self.wgmma { 1024 } else { 128 },
        }
    }

    /// Operand `x`'s tile of `rows` rows, its buffer at element `start`.
    fn shared_tile(&self, x: &Operand, rows: i64, wgmma: bool, start: i64) -> SharedTile {
        let tk = self.tile[2];
        let (lines, pitch) = self.layout(x, rows);
        let (stage_len, line_len) = if !wgmma {
            (lines * pitch, pitch)
        } else if narrow(x, rows) {
            (rows * tk, 32)
        } else {
            (rows * tk, 64)
        };
        SharedTile {
            start,
            stages: self.stages,
            stage_len,
            lines,
            chunks_per_line: (pitch - SHARED_ROW_PAD) / 8,
            line_len,
            descriptor: wgmma.then(|| descriptor(x, rows, tk)),
        }
    }

    /// Bytes of one stage (both operands; of the larger engine where the
    /// kernel has two).
    pub fn stage_bytes(&self) -> usize {
        let bytes = |t: SharedTiles| ((t.a.stage_len + t.b.stage_len) * 2) as usize;
        let sync = bytes(self.shared_tiles(false));
        if self.wgmma {
            sync.max(bytes(self.shared_tiles(true)))
        } else {
            sync
        }
    }

    /// Shared memory of the region in bytes (dynamic shared memory on the
    /// GPU: more than the 48 KB a static array may take): the larger of the
    /// two layouts when the kernel has both.
    pub fn shared_bytes(&self) -> usize {
        let stages = self.stages as usize * self.stage_bytes();
        // A split reduction's partial tile (f32) reuses the stages.
        let partial = if self.split > 1 {
            (self.tile[0] * self.tile[1] * 4) as usize
        } else {
            0
        };
        stages.max(partial)
    }
}

impl Contraction {
    /// An internal error where a refilled `wgmma` pipeline has fewer than
    /// [`MIN_REFILLED_WGMMA_STAGES`] stages.
    pub fn check_stages(&self) -> Result<()> {
        if self.wgmma && !self.whole_k && self.stages < MIN_REFILLED_WGMMA_STAGES {
            return Err(crate::error::Error::Internal(format!(
                "{}: a refilled wgmma pipeline of {} stages (at least {MIN_REFILLED_WGMMA_STAGES})",
                self.statement, self.stages
            )));
        }
        Ok(())
    }

    /// Whether operand B's shared tile is in the 64-byte swizzle: an
    /// MN-major tile 32 wide (one 64-byte line per k), where the 128-byte
    /// swizzle's atom (64 wide) does not fit.
    pub fn narrow_b(&self) -> bool {
        narrow(&self.b, self.tile[1])
    }

    /// Whether every tile is whole, known when the kernel is compiled: the
    /// extents are constants in `program`'s parameter values, multiples
    /// of the tile sizes along `m`, `n` and `k` (then the region's copies
    /// need no test of the k tile's end and its epilogue none of the
    /// output's bounds; see `codegen::mma::Region::full_tiles`).
    pub fn every_tile_whole(&self, program: &Program) -> bool {
        let values = program.known_params();
        let known = |e: &Expr| super::eval(e, &values).ok();
        self.extents
            .iter()
            .zip(self.tile)
            .all(|(e, t)| known(e).is_some_and(|x| x > 0 && x % t == 0))
            && self
                .terms
                .iter()
                .all(|t| known(&t.k_extent).is_some_and(|x| x > 0 && x % self.tile[2] == 0))
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (32 * self.warps[0] * self.warps[1]) as u32
    }
    /// Blocks per multiprocessor to keep registers for: two when the
    /// accumulators of a thread fit in 64 registers, else one. A promoted
    /// contraction holds a second set (its run's sums).
    pub fn min_blocks(&self) -> u32 {
        let [mt, nt] = self.fragments();
        let sets = if self.accumulation.is_promoted() {
            2
        } else {
            1
        };
        if sets * mt * nt * 4 <= 64 {
            2
        } else {
            1
        }
    }
    /// `mma` tiles per warp along `m` and `n`.
    pub fn fragments(&self) -> [i64; 2] {
        [
            self.tile[0] / self.warps[0] / MMA_M,
            self.tile[1] / self.warps[1] / MMA_N,
        ]
    }
}

/// The warp layouts tried for a block tile, largest first: `(tile_m,
/// tile_n, warps_m, warps_n)`. Each warp tile is a multiple of 16 x 16, so
/// fragments along `n` come in pairs (one `ldmatrix.x4` loads two).
/// Measured on the H100 (f16, 4096^3, 3 stages, after hoisting the copy
/// set-up and unrolling the stages): 128 x 256 x 32 with 64 x 64 warp
/// tiles ran in 512 us, 256 x 128 x 32 in 531 us, 128 x 128 x 32 in 557 us.
const LAYOUTS: [(i64, i64, i64, i64); 6] = [
    (128, 256, 2, 4),
    (128, 128, 2, 4),
    (64, 128, 1, 4),
    (64, 64, 2, 2),
    (32, 64, 1, 4),
    (32, 32, 2, 2),
];

/// Stages of the copy pipeline: three tiles in flight hide the global
/// memory latency behind two tiles of mma work.
pub const STAGES: i64 = 3;

/// Most blocks of a split reduction: the largest portable cluster.
pub const MAX_SPLIT: i64 = 8;

/// Depth of a k tile in the automatic choice.
const AUTO_TILE_K: i64 = 32;

/// The k tile of the `wgmma` path: one row of a 128-byte swizzle atom
/// (64 elements of 16 bits).
const WGMMA_TILE_K: i64 = 64;

/// An MN-major operand tile of 32 rows: its lines (one per k) are 64
/// bytes, laid out in the 64-byte swizzle.
pub fn narrow(x: &Operand, rows: i64) -> bool {
    !x.k_contiguous && rows == 32
}

/// Whether the block tile `tile` with `warps` runs on `wgmma` where the
/// compiler targets sm_90a: whole warpgroups of 64 rows along `m`, `n` a
/// multiple of 16 up to 256, and each operand's tile in whole swizzle
/// atoms: 8 rows of 64 k for a K-major operand, 64 rows (of `m` or `n`)
/// by 8 of k for an MN-major one in the 128-byte swizzle, or exactly 32
/// rows by 8 of k in the 64-byte swizzle ([`narrow`]). The k tile is 64
/// (the automatic choice, `auto`, takes it).
fn wgmma_fits(a: &Operand, b: &Operand, tile: [i64; 3], warps: [i64; 2], auto: bool) -> bool {
    let atoms = |x: &Operand, rows: i64| {
        if x.k_contiguous {
            rows % 8 == 0
        } else {
            rows % 64 == 0 || narrow(x, rows)
        }
    };
    tile[0] % 64 == 0
        && tile[1] % 16 == 0
        && tile[1] <= 256
        && warps[0] * warps[1] == tile[0] / 16
        && (auto || tile[2] == WGMMA_TILE_K)
        && atoms(a, tile[0])
        && atoms(b, tile[1])
}

/// A warp layout for user tile sizes `tile` and `threads` per block, when
/// one divides them (`None`: the kernel stays on the SIMT path).
fn layout_for(tile: [i64; 3], threads: u32) -> Option<[i64; 2]> {
    if !threads.is_multiple_of(32) || tile[2] % MMA_K != 0 {
        return None;
    }
    let warps = i64::from(threads / 32);
    // The squarest warp tile: fewest fragment loads per mma.
    (1..=warps)
        .filter(|wm| warps % wm == 0)
        .map(|wm| [wm, warps / wm])
        .filter(|[wm, wn]| tile[0] % (wm * MMA_M) == 0 && tile[1] % (wn * 2 * MMA_N) == 0)
        .min_by_key(|[wm, wn]| {
            let (a, b) = (tile[0] / wm, tile[1] / wn);
            (a.max(b) * 1000 / a.min(b).max(1), -wn)
        })
}

/// A read of the update's right side: tensor and subscripts.
type Read = (String, Vec<Affine>);

/// The roles of the update's iterators, as the band's members take them.
struct Iterators {
    /// The iterator of each band member: the batch, `m`, `n`, then `k`.
    members: Vec<String>,
    m: String,
    n: String,
    k: String,
    /// The outer members' iterators (tiles of one point).
    batch: Vec<String>,
}

/// Whether `band` has a contraction's shape: `nb` (two or three)
/// coincident members, which map to blocks, then one that is not, the
/// reduction, and no more.
fn contraction_band(band: &ScheduleNode, nb: usize) -> Result<bool> {
    if !(2..=3).contains(&nb) || band.band_n_member()? != nb as i32 + 1 {
        return Ok(false);
    }
    for i in 0..nb {
        if !band.band_member_get_coincident(i as i32)? {
            return Ok(false);
        }
    }
    Ok(!band.band_member_get_coincident(nb as i32)?)
}

/// The band's update, its epilogue candidates and its further sums.
type BandStatements<'s> = (&'s ModelStmt, Vec<&'s ModelStmt>, Vec<&'s ModelStmt>);

/// The band's statements (those with instances in `domain`): its first
/// update `S`, the others but the updates and `S`'s initialisation in
/// program order (epilogue candidates, checked once the iterators' roles
/// are known), and the further updates (sums into `S`'s tensor without
/// an initialisation of their own, [`Contraction::terms`], checked by
/// `UpdateMatch::term`); `None` where another update writes another
/// tensor or starts over, or another statement is not an assignment.
fn update_and_others<'s>(
    program: &Program,
    scop: &'s Scop,
    domain: &crate::isl::UnionSet,
) -> Result<Option<BandStatements<'s>>> {
    let stmts = scop.statements_in(domain)?;
    let mut updates: Vec<&ModelStmt> = stmts
        .iter()
        .filter(|s| s.kind == StmtKind::Update)
        .copied()
        .collect();
    updates.sort_by_key(|u| u.source);
    // The update is the first; the others ([`Contraction::terms`]) go on
    // with its sum: into its tensor, each without an initialisation.
    let Some((s, terms)) = updates.split_first() else {
        return Ok(None);
    };
    let (s, terms) = (*s, terms.to_vec());
    let tensor = &program.statements[s.source].lhs_tensor;
    for t in &terms {
        if &program.statements[t.source].lhs_tensor != tensor
            || scop.statement(&format!("{}_init", t.name)).is_some()
        {
            return Ok(None);
        }
    }
    let mut others: Vec<&ModelStmt> = stmts
        .iter()
        .filter(|o| {
            o.kind != StmtKind::Update && !(o.kind == StmtKind::Init && o.source == s.source)
        })
        .copied()
        .collect();
    others.sort_by_key(|o| o.source);
    if others.iter().any(|o| o.kind != StmtKind::Assign) {
        return Ok(None);
    }
    Ok(Some((s, others, terms)))
}

/// The update `st`'s operand type and its two reads: `st` is a sum (the
/// chain the fragments regroup) into an output type the fragments' store
/// knows (an 8-bit float, u8, bool or integer output keeps the ordinary
/// path) of a product of two reads, casts aside, of f16 tensors or of
/// bf16 ones.
fn product_reads(scop: &Scop, st: &Statement) -> Option<(DType, Read, Read)> {
    let AssignOp::Reduce {
        op: Reducer::Sum, ..
    } = st.op
    else {
        return None;
    };
    let out = scop.tensor(&st.lhs_tensor)?;
    if !matches!(
        out.dtype,
        DType::F32 | DType::F64 | DType::F16 | DType::BF16
    ) {
        return None;
    }
    let ExprKind::Binary(BinOp::Mul, x, y) = &uncast(&st.rhs).kind else {
        return None;
    };
    let read = |e: &crate::frontend::ast::Expr| match &uncast(e).kind {
        ExprKind::Access { tensor, subscripts } => Some((tensor.clone(), subscripts.clone())),
        _ => None,
    };
    let (x, y) = (read(x)?, read(y)?);
    match (scop.tensor(&x.0), scop.tensor(&y.0)) {
        (Some(a), Some(b)) if a.dtype == b.dtype && matches!(a.dtype, DType::F16 | DType::BF16) => {
            Some((a.dtype, x, y))
        }
        _ => None,
    }
}

/// The roles of the update `s`'s iterators: each band member is exactly
/// one of them ([`member_iterators`]), all distinct and every one of them
/// taken, so a schedule point is one iteration; the last three are `m`,
/// `n` and `k`, `k` a reduction index of `S` (`st`).
fn iterator_roles(
    band: &ScheduleNode,
    s: &ModelStmt,
    st: &Statement,
    nb: usize,
) -> Result<Option<Iterators>> {
    if s.iterators.len() != nb + 1 {
        return Ok(None);
    }
    let Some(members) = member_iterators(band, s, nb + 1)? else {
        return Ok(None);
    };
    let (m, n, k) = (
        members[nb - 2].clone(),
        members[nb - 1].clone(),
        members[nb].clone(),
    );
    let batch: Vec<String> = members[..nb - 2].to_vec();
    let mut distinct = members.clone();
    distinct.sort();
    distinct.dedup();
    if distinct.len() != members.len() || !st.reduction_indices.contains(&k) {
        return Ok(None);
    }
    Ok(Some(Iterators {
        members,
        m,
        n,
        k,
        batch,
    }))
}

/// The read `(tensor, subs)` as an operand whose rows run along `row`
/// (`m` for A, `n` for B): `row` and `k` each in exactly one dimension
/// with coefficient 1, the other of `m` and `n` in none, and one of the
/// two in the last (contiguous) dimension, so eight consecutive elements
/// of a tile row are 16 consecutive bytes.
fn operand((tensor, subs): &Read, row: &str, it: &Iterators) -> Option<Operand> {
    let other = if row == it.m { &it.n } else { &it.m };
    let mut row_dim = None;
    let mut k_dim = None;
    for (d, a) in subs.iter().enumerate() {
        if a.coeff(other) != 0 {
            return None;
        }
        let (r, kk) = (a.coeff(row), a.coeff(&it.k));
        match (r, kk) {
            (0, 0) => {}
            (1, 0) if row_dim.is_none() => row_dim = Some(d),
            (0, 1) if k_dim.is_none() => k_dim = Some(d),
            _ => return None,
        }
    }
    let last = subs.len().checked_sub(1)?;
    let (r, kd) = (row_dim?, k_dim?);
    if r != last && kd != last {
        return None;
    }
    Some(Operand {
        tensor: tensor.clone(),
        subscripts: subs.clone(),
        k_contiguous: kd == last,
    })
}

/// Operands A (`m`, `k`) and B (`k`, `n`) from the product's reads `x`
/// and `y`, in either order ([`operand`]).
fn operands(x: &Read, y: &Read, it: &Iterators) -> Option<(Operand, Operand)> {
    match (operand(x, &it.m, it), operand(y, &it.n, it)) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => match (operand(y, &it.m, it), operand(x, &it.n, it)) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        },
    }
}

/// The upper bound of each of `s`'s iterators, in the parameters, and
/// its extent as an expression, where `s`'s domain (under the context) is
/// the box `0 <= it <= hi` of those bounds: the fragments' tiles start at
/// 0 and read out-of-domain elements as zeros. `None` otherwise.
fn domain_box(isl: &Isl, scop: &Scop, s: &ModelStmt) -> Result<Option<(Vec<Affine>, Vec<Expr>)>> {
    let mut bounds = Vec::new();
    let mut his = Vec::new();
    let mut extents = Vec::new();
    for it in &s.iterators {
        let pos = s.iterators.iter().position(|i| i == it).unwrap_or(0) as i32;
        let max = s.domain.copy()?.dim_max(pos)?;
        let Some(aff) = super::promote::single_aff(&max)? else {
            return Ok(None);
        };
        let (c, terms) = crate::isl::aff_in_params(&aff)?;
        let mut hi = Affine::constant(c);
        for (p, v) in terms {
            hi = hi.add(&Affine::var(&p).scale(v));
        }
        bounds.push(format!("0 <= {it} <= {hi}"));
        his.push(hi);
        let e = ast_build_expr_from_pw_aff(scop.context.copy()?, max)
            .ok_or_else(|| crate::error::Error::Internal("isl could not print a bound".into()))?;
        extents.push(Expr::Op(
            ast::Op::Add,
            vec![ast::expr_from_isl(&e)?, Expr::Int(1)],
        ));
    }
    let text = format!(
        "{}{{ {}[{}] : {} }}",
        scop.param_prefix,
        s.name,
        s.iterators.join(", "),
        bounds.join(" and ")
    );
    let context = scop.context.copy()?;
    let boxed = isl.set(&text)?.intersect_params(context.copy()?)?;
    if !boxed.is_equal(&s.domain.copy()?.intersect_params(context)?)? {
        return Ok(None);
    }
    Ok(Some((his, extents)))
}

/// Whether every dependence among the band's instances (`domain`)
/// relates two instances of one element `(b, m, n)`: `D ∩ (T⁻¹ ∘ T)ᶜ =
/// ∅` with `T` the projection on the `nb` block members. The accumulator
/// chains are then the only order to keep, and the elements may be spread
/// over the lanes in the fragments' layout.
fn within_elements(
    band: &ScheduleNode,
    nb: usize,
    domain: crate::isl::UnionSet,
    deps: &Dependences,
) -> Result<bool> {
    let values = super::mapping::project_members(
        &band.band_get_partial_schedule_union_map()?,
        0,
        nb,
        nb + 1,
    )?
    .intersect_domain(domain.copy()?)?;
    let same = values.copy()?.apply_range(values.reverse()?)?;
    let inside = deps
        .all()?
        .intersect_domain(domain.copy()?)?
        .intersect_range(domain)?;
    Ok(inside.subtract(same)?.is_empty()?)
}

/// The recognised update: what the epilogue statements are checked
/// against.
struct UpdateMatch<'a> {
    isl: &'a Isl,
    program: &'a Program,
    scop: &'a Scop,
    band: &'a ScheduleNode,
    nb: usize,
    update: &'a ModelStmt,
    /// The epilogue candidates ([`update_and_others`]).
    others: &'a [&'a ModelStmt],
    iterators: &'a Iterators,
    /// The upper bound of each of the update's iterators ([`domain_box`]).
    his: &'a [Affine],
}

impl UpdateMatch<'_> {
    /// The epilogue statements, in program order, and the tensor the
    /// region stores ([`Contraction::stored`]): `C[e] = f(C[e], inputs)`
    /// on the update's element space, after the update in program order
    /// (the legality of the tree orders them after every step of their
    /// element; the dependence test keeps them within one element). `None`
    /// where one is not of that form ([`Self::epilogue_statement`]).
    fn epilogue(&self) -> Result<Option<(Vec<Epilogue>, String)>> {
        let st = &self.program.statements[self.update.source];
        let mut epilogue = Vec::new();
        let mut stored = st.lhs_tensor.clone();
        for o in self.others {
            let Some(e) = self.epilogue_statement(o, &stored)? else {
                return Ok(None);
            };
            let est = &self.program.statements[o.source];
            if est.lhs_tensor != st.lhs_tensor {
                stored = est.lhs_tensor.clone();
            }
            epilogue.push(e);
        }
        Ok(Some((epilogue, stored)))
    }

    /// Epilogue statement `o`, the region storing `stored` so far: after
    /// the update (one before it, `C = D; C += A B`, sets the values the
    /// accumulators start from, which the region has no form for), each
    /// block member one of its iterators and no other iterator; in place
    /// on the update's element, or, last, moving the element into another
    /// tensor ([`moves_out`]) at any order of the element's iterators (a
    /// transposed output), which it must not read; reading the update's
    /// tensor only at the element; on the same element box as the update.
    fn epilogue_statement(&self, o: &ModelStmt, stored: &str) -> Result<Option<Epilogue>> {
        let (program, s) = (self.program, self.update);
        let st = &program.statements[s.source];
        if o.source < s.source {
            return Ok(None);
        }
        let est = &program.statements[o.source];
        let Some(e_roles) = member_iterators(self.band, o, self.nb)? else {
            return Ok(None);
        };
        if o.iterators.len() != self.nb || stored != st.lhs_tensor {
            return Ok(None);
        }
        let moved = est.lhs_tensor != st.lhs_tensor;
        if moved && !moves_out(program, self.scop, s, self.others, o)? {
            return Ok(None);
        }
        let s_roles = self.element_roles();
        if !Self::writes_the_element(est, &e_roles, &s_roles, moved)
            || !self.reads_the_element_only(o, &e_roles, &s_roles, moved)
            || !self.on_the_update_box(o, &e_roles)?
        {
            return Ok(None);
        }
        Ok(Some(Epilogue {
            statement: o.name.clone(),
            element: s_roles.iter().map(|&r| e_roles[r].clone()).collect(),
            iterators: e_roles,
        }))
    }

    /// Further sum `t` as a [`Term`]: a product of two reads of `dtype`
    /// tensors, the band's block members its iterators (its batch, `m`
    /// and `n`) and its last iterator a reduction index (its `k`), writing
    /// the update's element, operands laid out as the update's `a` and `b`
    /// (so that one set of buffers, fragments and descriptors serves
    /// every loop), and its domain a box from 0 whose bounds but `k`'s
    /// are the update's. `None` otherwise.
    fn term(&self, t: &ModelStmt, dtype: DType, a: &Operand, b: &Operand) -> Result<Option<Term>> {
        let (program, nb) = (self.program, self.nb);
        let st = &program.statements[t.source];
        let Some((ty, x, y)) = product_reads(self.scop, st) else {
            return Ok(None);
        };
        let Some(members) = member_iterators(self.band, t, nb)? else {
            return Ok(None);
        };
        let [k] = st.reduction_indices.as_slice() else {
            return Ok(None);
        };
        if ty != dtype || t.iterators.len() != nb + 1 || members.contains(k) {
            return Ok(None);
        }
        let mut all = members.clone();
        all.push(k.clone());
        let it = Iterators {
            members: all,
            m: members[nb - 2].clone(),
            n: members[nb - 1].clone(),
            k: k.clone(),
            batch: members[..nb - 2].to_vec(),
        };
        let mut distinct = it.members.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != it.members.len() {
            return Ok(None);
        }
        // The update's element: the same role for each left-side index.
        let roles: Vec<Option<usize>> = st
            .lhs_indices
            .iter()
            .map(|i| members.iter().position(|r| r == i))
            .collect();
        let own: Vec<Option<usize>> = self.element_roles().into_iter().map(Some).collect();
        if roles != own {
            return Ok(None);
        }
        let Some((ta, tb)) = operands(&x, &y, &it) else {
            return Ok(None);
        };
        if ta.k_contiguous != a.k_contiguous || tb.k_contiguous != b.k_contiguous {
            return Ok(None);
        }
        let Some((his, extents)) = domain_box(self.isl, self.scop, t)? else {
            return Ok(None);
        };
        let bound = |s: &ModelStmt, his: &[Affine], it: &str| {
            s.iterators
                .iter()
                .position(|i| i == it)
                .map(|p| his[p].clone())
        };
        for (j, m) in members.iter().enumerate() {
            let own = bound(self.update, self.his, &self.iterators.members[j]);
            if own.is_none() || bound(t, &his, m) != own {
                return Ok(None);
            }
        }
        let Some(kp) = t.iterators.iter().position(|i| i == k) else {
            return Ok(None);
        };
        Ok(Some(Term {
            statement: t.name.clone(),
            m: it.m,
            n: it.n,
            k: it.k,
            batch: it.batch,
            a: ta,
            b: tb,
            k_extent: extents[kp].clone(),
        }))
    }

    /// The role (band member) of each of the update's left-side indices:
    /// its element `C[e]`.
    fn element_roles(&self) -> Vec<usize> {
        let roles = &self.iterators.members;
        self.program.statements[self.update.source]
            .lhs_indices
            .iter()
            .filter_map(|i| roles.iter().position(|r| r == i))
            .collect()
    }

    /// Whether epilogue statement `est` (its members' iterators `e_roles`)
    /// writes the update's element (roles `s_roles`): in place, `C`'s own
    /// element; moved, any order of the element's iterators (a transposed
    /// output), all of them.
    fn writes_the_element(
        est: &Statement,
        e_roles: &[String],
        s_roles: &[usize],
        moved: bool,
    ) -> bool {
        let mut mine: Vec<usize> = est
            .lhs_indices
            .iter()
            .filter_map(|i| e_roles.iter().position(|r| r == i))
            .collect();
        if mine.len() != est.lhs_indices.len() {
            return false;
        }
        let mut own = s_roles.to_vec();
        if moved {
            mine.sort_unstable();
            own.sort_unstable();
        }
        mine == own
    }

    /// Whether epilogue statement `o` reads the update's tensor `C` only
    /// at the element (`C`'s subscripts in `o`'s iterators) and, where it
    /// moves the element out, not the tensor it writes.
    fn reads_the_element_only(
        &self,
        o: &ModelStmt,
        e_roles: &[String],
        s_roles: &[usize],
        moved: bool,
    ) -> bool {
        let st = &self.program.statements[self.update.source];
        let est = &self.program.statements[o.source];
        let lhs: Vec<Affine> = s_roles.iter().map(|&r| Affine::var(&e_roles[r])).collect();
        o.accesses(self.program).iter().all(|a| {
            a.write
                || !((a.tensor == st.lhs_tensor && a.subscripts != lhs)
                    || (a.tensor == est.lhs_tensor && moved))
        })
    }

    /// Whether epilogue statement `o`'s domain is the update's element
    /// box: each member's iterator `0 <= it <= hi` with the update's bound
    /// of that member.
    fn on_the_update_box(&self, o: &ModelStmt, e_roles: &[String]) -> Result<bool> {
        let (scop, s) = (self.scop, self.update);
        let bounds: Vec<String> = e_roles
            .iter()
            .enumerate()
            .map(|(j, it)| {
                let role = &self.iterators.members[j];
                let pos = s.iterators.iter().position(|i| i == role).unwrap_or(0);
                format!("0 <= {it} <= {}", self.his[pos])
            })
            .collect();
        let text = format!(
            "{}{{ {}[{}] : {} }}",
            scop.param_prefix,
            o.name,
            o.iterators.join(", "),
            bounds.join(" and ")
        );
        let context = scop.context.copy()?;
        let boxed = self.isl.set(&text)?.intersect_params(context.copy()?)?;
        Ok(boxed.is_equal(&o.domain.copy()?.intersect_params(context)?)?)
    }
}

/// A block tile and its warps.
struct BlockTile {
    /// Tile sizes along `m`, `n`, `k`.
    tile: [i64; 3],
    /// Warps along `m` and `n`.
    warps: [i64; 2],
    /// The automatic latency layout was taken ([`latency_layout`]): it
    /// keeps the reduction whole.
    unsplit: bool,
}

/// The block tile and the warps: the user's tile with their threads (or,
/// threads 0, a warpgroup per 64 rows where the tile fits `wgmma`, else
/// the most threads that divide it), or the automatic choice (the latency
/// layout where it qualifies, else [`auto_layout`]). `None` where no warp
/// layout divides the user's tile.
fn block_tile(
    band: &ScheduleNode,
    nb: usize,
    user: Option<([i64; 3], u32)>,
    a: &Operand,
    b: &Operand,
) -> Result<Option<BlockTile>> {
    let user_tile = |tile: [i64; 3], warps: Option<[i64; 2]>| {
        warps.map(|warps| BlockTile {
            tile,
            warps,
            unsplit: false,
        })
    };
    let layout = match user {
        Some((tile, 0)) => {
            let warpgroups = u32::try_from(tile[0] / 64).unwrap_or(0);
            let wg =
                layout_for(tile, warpgroups * 128).filter(|w| wgmma_fits(a, b, tile, *w, false));
            let warps = wg.or_else(|| [256, 128, 64, 32].iter().find_map(|t| layout_for(tile, *t)));
            user_tile(tile, warps)
        }
        Some((tile, threads)) => user_tile(tile, layout_for(tile, threads)),
        None => {
            let e: Vec<Option<i64>> = (nb - 2..nb)
                .chain(0..nb - 2)
                .map(|i| super::mapping::member_extent(band, i))
                .collect::<Result<_>>()?;
            let k_extent = super::mapping::member_extent(band, nb)?;
            let latency = latency_layout(&e, k_extent, a, b);
            let unsplit = latency.is_some();
            let (tile, warps) = latency.unwrap_or_else(|| auto_layout(&e, k_extent));
            Some(BlockTile {
                tile,
                warps,
                unsplit,
            })
        }
    };
    Ok(layout)
}

/// The split of the reduction over blocks, and the extents `m`, `n`, `k`
/// the latency regime reads (`None` where unknown): the user's split, or
/// (automatic, unless the latency layout keeps the reduction whole)
/// enough blocks to fill the GPU when the output has few tiles and `k` is
/// long ([`auto_split`]). A batch takes the grid's z axis, so a batched
/// contraction keeps one (and its extents are left unknown).
fn reduction_split(
    band: &ScheduleNode,
    nb: usize,
    batched: bool,
    k_split: Option<u32>,
    unsplit: bool,
    tile: [i64; 3],
) -> Result<(i64, Vec<Option<i64>>)> {
    let e: Vec<Option<i64>> = if !batched {
        (0..=nb)
            .map(|i| super::mapping::member_extent(band, i))
            .collect::<Result<_>>()?
    } else {
        vec![None; 3]
    };
    let split = if batched {
        1
    } else if let Some(s) = k_split {
        i64::from(s)
    } else if unsplit {
        1
    } else {
        auto_split(&e, tile)
    };
    Ok((split, e))
}

/// Recognises the contraction of the kernel whose outermost band is
/// `band` (untiled, `nb` members mapped to blocks); `tile` and `threads`
/// are the user's sizes, `None` for the automatic choice. The steps: the
/// band's shape ([`contraction_band`]), its statements
/// ([`update_and_others`]), the update's product ([`product_reads`]), the
/// iterators' roles ([`iterator_roles`]), the operands ([`operands`]),
/// the domain box ([`domain_box`]), the dependences
/// ([`within_elements`]), the epilogue ([`UpdateMatch::epilogue`]); then
/// the tiling ([`block_tile`]), the split ([`reduction_split`]) and the
/// pipeline's stages ([`latency_stages`]).
#[allow(clippy::too_many_arguments)]
pub fn recognise(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    band: &ScheduleNode,
    nb: usize,
    user: Option<([i64; 3], u32)>,
    k_split: Option<u32>,
) -> Result<Option<Contraction>> {
    if !contraction_band(band, nb)? {
        return Ok(None);
    }
    let domain = band.get_domain()?;
    let Some((s, others, further)) = update_and_others(program, scop, &domain)? else {
        return Ok(None);
    };
    let st = &program.statements[s.source];
    let Some((dtype, x, y)) = product_reads(scop, st) else {
        return Ok(None);
    };
    let Some(it) = iterator_roles(band, s, st, nb)? else {
        return Ok(None);
    };
    let Some((a, b)) = operands(&x, &y, &it) else {
        return Ok(None);
    };
    let Some((his, extents)) = domain_box(isl, scop, s)? else {
        return Ok(None);
    };
    if !within_elements(band, nb, domain, deps)? {
        return Ok(None);
    }
    let update = UpdateMatch {
        isl,
        program,
        scop,
        band,
        nb,
        update: s,
        others: &others,
        iterators: &it,
        his: &his,
    };
    let Some((epilogue, stored)) = update.epilogue()? else {
        return Ok(None);
    };
    let mut terms = Vec::new();
    for t in further {
        match update.term(t, dtype, &a, &b)? {
            Some(term) => terms.push(term),
            None => return Ok(None),
        }
    }
    let at = |name: &str| {
        let pos = s.iterators.iter().position(|i| i == name).unwrap_or(0);
        extents[pos].clone()
    };
    let extents: [Expr; 3] = [at(&it.m), at(&it.n), at(&it.k)];
    let Some(BlockTile {
        tile,
        warps,
        unsplit,
    }) = block_tile(band, nb, user, &a, &b)?
    else {
        return Ok(None);
    };
    let auto = user.is_none();
    let wgmma = wgmma_fits(&a, &b, tile, warps, auto);
    let stored_dtype = program.tensor(&stored).map_or(DType::F32, |t| t.dtype);
    // The elements of k summed into one accumulator: the update's and every
    // further term's (unknown where any is).
    let values = program.known_params();
    let k_sums = std::iter::once(&extents[2])
        .chain(terms.iter().map(|t| &t.k_extent))
        .map(|e| super::eval(e, &values).ok())
        .sum::<Option<i64>>();
    let promoted = Accumulation::promotes(stored_dtype, k_sums);
    // The automatic tile takes wgmma's k tile: one 128-byte swizzled row.
    // A promoted wgmma step keeps a second set of accumulators (the k
    // run's sums, `codegen::mma`): at most 128 columns, so that a thread's
    // 64 accumulators and 64 sums fit its registers. Measured on the H200
    // (f16 4096^3 into f32, promoted): 128 x 256 tiles, 128 + 128 registers,
    // spilled and took 786 us against 211 us chained.
    let tile = if wgmma && auto {
        let n = if promoted {
            tile[1].min(PROMOTED_WGMMA_N)
        } else {
            tile[1]
        };
        [tile[0], n, WGMMA_TILE_K]
    } else {
        tile
    };
    // A short reduction: two blocks a multiprocessor (see
    // `two_blocks_per_sm`).
    let output = [&extents[0], &extents[1]].map(|e| super::eval(e, &values).ok());
    let two_blocks = wgmma
        && auto
        && !promoted
        && it.batch.is_empty()
        && two_blocks_per_sm(tile, output, k_sums);
    let tile = if two_blocks { TWO_BLOCKS_TILE } else { tile };
    let (split, e) = reduction_split(band, nb, !it.batch.is_empty(), k_split, unsplit, tile)?;
    // Several reduction loops run one after the other, unsplit.
    let split = if terms.is_empty() { split } else { 1 };
    let mut c = Contraction {
        statement: s.name.clone(),
        m: it.m,
        n: it.n,
        k: it.k,
        batch: it.batch,
        dtype,
        a,
        b,
        extents,
        tile,
        warps,
        // wgmma keeps a step's instructions in flight across the next
        // barrier: a fourth stage keeps two tiles copied ahead (see
        // `codegen::mma`).
        stages: match (wgmma, two_blocks) {
            (true, true) => TWO_BLOCKS_STAGES,
            (true, false) => 4,
            (false, _) => STAGES,
        },
        split,
        whole_k: false,
        wgmma,
        epilogue,
        stored,
        terms,
        accumulation: Accumulation::for_stored(stored_dtype, k_sums, tile[2]),
        copies: super::tma::Copies::CpAsync,
        stores: super::stores::Stores::Pairs,
    };
    // The latency regime sizes the stages by the update's k tiles alone.
    let latency = if c.terms.is_empty() {
        latency_stages(&c, &e)
    } else {
        None
    };
    match latency {
        Some(Latency::WholeK(stages)) => {
            c.stages = stages;
            c.whole_k = true;
        }
        Some(Latency::Deeper(stages)) => c.stages = stages,
        None => {}
    }
    c.check_stages()?;
    Ok(Some(c))
}

/// Fewest stages of a `wgmma` pipeline whose stages are refilled: with
/// two, the `cp.async` path copies no tile ahead (wrong in the
/// emulation), and the copy engine's path failed its check on the H200
/// (f16 1000^3, 128 x 128 tiles; cause not found). polyfuse makes 3, 4
/// or 6, or holds every k tile at once (`whole_k`, no refill); the check
/// keeps it so.
const MIN_REFILLED_WGMMA_STAGES: i64 = 3;

/// The tile of [`two_blocks_per_sm`]: 64 accumulators a thread (two
/// warpgroups of `wgmma.m64n128k16`), so two blocks' registers fit.
const TWO_BLOCKS_TILE: [i64; 3] = [128, 128, WGMMA_TILE_K];

/// Its stages: 3 x 32 KB, so two blocks' stages fit in shared memory.
const TWO_BLOCKS_STAGES: i64 = 3;

/// The longest reduction of [`two_blocks_per_sm`]: 16 k tiles of 64.
const SHORT_K: i64 = 1024;

/// Whether a `wgmma` product with the automatic `tile`, output extents
/// `output` (`m`, `n`; `None` where unknown) and a reduction of `k`
/// elements in all (`None`: unknown) should run 128 x 128 tiles, 3 stages
/// deep, two blocks a multiprocessor, instead of one block of 128 x 256
/// tiles: where the reduction is short ([`SHORT_K`] or less) and the
/// output has tiles for two waves of two blocks. A block spends a larger
/// share of its time outside its main loop when its k is short (filling
/// its pipeline, its epilogue, its stores), and with one block a
/// multiprocessor the tensor cores idle meanwhile; a second block runs its
/// products then. Measured on the H200 (`bench/experiments/two_blocks`,
/// against the 128 x 256 tiles in the same call): the MLP's first product
/// (4000 x 4096 x 1024, GELU epilogue into f16) 96 us against 125; a
/// product with a bias and GELU at 4096 x 4096 x 1024 68.7 us against
/// 70.7, with a bias and tanh 65.1 against 67.3; plain products at k =
/// 1024 and 512 level or 2.5% faster. Products with k = 4096 lost
/// (4096^3: 204.7 us against 192.6; with a bias and GELU 224.9 against
/// 204.9): they keep one block of 128 x 256.
fn two_blocks_per_sm(tile: [i64; 3], output: [Option<i64>; 2], k: Option<i64>) -> bool {
    let ([Some(m), Some(n)], Some(k)) = (output, k) else {
        return false;
    };
    let [tm, tn, _] = TWO_BLOCKS_TILE;
    let tiles = ((m + tm - 1) / tm) * ((n + tn - 1) / tn);
    tile[..2] == [128, 256] && k <= SHORT_K && tiles >= 4 * ENOUGH_BLOCKS
}

/// Shared memory the automatic stage count may fill (of the H100's 227 KB
/// a block may opt in to; 3 KB left for static shared memory).
const SHARED_FOR_STAGES: i64 = 224 * 1024;

/// Most stages of a copy pipeline.
const MAX_STAGES: i64 = 16;

/// The latency regime of `c` for extents `e` (`m`, `n`, `k`, `None` where
/// unknown or batched): when the grid has no more blocks than the GPU has
/// multiprocessors (one block each: a few output tiles, or a split
/// reduction) and shared memory can hold every k tile of a block at once
/// (in the larger of the two engines' layouts), `Some(stages)` with one
/// stage per k tile of a block ([`Contraction::whole_k`]). All of a
/// block's copies are then issued at its start and no stage is refilled,
/// so global-memory latency is paid once per block instead of once per
/// few tiles (cuBLAS's kernel for 128 x 1024 x 1024 f16 on the H100 keeps
/// its 16 k tiles of 64 in 213 KB of shared memory), and the pipeline's
/// loops are not unrolled: each stage is used once, and a block that runs
/// its code once spends its time fetching instructions (Nsight Compute,
/// 64 x 64 x 64 tiles split 4: 65% of the warps' stalls were instruction
/// fetch).
///
/// Measured on the H100 (128 x 1024 x 1024 f16, 64 x 64 x 64, split 4):
/// 7.49 us with four stages unrolled, 7.24 us with the loops rolled, 6.91
/// us with six stages rolled (every k tile in flight). A hand-written
/// kernel with every k tile in flight (`bench/experiments/gemm-latency`,
/// 20 launches in a CUDA graph): 64 x 32 tiles unsplit (16 stages, 64
/// blocks) 3.85 us, split 2 4.39 us; 64 x 64 split 2 4.60 us, split 4
/// 5.00 us; cuBLAS 3.84 us.
///
/// Where shared memory cannot hold a block's k tiles, small `wgmma`
/// tiles get a deeper pipeline instead ([`DEEPER_STAGES`]).
fn latency_stages(c: &Contraction, e: &[Option<i64>]) -> Option<Latency> {
    let (Some(em), Some(en), Some(ek)) = (e[0], e[1], e[2]) else {
        return None;
    };
    let [tm, tn, tk] = c.tile;
    let blocks = ((em + tm - 1) / tm) * ((en + tn - 1) / tn) * c.split;
    if blocks > ENOUGH_BLOCKS {
        return None;
    }
    let per_block = ((ek + tk - 1) / tk + c.split - 1) / c.split;
    let stage = c.stage_bytes() as i64;
    let fit = (SHARED_FOR_STAGES / stage.max(1)).min(MAX_STAGES);
    if per_block <= fit {
        return Some(Latency::WholeK(per_block.max(2)));
    }
    (c.wgmma && tm * tn <= 64 * 64 && DEEPER_STAGES <= fit && DEEPER_STAGES > c.stages)
        .then_some(Latency::Deeper(DEEPER_STAGES))
}

/// What the latency regime changes in a contraction's pipeline.
enum Latency {
    /// A stage per k tile of a block ([`Contraction::whole_k`]).
    WholeK(i64),
    /// More stages than the default, refilled as usual.
    Deeper(i64),
}

/// Stages of a one-wave grid whose blocks cannot hold all of k, on
/// `wgmma` tiles of 64 x 64 or smaller: four tiles copied ahead instead of
/// two. Measured on the H100 (f16, 64 x 64 x 64 tiles, `--bench`, one
/// run each): 128 x 4096 x 4096 (128 blocks, 64 k tiles each) 30.2 us
/// with four stages, 20.0 with six, 21.2 with eight, 24.2 with twelve
/// (cuBLAS 15.4); 256 x 1024 x 4096 (split 2) 14.2 -> 13.7; 512 x 512 x
/// 8192 (split 2) 22.8 -> 21.5. With 64 x 128 tiles (1024^3) six stages
/// took 10.1 us against 9.6: larger tiles keep four.
const DEEPER_STAGES: i64 = 6;

/// Whether epilogue statement `o`, writing a tensor other than the
/// update's, may take the update's value out of the region: the update's
/// tensor is a temp, the other's element type one the region stores, and no
/// statement but the update, its initialisation and the region's other
/// epilogue statements (`others`) reads it, so it need never be stored.
fn moves_out(
    program: &Program,
    scop: &Scop,
    update: &crate::model::ModelStmt,
    others: &[&crate::model::ModelStmt],
    o: &crate::model::ModelStmt,
) -> Result<bool> {
    let st = &program.statements[update.source];
    let Some(acc) = scop.tensor(&st.lhs_tensor) else {
        return Ok(false);
    };
    let Some(out) = scop.tensor(&program.statements[o.source].lhs_tensor) else {
        return Ok(false);
    };
    // The region stores 16-bit floats, f32 and f64 (`codegen::mma`).
    let storable = matches!(
        out.dtype,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64
    );
    if acc.role != crate::frontend::ast::TensorRole::Temp || !storable {
        return Ok(false);
    }
    let inside = |name: &str| others.iter().any(|x| x.name == name);
    for s in &scop.statements {
        if s.source == update.source || inside(&s.name) {
            continue;
        }
        let reads = s.accesses(program);
        if reads.iter().any(|a| !a.write && a.tensor == st.lhs_tensor) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The iterator of statement `o` that each of the first `members` members
/// of `band` is, when each is exactly one iterator (coefficient 1, no
/// constant, no parameter): `None` otherwise.
fn member_iterators(
    band: &ScheduleNode,
    o: &crate::model::ModelStmt,
    members: usize,
) -> Result<Option<Vec<String>>> {
    let partial = band
        .band_get_partial_schedule_union_map()?
        .intersect_domain(crate::isl::UnionSet::from_set(o.domain.copy()?)?)?;
    let pma = PwMultiAff::from_map(crate::isl::Map::from_union_map(partial)?)?;
    let value = |v: crate::isl::Val| crate::isl::val_to_i64(&v);
    let mut out = Vec::new();
    for d in 0..members as i32 {
        let Some(aff) = super::promote::single_aff(&pma.get_pw_aff(d)?)? else {
            return Ok(None);
        };
        if value(aff.get_constant_val()?)? != 0 {
            return Ok(None);
        }
        for p in 0..aff.dim(DimType::Param)? {
            if value(aff.get_coefficient_val(DimType::Param, p)?)? != 0 {
                return Ok(None);
            }
        }
        let mut found = None;
        for i in 0..o.iterators.len() as i32 {
            match value(aff.get_coefficient_val(DimType::In, i)?)? {
                0 => {}
                1 if found.is_none() => found = Some(i as usize),
                _ => return Ok(None),
            }
        }
        match found {
            Some(i) => out.push(o.iterators[i].clone()),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Fewest k tiles a block of a split reduction runs in the automatic
/// choice: the copy pipeline needs a few steps to overlap anything.
const MIN_K_TILES_PER_SPLIT: i64 = 2;

/// Most blocks the automatic choice splits a reduction over.
const MAX_AUTO_SPLIT: i64 = 4;

/// Blocks an automatic split aims at: about one per multiprocessor.
const FILL_BLOCKS: i64 = 128;

/// The automatic split of the reduction for extents `e` (`m`, `n`, `k`,
/// `None` where unknown at compile time) and `tile`: 1 when the tiles
/// alone give [`FILL_BLOCKS`] blocks or an extent is unknown; else the
/// smallest split that does (or the largest allowed), within
/// [`MAX_AUTO_SPLIT`] and at least [`MIN_K_TILES_PER_SPLIT`] k tiles per
/// block. Measured on the H100 (128 x 1024 x 1024 f16): 64 x 64 x 64
/// tiles (32) split 4 took 6.9 us; 32 x 32 x 32 tiles (128) unsplit 8.0
/// us; 64 x 128 x 64 split 4 9.0 us.
fn auto_split(e: &[Option<i64>], tile: [i64; 3]) -> i64 {
    let (Some(em), Some(en), Some(ek)) = (e[0], e[1], e[2]) else {
        return 1;
    };
    let tiles = ((em + tile[0] - 1) / tile[0]) * ((en + tile[1] - 1) / tile[1]);
    let k_tiles = (ek + tile[2] - 1) / tile[2];
    let mut split = 1;
    while tiles * split < FILL_BLOCKS
        && split < MAX_AUTO_SPLIT
        && k_tiles / (split + 1) >= MIN_K_TILES_PER_SPLIT
    {
        split += 1;
    }
    split
}

/// Blocks the automatic choice wants at least (the H100 has 132
/// multiprocessors).
const ENOUGH_BLOCKS: i64 = 132;

/// The layouts the latency regime tries ([`latency_layout`]): one
/// warpgroup of 64 rows, `n` 128, 64 or 32 wide.
const LATENCY_LAYOUTS: [(i64, i64, i64, i64); 3] =
    [(64, 128, 1, 4), (64, 64, 2, 2), (64, 32, 2, 2)];

/// The automatic layout in the latency regime, for `m` and `n` extents
/// `e` and `k` all known at compile time: among [`LATENCY_LAYOUTS`] whose
/// tiles are at least three quarters real work along `m` and `n`, whose
/// grid is one wave ([`ENOUGH_BLOCKS`] blocks or fewer) without a split,
/// and whose block can hold every k tile of 64 of operands `a` and `b` in
/// shared memory at once (in the padded `mma.sync` layout, the larger),
/// the one with the most
/// blocks; the reduction is then not split (see [`latency_stages`]).
/// `None` where none qualifies: [`auto_layout`] decides.
///
/// Why not split: on the H100 (128 x 1024 x 1024 f16, hand-written
/// kernels with every k tile in flight, `bench/experiments/gemm-latency`,
/// 20 launches in a CUDA graph) 64 x 32 tiles unsplit took 3.85 us (64
/// blocks), split 2 4.39 us (128 blocks); 64 x 64 split 2 4.60 us, split
/// 4 5.00 us: a cluster's partial sums cost more than the blocks they add.
fn latency_layout(
    e: &[Option<i64>],
    k: Option<i64>,
    a: &Operand,
    b: &Operand,
) -> Option<([i64; 3], [i64; 2])> {
    let (&[Some(em), Some(en)], Some(k)) = (e, k) else {
        return None;
    };
    let k_tiles = (k + WGMMA_TILE_K - 1) / WGMMA_TILE_K;
    let used = |x: i64, t: i64| x as f64 / (((x + t - 1) / t) * t).max(1) as f64;
    let blocks = |tm: i64, tn: i64| ((em + tm - 1) / tm) * ((en + tn - 1) / tn);
    let stage_bytes = |tm: i64, tn: i64| {
        let len = |x: &Operand, rows: i64| {
            let (lines, pitch) = padded_layout(x, rows, WGMMA_TILE_K);
            lines * pitch
        };
        2 * (len(a, tm) + len(b, tn))
    };
    LATENCY_LAYOUTS
        .iter()
        .filter(|(tm, tn, _, _)| {
            used(em, *tm) >= 0.75
                && used(en, *tn) >= 0.75
                && blocks(*tm, *tn) <= ENOUGH_BLOCKS
                && k_tiles <= MAX_STAGES
                && k_tiles * stage_bytes(*tm, *tn) <= SHARED_FOR_STAGES
        })
        .fold(None, |best: Option<&(i64, i64, i64, i64)>, l| match best {
            Some(b) if blocks(b.0, b.1) >= blocks(l.0, l.1) => Some(b),
            _ => Some(l),
        })
        .map(|&(tm, tn, wm, wn)| ([tm, tn, WGMMA_TILE_K], [wm, wn]))
}

/// The layout of [`LAYOUTS`] for extents `e` (`m`, `n`, then the batch
/// members; unknown extents count as large) and `k`: the one that gives
/// [`FILL_BLOCKS`] blocks with the smallest split of the reduction (1 to
/// [`MAX_AUTO_SPLIT`]; always 1 with a batch or an unknown extent, see
/// [`auto_split`]), the largest on a tie, among those whose tiles are at
/// least three quarters real work along `m` and along `n`, of 64 rows or
/// more where `m` has 64 (warpgroups: `wgmma` where the operands allow);
/// when none
/// does, among those that give [`ENOUGH_BLOCKS`] blocks, the one that
/// wastes the smallest share of its tiles on padding; else the smallest.
///
/// Measured on the H100 (f16, each shape's best of 64 x 64, 64 x 128, 128
/// x 128 and 128 x 256 tiles split 1, 2 or 4, against this choice): 256 x
/// 1024 x 4096 best 14.4 us, chosen 64 x 64 split 2 (14.4); 512 x 512 x
/// 8192 best 22.3, chosen 64 x 64 split 2 (22.6); 64 x 2048 x 2048 best
/// 10.0 (64 x 64 split 2: 64 blocks), chosen 64 x 64 split 4 (12.7);
/// 1024^3 best 10.2, chosen 64 x 128; 2048 x
/// 2048 x 512 best 16.9, chosen 128 x 256; 128 x 4096 x 4096 best 20.8
/// (64 x 64 split 2), chosen 64 x 64 unsplit (30.9). The rule before
/// (the least padding among layouts with 132 blocks unsplit) took 32 x 32
/// or 32 x 64 tiles on mma.sync for three of them, 1.8 to 2.9 times slower.
fn auto_layout(e: &[Option<i64>], k: Option<i64>) -> ([i64; 3], [i64; 2]) {
    const LARGE: i64 = 1 << 20;
    let count = |x: Option<i64>, t: i64| x.map_or(LARGE, |x| (x + t - 1) / t);
    let batch: i64 = e[2..]
        .iter()
        .fold(1i64, |b, x| b.saturating_mul(x.unwrap_or(LARGE).max(1)));
    let blocks = |tm: i64, tn: i64| -> i64 {
        count(e[0], tm)
            .saturating_mul(count(e[1], tn))
            .saturating_mul(batch)
    };
    // The share of the padded tiles that is not real work (none along an
    // extent unknown at compile time).
    let used = |x: Option<i64>, t: i64| -> f64 {
        x.map_or(1.0, |x| x as f64 / (count(Some(x), t) * t).max(1) as f64)
    };
    let padded =
        |tm: i64, tn: i64| -> i64 { ((1.0 - used(e[0], tm) * used(e[1], tn)) * 1e6) as i64 };
    let known = e.len() == 2 && e.iter().all(Option::is_some) && k.is_some();
    let max_split = if known { MAX_AUTO_SPLIT } else { 1 };
    let k_tiles = k.map_or(LARGE, |k| (k + AUTO_TILE_K - 1) / AUTO_TILE_K);
    let by_split = (1..=max_split)
        .filter(|s| *s == 1 || k_tiles / s >= MIN_K_TILES_PER_SPLIT)
        .find_map(|s| {
            LAYOUTS.iter().find(|(tm, tn, _, _)| {
                (*tm >= 64 || e[0].is_some_and(|m| m < 64))
                    && used(e[0], *tm) >= 0.75
                    && used(e[1], *tn) >= 0.75
                    && blocks(*tm, *tn).saturating_mul(s) >= FILL_BLOCKS
            })
        });
    let pick = by_split
        .or_else(|| {
            LAYOUTS
                .iter()
                .filter(|(tm, tn, _, _)| blocks(*tm, *tn) >= ENOUGH_BLOCKS)
                .min_by_key(|(tm, tn, _, _)| padded(*tm, *tn))
        })
        .unwrap_or(&LAYOUTS[LAYOUTS.len() - 1]);
    ([pick.0, pick.1, AUTO_TILE_K], [pick.2, pick.3])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::Analysed;
    use crate::gpu::GpuOptions;

    #[test]
    fn promotion_runs_grow_with_the_root_of_the_reduction() {
        // The largest power of two at most 4 sqrt(k), at least 64.
        for (k, run) in [
            (65, 64),
            (200, 64),
            (512, 64),
            (1023, 64),
            (1024, 128),
            (4095, 128),
            (4096, 256),
            (16383, 256),
            (16384, 512),
        ] {
            assert_eq!(promoted_run_k(Some(k)), run, "k = {k}");
        }
        assert_eq!(promoted_run_k(None), 64);
        // One run is chained; longer reductions of an f32 store are
        // promoted, an f16 or bf16 store never.
        assert!(!Accumulation::promotes(DType::F32, Some(64)));
        assert!(Accumulation::promotes(DType::F32, Some(65)));
        assert!(Accumulation::promotes(DType::F64, None));
        assert!(!Accumulation::promotes(DType::F16, Some(8192)));
        assert!(!Accumulation::promotes(DType::BF16, Some(8192)));
        // Runs in whole k tiles, at least one.
        assert_eq!(
            Accumulation::for_stored(DType::F32, Some(1100), 32),
            Accumulation::Promoted { k_tiles: 4 }
        );
        assert_eq!(
            Accumulation::for_stored(DType::F32, Some(200), 128),
            Accumulation::Promoted { k_tiles: 1 }
        );
        assert_eq!(
            Accumulation::for_stored(DType::F32, Some(64), 32),
            Accumulation::Chained
        );
    }

    #[test]
    fn short_reductions_with_many_tiles_run_two_blocks_a_multiprocessor() {
        let wide = [128, 256, 64];
        // The MLP's first product: 32 x 32 tiles of 128 x 128, k 1024.
        assert!(two_blocks_per_sm(
            wide,
            [Some(4000), Some(4096)],
            Some(1024)
        ));
        // A long reduction, too few tiles, an unknown extent, or another
        // automatic tile keep one block.
        assert!(!two_blocks_per_sm(
            wide,
            [Some(4000), Some(4096)],
            Some(1025)
        ));
        assert!(!two_blocks_per_sm(
            wide,
            [Some(2048), Some(2048)],
            Some(1024)
        ));
        assert!(!two_blocks_per_sm(wide, [None, Some(4096)], Some(1024)));
        assert!(!two_blocks_per_sm(wide, [Some(4000), Some(4096)], None));
        assert!(!two_blocks_per_sm(
            [64, 128, 64],
            [Some(4000), Some(4096)],
            Some(1024)
        ));
    }

    /// A product of `dtype` operands `A` (`a_shape`) and `B` (`b_shape`)
    /// over `M = 256, N = 192, K = 160` (off every automatic tile), with
    /// `outputs` and `temps` (JSON members) and `body`.
    fn program(
        dtype: &str,
        shapes: [&str; 2],
        outputs: &str,
        temps: &str,
        body: &[&str],
    ) -> String {
        let body: Vec<String> = body.iter().map(|l| format!("\"{l}\"")).collect();
        format!(
            r#"{{"name": "mm", "params": {{"M": 256, "N": 192, "K": 160}},
                "inputs": {{"A": {{"dtype": "{dtype}", "shape": {}}},
                           "B": {{"dtype": "{dtype}", "shape": {}}},
                           "bias": {{"dtype": "{dtype}", "shape": ["N"]}}}},
                "outputs": {{ {outputs} }},
                "temps": {{ {temps} }},
                "body": [{}]}}"#,
            shapes[0],
            shapes[1],
            body.join(", ")
        )
    }

    const ROW_MAJOR: [&str; 2] = [r#"["M", "K"]"#, r#"["K", "N"]"#];
    const C_F32: &str = r#""C": {"dtype": "f32", "shape": ["M", "N"]}"#;
    const D_F16: &str = r#""D": {"dtype": "f16", "shape": ["M", "N"]}"#;
    const ACC: &str = r#""acc": {"dtype": "f32", "shape": ["M", "N"]}"#;

    /// The user's sizes: tiles 64 x 64 x 32 and 128 threads.
    fn user_sizes() -> GpuOptions {
        GpuOptions {
            block: vec![128],
            ..GpuOptions::default()
        }
    }

    /// The contraction the mapping recognises in `json`'s kernels (at
    /// tiles 64 x 64 x 32 and `options`), if any.
    fn contraction(json: &str, options: &GpuOptions) -> Option<Contraction> {
        let a = Analysed::new(json);
        a.plans(&[64, 64, 32], options)
            .into_iter()
            .find_map(|p| p.contraction().cloned())
    }

    #[test]
    fn a_product_is_recognised_with_the_users_tiles() {
        let json = program(
            "f16",
            ROW_MAJOR,
            C_F32,
            "",
            &["C(i, j) +=! A(i, k) * B(k, j)"],
        );
        let c = contraction(&json, &user_sizes()).expect("recognised");
        assert_eq!((c.m.as_str(), c.n.as_str(), c.k.as_str()), ("i", "j", "k"));
        assert!(c.batch.is_empty());
        assert_eq!(c.dtype, DType::F16);
        assert_eq!((c.a.tensor.as_str(), c.b.tensor.as_str()), ("A", "B"));
        // A is K-major (k contiguous), B MN-major.
        assert!(c.a.k_contiguous && !c.b.k_contiguous);
        // The squarest warp tiles of 128 threads: 2 x 2 warps of 32 x 32.
        assert_eq!((c.tile, c.warps), ([64, 64, 32], [2, 2]));
        assert!(!c.wgmma, "a k tile of 32 is no wgmma tile");
        // 4 x 3 output tiles split 2 over 5 k tiles: a wave of 24 blocks,
        // each holding its 3 k tiles at once.
        assert_eq!(c.split, 2);
        assert!(c.whole_k);
        assert_eq!(c.stages, 3);
        assert!(c.epilogue.is_empty());
        assert_eq!(c.stored, "C");
    }

    #[test]
    fn the_shared_tiles_lie_one_after_the_other_in_the_launchs_bytes() {
        let json = program(
            "f16",
            ROW_MAJOR,
            C_F32,
            "",
            &["C(i, j) +=! A(i, k) * B(k, j)"],
        );
        let mut c = contraction(&json, &user_sizes()).expect("recognised");
        c.split = 1;
        let t = c.shared_tiles(false);
        // A, K-major: 64 rows of the 32-wide k tile, padded to 40; B,
        // MN-major: 32 lines (k) of 64 columns, padded to 72.
        assert_eq!((t.a.lines, t.a.chunks_per_line, t.a.line_len), (64, 4, 40));
        assert_eq!((t.b.lines, t.b.chunks_per_line, t.b.line_len), (32, 8, 72));
        assert_eq!((t.a.stage_len, t.b.stage_len), (64 * 40, 32 * 72));
        assert_eq!((t.a.start, t.b.start), (0, 3 * 64 * 40));
        assert_eq!(t.align, 128);
        assert_eq!(c.shared_bytes(), 2 * t.b.end() as usize);
        // The swizzled layout: unpadded, 64-element lines (a 32-wide
        // MN-major tile would take the 64-byte swizzle's 32).
        let w = c.shared_tiles(true);
        assert_eq!((w.a.line_len, w.b.line_len), (64, 64));
        assert_eq!((w.a.stage_len, w.b.start), (64 * 32, 3 * 64 * 32));
        assert_eq!(
            (w.a.lines, w.a.chunks_per_line),
            (t.a.lines, t.a.chunks_per_line)
        );
        // Descriptors on the wgmma engine only: K-major A's 8-row groups
        // 1024 bytes apart, MN-major B's 64-row groups 32 lines of 128
        // bytes apart.
        assert_eq!(t.a.descriptor, None);
        let d = |lbo, sbo, swizzle| Some(Descriptor { lbo, sbo, swizzle });
        assert_eq!(w.a.descriptor, d(16, 1024, 128));
        assert_eq!(w.b.descriptor, d(32 * 128, 1024, 128));
        // A 32-wide MN-major B: the 64-byte swizzle.
        c.tile = [64, 32, 64];
        let n = c.shared_tiles(true);
        assert_eq!((n.b.line_len, n.b.descriptor), (32, d(64 * 64, 512, 64)));
    }

    #[test]
    fn every_tile_is_whole_where_the_known_extents_are_multiples_of_the_tile() {
        let json = program(
            "f16",
            ROW_MAJOR,
            C_F32,
            "",
            &["C(i, j) +=! A(i, k) * B(k, j)"],
        );
        let p = crate::frontend::load_str(&json, "mm.json").unwrap();
        let mut c = contraction(&json, &user_sizes()).expect("recognised");
        // 256 x 192 x 160 in tiles of 64 x 64 x 32.
        assert!(c.every_tile_whole(&p));
        // 192 columns in tiles of 128: the last is partial.
        c.tile = [64, 128, 32];
        assert!(!c.every_tile_whole(&p));
        // An extent without a value is not known to be whole.
        let symbolic = json.replace(r#""M": 256"#, r#""M": null"#);
        let q = crate::frontend::load_str(&symbolic, "mm.json").unwrap();
        let c = contraction(&symbolic, &user_sizes()).expect("recognised");
        assert_eq!(c.tile, [64, 64, 32]);
        assert!(!c.every_tile_whole(&q));
    }

    #[test]
    fn the_automatic_choice_takes_wgmma_tiles_of_64() {
        let json = program(
            "f16",
            ROW_MAJOR,
            C_F32,
            "",
            &["C(i, j) +=! A(i, k) * B(k, j)"],
        );
        let auto = GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        };
        let c = contraction(&json, &auto).expect("recognised");
        assert!(c.wgmma);
        assert_eq!(c.tile[2], WGMMA_TILE_K);
        assert_eq!(c.tile[0] % 64, 0);
    }

    #[test]
    fn an_epilogue_through_an_accumulator_temp_stores_its_own_tensor() {
        let body = [
            "acc(m, n) +=! f32(A(m, k)) * f32(B(k, n))",
            "D(m, n) = f16(tanh(acc(m, n) + f32(bias(n))))",
        ];
        let c = contraction(&program("f16", ROW_MAJOR, D_F16, ACC, &body), &user_sizes())
            .expect("recognised");
        assert_eq!(c.stored, "D");
        let [e] = c.epilogue.as_slice() else {
            panic!("one epilogue statement: {:?}", c.epilogue);
        };
        assert_eq!(e.element.len(), 2);
        assert_eq!((c.m.as_str(), c.n.as_str()), ("m", "n"));
    }

    #[test]
    fn a_transposed_epilogue_and_a_transposed_operand_are_recognised() {
        let d_t = r#""D": {"dtype": "f16", "shape": ["N", "M"]}"#;
        let b_t = [r#"["M", "K"]"#, r#"["N", "K"]"#];
        let body = [
            "acc(m, n) +=! f32(A(m, k)) * f32(B(n, k))",
            "D(n, m) = f16(acc(m, n))",
        ];
        let c =
            contraction(&program("f16", b_t, d_t, ACC, &body), &user_sizes()).expect("recognised");
        assert!(c.a.k_contiguous && c.b.k_contiguous);
        assert_eq!(c.stored, "D");
        assert_eq!(c.epilogue.len(), 1);
    }

    #[test]
    fn an_in_place_epilogue_keeps_the_update_tensor() {
        let body = [
            "C(i, j) +=! A(i, k) * B(k, j)",
            "C(i, j) = max(C(i, j), 0.0)",
        ];
        let c = contraction(&program("f16", ROW_MAJOR, C_F32, "", &body), &user_sizes())
            .expect("recognised");
        assert_eq!(c.stored, "C");
        assert_eq!(c.epilogue.len(), 1);
        assert_eq!(c.epilogue[0].element, ["i", "j"]);
    }

    #[test]
    fn f32_operands_are_refused() {
        let body = ["C(i, j) +=! A(i, k) * B(k, j)"];
        let json = program("f32", ROW_MAJOR, C_F32, "", &body);
        assert!(contraction(&json, &user_sizes()).is_none());
        // The product's step: no 16-bit operands.
        let a = Analysed::new(&json);
        assert!(product_reads(&a.scop, &a.program.statements[0]).is_none());
        let a = Analysed::new(&program("f16", ROW_MAJOR, C_F32, "", &body));
        let (dtype, x, y) = product_reads(&a.scop, &a.program.statements[0]).unwrap();
        assert_eq!((dtype, x.0.as_str(), y.0.as_str()), (DType::F16, "A", "B"));
    }

    #[test]
    fn a_sum_into_an_8_bit_float_output_is_refused() {
        let c8 = r#""C": {"dtype": "f8e4m3", "shape": ["M", "N"]}"#;
        let json = program("f16", ROW_MAJOR, c8, "", &["C(i, j) +=! A(i, k) * B(k, j)"]);
        let a = Analysed::new(&json);
        assert!(product_reads(&a.scop, &a.program.statements[0]).is_none());
    }

    /// The roles of `C(i, j) += A(..) * B(..)`: `m = i`, `n = j`, `k`.
    fn ijk() -> Iterators {
        Iterators {
            members: vec!["i".into(), "j".into(), "k".into()],
            m: "i".into(),
            n: "j".into(),
            k: "k".into(),
            batch: Vec::new(),
        }
    }

    /// A read of `tensor` at `subs` (iterator names or constants).
    fn read(tensor: &str, subs: &[&str]) -> Read {
        let subs = subs
            .iter()
            .map(|s| match s.parse::<i64>() {
                Ok(c) => Affine::constant(c),
                Err(_) => Affine::var(s),
            })
            .collect();
        (tensor.to_string(), subs)
    }

    #[test]
    fn operands_are_told_apart_by_their_roles_in_either_order() {
        let it = ijk();
        // B(j, k) * A(i, k): A is found as the one along m.
        let (a, b) = operands(&read("B", &["j", "k"]), &read("A", &["i", "k"]), &it).unwrap();
        assert_eq!((a.tensor.as_str(), b.tensor.as_str()), ("A", "B"));
        assert!(a.k_contiguous && b.k_contiguous);
        // A(k, i): m contiguous.
        let (a, _) = operands(&read("A", &["k", "i"]), &read("B", &["k", "j"]), &it).unwrap();
        assert!(!a.k_contiguous);
    }

    #[test]
    fn an_operand_without_a_contiguous_role_is_refused() {
        let it = ijk();
        // The last dimension is neither the row nor k: A(i, k, 0).
        let a = read("A", &["i", "k", "0"]);
        assert!(operands(&a, &read("B", &["k", "j"]), &it).is_none());
        // n in A.
        let a = read("A", &["i", "k", "j"]);
        assert!(operands(&a, &read("B", &["k", "j"]), &it).is_none());
        // Through the mapping: no tensor-core kernel.
        let shapes = [r#"["M", "K", 2]"#, r#"["K", "N"]"#];
        let json = program(
            "f16",
            shapes,
            C_F32,
            "",
            &["C(i, j) +=! A(i, k, 0) * B(k, j)"],
        );
        assert!(contraction(&json, &user_sizes()).is_none());
    }

    #[test]
    fn a_statement_setting_the_accumulator_before_the_sum_is_refused() {
        // `C = bias; C += A B`: the region has no form for a start value.
        let body = ["C(i, j) = f32(bias(j))", "C(i, j) += A(i, k) * B(k, j)"];
        let json = program("f16", ROW_MAJOR, C_F32, "", &body);
        assert!(contraction(&json, &user_sizes()).is_none());
    }

    #[test]
    fn a_warp_layout_divides_the_users_tile_or_there_is_none() {
        // 128 threads over 64 x 64: 2 x 2 warps.
        assert_eq!(layout_for([64, 64, 32], 128), Some([2, 2]));
        // k not a multiple of the mma's 16, or threads not whole warps.
        assert_eq!(layout_for([64, 64, 24], 128), None);
        assert_eq!(layout_for([64, 64, 32], 100), None);
    }
}
