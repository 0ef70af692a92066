//! What differs between a thread-mapped kernel on the GPU ([`Gpu`],
//! CUDA) and its CPU emulation ([`Emulation`], C): [`Ctx`] prints the
//! kernel once, through a [`KernelTarget`], and the two targets print the
//! operations that differ: the hardware's block and thread indices against
//! the emulation's loops over them, the barriers (the race detector's
//! epochs in the emulation, whose threads run one after another), the
//! warp's shuffles (lane after lane on the CPU), the unroll hints and the
//! 16-byte accesses (the GPU's alone), the arrays each thread or lane has
//! its own of (a row per thread or lane in the emulation), and the
//! sections that are different programs on the two (a warp's reduction, a
//! split loop's combination, a double buffer's next stage).
//!
//! [`Gpu`]: super::gpu::Gpu
//! [`Emulation`]: super::emulation::Emulation
//!
//! This is neither `codegen::flash`'s `FlashTarget` (an attention kernel,
//! printed whole) nor `codegen::mma`'s `Target` (the tensor-core engine,
//! which a contraction's region reaches through `mma_threads`).

use crate::codegen::expr::Printer;
use crate::frontend::ast::{DType, Reducer};
use crate::gpu::contraction::Contraction;
use crate::gpu::promote::Promotion;
use crate::isl::ast::Node;

use super::lanes::Slot;
use super::{Ctx, Pending};

/// A reduction loop split over a warp's lanes (`Ctx::reduce`), its
/// partial results to combine.
pub(super) struct WarpReduce<'r> {
    /// The padding of the reduction's braces (its lines one step in).
    pub pad: &'r str,
    /// The compute type of the partial results, and the reducer's
    /// identity in it.
    pub ty: &'r str,
    pub ident: &'r str,
    pub op: Reducer,
    pub t: DType,
    /// The total `pf_red` folded into the element.
    pub fold: &'r str,
    /// The mappings pending around the loop.
    pub pending: &'r [Pending],
    /// One lane's share into `pf_red`: (out, padding, the lane).
    pub per_lane: &'r dyn Fn(&mut String, &str, &str),
}

/// A map loop a row's lanes share (`Ctx::lane_loop`), without states.
pub(super) struct MapLoop<'m, 'c> {
    /// The printer inside the loop (its lanes shared).
    pub inner: &'m Ctx<'c>,
    /// The loop's node, and its body.
    pub whole: &'m Node,
    pub body: &'m Node,
    /// The loop's iterator, start, condition and step, as printed.
    pub head: (&'m str, &'m str, &'m str, &'m str),
    /// The slots per lane of the cached rows the loop reads, if any.
    pub slots: Option<i64>,
    /// A lane's share: (out, padding, the lane, depth).
    pub share: &'m dyn Fn(&mut String, &str, &str, usize),
    /// Where the loop is printed: its depth, the mappings pending there,
    /// and whether it is inside the thread loops.
    pub depth: usize,
    pub pending: &'m [Pending],
    pub in_thread: bool,
}

