//! The CUDA printer: one `__global__` function per kernel mark of the
//! mapped AST (see `gpu::mapping`).
//!
//! * A loop under a `block_A` (`thread_A`) mark is distributed cyclically
//!   over `blockIdx.A` (`threadIdx.A`), which is right for every grid and
//!   block size: a block loop as `for (c = init + id * inc; cond; c +=
//!   count * inc)`, a thread loop so that thread `id` runs the values
//!   `c ≡ id (mod count)` whatever `init` (see `Ctx::distributed_head`).
//!   A mapped member that isl left without a loop (a single iteration) is
//!   run by index 0 only.
//! * Code outside the thread-mapped loops runs on every thread of a block in
//!   lock step; its statements are executed by thread 0 alone, and a
//!   `__syncthreads()` separates consecutive pieces of block-level code and
//!   ends each iteration of a block-level loop, so what one thread wrote is
//!   visible to the others before they read it (the dependences between
//!   those pieces are exactly the ones the schedule orders sequentially).
//!   The barriers sit only in block-uniform control flow: every condition
//!   and bound there depends on block indices and parameters alone.
//! * f16 and bf16 are stored as 16-bit integers and computed in f32 through
//!   `cuda_fp16.h` and `cuda_bf16.h`; the 8-bit floats as bytes through
//!   `cuda_fp8.h` (see [`storage_type`] and `dtype_helpers`).
//! * Each kernel is printed twice by the same [`Ctx`], through a
//!   `target::KernelTarget`: as CUDA (`gpu::Gpu`) and as its CPU emulation
//!   in C (`emulation::Emulation`, see [`program`]).
//!
//! This file holds the program's prelude, the kernels' heads and launch
//! records, and `Ctx::node`, the walk over the mapped AST; what a node
//! prints lives beside it, one file a kind: `loops` (distributed,
//! sequential and folded loops), `marks` (the mapping's marks), `statements`
//! (an instance with its accesses and guards), `reduce` (reductions across
//! threads and lanes), `registers` (register tiles and tensor-core
//! regions), `private` (private arrays), `copies` (shared tiles), and the
//! smaller pieces they use (`lanes`, `slots`, `full_tile`, `rowcopy`, ...).

use std::collections::HashSet;
use std::fmt::Write;

mod box_reads;
mod chains;
mod clamp;
mod copies;
mod emulation;
mod full_steps;
mod full_tile;
mod gpu;
mod lanes;
mod loops;
mod marks;
mod private;
mod reduce;
mod registers;
mod rowcopy;
mod slot_box;
mod slots;
mod statements;
mod target;
mod unswitch;

use super::expr::{param_name, tensor_name, Mode, Printer};
use crate::error::{Error, Result};
use crate::frontend::ast::{Affine, DType, Program};
use crate::gpu::attention::Attention;
use crate::gpu::contraction::Contraction;
use crate::gpu::lanes::LaneLoop;
use crate::gpu::mapping::{
    parse_mapping_mark, AttentionPlan, CombineKernel, KernelBody, KernelPlan, Registers, ThreadPlan,
};
use crate::gpu::private::PrivateRegion;
use crate::gpu::promote::{Promotion, Scope};
use crate::gpu::registers::RegisterTile;
use crate::gpu::{CudaProgram, HostLoop, Kernel, KernelArg};
use crate::isl::ast::{c_expr, Expr, Node, Op};
use crate::model::Scop;
use crate::schedule::host::HostStep;
use emulation::Emulation;
use full_tile::FullTile;
use gpu::Gpu;
use slots::{upper_bound, SlotTest};
use target::{KernelTarget, WarpReduce};

/// Storage type of a tensor element in CUDA.
pub fn storage_type(t: DType) -> &'static str {
    match t {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I32 => "int",
        DType::I64 => "long long",
        // One byte: bool holds 0 or 1 (the layout of C++'s `bool`, read
        // without assuming it); the 8-bit floats are their bit patterns,
        // converted by `cuda_fp8.h` (`pf_e4m3_2f`, `pf_f2e4m3`, ...).
        DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => "unsigned char",
    }
}

/// Device helpers of the dtypes added after the first five (printed for
/// programs that use them): the 8-bit floats through `__nv_fp8_e4m3` and
/// `__nv_fp8_e5m2` (whose conversion from float is
/// `__nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..)`, `cvt.rn.satfinite` on
/// sm_89 and later; `codegen::c::DTYPE_HELPERS` is the same on the CPU),
/// the float to int truncation of `u8(x)`, and i64's limits.
fn dtype_helpers(program: &Program, scop: &Scop) -> String {
    let fp8 = |t: DType| matches!(t, DType::F8E4M3 | DType::F8E5M2);
    let fp8 = scop.tensors.iter().any(|t| fp8(t.dtype)) || program.uses_dtype(&fp8);
    let mut s = String::new();
    if fp8 {
        s.push_str("#include <cuda_fp8.h>\n");
    }
    s.push_str(
        r#"#ifndef LLONG_MAX
#define LLONG_MAX 9223372036854775807LL
#endif
#ifndef LLONG_MIN
#define LLONG_MIN (-9223372036854775807LL - 1)
#endif
static __device__ __forceinline__ int pf_f2i(double x) { return x != x ? 0 : x >= 2147483647.0 ? INT_MAX : x <= -2147483648.0 ? INT_MIN : (int)x; }
"#,
    );
    if fp8 {
        s.push_str(
            r#"static __device__ __forceinline__ float pf_e4m3_2f(unsigned char b) { __nv_fp8_e4m3 v; v.__x = b; return (float)v; }
static __device__ __forceinline__ unsigned char pf_f2e4m3(float f) { return __nv_fp8_e4m3(f).__x; }
static __device__ __forceinline__ float pf_e5m2_2f(unsigned char b) { __nv_fp8_e5m2 v; v.__x = b; return (float)v; }
static __device__ __forceinline__ unsigned char pf_f2e5m2(float f) { return __nv_fp8_e5m2(f).__x; }
"#,
        );
    }
    s
}

