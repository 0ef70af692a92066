//! The C ABI (`include/polyfuse.h`): an `extern "C"` layer over
//! [`crate::compile`] for C and C++ programs that embed polyfuse without
//! Rust in their build. It holds no compiler logic of its own: it parses
//! C arguments, calls the library, and hands back plain values.
//!
//! Three rules shape every function here:
//! - Nothing unwinds across the boundary: each entry runs its body under
//!   `catch_unwind` and turns a panic into `PF_ERR_INTERNAL`.
//! - Handles are never dereferenced: they are registry numbers (see
//!   [`handles`]), so null, freed and forged handles are refused with
//!   `PF_ERR_INVALID_HANDLE`.
//! - Errors are a status (the exit statuses of the command line: 2 bad input
//!   or illegal transformation, 3 environment, 4 internal; 5 and 6 for
//!   misuse of the ABI itself) plus a message, kept on the handle the call
//!   was about and, for every call, on the calling thread.
//!
//! The header is generated from these definitions by cbindgen
//! (`cbindgen.toml`) and checked in; `tests/integration/capi_header.rs` fails when it
//! is out of date. So the doc comments of the C-visible items here (the
//! `pf_` functions, types and constants) are the header's documentation,
//! written for C callers: what each does, who owns what, which errors.
#![allow(non_camel_case_types)]

mod handles;
mod launch;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::frontend::{self, ast::DType, ast::Program, ast::TensorRole};
use crate::gpu::{GpuOptions, KernelArg};
use crate::pipeline::{Compiled, Options};
use crate::schedule::Strategy;
use crate::session::{self, Arch, CacheFault, Event, Origin, Session, TunedCache};
use crate::Error;

use handles::Object;

/// Status of every call that can fail: PF_OK or one of the PF_ERR_ codes,
/// which mirror the command line's exit statuses.
pub type pf_status = i32;
/// Success.
pub const PF_OK: pf_status = 0;
/// Bad JSON, program or option value; or an illegal transformation.
pub const PF_ERR_INPUT: pf_status = 2;
/// Something the machine lacks: the CUDA driver, NVRTC, a CUDA context.
pub const PF_ERR_ENVIRONMENT: pf_status = 3;
/// A bug in polyfuse (a caught panic among them).
pub const PF_ERR_INTERNAL: pf_status = 4;
/// A null, destroyed or forged handle or string.
pub const PF_ERR_INVALID_HANDLE: pf_status = 5;
/// A null output, an index out of range, a string that is not UTF-8, or a
/// query the result cannot answer (the CUDA source of a cpu result: the
/// wrong target).
pub const PF_ERR_INVALID_ARGUMENT: pf_status = 6;

/// Element type of a tensor argument: one of the PF_DTYPE_ values.
pub type pf_dtype = i32;
/// 32-bit IEEE float.
pub const PF_DTYPE_F32: pf_dtype = 0;
/// Stored as 16-bit IEEE half.
pub const PF_DTYPE_F16: pf_dtype = 1;
/// Stored as 16-bit bfloat16.
pub const PF_DTYPE_BF16: pf_dtype = 2;
/// 64-bit IEEE float.
pub const PF_DTYPE_F64: pf_dtype = 3;
/// 32-bit signed integer.
pub const PF_DTYPE_I32: pf_dtype = 4;
/// 64-bit signed integer.
pub const PF_DTYPE_I64: pf_dtype = 5;
/// 8-bit unsigned integer.
pub const PF_DTYPE_U8: pf_dtype = 6;
/// One byte, 0 or 1.
pub const PF_DTYPE_BOOL: pf_dtype = 7;
/// One byte: 8-bit float, 4 exponent bits (no infinity, max 448).
pub const PF_DTYPE_F8E4M3: pf_dtype = 8;
/// One byte: 8-bit float, 5 exponent bits (max 57344).
pub const PF_DTYPE_F8E5M2: pf_dtype = 9;

/// What an argument of the kernels is (pf_result_arg_kind): one of the
/// PF_ARG_ values.
pub type pf_arg_kind = i32;
/// A device pointer.
pub const PF_ARG_TENSOR: pf_arg_kind = 0;
/// A parameter value, passed as a 64-bit long.
pub const PF_ARG_PARAM: pf_arg_kind = 1;
/// A host loop's iterator, passed as a 64-bit long: set by
/// pf_result_launch_all for each launch.
pub const PF_ARG_STEP: pf_arg_kind = 2;

/// The ABI version this header describes; compare with pf_abi_version().
pub const PF_ABI_VERSION: i32 = 1;

/// A compiler context: one program and its options. Opaque: the library
/// hands out handles and never dereferences them.
// Not `repr(C)`, so that cbindgen declares it opaque.
pub struct pf_context {
    _private: [u8; 0],
}

/// What one compilation produced. Opaque; immutable once made, so it may be
/// queried from several threads at once.
// Not `repr(C)`, so that cbindgen declares it opaque.
pub struct pf_result {
    _private: [u8; 0],
}

/// The CUDA driver's stream type, declared opaque so that the header needs
/// no `cuda.h`; the same pointer type as the driver's `CUstream`. The
/// header declares it by hand (`cbindgen.toml`'s after_includes), only
/// where `cuda.h` has not.
#[repr(C)]
pub struct CUstream_st {
    _private: [u8; 0],
}
pub type CUstream = *mut CUstream_st;

/// Where the compiled program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Cpu,
    Cuda,
}

/// The state behind a `pf_context`.
pub(crate) struct ContextState {
    program: Option<Program>,
    /// The loaded program's text and name, for `pf_result_save` (an
    /// artifact parses the same program back).
    program_text: Option<(String, String)>,
    target: Target,
    options: Options,
    gpu: GpuOptions,
    /// `NAME=VALUE` overrides, applied at compile time so that options may
    /// be set before the program is loaded.
    params: Vec<(String, i64)>,
    /// Replaces the program's `schedule` key when set.
    directives: Option<serde_json::Value>,
    last_error: Option<String>,
    /// Whether a schedule option was set (then the cache's tuned options
    /// are not consulted).
    options_set: bool,
    /// Whether `pf_context_set_tile` gave tile sizes; without them the GPU
    /// target chooses its tiles per kernel, as the command line does
    /// without `--tile`.
    tile_set: bool,
    /// The compilation cache (`pf_context_set_cache`); None: no cache. A
    /// library reads and writes no file of the user's unless asked.
    cache: Option<std::path::PathBuf>,
    /// Where the library's notices go (`pf_context_set_log`); None: nowhere
    /// (the library never writes to stderr).
    log: Option<LogSink>,
    /// Seconds after which a compilation isl's scheduler has not finished
    /// is replaced by one with minimal fusion; None:
    /// `POLYFUSE_SCHEDULE_TIMEOUT`, else 60.
    schedule_timeout: Option<u64>,
    /// The GPU architecture launches compile for (`pf_context_set_arch`);
    /// None: `POLYFUSE_CUDA_ARCH`, else the device's choice.
    arch: Option<String>,
    /// The device the result is meant for (`pf_context_set_device`), whose
    /// architecture keys the tuning cache; None: the device of the
    /// thread's current context, else device 0.
    device: Option<i32>,
}

/// The state behind a `pf_result`.
pub(crate) struct ResultState {
    compiled: Compiled,
    target: Target,
    /// Kernel arguments in order: tensors, then symbolic parameters.
    args: Vec<KernelArg>,
    /// Every parameter with a compile-time value.
    fixed: HashMap<String, i64>,
    /// The parameters without one, in the order callers pass their values.
    symbolic: Vec<String>,
    last_error: Mutex<Option<String>>,
    modules: Mutex<launch::Modules>,
    /// 0: compiled under the context's options; 1: under tuned options
    /// from the cache; 2: the compiled program itself came from the cache;
    /// 3: loaded from an artifact (`pf_result_load`).
    from_cache: i32,
    /// Each argument's name as a C string, for `pf_tensor_info::name`
    /// (valid while the result lives).
    arg_names: Vec<std::ffi::CString>,
    /// Per kernel, the argument indices of the tensors its code reads or
    /// writes in global memory (`gpu::Kernel::globals`): a null pointer
    /// for one of them is refused at launch.
    kernel_globals: Vec<Vec<usize>>,
    /// Per argument, whether it is a tensor some kernel touches in global
    /// memory (every tensor of a cpu result: its C function touches all).
    /// A temp that is not needs no memory and takes no workspace.
    in_memory: Vec<bool>,
    /// What the program was compiled from, for `pf_result_save`.
    source: crate::tune::aot::Source,
}

/// Alignment of each temp in the workspace, and of a caller's workspace:
/// `cuMemAlloc`'s, so a temp is aligned as if allocated on its own (the
/// kernels load some tensors 16 bytes at a time).
pub const PF_WORKSPACE_ALIGN: usize = 256;

/// A failed call: its status and message.
#[derive(Debug)]
pub(crate) struct Failure {
    status: pf_status,
    message: String,
}

