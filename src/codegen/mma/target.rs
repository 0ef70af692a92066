//! What differs between the region on the GPU and its CPU emulation for
//! the operations both print the same way around: the thread loop, the
//! unrolling hints, a 16-byte copy, the accumulators' declaration and
//! storage types. The sections that are different programs on the two
//! (the `mma.sync` step, the cluster's ranks) match on [`Target`]
//! themselves.

use super::super::{c, cuda};
use super::writer::Lines;
use crate::frontend::ast::DType;

/// Where the region runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// CUDA: each thread runs the region, `pf_tid` its index.
    Gpu,
    /// The CPU emulation: one thread after the other (from the last, so
    /// that a read of another thread's result in the wrong order shows),
    /// the warp-wide instructions as C functions.
    Emulation,
}

impl Target {
    /// The target of a region whose `emulate` is `emulate`.
    pub(super) fn of(emulate: Option<u32>) -> Self {
        if emulate.is_some() {
            Target::Emulation
        } else {
            Target::Gpu
        }
    }

    /// `#pragma unroll` before a loop with a constant count, on the GPU
    /// (the emulation's C compiler decides for itself).
    pub(super) fn unroll(self, o: &mut Lines, level: usize) {
        if self == Target::Gpu {
            o.line(level, "#pragma unroll");
        }
    }

    /// Opens the loop over the block's `threads` in the emulation (each
    /// thread's own code inside it); on the GPU the thread is already
    /// running. Returns the level of the code inside.
    pub(super) fn open_threads(self, o: &mut Lines, level: usize, threads: u32) -> usize {
        match self {
            Target::Gpu => level,
            Target::Emulation => {
                o.line(
                    level,
                    format!(
                        "for (int pf_tid = {}; pf_tid >= 0; pf_tid--) {{",
                        threads - 1
                    ),
                );
                level + 1
            }
        }
    }

    /// Closes what [`Target::open_threads`] opened at `level`.
    pub(super) fn close_threads(self, o: &mut Lines, level: usize) {
        if self == Target::Emulation {
            o.line(level, "}");
        }
    }

    /// A whole 16-byte chunk from global to shared memory: `cp.async` on
    /// the GPU (waited for at the pipeline's steps), `memcpy` on the CPU.
    pub(super) fn copy16(self, dst: &str, src: &str) -> String {
        match self {
            Target::Gpu => format!("pf_cp_async16_full({dst}, {src});"),
            Target::Emulation => format!("memcpy({dst}, {src}, 16);"),
        }
    }

    /// Accumulator `pf_r` of fragment `(pf_mt, pf_nt)` of thread `pf_tid`:
    /// the thread's registers on the GPU, a static array indexed by the
    /// thread in the emulation.
    pub(super) fn accumulator(self) -> &'static str {
        match self {
            Target::Gpu => "pf_acc[pf_mt][pf_nt][pf_r]",
            Target::Emulation => "pf_acc[pf_tid][pf_mt][pf_nt][pf_r]",
        }
    }

    /// The C type a tensor of `t` is stored as.
    pub(super) fn storage_type(self, t: DType) -> &'static str {
        match self {
            Target::Gpu => cuda::storage_type(t),
            Target::Emulation => c::storage_type(t),
        }
    }

    /// The type of two neighbouring elements of `t` stored as one access,
    /// where there is one (16-bit and f32 elements).
    pub(super) fn pair_type(self, t: DType) -> Option<&'static str> {
        let gpu = self == Target::Gpu;
        match t {
            DType::F16 | DType::BF16 => Some(if gpu { "unsigned int" } else { "uint32_t" }),
            DType::F32 => Some(if gpu { "float2" } else { "uint64_t" }),
            _ => None,
        }
    }
}
