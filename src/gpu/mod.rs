//! The GPU target: the tiled schedule tree mapped to CUDA blocks and
//! threads ([`mapping`]), arrays promoted to shared memory ([`promote`]), and
//! the result as a CUDA program description ([`CudaProgram`]) that the
//! CUDA printer (`codegen::cuda`), the CPU emulation (`codegen::c`), the
//! runtime (`runtime::cuda`) and the C ABI all read.
//!
//! Every kernel takes the same arguments: a pointer per tensor of the
//! program in the model's order (inputs, outputs, temps), then one `long`
//! per parameter that has no value at compile time, in file order, then
//! one `long` per host loop's iterator ([`HostLoop`]), where the program
//! has host loops.

pub mod attention;
pub mod block_order;
pub mod contraction;
pub mod cost;
pub mod decoding;
pub mod describe;
pub mod lanes;
pub mod mapping;
pub mod private;
pub mod promote;
pub mod race;
pub mod registers;
pub mod stores;
#[cfg(test)]
pub(crate) mod test_support;
pub mod tma;
pub mod traffic;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::frontend::ast::{DType, Program};
use crate::isl::ast::Expr;
use crate::model::ModelTensor;

/// Options of the GPU mapping, independent of the tile sizes (as in PPCG):
/// a block of threads executes a tile cyclically when it has fewer threads
/// than the tile has points, and a grid smaller than the number of tiles
/// runs them cyclically too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOptions {
    /// Threads per block along x, y, z (innermost mapped member first);
    /// empty: chosen from the tile sizes (at most 256 threads).
    pub block: Vec<u32>,
    /// Upper bounds on blocks along x, y, z; empty: one block per tile.
    pub grid: Vec<u32>,
    /// Promote reused tiles of read-only tensors to shared memory.
    pub shared: bool,
    /// Choose tile sizes (and the block) for the GPU instead of the
    /// options' `tile`, per kernel: see `mapping::auto_tile`.
    pub auto_tile: bool,
    /// Keep a tensor the threads own element by element (an accumulator)
    /// in registers across the sequential loops of a block.
    pub registers: bool,
    /// Run the reduction loop of a kernel with a single parallel loop across
    /// the threads of a warp, combining the partial results with shuffles.
    pub reduce: bool,
    /// Shared memory a block may use, in bytes (the H100 allows 227 KB
    /// with the opt-in; 48 KB without).
    pub shared_limit: usize,
    /// Run contractions of f16 and bf16 operands on tensor cores
    /// (`mma.sync`, see [`contraction`]).
    pub tensor_cores: bool,
    /// Register tiles in groups of this many consecutive points per thread
    /// along each thread axis (1: cyclic, a thread's points one block
    /// apart). With groups, the shared tiles those points read are laid
    /// out with the thread-indexed dimension innermost and rows padded to
    /// whole groups, so a thread reads a group with one vector load (four
    /// f32 in one 16-byte load); see `registers::RegisterTile::group`.
    pub vector: u32,
    /// Unroll the sequential point loops of register tiles (a gemm's
    /// steps along `k` inside a shared tile) where their trip count is a
    /// constant, so the compiler can schedule the shared loads of several
    /// steps together. `None`: the mapping decides (on for register tiles
    /// on the SIMT units whose sizes it chose, see `mapping`'s
    /// `simt_tile`).
    pub unroll: Option<bool>,
    /// Double-buffer the shared tiles along the sequential loop around
    /// them (a gemm's loop over k tiles): each thread loads its part of
    /// the next tile into registers before the threads compute on the
    /// current one, and stores it into the other buffer after, so the
    /// global loads overlap the arithmetic and one barrier per step
    /// remains. Doubles the shared memory; see `promote::Scope::double_buffered`.
    /// `None`: the mapping decides, as for [`GpuOptions::unroll`].
    pub pipeline: Option<bool>,
    /// Split the reduction of a contraction on tensor cores over this many
    /// blocks (a thread-block cluster along the grid's z; at most 8); 1:
    /// no split; `None`: split where the output has too few tiles to fill
    /// the GPU (see `contraction::Contraction::split`). Kernels with a
    /// batch on z, or not on tensor cores, keep one block per tile.
    pub k_split: Option<u32>,
    /// Under the default strategy, replace a fused grouping by minimal
    /// fusion where the cost model (`gpu::cost`) expects that to take at
    /// most half the time (a product fused with its consumers into a
    /// kernel that loses its tiles). Off: the strategy's grouping as is.
    pub fusion_by_cost: bool,
    /// How the loops of loop blocks that carry a dependence run (see
    /// [`Recurrences`]).
    pub recurrences: Recurrences,
    /// On the host's steps of a recurrence, fuse each step's sums into one
    /// accumulator (an LSTM step's gates: the initialisation, both
    /// products and the bias) into one kernel (`schedule::sums` below the
    /// host loop). On by default since each block copies only its gate's
    /// weights (`gpu::promote::fixed_dimensions`): on the H200
    /// (2026-11-29, one call) the stacked LSTM of `bench/recurrences` took
    /// 8.13 ms with it (522 launches) against 12.35 ms without (1,299); at
    /// L 32, T 64, B 256 36.8 against 37.5 ms. Before that change it was
    /// slower (H100, 2026-11-28: 20.6 against 17.2 ms).
    pub fuse_step_sums: bool,
    /// Keep the cost model's estimate of the final mapping in
    /// `Compiled::gpu_estimate` (`compare` shows it beside the measured
    /// time, so the model can be checked); off by default, as it costs a
    /// traffic count per compilation.
    pub estimate: bool,
    /// Keep every tensor-core contraction's sums chained in the tensor
    /// cores, also where its stored value is f32 and the mapping would add
    /// them in IEEE f32 (`contraction::Accumulation`). Numerically weaker
    /// than the spec admits at long reductions: for tests of the check and
    /// for measuring what the promotion costs; no command-line flag sets
    /// it. The tiles stay those of the promoted form.
    pub chained_accumulation: bool,
    /// Copy the operand tiles of `wgmma` contractions with Hopper's copy
    /// engine where they allow it (see [`tma`]); off: `cp.async` copies
    /// by every thread, as before (`--no-tma`).
    pub tma: bool,
    /// Store a tensor-core contraction's tile through shared memory where
    /// it fits in the stages (see [`stores`]); off: each thread stores its
    /// own accumulators (`--no-staged-stores`).
    pub staged_stores: bool,
    /// Stages of every refilled `wgmma` pipeline, in place of the
    /// mapping's choice (4, or 3 for two blocks a multiprocessor, see
    /// `contraction::two_blocks_per_sm`): for tests that run a pipeline
    /// depth in the emulation at sizes where the mapping would not choose
    /// it; no command-line flag sets it. Values below the fewest a
    /// refilled pipeline may have (3) are refused by the mapping.
    pub wgmma_stages: Option<i64>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            block: Vec::new(),
            grid: Vec::new(),
            shared: true,
            reduce: true,
            registers: true,
            auto_tile: false,
            shared_limit: 48 * 1024,
            tensor_cores: true,
            vector: 1,
            unroll: None,
            pipeline: None,
            k_split: None,
            fusion_by_cost: true,
            recurrences: Recurrences::Wavefront,
            fuse_step_sums: true,
            estimate: false,
            chained_accumulation: false,
            tma: true,
            staged_stores: true,
            wgmma_stages: None,
        }
    }
}