impl Failure {
    fn new(status: pf_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }
    pub(crate) fn argument(message: impl Into<String>) -> Failure {
        Failure::new(PF_ERR_INVALID_ARGUMENT, message)
    }
    fn input(message: impl Into<String>) -> Failure {
        Failure::new(PF_ERR_INPUT, message)
    }
    pub(crate) fn environment(message: impl Into<String>) -> Failure {
        Failure::new(PF_ERR_ENVIRONMENT, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Failure {
        Failure::new(PF_ERR_INTERNAL, message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match e.exit_code() {
            2 => PF_ERR_INPUT,
            3 => PF_ERR_ENVIRONMENT,
            _ => PF_ERR_INTERNAL,
        };
        Failure::new(status, e.to_string())
    }
}

type Outcome<T = ()> = Result<T, Failure>;

thread_local! {
    /// The message of the latest failed call on this thread.
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let what = crate::error::panic_text(payload).unwrap_or_else(|| "a panic".into());
    format!("internal error: {what}")
}

/// Runs `f` with panics caught, and records its failure on this thread.
fn guard(f: impl FnOnce() -> Outcome) -> pf_status {
    let outcome = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(o) => o,
        Err(payload) => Err(Failure::internal(panic_message(&*payload))),
    };
    match outcome {
        Ok(()) => PF_OK,
        Err(fail) => {
            let status = fail.status;
            let _ = catch_unwind(|| LAST_ERROR.with(|l| *l.borrow_mut() = Some(fail.message)));
            status
        }
    }
}

fn invalid_handle(what: &str) -> Failure {
    Failure::new(
        PF_ERR_INVALID_HANDLE,
        format!("{what} is null, already destroyed, or not a handle polyfuse handed out"),
    )
}

fn context_of(ctx: *const pf_context) -> Outcome<Arc<Mutex<ContextState>>> {
    match handles::get(ctx.addr() as u64) {
        Some(Object::Context(c)) => Ok(c),
        _ => Err(invalid_handle("the pf_context")),
    }
}

fn result_of(r: *const pf_result) -> Outcome<Arc<ResultState>> {
    match handles::get(r.addr() as u64) {
        Some(Object::Result(s)) => Ok(s),
        _ => Err(invalid_handle("the pf_result")),
    }
}

/// A call about a context: the outcome also becomes the context's last
/// error (cleared on success).
fn with_context(ctx: *const pf_context, f: impl FnOnce(&mut ContextState) -> Outcome) -> pf_status {
    guard(|| {
        let state = context_of(ctx)?;
        let outcome = catch_unwind(AssertUnwindSafe(|| f(&mut lock(&state))))
            .unwrap_or_else(|p| Err(Failure::internal(panic_message(&*p))));
        lock(&state).last_error = outcome.as_ref().err().map(|e| e.message.clone());
        outcome
    })
}

/// A call about a result; its outcome becomes the result's last error.
fn with_result(r: *const pf_result, f: impl FnOnce(&ResultState) -> Outcome) -> pf_status {
    guard(|| {
        let state = result_of(r)?;
        let outcome = catch_unwind(AssertUnwindSafe(|| f(&state)))
            .unwrap_or_else(|p| Err(Failure::internal(panic_message(&*p))));
        *lock(&state.last_error) = outcome.as_ref().err().map(|e| e.message.clone());
        outcome
    })
}

/// Reads a C string argument.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that stays valid for
/// the call (the header's contract for every `const char *`).
unsafe fn text<'a>(p: *const c_char, what: &str) -> Outcome<&'a str> {
    if p.is_null() {
        return Err(Failure::argument(format!("{what} is null")));
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Failure::argument(format!("{what} is not UTF-8")))
}

/// Reads `count` elements of a C array argument; an empty slice when
/// `count` is 0 (then `p` may be null).
///
/// # Safety
/// `p` points to `count` readable elements when `count > 0`.
unsafe fn array<'a, T>(p: *const T, count: usize, what: &str) -> Outcome<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::argument(format!("{what} is null")));
    }
    // SAFETY: non-null and `count` elements long by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}

/// Writes an output argument.
///
/// # Safety
/// `out` is null or points to writable memory for one `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Outcome {
    if out.is_null() {
        return Err(Failure::argument(format!(
            "the output pointer {what} is null"
        )));
    }
    // SAFETY: non-null, and writable by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

fn dtype_code(t: DType) -> pf_dtype {
    match t {
        DType::F32 => PF_DTYPE_F32,
        DType::F16 => PF_DTYPE_F16,
        DType::BF16 => PF_DTYPE_BF16,
        DType::F64 => PF_DTYPE_F64,
        DType::I32 => PF_DTYPE_I32,
        DType::I64 => PF_DTYPE_I64,
        DType::U8 => PF_DTYPE_U8,
        DType::Bool => PF_DTYPE_BOOL,
        DType::F8E4M3 => PF_DTYPE_F8E4M3,
        DType::F8E5M2 => PF_DTYPE_F8E5M2,
    }
}

fn dtype_bytes(t: DType) -> u64 {
    t.size() as u64
}

/// What a tensor argument is to the program (pf_result_arg_role): one of
/// the PF_ROLE_ values.
pub type pf_role = i32;
/// Read by the kernels, never written.
pub const PF_ROLE_INPUT: pf_role = 0;
/// Written by the kernels, every element.
pub const PF_ROLE_OUTPUT: pf_role = 1;
/// An intermediate the program declared or inferred (or a repair added).
pub const PF_ROLE_TEMP: pf_role = 2;
/// The most dimensions pf_tensor_info holds.
pub const PF_MAX_RANK: usize = 8;

/// One tensor argument, as pf_result_tensors describes it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct pf_tensor_info {
    /// The tensor's name, valid while the result lives.
    pub name: *const c_char,
    /// Its index among the kernel arguments (for `device_ptrs`).
    pub arg_index: usize,
    /// PF_ROLE_INPUT, PF_ROLE_OUTPUT or PF_ROLE_TEMP.
    pub role: pf_role,
    /// Its element type, a PF_DTYPE_ value.
    pub dtype: pf_dtype,
    /// Its number of dimensions, at most PF_MAX_RANK.
    pub rank: usize,
    /// Extents for the given parameters; those past `rank` are 0.
    pub extents: [i64; PF_MAX_RANK],
    /// Bytes to allocate: row-major, storage type.
    pub bytes: usize,
}

fn role_code(r: TensorRole) -> pf_role {
    match r {
        TensorRole::Input => PF_ROLE_INPUT,
        TensorRole::Output => PF_ROLE_OUTPUT,
        TensorRole::Temp => PF_ROLE_TEMP,
    }
}

impl ResultState {
    fn cuda(&self) -> Outcome<&crate::gpu::CudaProgram> {
        self.compiled.cuda.as_ref().ok_or_else(|| {
            Failure::argument("the result was compiled for the cpu target; it has no CUDA program")
        })
    }

    fn kernel(&self, k: usize) -> Outcome<&crate::gpu::Kernel> {
        let n = self.compiled.cuda.as_ref().map_or(0, |c| c.kernels.len());
        self.compiled
            .cuda
            .as_ref()
            .and_then(|c| c.kernels.get(k))
            .ok_or_else(|| Failure::argument(format!("kernel index {k} is out of range (0..{n})")))
    }

    /// Tensor map `index` of kernel `k`, and the place of its tensor among
    /// the tensor arguments (its index in a `device_ptrs` array).
    fn tensor_map(&self, k: usize, index: usize) -> Outcome<(&crate::gpu::TensorMap, usize)> {
        let kernel = self.kernel(k)?;
        let map = kernel.tensor_maps.get(index).ok_or_else(|| {
            Failure::argument(format!(
                "tensor map index {index} is out of range (0..{}) for kernel {k}",
                kernel.tensor_maps.len()
            ))
        })?;
        let at = self
            .args
            .iter()
            .filter(|a| matches!(a, KernelArg::Tensor { .. }))
            .position(|a| matches!(a, KernelArg::Tensor { name, .. } if *name == map.tensor))
            .ok_or_else(|| {
                Failure::internal(format!("kernel {k} maps {}, no argument", map.tensor))
            })?;
        Ok((map, at))
    }

    /// The number of tensor arguments: the pointers `pf_result_launch`
    /// takes.
    fn tensor_count(&self) -> usize {
        self.args
            .iter()
            .filter(|a| matches!(a, KernelArg::Tensor { .. }))
            .count()
    }

    fn arg(&self, i: usize) -> Outcome<&KernelArg> {
        self.args.get(i).ok_or_else(|| {
            Failure::argument(format!(
                "argument index {i} is out of range (0..{})",
                self.args.len()
            ))
        })
    }

    /// Every parameter's value: the compile-time ones and `values` for the
    /// symbolic ones, in [`ResultState::symbolic`] order.
    fn param_map(&self, values: &[i64]) -> Outcome<HashMap<String, i64>> {
        if values.len() != self.symbolic.len() {
            return Err(Failure::argument(format!(
                "{} parameter values given; the result has {} symbolic parameters ({})",
                values.len(),
                self.symbolic.len(),
                self.symbolic.join(", ")
            )));
        }
        let mut map = self.fixed.clone();
        for (name, v) in self.symbolic.iter().zip(values) {
            if *v < 1 {
                return Err(Failure::input(format!(
                    "parameter {name} = {v}: parameters are positive integers"
                )));
            }
            map.insert(name.clone(), *v);
        }
        Ok(map)
    }

    /// The role of tensor argument `i`.
    fn role(&self, i: usize) -> Outcome<pf_role> {
        let KernelArg::Tensor { name, .. } = self.arg(i)? else {
            return Err(Failure::argument(format!(
                "argument {i} is a parameter, not a tensor"
            )));
        };
        let t = self
            .compiled
            .tensors
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| Failure::internal(format!("no tensor {name}")))?;
        Ok(role_code(t.role))
    }

    /// Where each temp that reaches memory lies in the workspace (a byte
    /// offset per argument index; `None` for inputs, outputs, parameters
    /// and temps no kernel touches), and the workspace's size: those
    /// temps in argument order, each at a multiple of [`PF_WORKSPACE_ALIGN`].
    fn workspace_layout(&self, map: &HashMap<String, i64>) -> Outcome<(Vec<Option<usize>>, usize)> {
        let mut offsets = vec![None; self.args.len()];
        let mut total = 0usize;
        for (i, place) in offsets.iter_mut().enumerate() {
            if !self.in_memory[i] || self.role(i).ok() != Some(PF_ROLE_TEMP) {
                continue;
            }
            let overflow = || Failure::input("the workspace's size overflows");
            let start = total
                .checked_next_multiple_of(PF_WORKSPACE_ALIGN)
                .ok_or_else(overflow)?;
            *place = Some(start);
            total = start
                .checked_add(self.bytes(i, map)?)
                .ok_or_else(overflow)?;
        }
        Ok((offsets, total))
    }

    /// The number of inputs and outputs: the pointers the caller passes to
    /// `pf_result_launch_workspace`.
    fn io_count(&self) -> usize {
        (0..self.args.len())
            .filter(|&i| matches!(self.role(i), Ok(role) if role != PF_ROLE_TEMP))
            .count()
    }

    /// Where each tensor argument is, in argument order among the
    /// tensors: the caller's pointer for an input or output (`io`, in that
    /// order), the workspace offset for a temp that takes memory
    /// (`offsets`, from [`Self::workspace_layout`]), null for a temp that
    /// takes none.
    fn tensor_places(&self, io: &[u64], offsets: &[Option<usize>]) -> Vec<Result<u64, usize>> {
        let mut io = io.iter();
        let mut places = Vec::new();
        for (i, (a, offset)) in self.args.iter().zip(offsets).enumerate() {
            if !matches!(a, KernelArg::Tensor { .. }) {
                continue;
            }
            let temp = self.role(i).ok() == Some(PF_ROLE_TEMP);
            places.push(match (temp, *offset) {
                (false, _) => Ok(io.next().copied().unwrap_or(0)),
                (true, Some(offset)) => Err(offset),
                (true, None) => Ok(0),
            });
        }
        places
    }

    /// Kernel `k`'s arguments from a pointer per tensor (`tensor_ptrs`, by
    /// argument order among the tensors; `None` for a temp in the
    /// workspace at its offset) and the parameter values, refusing a null
    /// pointer for a tensor the kernel touches; and a device pointer of
    /// the launch to find the null stream's context from.
    fn launch_args(
        &self,
        k: usize,
        tensor_ptrs: &[Result<u64, usize>],
        map: &HashMap<String, i64>,
        steps: &[i64],
    ) -> Outcome<(Vec<launch::Arg>, Option<u64>)> {
        let mut args = Vec::with_capacity(self.args.len());
        let mut ptrs = tensor_ptrs.iter();
        let mut next_step = steps.iter();
        for a in &self.args {
            args.push(match a {
                KernelArg::Tensor { .. } => match ptrs.next() {
                    Some(Ok(p)) => launch::Arg::Pointer(*p),
                    Some(Err(offset)) => launch::Arg::Workspace(*offset),
                    None => return Err(Failure::internal("fewer pointers than tensors")),
                },
                KernelArg::Param { name } => launch::Arg::Long(map.get(name).copied().unwrap_or(0)),
                KernelArg::Step { .. } => launch::Arg::Long(next_step.next().copied().unwrap_or(0)),
            });
        }
        // A tensor of no element may be null (torch's empty tensors are):
        // no access reaches it.
        for &i in &self.kernel_globals[k] {
            if args[i] == launch::Arg::Pointer(0) && self.bytes(i, map)? > 0 {
                let name = self.arg_names[i].to_string_lossy();
                return Err(Failure::argument(format!(
                    "the pointer for tensor {name} (argument {i}) is null, and kernel {k} reads or writes it"
                )));
            }
        }
        let probe = self.kernel_globals[k]
            .iter()
            .map(|&i| args[i])
            .chain(args.iter().copied())
            .find_map(|a| match a {
                launch::Arg::Pointer(p) if p != 0 => Some(p),
                _ => None,
            });
        Ok((args, probe))
    }

    /// Bytes of tensor argument `i` for the given parameter values.
    fn bytes(&self, i: usize, map: &HashMap<String, i64>) -> Outcome<usize> {
        let (t, shape) = tensor_arg(self, i)?;
        let mut bytes = dtype_bytes(t);
        for d in 0..shape.len() {
            let e = self.extent(i, d, map)?.max(0) as u64;
            bytes = bytes
                .checked_mul(e)
                .ok_or_else(|| Failure::input("the tensor's size overflows"))?;
        }
        usize::try_from(bytes).map_err(|_| Failure::input("the tensor's size overflows"))
    }

    /// Extent `d` of tensor argument `i` for the given parameter values.
    fn extent(&self, i: usize, d: usize, params: &HashMap<String, i64>) -> Outcome<i64> {
        let name = match self.arg(i)? {
            KernelArg::Tensor { name, .. } => name,
            KernelArg::Param { name } | KernelArg::Step { name } => {
                return Err(Failure::argument(format!(
                    "argument {i} is the parameter {name}, not a tensor"
                )))
            }
        };
        let t = self
            .compiled
            .tensors
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| Failure::internal(format!("tensor {name} is not in the model")))?;
        let e = t.shape.get(d).ok_or_else(|| {
            Failure::argument(format!(
                "dimension {d} is out of range: {name} has rank {}",
                t.shape.len()
            ))
        })?;
        let mut v = e.constant;
        for (p, k) in &e.terms {
            let x = params
                .get(p)
                .ok_or_else(|| Failure::internal(format!("extent of {name} uses {p}")))?;
            v += k * x;
        }
        Ok(v)
    }
}