fn prelude(program: &Program, scop: &Scop, index: &str) -> String {
    let mut s = String::from("/* generated by polyfuse */\n");
    let uses = |d: DType| scop.tensors.iter().any(|t| t.dtype == d);
    if uses(DType::F16) {
        s.push_str("#include <cuda_fp16.h>\n");
    }
    if uses(DType::BF16) {
        s.push_str("#include <cuda_bf16.h>\n");
    }
    // Index arithmetic: 32-bit where every tensor has fewer than 2^31
    // elements (64-bit integer multiplies take several instructions).
    let _ = writeln!(s, "typedef {index} pf_i;");
    s.push_str(
        r#"#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef INT_MIN
#define INT_MIN (-2147483647 - 1)
#endif
#define pf_min(a, b) ((a) < (b) ? (a) : (b))
#define pf_max(a, b) ((a) > (b) ? (a) : (b))
static __device__ __forceinline__ pf_i pf_floord(pf_i a, pf_i b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static __device__ __forceinline__ int pf_iabs(int a) { return a < 0 ? -a : a; }
// Combine one value per lane across the 32 lanes of a warp (all lanes
// take part and receive the result).
template <typename T> static __device__ __forceinline__ T pf_warp_sum(T v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
template <typename T> static __device__ __forceinline__ T pf_warp_prod(T v) { for (int o = 16; o > 0; o >>= 1) v *= __shfl_xor_sync(0xffffffffu, v, o); return v; }
template <typename T> static __device__ __forceinline__ T pf_warp_max(T v) { for (int o = 16; o > 0; o >>= 1) { T w = __shfl_xor_sync(0xffffffffu, v, o); v = pf_max(v, w); } return v; }
template <typename T> static __device__ __forceinline__ T pf_warp_min(T v) { for (int o = 16; o > 0; o >>= 1) { T w = __shfl_xor_sync(0xffffffffu, v, o); v = pf_min(v, w); } return v; }
"#,
    );
    if uses(DType::F16) {
        s.push_str(
            "static __device__ __forceinline__ float pf_h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }\n\
             static __device__ __forceinline__ unsigned short pf_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }\n",
        );
    }
    if uses(DType::BF16) {
        s.push_str(
            "static __device__ __forceinline__ float pf_b2f(unsigned short b) { return __bfloat162float(__ushort_as_bfloat16(b)); }\n\
             static __device__ __forceinline__ unsigned short pf_f2b(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }\n",
        );
    }
    if program.uses_extra_dtypes() {
        s.push_str(&dtype_helpers(program, scop));
    }
    s
}

/// `int` when every parameter has a value and every tensor has fewer than
/// 2^31 elements (so every index and offset fits), else `long`.
fn index_type(program: &Program, scop: &Scop) -> &'static str {
    let fits = scop
        .tensors
        .iter()
        .all(|t| matches!(t.elements(program), Some(n) if n < (1i64 << 31) - 1024));
    if fits {
        "int"
    } else {
        "long"
    }
}

/// Every kernel's first statements, so that any kernel may be launched as a
/// programmatic dependent of the one before it on its stream
/// ([`Kernel::dependent`]): wait until that kernel has finished and its
/// writes are visible (at once where this one was launched plainly, or
/// after something other than a kernel), then let the kernel after this
/// one be launched. The wait comes before any access to global memory, so
/// the overlap is correct whatever the kernels read and write; what
/// overlaps is the launch and the blocks' start, not their work. Both
/// are held only until every block of the grid has executed them, when
/// all its blocks are resident, so a dependent's blocks never take the
/// place of this kernel's. On devices before sm_90 nothing (kernels are
/// launched plainly there).
const GRID_DEPENDENCY_PROLOGUE: &str = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\nasm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\nasm volatile(\"griddepcontrol.launch_dependents;\");\n#endif\n";

/// A kernel's opening line, with `qualifiers` (launch bounds, cluster)
/// before its name, the grid dependency's prologue
/// ([`GRID_DEPENDENCY_PROLOGUE`]), and the parameters that have values as
/// constants.
fn kernel_head(
    source: &mut String,
    qualifiers: &str,
    name: &str,
    signature: &[String],
    program: &Program,
) {
    let _ = writeln!(
        source,
        "\nextern \"C\" __global__ void {qualifiers} {name}({}) {{",
        signature.join(", ")
    );
    source.push_str(GRID_DEPENDENCY_PROLOGUE);
    for p in &program.params {
        if let Some(v) = p.value {
            let _ = writeln!(source, "  const pf_i {} = {v};", param_name(&p.name));
        }
    }
}

/// The kernels of `ast` (the AST of the mapped schedule) as CUDA, and the
/// same kernels as C for the CPU (`pf_kernel`).
///
/// The C emulation runs every mapped loop cyclically exactly as the GPU
/// does, over [`EMULATED_BLOCKS`] blocks and the kernel's block size, with
/// the blocks and the threads taken in *decreasing* order: a mapping that
/// let one thread or block depend on another one with a higher index would
/// compute a different result than the reference, and the check fails.
/// Barriers become no-ops, since each thread's part between two barriers
/// runs to completion before the next thread's.
pub fn program(
    program: &Program,
    scop: &Scop,
    ast: &Node,
    plans: &[KernelPlan],
) -> Result<(CudaProgram, String)> {
    let mut bodies = Vec::new();
    let mut host_loops = Vec::new();
    collect_kernels(ast, &mut Vec::new(), &mut bodies, &mut host_loops)?;
    let params: Vec<String> = program.params.iter().map(|p| p.name.clone()).collect();
    let printer = Printer {
        tensors: &scop.tensors,
        params: &params,
        mode: Mode::Native,
        overrides: Default::default(),
        privates: Default::default(),
        fixed_selects: Default::default(),
        run_reads: Default::default(),
        fast_exp: false,
        scaled_reads: Default::default(),
        race: Default::default(),
        globals: Default::default(),
    };
    let args = kernel_args(program, scop, &host_loops);
    let mut source = prelude(program, scop, index_type(program, scop));
    source.push_str(&tensor_core_helpers(plans));
    let mut out = Printed {
        program,
        scop,
        printer: &printer,
        params: &params,
        signature: signature(&args),
        args: &args,
        source,
        emulation: emulation_head(program, scop, plans, &printer),
        kernels: Vec::new(),
    };
    for (index, (mark, body)) in bodies.iter().enumerate() {
        host_loop_heads(&host_loops, index, &params, &mut out.emulation);
        let plan = plans
            .iter()
            .find(|p| &p.mark == mark)
            .ok_or_else(|| Error::Internal(format!("no mapping recorded for {mark}")))?;
        out.kernel_head(plan);
        // The iterators of the host loops around this kernel, under the
        // names its code uses: bound for the whole kernel body (a register
        // region whose prefix names a host step's iterator is printed with
        // its registers, see `Ctx::names_unbound`).
        let host_iterators: Vec<String> = host_loops
            .iter()
            .filter(|l| (l.first..l.end).contains(&index))
            .map(|l| l.iterator.clone())
            .collect();
        for it in &host_iterators {
            let _ = writeln!(out.source, "  const pf_i {it} = {};", step_arg(it));
        }
        match &plan.body {
            KernelBody::Attention(a) => {
                out.attention(plan, a)?;
                if let Some(combine) = &a.combine {
                    out.combine(&a.attention, combine)?;
                }
            }
            KernelBody::Threads(t) => out.threads(plan, t, body, &host_iterators)?,
        }
    }
    let Printed {
        source,
        mut emulation,
        kernels,
        ..
    } = out;
    host_loop_tails(&host_loops, bodies.len(), &mut emulation);
    emulation.push_str("}\n");
    Ok((
        CudaProgram {
            source,
            kernels,
            args,
            host_loops,
        },
        emulation,
    ))
}

/// The kernels' arguments: the tensors and parameters in the order every
/// launcher uses, then the host loops' iterators, once each (loops one
/// after the other may share their iterator's name).
fn kernel_args(program: &Program, scop: &Scop, host_loops: &[HostLoop]) -> Vec<KernelArg> {
    let mut args = crate::gpu::kernel_args(program, &scop.tensors);
    for l in host_loops {
        let step = KernelArg::Step {
            name: l.iterator.clone(),
        };
        if !args.contains(&step) {
            args.push(step);
        }
    }
    args
}

/// Every kernel's parameter list, from its arguments.
fn signature(args: &[KernelArg]) -> Vec<String> {
    args.iter()
        .map(|a| match a {
            KernelArg::Tensor { name, dtype, .. } => format!(
                "{} *__restrict__ {}",
                storage_type(*dtype),
                tensor_name(name)
            ),
            KernelArg::Param { name } => format!("long {}", param_name(name)),
            KernelArg::Step { name } => format!("long {}", step_arg(name)),
        })
        .collect()
}

/// The CUDA helpers the plans' tensor-core kernels use (fragments,
/// `wgmma` of each shape, clusters, attention), or nothing.
fn tensor_core_helpers(plans: &[KernelPlan]) -> String {
    let attention = plans.iter().find_map(KernelPlan::attention);
    let contractions = || plans.iter().filter_map(KernelPlan::contraction);
    let mut source = String::new();
    if attention.is_none() && contractions().next().is_none() {
        return source;
    }
    source.push_str(super::mma::GPU_HELPERS);
    source.push_str(super::mma::WGMMA_HELPERS);
    if plans.iter().any(|p| !p.tensor_maps().is_empty()) {
        source.push_str(&super::mma::tma_gpu_helpers());
    }
    if contractions().any(|c| c.split > 1) {
        source.push_str(super::mma::CLUSTER_HELPERS);
    }
    if let Some(a) = attention {
        source.push_str(&super::flash::gpu_helpers(a));
    }
    let mut shapes: Vec<(&str, i64, [bool; 2])> = contractions()
        .filter(|c| c.wgmma)
        .map(|c| {
            let ty = if c.dtype == DType::BF16 {
                "bf16"
            } else {
                "f16"
            };
            (ty, c.tile[1], [!c.a.k_contiguous, !c.b.k_contiguous])
        })
        .collect();
    shapes.sort();
    shapes.dedup();
    for (ty, n, trans) in shapes {
        source.push_str(&super::mma::wgmma_helper(ty, n, trans));
    }
    source
}

/// The emulation's start, up to its first kernel: the helpers its plans
/// need, the race detector's (set up for every tensor's elements), and
/// the entry point's head.
fn emulation_head(
    program: &Program,
    scop: &Scop,
    plans: &[KernelPlan],
    printer: &Printer<'_>,
) -> String {
    let attention = plans.iter().any(|p| p.attention().is_some());
    let tensor_cores = attention || plans.iter().any(|p| p.contraction().is_some());
    let mut emulation = String::new();
    let _ = writeln!(
        emulation,
        "/* {}: the GPU mapping emulated on the CPU by polyfuse */",
        program.name
    );
    if tensor_cores {
        emulation.push_str(super::mma::EMULATION_HELPERS);
    }
    if plans.iter().any(|p| !p.tensor_maps().is_empty()) {
        emulation.push_str(super::mma::TMA_EMULATION_HELPERS);
    }
    if attention {
        emulation.push_str(super::flash::EMULATION_HELPERS);
    }
    let names: Vec<String> = scop.tensors.iter().map(|t| t.name.clone()).collect();
    let shared = plans
        .iter()
        .filter_map(|p| p.threads()?.scope.as_ref())
        .map(|s| s.arrays.len())
        .max()
        .unwrap_or(0);
    emulation.push_str(&super::race::helpers(&names, shared, EMULATED_BLOCKS));
    super::c::header(
        program,
        scop,
        None,
        "pf_kernel",
        Mode::Native,
        &mut emulation,
    );
    emulation.push_str("  typedef long pf_i;\n");
    // The element count of each tensor, for the race detector's shadows.
    let counts: Vec<String> = scop
        .tensors
        .iter()
        .map(|t| {
            let mut c = "1L".to_string();
            for e in &t.shape {
                c = format!("{c} * {}", printer.affine(e, &Default::default()));
            }
            c
        })
        .collect();
    let _ = writeln!(
        emulation,
        "  {{ const long pf_race_counts[] = {{ {} }}; pf_race_setup(pf_race_counts); }}",
        if counts.is_empty() {
            "0".to_string()
        } else {
            counts.join(", ")
        }
    );
    emulation
}

/// The program being printed: the CUDA source, the emulation and the
/// launch records so far, and what every kernel shares.
struct Printed<'a> {
    program: &'a Program,
    scop: &'a Scop,
    printer: &'a Printer<'a>,
    params: &'a [String],
    args: &'a [KernelArg],
    signature: Vec<String>,
    source: String,
    emulation: String,
    kernels: Vec<Kernel>,
}

impl Printed<'_> {
    /// The opening of kernel `plan` in the source: its cluster's macro for
    /// a split contraction (its blocks of one tile form a cluster along z
    /// on sm_90 and later; before, the kernel runs without clusters), and
    /// its launch bounds.
    fn kernel_head(&mut self, plan: &KernelPlan) {
        let mark = &plan.mark;
        let threads: u32 = plan.block.iter().product();
        let bounds = match plan.min_blocks {
            Some(m) => format!("{threads}, {m}"),
            None => threads.to_string(),
        };
        let cluster = match plan.contraction() {
            Some(c) if c.split > 1 => {
                let _ = writeln!(
                    self.source,
                    "\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n#define PF_CLUSTER_{mark} __cluster_dims__(1, 1, {})\n#else\n#define PF_CLUSTER_{mark}\n#endif",
                    c.split
                );
                format!("PF_CLUSTER_{mark} ")
            }
            _ => String::new(),
        };
        // The copy engine's tensor maps follow the arguments (see
        // `gpu::Kernel::tensor_maps`).
        let mut signature = self.signature.clone();
        let names: fn(usize) -> String = if plan.attention().is_some() {
            super::flash::map_param
        } else {
            |which| super::mma::map_param(which).to_string()
        };
        for which in 0..plan.tensor_maps().len() {
            signature.push(format!(
                "const __grid_constant__ PfTensorMap {}",
                names(which)
            ));
        }
        kernel_head(
            &mut self.source,
            &format!("{cluster}__launch_bounds__({bounds})"),
            mark,
            &signature,
            self.program,
        );
    }

    /// The launch record of kernel `name` (dynamic and static shared
    /// bytes in `shared`), with the tensors its CUDA text from `start` on
    /// accessed (noted by the printer since its last take).
    fn record(
        &mut self,
        name: &str,
        grid: &[Expr; 3],
        block: [u32; 3],
        [dynamic_shared, static_shared]: [usize; 2],
        start: usize,
        tensor_maps: Vec<crate::gpu::TensorMap>,
    ) -> Result<()> {
        let globals = touched(
            self.args,
            self.printer.globals.take(),
            name,
            &self.source[start..],
        )?;
        self.kernels.push(Kernel {
            name: name.to_string(),
            grid: grid.clone(),
            block,
            dynamic_shared,
            static_shared,
            dependent: true,
            globals,
            tensor_maps,
        });
        Ok(())
    }

    /// An attention kernel, printed whole by `codegen::flash`.
    fn attention(&mut self, plan: &KernelPlan, a: &AttentionPlan) -> Result<()> {
        let (program, scop, globals) = (self.program, self.scop, &self.printer.globals);
        let mark = &plan.mark;
        globals.take();
        let start = self.source.len();
        self.source.push_str(&super::flash::body(
            a,
            plan.reversed[0],
            program,
            scop,
            false,
            globals,
        ));
        let shared = [plan.dynamic_shared, plan.static_shared];
        self.record(
            mark,
            &plan.grid,
            plan.block,
            shared,
            start,
            plan.tensor_maps(),
        )?;
        self.source.push_str("}\n");
        let _ = writeln!(self.emulation, "  {{ /* {mark} */");
        let emulated = super::flash::body(
            a,
            plan.reversed[0],
            program,
            scop,
            true,
            &self.printer.globals,
        );
        self.emulation.push_str(&emulated);
        let _ = writeln!(self.emulation, "  }}");
        Ok(())
    }

    /// A split attention's second kernel (`combine`, planned by the gpu
    /// stage): the combination over the slices and the epilogue.
    fn combine(&mut self, a: &Attention, combine: &CombineKernel) -> Result<()> {
        let (program, scop) = (self.program, self.scop);
        let name = &combine.name;
        let threads: u32 = combine.block.iter().product();
        kernel_head(
            &mut self.source,
            &format!("__launch_bounds__({threads})"),
            name,
            &self.signature,
            program,
        );
        self.printer.globals.take();
        let start = self.source.len();
        let text = super::flash::combine_body(a, program, scop, false, &self.printer.globals);
        self.source.push_str(&text);
        self.record(
            name,
            &combine.grid,
            combine.block,
            [0, 0],
            start,
            Vec::new(),
        )?;
        self.source.push_str("}\n");
        let _ = writeln!(self.emulation, "  {{ /* {name} */");
        let emulated = super::flash::combine_body(a, program, scop, true, &self.printer.globals);
        self.emulation.push_str(&emulated);
        let _ = writeln!(self.emulation, "  }}");
        Ok(())
    }

    /// A kernel mapped to blocks and threads (`body`, its tree's AST),
    /// printed node by node by [`Ctx`], in CUDA and in the emulation.
    fn threads(
        &mut self,
        plan: &KernelPlan,
        thread_plan: &ThreadPlan,
        body: &Node,
        host_iterators: &[String],
    ) -> Result<()> {
        let (program, scop, mark) = (self.program, self.scop, plan.mark.as_str());
        let repeated = repeated_marks(body, "private_");
        // isl may print the register region in several pieces (one where
        // the reduction runs, one for a later reader of the tile): only a
        // region that runs the initialisation may start from the identity;
        // with pieces, every piece loads the tile and the initialisation
        // runs where isl put it (seed-140: the reader's piece started from
        // zeros and stored them over the reduction's result).
        //
        // A contraction's region is printed whole (every reduction loop,
        // the epilogue) in the piece that runs its update, and nothing in
        // the others (see the "registers" mark): it starts from the
        // identity wherever the mapping hoisted the initialisation. isl
        // splits the block's loops by statement where a further sum
        // follows the update (`Contraction::terms`, `--tile 64,64,64` at
        // B = 37, 4H = 52): printed in both pieces, the region ran the sums
        // twice.
        let contraction = plan.contraction();
        let regs_of_kernel = thread_plan.registers.as_ref().map(|r| {
            let mut r = r.tile().clone();
            if !repeated_marks(body, "registers").is_empty() && contraction.is_none() {
                r.init = None;
            }
            // A statement runs at a slot beyond its loop's points only where
            // that loop holds all its instances at the values of the loops
            // around it (`gpu::registers::closed`): where isl printed the
            // statement once. (The copies `full_steps` and the full tile make
            // are each run for different values of the loops around them.)
            let repeated = repeated_statements(body);
            r.slot_closed.retain(|s| !repeated.contains(s));
            r
        });
        // A register tile's step loops: full tiles with a constant trip
        // count, the last one clipped (`full_steps`).
        let split_body;
        let body = if matches!(thread_plan.registers, Some(Registers::Tile(_))) {
            let regs = regs_of_kernel.as_ref();
            let nt = regs.map_or(0, |r| r.thread_dims);
            let counts = regs.map(|r| r.counts(plan.block)).unwrap_or_default();
            // The last slot along each thread axis, as `full_tile_test`
            // counts them.
            let last: full_steps::LastSlots = std::array::from_fn(|a| {
                (a < nt).then(|| counts[nt - 1 - a] * i64::from(plan.block[a]) - 1)
            });
            split_body = full_steps::split(body, &last);
            &split_body
        } else {
            body
        };
        let scope = thread_plan.scope.as_ref().filter(|s| !s.arrays.is_empty());
        let arrays = scope.map(|s| s.arrays.as_slice()).unwrap_or(&[]);
        self.source
            .push_str(&Gpu.shared_arrays(mark, arrays, contraction));
        let ctx = Ctx {
            program,
            scop,
            printer: self.printer,
            params: self.params,
            plan,
            threads: thread_plan,
            t: &Gpu,
            in_scope: false,
            regs: regs_of_kernel.as_ref(),
            in_regs: false,
            full_tile: None,
            slot_tests: &[],
            slot_loops: &[],
            nosync: false,
            repeated_private: &repeated,
            bound: host_iterators,
            step_loop: None,
            staged: false,
            in_lanes: false,
            row_caches: &[],
            store_in_fours: false,
            lane_loop: None,
        };
        self.printer.globals.take();
        let start = self.source.len();
        ctx.node(body, 1, &[], false, &mut self.source);
        let shared = [plan.dynamic_shared, plan.static_shared];
        self.record(
            mark,
            &plan.grid,
            plan.block,
            shared,
            start,
            plan.tensor_maps(),
        )?;
        self.source.push_str("}\n");
        let _ = writeln!(self.emulation, "  {{ /* {mark} */");
        // The race detector watches the kernels printed here statement by
        // statement; templates print their own accesses (`codegen::race`).
        let race = contraction.is_none() && thread_plan.lanes.is_none();
        if race {
            self.watch_races(mark, plan.block, arrays);
        }
        let emu = Ctx {
            t: &Emulation,
            ..ctx
        };
        self.emulation
            .push_str(&emu.t.shared_arrays(mark, arrays, contraction));
        self.printer.race.set(race);
        emu.node(body, 2, &[], false, &mut self.emulation);
        self.printer.race.set(false);
        let _ = writeln!(self.emulation, "  }}");
        Ok(())
    }

    /// The race detector's start of kernel `mark` in the emulation: its
    /// block size, and its shared arrays as memory the detector watches.
    fn watch_races(&mut self, mark: &str, block: [u32; 3], arrays: &[Promotion]) {
        let [x, y, z] = block;
        let _ = writeln!(
            self.emulation,
            "    pf_race_begin(\"{mark}\", {x}, {y}, {z});"
        );
        for (k, a) in arrays.iter().enumerate() {
            let _ = writeln!(
                self.emulation,
                "    pf_race_shared({}, \"{} (shared copy of {})\", {});",
                self.scop.tensors.len() + k,
                a.buffer,
                a.tensor,
                a.layout.elements()
            );
        }
    }
}

