//! What differs between an attention kernel on the GPU ([`Gpu`], CUDA)
//! and its CPU emulation ([`Emulation`], C): [`Emit`] prints the kernel
//! once, through a [`FlashTarget`], and the two targets print the
//! operations that differ: the loops over the threads and the warps that
//! the emulation has in place of the hardware's, the barriers and the
//! copies' bookkeeping (nothing to wait for on the CPU), the warp-wide
//! instructions and the shuffles (C helpers in the emulation), and the
//! sections that are different programs on the two (the `wgmma` steps,
//! the block's and the combining grid's indices).
//!
//! This is not `codegen::mma`'s `Target`: that one prints through its
//! indented `Lines`, this one into the kernel's flat text.

use crate::frontend::ast::Reducer;
use crate::gpu::attention::Attention;

use super::emulation::Emulation;
use super::gpu::Gpu;
use super::Emit;

/// The target printed: the emulation with `emu`, else the GPU.
pub(super) fn of(emu: bool) -> &'static dyn FlashTarget {
    if emu {
        &Emulation
    } else {
        &Gpu
    }
}

/// A fragment operand of [`FlashTarget::mma`]: the per-thread array, the
/// first register's index in a thread's part, a thread's part's length.
pub(super) type Fragment<'s> = (&'s str, &'s str, i64);

/// The operations whose text differs between the GPU and the emulation.
pub(super) trait FlashTarget {
    /// `#pragma unroll` before a loop of a constant count on the GPU (the
    /// emulation's C compiler decides for itself).
    fn unroll(&self) -> &'static str;

    /// The hint that unrolls a loop four times on the GPU (a lane's loads
    /// in flight together).
    fn unroll4(&self) -> &'static str;

    /// Element `idx` of per-thread array `name`: the thread's own array on
    /// the GPU, thread `pf_t`'s row of it in the emulation.
    fn at(&self, name: &str, idx: &str) -> String;

    /// `code`, which each of the block's `threads` runs: in a block of its
    /// own on the GPU, in a loop over the threads in the emulation.
    fn threads(&self, out: &mut String, threads: u32, code: &str);

    /// Warp-wide `code`: as printed on the GPU, once per warp (of
    /// `warps`) in the emulation.
    fn warps(&self, out: &mut String, warps: i64, code: &str);

    /// The block's barrier, with its newline (none in the emulation, whose
    /// threads run one after the other).
    fn barrier(&self) -> &'static str;

    /// `ldmatrix.x4` (transposed with `trans`) into `dst[off..off + 4]`,
    /// lane `pf_l` of warp `pf_w` giving the row address `addr`.
    fn ldsm(&self, dst: &str, off: &str, addr: &str, trans: bool) -> String;