/// A caller's log callback and its user pointer (kept as an address: the
/// library never dereferences it, only hands it back).
#[derive(Clone, Copy)]
pub(crate) struct LogSink {
    /// A `pf_log_fn` that is not NULL.
    callback: unsafe extern "C" fn(*mut c_void, i32, *const c_char),
    user: usize,
}

/// Where the library's notices go (pf_context_set_log): called on the
/// thread that called pf_compile, with the user pointer given, a level
/// (PF_LOG_INFO or PF_LOG_WARNING) and a message valid for the call only.
/// It must not throw into polyfuse.
// An `Option` so that C's NULL is a value of the type (cbindgen writes a
// nullable function pointer as the plain C function pointer type).
pub type pf_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: i32, message: *const c_char)>;

/// Something to know, nothing went wrong (a tuned configuration from the
/// cache was used).
pub const PF_LOG_INFO: i32 = 0;
/// Polyfuse did other than asked, and says what (a schedule isl did not
/// finish replaced by minimal fusion; a cache it could not read).
pub const PF_LOG_WARNING: i32 = 1;

impl LogSink {
    /// Hands `message` to the callback, on the calling thread. A message
    /// with a NUL inside is cut there.
    fn send(self, level: i32, message: &str) {
        let text = message.split('\0').next().unwrap_or_default();
        let Ok(c) = std::ffi::CString::new(text) else {
            return;
        };
        // SAFETY: the callback's contract (pf_context_set_log): it may be
        // called with its user pointer and a string valid for the call.
        unsafe {
            (self.callback)(
                std::ptr::with_exposed_provenance_mut(self.user),
                level,
                c.as_ptr(),
            )
        }
    }
}

/// Sends a notice where the context says, or nowhere.
fn log(state: &ContextState, level: i32, message: &str) {
    if let Some(sink) = state.log {
        sink.send(level, message);
    }
}

/// Builds a result from a context's program and options, through the
/// session the command line compiles through; its events go to the
/// context's log as they happen.
fn compile_context(state: &ContextState) -> Outcome<ResultState> {
    let program = state.program.clone().ok_or_else(|| {
        Failure::input(
            "no program is loaded; call pf_context_load_json or pf_context_load_file first",
        )
    })?;
    let source_name = program.source.clone();
    let (target, arch) = match state.target {
        Target::Cpu => (session::Target::Cpu, Arch::Known("cpu".into())),
        Target::Cuda => (
            session::Target::Gpu(state.gpu.clone()),
            Arch::Optional(Box::new(|| cache_arch(state).map_err(Error::Environment))),
        ),
    };
    let session = Session::new(program)
        .params(&state.params)
        .directives(state.directives.clone())
        .options(state.options.clone(), state.options_set)
        .tile(state.tile_set.then(|| state.options.tile.clone()))
        .target(target)
        // A schedule isl does not finish in the context's timeout
        // (pf_context_set_schedule_timeout, else POLYFUSE_SCHEDULE_TIMEOUT,
        // else 60 s) is replaced by minimal fusion, as on the command line.
        .fallback_after(state.schedule_timeout.map(std::time::Duration::from_secs))
        .cache(state.cache.clone().map(|path| TunedCache {
            path,
            arch,
            program_errors_fail: true,
        }))
        .observe(|e| log_event(state, e, &source_name));
    let program = session.program()?;
    let compilation = session.compile()?;
    let from_cache = match compilation.origin {
        Origin::Compiled => 0,
        Origin::TunedOptions => 1,
        Origin::CachedProgram => 2,
    };
    let (text, name) = state
        .program_text
        .clone()
        .ok_or_else(|| Failure::internal("a program without its text"))?;
    let source = crate::tune::aot::Source {
        text,
        name,
        params: state.params.clone(),
        directives: state.directives.clone(),
    };
    result_state(
        &program,
        compilation.compiled,
        state.target,
        from_cache,
        state.arch.clone(),
        source,
    )
}

/// Sends a session's event to the context's log: a notice or a warning.
/// Without a device named (`pf_context_set_device`), a cuda result whose
/// architecture cannot be learnt (no driver) skips the cache quietly; a
/// device the caller named is worth a word.
fn log_event(state: &ContextState, event: &Event, source: &str) {
    if let Event::CacheNotUsed {
        fault: CacheFault::Arch,
        ..
    } = event
    {
        if state.device.is_none() {
            return;
        }
    }
    let level = if event.is_warning() {
        PF_LOG_WARNING
    } else {
        PF_LOG_INFO
    };
    log(state, level, &event.message(source));
}

/// A result of `compiled` (of `program`, for `target`): its arguments,
/// parameters, the tensors each kernel touches. Shared by `pf_compile` and
/// `pf_result_load`.
fn result_state(
    program: &Program,
    compiled: Compiled,
    target: Target,
    from_cache: i32,
    arch: Option<String>,
    source: crate::tune::aot::Source,
) -> Outcome<ResultState> {
    let args = match (&compiled.cuda, target) {
        (Some(c), Target::Cuda) => c.args.clone(),
        (None, Target::Cuda) => {
            return Err(Failure::environment(
                "the CUDA target is not available in this build of polyfuse (the GPU mapping produced no CUDA program)",
            ))
        }
        // The CPU kernel takes the same tensors in the same order.
        _ => crate::gpu::kernel_args(program, &compiled.tensors),
    };
    let arg_names = args
        .iter()
        .map(|a| {
            let (KernelArg::Tensor { name, .. }
            | KernelArg::Param { name }
            | KernelArg::Step { name }) = a;
            std::ffi::CString::new(name.as_str()).unwrap_or_default()
        })
        .collect();
    let arg_index: HashMap<&str, usize> = args
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            KernelArg::Tensor { name, .. } => Some((name.as_str(), i)),
            KernelArg::Param { .. } | KernelArg::Step { .. } => None,
        })
        .collect();
    let kernel_globals: Vec<Vec<usize>> = match (&compiled.cuda, target) {
        (Some(c), Target::Cuda) => c
            .kernels
            .iter()
            .map(|k| {
                k.globals
                    .iter()
                    .filter_map(|t| arg_index.get(t.as_str()).copied())
                    .collect()
            })
            .collect(),
        _ => Vec::new(),
    };
    let in_memory = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            matches!(a, KernelArg::Tensor { .. })
                && (target == Target::Cpu || kernel_globals.iter().any(|g| g.contains(&i)))
        })
        .collect();
    let fixed = program.known_params();
    let symbolic = program
        .params
        .iter()
        .filter(|p| p.value.is_none())
        .map(|p| p.name.clone())
        .collect();
    Ok(ResultState {
        compiled,
        target,
        args,
        fixed,
        symbolic,
        last_error: Mutex::new(None),
        modules: Mutex::new(launch::Modules::for_arch(arch)),
        from_cache,
        arg_names,
        kernel_globals,
        in_memory,
        source,
    })
}

/// The architecture the tuning cache is keyed by for a cuda result
/// (`sm_90`): that of the device `pf_context_set_device` names, else of
/// the device of the thread's current context, else of device 0 (issue
/// 33: always device 0 before, whatever device the result ran on). None
/// where no driver answers.
fn cache_arch(state: &ContextState) -> Result<String, String> {
    catch_unwind(|| launch::device_arch(state.device))
        .map_err(|p| panic_message(&*p))?
        .map_err(|f| f.message)
}

// ---------------------------------------------------------------------------
// Version, strings, errors
// ---------------------------------------------------------------------------

/// The library's version, e.g. "0.1.0": a static string, not to be freed.
#[no_mangle]
pub extern "C" fn pf_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The ABI version the library implements; equals PF_ABI_VERSION of the
/// header the caller was built with unless header and library disagree.
#[no_mangle]
pub extern "C" fn pf_abi_version() -> i32 {
    PF_ABI_VERSION
}

/// Frees a string handed out by polyfuse. NULL is ignored; a string freed
/// already or not handed out is refused (PF_ERR_INVALID_HANDLE).
///
/// # Safety
/// `s` is null or any pointer value; it is never dereferenced unless
/// polyfuse handed it out and has not taken it back.
#[no_mangle]
pub unsafe extern "C" fn pf_string_free(s: *mut c_char) -> pf_status {
    guard(|| {
        if s.is_null() {
            return Ok(());
        }
        handles::take_string(s).map(drop).ok_or_else(|| {
            Failure::new(
                PF_ERR_INVALID_HANDLE,
                "pf_string_free: the string was not handed out by polyfuse or is already freed",
            )
        })
    })
}