/// The tensor arguments among `noted` (the tensors a kernel's printed code
/// accessed in global memory), in argument order, verified against the
/// kernel's printed `body`: a tensor it names that was not noted would get
/// no memory from the C ABI's workspace or the runtime (one byte), and the
/// kernel would write past it without a word; that is an internal error
/// here instead. (A check of what was printed, not a decision: the list is
/// the printer's record.)
fn touched(
    args: &[KernelArg],
    noted: std::collections::BTreeSet<String>,
    kernel: &str,
    body: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for a in args {
        let KernelArg::Tensor { name, .. } = a else {
            continue;
        };
        if noted.contains(name) {
            out.push(name.clone());
        } else if names_identifier(body, &tensor_name(name)) {
            return Err(Error::Internal(format!(
                "{kernel}: the printed code accesses {name}, which the printer did not note as a global access"
            )));
        }
    }
    Ok(out)
}

/// Whether `text` has `word` as a whole C identifier.
fn names_identifier(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The emulation's host loops at kernel `index`: closes those that end
/// there (innermost first), then opens those that start there (outermost
/// first), each as a C loop over its iterator.
fn host_loop_heads(loops: &[HostLoop], index: usize, params: &[String], out: &mut String) {
    host_loop_tails(loops, index, out);
    let rename = |s: &str| {
        if params.iter().any(|p| p == s) {
            param_name(s)
        } else {
            s.to_string()
        }
    };
    for l in loops.iter().filter(|l| l.first == index) {
        let _ = writeln!(
            out,
            "  for (long {it} = {}; {}; {it} += {}) {{ /* {} */",
            c_expr(&l.init, &rename),
            c_expr(&l.cond, &rename),
            c_expr(&l.inc, &rename),
            l.step.mark(),
            it = l.iterator,
        );
    }
}

/// The kernel argument that carries host loop iterator `name`.
fn step_arg(name: &str) -> String {
    format!("pf_host_{name}")
}

/// Closes the emulation's host loops that end at kernel `index`.
fn host_loop_tails(loops: &[HostLoop], index: usize, out: &mut String) {
    for l in loops.iter().rev().filter(|l| l.end == index) {
        let _ = writeln!(out, "  }} /* {} */", l.iterator);
    }
}

/// The CPU emulation (with its race detector) of `mapped`, a schedule tree
/// already mapped to the GPU (kernel, block and thread marks) whose kernels
/// have no plan: each kernel runs `block` threads per block, with nothing
/// promoted. For tests that print a hand-built mapping the pipeline would
/// refuse (`gpu::race`), to see that the emulation catches its races.
pub fn emulate_mapped(
    program: &Program,
    scop: &Scop,
    mapped: &crate::isl::Schedule,
    block: [u32; 3],
) -> Result<String> {
    let ast = super::build_ast(scop, mapped)?;
    let mut bodies = Vec::new();
    collect_kernels(&ast, &mut Vec::new(), &mut bodies, &mut Vec::new())?;
    let plans: Vec<KernelPlan> = bodies
        .into_iter()
        .map(|(mark, _)| KernelPlan {
            block,
            ..KernelPlan::one_thread(mark)
        })
        .collect();
    Ok(self::program(program, scop, &ast, &plans)?.1)
}

/// The kernel marks of the AST in order, each body under the conditions
/// isl put around it (conditions on parameters and host loops' iterators),
/// and the host loops around them (`schedule::host`: a `host_loop_*` mark
/// above a loop, which the host runs).
fn collect_kernels(
    n: &Node,
    conds: &mut Vec<Expr>,
    out: &mut Vec<(String, Node)>,
    loops: &mut Vec<HostLoop>,
) -> Result<()> {
    let host = match n {
        Node::Mark { name, body } => HostStep::from_mark(name).map(|step| (step, body)),
        _ => None,
    };
    if let Some((step, body)) = host {
        return collect_host_loop(step, body, conds, out, loops);
    }
    match n {
        Node::Mark { name, body } if name.starts_with("kernel_") => {
            let mut b = (**body).clone();
            for c in conds.iter().rev() {
                b = Node::If {
                    cond: c.clone(),
                    then: Box::new(b),
                    otherwise: None,
                };
            }
            out.push((name.clone(), b));
        }
        Node::Mark { body, .. } => collect_kernels(body, conds, out, loops)?,
        Node::Block(v) => {
            for c in v {
                collect_kernels(c, conds, out, loops)?;
            }
        }
        Node::If {
            cond,
            then,
            otherwise,
        } => {
            conds.push(cond.clone());
            collect_kernels(then, conds, out, loops)?;
            conds.pop();
            if let Some(e) = otherwise {
                conds.push(Expr::Op(Op::Eq, vec![cond.clone(), Expr::Int(0)]));
                collect_kernels(e, conds, out, loops)?;
                conds.pop();
            }
        }
        Node::For { .. } | Node::User { .. } => {
            return Err(Error::Internal(
                "the mapped AST has code outside every kernel".into(),
            ))
        }
    }
    Ok(())
}

/// The kernels below a host loop's mark (`body`: the loop isl wrote for
/// its band), recorded as a [`HostLoop`] around them.
fn collect_host_loop(
    step: HostStep,
    body: &Node,
    conds: &mut Vec<Expr>,
    out: &mut Vec<(String, Node)>,
    loops: &mut Vec<HostLoop>,
) -> Result<()> {
    let Node::For {
        iterator,
        init,
        cond,
        inc,
        body,
    } = body
    else {
        // One iteration: isl wrote no loop, and the kernels use the
        // iterator's value.
        return collect_kernels(body, conds, out, loops);
    };
    let at = loops.len();
    let first = out.len();
    loops.push(HostLoop {
        step,
        iterator: iterator.clone(),
        init: init.clone(),
        cond: cond.clone(),
        inc: inc.clone(),
        first,
        end: first,
    });
    collect_kernels(body, conds, out, loops)?;
    loops[at].end = out.len();
    if first == out.len() {
        loops.remove(at);
    }
    Ok(())
}

/// A mapping still waiting for its loop: (thread?, axis, loop iterator).
type Pending = (bool, char, String);

/// A loop of isl's AST as the printer reads it: its iterator, start,
/// condition and increment, the same three printed, and its body.
struct LoopHead<'n> {
    iterator: &'n str,
    init: &'n Expr,
    cond: &'n Expr,
    inc: &'n Expr,
    printed: [&'n str; 3],
    body: &'n Node,
}

/// A loop whose head is printed: what its body runs under.
struct OpenLoop {
    /// The mappings still pending in the body.
    pending: Vec<Pending>,
    /// The body runs inside a thread-mapped loop.
    in_thread: bool,
    /// A test beyond the loop's constant bound is open around the body.
    step_guard: bool,
    /// Reads the body takes from registers loaded ahead of the loop.
    run_reads: usize,
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    program: &'a Program,
    scop: &'a Scop,
    printer: &'a Printer<'a>,
    params: &'a [String],
    /// The kernel's plan and its thread mapping: its block, its mark,
    /// its promotions, its contraction, its private regions, its lanes.
    plan: &'a KernelPlan,
    threads: &'a ThreadPlan,
    /// The target printed: the GPU, or the CPU emulation (of the plan's
    /// block size).
    t: &'a dyn KernelTarget,
    /// Inside the promotion scope: promoted reads use the shared copies.
    in_scope: bool,
    /// The kernel's register tile, and whether we are inside its region.
    regs: Option<&'a RegisterTile>,
    in_regs: bool,
    /// Inside a register region whose tile is known to be full: the
    /// counted thread loops need no bound test, and the slot loops named
    /// here need no test of their start either (`FullTile`).
    full_tile: Option<&'a FullTile>,
    /// Inside a register tile's clamped thread loops: the tests that the
    /// thread's slot is a point of the loops, which the statements the
    /// clamp does not allow must pass.
    slot_tests: &'a [SlotTest],
    /// The iterators of the register tile's slot loops printed around
    /// this point.
    slot_loops: &'a [String],

    /// The next loop needs no barrier after each iteration (no dependence
    /// it carries crosses threads).
    nosync: bool,
    /// Private regions whose mark isl printed more than once (see
    /// [`repeated_marks`]).
    repeated_private: &'a [String],
    /// The iterators of the loops printed around this point.
    bound: &'a [String],
    /// The plain loop whose body is the node being printed: (iterator,
    /// start, condition, step), for a double-buffered promotion point.
    step_loop: Option<(&'a str, &'a Expr, &'a Expr, i64)>,
    /// Inside a double-buffered promotion scope: shared reads take the
    /// stage `pf_stage` of their array.
    staged: bool,
    /// Inside a loop the lanes share: every lane runs its statements.
    in_lanes: bool,
    /// Input rows the lanes keep in registers across the row's loops.
    row_caches: &'a [lanes::RowCache],
    /// The lane loop being printed, if any (its reads of cached rows use
    /// the registers).
    lane_loop: Option<usize>,
    /// Inside a map loop whose lanes store their slots four at a time
    /// (`codegen::cuda::lanes`): the statement's element goes to `pf_vs[pf_r]`.
    store_in_fours: bool,
}

/// One reduction's steps folded into a register (see `Ctx::folded`).
struct Folded<'n> {
    model: &'n crate::model::ModelStmt,
    op: crate::frontend::ast::Reducer,
    /// The compute type of the register.
    t: DType,
    /// The steps, `pf_red = pf_red op rhs;` inside the guards and loops.
    steps: String,
    /// `pf_red` folded into the element, one store.
    fold: String,
}

/// Blocks per mapped dimension in the CPU emulation: more than one, so the
/// cyclic distribution is exercised, and few, so that a tile is often
/// revisited by the same block.
pub const EMULATED_BLOCKS: u32 = 3;

/// The point of register slot `r` of thread `tid` along an axis of `b`
/// threads, with the thread's points in groups of `w` (see
/// `RegisterTile::group`): `tid + r b` when `w = 1`.
fn slot_point(tid: &str, r: &str, b: i64, w: i64) -> String {
    if w == 1 {
        format!("{tid} + {r} * {b}")
    } else {
        format!("({r} / {w}) * {} + {tid} * {w} + {r} % {w}", b * w)
    }
}

/// A loop with a constant trip count (`constant_trip`) and no test
/// beyond its bound: every one of its `trips` iterations `start + k step`
/// runs.
pub(super) struct CountedLoop<'n> {
    pub iterator: &'n str,
    pub start: i64,
    pub step: i64,
    pub trips: i64,
    pub cond: &'n Expr,
    pub inc: &'n Expr,
}

