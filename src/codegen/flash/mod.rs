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
//! [`emulation::Emulation`] as their C emulation.
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
mod target;

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

    /// The copy of `rows` rows of operand `x` from row `first` into the
    /// shared tile `buf` (pitch for `width` elements), zero-filled past the
    /// tensor's rows; a `cp.async` group on the GPU (not committed).
    fn copy(&self, x: &TileOperand, first: &str, rows: i64, width: i64, buf: &str) -> String {
        let chunks = width / 8;
        let mut env = self.env();
        env.insert(x.row.clone(), "pf_gr".into());
        env.insert(x.col.clone(), "pf_q".into());
        let printer = self.printer(HashMap::new(), false);
        let src = printer.element(&x.tensor, &x.subscripts, &env);
        let mut c = String::new();
        let total = rows * chunks;
        let threads = self.a.threads() as i64;
        let unrolled = threads % chunks == 0 && total % threads == 0;
        if unrolled {
            // A thread's chunks share their column and lie a whole number
            // of lines apart: unrolled, so that the compiler computes the
            // first chunk's addresses once and offsets the others by
            // constants (H100, prefill: the generic loop took about a
            // quarter of the loop's instructions).
            let _ = writeln!(
                c,
                "{}for (int pf_n = 0; pf_n < {}; pf_n++) {{\n\
                 const int pf_r = pf_t / {chunks} + pf_n * {}, pf_q = (pf_t % {chunks}) * 8;",
                self.t.unroll(),
                total / threads,
                threads / chunks
            );
        } else {
            let _ = writeln!(
                c,
                "for (int pf_x = pf_t; pf_x < {total}; pf_x += {threads}) {{\n\
                 const int pf_r = pf_x / {chunks}, pf_q = (pf_x % {chunks}) * 8;"
            );
        }
        let _ = writeln!(
            c,
            "const pf_i pf_gr = {first} + pf_r;\n\
             {} *pf_dst = &{buf}[{}];",
            self.t.u16(),
            self.tile_at(rows, width, "pf_r", "pf_q")
        );
        let head = c;
        self.globals.note(&x.tensor);
        let tensor = super::expr::tensor_name(&x.tensor);
        let (line, zero) = self.t.copy_chunk(&src, &tensor);
        // Every tile a kernel copies starts at a multiple of its rows
        // (`first` is `tile * rows`: a key tile `kt * 64`, the query tile
        // `pf_i0`) and below the tensor's extent (a key tile holds a key of
        // the domain, a query tile a row of it, and the domain reads the
        // tensor in bounds). Where the extent is a multiple of the rows,
        // every such tile is whole: the copy has neither the test nor the
        // row tests of a partial tile (H100, B4 H16 S4096 D64 prefill, the
        // kernel with the test edited out: 843-845 against 894-897 us
        // global, 476-478 against 504 us causal; the partial tiles' copies,
        // never run there, still cost their code in the loop).
        if x.rows % rows == 0 {
            return format!("{head}{line}\n}}\n");
        }
        let guarded = format!("{head}if (pf_gr < {}) {line} else {zero}\n}}\n", x.rows);
        if !unrolled {
            return guarded;
        }
        // A tile wholly inside the tensor (a test uniform in the block)
        // copies without testing each row.
        format!(
            "if ({first} + {rows} <= {}) {{\n{head}{line}\n}}\n}} else {{\n{guarded}}}\n",
            x.rows
        )
    }

    /// Index in a shared tile of `rows` lines of `width` elements of the
    /// element at line `row`, column `col` (a multiple of 8): `row * pitch
    /// + col`, or, with a `wgmma` path, in the 128-byte swizzle: atoms of
    /// 64 columns (`rows` lines of 128 bytes each, the atoms one after the
    /// other), the 16-byte chunk `(col % 64) / 8` of a line stored at
    /// chunk `(col % 64) / 8 ^ row % 8`. The eight lines an `ldmatrix`
    /// reads at one chunk then fall in eight different chunks (all banks),
    /// and the layout is the canonical one `wgmma`'s descriptors name.
    fn tile_at(&self, rows: i64, width: i64, row: &str, col: &str) -> String {
        if self.a.wgmma() {
            format!(
                "(({col}) / 64) * {} + ({row}) * 64 + (((({col}) % 64) / 8) ^ (({row}) % 8)) * 8",
                rows * 64
            )
        } else {
            format!("({row}) * {} + ({col})", self.a.pitch(width))
        }
    }

    /// The copies of key tile `tile` (when it is below `pf_khi`): the key
    /// operand into `key_buf`, value operand `k` into `{value_buf}{k}`;
    /// one committed `cp.async` group. Where the copy engine copies the
    /// tiles (on the `wgmma` path), thread 0 asks for their boxes instead,
    /// counted on stage `stage`'s barrier; the group is then empty.
    fn copy_key_tile(&self, tile: &str, key_buf: &str, value_buf: &str, stage: &str) -> String {
        let a = self.a;
        let first = format!("{} * {BLOCK_KEYS}", self.tile_of(tile));
        let mut c = format!("if ({tile} < pf_khi) {{\n");
        c.push_str(&self.copy(&a.key_operand, &first, BLOCK_KEYS, a.depth, key_buf));
        for (k, x) in a.contractions.iter().enumerate() {
            c.push_str(&self.copy(
                &x.value,
                &first,
                BLOCK_KEYS,
                x.width,
                &format!("{value_buf}{k}"),
            ));
        }
        c.push_str("}\n");
        if !self.copies.is_empty() {
            let boxes = self.tile_boxes(tile, &first, key_buf, value_buf, stage);
            c = self.t.tma_or(&boxes, &c);
        }
        c.push_str(self.t.commit());
        c
    }

    /// Thread 0's copies of key tile `tile` (its first key `first`) by the
    /// copy engine: the bytes its stage's barrier expects, then each
    /// operand's boxes, one per 64-column atom, at the operand's
    /// coordinates (from its element at the tile's first row and column
    /// 0: the map's dimensions are the tensor's, contiguous first).
    fn tile_boxes(
        &self,
        tile: &str,
        first: &str,
        key_buf: &str,
        value_buf: &str,
        stage: &str,
    ) -> String {
        let a = self.a;
        let bar = format!("&{TILE_BARRIERS}[{stage}]");
        let bytes: i64 = self.copies.iter().map(TmaOperand::stage_bytes).sum();
        let mut c = format!("if ({tile} < pf_khi && pf_t == 0) {{\n");
        c.push_str(&self.t.expect_bytes(&bar, bytes));
        let operands =
            std::iter::once(&a.key_operand).chain(a.contractions.iter().map(|x| &x.value));
        for (which, (op, x)) in self.copies.iter().zip(operands).enumerate() {
            let buf = if which == 0 {
                key_buf.to_string()
            } else {
                format!("{value_buf}{}", which - 1)
            };
            let mut env = self.env();
            env.insert(x.row.clone(), format!("({first})"));
            env.insert(x.col.clone(), "0".into());
            let element =
                self.printer(HashMap::new(), false)
                    .element(&x.tensor, &x.subscripts, &env);
            let tensor = super::expr::tensor_name(&x.tensor);
            let _ = writeln!(c, "{{ const long pf_at = (long)(&{element} - {tensor});");
            for line in crate::codegen::mma::coordinate_lines(&op.map, "pf_at", "pf_c", None) {
                let _ = writeln!(c, "{line}");
            }
            let coords: Vec<String> = (0..op.map.dims.len()).map(|d| format!("pf_c{d}")).collect();
            for g in 0..op.boxes {
                let mut at = coords.clone();
                at[op.k_dim] = format!("pf_c{} + {}", op.k_dim, 64 * g);
                let dst = format!("&{buf}[{}]", g * op.box_len);
                let load = crate::codegen::mma::box_copy(
                    &op.map,
                    &map_param(which),
                    &dst,
                    &bar,
                    &at,
                    self.t.emulated(),
                );
                let _ = writeln!(c, "{load}");
            }
            c.push_str("}\n");
        }
        c.push_str("}\n");
        c
    }

    /// The key and value tiles of the current tile have landed (the
    /// prologue's first tile, or the rolling loop's `pf_kt`), with all but
    /// the newest `n` `cp.async` groups: where the copy engine copies the
    /// tiles, once the stage's barrier has completed the tile's phase
    /// (`(tile / stages) % 2`), the query's `cp.async` group (the
    /// prologue's only one) waited for; then the block's barrier.
    fn tile_landed(&mut self, n: i32, in_loop: bool) {
        if self.copies.is_empty() {
            return self.landed(n);
        }
        let (stage, parity) = if in_loop {
            (
                "pf_st".to_string(),
                format!("(unsigned)(((pf_kt - pf_klo) / {}) & 1)", self.a.stages()),
            )
        } else {
            ("0".to_string(), "0u".to_string())
        };
        let bar = format!("&{TILE_BARRIERS}[{stage}]");
        let w = self.t.tile_landed(n, &bar, &parity);
        self.out.push_str(&w);
        self.sync();
    }

    /// The copies of all but the newest `n` `cp.async` groups have landed
    /// and are visible to the block; with a `wgmma` path also to the tensor
    /// cores, which read shared memory through the async proxy (each
    /// thread orders its copies before them, then the barrier).
    fn landed(&mut self, n: i32) {
        self.wait(n);
        if self.a.wgmma() {
            self.out.push_str(self.t.proxy_fence());
        }
        self.sync();
    }

    /// The scores of a key tile on `wgmma` (`S = A Bᵀ`, one warpgroup's 64
    /// rows by the tile's keys, k = the depth in steps of 16): both
    /// operands K-major in the 128-byte swizzle, so the descriptor of step
    /// `kk` starts `kk % 4` 32-byte chunks into atom `kk / 4` (the hardware
    /// applies the XOR to the address it forms), 8-line groups 1024 bytes
    /// apart. The first step overwrites the accumulators (scale-d 0).
    fn wgmma_scores(&mut self) {
        let t = self.t;
        t.wgmma_scores(self);
    }

    /// The value products on `wgmma`: the weights (the rounded ones and
    /// their rounded remainders) are A fragments in registers, which is
    /// `wgmma`'s register layout of A for a warpgroup's 64 rows; the value
    /// tile is an MN-major B (its lines are keys, the columns along them)
    /// in the 128-byte swizzle: the descriptor of step `kc` starts 16 lines
    /// further, 8-line groups 1024 bytes apart (SBO), groups of 64 columns
    /// a whole atom apart (LBO, the tile's keys times 128 bytes).
    fn wgmma_values(&mut self) {
        let t = self.t;
        t.wgmma_values(self);
    }

    /// Waits for all but the newest `n` groups of copies.
    fn wait(&mut self, n: i32) {
        let w = self.t.wait(n);
        self.out.push_str(&w);
    }

    fn declare(&mut self) {
        let a = self.a;
        let layout = a.shared_layout();
        // One array, the buffers at the layout's offsets (the same on the
        // CPU, so a layout whose buffers overlap fails there too).
        self.out.push_str(&self.t.shared_memory(a));
        if !self.copies.is_empty() {
            self.out
                .push_str(&self.t.tile_barriers(TILE_BARRIERS, a.stages()));
        }
        let ty = self.t.u16();
        for b in layout.all() {
            let _ = writeln!(
                self.out,
                "{ty} *const {} = pf_dynamic_shared + {};",
                b.name, b.start
            );
        }
        // Per-thread state: name, C type (on the CPU), elements.
        let nb = a.warp_keys() / 8;
        let mut vars: Vec<(String, &str, i64)> = vec![
            ("pf_qf".into(), "uint32_t", WARP_TILES * a.depth / 16 * 4),
            ("pf_kb".into(), "uint32_t", 4),
            ("pf_s".into(), "float", WARP_TILES * nb * 4),
        ];
        for k in 0..a.maps.len() {
            vars.push((format!("pf_x{k}"), "float", WARP_TILES * nb * 4));
        }
        for n in ["pf_m", "pf_mn", "pf_mt"] {
            vars.push((n.into(), "float", SLOTS));
        }
        for k in 0..a.sums.len() {
            vars.push((format!("pf_sum{k}"), "float", SLOTS));
            vars.push((format!("pf_st{k}"), "float", SLOTS));
        }
        for (k, c) in a.contractions.iter().enumerate() {
            let frags = WARP_TILES * a.warp_keys() / 16 * 4;
            vars.push((format!("pf_o{k}"), "float", Self::accumulators(c)));
            if c.promoted {
                // A key tile's value sums, added to `pf_o` in IEEE f32.
                vars.push((format!("pf_ot{k}"), "float", Self::accumulators(c)));
            }
            vars.push((format!("pf_cf{k}"), "float", SLOTS));
            vars.push((format!("pf_pa{k}"), "uint32_t", frags));
            if !c.rounded_once {
                vars.push((format!("pf_pl{k}"), "uint32_t", frags));
            }
        }
        if a.wgmma() {
            // The operand descriptors' fields other than the start
            // address, once: each tile's descriptor is one of these moved
            // by its offset (`pf_wgmma_desc_at`).
            self.out.push_str(&self.t.wgmma_descriptors());
        }
        for (name, ty, len) in vars {
            let decl = self.t.per_thread(a.threads(), ty, &name, len);
            self.out.push_str(&decl);
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

    /// The kernel: the block (a loop over the blocks in the emulation),
    /// its buffers and range of key tiles, the prologue's copies, the
    /// query's fragments, the rolling loop over the key tiles, and the
    /// end (the split kernel's merge of the warps' states, else the
    /// epilogue).
    fn kernel(&mut self) {
        self.open_block();
        self.declare();
        self.key_range();
        self.prologue();
        self.query_fragments();
        self.rolling_loop();
        self.wait(0);
        if self.a.split.is_some() {
            self.sync();
            self.merge_and_store();
        } else {
            self.epilogue();
        }
        self.out.push_str(self.t.close_block());
    }

    /// The block's indices and the batch values it runs: a row tile (and
    /// in a split kernel, a slice) along x, a batch combination along y.
    /// The emulation opens its loop over the blocks here (closed at the
    /// kernel's end); on the GPU the thread's own indices come first.
    fn open_block(&mut self) {
        let a = self.a;
        let mut batch_decl = self.batch_values();
        let tile = if self.rows_reversed {
            format!("({} - pf_bx % {})", a.row_tiles() - 1, a.row_tiles())
        } else {
            format!("(pf_bx % {})", a.row_tiles())
        };
        let _ = writeln!(
            batch_decl,
            "const pf_i pf_i0 = {tile} * {}; (void)pf_i0;",
            a.block_rows()
        );
        if a.split.is_some() {
            let _ = writeln!(
                batch_decl,
                "const pf_i pf_sl = pf_bx / {}; (void)pf_sl;",
                a.row_tiles()
            );
        }
        let open = self.t.open_block(a, &batch_decl);
        self.out.push_str(&open);
    }

    /// The block's key tiles: the loop runs over `pf_kt` in `pf_klo ..
    /// pf_khi` (none where no key of the block's rows is in the domain).
    /// For a range, `pf_kt` is the tile; for runs, its position among the
    /// runs' tiles, from 0: run `r` starts at tile `pf_rs{r}` and holds
    /// `pf_rn{r}` tiles (0 where the block has no such run), positions
    /// `.. pf_re{r}`, and a position's tile is the position plus its run's
    /// `pf_rd{r}` ([`Self::tile_of`]). The positions keep the loop's
    /// stages and copies ahead as they are, across the gaps.
    fn key_range(&mut self) {
        let a = self.a;
        match &a.key_tiles {
            KeyTiles::Range { any, lo, hi } => {
                let any = self.cond(any);
                let lo = self.cond(lo);
                let hi = self.cond(hi);
                let _ = writeln!(
                    self.out,
                    "const int pf_any = {any};\n\
                     const pf_i pf_klo = pf_any ? ({lo}) / {BLOCK_KEYS} : 0;\n\
                     const pf_i pf_khi = pf_any ? ({hi}) / {BLOCK_KEYS} + 1 : 0;"
                );
            }
            KeyTiles::Runs(runs) => {
                let mut end = "0".to_string();
                for (r, run) in runs.iter().enumerate() {
                    let any = self.cond(&run.any);
                    let first = self.cond(&run.first);
                    let last = self.cond(&run.last);
                    let _ = writeln!(
                        self.out,
                        "const int pf_ra{r} = {any};\n\
                         const pf_i pf_rs{r} = pf_ra{r} ? ({first}) : 0;\n\
                         const pf_i pf_rn{r} = pf_ra{r} ? ({last}) - pf_rs{r} + 1 : 0;\n\
                         const pf_i pf_rd{r} = pf_rs{r} - {end};\n\
                         const pf_i pf_re{r} = {end} + pf_rn{r};"
                    );
                    end = format!("pf_re{r}");
                }
                let _ = writeln!(
                    self.out,
                    "const pf_i pf_klo = 0;\nconst pf_i pf_khi = {end};"
                );
            }
        }
    }

    /// The key tile at loop position `pos` ([`Self::key_range`]): the
    /// position itself for a range, else the position plus the offset of
    /// the run it falls in (the first run whose end is past it).
    fn tile_of(&self, pos: &str) -> String {
        let KeyTiles::Runs(runs) = &self.a.key_tiles else {
            return pos.to_string();
        };
        let last = runs.len() - 1;
        let mut offset = format!("pf_rd{last}");
        for r in (0..last).rev() {
            offset = format!("({pos} < pf_re{r} ? pf_rd{r} : {offset})");
        }
        format!("({pos} + {offset})")
    }

    /// Prologue: the query tile and the first key and value tiles (one
    /// `cp.async` group with stage 0; each further stage but the last its
    /// own group), the states; then the wait for the query and the first
    /// key tile.
    fn prologue(&mut self) {
        let a = self.a;
        let layout = a.shared_layout();
        let stages = layout.keys.stages;
        let ptr = self.t.u16();
        let mut c = self.copy(&a.query, "pf_i0", a.block_rows(), a.depth, "pf_fa_q");
        c.push_str(&self.copy_key_tile("pf_klo", "pf_fa_k", "pf_fa_v", "0"));
        for st in 1..stages - 1 {
            let _ = writeln!(
                self.out,
                "{ptr} *const pf_kpre{st} = pf_fa_k + {};",
                st * layout.keys.stage_len
            );
            for (k, v) in layout.values.iter().enumerate() {
                let _ = writeln!(
                    self.out,
                    "{ptr} *const pf_vpre{st}_{k} = pf_fa_v{k} + {};",
                    st * v.stage_len
                );
            }
            c.push_str(&self.copy_key_tile(
                &format!("(pf_klo + {st})"),
                &format!("pf_kpre{st}"),
                &format!("pf_vpre{st}_"),
                &st.to_string(),
            ));
        }
        self.threads(&c);
        self.init_states();
        // The query and the first key tile have landed.
        self.tile_landed((stages - 2) as i32, false);
    }

    /// The query fragments, for `mma.sync` (`wgmma` reads the query tile
    /// from shared memory, so the emulation, which runs that path, has
    /// none).
    fn query_fragments(&mut self) {
        self.mma_sync_path(Self::load_query_fragments);
    }

    /// The query fragments through `ldmatrix`, each warp its rows'.
    fn load_query_fragments(&mut self) {
        let a = self.a;
        let kq = a.depth / 16;
        let mut w = String::new();
        let _ = writeln!(
            w,
            "{u}for (int pf_mi = 0; pf_mi < {WARP_TILES}; pf_mi++)\n{u}for (int pf_kk = 0; pf_kk < {kq}; pf_kk++) {{",
            u = self.t.unroll()
        );
        let at = self.tile_at(
            a.block_rows(),
            a.depth,
            &format!(
                "pf_mi * {} + {} + pf_l % 16",
                16 * a.warps(),
                self.warp_row()
            ),
            "pf_kk * 16 + (pf_l / 16) * 8",
        );
        w.push_str(&self.t.ldsm(
            "pf_qf",
            &format!("(pf_mi * {kq} + pf_kk) * 4"),
            &format!("&pf_fa_q[{at}]"),
            false,
        ));
        w.push_str("}\n");
        self.warps(&w);
    }

    /// The rolling loop in tiles: the copies of the tiles `stages - 1`
    /// ahead run while the block computes on the current ones; the stage
    /// they overwrite was last read in the previous iteration, which ended
    /// with a barrier. Each iteration: the scores, the softmax step, the
    /// value products.
    fn rolling_loop(&mut self) {
        let a = self.a;
        let wg = a.wgmma();
        let stages = a.stages();
        self.tile_stages();
        let c = self.copy_key_tile(
            &format!("(pf_kt + {})", stages - 1),
            "pf_knext",
            "pf_vnext",
            &self.next_stage(),
        );
        if wg {
            // This tile's copies land and are ordered before the tensor
            // cores' reads (the proxy fence) before the next ones are
            // issued: a fence after them would wait for them too. They go
            // into the stage the previous tile took, which every warp is
            // done with once past the barrier (its `wgmma` waited for), so
            // the loop needs one barrier a tile.
            self.tile_landed((stages - 2) as i32, true);
            self.threads(&c);
        } else {
            self.threads(&c);
            self.tile_landed((stages - 1) as i32, true);
        }
        self.either(Self::wgmma_scores, Self::mma_scores);
        // Whole tiles (the test `pf_full`, uniform in the block) skip the
        // element test: two copies of the step, or one where every tile
        // the kernel visits is whole.
        if a.every_tile_whole() {
            self.softmax_step(true);
        } else {
            self.line("if (pf_full) {");
            self.softmax_step(true);
            self.line("} else {");
            self.softmax_step(false);
            self.line("}");
        }
        // The value products.
        self.either(Self::wgmma_values, Self::mma_values);
        if !wg {
            self.sync();
        }
        self.line("}");
    }

    /// The stage the tile `stages - 1` ahead of `pf_kt` (at stage
    /// `pf_st`) is copied into.
    fn next_stage(&self) -> String {
        let stages = self.a.stages();
        if stages == 2 {
            "(pf_st ^ 1)".to_string()
        } else {
            format!("((pf_st + {}) % {stages})", stages - 1)
        }
    }

    /// The rolling loop's head: the key tile `pf_kt`, whether it is whole
    /// (`pf_full`), and the stages it is read from (`pf_kcur`, `pf_vcurK`)
    /// and the tile ahead is copied into (`pf_knext`, `pf_vnextK`).
    fn tile_stages(&mut self) {
        let a = self.a;
        let layout = a.shared_layout();
        let stages = layout.keys.stages;
        let ptr = self.t.u16();
        let full = self.cond(&a.full_tile);
        let kl = layout.keys.stage_len;
        let cur = if stages == 2 {
            "(int)((pf_kt - pf_klo) & 1)".to_string()
        } else {
            format!("(int)((pf_kt - pf_klo) % {stages})")
        };
        let next = self.next_stage();
        let _ = writeln!(
            self.out,
            "for (pf_i pf_kt = pf_klo; pf_kt < pf_khi; pf_kt++) {{\n\
             const pf_i pf_j0 = {} * {BLOCK_KEYS};\n\
             const int pf_full = {full}; (void)pf_full;\n\
             const int pf_st = {cur};\n\
             {ptr} *const pf_kcur = pf_fa_k + pf_st * {kl};\n\
             {ptr} *const pf_knext = pf_fa_k + {next} * {kl};",
            self.tile_of("pf_kt")
        );
        for (k, v) in layout.values.iter().enumerate() {
            let vl = v.stage_len;
            let _ = writeln!(
                self.out,
                "{ptr} *const pf_vcur{k} = pf_fa_v{k} + pf_st * {vl};\n\
                 {ptr} *const pf_vnext{k} = pf_fa_v{k} + {next} * {vl};"
            );
        }
    }

    /// `wgmma`'s form of a step where the kernel has that path, and
    /// `mma_sync`'s (in the CUDA, compiled where the device is not sm_90a;
    /// the emulation runs the `wgmma` path alone).
    fn either(&mut self, wgmma: fn(&mut Self), mma_sync: fn(&mut Self)) {
        if self.a.wgmma() {
            wgmma(self);
        }
        self.mma_sync_path(mma_sync);
    }

    /// A part of the `mma.sync` path, printed by `mma_sync`: as it is in a
    /// kernel without a `wgmma` path, else as the target prints it beside
    /// that path ([`FlashTarget::beside_wgmma`]).
    fn mma_sync_path(&mut self, mma_sync: fn(&mut Self)) {
        if self.a.wgmma() {
            let t = self.t;
            t.beside_wgmma(self, mma_sync);
        } else {
            mma_sync(self);
        }
    }

    /// The scores of a key tile on `mma.sync`: each warp's key fragments
    /// through `ldmatrix`, times the query fragments it holds.
    fn mma_scores(&mut self) {
        let a = self.a;
        let nb = a.warp_keys() / 8;
        let kq = a.depth / 16;
        let mut c = String::new();
        let _ = writeln!(
            c,
            "{}for (int pf_k = 0; pf_k < {}; pf_k++) {} = 0.0f;",
            self.t.unroll(),
            WARP_TILES * nb * 4,
            self.t.at("pf_s", "pf_k")
        );
        self.threads(&c);
        let mut w = String::new();
        let _ = writeln!(
        w,
        "{u}for (int pf_kk = 0; pf_kk < {}; pf_kk++)\n{u}for (int pf_np = 0; pf_np < {}; pf_np++) {{",
        a.depth / 16,
        a.warp_keys() / 16,
        u = self.t.unroll()
    );
        let at = self.tile_at(
            BLOCK_KEYS,
            a.depth,
            &format!(
                "{} + pf_np * 16 + pf_l % 8 + 8 * (pf_l / 16)",
                self.warp_key()
            ),
            "pf_kk * 16 + 8 * ((pf_l / 8) % 2)",
        );
        w.push_str(&self.t.ldsm("pf_kb", "0", &format!("&pf_kcur[{at}]"), false));
        let _ = writeln!(
            w,
            "{}for (int pf_mi = 0; pf_mi < {WARP_TILES}; pf_mi++) {{",
            self.t.unroll()
        );
        for half in 0..2 {
            w.push_str(&self.mma(
                (
                    "pf_s",
                    &format!("(pf_mi * {nb} + 2 * pf_np + {half}) * 4"),
                    WARP_TILES * nb * 4,
                ),
                (
                    "pf_qf",
                    &format!("(pf_mi * {kq} + pf_kk) * 4"),
                    WARP_TILES * kq * 4,
                ),
                ("pf_kb", &format!("{}", 2 * half), 4),
            ));
        }
        w.push_str("}\n}\n");
        self.warps(&w);
    }

    /// The value products on `mma.sync`: the value tile's fragments through
    /// `ldmatrix.trans`, times the weights' A fragments.
    fn mma_values(&mut self) {
        let a = self.a;
        for (k, x) in a.contractions.iter().enumerate() {
            self.start_tile_sums(k, x);
            let mut w = String::new();
            let _ = writeln!(
                w,
                "{u}for (int pf_kc = 0; pf_kc < {}; pf_kc++)\n{u}for (int pf_ep = 0; pf_ep < {}; pf_ep++) {{",
                a.warp_keys() / 16,
                x.width / 16,
                u = self.t.unroll()
            );
            let at = self.tile_at(
                BLOCK_KEYS,
                x.width,
                &format!("{} + pf_kc * 16 + pf_l % 16", self.warp_key()),
                "pf_ep * 16 + 8 * (pf_l / 16)",
            );
            w.push_str(
                &self
                    .t
                    .ldsm("pf_kb", "0", &format!("&pf_vcur{k}[{at}]"), true),
            );
            let o = Self::value_sums(k, x);
            let w8 = x.width / 8;
            let kc = a.warp_keys() / 16;
            let _ = writeln!(
                w,
                "{}for (int pf_mi = 0; pf_mi < {WARP_TILES}; pf_mi++) {{",
                self.t.unroll()
            );
            // The rounded weights, then their rounded remainders (without
            // them, H100: global prefill 1519 against 1947 us, and the
            // check's element error 2e-2, over f16's bound) unless the
            // program declares the weights f16 or bf16.
            for part in weight_parts(x) {
                for half in 0..2 {
                    w.push_str(&self.mma(
                        (
                            &o,
                            &format!("(pf_mi * {w8} + 2 * pf_ep + {half}) * 4"),
                            WARP_TILES * w8 * 4,
                        ),
                        (
                            &format!("pf_{part}{k}"),
                            &format!("(pf_mi * {kc} + pf_kc) * 4"),
                            WARP_TILES * kc * 4,
                        ),
                        ("pf_kb", &format!("{}", 2 * half), 4),
                    ));
                }
            }
            w.push_str("}\n");
            w.push_str("}\n");
            self.warps(&w);
            self.add_tile_values(k, x);
        }
    }

    /// A thread's accumulators of contraction `x` (and, promoted, its key
    /// tile's sums).
    fn accumulators(x: &RowContraction) -> i64 {
        WARP_TILES * x.width / 8 * 4
    }

    /// Where contraction `k`'s value products go: its accumulators, or
    /// (promoted) the key tile's sums.
    fn value_sums(k: usize, x: &RowContraction) -> String {
        if x.promoted {
            format!("pf_ot{k}")
        } else {
            format!("pf_o{k}")
        }
    }

    /// A promoted contraction's key-tile sums start at zero.
    fn start_tile_sums(&mut self, k: usize, x: &RowContraction) {
        if x.promoted {
            let code = format!(
                "for (int pf_i = 0; pf_i < {}; pf_i++) {} = 0.0f;\n",
                Self::accumulators(x),
                self.t.at(&format!("pf_ot{k}"), "pf_i")
            );
            self.threads(&code);
        }
    }

    /// A promoted contraction's key-tile sums added to its accumulators in
    /// IEEE f32 (`RowContraction::promoted`).
    fn add_tile_values(&mut self, k: usize, x: &RowContraction) {
        if x.promoted {
            let code = format!(
                "for (int pf_i = 0; pf_i < {}; pf_i++) {} += {};\n",
                Self::accumulators(x),
                self.t.at(&format!("pf_o{k}"), "pf_i"),
                self.t.at(&format!("pf_ot{k}"), "pf_i")
            );
            self.threads(&code);
        }
    }

    /// The states' initial values.
    fn init_states(&mut self) {
        let a = self.a;
        let printer = self.printer(HashMap::new(), false);
        let env = self.env();
        let mut c = String::new();
        let _ = writeln!(
            c,
            "{}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n{}",
            self.t.unroll(),
            self.row_of()
        );
        let _ = writeln!(
            c,
            "{} = {};",
            self.t.at("pf_m", "pf_r"),
            printer.expr(&a.pred_init, &env)
        );
        for (k, s) in a.sums.iter().enumerate() {
            let _ = writeln!(
                c,
                "{} = {};",
                self.t.at(&format!("pf_sum{k}"), "pf_r"),
                printer.expr(&s.init, &env)
            );
        }
        for (k, x) in a.contractions.iter().enumerate() {
            let _ = writeln!(
                c,
                "{}for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++) {{\n\
                 const pf_i pf_ee = pf_n * 8 + 2 * pf_c + pf_h; (void)pf_ee;\n\
                 {} = {}; }}",
                self.t.unroll(),
                x.width / 8,
                self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width)),
                printer.expr(&x.init, &env)
            );
        }
        c.push_str("(void)pf_ei; }\n");
        self.threads(&c);
    }

    /// One tile's maps, predecessor, repairs and terms (all but the value
    /// products), in the order the rewrite's step takes them: the tile's
    /// reduction of the scores, the repair factors of the row states and
    /// the accumulators' repair, the terms and weights, then the tile's
    /// sums added to the rows'. `whole`: the tile is known to be whole (no
    /// element test).
    fn softmax_step(&mut self, whole: bool) {
        let step = self.step_elements(whole);
        self.tile_reduction(&step);
        let mut c = String::new();
        self.repair_factors(&step, &mut c);
        self.repair_accumulators(&mut c);
        self.tile_terms(&step, &mut c);
        self.threads(&c);
        self.add_tile_sums();
    }

    /// What the parts of a tile's step share (see [`StepElements`]).
    fn step_elements(&self, whole: bool) -> StepElements {
        let a = self.a;
        let env = self.env();
        let wk = self.warp_key();
        let element = if whole {
            "1".to_string()
        } else {
            self.cond(&a.element)
        };
        let row_decl = self.row_of();
        let k_idx = self.s_idx();
        // An element's score index, row, key and whether it is inside the
        // domain, at the top of the loop over a thread's elements.
        let head = format!(
            "const int pf_k = {k_idx};\n\
             {row_decl}\n\
             const pf_i pf_ej = pf_j0 + {wk} + pf_n * 8 + 2 * pf_c + pf_h;\n\
             const int pf_ok = ({element}); (void)pf_ok; (void)pf_ei; (void)pf_ej; (void)pf_k;"
        );
        let mut overrides = HashMap::new();
        self.element_overrides(&mut overrides);
        StepElements {
            whole,
            env,
            overrides,
            head,
            key_groups: a.warp_keys() / 8,
        }
    }

    /// The maps of every element of the thread's scores and the tile's
    /// value of the predecessor (the reduction of each row over the tile),
    /// combined over a row's four lanes; a maximum of scaled scores takes
    /// the scaling out of its loop (`ScoreScale::folded`).
    fn tile_reduction(&mut self, step: &StepElements) {
        let a = self.a;
        let (env, nb, head) = (&step.env, step.key_groups, &step.head);
        // Maps and the predecessor's tile value.
        let printer = self.printer(step.overrides.clone(), true);
        let ident = printer.identity(a.reducer, DType::F32);
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {} = {ident};",
            self.t.at("pf_mt", "pf_r")
        );
        let u = self.t.unroll();
        let _ = writeln!(
            c,
            "{u}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++)\n{u}for (int pf_n = 0; pf_n < {nb}; pf_n++)\n{u}for (int pf_h = 0; pf_h < 2; pf_h++) {{\n{head}"
        );
        for (k, (_, rhs)) in a.maps.iter().enumerate() {
            // A map that reads a tensor in memory reads it only inside the
            // domain: a partial tile's other elements (rows or keys past
            // the tensor's extent) are never read (the masked elements'
            // map values are not used).
            let value = printer.expr(rhs, env);
            let value = if !step.whole && !input_reads(self.program, rhs).is_empty() {
                format!("pf_ok ? {value} : 0.0f")
            } else {
                value
            };
            let _ = writeln!(c, "{} = {value};", self.t.at(&format!("pf_x{k}"), "pf_k"));
        }
        let mt = self.t.at("pf_mt", "pf_r");
        // A maximum (or minimum) of scaled scores `c * s` (c > 0) is `c`
        // times the maximum of the scores (`Attention::score_scale`).
        let folded = self.scale.filter(|s| s.folded);
        let body = match folded {
            Some(_) => self.t.at("pf_s", "pf_k"),
            None => printer.expr(&a.pred_body, env),
        };
        let _ = writeln!(
            c,
            "if (pf_ok) {mt} = {};\n}}",
            printer.combine(a.reducer, DType::F32, &mt, &body)
        );
        self.threads(&c);
        self.quad("pf_mt", SLOTS, a.reducer);
        if let Some(s) = folded {
            self.threads(&format!(
                "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {mt} = {mt} * {:?}f;\n",
                s.factor as f32
            ));
        }
    }

    /// New predecessor value, repairs. A sum's repair `H(X; Mp, M)`
    /// distributes over the sum (Eq. 5, proven by the rewrite) and is
    /// continuous in `X`, so it is `X * H(1; Mp, M)`: one factor per row
    /// (shared by targets whose repairs print alike), not one evaluation
    /// per element. The sums are repaired here; the contractions' factors
    /// are kept for [`Emit::repair_accumulators`].
    fn repair_factors(&self, step: &StepElements, c: &mut String) {
        let a = self.a;
        let rov = self.repair_overrides(
            step.overrides.clone(),
            &self.t.at("pf_m", "pf_r"),
            &self.t.at("pf_mn", "pf_r"),
        );
        let printer = self.printer(rov, true);
        let (factors, sum_factor, con_factor) =
            self.distinct(&printer, &step.env, |s| &s.repair, |x| &x.repair);
        let _ = writeln!(
            c,
            "{}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n{} = {};",
            self.t.unroll(),
            self.t.at("pf_mn", "pf_r"),
            printer.combine(
                a.reducer,
                DType::F32,
                &self.t.at("pf_m", "pf_r"),
                &self.t.at("pf_mt", "pf_r")
            )
        );
        for (k, f) in factors.iter().enumerate() {
            let _ = writeln!(c, "const float pf_f{k} = {f};");
        }
        for (k, f) in sum_factor.iter().enumerate() {
            let x = self.t.at(&format!("pf_sum{k}"), "pf_r");
            let _ = writeln!(c, "{x} = {x} * pf_f{f};");
            let _ = writeln!(c, "{} = 0.0f;", self.t.at(&format!("pf_st{k}"), "pf_r"));
        }
        for (k, f) in con_factor.iter().enumerate() {
            let _ = writeln!(c, "{} = pf_f{f};", self.t.at(&format!("pf_cf{k}"), "pf_r"));
        }
        c.push_str("}\n");
    }

    /// The accumulators' repair, skipped where it multiplies by exactly
    /// one in every row of the warp (a tile that raises no row's
    /// predecessor value: most tiles after the first few), which changes
    /// no value.
    fn repair_accumulators(&self, c: &mut String) {
        for (k, x) in self.a.contractions.iter().enumerate() {
            let cf = format!("pf_cf{k}");
            let o = self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width));
            let any: Vec<String> = (0..SLOTS)
                .map(|r| format!("{} != 1.0f", self.t.at(&cf, &r.to_string())))
                .collect();
            let guard = self.t.any_lane(&any);
            let _ = writeln!(
                c,
                "{guard} {{\n{u}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++)\n\
                 {u}for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++) {o} = {o} * {};\n}}",
                x.width / 8,
                self.t.at(&cf, "pf_r"),
                u = self.t.unroll()
            );
        }
    }

    /// The tile's terms with the new predecessor value, added to the
    /// tile's sums, and its weights split into the value products'
    /// fragments. The map that scales the scores (`Emit::scale`) is read
    /// as one FFMA of the score.
    fn tile_terms(&self, step: &StepElements, c: &mut String) {
        let a = self.a;
        let (nb, head) = (step.key_groups, &step.head);
        let mut tov = step.overrides.clone();
        tov.insert(a.pred_term.clone(), self.t.at("pf_mn", "pf_r"));
        let printer = self.printer(tov, true);
        // `exp(c s - m)` of scaled scores as one FFMA of the score.
        if let Some(s) = self.scale {
            printer.scaled_reads.borrow_mut().insert(
                s.scaled.clone(),
                (self.t.at("pf_s", "pf_k"), s.factor as f32 as f64),
            );
        }
        let u = self.t.unroll();
        let _ = writeln!(
            c,
            "{u}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++)\n{u}for (int pf_n = 0; pf_n < {nb}; pf_n++) {{\n\
             float pf_w0[{n}], pf_w1[{n}];",
            n = a.contractions.len().max(1)
        );
        let _ = writeln!(c, "{u}for (int pf_h = 0; pf_h < 2; pf_h++) {{\n{head}");
        // Each distinct term or weight once per element (a softmax's
        // `exp(T - M)` is both).
        let (values, sum_value, weight_value) =
            self.distinct(&printer, &step.env, |s| &s.term, |x| &x.weight);
        for (k, v) in values.iter().enumerate() {
            let _ = writeln!(c, "const float pf_v{k} = pf_ok ? {v} : 0.0f;");
        }
        for (k, v) in sum_value.iter().enumerate() {
            let st = self.t.at(&format!("pf_st{k}"), "pf_r");
            let _ = writeln!(c, "{st} = {st} + pf_v{v};");
        }
        for (k, v) in weight_value.iter().enumerate() {
            let _ = writeln!(
                c,
                "if (pf_h == 0) pf_w0[{k}] = pf_v{v}; else pf_w1[{k}] = pf_v{v};"
            );
        }
        c.push_str("}\n");
        self.split_weights(c);
        c.push_str("}\n");
    }

    /// Each weight as the sum of two values of the operand type (the
    /// rounded weight and the rounded remainder), so the product with the
    /// values loses no more than the f32 accumulation does; a weight
    /// declared in the operand type is rounded once.
    fn split_weights(&self, c: &mut String) {
        let a = self.a;
        for k in 0..a.contractions.len() {
            let idx = format!(
                "((pf_r / 2) * {} + pf_n / 2) * 4 + (pf_n % 2) * 2 + pf_r % 2",
                a.warp_keys() / 16
            );
            let idx = idx.as_str();
            let bf16 = self.t.dtype_arg(a.dtype == DType::BF16);
            if a.contractions[k].rounded_once {
                let _ = writeln!(
                    c,
                    "pf_round2(pf_w0[{k}], pf_w1[{k}], &{}{bf16});",
                    self.t.at(&format!("pf_pa{k}"), idx),
                );
            } else {
                let _ = writeln!(
                    c,
                    "pf_split2(pf_w0[{k}], pf_w1[{k}], &{}, &{}{bf16});",
                    self.t.at(&format!("pf_pa{k}"), idx),
                    self.t.at(&format!("pf_pl{k}"), idx)
                );
            }
        }
    }

    /// The tile's sums, combined over a row's four lanes, added to the
    /// rows'; the new predecessor value becomes the row's.
    fn add_tile_sums(&mut self) {
        let a = self.a;
        for k in 0..a.sums.len() {
            self.quad(&format!("pf_st{k}"), SLOTS, Reducer::Sum);
        }
        let mut c = String::new();
        let _ = writeln!(c, "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{");
        for k in 0..a.sums.len() {
            let s = self.t.at(&format!("pf_sum{k}"), "pf_r");
            let _ = writeln!(
                c,
                "{s} = {s} + {};",
                self.t.at(&format!("pf_st{k}"), "pf_r")
            );
        }
        let _ = writeln!(
            c,
            "{} = {}; }}",
            self.t.at("pf_m", "pf_r"),
            self.t.at("pf_mn", "pf_r")
        );
        self.threads(&c);
    }

    /// The expressions `of_sum` picks of the row sums and `of_con` of the
    /// contractions, printed, each distinct text once (see [`Distinct`]).
    fn distinct(
        &self,
        printer: &Printer<'_>,
        env: &HashMap<String, String>,
        of_sum: impl Fn(&RowSum) -> &Expr,
        of_con: impl Fn(&RowContraction) -> &Expr,
    ) -> Distinct {
        let mut texts = Vec::new();
        let sums = self
            .a
            .sums
            .iter()
            .map(|s| intern(&mut texts, printer.expr(of_sum(s), env)))
            .collect();
        let cons = self
            .a
            .contractions
            .iter()
            .map(|x| intern(&mut texts, printer.expr(of_con(x), env)))
            .collect();
        (texts, sums, cons)
    }

    /// `overrides` and the reads of a repair `H(X; Mp, M)`: `X` by 1 (the
    /// repair is a factor), the old and the new predecessor values by
    /// `old` and `new`.
    fn repair_overrides(
        &self,
        mut o: HashMap<AccessKey, String>,
        old: &str,
        new: &str,
    ) -> HashMap<AccessKey, String> {
        let a = self.a;
        o.insert(a.repair_new.clone(), new.to_string());
        o.insert(a.repair_old.clone(), old.to_string());
        for x in a.sums.iter().map(|s| &s.repair_self) {
            o.insert(x.clone(), "1.0f".into());
        }
        for x in a.contractions.iter().map(|c| &c.repair_self) {
            o.insert(x.clone(), "1.0f".into());
        }
        o
    }

    /// A split kernel's end: the warps' states (each over its share of the
    /// slice's keys) combined into the block's, as the rewrite's proven
    /// combination joins two partial states (`M = M_a fr M_b`, each target
    /// moved to `M` by its repair, then summed), and stored as the slice's
    /// local states. Through shared memory: each warp's rows' predecessor
    /// values, then each warp's repaired states, summed over the warps.
    fn merge_and_store(&mut self) {
        let a = self.a;
        let Some(sp) = &a.split else {
            return;
        };
        let per_row = a.merge_row_floats();
        let mg = self.t.merge_buffer(a.merge_floats());
        self.out.push_str(&mg);
        let slot =
            |w: &str, row: &str, k: String| format!("pf_mg[({w} * 16 + {row}) * {per_row} + {k}]");
        let env = self.env();
        // Each warp's predecessor values.
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n\
             const int pf_rl = pf_g + 8 * (pf_r % 2);\n\
             if (pf_c == 0) {} = {}; }}",
            slot("pf_w", "pf_rl", "0".into()),
            self.t.at("pf_m", "pf_r")
        );
        self.threads(&c);
        self.sync();
        // The block's value, each warp's states repaired to it.
        let printer = self.printer(HashMap::new(), false);
        let ident = printer.identity(a.reducer, DType::F32);
        let rov = self.repair_overrides(HashMap::new(), &self.t.at("pf_m", "pf_r"), "pf_mb");
        let printer = self.printer(rov, false);
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n\
             const int pf_rl = pf_g + 8 * (pf_r % 2);\n\
             float pf_mb = {ident};\n\
             for (int pf_v = 0; pf_v < {WARPS}; pf_v++) pf_mb = {};\n\
             {}\n\