/// The message of the latest failed call on the calling thread (whatever
/// handle it was about, including calls refused for a bad handle), or NULL
/// when none failed. Free it with pf_string_free.
#[no_mangle]
pub extern "C" fn pf_last_error_message() -> *mut c_char {
    catch_unwind(|| {
        LAST_ERROR.with(|l| {
            l.borrow()
                .as_deref()
                .map_or(std::ptr::null_mut(), handles::give_string)
        })
    })
    .unwrap_or(std::ptr::null_mut())
}

/// The message of the latest call on `ctx` if it failed, or NULL when it
/// succeeded or `ctx` is not a live context. Free it with pf_string_free.
///
/// # Safety
/// Any pointer value is accepted; handles are never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn pf_context_error_message(ctx: *const pf_context) -> *mut c_char {
    catch_unwind(|| {
        context_of(ctx)
            .ok()
            .and_then(|c| lock(&c).last_error.clone())
            .map_or(std::ptr::null_mut(), |m| handles::give_string(&m))
    })
    .unwrap_or(std::ptr::null_mut())
}

/// The message of the latest call on `result` if it failed, or NULL
/// otherwise. Free it with pf_string_free.
///
/// # Safety
/// Any pointer value is accepted; handles are never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn pf_result_error_message(result: *const pf_result) -> *mut c_char {
    catch_unwind(|| {
        result_of(result)
            .ok()
            .and_then(|r| lock(&r.last_error).clone())
            .map_or(std::ptr::null_mut(), |m| handles::give_string(&m))
    })
    .unwrap_or(std::ptr::null_mut())
}

// ---------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------

/// Creates a context with the command line's defaults: target cpu, strategy
/// isl, tile 32, sinking on, GPU block and grid chosen by polyfuse,
/// shared-memory promotion on.
///
/// # Safety
/// `out` is null or points to writable memory for one handle.
#[no_mangle]
pub unsafe extern "C" fn pf_context_create(out: *mut *mut pf_context) -> pf_status {
    guard(|| {
        if out.is_null() {
            return Err(Failure::argument("the output pointer out is null"));
        }
        let state = ContextState {
            program: None,
            program_text: None,
            target: Target::Cpu,
            options: Options::default(),
            gpu: GpuOptions::default(),
            params: Vec::new(),
            directives: None,
            last_error: None,
            options_set: false,
            tile_set: false,
            cache: None,
            log: None,
            schedule_timeout: None,
            arch: None,
            device: None,
        };
        let id = handles::insert(Object::Context(Arc::new(Mutex::new(state))));
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { put(out, std::ptr::without_provenance_mut(id as usize), "out") }
    })
}

/// Destroys a context. Results compiled from it stay valid.
///
/// # Safety
/// Any pointer value is accepted; handles are never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn pf_context_destroy(ctx: *mut pf_context) -> pf_status {
    guard(|| {
        handles::remove(ctx.addr() as u64, |o| matches!(o, Object::Context(_)))
            .map(drop)
            .ok_or_else(|| invalid_handle("the pf_context"))
    })
}

/// Loads a program from JSON text (the program format), replacing any
/// program loaded before; messages name it `<json>`. The text ends at its
/// first NUL byte; to pass text whose length you know (a buffer that is not
/// NUL-terminated, or to have a NUL inside refused rather than the prefix
/// before it compiled), use pf_context_load_json_n.
///
/// # Safety
/// `json` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_load_json(
    ctx: *mut pf_context,
    json: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `json`.
        let json = unsafe { text(json, "json") }?;
        s.program = Some(frontend::load_str(json, "<json>")?);
        s.program_text = Some((json.to_string(), "<json>".to_string()));
        Ok(())
    })
}

/// Loads a program from the `len` bytes at `json` (UTF-8, no terminator
/// needed), replacing any program loaded before; messages name it `<json>`.
/// A NUL byte among them is an input error naming its offset.
///
/// # Safety
/// `json` is null or points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn pf_context_load_json_n(
    ctx: *mut pf_context,
    json: *const c_char,
    len: usize,
) -> pf_status {
    with_context(ctx, |s| {
        if json.is_null() && len > 0 {
            return Err(Failure::argument("json is null".to_string()));
        }
        // SAFETY: the header's contract for `json` and `len`.
        let bytes = unsafe { array(json.cast::<u8>(), len, "json") }?;
        if let Some(at) = bytes.iter().position(|b| *b == 0) {
            return Err(Failure::input(format!(
                "the program text has a NUL byte at offset {at} of {len}"
            )));
        }
        let json = std::str::from_utf8(bytes)
            .map_err(|e| Failure::argument(format!("json is not UTF-8: {e}")))?;
        s.program = Some(frontend::load_str(json, "<json>")?);
        s.program_text = Some((json.to_string(), "<json>".to_string()));
        Ok(())
    })
}

/// Loads a program file, replacing any program loaded before.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_load_file(
    ctx: *mut pf_context,
    path: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `path`.
        let path = unsafe { text(path, "path") }?;
        let program = frontend::load_file(Path::new(path))?;
        // The text the program was parsed from, for artifacts; the file
        // was just read, so reading it again fails only in a race.
        let text =
            std::fs::read_to_string(path).map_err(|e| Failure::input(format!("{path}: {e}")))?;
        s.program_text = Some((text, program.source.clone()));
        s.program = Some(program);
        Ok(())
    })
}

/// Sets the target: "cpu" (C source) or "cuda" (CUDA kernels).
///
/// # Safety
/// `target` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_target(
    ctx: *mut pf_context,
    target: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `target`.
        s.target = match unsafe { text(target, "target") }? {
            "cpu" => Target::Cpu,
            "cuda" => Target::Cuda,
            other => {
                return Err(Failure::input(format!(
                    "unknown target `{other}` (cpu, cuda)"
                )))
            }
        };
        Ok(())
    })
}

/// Sets the scheduling strategy: "isl", "min", "max" or "canonical" (see the
/// README).
///
/// # Safety
/// `strategy` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_strategy(
    ctx: *mut pf_context,
    strategy: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `strategy`.
        let name = unsafe { text(strategy, "strategy") }?;
        s.options_set = true;
        s.options.strategy = Strategy::parse(name).ok_or_else(|| {
            Failure::input(format!(
                "unknown strategy `{name}` (isl, min, max, canonical)"
            ))
        })?;
        Ok(())
    })
}

/// Gives a parameter a value, "NAME=VALUE" (a positive integer) as the
/// command line's --param does; overrides the file. Checked against the
/// program when it is compiled (the program may be loaded after), and at
/// once when one is loaded already.
///
/// # Safety
/// `assignment` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_param(
    ctx: *mut pf_context,
    assignment: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `assignment`.
        let a = unsafe { text(assignment, "assignment") }?;
        let (name, value) = frontend::parse_param_override(a)?;
        if let Some(p) = &s.program {
            frontend::apply_param_overrides(&mut p.clone(), &[(name.clone(), value)])?;
        }
        s.params.retain(|(n, _)| n != &name);
        s.params.push((name, value));
        Ok(())
    })
}

/// Sets parameter `name` to `value` (a positive integer), overriding the
/// file: pf_context_set_param without the text.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_param_value(
    ctx: *mut pf_context,
    name: *const c_char,
    value: i64,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `name`.
        let name = unsafe { text(name, "name") }?.to_string();
        if value < 1 {
            return Err(Failure::input(format!(
                "parameter {name} = {value}: parameters are positive integers"
            )));
        }
        if let Some(p) = &s.program {
            frontend::apply_param_overrides(&mut p.clone(), &[(name.clone(), value)])?;
        }
        s.params.retain(|(n, _)| n != &name);
        s.params.push((name, value));
        Ok(())
    })
}

/// Sets the tile sizes of each permutable band (the last repeats); `count`
/// 0 turns tiling off. Every size must be at least 1. Without this call
/// the "cuda" target chooses its tiles per kernel, as the command line does
/// without --tile (contractions and attention on tensor cores among them),
/// and the "cpu" target tiles by 32.
///
/// # Safety
/// `sizes` points to `count` values (may be null when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_tile(
    ctx: *mut pf_context,
    sizes: *const i64,
    count: usize,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `sizes` and `count`.
        let sizes = unsafe { array(sizes, count, "sizes") }?;
        if let Some(bad) = sizes.iter().find(|t| **t < 1) {
            return Err(Failure::input(format!(
                "tile size {bad} must be at least 1"
            )));
        }
        s.options_set = true;
        s.tile_set = true;
        s.options.tile = sizes.to_vec();
        Ok(())
    })
}

/// TC's imperfectly nested tiling (sink point loops below inner tile loops):
/// nonzero on (the default), zero off.
///
/// # Safety
/// Any pointer value is accepted for `ctx`.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_sink(ctx: *mut pf_context, enabled: c_int) -> pf_status {
    with_context(ctx, |s| {
        s.options_set = true;
        s.options.sink = enabled != 0;
        Ok(())
    })
}

fn gpu_sizes(sizes: &[u32], what: &str) -> Outcome<Vec<u32>> {
    crate::gpu::check_sizes(sizes, what).map_err(Failure::input)?;
    Ok(sizes.to_vec())
}

/// GPU threads per block along x, y, z (1 to 3 values); `count` 0:
/// automatic, chosen from the tile sizes (at most 256 threads).
///
/// # Safety
/// `sizes` points to `count` values (may be null when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_block(
    ctx: *mut pf_context,
    sizes: *const u32,
    count: usize,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `sizes` and `count`.
        s.options_set = true;
        s.gpu.block = gpu_sizes(unsafe { array(sizes, count, "sizes") }?, "block")?;
        Ok(())
    })
}

/// Upper bounds on GPU blocks along x, y, z; `count` 0: one block per tile.
///
/// # Safety
/// `sizes` points to `count` values (may be null when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_grid(
    ctx: *mut pf_context,
    sizes: *const u32,
    count: usize,
) -> pf_status {
    with_context(ctx, |s| {
        // SAFETY: the header's contract for `sizes` and `count`.
        s.options_set = true;
        s.gpu.grid = gpu_sizes(unsafe { array(sizes, count, "sizes") }?, "grid")?;
        Ok(())
    })
}

/// Shared-memory promotion of reused read-only tiles: nonzero on (the
/// default), zero off.
///
/// # Safety
/// Any pointer value is accepted for `ctx`.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_shared(ctx: *mut pf_context, enabled: c_int) -> pf_status {
    with_context(ctx, |s| {
        s.options_set = true;
        s.gpu.shared = enabled != 0;
        Ok(())
    })
}

/// The compilation cache pf_compile consults when no schedule option was set
/// on the context (tuned options from `polyfuse tune`; said to the log):
/// `path` to its SQLite file, or NULL for none. Default: none (the library
/// reads and writes no file of the user's unless asked).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_cache(
    ctx: *mut pf_context,
    path: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        s.cache = if path.is_null() {
            None
        } else {
            // SAFETY: the header's contract for `path`.
            Some(std::path::PathBuf::from(unsafe { text(path, "path") }?))
        };
        Ok(())
    })
}