impl GpuOptions {
    /// Checks the sizes a user gave: one to three values of at least 1
    /// for the block and the grid, a block of at most 1024 threads with at
    /// most 64 along z (CUDA's limits). The message says what is wrong.
    pub fn validate(&self) -> std::result::Result<(), String> {
        check_sizes(&self.block, "block")?;
        check_sizes(&self.grid, "grid")?;
        let threads: u64 = self.block.iter().map(|b| u64::from(*b)).product();
        if threads > 1024 || self.block.get(2).is_some_and(|z| *z > 64) {
            return Err(format!(
                "block {} is larger than CUDA allows (1024 threads, z at most 64)",
                self.block
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join("x")
            ));
        }
        if let Some(s) = self.k_split {
            if !(1..=contraction::MAX_SPLIT as u32).contains(&s) {
                return Err(format!(
                    "k split {s}: a contraction's reduction is split over 1 to {} blocks (one cluster)",
                    contraction::MAX_SPLIT
                ));
            }
        }
        if !matches!(self.vector, 1 | 2 | 4) {
            return Err(format!(
                "vector {} is not a group width polyfuse prints (1, 2 or 4)",
                self.vector
            ));
        }
        Ok(())
    }
}

/// How a recurrence (a loop block's loop that carries a dependence) runs
/// on the GPU, where the plain mapping would run it on one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recurrences {
    /// Inside one kernel on blocks of one thread (no host loop).
    Serial,
    /// One step per value of each block's index, the step's kernels
    /// parallel, the loop on the host (`schedule::host`).
    Steps,
    /// As `Steps`, with a wavefront over two nested blocks and the
    /// independent chains of a dilated recurrence in one launch, where the
    /// dependences allow (the default).
    Wavefront,
}

