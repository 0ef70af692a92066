//! The kernel of a recognised attention (`gpu::attention`): a block of 64
//! rows on four warps (16 rows each), the rolling loop in tiles of 64 keys.
//!
//! Per tile: the next key tile and value tiles are copied to shared memory
//! with `cp.async` while the block computes on the current ones (two
//! stages); the scores `S = A Bᵀ` are `mma.sync` accumulators (the query
//! fragments stay in registers, loaded once with `ldmatrix`), or, where the
//! depth and the value widths are whole 64-element atoms and the device is
//! sm_90a, `wgmma` accumulators (the four warps are one warpgroup; the
//! tiles in the 128-byte swizzle, read by the tensor cores through
//! descriptors; the weights enter the value products as register A
//! fragments; `Attention::wgmma`); the maps run
//! on the accumulators element by element; the predecessor's tile value is
//! reduced per row (a thread's elements, then the four lanes of a row with
//! two shuffles); each target is repaired once, by one factor a row, with
//! the old and new predecessor values; the tile's terms are added (row
//! sums: reduced like the predecessor; contractions: each weight split
//! into the operand type's rounding of it and of its remainder, both laid
//! out as A fragments, which is the accumulators' own layout, times the
//! value tile on `mma.sync` with `ldmatrix.trans`, or on `wgmma` reading
//! the value tile MN-major). Whole tiles take a copy of the step without
//! the element test. The epilogue stores from the accumulators.
//!
//! The CPU emulation prints the same code with each thread's part in a
//! loop over the block's threads (every per-thread variable an array
//! indexed by the thread), the warp-wide instructions replaced by the
//! emulation helpers of `codegen::mma` (for a kernel with a `wgmma` path,
//! that path: `pf_emu_wgmma` and `pf_emu_wgmma_ra` read each operand
//! element at the swizzled address its descriptor names) and the shuffles
//! by a combination of each four lanes (`pf_emu_quad`), and the shared
//! buffers at the kernel's own offsets in one array, so the fragment
//! layouts, the shared layout, the tile bookkeeping, the masks and the
//! repair are executed in CI. The `mma.sync` path of a kernel that also
//! has a `wgmma` one is not emulated; `POLYFUSE_CUDA_ARCH=sm_90` runs it
//! on a Hopper GPU.
//!
//! One printer ([`Emit`]) prints both, through a [`FlashTarget`]
//! (`target`): [`gpu::Gpu`] prints the operations that differ as CUDA,
//! [`emulation::Emulation`] as their C emulation. `Emit`'s parts, in the
//! order a kernel runs them: `structure` (declarations, the block's rows
//! and keys, the loop over key tiles), `tiles` (the key and value tiles'
//! copies and stages), `products` (scores and value sums on the tensor
//! cores), `softmax` (the rolling update), `store` (merge, store, combine,
//! epilogue); this file keeps the small helpers they share.
//!
//! Accumulator layout (`mma.m16n8k16`, lane `l`, `g = l / 4`, `c = l % 4`):
//! element `4 n + 2 r + h` of a thread's scores is row `16 w + g + 8 r`,
//! key `8 n + 2 c + h` of the tile.

use std::collections::HashMap;
use std::fmt::Write;

use crate::frontend::ast::{Affine, DType, Expr, Program, Reducer};
use crate::gpu::attention::{
    input_reads, Attention, KeyTiles, RowContraction, RowSum, ScoreScale, TileOperand, BLOCK_KEYS,
    COMBINE_WARPS, SPLIT_ROWS, THREADS, WARPS, WARP_TILES,
};
use crate::gpu::mapping::AttentionPlan;
use crate::gpu::tma::TmaOperand;
use crate::model::{AccessKey, Scop, StmtKind};

use super::expr::{GlobalAccesses, Mode, Printer};

mod emulation;
mod gpu;
mod products;
mod softmax;
mod store;
mod structure;
mod target;
mod tiles;

pub use emulation::EMULATION_HELPERS;
pub use gpu::gpu_helpers;
use target::{FlashTarget, Fragment};

/// The kernel parameter of tensor map `which` (the key tile's, then each
/// value tile's; `gpu::mapping::AttentionPlan::copies`).
pub fn map_param(which: usize) -> String {
    format!("pf_map_{which}")
}

/// The full barriers of the key and value tiles' stages, where the copy
/// engine copies them.
const TILE_BARRIERS: &str = "pf_fa_bar";

/// The leading byte offset of a value tile's `wgmma` descriptor (MN-major
/// in the 128-byte swizzle): groups of 64 columns a whole atom apart, the
/// tile's keys times 128 bytes.
const VALUE_LBO: i64 = BLOCK_KEYS * 128;

/// Row slots of a thread: two rows (`g`, `g + 8`) of each of its warp's
/// row tiles; slot `r` is tile `r / 2`, half `r % 2`.
const SLOTS: i64 = 2 * WARP_TILES;

/// The weight fragments of contraction `x` that multiply the values: the
/// rounded weights, and their rounded remainders unless the program
/// declares the weights in the operand type (`RowContraction::rounded_once`).
fn weight_parts(x: &RowContraction) -> &'static [&'static str] {
    if x.rounded_once {
        &["pa"]
    } else {
        &["pa", "pl"]
    }
}