fn counted_loop<'n>(
    iterator: &'n str,
    init: &Expr,
    cond: &'n Expr,
    inc: &'n Expr,
) -> Option<CountedLoop<'n>> {
    let (_, None, trips) = constant_trip(iterator, init, cond, inc)? else {
        return None;
    };
    let (Expr::Int(start), Expr::Int(step)) = (init, inc) else {
        return None;
    };
    Some(CountedLoop {
        iterator,
        start: *start,
        step: *step,
        trips,
        cond,
        inc,
    })
}

/// A loop `for (it = init; cond; it += inc)` with constant `init` and
/// `inc > 0`, as a loop whose trip count is known when the kernel is
/// compiled: `(bound, rest, trips)` with `bound` the test `it <= c` (or
/// `<`) of a constant `c`, `rest` what `cond` tests beyond it, and `trips`
/// the iterations `bound` allows. `it <= min(c, e)`, a tile's steps
/// clipped at the end of the tensor, becomes `it <= c` and, inside,
/// `it <= e`.
fn constant_trip(
    iterator: &str,
    init: &Expr,
    cond: &Expr,
    inc: &Expr,
) -> Option<(Expr, Option<Expr>, i64)> {
    let (Expr::Int(first), Expr::Int(step)) = (init, inc) else {
        return None;
    };
    let (op, bound) = upper_bound(iterator, cond)?;
    if *step <= 0 {
        return None;
    }
    let it = Expr::Id(iterator.to_string());
    // `min(min(15, e1), e2)` is `min(15, min(e1, e2))`: isl nests the
    // clips of a triangle and of the tensor's end.
    fn flatten<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
        match e {
            Expr::Op(Op::Min, m) => m.iter().for_each(|x| flatten(x, out)),
            other => out.push(other),
        }
    }
    let mut terms = Vec::new();
    flatten(bound, &mut terms);
    let c = terms
        .iter()
        .filter_map(|t| match t {
            Expr::Int(c) => Some(*c),
            _ => None,
        })
        .min()?;
    let others: Vec<Expr> = terms
        .into_iter()
        .filter(|t| !matches!(t, Expr::Int(_)))
        .cloned()
        .collect();
    let rest = match others.len() {
        0 => None,
        1 => others.into_iter().next(),
        _ => Some(Expr::Op(Op::Min, others)),
    };
    let test = |b: Expr| Expr::Op(op, vec![it.clone(), b]);
    let last = if op == Op::Le { c } else { c - 1 };
    let trips = if last < *first {
        0
    } else {
        (last - first) / step + 1
    };
    Some((test(Expr::Int(c)), rest.map(test), trips))
}