impl Recurrences {
    pub const NAMES: [&'static str; 3] = ["serial", "steps", "wavefront"];

    pub fn parse(s: &str) -> Option<Recurrences> {
        Some(match s {
            "serial" => Recurrences::Serial,
            "steps" => Recurrences::Steps,
            "wavefront" => Recurrences::Wavefront,
            _ => return None,
        })
    }
}

/// `sizes` (for `what`, "block" or "grid") is empty or one to three values
/// of at least 1.
pub fn check_sizes(sizes: &[u32], what: &str) -> std::result::Result<(), String> {
    if sizes.len() > 3 || sizes.contains(&0) {
        return Err(format!(
            "{what} sizes are one to three values of at least 1 (x, y, z)"
        ));
    }
    Ok(())
}

/// One argument of every kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelArg {
    /// A device pointer to the tensor's elements (row-major, storage type).
    Tensor {
        name: String,
        dtype: DType,
        /// Extents as C/isl text in the parameters.
        shape: Vec<String>,
    },
    /// A parameter without a compile-time value, passed as a C `long`.
    Param { name: String },
    /// The iterator of a host loop ([`HostLoop`]), passed as a C `long`:
    /// its value at the launch (0 for a kernel outside that loop).
    Step { name: String },
}

/// A loop the host runs around the launches of some kernels: the loop of
/// a recurrence's block that carries its dependences (`schedule::host`),
/// as isl's AST generator wrote it. Each iteration launches
/// `kernels[first..end]` in order, every kernel after the previous one
/// finished, with the iterator's value as its argument
/// ([`KernelArg::Step`]). Loops nest (an inner loop's kernels are a range
/// inside its outer loop's); [`CudaProgram::launches`] unrolls them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostLoop {
    /// What one iteration runs, as the schedule stage chose it.
    pub step: crate::schedule::host::HostStep,
    /// The iterator's name, as the kernels' code names it.
    pub iterator: String,
    /// The first value, in the parameters and the enclosing loops'
    /// iterators.
    pub init: Expr,
    /// Iterate while this holds (same names, and the iterator).
    pub cond: Expr,
    /// The increment (a positive constant).
    pub inc: Expr,
    /// The kernels run in each iteration: indices `first..end`.
    pub first: usize,
    pub end: usize,
}

/// One launch of an execution: the kernel's index in
/// [`CudaProgram::kernels`] and the value of each [`KernelArg::Step`]
/// argument, in argument order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub kernel: usize,
    pub steps: Vec<i64>,
}

/// One `__global__` function and how to launch it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// The function's name in [`CudaProgram::source`].
    pub name: String,
    /// Blocks along x, y, z as expressions in the parameters.
    pub grid: [Expr; 3],
    /// Threads along x, y, z.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory to launch with (static shared arrays
    /// are declared in the kernel and not counted here).
    pub dynamic_shared: usize,
    /// Bytes of shared memory the kernel declares statically.
    pub static_shared: usize,
    /// Launched as a programmatic dependent of the kernel before it (sm_90
    /// and later): its blocks may be scheduled while that kernel's last
    /// ones still run, and wait in their code (`griddepcontrol.wait`) for
    /// it to finish and its writes to be visible, so the launch and the
    /// blocks' start overlap the previous kernel's tail. Launched plainly,
    /// the wait returns at once and stream order alone makes it correct.
    /// Every kernel polyfuse emits now waits first, so this holds for all
    /// of them (the previous kernel may be another program's).
    pub dependent: bool,
    /// The tensors whose global memory the kernel's code reads or writes,
    /// in argument order, as the CUDA printer emitted their accesses
    /// (`codegen::expr::GlobalAccesses`). A temp in no kernel's list never
    /// reaches memory (a rolling update's `M_prev`, the row state the
    /// attention template keeps in registers, an accumulator its epilogue
    /// consumes): it needs no allocation, and the C ABI's workspace leaves
    /// it out (its pointer argument is null).
    pub globals: Vec<String>,
    /// The tensor maps of the kernel's TMA copies (Hopper's bulk tensor
    /// copies, `gpu::contraction::Copies::Tma`), passed by value after
    /// [`CudaProgram::args`], in this order, as `const __grid_constant__
    /// PfTensorMap` parameters. The launcher encodes each one from its
    /// tensor's device address (`cuTensorMapEncodeTiled`); empty for a
    /// kernel without TMA copies, whose parameters are the arguments alone.
    #[serde(default)]
    pub tensor_maps: Vec<TensorMap>,
}