struct Emit<'a> {
    a: &'a Attention,
    /// The map that scales the scores, as the gpu stage found it
    /// (`gpu::mapping::AttentionPlan::score_scale`).
    scale: Option<&'a ScoreScale>,
    program: &'a Program,
    scop: &'a Scop,
    /// What is printed: the CUDA or the CPU emulation.
    t: &'static dyn FlashTarget,
    out: String,
    /// Where the global accesses printed are noted (the kernel's launch
    /// record, `gpu::Kernel::globals`).
    globals: GlobalAccesses,
    /// The key and value tiles' copies by the copy engine (the key
    /// operand's, then each value operand's; `AttentionPlan::copies`), or
    /// none: the threads copy them with `cp.async`.
    copies: &'a [TmaOperand],
    /// The row tiles run last first (the kernel's grid x reversed,
    /// `KernelPlan::reversed`).
    rows_reversed: bool,
}

/// The kernel body (CUDA) or its emulation (C), for the kernel whose
/// signature and parameter constants the caller printed.
pub fn body(
    plan: &AttentionPlan,
    rows_reversed: bool,
    program: &Program,
    scop: &Scop,
    emu: bool,
    globals: &GlobalAccesses,
) -> String {
    let mut e = Emit {
        a: &plan.attention,
        scale: plan.score_scale.as_ref(),
        program,
        scop,
        t: target::of(emu),
        out: String::new(),
        globals: globals.clone(),
        copies: &plan.copies,
        rows_reversed,
    };
    e.kernel();
    e.out
}

/// The second kernel of a split attention: a warp per (row, column) (grid
/// x the rows, y the batch combinations, z the columns in groups of
/// [`COMBINE_WARPS`]), combining the slices' local states as the
/// program's global statements say: the predecessor and the row sums, then
/// its column of each contraction target, each a fold over the slices
/// with the lanes on consecutive slices (the local states of a row and
/// column are contiguous along the slice, so a warp's loads are
/// coalesced) and a butterfly across the lanes; lane 0 runs the epilogue
/// on the combined states. Every warp recomputes the row's folds rather
/// than wait for another's: they are a few loads that hit the cache, and
/// the grid has a warp for every output element in flight at once (H100,
/// 64 slices, D = 128: a block per row with a thread per column, each
/// walking its 64 slices, took 12 us).
pub fn combine_body(
    a: &Attention,
    program: &Program,
    scop: &Scop,
    emu: bool,
    globals: &GlobalAccesses,
) -> String {
    let mut e = Emit {
        a,
        scale: None,
        program,
        scop,
        t: target::of(emu),
        out: String::new(),
        globals: globals.clone(),
        copies: &[],
        rows_reversed: false,
    };
    e.combine();
    e.out
}

/// The position of `text` in `list`, added at the end if absent: one C
/// variable per distinct expression.
fn intern(list: &mut Vec<String>, text: String) -> usize {
    match list.iter().position(|t| *t == text) {
        Some(k) => k,
        None => {
            list.push(text);
            list.len() - 1
        }
    }
}

/// Printed texts of one expression of each row sum and each contraction:
/// the distinct texts, and the position of each sum's and each
/// contraction's in them.
type Distinct = (Vec<String>, Vec<usize>, Vec<usize>);

/// What the parts of a tile's step (`Emit::softmax_step`) share.
struct StepElements {
    /// The tile is known to be whole: no element test.
    whole: bool,
    env: HashMap<String, String>,
    /// The overrides that name an element's maps (`Emit::element_overrides`).
    overrides: HashMap<AccessKey, String>,
    /// The head of the loop over a thread's elements: the element's score
    /// index, row, key and whether it is inside the domain.
    head: String,
    /// Groups of 8 keys in a warp's share of the tile.
    key_groups: i64,
}

fn reducer_op(r: Reducer) -> i32 {
    match r {
        Reducer::Sum => 0,
        Reducer::Max => 1,
        _ => 2,
    }
}