    /// `d += a b` (`mma.m16n8k16`, bf16 operands with `bf16`, else f16) on
    /// warp `pf_w`.
    fn mma(&self, d: Fragment<'_>, a: Fragment<'_>, b: Fragment<'_>, bf16: bool) -> String;

    /// Each entry of per-thread array `name` (`n` entries) combined with
    /// reducer `op` over a row's four lanes, in a block of `threads`.
    fn quad(&self, out: &mut String, threads: u32, name: &str, n: i64, op: Reducer);

    /// Whether the step's exponentials may be `__expf` (the GPU's; the
    /// emulation computes `expf`).
    fn fast_exp(&self) -> bool;

    /// The C type of a 16-bit element.
    fn u16(&self) -> &'static str;

    /// The copy of one 16-byte chunk at `src` (of tensor `tensor`) to
    /// `pf_dst`, and the zero fill of `pf_dst` past the tensor's rows:
    /// `cp.async` on the GPU, `memcpy` and `memset` in the emulation.
    fn copy_chunk(&self, src: &str, tensor: &str) -> (String, String);

    /// Closes a group of copies (a `cp.async` group on the GPU; the
    /// emulation's copies are done when they return).
    fn commit(&self) -> &'static str;

    /// Waits until all but the newest `n` groups of copies have landed.
    fn wait(&self, n: i32) -> String;

    /// Orders the thread's copies before the tensor cores' reads of
    /// shared memory (through the async proxy) in a kernel with a `wgmma`
    /// path, with its newline.
    fn proxy_fence(&self) -> &'static str;

    /// The `mma.sync` form of a step, printed by `mma_sync`, in a kernel
    /// that has a `wgmma` path: on the GPU compiled where the device is
    /// not sm_90a, in the emulation none (it runs the `wgmma` path alone).
    fn beside_wgmma<'a>(&self, e: &mut Emit<'a>, mma_sync: fn(&mut Emit<'a>));

    /// Whether this is the CPU emulation.
    fn emulated(&self) -> bool;

    /// The full barriers `name` of `stages` tile stages copied by the copy
    /// engine, declared and initialised (one arrival each) at the block's
    /// start.
    fn tile_barriers(&self, name: &str, stages: i64) -> String;

    /// `tma`, the copy engine's copies, where the kernel runs its `wgmma`
    /// path, and `threads`, the threads' copies, where it does not (the
    /// emulation runs the former).
    fn tma_or(&self, tma: &str, threads: &str) -> String;

    /// The producer's arrival on barrier `bar` (an address), expecting
    /// `bytes` more bytes of copies.
    fn expect_bytes(&self, bar: &str, bytes: i64) -> String;

    /// The wait for a tile copied by the copy engine: barrier `bar`'s
    /// phase of parity `parity` completed, and the query's `cp.async`
    /// copies ordered before the tensor cores' reads; where the kernel
    /// runs `mma.sync`, all but the newest `n` `cp.async` groups.
    fn tile_landed(&self, n: i32, bar: &str, parity: &str) -> String;

    /// The scores of a key tile on `wgmma` (`Emit::wgmma_scores`).
    fn wgmma_scores(&self, e: &mut Emit<'_>);

    /// The value products on `wgmma` (`Emit::wgmma_values`).
    fn wgmma_values(&self, e: &mut Emit<'_>);

    /// The declaration of the block's shared memory `pf_dynamic_shared`:
    /// the GPU's dynamic shared memory, an array of the same size in the
    /// emulation.
    fn shared_memory(&self, a: &Attention) -> String;

    /// The `wgmma` descriptors' fields other than the start address, once
    /// (a kernel with a `wgmma` path; the emulation's `wgmma` takes the
    /// fields as arguments).
    fn wgmma_descriptors(&self) -> String;

    /// The declaration of a thread's array `name` of `len` elements of
    /// `ty` (the emulation's C type name), of a block of `threads`.
    fn per_thread(&self, threads: u32, ty: &str, name: &str, len: i64) -> String;

    /// The block's and the thread's indices, then `batch_decl`: on the GPU
    /// from the hardware's, in the emulation a loop over the blocks (closed
    /// by [`FlashTarget::close_block`]).
    fn open_block(&self, a: &Attention, batch_decl: &str) -> String;

    /// Closes what [`FlashTarget::open_block`] opened, with its newline.
    fn close_block(&self) -> &'static str;

    /// The test that any of a warp's lanes has any of `conds` true before
    /// a repair that is skipped otherwise (the emulation repairs always).
    fn any_lane(&self, conds: &[String]) -> String;

    /// The arguments `pf_split2` and `pf_round2` take after the weights:
    /// the emulation's take the operand type, the GPU's are the kernel's
    /// own.
    fn dtype_arg(&self, bf16: bool) -> String;

    /// The split kernel's merge buffer `pf_mg` of `floats` floats: the
    /// shared memory on the GPU, an array of its own in the emulation.
    fn merge_buffer(&self, floats: i64) -> String;

    /// `var` declared and set to a warp's fold of its lanes' values, each
    /// lane's computed by `lanes` into `pf_v`, with `combine(x, y)` (the
    /// reducer of two values): a butterfly of shuffles on the GPU, the
    /// lanes one after the other and then the butterfly's sums as lane 0
    /// forms them in the emulation.
    fn warp_fold(&self, var: &str, lanes: &str, combine: &dyn Fn(&str, &str) -> String) -> String;

    /// The combining kernel's grid around `code`: the hardware's indices on
    /// the GPU, loops over the rows, the batch combinations, the column
    /// blocks and the warps in the emulation.
    fn combine_grid(&self, a: &Attention, code: &str) -> String;
}