/// Sends the library's notices to `callback` (see pf_log_fn), with `user`;
/// NULL: nowhere, the default. The library never writes to stderr.
///
/// # Safety
/// `callback` is null or a function that may be called with `user` and a
/// string for as long as the context and its compilations live; it must
/// not unwind (throw) into polyfuse.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_log(
    ctx: *mut pf_context,
    callback: pf_log_fn,
    user: *mut c_void,
) -> pf_status {
    with_context(ctx, |s| {
        s.log = callback.map(|callback| LogSink {
            callback,
            user: user.expose_provenance(),
        });
        Ok(())
    })
}

/// Seconds after which a compilation whose schedule isl has not finished is
/// replaced by one with minimal fusion (said to the log as a warning, as
/// the command line does). isl's scheduler can run for minutes, or not end,
/// on some fusion problems; the abandoned compilation is stopped. Default:
/// POLYFUSE_SCHEDULE_TIMEOUT, else 60.
///
/// # Safety
/// Any pointer value is accepted for `ctx`.
// The watchdog is pipeline::watch's.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_schedule_timeout(
    ctx: *mut pf_context,
    seconds: u32,
) -> pf_status {
    with_context(ctx, |s| {
        s.schedule_timeout = Some(u64::from(seconds));
        Ok(())
    })
}

/// The GPU architecture the result's launches compile for: "sm_NN" or
/// "sm_NNa" ("sm_90" runs the portable paths of kernels that also have a
/// Hopper-only one). NULL: the device's choice, as the command line makes
/// it ("sm_90a" where a kernel has a wgmma path on an sm_90 device), unless
/// POLYFUSE_CUDA_ARCH names one. A malformed name is refused here
/// (PF_ERR_INPUT); one the device cannot run fails the launch.
///
/// # Safety
/// `arch` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_arch(
    ctx: *mut pf_context,
    arch: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        s.arch = if arch.is_null() {
            None
        } else {
            // SAFETY: `arch` is NUL-terminated by the caller's contract.
            let a = unsafe { text(arch, "arch") }?;
            // The device's own capability decides at the launch; here only
            // the form is checked (any device of that architecture).
            let cc = a
                .strip_prefix("sm_")
                .map(|r| r.trim_end_matches('a'))
                .and_then(|d| d.parse::<i32>().ok())
                .unwrap_or(0);
            crate::runtime::cuda::arch_override(a, cc).map_err(Failure::from)?;
            Some(a.to_string())
        };
        Ok(())
    })
}

/// The CUDA device (driver ordinal) a cuda result is meant for: the tuning
/// cache (pf_context_set_cache) is looked up for its architecture. -1, the
/// default: the device of the thread's current CUDA context at pf_compile,
/// else device 0. Launches run on the device of their stream or tensors
/// whatever this says. A value below -1 is refused (PF_ERR_INPUT); an
/// ordinal the driver does not have is refused at pf_compile's lookup (the
/// cache is then not used, said to the log).
///
/// # Safety
/// Any handle value is accepted.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_device(ctx: *mut pf_context, device: i32) -> pf_status {
    with_context(ctx, |s| {
        if device < -1 {
            return Err(Failure::input(format!(
                "device {device}: an ordinal (0, 1, ...) or -1 for the current context's"
            )));
        }
        s.device = (device >= 0).then_some(device);
        Ok(())
    })
}

/// Transformation directives as JSON text, used as the program's "schedule"
/// key (a list of steps, see the README: rolling-update, split-k,
/// privatize, tile); NULL clears them. Text that is not JSON is refused
/// here; a template pf_compile cannot apply makes it fail with
/// PF_ERR_INPUT (an illegal transformation is an input error).
///
/// # Safety
/// `json` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pf_context_set_directives(
    ctx: *mut pf_context,
    json: *const c_char,
) -> pf_status {
    with_context(ctx, |s| {
        if json.is_null() {
            s.directives = None;
            return Ok(());
        }
        // SAFETY: the header's contract for `json`.
        let text = unsafe { text(json, "json") }?;
        let v = serde_json::from_str(text)
            .map_err(|e| Failure::input(format!("directives: not valid JSON: {e}")))?;
        s.directives = Some(v);
        Ok(())
    })
}

/// Compiles the context's program under its options into a new result.
/// Contexts are independent: several threads may compile on several
/// contexts at once (calls on one context wait for each other).
///
/// # Safety
/// `out` is null or points to writable memory for one handle.
#[no_mangle]
pub unsafe extern "C" fn pf_compile(ctx: *mut pf_context, out: *mut *mut pf_result) -> pf_status {
    with_context(ctx, |s| {
        if out.is_null() {
            return Err(Failure::argument("the output pointer out is null"));
        }
        let result = compile_context(s)?;
        let id = handles::insert(Object::Result(Arc::new(result)));
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { put(out, std::ptr::without_provenance_mut(id as usize), "out") }
    })
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// Destroys a result. A result that launched kernels unloads its CUDA
/// modules here, and frees the workspaces it allocated, each with its
/// context current. When that context is the device's primary context
/// (cuDevicePrimaryCtxRetain, or the CUDA runtime's context), the result
/// holds a reference of its own on it from its first launch there until the
/// module is unloaded, so the caller may release the primary context
/// (cuDevicePrimaryCtxRelease, cudaDeviceReset) before or after destroying
/// the result. A context made with cuCtxCreate cannot be retained: destroy
/// the results that launched in it before cuCtxDestroy. The handle is
/// destroyed in every case; PF_ERR_ENVIRONMENT says that the driver refused
/// to unload a module (the message says why).
///
/// # Safety
/// Any pointer value is accepted; handles are never dereferenced.
// The retained primary contexts are launch.rs's.
#[no_mangle]
pub unsafe extern "C" fn pf_result_destroy(result: *mut pf_result) -> pf_status {
    guard(|| {
        let Some(Object::Result(r)) =
            handles::remove(result.addr() as u64, |o| matches!(o, Object::Result(_)))
        else {
            return Err(invalid_handle("the pf_result"));
        };
        // Unloaded here, not when the last reference drops, so that a
        // failure is reported (a launch on another thread that still holds
        // the result has finished once the lock is ours).
        let unloaded = lock(&r.modules).unload_all();
        unloaded.map_err(|e| Failure::environment(format!("CUDA driver: {e}")))
    })
}

/// Writes a string output.
///
/// # Safety
/// `out` is null or writable for one pointer.
unsafe fn put_string(out: *mut *mut c_char, s: &str) -> Outcome {
    if out.is_null() {
        return Err(Failure::argument("the output pointer out is null"));
    }
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { put(out, handles::give_string(s), "out") }
}

/// Where the result came from: 0 the context's options, 1 tuned options
/// from the cache (compiled now), 2 a compiled program from the cache, 3 an
/// artifact (pf_result_load).
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_from_cache(
    result: *const pf_result,
    out: *mut i32,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, r.from_cache, "out") }
    })
}

/// The target the result was compiled for: "cpu" or "cuda".
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_target(
    result: *const pf_result,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let t = match r.target {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
        };
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, t) }
    })
}

/// Number of CUDA kernels, to be launched in index order on one stream; 0
/// for the cpu target.
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_num_kernels(
    result: *const pf_result,
    out: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        let n = match r.target {
            Target::Cuda => r.compiled.cuda.as_ref().map_or(0, |c| c.kernels.len()),
            Target::Cpu => 0,
        };
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, n, "out") }
    })
}

/// The name of kernel `kernel`: its extern "C" __global__ function in the
/// CUDA source.
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_name(
    result: *const pf_result,
    kernel: usize,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let k = r.kernel(kernel)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, &k.name) }
    })
}

/// The complete CUDA source of every kernel (NVRTC or nvcc).
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_cuda_source(
    result: *const pf_result,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let c = r.cuda()?;
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, &c.source) }
    })
}

/// Threads per block of kernel `kernel`: block[0..2] = x, y, z.
///
/// # Safety
/// `block` is null or writable for three values.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_block(
    result: *const pf_result,
    kernel: usize,
    block: *mut u32,
) -> pf_status {
    with_result(result, |r| {
        let k = r.kernel(kernel)?;
        // SAFETY: the header's contract for `block`.
        unsafe { put(block.cast::<[u32; 3]>(), k.block, "block") }
    })
}

/// Blocks of kernel `kernel` for the given parameter values: grid[0..2] =
/// x, y, z. A zero dimension means there is nothing to do: skip the kernel.
/// A contraction whose reduction is split (sm_90 and later) declares its
/// cluster in the source (__cluster_dims__, blocks along z): launch it with
/// this grid as it is; cuLaunchKernel and <<<>>> both honour the declared
/// cluster.
///
/// # Safety
/// `params` points to `num_params` values; `grid` is null or writable for
/// three values.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_grid(
    result: *const pf_result,
    kernel: usize,
    params: *const i64,
    num_params: usize,
    grid: *mut u32,
) -> pf_status {
    with_result(result, |r| {
        let k = r.kernel(kernel)?;
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, num_params, "params") }?;
        let dims = k.grid_dims(&r.param_map(values)?)?;
        // SAFETY: the header's contract for `grid`.
        unsafe { put(grid.cast::<[u32; 3]>(), dims, "grid") }
    })
}

/// Bytes of dynamic shared memory to launch kernel `kernel` with, and bytes
/// of static shared memory it declares; either output may be NULL.
///
/// # Safety
/// Each output is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_shared_memory(
    result: *const pf_result,
    kernel: usize,
    dynamic_bytes: *mut usize,
    static_bytes: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        let k = r.kernel(kernel)?;
        if !dynamic_bytes.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { dynamic_bytes.write(k.dynamic_shared) };
        }
        if !static_bytes.is_null() {
            // SAFETY: as above.
            unsafe { static_bytes.write(k.static_shared) };
        }
        Ok(())
    })
}

/// 1 when kernel `kernel` is a programmatic dependent of the kernel before
/// it (0 otherwise; every kernel of this version is): its first statement
/// waits (griddepcontrol.wait, sm_90 and later) for that kernel, whichever
/// it is, to finish, so it may be launched with
/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION to overlap that
/// kernel's end, as pf_result_launch does on compute capability 9.0 and
/// later. A plain launch is correct too.
///
/// # Safety
/// `out` is writable for one value.
// See gpu::Kernel::dependent.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_dependent(
    result: *const pf_result,
    kernel: usize,
    out: *mut i32,
) -> pf_status {
    with_result(result, |r| {
        let k = r.kernel(kernel)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, i32::from(k.dependent), "out") }
    })
}

/// Number of TMA tensor maps kernel `kernel` takes (0 for a kernel without
/// Hopper's bulk tensor copies). A kernel with maps takes them after its
/// pf_result_num_args arguments, in index order, each by value as a
/// `const __grid_constant__ PfTensorMap` parameter, where
/// `struct __align__(64) PfTensorMap { unsigned long long opaque[16]; }` is
/// the driver's 128-byte CUtensorMap. pf_result_launch and its variants
/// pass them; a caller that launches kernels itself gets each from
/// pf_result_kernel_tensor_map.
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_num_tensor_maps(
    result: *const pf_result,
    kernel: usize,
    out: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        let k = r.kernel(kernel)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, k.tensor_maps.len(), "out") }
    })
}