/// The start of the current stage of a double-buffered shared array, as
/// the prefix `expr + ` of an index (see `Ctx::copy_in_stages`).
fn this_stage(a: &Promotion) -> String {
    format!("pf_stage * {} + ", a.layout.stage_len)
}

/// The start of the other stage (the next step's tiles).
fn other_stage(a: &Promotion) -> String {
    format!("(1 - pf_stage) * {} + ", a.layout.stage_len)
}

/// `e` with `name` replaced by `name + by`.
fn shift(e: &Expr, name: &str, by: i64) -> Expr {
    e.replace_ids(&|s| {
        (s == name).then(|| Expr::Op(Op::Add, vec![Expr::Id(s.to_string()), Expr::Int(by)]))
    })
}

/// The marks starting with `prefix` that occur more than once in `n`.
fn repeated_marks(n: &Node, prefix: &str) -> Vec<String> {
    fn walk(n: &Node, prefix: &str, seen: &mut Vec<String>) {
        if let Node::Mark { name, .. } = n {
            if name.starts_with(prefix) {
                seen.push(name.clone());
            }
        }
        n.children().into_iter().for_each(|c| walk(c, prefix, seen));
    }
    let mut seen = Vec::new();
    walk(n, prefix, &mut seen);
    let mut repeated: Vec<String> = seen
        .iter()
        .filter(|m| seen.iter().filter(|o| o == m).count() > 1)
        .cloned()
        .collect();
    repeated.sort();
    repeated.dedup();
    repeated
}