(void)pf_ei;",
            printer.combine(
                a.reducer,
                DType::F32,
                "pf_mb",
                &slot("pf_v", "pf_rl", "0".into())
            ),
            self.row_of()
        );
        let mut off = 1;
        for (k, x) in a.sums.iter().enumerate() {
            let _ = writeln!(
                c,
                "if (pf_c == 0) {} = {} * ({});",
                slot("pf_w", "pf_rl", format!("{off}")),
                self.t.at(&format!("pf_sum{k}"), "pf_r"),
                printer.expr(&x.repair, &env)
            );
            off += 1;
        }
        for (k, x) in a.contractions.iter().enumerate() {
            let _ = writeln!(
                c,
                "{{ const float pf_f = {};\n\
                 for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++)\n\
                 {} = {} * pf_f; }}",
                printer.expr(&x.repair, &env),
                x.width / 8,
                slot(
                    "pf_w",
                    "pf_rl",
                    format!("{off} + pf_n * 8 + 2 * pf_c + pf_h")
                ),
                self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width))
            );
            off += x.width;
        }
        c.push_str("}\n");
        self.threads(&c);
        self.sync();
        // Sums over the warps, stored as the slice's local states.
        let sts = &self.program.statements;
        let printer = self.printer(HashMap::new(), false);
        let store = |pos: usize, v: &str| -> String {
            let st = &sts[pos];
            let subs: Vec<Affine> = st.lhs_indices.iter().map(|n| Affine::var(n)).collect();
            format!("{} = {v};", printer.element(&st.lhs_tensor, &subs, &env))
        };
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_x = pf_t; pf_x < {}; pf_x += {THREADS}) {{\n\
             const int pf_rl = pf_x / {per_row}, pf_q = pf_x % {per_row};\n\
             const pf_i pf_ei = pf_i0 + pf_rl;\n\
             if (pf_ei < {}) {{\n\
             float pf_sv = pf_q == 0 ? {ident} : 0.0f;\n\
             for (int pf_v = 0; pf_v < {WARPS}; pf_v++) pf_sv = pf_q == 0 ? {} : pf_sv + {};",
            SPLIT_ROWS * per_row,
            a.rows,
            printer.combine(
                a.reducer,
                DType::F32,
                "pf_sv",
                &slot("pf_v", "pf_rl", "0".into())
            ),
            slot("pf_v", "pf_rl", "pf_q".into())
        );
        let _ = writeln!(c, "if (pf_q == 0) {{ {} }}", store(sp.pred_local, "pf_sv"));
        let mut off = 1;
        for &pos in &sp.sum_locals {
            let _ = writeln!(c, "else if (pf_q == {off}) {{ {} }}", store(pos, "pf_sv"));
            off += 1;
        }
        for (k, &pos) in sp.con_locals.iter().enumerate() {
            let w = a.contractions[k].width;
            let _ = writeln!(
                c,
                "else if (pf_q < {}) {{ const pf_i pf_ee = pf_q - {off}; {} }}",
                off + w,
                store(pos, "pf_sv")
            );
            off += w;
        }
        c.push_str("}\n}\n");
        self.threads(&c);
    }

    /// The batch iterators' values `pf_b0, ..` from the block's batch
    /// combination `pf_bt` (the last iterator varies fastest).
    fn batch_values(&self) -> String {
        let mut decl = String::new();
        let mut stride = 1i64;
        for (k, (_, e)) in self.a.batch.iter().enumerate().rev() {
            let _ = writeln!(
                decl,
                "const pf_i pf_b{k} = (pf_bt / {stride}) % {e}; (void)pf_b{k};"
            );
            stride *= e;
        }
        decl
    }

    fn combine(&mut self) {
        let a = self.a;
        let Some(sp) = &a.split else {
            return;
        };
        let sts = &self.program.statements;
        let batch_decl = self.batch_values();
        let row = self.row_subs();
        // Overrides: the combined states as the thread's variables.
        let mut ov = HashMap::new();
        let pg = &sts[sp.pred_global];
        ov.insert(AccessKey::new(&pg.lhs_tensor, &row), "pf_M".to_string());
        for (k, &pos) in sp.sum_globals.iter().enumerate() {
            ov.insert(
                AccessKey::new(&sts[pos].lhs_tensor, &row),
                format!("pf_X{k}"),
            );
        }
        let mut env = self.env();
        let mut c = String::new();
        let _ = writeln!(c, "{batch_decl}");
        // One fold: `var` = the global statement at `pos` reduced over the
        // slices, the lane's slices first, then across the warp.
        let fold = |c: &mut String,
                    ov: &HashMap<AccessKey, String>,
                    env: &mut HashMap<String, String>,
                    pos: usize,
                    var: &str| {
            let st = &sts[pos];
            let op = if pos == sp.pred_global {
                a.reducer
            } else {
                Reducer::Sum
            };
            env.insert(st.reduction_indices[0].clone(), "pf_s".into());
            let printer = self.printer(ov.clone(), false);
            let ident = printer.identity(op, DType::F32);
            let step = printer.combine(op, DType::F32, "pf_v", &printer.expr(&st.rhs, env));
            // The lane's slices unrolled: their loads in flight together.
            let unroll = self.t.unroll4();
            let lanes = format!(
                "float pf_v = {ident};\n{unroll}for (pf_i pf_s = pf_l; pf_s < {}; pf_s += 32) pf_v = {step};\n",
                sp.slices
            );
            let combine = |x: &str, y: &str| printer.combine(op, DType::F32, x, y);
            c.push_str(&self.t.warp_fold(var, &lanes, &combine));
        };
        fold(&mut c, &ov, &mut env, sp.pred_global, "pf_M");
        for (k, &pos) in sp.sum_globals.iter().enumerate() {
            fold(&mut c, &ov, &mut env, pos, &format!("pf_X{k}"));
        }
        // The epilogue over rows (one thread of the grid's first column
        // block), then a warp's column (a column name stands for one
        // width).
        let printer = self.printer(ov.clone(), false);
        for &p in &a.epilogue {
            let st = &sts[p];
            if st.lhs_indices.len() == row.len() {
                let _ = writeln!(
                    c,
                    "if (pf_ez == 0 && pf_t == 0) {}",
                    printer.statement(st, StmtKind::Assign, &env)
                );
            }
        }
        let mut columns: Vec<(&String, i64)> = a
            .contractions
            .iter()
            .map(|x| (&x.column, x.width))
            .collect();
        columns.sort();
        columns.dedup();
        let _ = writeln!(
            c,
            "const pf_i pf_ee = pf_ez * {COMBINE_WARPS} + pf_w; (void)pf_ee;"
        );
        for (column, width) in columns {
            let _ = writeln!(c, "if (pf_ee < {width}) {{");
            let mut cov = ov.clone();
            for (k, x) in a.contractions.iter().enumerate() {
                if &x.column != column {
                    continue;
                }
                cov.insert(
                    AccessKey::new(&sts[sp.con_globals[k]].lhs_tensor, &self.col_subs(column)),
                    format!("pf_O{k}"),
                );
                fold(
                    &mut c,
                    &ov,
                    &mut env,
                    sp.con_globals[k],
                    &format!("pf_O{k}"),
                );
            }
            let printer = self.printer(cov, false);
            for &p in &a.epilogue {
                let st = &sts[p];
                if st.lhs_indices.len() > row.len() && st.lhs_indices.last() == Some(column) {
                    let _ = writeln!(
                        c,
                        "if (pf_l == 0) {}",
                        printer.statement(st, StmtKind::Assign, &env)
                    );
                }
            }
            c.push_str("}\n");
        }
        let grid = self.t.combine_grid(a, &c);
        self.out.push_str(&grid);
    }

    /// The epilogue statements, from the final states.
    fn epilogue(&mut self) {
        let a = self.a;
        let env = self.env();
        let row = self.row_subs();
        let mut c = String::new();
        for &p in &a.epilogue {
            let st = &self.program.statements[p];
            let mut ov = HashMap::new();
            ov.insert(AccessKey::new(&a.pred, &row), self.t.at("pf_m", "pf_r"));
            for (k, s) in a.sums.iter().enumerate() {
                ov.insert(
                    AccessKey::new(&s.tensor, &row),
                    self.t.at(&format!("pf_sum{k}"), "pf_r"),
                );
            }
            let column = if st.lhs_indices.len() > row.len() {
                st.lhs_indices.last().cloned()
            } else {
                None
            };
            let width = column
                .as_ref()
                .and_then(|col| a.contractions.iter().find(|x| &x.column == col))
                .map(|x| x.width);
            for (k, x) in a.contractions.iter().enumerate() {
                if column.as_ref() == Some(&x.column) && Some(x.width) == width {
                    ov.insert(
                        AccessKey::new(&x.tensor, &self.col_subs(&x.column)),
                        self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width)),
                    );
                }
            }
            let printer = self.printer(ov, false);
            let text = printer.statement(st, StmtKind::Assign, &env);
            match width {
                Some(w) => {
                    let _ = writeln!(
                        c,
                        "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++) {{\n\
                         {}\nconst pf_i pf_ee = pf_n * 8 + 2 * pf_c + pf_h; (void)pf_ee;\n\
                         if (pf_ei < {}) {text}\n}}",
                        w / 8,
                        self.row_of(),
                        a.rows
                    );
                }
                None => {
                    let _ = writeln!(
                        c,
                        "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n{}\nif (pf_c == 0 && pf_ei < {}) {text}\n}}",
                        self.row_of(),
                        a.rows
                    );
                }
            }
        }
        self.threads(&c);
    }
}