/// Tensor map `index` of kernel `kernel` (see
/// pf_result_kernel_num_tensor_maps), encoded with cuTensorMapEncodeTiled
/// for the buffers in `args`: one device pointer per tensor argument, temps
/// included (a temp at its place in the workspace), in argument order, as
/// pf_result_launch's device_ptrs; `num_args` is their number. Writes the
/// map's 128 bytes to `out`, which must be aligned to 64 bytes; pass a
/// pointer to them as the kernel's parameter after its pf_result_num_args
/// arguments (cuLaunchKernel's kernelParams). The map depends on its
/// tensor's pointer alone: encode it again when that pointer changes.
/// PF_ERR_INVALID_ARGUMENT for an index out of range, a `num_args` that is
/// not the number of tensor arguments, a NULL pointer for the map's tensor,
/// or an `out` that is NULL or misaligned; PF_ERR_INPUT when the tensor's
/// pointer is not 16-byte aligned (TMA needs it); PF_ERR_ENVIRONMENT
/// without a CUDA driver.
///
/// # Safety
/// `args` points to `num_args` pointers; `out` is null or writable for 128
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn pf_result_kernel_tensor_map(
    result: *const pf_result,
    kernel: usize,
    index: usize,
    args: *const *const c_void,
    num_args: usize,
    out: *mut c_void,
) -> pf_status {
    with_result(result, |r| {
        let (map, at) = r.tensor_map(kernel, index)?;
        // SAFETY: the header's contract for `args`.
        let ptrs = unsafe { array(args, num_args, "args") }?;
        let tensors = r.tensor_count();
        if num_args != tensors {
            return Err(Failure::argument(format!(
                "{num_args} pointers given; the result has {tensors} tensor arguments"
            )));
        }
        let address = ptrs[at].addr() as u64;
        if address == 0 {
            return Err(Failure::argument(format!(
                "the pointer for tensor {} is null, and kernel {kernel}'s map {index} maps it",
                map.tensor
            )));
        }
        if out.is_null() || !out.addr().is_multiple_of(64) {
            return Err(Failure::argument(format!(
                "out at {:#x} is null or not aligned to 64 bytes, as a CUtensorMap is",
                out.addr()
            )));
        }
        let value = launch::encode_map(map, address)?;
        // SAFETY: non-null and aligned (checked above), writable for 128
        // bytes by the header's contract.
        unsafe { out.cast::<[u64; 16]>().write(value.0) };
        Ok(())
    })
}

/// Number of parameters without a compile-time value: the values every
/// `params` array of this result holds.
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_num_params(
    result: *const pf_result,
    out: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, r.symbolic.len(), "out") }
    })
}

/// The name of parameter `index` (of those without a compile-time value).
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_param_name(
    result: *const pf_result,
    index: usize,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let name = r.symbolic.get(index).ok_or_else(|| {
            Failure::argument(format!(
                "parameter index {index} is out of range (0..{})",
                r.symbolic.len()
            ))
        })?;
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, name) }
    })
}

/// Number of kernel arguments, in order: one device pointer per tensor
/// (inputs, outputs, temps), then one per parameter without a compile-time
/// value, then (for a program whose recurrences run on host loops) one per
/// host loop iterator (PF_ARG_STEP). A kernel with tensor maps takes them
/// after these (pf_result_kernel_num_tensor_maps).
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_num_args(
    result: *const pf_result,
    out: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, r.args.len(), "out") }
    })
}

/// What argument `index` is: PF_ARG_TENSOR, PF_ARG_PARAM or PF_ARG_STEP.
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_kind(
    result: *const pf_result,
    index: usize,
    out: *mut pf_arg_kind,
) -> pf_status {
    with_result(result, |r| {
        let kind = match r.arg(index)? {
            KernelArg::Tensor { .. } => PF_ARG_TENSOR,
            KernelArg::Param { .. } => PF_ARG_PARAM,
            KernelArg::Step { .. } => PF_ARG_STEP,
        };
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, kind, "out") }
    })
}

/// The name of argument `index`: its tensor's, parameter's or host loop iterator's.
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_name(
    result: *const pf_result,
    index: usize,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let name = match r.arg(index)? {
            KernelArg::Tensor { name, .. }
            | KernelArg::Param { name }
            | KernelArg::Step { name } => name,
        };
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, name) }
    })
}

fn tensor_arg(r: &ResultState, index: usize) -> Outcome<(DType, &[String])> {
    match r.arg(index)? {
        KernelArg::Tensor { dtype, shape, .. } => Ok((*dtype, shape)),
        KernelArg::Param { name } => Err(Failure::argument(format!(
            "argument {index} is the parameter {name}, not a tensor"
        ))),
        KernelArg::Step { name } => Err(Failure::argument(format!(
            "argument {index} is the host loop's iterator {name}, not a tensor"
        ))),
    }
}

/// The element type of tensor argument `index` (tensor arguments only, as
/// for its rank and extents).
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_dtype(
    result: *const pf_result,
    index: usize,
    out: *mut pf_dtype,
) -> pf_status {
    with_result(result, |r| {
        let (t, _) = tensor_arg(r, index)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, dtype_code(t), "out") }
    })
}

/// The rank of tensor argument `index`.
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_rank(
    result: *const pf_result,
    index: usize,
    out: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        let (_, shape) = tensor_arg(r, index)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, shape.len(), "out") }
    })
}

/// Extent `dim` of tensor argument `index` as text in the parameters, e.g.
/// "M" or "H - 2".
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_dim(
    result: *const pf_result,
    index: usize,
    dim: usize,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let (_, shape) = tensor_arg(r, index)?;
        let e = shape.get(dim).ok_or_else(|| {
            Failure::argument(format!(
                "dimension {dim} is out of range (rank {})",
                shape.len()
            ))
        })?;
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, e) }
    })
}

/// Extent `dim` of tensor argument `index` for the given parameter values.
///
/// # Safety
/// `params` points to `num_params` values; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_extent(
    result: *const pf_result,
    index: usize,
    dim: usize,
    params: *const i64,
    num_params: usize,
    out: *mut i64,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, num_params, "params") }?;
        let v = r.extent(index, dim, &r.param_map(values)?)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, v, "out") }
    })
}

/// Bytes to allocate for tensor argument `index` (row-major, its storage
/// type: 2 bytes for f16 and bf16) for the given parameter values.
///
/// # Safety
/// `params` points to `num_params` values; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_bytes(
    result: *const pf_result,
    index: usize,
    params: *const i64,
    num_params: usize,
    out: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, num_params, "params") }?;
        let map = r.param_map(values)?;
        let bytes = r.bytes(index, &map)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, bytes, "out") }
    })
}

/// The role of tensor argument `index`: PF_ROLE_INPUT, PF_ROLE_OUTPUT or
/// PF_ROLE_TEMP (tensor arguments only).
///
/// # Safety
/// `out` is null or writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_role(
    result: *const pf_result,
    index: usize,
    out: *mut pf_role,
) -> pf_status {
    with_result(result, |r| {
        let role = r.role(index)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put(out, role, "out") }
    })
}

/// Every tensor argument in one call, for the given parameter values:
/// *count is set to their number and the first min(capacity, *count) are
/// written to `out` (NULL with capacity 0 asks for the count). A tensor of
/// more than PF_MAX_RANK dimensions is refused (PF_ERR_INVALID_ARGUMENT);
/// its extents are in pf_result_arg_extent. A rank-0 input is a runtime
/// scalar passed like any tensor: a device pointer to its one element.
///
/// # Safety
/// `params` points to `num_params` values; `out` is null or writable for
/// `capacity` entries; `count` is writable for one value.
#[no_mangle]
pub unsafe extern "C" fn pf_result_tensors(
    result: *const pf_result,
    params: *const i64,
    num_params: usize,
    out: *mut pf_tensor_info,
    capacity: usize,
    count: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, num_params, "params") }?;
        let map = r.param_map(values)?;
        let mut infos = Vec::new();
        for (i, a) in r.args.iter().enumerate() {
            let KernelArg::Tensor { dtype, shape, .. } = a else {
                continue;
            };
            if shape.len() > PF_MAX_RANK {
                return Err(Failure::argument(format!(
                    "tensor argument {i} has {} dimensions, more than PF_MAX_RANK ({PF_MAX_RANK})",
                    shape.len()
                )));
            }
            let mut extents = [0i64; PF_MAX_RANK];
            for (d, e) in extents.iter_mut().enumerate().take(shape.len()) {
                *e = r.extent(i, d, &map)?;
            }
            infos.push(pf_tensor_info {
                name: r.arg_names[i].as_ptr(),
                arg_index: i,
                role: r.role(i)?,
                dtype: dtype_code(*dtype),
                rank: shape.len(),
                extents,
                bytes: r.bytes(i, &map)?,
            });
        }
        if capacity > 0 && out.is_null() {
            return Err(Failure::argument("out is null but capacity is not 0"));
        }
        for (k, info) in infos.iter().take(capacity).enumerate() {
            // SAFETY: `out` is writable for `capacity` entries by the
            // header's contract, and k < capacity.
            unsafe { out.add(k).write(*info) };
        }
        // SAFETY: the header's contract for `count`.
        unsafe { put(count, infos.len(), "count") }
    })
}

/// The final schedule tree as text (what `polyfuse schedule` prints; for
/// the cuda target, the tree that was mapped to blocks and threads).
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_schedule_tree(
    result: *const pf_result,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let text = match (&r.compiled.gpu_tree, r.target) {
            (Some(t), Target::Cuda) => t.to_string(),
            _ => r.compiled.tree.to_string(),
        };
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, &text) }
    })
}

/// C source: void pf_kernel(const long *pf_params, void **pf_tensors), where
/// pf_params holds every parameter in file order and pf_tensors the tensor
/// arguments in order, after its prelude. Available for both targets.
///
/// # Safety
/// `out` is null or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pf_result_c_source(
    result: *const pf_result,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, &r.compiled.c_source()) }
    })
}