/// The statements that isl's AST prints at more than one place in `n`.
fn repeated_statements(n: &Node) -> HashSet<String> {
    fn walk(n: &Node, seen: &mut HashSet<String>, repeated: &mut HashSet<String>) {
        if let Node::User { statement, .. } = n {
            if !seen.insert(statement.clone()) {
                repeated.insert(statement.clone());
            }
        }
        n.children()
            .into_iter()
            .for_each(|c| walk(c, seen, repeated));
    }
    let mut seen = HashSet::new();
    let mut repeated = HashSet::new();
    walk(n, &mut seen, &mut repeated);
    repeated
}

/// Whether `n` runs instances of model statement `name`.
fn runs_statement(n: &Node, name: &str) -> bool {
    match n {
        Node::User { statement, .. } => statement == name,
        _ => n.children().into_iter().any(|c| runs_statement(c, name)),
    }
}

/// Whether `n` contains thread-mapped loops or statements.
fn has_work(n: &Node) -> bool {
    matches!(n, Node::User { .. }) || n.children().into_iter().any(has_work)
}

impl<'a> Ctx<'a> {
    /// The block has more than one thread.
    fn has_threads(&self) -> bool {
        self.plan.block.iter().product::<u32>() > 1
    }

    /// The kernel's shared-memory promotions, if it has any.
    fn scope(&self) -> Option<&'a Scope> {
        self.threads.scope.as_ref().filter(|s| !s.arrays.is_empty())
    }

    /// The kernel's contraction on tensor cores, if any.
    fn mma(&self) -> Option<&'a Contraction> {
        self.plan.contraction()
    }

    /// The kernel's mark (`kernel_K`).
    fn kernel_mark(&self) -> &'a str {
        &self.plan.mark
    }

    /// A warp per row whose lanes share the row's loops (`gpu::lanes`):
    /// the states of the split reduction loops.
    fn lanes(&self) -> Option<&'a [LaneLoop]> {
        self.threads.lanes.as_deref()
    }
}