/// One tensor map: how the copy engine sees a tensor's buffer (a row-major
/// array of 2-byte elements), and the box one copy moves into shared
/// memory, in the swizzle the `wgmma` descriptors read. Everything but the
/// buffer's address is known when the kernel is compiled; the launcher
/// encodes the map at each launch (the C ABI: `pf_result_launch`, or
/// `pf_result_kernel_tensor_map` for a caller that launches itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMap {
    /// The tensor (a [`KernelArg::Tensor`]'s name) whose buffer it maps.
    pub tensor: String,
    /// Its element type: F16 or BF16.
    pub dtype: DType,
    /// Extents in elements, the contiguous dimension first (the reverse of
    /// the tensor's shape).
    pub dims: Vec<u64>,
    /// Bytes from one element to the next along `dims[1..]`
    /// (`dims.len() - 1` values, each a multiple of 16).
    pub strides: Vec<u64>,
    /// Elements one copy moves along each of `dims` (each at most 256; the
    /// first times the element size equals `swizzle`).
    pub boxes: Vec<u32>,
    /// Bytes of a line of the shared-memory swizzle: 128 or 64.
    pub swizzle: u32,
}

/// Everything a launcher needs: the source, the kernels in launch order
/// (each one after the previous finished, on one stream) and their
/// arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaProgram {
    /// Complete CUDA C++ source (NVRTC or nvcc), kernels `extern "C"`.
    pub source: String,
    pub kernels: Vec<Kernel>,
    pub args: Vec<KernelArg>,
    /// The host loops around the kernels' launches, outer loops before
    /// the loops inside them; empty where every kernel runs once.
    pub host_loops: Vec<HostLoop>,
}

impl CudaProgram {
    /// Every launch of one execution, in order, for the given parameter
    /// values (every parameter, by name): the kernels in index order, those
    /// of a host loop once per iteration with the iterators' values.
    pub fn launches(&self, params: &HashMap<String, i64>) -> Result<Vec<Launch>> {
        let mut env = params.clone();
        let mut out = Vec::new();
        self.unroll(0, self.kernels.len(), &self.host_loops, &mut env, &mut out)?;
        Ok(out)
    }

    /// The launches of kernels `lo..hi`, where `loops` (in pre-order)
    /// holds the loops not entered yet.
    fn unroll(
        &self,
        lo: usize,
        hi: usize,
        loops: &[HostLoop],
        env: &mut HashMap<String, i64>,
        out: &mut Vec<Launch>,
    ) -> Result<()> {
        let mut k = lo;
        while k < hi {
            let Some(i) = loops
                .iter()
                .position(|l| l.first == k && l.end <= hi && l.first < l.end)
            else {
                let steps = self
                    .args
                    .iter()
                    .filter_map(|a| match a {
                        KernelArg::Step { name } => Some(env.get(name).copied().unwrap_or(0)),
                        _ => None,
                    })
                    .collect();
                out.push(Launch { kernel: k, steps });
                k += 1;
                continue;
            };
            let l = &loops[i];
            let inc = eval(&l.inc, env)?;
            if inc <= 0 {
                return Err(Error::Internal(format!(
                    "host loop {} has increment {inc}",
                    l.iterator
                )));
            }
            let mut v = eval(&l.init, env)?;
            loop {
                env.insert(l.iterator.clone(), v);
                if eval(&l.cond, env)? == 0 {
                    break;
                }
                self.unroll(l.first, l.end, &loops[i + 1..], env, out)?;
                v += inc;
            }
            env.remove(&l.iterator);
            k = l.end;
        }
        Ok(())
    }

    /// Whether some kernel runs inside a host loop.
    pub fn host_stepped(&self) -> bool {
        !self.host_loops.is_empty()
    }
}

/// The arguments every kernel of `program` takes (see the module comment):
/// a pointer per tensor of `tensors`, then the parameters without a value.
pub fn kernel_args(program: &Program, tensors: &[ModelTensor]) -> Vec<KernelArg> {
    let mut args: Vec<KernelArg> = tensors
        .iter()
        .map(|t| KernelArg::Tensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.iter().map(|e| e.to_string()).collect(),
        })
        .collect();
    args.extend(
        program
            .params
            .iter()
            .filter(|p| p.value.is_none())
            .map(|p| KernelArg::Param {
                name: p.name.clone(),
            }),
    );
    args
}