/// Launches kernel `kernel` on `stream` with the caller's device buffers:
/// `device_ptrs` holds one device pointer per tensor argument, temps
/// included, in argument order, each at least pf_result_arg_bytes large. A
/// temp no kernel touches (pf_result_arg_workspace_offset -1) may be NULL; a
/// NULL pointer for a tensor this kernel reads or writes is refused
/// (PF_ERR_INVALID_ARGUMENT). The kernel is compiled with NVRTC for the
/// stream's device on first use and cached per CUDA context. Returns once
/// the launch is queued; kernels of one result must be launched in index
/// order. A kernel inside a host loop (a recurrence stepped by the host) is
/// refused: its launches take the loop's iterator, which
/// pf_result_launch_all supplies. PF_ERR_ENVIRONMENT when there is no CUDA
/// driver, NVRTC or context.
///
/// Contexts and streams. A launch runs in the context of its stream
/// (cuStreamGetCtx). For the null stream (NULL, CU_STREAM_LEGACY or
/// CU_STREAM_PER_THREAD) it runs in the context the tensors live in: the
/// context the first tensor pointer the kernel uses was allocated in
/// (CU_POINTER_ATTRIBUTE_CONTEXT), or for memory the driver names no context
/// for (virtual memory management, e.g. PyTorch's expandable segments) the
/// primary context of its device (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
/// cuDevicePrimaryCtxRetain). The thread's current context is used only
/// when the launch has no pointer at all, and is left as it was. So a fresh
/// thread may launch on the default stream. A pointer the driver does not
/// know is PF_ERR_INVALID_ARGUMENT. The CUDA source is compiled with NVRTC
/// once per compute capability and loaded once per context; the module
/// stays loaded until pf_result_destroy (which says what that means for the
/// context's life).
///
/// Temps and the workspace. Inputs and outputs are the caller's. A temp
/// takes memory only when some kernel's code reads or writes it in global
/// memory (decided from the kernels' launch records when the result is
/// compiled; every temp of a cpu result); the others (attention's row
/// states and M_prev, an accumulator kept in registers) are never touched
/// and take none. The temps that take memory live in one workspace, in
/// argument order, each at a multiple of PF_WORKSPACE_ALIGN bytes:
/// pf_result_workspace_size gives its size, pf_result_arg_workspace_offset
/// where each temp lies. pf_result_launch_workspace takes the caller's
/// workspace, or NULL to use one the result allocates and keeps.
///
/// Tensor maps. A kernel with TMA copies (pf_result_kernel_num_tensor_maps
/// not 0) takes, after the arguments above, its tensor maps by value
/// (const __grid_constant__); the launch encodes each from the pointer of
/// its tensor (or the temp's place in the workspace), which must then be
/// 16-byte aligned (else PF_ERR_INPUT), and keeps it: a later launch of
/// the kernel with that tensor at the same address reuses the map.
///
/// # Safety
/// `params` and `device_ptrs` point to as many values as described;
/// `stream` is null or a live stream; the device pointers address buffers
/// of at least `pf_result_arg_bytes` bytes in the stream's context.
#[no_mangle]
pub unsafe extern "C" fn pf_result_launch(
    result: *const pf_result,
    kernel: usize,
    params: *const i64,
    device_ptrs: *mut *mut c_void,
    stream: CUstream,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `params` and `device_ptrs`.
        let (map, ptrs) = unsafe { launch_inputs(r, params, device_ptrs) }?;
        refuse_host_loop(r, kernel)?;
        let steps = vec![
            0;
            r.args
                .iter()
                .filter(|a| matches!(a, KernelArg::Step { .. }))
                .count()
        ];
        // SAFETY: the header's contract for `stream` and the buffers.
        unsafe {
            launch_kernel(
                r,
                kernel,
                (&map, &ptrs, &steps),
                launch::Workspace::Caller(0),
                stream,
            )
        }
    })
}

/// Bytes of the workspace for the given parameter values: the temps that
/// take memory (see pf_result_launch), each at a multiple of
/// PF_WORKSPACE_ALIGN; 0 when none does.
///
/// # Safety
/// `params` points to `num_params` values; `bytes` is null or writable.
// Which temps reach memory is gpu::Kernel::globals; issue 33 measured
// 3.0 GiB allocated for temps nothing touched before.
#[no_mangle]
pub unsafe extern "C" fn pf_result_workspace_size(
    result: *const pf_result,
    params: *const i64,
    num_params: usize,
    bytes: *mut usize,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, num_params, "params") }?;
        let (_, total) = r.workspace_layout(&r.param_map(values)?)?;
        // SAFETY: the header's contract for `bytes`.
        unsafe { put(bytes, total, "bytes") }
    })
}

/// Where temp argument `index` lies in the workspace: its byte offset, or
/// -1 when no kernel touches it (pass NULL for it). For callers that launch
/// the kernels themselves. Not a temp: PF_ERR_INVALID_ARGUMENT.
///
/// # Safety
/// `params` points to `num_params` values; `offset` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pf_result_arg_workspace_offset(
    result: *const pf_result,
    index: usize,
    params: *const i64,
    num_params: usize,
    offset: *mut i64,
) -> pf_status {
    with_result(result, |r| {
        if r.role(index)? != PF_ROLE_TEMP {
            let name = r.arg_names[index].to_string_lossy();
            return Err(Failure::argument(format!(
                "argument {index} ({name}) is not a temp: the caller passes it"
            )));
        }
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, num_params, "params") }?;
        let (offsets, _) = r.workspace_layout(&r.param_map(values)?)?;
        let at = match offsets[index] {
            Some(o) => i64::try_from(o).map_err(|_| Failure::input("the offset overflows"))?,
            None => -1,
        };
        // SAFETY: the header's contract for `offset`.
        unsafe { put(offset, at, "offset") }
    })
}

/// Launches kernel `kernel` with the caller's inputs and outputs only:
/// `io_ptrs` holds one device pointer per tensor argument whose role is not
/// PF_ROLE_TEMP, in argument order (the pf_tensor_info entries that are
/// inputs or outputs, in order). The temps live in `workspace`, a device
/// buffer of `workspace_bytes` (at least pf_result_workspace_size, aligned
/// to PF_WORKSPACE_ALIGN, else PF_ERR_INVALID_ARGUMENT), or, where
/// `workspace` is NULL, in a buffer the result allocates in the launch's
/// context on first need and keeps until pf_result_destroy. That buffer is
/// grown when larger sizes need more, after the context's queued work is
/// done (cuCtxSynchronize), and serves one stream at a time: launches that
/// may overlap on several streams, or run inside a CUDA graph capture
/// (where allocating is not allowed), pass their own workspace, or launch
/// once with the largest sizes before. Kernels of one launch sequence use
/// the same workspace. Contexts and streams as for pf_result_launch.
///
/// # Safety
/// `params` points to the symbolic parameters' values, `io_ptrs` to as
/// many pointers as the result has inputs and outputs; `stream` is null or
/// a live stream; the buffers are as large as `pf_result_arg_bytes` and
/// `workspace_bytes` say, in the stream's context.
#[no_mangle]
pub unsafe extern "C" fn pf_result_launch_workspace(
    result: *const pf_result,
    kernel: usize,
    params: *const i64,
    io_ptrs: *mut *mut c_void,
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: CUstream,
) -> pf_status {
    with_result(result, |r| {
        if r.target != Target::Cuda {
            return Err(Failure::argument(
                "the result was compiled for the cpu target; compile with target cuda to launch",
            ));
        }
        // SAFETY: the header's contract for `params`.
        let values = unsafe { array(params, r.symbolic.len(), "params") }?;
        let map = r.param_map(values)?;
        let (offsets, total) = r.workspace_layout(&map)?;
        let count = r.io_count();
        // SAFETY: the header's contract for `io_ptrs`.
        let given = unsafe { array(io_ptrs.cast_const(), count, "io_ptrs") }?;
        let given: Vec<u64> = given.iter().map(|p| p.addr() as u64).collect();
        let ptrs = r.tensor_places(&given, &offsets);
        let place = if workspace.is_null() {
            launch::Workspace::Own(total)
        } else {
            let address = workspace.addr();
            if workspace_bytes < total {
                return Err(Failure::argument(format!(
                    "the workspace has {workspace_bytes} bytes; these sizes need {total} (pf_result_workspace_size)"
                )));
            }
            if !address.is_multiple_of(PF_WORKSPACE_ALIGN) {
                return Err(Failure::argument(format!(
                    "the workspace at {address:#x} is not aligned to {PF_WORKSPACE_ALIGN} bytes"
                )));
            }
            launch::Workspace::Caller(address as u64)
        };
        refuse_host_loop(r, kernel)?;
        let steps = vec![
            0;
            r.args
                .iter()
                .filter(|a| matches!(a, KernelArg::Step { .. }))
                .count()
        ];
        // SAFETY: the header's contract for `stream` and the buffers.
        unsafe { launch_kernel(r, kernel, (&map, &ptrs, &steps), place, stream) }
    })
}

/// The result as an artifact: one JSON document (freed with pf_string_free)
/// holding the program's text and the values it was compiled with, the
/// compiled program (trees, C and CUDA source, launch records, tensors),
/// and PTX for each architecture of `archs` ("sm_90,sm_80": the devices'
/// architectures, comma-separated; NULL or "" for none), stored under the
/// architecture a launch on such a device compiles for ("sm_90a" on sm_90
/// for kernels with a wgmma path). Making PTX needs NVRTC, not a GPU
/// (PF_ERR_ENVIRONMENT without it). `polyfuse schedule --emit artifact`
/// writes the same document; pf_result_load reads it back.
///
/// # Safety
/// `archs` is null or a NUL-terminated string; `out` is null or writable.
// Issue 33, item 5.
#[no_mangle]
pub unsafe extern "C" fn pf_result_save(
    result: *const pf_result,
    archs: *const c_char,
    out: *mut *mut c_char,
) -> pf_status {
    with_result(result, |r| {
        let archs: Vec<String> = if archs.is_null() {
            Vec::new()
        } else {
            // SAFETY: the header's contract for `archs`.
            unsafe { text(archs, "archs") }?
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect()
        };
        if r.target == Target::Cpu && !archs.is_empty() {
            return Err(Failure::argument(
                "the result was compiled for the cpu target: it has no CUDA to make PTX of",
            ));
        }
        let arch = lock(&r.modules).arch.clone();
        let target = match r.target {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
        };
        let doc = crate::tune::aot::save(&r.source, &r.compiled, target, arch.as_deref(), &archs)?;
        // SAFETY: the header's contract for `out`.
        unsafe { put_string(out, &doc.to_string()) }
    })
}

/// A result from an artifact pf_result_save wrote (the `len` bytes at
/// `text`) without compiling: the program is parsed and the compiled
/// program taken from the artifact; no isl runs. Launches on a device whose
/// architecture the artifact has PTX for load that PTX without NVRTC (the
/// driver finishes it); on other devices they compile the CUDA source with
/// NVRTC as any result does. Not an artifact, or of another version:
/// PF_ERR_INPUT. Destroy it with pf_result_destroy.
///
/// # Safety
/// `text` points to `len` readable bytes; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pf_result_load(
    text: *const c_char,
    len: usize,
    out: *mut *mut pf_result,
) -> pf_status {
    guard(|| {
        if out.is_null() {
            return Err(Failure::argument("the output pointer out is null"));
        }
        // SAFETY: the header's contract for `text` and `len`.
        let bytes = unsafe { array(text.cast::<u8>(), len, "text") }?;
        let doc = std::str::from_utf8(bytes)
            .map_err(|e| Failure::argument(format!("the artifact is not UTF-8: {e}")))?;
        let loaded = crate::tune::aot::load(doc)?;
        let target = if loaded.target == "cuda" {
            Target::Cuda
        } else {
            Target::Cpu
        };
        let state = result_state(
            &loaded.program,
            loaded.compiled,
            target,
            3,
            loaded.arch,
            loaded.source,
        )?;
        lock(&state.modules).stored = loaded.ptx.into_iter().collect();
        let id = handles::insert(Object::Result(Arc::new(state)));
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { put(out, std::ptr::without_provenance_mut(id as usize), "out") }
    })
}