/// The operations whose text differs between the GPU and the emulation.
pub(super) trait KernelTarget {
    /// Whether the race detector watches what is printed now: an emulated
    /// kernel the printer routes through it (`Printer::race`), never the
    /// GPU's.
    fn watches_races(&self, printer: &Printer<'_>) -> bool;

    /// The block's barrier at `pad`: `__syncthreads()` on the GPU; in the
    /// emulation, whose threads run one after another, the race
    /// detector's next epoch (when it watches).
    fn barrier(&self, c: &Ctx<'_>, pad: &str, out: &mut String);

    /// The barrier of the threads sharing a row (`Ctx::lane_barrier`),
    /// on the GPU (the emulation runs a row's lanes one after another).
    fn row_barrier(&self, c: &Ctx<'_>, pad: &str, out: &mut String);

    /// Whether every loop's steps run in order without a barrier (the
    /// emulation's threads run each step whole), so that a promotion point
    /// below any loop may be double buffered along it (on the GPU, along a
    /// loop whose steps end with a barrier).
    fn steps_in_order(&self) -> bool;

    /// The index and the count of mapping `p` (`above`: the mappings
    /// pending above it) that a loop is distributed over: the hardware's on
    /// the GPU (index 0 of those above), in the emulation a loop over the
    /// emulated indices opened here, from the last one down.
    fn mapped_index(
        &self,
        c: &Ctx<'_>,
        above: &[Pending],
        p: &Pending,
        pad: &str,
        out: &mut String,
    ) -> (String, String);

    /// The test that index `axis` of the thread (`thread`) or the block is
    /// 0, where one index along it runs code the others skip: the GPU's;
    /// none in the emulation, which runs such code once.
    fn index_zero(&self, thread: bool, axis: char) -> Option<String>;

    /// Opens the emulation's loop over the threads along `axis` (`count`
    /// of them, from the last one with `down`), which the GPU's run side
    /// by side: nothing on the GPU.
    fn thread_loop(
        &self,
        c: &Ctx<'_>,
        axis: char,
        count: u32,
        down: bool,
        pad: &str,
        out: &mut String,
    );

    /// The thread's index along `axis`: the hardware's, or the emulation's
    /// loop variable ([`KernelTarget::thread_loop`]).
    fn thread_index(&self, axis: char) -> String;

    /// Whether loops over a thread's registers are unrolled (a private
    /// array's, a register tile's steps) so that their subscripts are
    /// constants: the GPU's registers need it, the emulation's arrays not.
    fn unrolls(&self) -> bool;

    /// `#pragma unroll` at `pad` before a loop the GPU unrolls (the
    /// emulation's C compiler decides for itself).
    fn unroll(&self, pad: &str, out: &mut String);

    /// Whether global memory moves 16 bytes at a time (`float4`) where the
    /// plan allows: the GPU's wide accesses; the emulation moves one
    /// element at a time.
    fn vectors(&self) -> bool;

    /// Whether a thread's read-only copy of an f16 or bf16 input is held
    /// in f32, converted once at its load (the GPU's saving on every read;
    /// the emulation keeps the storage type).
    fn widens_inputs(&self) -> bool;

    /// Whether a column lane's loop loads its inputs a batch of steps
    /// ahead (`Ctx::column_steps`): loads in flight together on the GPU;
    /// the emulation runs the plain strided loop.
    fn loads_ahead(&self) -> bool;

    /// The C type an element of `t` is stored as: CUDA's (`storage_type`)
    /// or the emulation's C (`codegen::c::storage_type`).
    fn storage_type(&self, t: DType) -> &'static str;

    /// The qualifier and the leading dimensions of an array each thread
    /// has its own of, along `axes` of block `block`: none on the GPU (the
    /// thread's registers), a static array with a row per emulated thread.
    fn thread_rows(&self, block: [u32; 3], axes: &[char]) -> (&'static str, String);

    /// The current thread's row of such an array (see
    /// [`KernelTarget::thread_rows`]).
    fn thread_row(&self, axes: &[char]) -> String;

    /// A thread axis whose loop isl did not generate: the emulation's
    /// thread index there is 0 (the GPU's is the hardware's).
    fn thread_zero(&self, axis: char, pad: &str, out: &mut String);

    /// The leading dimension of an array each of a row's `width` lanes has
    /// its own of: none on the GPU, a row per lane in the emulation.
    fn lane_rows(&self, width: u32) -> String;

    /// The current lane's row of such an array (see
    /// [`KernelTarget::lane_rows`]).
    fn lane_row(&self) -> &'static str;

    /// `body(lane, pad, out)` for the row's lanes: on the GPU this lane's
    /// (`Ctx::lane_index`), in the emulation each lane in a loop.
    fn each_lane(
        &self,
        c: &Ctx<'_>,
        pad: &str,
        out: &mut String,
        body: &mut dyn FnMut(&str, &str, &mut String),
    );

    /// The `emulate` of a contraction's tensor-core region
    /// (`codegen::mma::Region`) of `threads` threads: none on the GPU.
    fn mma_threads(&self, threads: u32) -> Option<u32>;

    /// Kernel `mark`'s shared arrays (`arrays`, a contraction's own):
    /// `__shared__` on the GPU, static arrays every emulated block reuses.
    fn shared_arrays(
        &self,
        mark: &str,
        arrays: &[Promotion],
        contraction: Option<&Contraction>,
    ) -> String;

    /// The head of the cooperative copy of shared array `a`'s box
    /// (`box_len` elements in groups of `width`), each element `pf_e`: the
    /// block's threads strided over it on the GPU, one loop in the
    /// emulation (which tells the race detector each element's thread).
    fn copy_loop(
        &self,
        c: &Ctx<'_>,
        a: &Promotion,
        box_len: i64,
        width: i64,
        pad: &str,
        out: &mut String,
    );

    /// A double buffer's next tiles fetched at the start of a step
    /// (`Ctx::copy_in_stages`): into registers on the GPU, stored by
    /// [`KernelTarget::store_next_stage`]; copied into the other stage at
    /// once in the emulation.
    fn fetch_next_stage(&self, c: &Ctx<'_>, depth: usize, out: &mut String);

    /// The end of a double-buffered promotion point: the GPU's registers
    /// stored into the other stage (nothing in the emulation).
    fn store_next_stage(&self, c: &Ctx<'_>, depth: usize, out: &mut String);

    /// The lanes' partial results of a reduction loop combined and folded
    /// into the element (`Ctx::reduce`): shuffles on the GPU, the lanes one
    /// after the other in the emulation.
    fn warp_reduce(&self, c: &Ctx<'_>, r: &WarpReduce<'_>, out: &mut String);

    /// A map loop the lanes share: the GPU's lanes strided over it (four
    /// slots at once where they can), then the row's barrier; the
    /// emulation runs it whole, or lane after lane where it reads a cached
    /// row.
    fn map_loop(&self, c: &Ctx<'_>, m: &MapLoop<'_, '_>, out: &mut String);

    /// A reduction loop split over the lanes (`Ctx::split_loop`): each
    /// lane's share, then the partial states combined: shuffles and shared
    /// memory on the GPU, a butterfly over arrays in the emulation.
    fn split_loop(
        &self,
        c: &Ctx<'_>,
        slots: &[Slot],
        carried: &[&Slot],
        share: &dyn Fn(&mut String, &str, &str, usize),
        depth: usize,
        out: &mut String,
    );
}