impl Ctx<'_> {
    /// Printing an emulation the race detector watches (`codegen::race`).
    fn race(&self) -> bool {
        self.t.watches_races(self.printer)
    }

    /// `t_X[global]`, for a read (`Some(false)`) or a write (`Some(true)`)
    /// through the race detector when it is on.
    fn global_element(&self, tensor: &str, global: &str, write: Option<bool>) -> String {
        self.printer.globals.note(tensor);
        match write {
            Some(w) if self.race() => {
                let k = self
                    .scop
                    .tensors
                    .iter()
                    .position(|t| t.name == tensor)
                    .unwrap_or(0);
                let f = if w { "pf_race_w" } else { "pf_race_r" };
                format!("{}[{f}({k}, {global})]", tensor_name(tensor))
            }
            _ => format!("{}[{global}]", tensor_name(tensor)),
        }
    }

    fn rename(&self, s: &str) -> String {
        if self.params.iter().any(|p| p == s) {
            param_name(s)
        } else {
            s.to_string()
        }
    }

    fn e(&self, x: &Expr) -> String {
        c_expr(x, &|s| self.rename(s))
    }

    /// Prints `n`. `pending`: mappings whose loop has not been met yet;
    /// `in_thread`: inside a thread-mapped loop.
    fn node(&self, n: &Node, depth: usize, pending: &[Pending], in_thread: bool, out: &mut String) {
        let pad = "  ".repeat(depth);
        match n {
            Node::For {
                iterator,
                init,
                cond,
                inc,
                body,
            } => {
                let printed = [self.e(init), self.e(cond), self.e(inc)];
                let head = LoopHead {
                    iterator,
                    init,
                    cond,
                    inc,
                    printed: [&printed[0], &printed[1], &printed[2]],
                    body,
                };
                self.for_loop(n, &head, depth, pending, in_thread, out);
            }
            Node::If {
                cond,
                then,
                otherwise,
            } => {
                let _ = writeln!(out, "{pad}if ({}) {{", self.e(cond));
                self.node(then, depth + 1, pending, in_thread, out);
                if let Some(e) = otherwise {
                    let _ = writeln!(out, "{pad}}} else {{");
                    self.node(e, depth + 1, pending, in_thread, out);
                }
                let _ = writeln!(out, "{pad}}}");
            }
            Node::Block(v) => {
                // A single row across lanes (its loop left, its mapping
                // pending): isl repeats the row's private region in each
                // part of the row, so a part's lanes load what lane 0
                // stored at the end of the part before; the row's threads
                // wait for it.
                let row_parts = self.lanes().is_some()
                    && !self.in_lanes
                    && in_thread
                    && pending.iter().any(|p| p.0);
                for (i, c) in v.iter().enumerate() {
                    if i > 0 && !in_thread && self.has_threads() {
                        self.t.barrier(self, &pad, out);
                    } else if i > 0 && row_parts {
                        self.t.row_barrier(self, &pad, out);
                    }
                    self.node(c, depth, pending, in_thread, out);
                }
            }
            Node::Mark { name, body } => self.mark(name, body, depth, pending, in_thread, out),
            Node::User { statement, args } => {
                self.statement(statement, args, depth, pending, in_thread, out)
            }
        }
    }
}