/// Launches one execution of the whole program on `stream`: every kernel in
/// index order, and the kernels of a host loop once per iteration with the
/// iterator as their PF_ARG_STEP argument. A program with loop blocks whose
/// loops carry a dependence (a recurrence) runs those loops on the host: its
/// kernels inside them cannot be launched with pf_result_launch (which
/// refuses them with PF_ERR_INVALID_ARGUMENT); launch it with this call.
/// For every other program it is the same as pf_result_launch of each
/// kernel in order. Arguments and errors as for pf_result_launch.
///
/// # Safety
/// As for `pf_result_launch`.
#[no_mangle]
pub unsafe extern "C" fn pf_result_launch_all(
    result: *const pf_result,
    params: *const i64,
    device_ptrs: *mut *mut c_void,
    stream: CUstream,
) -> pf_status {
    with_result(result, |r| {
        // SAFETY: the header's contract for `params` and `device_ptrs`.
        let (map, ptrs) = unsafe { launch_inputs(r, params, device_ptrs) }?;
        for l in r.cuda()?.launches(&map)? {
            // SAFETY: the header's contract for `stream` and the buffers.
            unsafe {
                launch_kernel(
                    r,
                    l.kernel,
                    (&map, &ptrs, &l.steps),
                    launch::Workspace::Caller(0),
                    stream,
                )
            }?;
        }
        Ok(())
    })
}

/// Refuses kernel `kernel` where it runs inside a host loop (a recurrence
/// stepped by the host): its launches take the loop's iterator, which only
/// `pf_result_launch_all` supplies.
fn refuse_host_loop(r: &ResultState, kernel: usize) -> Outcome {
    r.kernel(kernel)?;
    if let Some(l) = r
        .cuda()?
        .host_loops
        .iter()
        .find(|l| (l.first..l.end).contains(&kernel))
    {
        return Err(Failure::argument(format!(
            "kernel {kernel} runs inside the host loop over {} ({}): launch the program with pf_result_launch_all",
            l.iterator,
            l.step.mark()
        )));
    }
    Ok(())
}

/// Where a launch finds a tensor: the caller's device pointer, or an offset
/// in the workspace.
type TensorPlace = Result<u64, usize>;

/// Every parameter's value and each tensor's place (the caller's device
/// pointer, every tensor in argument order) of a launch.
///
/// # Safety
/// `params` and `device_ptrs` point to as many values as
/// `pf_result_launch` describes.
unsafe fn launch_inputs(
    r: &ResultState,
    params: *const i64,
    device_ptrs: *mut *mut c_void,
) -> Outcome<(HashMap<String, i64>, Vec<TensorPlace>)> {
    if r.target != Target::Cuda {
        return Err(Failure::argument(
            "the result was compiled for the cpu target; compile with target cuda to launch",
        ));
    }
    // SAFETY: the caller's contract for `params`.
    let values = unsafe { array(params, r.symbolic.len(), "params") }?;
    let map = r.param_map(values)?;
    // SAFETY: the caller's contract for `device_ptrs`.
    let ptrs = unsafe { array(device_ptrs.cast_const(), r.tensor_count(), "device_ptrs") }?;
    Ok((map, ptrs.iter().map(|p| Ok(p.addr() as u64)).collect()))
}

/// Launches kernel `kernel` with `(parameters, tensor places, host loop
/// iterators)` (one iterator per `KernelArg::Step`) and the temps in
/// `place`.
///
/// # Safety
/// `stream` is null or a live stream; the device pointers (and a caller's
/// workspace) address buffers large enough in the stream's context.
unsafe fn launch_kernel(
    r: &ResultState,
    kernel: usize,
    (map, ptrs, steps): (&HashMap<String, i64>, &[TensorPlace], &[i64]),
    place: launch::Workspace,
    stream: CUstream,
) -> Outcome {
    let k = r.kernel(kernel)?;
    let (args, probe) = r.launch_args(kernel, ptrs, map, steps)?;
    let probe = probe.or(match place {
        launch::Workspace::Caller(a) if a != 0 => Some(a),
        _ => None,
    });
    let grid = k.grid_dims(map)?;
    if grid.contains(&0) {
        return Ok(());
    }
    let cuda = r.cuda()?;
    let mut modules = lock(&r.modules);
    // SAFETY: the caller's contract for `stream` and the buffers.
    unsafe { modules.launch(cuda, kernel, grid, k, &args, place, probe, stream) }
}

#[cfg(test)]
mod tests {
    //! How a launch with inputs and outputs only places each tensor, on a
    //! result compiled here (no GPU needed: the arguments are built before
    //! the driver is called).
    use super::*;
    use crate::runtime::cuda::TensorMapValue;

    fn softmax_result(target: Target) -> ResultState {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/softmax.json");
        let state = ContextState {
            program: Some(frontend::load_file(Path::new(path)).unwrap()),
            program_text: Some((std::fs::read_to_string(path).unwrap(), path.into())),
            target,
            options: Options::default(),
            gpu: GpuOptions::default(),
            params: vec![("N".into(), 9)],
            directives: None,
            last_error: None,
            options_set: false,
            tile_set: false,
            cache: None,
            log: None,
            schedule_timeout: None,
            arch: None,
            device: None,
        };
        compile_context(&state).unwrap_or_else(|f| panic!("{}", f.message))
    }

    #[test]
    fn inputs_and_outputs_come_from_the_caller_temps_from_the_workspace() {
        let r = softmax_result(Target::Cuda);
        let map = r.param_map(&[]).unwrap();
        let (offsets, total) = r.workspace_layout(&map).unwrap();
        // X and Y are the caller's; M, E, S are temps.
        assert_eq!(r.io_count(), 2);
        let places = r.tensor_places(&[0xa000, 0xb000], &offsets);
        let names: Vec<&str> = r
            .args
            .iter()
            .filter_map(|a| match a {
                KernelArg::Tensor { name, .. } => Some(name.as_str()),
                KernelArg::Param { .. } | KernelArg::Step { .. } => None,
            })
            .collect();
        assert_eq!(names, ["X", "Y", "M", "E", "S"]);
        assert_eq!(places[..2], [Ok(0xa000), Ok(0xb000)]);
        let mut end = 0;
        for (i, place) in places.iter().enumerate().skip(2) {
            match place {
                Err(offset) => {
                    assert_eq!(offset % PF_WORKSPACE_ALIGN, 0);
                    assert!(*offset >= end, "{} overlaps", names[i]);
                    end = offset + r.bytes(i, &map).unwrap();
                }
                Ok(p) => {
                    assert_eq!(*p, 0);
                    assert!(!r.in_memory[i], "{} is touched but got no place", names[i]);
                }
            }
        }
        assert_eq!(end, total);
        // Every kernel gets a non-null pointer or a workspace place for
        // each tensor it touches.
        for k in 0..r.kernel_globals.len() {
            let (args, probe) = r.launch_args(k, &places, &map, &[]).unwrap();
            // The null stream's context is found from one of the caller's
            // pointers.
            assert!(
                probe.is_some_and(|p| p == 0xa000 || p == 0xb000),
                "{probe:?}"
            );
            for &i in &r.kernel_globals[k] {
                assert_ne!(args[i], launch::Arg::Pointer(0), "kernel {k}, {}", names[i]);
            }
        }
    }

    #[test]
    fn a_kernels_tensor_map_is_encoded_from_the_callers_pointer() {
        let mut r = softmax_result(Target::Cuda);
        let cuda = r.compiled.cuda.as_mut().unwrap();
        cuda.kernels[0].tensor_maps.push(crate::gpu::TensorMap {
            tensor: "Y".into(),
            dtype: DType::F16,
            dims: vec![64, 9],
            strides: vec![128],
            boxes: vec![64, 9],
            swizzle: 128,
        });
        let r = handles::insert(Object::Result(Arc::new(r)));
        let r: *const pf_result = std::ptr::without_provenance(r as usize);
        let ptr = |a: usize| std::ptr::without_provenance::<c_void>(a);
        let good = [ptr(0xa000), ptr(0xb000), ptr(0), ptr(0), ptr(0)];
        let mut out = TensorMapValue([0; 16]);
        let out_ptr: *mut c_void = std::ptr::from_mut(&mut out).cast();
        let call = |k: usize, i: usize, args: &[*const c_void], out: *mut c_void| {
            // SAFETY: `args` holds `args.len()` pointers; `out` is null or
            // 128 writable bytes (the misaligned one is refused unwritten).
            unsafe { pf_result_kernel_tensor_map(r, k, i, args.as_ptr(), args.len(), out) }
        };
        let mut n = 9;
        // SAFETY: valid handle and output place.
        assert_eq!(
            unsafe { pf_result_kernel_num_tensor_maps(r, 0, &mut n) },
            PF_OK
        );
        assert_eq!(n, 1);
        // Y is the second tensor: its pointer, misaligned, is the input's
        // fault.
        let bad = [ptr(0xa000), ptr(0xb008), ptr(0), ptr(0), ptr(0)];
        assert_eq!(call(0, 0, &bad, out_ptr), PF_ERR_INPUT);
        let message = take_error();
        assert!(message.contains("tensor Y's buffer at 0xb008"), "{message}");
        // The caller's other mistakes, before any driver call.
        assert_eq!(call(0, 1, &good, out_ptr), PF_ERR_INVALID_ARGUMENT);
        assert!(take_error().contains("tensor map index 1 is out of range (0..1)"));
        assert_eq!(call(0, 0, &good[..4], out_ptr), PF_ERR_INVALID_ARGUMENT);
        assert_eq!(
            call(
                0,
                0,
                &[ptr(0xa000), ptr(0), ptr(0), ptr(0), ptr(0)],
                out_ptr
            ),
            PF_ERR_INVALID_ARGUMENT
        );
        let misaligned = out_ptr.wrapping_byte_add(8);
        assert_eq!(call(0, 0, &good, misaligned), PF_ERR_INVALID_ARGUMENT);
        assert_eq!(
            call(0, 0, &good, std::ptr::null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        // Encoded where there is a driver, an environment error elsewhere.
        let st = call(0, 0, &good, out_ptr);
        if crate::runtime::cuda::probe_driver().is_ok() {
            assert_eq!(st, PF_OK, "{}", take_error());
            assert_ne!(out.0, [0; 16]);
        } else {
            assert_eq!(st, PF_ERR_ENVIRONMENT);
        }
        // SAFETY: destroyed once.
        assert_eq!(unsafe { pf_result_destroy(r.cast_mut()) }, PF_OK);
    }

    /// The calling thread's last error message.
    fn take_error() -> String {
        LAST_ERROR
            .with(|l| l.borrow_mut().take())
            .unwrap_or_default()
    }

    #[test]
    fn a_cpu_result_places_every_temp() {
        let r = softmax_result(Target::Cpu);
        let map = r.param_map(&[]).unwrap();
        let (offsets, total) = r.workspace_layout(&map).unwrap();
        assert_eq!(offsets.iter().filter(|o| o.is_some()).count(), 3);
        // M and S are 9 floats, E 9 x 256: each temp aligned.
        assert!(total >= 9 * 4 + 9 * 256 * 4 + 9 * 4);
    }
}