impl Kernel {
    /// The grid for the given parameter values (every parameter, by name).
    /// A dimension that evaluates to zero or less launches no block: the
    /// caller skips the kernel.
    pub fn grid_dims(&self, params: &HashMap<String, i64>) -> Result<[u32; 3]> {
        let mut out = [1u32; 3];
        for (d, e) in self.grid.iter().enumerate() {
            let v = eval(e, params)?;
            out[d] = u32::try_from(v.clamp(0, u32::MAX as i64)).unwrap_or(u32::MAX);
        }
        Ok(out)
    }
}

/// Evaluates an isl AST expression in the parameters.
pub fn eval(e: &Expr, params: &HashMap<String, i64>) -> Result<i64> {
    use crate::isl::ast::Op;
    Ok(match e {
        Expr::Int(v) => *v,
        Expr::Id(s) => *params
            .get(s)
            .ok_or_else(|| Error::Internal(format!("launch bound uses {s}, which has no value")))?,
        Expr::Op(op, a) => {
            let v: Vec<i64> = a.iter().map(|x| eval(x, params)).collect::<Result<_>>()?;
            let arg = |i: usize| v.get(i).copied().unwrap_or(0);
            match op {
                Op::Add => v.iter().sum(),
                Op::Sub => arg(0) - arg(1),
                Op::Mul => v.iter().product(),
                Op::Neg => -arg(0),
                Op::Max => v.iter().copied().max().unwrap_or(0),
                Op::Min => v.iter().copied().min().unwrap_or(0),
                Op::Div | Op::PosDiv => arg(0).checked_div(arg(1)).unwrap_or(0),
                Op::FloorDiv => arg(0).checked_div_euclid(arg(1)).unwrap_or(0),
                Op::PosRem | Op::ZeroRem => arg(0).checked_rem(arg(1)).unwrap_or(0),
                Op::Select => {
                    if arg(0) != 0 {
                        arg(1)
                    } else {
                        arg(2)
                    }
                }
                Op::And => (v.iter().all(|x| *x != 0)) as i64,
                Op::Or => (v.iter().any(|x| *x != 0)) as i64,
                Op::Eq => (arg(0) == arg(1)) as i64,
                Op::Le => (arg(0) <= arg(1)) as i64,
                Op::Lt => (arg(0) < arg(1)) as i64,
                Op::Ge => (arg(0) >= arg(1)) as i64,
                Op::Gt => (arg(0) > arg(1)) as i64,
                Op::Call => {
                    return Err(Error::Internal(
                        "a call in a launch bound cannot be evaluated".into(),
                    ))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isl::ast::Op;
    use crate::schedule::host::HostStep;

    fn kernel(name: &str) -> Kernel {
        Kernel {
            name: name.into(),
            grid: [Expr::Int(1), Expr::Int(1), Expr::Int(1)],
            block: [1, 1, 1],
            dynamic_shared: 0,
            static_shared: 0,
            dependent: true,
            globals: Vec::new(),
            tensor_maps: Vec::new(),
        }
    }

    /// `for (it = init; it <= hi; it += 1)` over kernels `first..end`.
    fn host_loop(it: &str, init: Expr, hi: Expr, first: usize, end: usize) -> HostLoop {
        HostLoop {
            step: HostStep::Steps,
            iterator: it.into(),
            init,
            cond: Expr::Op(Op::Le, vec![Expr::Id(it.into()), hi]),
            inc: Expr::Int(1),
            first,
            end,
        }
    }

    #[test]
    fn host_loops_unroll_into_launches_in_order() {
        // kernel 0; for c0 in 1..=T: { kernel 1; for c1 in c0..=2: kernel 2 }; kernel 3
        let program = CudaProgram {
            source: String::new(),
            kernels: ["k0", "k1", "k2", "k3"].map(kernel).to_vec(),
            args: vec![
                KernelArg::Step { name: "c0".into() },
                KernelArg::Step { name: "c1".into() },
            ],
            host_loops: vec![
                host_loop("c0", Expr::Int(1), Expr::Id("T".into()), 1, 3),
                host_loop("c1", Expr::Id("c0".into()), Expr::Int(2), 2, 3),
            ],
        };
        let params = HashMap::from([("T".to_string(), 3)]);
        let got: Vec<(usize, Vec<i64>)> = program
            .launches(&params)
            .unwrap()
            .into_iter()
            .map(|l| (l.kernel, l.steps))
            .collect();
        let want = vec![
            (0, vec![0, 0]),
            (1, vec![1, 0]),
            (2, vec![1, 1]),
            (2, vec![1, 2]),
            (1, vec![2, 0]),
            (2, vec![2, 2]),
            (1, vec![3, 0]),
            (3, vec![0, 0]),
        ];
        assert_eq!(got, want);
        assert!(program.host_stepped());
    }
}