/// A private array as the region holds it (`Ctx::private_buffer`).
struct PrivateBuffer {
    name: String,
    /// Held in f32 though its tensor is f16 or bf16.
    wide: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str) -> KernelArg {
        KernelArg::Tensor {
            name: name.into(),
            dtype: DType::F32,
            shape: vec!["N".into()],
        }
    }

    /// The launch record's list is the printer's notes, in argument order;
    /// a tensor the printed body names without a note is an internal
    /// error, not a silent gap in the workspace (`t_X` inside `t_XY` or
    /// `pf_t_X` is not a mention of `X`).
    #[test]
    fn a_tensor_printed_but_not_noted_is_refused() {
        let args = vec![
            tensor("X"),
            KernelArg::Param { name: "N".into() },
            tensor("Y"),
        ];
        let noted: std::collections::BTreeSet<String> = ["Y".to_string(), "X".to_string()].into();
        let list = touched(&args, noted, "kernel_0", "t_Y[i] = t_X[i];").unwrap();
        assert_eq!(list, ["X", "Y"]);
        let only_y: std::collections::BTreeSet<String> = ["Y".to_string()].into();
        let body = "t_Y[i] = t_XY[i] + pf_t_X;";
        assert_eq!(
            touched(&args, only_y.clone(), "kernel_0", body).unwrap(),
            ["Y"]
        );
        match touched(&args, only_y, "kernel_0", "t_Y[i] = t_X[i];") {
            Err(Error::Internal(m)) => assert!(m.contains("kernel_0") && m.contains("X"), "{m}"),
            other => panic!("expected an internal error, got {other:?}"),
        }
    }
}