impl Emit<'_> {
    fn line(&mut self, s: &str) {
        self.out.push_str(s);
        self.out.push('\n');
    }

    /// Code every thread runs.
    fn threads(&mut self, code: &str) {
        self.t.threads(&mut self.out, self.a.threads(), code);
    }

    /// The block's barrier.
    fn sync(&mut self) {
        self.out.push_str(self.t.barrier());
    }

    /// Warp-wide code: as printed on the GPU, once per warp on the CPU.
    fn warps(&mut self, code: &str) {
        self.t.warps(&mut self.out, self.a.warps(), code);
    }

    /// `d[doff..] += a[aoff..] b[boff..]` on a warp.
    fn mma(&self, d: Fragment<'_>, a: Fragment<'_>, b: Fragment<'_>) -> String {
        self.t.mma(d, a, b, self.a.dtype == DType::BF16)
    }

    /// Combine entry `r` of array `name` (`n` entries) over a row's four
    /// lanes with reducer `op`.
    fn quad(&mut self, name: &str, n: i64, op: Reducer) {
        self.t.quad(&mut self.out, self.a.threads(), name, n, op);
    }

    /// The statement printer with `overrides`; `fast` for the values of a
    /// tile's step on the GPU: they only feed weights that are rounded to
    /// the operand type after a subtraction keeping 11 more bits, so
    /// `__expf` (`ex2.approx` of a product, relative error about 2^-21 over
    /// the weights' range, at most 0) serves, two instructions where
    /// `expf` takes about ten.
    fn printer(&self, overrides: HashMap<AccessKey, String>, fast: bool) -> Printer<'_> {
        Printer {
            tensors: &self.scop.tensors,
            params: &[],
            mode: Mode::Native,
            overrides: std::cell::RefCell::new(
                overrides.into_iter().map(|(k, v)| (k, v.into())).collect(),
            ),
            privates: Default::default(),
            fixed_selects: Default::default(),
            run_reads: Default::default(),
            fast_exp: fast && self.t.fast_exp(),
            scaled_reads: Default::default(),
            race: Default::default(),
            globals: self.globals.clone(),
        }
    }

    /// Index variables of a statement: the batch, the row, the key and the
    /// columns.
    fn env(&self) -> HashMap<String, String> {
        let mut env = self.rename();
        env.insert(self.a.row.clone(), "pf_ei".into());
        env.insert(self.a.key.clone(), "pf_ej".into());
        for c in &self.a.contractions {
            env.insert(c.column.clone(), "pf_ee".into());
        }
        if let Some(sp) = &self.a.split {
            env.insert(sp.within.clone(), format!("(pf_ej - {} * pf_sl)", sp.len));
        }
        env
    }

    /// The batch iterators' C names (and a split's slice iterator's).
    fn rename(&self) -> HashMap<String, String> {
        let mut r = HashMap::new();
        for (k, (b, _)) in self.a.batch.iter().enumerate() {
            r.insert(b.clone(), format!("pf_b{k}"));
        }
        if let Some(sp) = &self.a.split {
            r.insert(sp.slice.clone(), "pf_sl".into());
        }
        r
    }

    /// C text of a condition or bound from the domain: parameters by
    /// their C names, batch iterators by the block's.
    fn cond(&self, e: &crate::isl::ast::Expr) -> String {
        let rename = self.rename();
        crate::isl::ast::c_expr(e, &|n: &str| {
            if self.program.is_param(n) {
                super::expr::param_name(n)
            } else {
                rename.get(n).cloned().unwrap_or_else(|| n.to_string())
            }
        })
    }

    fn row_subs(&self) -> Vec<Affine> {
        let mut v: Vec<Affine> = self.a.batch.iter().map(|(b, _)| Affine::var(b)).collect();
        v.push(Affine::var(&self.a.row));
        v
    }

    fn elem_subs(&self) -> Vec<Affine> {
        let mut v = self.row_subs();
        v.push(Affine::var(&self.a.key));
        v
    }

    fn col_subs(&self, column: &str) -> Vec<Affine> {
        let mut v = self.row_subs();
        v.push(Affine::var(column));
        v
    }

    /// Overrides of the element-wise tensors (score and maps) by the
    /// per-thread arrays at element `pf_k`.
    fn element_overrides(&self, o: &mut HashMap<AccessKey, String>) {
        let subs = self.elem_subs();
        o.insert(
            AccessKey::new(&self.a.score, &subs),
            self.t.at("pf_s", "pf_k"),
        );
        for (k, (t, _)) in self.a.maps.iter().enumerate() {
            o.insert(
                AccessKey::new(t, &subs),
                self.t.at(&format!("pf_x{k}"), "pf_k"),
            );
        }
    }

    /// The first row of warp `pf_w`'s tile in the block: its own 16 rows,
    /// or in a split kernel the block's.
    fn warp_row(&self) -> &'static str {
        if self.a.split.is_some() {
            "0"
        } else {
            "pf_w * 16"
        }
    }

    /// The first key of a key tile that warp `pf_w` computes on: all of
    /// them, or in a split kernel its 16.
    fn warp_key(&self) -> &'static str {
        if self.a.split.is_some() {
            "pf_w * 16"
        } else {
            "0"
        }
    }

    /// Row `pf_ei` of the thread's row slot `pf_r`.
    fn row_of(&self) -> String {
        format!(
            "const pf_i pf_ei = pf_i0 + (pf_r / 2) * {} + {} + pf_g + 8 * (pf_r % 2);",
            16 * self.a.warps(),
            self.warp_row()
        )
    }

    /// Index of element `(pf_r, pf_n, pf_h)` in a thread's scores.
    fn s_idx(&self) -> String {
        format!(
            "((pf_r / 2) * {} + pf_n) * 4 + 2 * (pf_r % 2) + pf_h",
            self.a.warp_keys() / 8
        )
    }

    /// Index of element `(pf_r, pf_n, pf_h)` in a thread's accumulators
    /// of a contraction of `width` columns.
    fn o_idx(width: i64) -> String {
        format!(
            "((pf_r / 2) * {} + pf_n) * 4 + 2 * (pf_r % 2) + pf_h",
            width / 8
        )
    }
}
