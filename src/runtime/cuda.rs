//! The CUDA target: the program's CUDA ([`crate::gpu::CudaProgram`]) is
//! compiled by NVRTC for the device's architecture, loaded and launched
//! through the CUDA driver (cudarc), and checked against the same f64
//! reference as the CPU target, on the same inputs.
//!
//! Nothing here needs a GPU at build time: the driver and NVRTC are loaded
//! when first used ([`sys`]). A machine without them gets
//! [`Error::Environment`] (exit status 3), never a panic.
//!
//! One execution is the program's kernels launched in order on one stream,
//! those inside host loops once per iteration with the iterator's value
//! (`CudaProgram::launches`); a kernel whose grid is empty at the run's
//! parameter values is skipped. A kernel with TMA copies takes its tensor
//! maps after the arguments, encoded once for the run's buffers.
//! Before the checked execution every output and temporary is filled with
//! 0xFF bytes (NaN in every float type), so an element no kernel writes
//! fails the check instead of passing by luck.

mod sys;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::cpu::{self, RunOptions};
use super::data;
use super::RunReport;
use crate::error::{Error, Result};
use crate::frontend::ast::TensorRole;
use crate::gpu::{CudaProgram, KernelArg, TensorMap};
use crate::pipeline::Compiled;

pub use sys::TensorMapValue;

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_DYNAMIC_SHARED: usize = 48 * 1024;

/// Untimed executions before the timed ones (`--bench`): the first launch
/// of a module pays for loading it, and clocks need to ramp up.
const WARMUP_RUNS: usize = 3;

const CPU_HINT: &str = "--target cpu runs the program on the CPU";

/// The GPU of a run: its context, stream and description.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    /// Compute capability as one number: 90 for sm_90.
    cc: i32,
}

/// Checks that the CUDA driver can be loaded, without touching a device:
/// the command line calls it before compiling, so that a machine without a
/// driver fails at once with exit status 3.
pub fn probe_driver() -> Result<()> {
    match sys::load_driver(&driver_dirs()) {
        Ok(_) => Ok(()),
        Err(searched) => Err(Error::Environment(format!(
            "no CUDA driver found: libcuda.so.1 is not on the loader's path (LD_LIBRARY_PATH, \
             the ld.so cache){}; {CPU_HINT}",
            searched_text(searched)
        ))),
    }
}

/// A CUDA driver error as `CUDA_ERROR_NAME: description` (for the C ABI's
/// launches, which call the driver directly).
pub fn describe_driver_error(e: &cudarc::driver::DriverError) -> String {
    sys::describe(e)
}

/// Checks that a caller's buffer at `address` suits `map` (TMA wants it
/// 16-byte aligned), so that the C ABI can tell its caller's mistake from
/// a failure of [`encode_tensor_map`].
pub fn check_tensor_address(map: &TensorMap, address: u64) -> std::result::Result<(), String> {
    sys::check_address(map, address)
}

/// `map` encoded for the buffer at device `address`: the value of a
/// kernel's `PfTensorMap` parameter. An environment error without a
/// driver; otherwise an internal one, since polyfuse made the map and the
/// runtime's own buffers are aligned (the C ABI checks its callers'
/// addresses first, with [`check_tensor_address`]).
pub fn encode_tensor_map(map: &TensorMap, address: u64) -> Result<TensorMapValue> {
    probe_driver()?;
    // The driver refuses every call before cuInit; a C ABI caller may ask
    // for a map before anything else.
    cudarc::driver::result::init()
        .map_err(|e| Error::Environment(format!("cuInit failed: {}", sys::describe(&e))))?;
    sys::encode_tensor_map(map, address)
        .map(TensorMapValue)
        .map_err(Error::Internal)
}

/// Loads NVRTC or says where it looked.
fn require_nvrtc() -> Result<&'static str> {
    match sys::load_nvrtc(&nvrtc_dirs()) {
        Ok(found) => Ok(found.as_str()),
        Err(searched) => Err(Error::Environment(format!(
            "NVRTC not found: libnvrtc.so.13 (or another version's) is not on the loader's \
             path (LD_LIBRARY_PATH, the ld.so cache){}; install the CUDA toolkit or the \
             nvidia-cuda-nvrtc Python wheel, or put its lib folder on LD_LIBRARY_PATH",
            searched_text(searched)
        ))),
    }
}

fn searched_text(searched: &[String]) -> String {
    if searched.is_empty() {
        String::new()
    } else {
        format!(" nor in {}", searched.join(", "))
    }
}

fn open_gpu(device: usize) -> Result<Gpu> {
    probe_driver()?;
    let ctx = sys::context(device).map_err(|e| {
        Error::Environment(format!(
            "no usable CUDA device (the driver says: {e}); {CPU_HINT}"
        ))
    })?;
    let env = |what: &str, e: cudarc::driver::DriverError| {
        Error::Environment(format!(
            "cannot read the device's {what}: {}",
            sys::describe(&e)
        ))
    };
    let name = ctx.name().map_err(|e| env("name", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| env("compute capability", e))?;
    let stream = ctx.default_stream();
    Ok(Gpu {
        ctx,
        stream,
        name,
        cc: major * 10 + minor,
    })
}

/// Compiles CUDA `source` to PTX for `arch` (`sm_90`, `sm_90a` or
/// `compute_90`) with NVRTC alone: no GPU or driver is needed, which is how
/// CI checks that the printed CUDA compiles.
pub fn compile_ptx(source: &str, arch: &str) -> Result<String> {
    let virt = virtual_arch(arch)?;
    require_nvrtc()?;
    let out = nvrtc(source, &format!("--gpu-architecture={virt}"))?;
    out.ptx.ok_or_else(|| {
        Error::Internal(format!(
            "NVRTC compiled for {virt} but returned no PTX (log: {})",
            out.log.trim()
        ))
    })
}

/// `sm_90` -> `compute_90`; `compute_XX` as is; anything else is refused.
fn virtual_arch(arch: &str) -> Result<String> {
    let bad = || Error::Input {
        file: "--arch".into(),
        message: format!("`{arch}` is not a GPU architecture (write it as sm_90 or compute_90)"),
    };
    let (_, rest) = arch
        .split_once('_')
        .filter(|(p, _)| *p == "sm" || *p == "compute")
        .ok_or_else(bad)?;
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    Ok(format!("compute_{rest}"))
}

/// Compiles with NVRTC under `arch_option`, with the include folders that
/// hold `cuda_fp16.h`; if that fails, once more without them (NVRTC 12.8
/// and later carry those headers built in, and a mismatched toolkit's copy
/// can break them). On failure the source is written to a file that the
/// error names, with NVRTC's log.
fn nvrtc(source: &str, arch_option: &str) -> Result<sys::NvrtcOutput> {
    let includes = include_dirs();
    let options = |with_includes: bool| {
        let mut o = vec![arch_option.to_string(), "--std=c++17".to_string()];
        if with_includes {
            o.extend(
                includes
                    .iter()
                    .map(|d| format!("--include-path={}", d.display())),
            );
        }
        o
    };
    let first = sys::nvrtc_compile(source, "polyfuse.cu", &options(true));
    let failure = match first {
        Ok(out) => return Ok(out),
        Err(f) if includes.is_empty() => f,
        Err(f) => match sys::nvrtc_compile(source, "polyfuse.cu", &options(false)) {
            Ok(out) => return Ok(out),
            Err(_) => f,
        },
    };
    let path = std::env::temp_dir().join(format!("polyfuse-{}.cu", std::process::id()));
    let saved = match std::fs::write(&path, source) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(could not save it to {}: {e})", path.display()),
    };
    let version = sys::nvrtc_version()
        .map(|(a, b)| format!("NVRTC {a}.{b}"))
        .unwrap_or_else(|| "NVRTC".into());
    Err(Error::Internal(format!(
        "{version} rejected the generated CUDA ({}; options {}); source: {saved}\n{}",
        failure.error,
        options(true).join(" "),
        failure.log.trim_end()
    )))
}

/// The environment variable that names the architecture to compile for
/// instead of the device's own choice: `sm_90` on an H100 runs the
/// portable paths of kernels that also have a Hopper-only one (`wgmma`
/// under `__CUDA_ARCH_FEAT_SM90_ALL`), which is how those are checked on
/// the device.
pub const ARCH_VARIABLE: &str = "POLYFUSE_CUDA_ARCH";

/// The architecture `value` of [`ARCH_VARIABLE`] names (`sm_NN` or
/// `sm_NNa`), refused unless the device (compute capability `cc`, 90 for
/// 9.0) can run its code: an `a` architecture only on its own device, any
/// other one at or below the device's.
pub fn arch_override(value: &str, cc: i32) -> Result<String> {
    let bad = |why: &str| Error::Input {
        file: ARCH_VARIABLE.into(),
        message: format!("`{value}` {why}"),
    };
    let rest = value
        .strip_prefix("sm_")
        .ok_or_else(|| bad("is not a GPU architecture (write it as sm_90 or sm_90a)"))?;
    let (digits, specific) = match rest.strip_suffix('a') {
        Some(d) => (d, true),
        None => (rest, false),
    };
    let n: i32 = digits
        .parse()
        .ok()
        .filter(|_| digits.len() >= 2 && digits.chars().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| bad("is not a GPU architecture (write it as sm_90 or sm_90a)"))?;
    if n > cc || (specific && n != cc) {
        return Err(bad(&format!(
            "cannot run on this device (sm_{cc}): name its own architecture or an older one"
        )));
    }
    // Machine code runs only on its own major version; for an older one
    // the driver compiles the PTX.
    if n / 10 == cc / 10 {
        Ok(value.to_string())
    } else {
        Ok(format!("compute_{rest}"))
    }
}

/// The architecture `source` is compiled for on a device of compute
/// capability `cc` (90 for 9.0) that NVRTC knows: `requested` (the value
/// of [`ARCH_VARIABLE`]) where given and runnable there; else `sm_90a`
/// on an sm_90 device for kernels with a Hopper-only path (`wgmma`, under
/// `__CUDA_ARCH_FEAT_SM90_ALL`: compiled for plain `sm_90` that path is
/// left out, and an f16 gemm ran 3.3 times slower through the C ABI), the
/// code then running on that architecture only, which is the device's;
/// else the device's own. The command line and the C ABI both choose here.
pub fn target_arch(source: &str, cc: i32, requested: Option<&str>) -> Result<String> {
    if let Some(value) = requested {
        return arch_override(value, cc);
    }
    Ok(
        if cc == 90 && source.contains("__CUDA_ARCH_FEAT_SM90_ALL") {
            "sm_90a".to_string()
        } else {
            format!("sm_{cc}")
        },
    )
}

/// The value of [`ARCH_VARIABLE`], if set.
pub fn requested_arch() -> Option<String> {
    std::env::var_os(ARCH_VARIABLE).map(|v| v.to_string_lossy().into_owned())
}

/// `source` compiled by NVRTC for `arch`: its machine code (CUBIN) where
/// NVRTC gives one (a real architecture), else its PTX.
fn module_for(source: &str, arch: String) -> Result<(Ptx, String)> {
    let out = nvrtc(source, &format!("--gpu-architecture={arch}"))?;
    match (out.cubin, out.ptx) {
        (Some(cubin), _) => Ok((Ptx::from_binary(cubin), arch)),
        (None, Some(ptx)) => Ok((Ptx::from_src(ptx), arch)),
        (None, None) => Err(Error::Internal(
            "NVRTC returned neither CUBIN nor PTX".into(),
        )),
    }
}

/// Compiles the program for the device: machine code (CUBIN) when NVRTC
/// knows the device's architecture, else PTX for the newest architecture
/// it knows below it, which the driver compiles further.
fn compile_for(gpu: &Gpu, source: &str) -> Result<(Ptx, String)> {
    require_nvrtc()?;
    let requested = requested_arch();
    let archs = sys::nvrtc_archs();
    let known = archs.is_empty() || archs.contains(&gpu.cc);
    if known || requested.is_some() {
        let arch = target_arch(source, gpu.cc, requested.as_deref())?;
        return module_for(source, arch);
    }
    let below = archs.iter().copied().filter(|a| *a < gpu.cc).max();
    let Some(a) = below else {
        return Err(Error::Environment(format!(
            "this NVRTC cannot compile for sm_{} (it knows sm_{:?}); install an NVRTC that \
             supports the device",
            gpu.cc, archs
        )));
    };
    let out = nvrtc(source, &format!("--gpu-architecture=compute_{a}"))?;
    let ptx = out
        .ptx
        .ok_or_else(|| Error::Internal("NVRTC returned no PTX".into()))?;
    Ok((Ptx::from_src(ptx), format!("compute_{a}")))
}

/// One kernel, ready to launch.
struct Launch {
    name: String,
    func: CudaFunction,
    cfg: LaunchConfig,
    /// As a programmatic dependent of the kernel before it (the kernel
    /// asks for it and the device has compute capability 9.0 or later).
    dependent: bool,
}

impl Launch {
    fn launch(&self, stream: &Arc<CudaStream>, args: &[sys::Arg]) -> Result<()> {
        let launched = if self.dependent {
            sys::launch_dependent(stream, &self.func, self.cfg, args)
        } else {
            sys::launch(stream, &self.func, self.cfg, args)
        };
        launched
            .map_err(|e| Error::Internal(format!("launching {}: {}", self.name, sys::describe(&e))))
    }
}

/// One execution of `launches` captured in a CUDA graph on a stream of its
/// own (the legacy default stream that runs everything else cannot be
/// captured), after the default stream's work; `None` where the driver
/// refuses the capture or the instantiation.
fn capture(
    gpu: &Gpu,
    run_all: &dyn Fn(&Arc<CudaStream>) -> Result<()>,
) -> Option<(Arc<CudaStream>, cudarc::driver::CudaGraph)> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    gpu.stream.synchronize().ok()?;
    let stream = gpu.ctx.new_stream().ok()?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ok()?;
    let launched = run_all(&stream);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    match (launched, graph) {
        (Ok(()), Ok(Some(graph))) => Some((stream, graph)),
        _ => None,
    }
}

/// Loads the module and prepares every kernel whose grid is not empty
/// (`None` for the others, by kernel index), checking its launch bounds
/// against the device.
fn prepare(
    gpu: &Gpu,
    program: &CudaProgram,
    compiled: &Compiled,
    ptx: Ptx,
) -> Result<Vec<Option<Launch>>> {
    let module = gpu.ctx.load_module(ptx).map_err(|e| {
        let what = sys::describe(&e);
        let versions = format!(
            "NVRTC {}, driver CUDA {}",
            sys::nvrtc_version()
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_else(|| "?".into()),
            sys::driver_version()
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
                .unwrap_or_else(|| "?".into())
        );
        if what.contains("UNSUPPORTED_PTX_VERSION")
            || what.contains("NO_BINARY_FOR_GPU")
            || what.contains("INVALID_IMAGE")
        {
            Error::Environment(format!(
                "the driver cannot load what NVRTC produced ({what}; {versions}): use an NVRTC \
                 no newer than the driver"
            ))
        } else {
            Error::Internal(format!(
                "loading the compiled module failed: {what} ({versions})"
            ))
        }
    })?;
    let values = param_map(compiled)?;
    let attr = |a: CUdevice_attribute| gpu.ctx.attribute(a).unwrap_or(0).max(0) as usize;
    let max_threads = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    let max_shared =
        attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .max(DEFAULT_DYNAMIC_SHARED);
    let illegal = |message: String| Error::Illegal {
        file: compiled.program.source.clone(),
        message,
    };
    let hopper = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) >= 9;
    let mut launches = Vec::new();
    for k in &program.kernels {
        let grid = k.grid_dims(&values)?;
        if grid.contains(&0) {
            launches.push(None);
            continue;
        }
        let threads = k.block.iter().map(|b| *b as usize).product::<usize>();
        if threads == 0 || threads > max_threads {
            return Err(illegal(format!(
                "kernel {} has {threads} threads per block ({:?}); the device allows 1 to {max_threads}",
                k.name, k.block
            )));
        }
        let shared = k.dynamic_shared + k.static_shared;
        if shared > max_shared {
            return Err(illegal(format!(
                "kernel {} needs {shared} bytes of shared memory per block; the device allows {max_shared}",
                k.name
            )));
        }
        let func = module.load_function(&k.name).map_err(|e| {
            Error::Internal(format!(
                "kernel {} is not in the module: {}",
                k.name,
                sys::describe(&e)
            ))
        })?;
        if k.dynamic_shared > DEFAULT_DYNAMIC_SHARED {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                k.dynamic_shared as i32,
            )
            .map_err(|e| {
                Error::Internal(format!(
                    "kernel {}: cannot allow {} bytes of dynamic shared memory: {}",
                    k.name,
                    k.dynamic_shared,
                    sys::describe(&e)
                ))
            })?;
        }
        launches.push(Some(Launch {
            name: k.name.clone(),
            func,
            cfg: LaunchConfig {
                grid_dim: (grid[0], grid[1], grid[2]),
                block_dim: (k.block[0], k.block[1], k.block[2]),
                shared_mem_bytes: k.dynamic_shared as u32,
            },
            dependent: k.dependent && hopper,
        }));
    }
    Ok(launches)
}

/// Every parameter's value by name (all have one for a run).
fn param_map(compiled: &Compiled) -> Result<HashMap<String, i64>> {
    let values = compiled.param_values()?;
    Ok(compiled
        .program
        .params
        .iter()
        .map(|p| p.name.clone())
        .zip(values)
        .collect())
}

/// What each kernel argument is: a tensor (index into the buffers), a
/// parameter value, or a host loop's iterator (index into a launch's
/// steps). Checks that the program's argument list covers every tensor of
/// the model in order, which is what the kernels expect.
enum ArgSlot {
    Tensor(usize),
    Long(i64),
    Step(usize),
}

/// The arguments of one launch: the buffers, the parameters, and the
/// launch's values of the host loops' iterators, then the kernel's tensor
/// maps (`maps`, from [`encode_maps`]).
fn launch_args<'a>(
    slots: &'a [ArgSlot],
    buffers: &'a [CudaSlice<u8>],
    steps: &'a [i64],
    maps: &[TensorMapValue],
) -> Vec<sys::Arg<'a>> {
    let common = slots.iter().map(|s| match s {
        ArgSlot::Tensor(i) => sys::Arg::Buffer(&buffers[*i]),
        ArgSlot::Long(v) => sys::Arg::Long(v),
        ArgSlot::Step(j) => sys::Arg::Long(&steps[*j]),
    });
    common
        .chain(maps.iter().map(|m| sys::Arg::TensorMap(*m)))
        .collect()
}

/// Each kernel's tensor maps, encoded from the buffer its tensor's pointer
/// argument gets; once per run's buffers rather than per launch, as timed
/// executions and host loops launch a kernel many times on the same
/// buffers. Empty for a kernel not launched (`launches`' `None`).
fn encode_maps(
    gpu: &Gpu,
    program: &CudaProgram,
    compiled: &Compiled,
    buffers: &[CudaSlice<u8>],
    launches: &[Option<Launch>],
) -> Result<Vec<Vec<TensorMapValue>>> {
    use cudarc::driver::DevicePtr;
    let encode = |kernel: &str, map: &TensorMap| {
        let i = compiled
            .tensors
            .iter()
            .position(|t| t.name == map.tensor)
            .ok_or_else(|| {
                Error::Internal(format!("kernel {kernel} maps {}, no tensor", map.tensor))
            })?;
        let (address, _) = buffers[i].device_ptr(&gpu.stream);
        sys::encode_tensor_map(map, address)
            .map(TensorMapValue)
            .map_err(|e| Error::Internal(format!("kernel {kernel}: {e}")))
    };
    program
        .kernels
        .iter()
        .zip(launches)
        .map(|(k, l)| match l {
            Some(_) => k.tensor_maps.iter().map(|m| encode(&k.name, m)).collect(),
            None => Ok(Vec::new()),
        })
        .collect()
}

fn arg_slots(program: &CudaProgram, compiled: &Compiled) -> Result<Vec<ArgSlot>> {
    let values = param_map(compiled)?;
    let mut slots = Vec::new();
    let mut next_tensor = 0usize;
    for a in &program.args {
        match a {
            KernelArg::Tensor { name, dtype, .. } => {
                let i = compiled
                    .tensors
                    .iter()
                    .position(|t| &t.name == name)
                    .ok_or_else(|| {
                        Error::Internal(format!("kernel argument {name} is no tensor"))
                    })?;
                if i != next_tensor || compiled.tensors[i].dtype != *dtype {
                    return Err(Error::Internal(format!(
                        "kernel argument {name} ({dtype}) is out of the model's tensor order"
                    )));
                }
                next_tensor += 1;
                slots.push(ArgSlot::Tensor(i));
            }
            KernelArg::Param { name } => {
                let v = values
                    .get(name)
                    .ok_or_else(|| Error::Internal(format!("parameter {name} has no value")))?;
                slots.push(ArgSlot::Long(*v));
            }
            KernelArg::Step { .. } => {
                let j = slots
                    .iter()
                    .filter(|s| matches!(s, ArgSlot::Step(_)))
                    .count();
                slots.push(ArgSlot::Step(j));
            }
        }
    }
    if next_tensor != compiled.tensors.len() {
        return Err(Error::Internal(
            "the kernels do not take every tensor as an argument".into(),
        ));
    }
    Ok(slots)
}

/// Runs `compiled` (compiled with the GPU mapping) on the GPU: `--check`
/// compares with the CPU's f64 reference on the same inputs, `--bench`
/// times `bench_runs` executions with CUDA events after a few warm-ups.
pub fn run(compiled: &Compiled, opts: &RunOptions) -> Result<RunReport> {
    run_on(compiled, opts, 0)
}

/// The number of CUDA devices the driver sees.
pub fn device_count() -> Result<usize> {
    probe_driver()?;
    let n = std::panic::catch_unwind(cudarc::driver::CudaContext::device_count)
        .map_err(|p| Error::Environment(sys::panic_text(p.as_ref())))?
        .map_err(|e| {
            Error::Environment(format!(
                "cannot count the CUDA devices: {}",
                sys::describe(&e)
            ))
        })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The architecture of device `device`, as `sm_90`.
pub fn device_arch(device: usize) -> Result<String> {
    Ok(format!("sm_{}", open_gpu(device)?.cc))
}

/// [`run`] on device `device` (an ordinal of the driver's list).
pub fn run_on(compiled: &Compiled, opts: &RunOptions, device: usize) -> Result<RunReport> {
    run_checked(compiled, opts, device, None)
}

/// The reference and declared-precision outputs of
/// [`cpu::reference_outputs`].
pub type Reference = [data::ReferenceOutput];

/// [`run_on`], checking against `reference` when given (computed once by a
/// caller that runs many schedules of one program on the same inputs, as
/// `tune` does) instead of computing it for this run.
pub fn run_checked(
    compiled: &Compiled,
    opts: &RunOptions,
    device: usize,
    reference: Option<&Reference>,
) -> Result<RunReport> {
    run_checked_within(compiled, opts, device, reference, None)
}

/// [`run_checked`], giving up on the timing when the first warm-up run
/// takes longer than `give_up_after_us`: the report's median is then that
/// one run (the tuner's way of not spending its budget on a candidate many
/// times slower than its best).
pub fn run_checked_within(
    compiled: &Compiled,
    opts: &RunOptions,
    device: usize,
    reference: Option<&Reference>,
    give_up_after_us: Option<f64>,
) -> Result<RunReport> {
    let program = compiled.cuda.as_ref().ok_or_else(|| {
        Error::Internal("the program was compiled without the GPU mapping".into())
    })?;
    let counts = cpu::tensor_counts(compiled)?;
    let slots = arg_slots(program, compiled)?;
    let work = super::work::measure(compiled)?;
    let gpu = open_gpu(device)?;
    // cudarc panics on a few conditions it treats as impossible (a missing
    // driver entry point); those become errors rather than crashes.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        execute(
            &gpu,
            program,
            compiled,
            &counts,
            &slots,
            opts,
            reference,
            give_up_after_us,
        )
    }))
    .map_err(|p| {
        Error::Internal(format!(
            "the CUDA runtime failed: {}",
            sys::panic_text(p.as_ref())
        ))
    })?;
    let (check, median_us, arch, launches, kernel_us) = result?;
    Ok(RunReport {
        check,
        median_us,
        runs: opts.bench_runs,
        device: format!("{}, {arch}", gpu.name),
        launches,
        work,
        kernel_us,
    })
}

/// What one execution gave: the check, the median time, the architecture,
/// the number of launches, and each kernel's median time.
type Executed = (
    Option<data::CheckResult>,
    Option<f64>,
    String,
    usize,
    Vec<(String, f64)>,
);

/// One execution of `program` on `gpu`: (1) compile and load the
/// kernels, (2) fill the buffers, (3) run once, synchronising after each
/// kernel, (4) check the outputs against the reference, (5) time whole
/// executions, (6) time each kernel.
#[allow(clippy::too_many_arguments)]
fn execute(
    gpu: &Gpu,
    program: &CudaProgram,
    compiled: &Compiled,
    counts: &[usize],
    slots: &[ArgSlot],
    opts: &RunOptions,
    reference: Option<&Reference>,
    give_up_after_us: Option<f64>,
) -> Result<Executed> {
    let (ptx, arch) = compile_for(gpu, &program.source)?;
    let launches = prepare(gpu, program, compiled, ptx)?;
    let buffers = fill_buffers(gpu, program, compiled, counts, opts.seed)?;
    let maps = encode_maps(gpu, program, compiled, &buffers, &launches)?;
    // One execution: the kernels in order, those of host loops once per
    // iteration (`CudaProgram::launches`), each launch with its arguments.
    let plan: Vec<crate::gpu::Launch> = program
        .launches(&param_map(compiled)?)?
        .into_iter()
        .filter(|l| launches.get(l.kernel).is_some_and(Option::is_some))
        .collect();
    let order: Vec<(&Launch, Vec<sys::Arg>)> = plan
        .iter()
        .filter_map(|l| {
            let prepared = launches.get(l.kernel)?.as_ref()?;
            Some((
                prepared,
                launch_args(slots, &buffers, &l.steps, &maps[l.kernel]),
            ))
        })
        .collect();
    // The checked execution: synchronize after every kernel so that a
    // fault names the kernel that caused it.
    for (l, args) in &order {
        l.launch(&gpu.stream, args)?;
        gpu.stream
            .synchronize()
            .map_err(|e| driver_error(&format!("kernel {} failed", l.name), e))?;
    }
    let check = if opts.check {
        Some(check_outputs(
            gpu, compiled, counts, &buffers, opts.seed, reference,
        )?)
    } else {
        None
    };
    let median_us = if opts.bench_runs > 0 {
        match time_executions(gpu, program, &order, opts.bench_runs, give_up_after_us)? {
            Timed::Median(us) => Some(us),
            Timed::GaveUp(first_us) => {
                return Ok((check, Some(first_us), arch, order.len(), Vec::new()));
            }
        }
    } else {
        None
    };
    let kernel_us = if opts.bench_runs > 0 && !order.is_empty() {
        time_each_kernel(gpu, &order, opts.bench_runs.min(KERNEL_TIMING_RUNS))?
    } else {
        Vec::new()
    };
    gpu.stream
        .synchronize()
        .map_err(|e| driver_error("finishing", e))?;
    Ok((check, median_us, arch, order.len(), kernel_us))
}

fn driver_error(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Internal(format!("{what}: {}", sys::describe(&e)))
}

/// The buffers: inputs from the shared generator, the rest poisoned. A
/// temp no kernel touches (`Kernel::globals`: attention's row states, a
/// rolling update's M_prev) gets one byte, as the C ABI gives it none: at
/// B4 H16 S2048 D64 causal attention's temps were 3 GiB written from the
/// host for nothing.
fn fill_buffers(
    gpu: &Gpu,
    program: &CudaProgram,
    compiled: &Compiled,
    counts: &[usize],
    seed: u64,
) -> Result<Vec<CudaSlice<u8>>> {
    let touched: std::collections::HashSet<&str> = program
        .kernels
        .iter()
        .flat_map(|k| k.globals.iter().map(String::as_str))
        .collect();
    let mut buffers: Vec<CudaSlice<u8>> = Vec::new();
    for (i, t) in compiled.tensors.iter().enumerate() {
        let bytes = if t.role == TensorRole::Input {
            data::random_bytes(t.dtype, counts[i], seed.wrapping_add(i as u64))
        } else if t.role == TensorRole::Temp && !touched.contains(t.name.as_str()) {
            Vec::new()
        } else {
            vec![0xFF; counts[i] * t.dtype.size()]
        };
        // A zero-sized tensor still gets a valid pointer.
        let bytes = if bytes.is_empty() { vec![0xFF] } else { bytes };
        let b = gpu
            .stream
            .clone_htod(&bytes)
            .map_err(|e| driver_error(&format!("allocating and filling {}", t.name), e))?;
        buffers.push(b);
    }
    Ok(buffers)
}

/// The outputs copied back and compared with the reference (computed
/// here from the same seed where none is given).
fn check_outputs(
    gpu: &Gpu,
    compiled: &Compiled,
    counts: &[usize],
    buffers: &[CudaSlice<u8>],
    seed: u64,
    reference: Option<&Reference>,
) -> Result<data::CheckResult> {
    let computed;
    let reference = match reference {
        Some(r) => r,
        None => {
            computed = cpu::reference_outputs(compiled, seed)?;
            &computed[..]
        }
    };
    let mut outputs = Vec::new();
    for (i, t) in compiled.tensors.iter().enumerate() {
        if t.role != TensorRole::Output {
            continue;
        }
        let got = gpu
            .stream
            .clone_dtoh(&buffers[i])
            .map_err(|e| driver_error(&format!("copying {} back", t.name), e))?;
        let n = counts[i] * t.dtype.size();
        let y = data::to_f64(t.dtype, &got[..n.min(got.len())]);
        let r = reference
            .iter()
            .find(|r| r.name == t.name)
            .ok_or_else(|| Error::Internal(format!("no reference for {}", t.name)))?;
        outputs.push((r, y));
    }
    let outputs: Vec<(&data::ReferenceOutput, &[f64])> =
        outputs.iter().map(|(r, y)| (*r, &y[..])).collect();
    Ok(data::compare(&outputs))
}

/// What timing whole executions gave.
enum Timed {
    /// The median of the timed runs, in microseconds.
    Median(f64),
    /// The first warm-up run took longer than the cap: its time.
    GaveUp(f64),
}

fn new_event(gpu: &Gpu) -> Result<cudarc::driver::CudaEvent> {
    gpu.ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| driver_error("creating an event", e))
}

/// The median of `runs` timed executions after the warm-up.
fn time_executions(
    gpu: &Gpu,
    program: &CudaProgram,
    order: &[(&Launch, Vec<sys::Arg>)],
    runs: usize,
    give_up_after_us: Option<f64>,
) -> Result<Timed> {
    let timing = |e| driver_error("timing", e);
    let run_on = |stream: &Arc<CudaStream>| -> Result<()> {
        for (l, args) in order {
            l.launch(stream, args)?;
        }
        Ok(())
    };
    let run_all = || run_on(&gpu.stream);
    let (start, end) = (new_event(gpu)?, new_event(gpu)?);
    // The first warm-up is timed: far too slow, and that one run is the
    // answer.
    start.record(&gpu.stream).map_err(timing)?;
    run_all()?;
    end.record(&gpu.stream).map_err(timing)?;
    let first_us = f64::from(start.elapsed_ms(&end).map_err(timing)?) * 1e3;
    if give_up_after_us.is_some_and(|cap| first_us > cap) {
        gpu.stream
            .synchronize()
            .map_err(|e| driver_error("finishing", e))?;
        return Ok(Timed::GaveUp(first_us));
    }
    for _ in 1..WARMUP_RUNS {
        run_all()?;
    }
    gpu.stream
        .synchronize()
        .map_err(|e| driver_error("warm-up", e))?;
    // Short programs: several runs back to back per pair of events, so
    // that the host's launch latency is not timed with them (the queue
    // stays ahead of the GPU); peers.py replays a CUDA graph likewise.
    start.record(&gpu.stream).map_err(timing)?;
    run_all()?;
    end.record(&gpu.stream).map_err(timing)?;
    let once_us = f64::from(start.elapsed_ms(&end).map_err(timing)?) * 1e3;
    let reps = if once_us < SHORT_RUN_US {
        SHORT_RUN_REPS
    } else {
        1
    };
    // Short programs are timed as replays of a CUDA graph of one
    // execution, as peers.py times its peers: the host's launch rate
    // through the driver (about 4 us a kernel here) would otherwise be
    // timed instead of kernels that take less. Where the capture fails,
    // back-to-back launches. A program with host loops (`schedule::host`)
    // is replayed as a graph whatever its length: its many short launches
    // per execution are what a graph is for.
    let graph = if reps > 1 || program.host_stepped() {
        capture(gpu, &run_on)
    } else {
        None
    };
    // One timed execution, and the stream it runs on.
    let (stream, once): (&Arc<CudaStream>, Box<dyn Fn() -> Result<()>>) = match &graph {
        Some((stream, graph)) => {
            let replay = || {
                graph
                    .launch()
                    .map_err(|e| driver_error("replaying the graph", e))
            };
            for _ in 0..WARMUP_RUNS {
                replay()?;
            }
            (stream, Box::new(replay))
        }
        None => (&gpu.stream, Box::new(run_all)),
    };
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        start.record(stream).map_err(timing)?;
        for _ in 0..reps {
            once()?;
        }
        end.record(stream).map_err(timing)?;
        let ms = start.elapsed_ms(&end).map_err(timing)?;
        times.push(ms as f64 * 1e3 / reps as f64);
    }
    stream.synchronize().map_err(timing)?;
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(Timed::Median(times[times.len() / 2]))
}

/// Where the time goes: each kernel between its own pair of events, in
/// `runs` further executions; the median of each. Events between launches
/// add no synchronisation, so the kernels run as in the timed executions,
/// only their launch gaps are counted nowhere. Per kernel and execution,
/// the sum over its launches (a kernel of a host loop runs once per
/// iteration).
fn time_each_kernel(
    gpu: &Gpu,
    order: &[(&Launch, Vec<sys::Arg>)],
    runs: usize,
) -> Result<Vec<(String, f64)>> {
    let timing = |e| driver_error("timing", e);
    let events = (0..=order.len())
        .map(|_| new_event(gpu))
        .collect::<Result<Vec<_>>>()?;
    let mut names: Vec<&str> = Vec::new();
    for (l, _) in order {
        if !names.contains(&l.name.as_str()) {
            names.push(&l.name);
        }
    }
    let mut times = vec![Vec::with_capacity(runs); names.len()];
    for _ in 0..runs {
        events[0].record(&gpu.stream).map_err(timing)?;
        for (k, (l, args)) in order.iter().enumerate() {
            l.launch(&gpu.stream, args)?;
            events[k + 1].record(&gpu.stream).map_err(timing)?;
        }
        let mut sums = vec![0.0; names.len()];
        for (k, (l, _)) in order.iter().enumerate() {
            let ms = events[k].elapsed_ms(&events[k + 1]).map_err(timing)?;
            let at = names.iter().position(|n| *n == l.name).unwrap_or(0);
            sums[at] += f64::from(ms) * 1e3;
        }
        for (t, v) in times.iter_mut().zip(sums) {
            t.push(v);
        }
    }
    Ok(names
        .iter()
        .zip(times)
        .map(|(name, mut t)| {
            t.sort_by(|a, b| a.total_cmp(b));
            (name.to_string(), t[t.len() / 2])
        })
        .collect())
}

/// A run shorter than this (one timed run, after the warm-up) is timed
/// [`SHORT_RUN_REPS`] times back to back per pair of events.
const SHORT_RUN_US: f64 = 100.0;
const SHORT_RUN_REPS: usize = 20;
/// Executions timed kernel by kernel after the timed runs (`--bench`).
const KERNEL_TIMING_RUNS: usize = 10;

/// Folders where the driver library may be outside the loader's search.
fn driver_dirs() -> Vec<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
        "/usr/lib/wsl/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

/// Folders that may hold `libnvrtc`: the toolkit's, then the pip wheels'.
fn nvrtc_dirs() -> Vec<PathBuf> {
    let mut dirs = toolkit_dirs(&["lib64", "lib", "targets/x86_64-linux/lib"]);
    for n in python_nvidia_dirs() {
        for sub in ["cu13/lib", "cuda_nvrtc/lib", "cu12/lib"] {
            dirs.push(n.join(sub));
        }
    }
    dirs
}

/// Folders that hold `cuda_fp16.h` and `cuda_bf16.h` (NVRTC does not carry
/// them): NVRTC's own first (the `include` beside the `lib` it was loaded
/// from), then those beside `LD_LIBRARY_PATH`'s folders, then the
/// toolkit's and the pip wheels'.
fn include_dirs() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(found) = sys::nvrtc_path() {
        if let Some(lib) = Path::new(found).parent() {
            candidates.push(lib.join("../include"));
        }
    }
    // NVRTC found by name: the `include` beside each folder the loader
    // searches first (a wheel's `nvidia/cu13/lib` on LD_LIBRARY_PATH).
    if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
        for d in std::env::split_paths(&path) {
            if !d.as_os_str().is_empty() {
                candidates.push(d.join("../include"));
            }
        }
    }
    candidates.extend(toolkit_dirs(&["include", "targets/x86_64-linux/include"]));
    for n in python_nvidia_dirs() {
        for sub in [
            "cu13/include",
            "cuda_runtime/include",
            "cuda_nvrtc/include",
            "cu12/include",
        ] {
            candidates.push(n.join(sub));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for c in candidates {
        if c.join("cuda_fp16.h").is_file() {
            let c = c.canonicalize().unwrap_or(c);
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT` and the usual install
/// prefixes, each joined with every one of `subdirs`.
fn toolkit_dirs(subdirs: &[&str]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.push(PathBuf::from("/opt/cuda"));
    let mut out = Vec::new();
    for r in roots {
        for s in subdirs {
            let d = r.join(s);
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

/// The `nvidia` package folders of the Python installation, where the pip
/// wheels (`nvidia-cuda-nvrtc`, `nvidia-cuda-runtime`, ...) put their
/// libraries and headers; found by asking `python3` for its search path
/// (which includes `PYTHONPATH`). Asked once per process.
fn python_nvidia_dirs() -> &'static [PathBuf] {
    static DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys\nfor p in sys.path: print(p)"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        let mut dirs = Vec::new();
        if let Ok(out) = out {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let line = line.trim();
                let d = Path::new(line).join("nvidia");
                if !line.is_empty() && d.is_dir() && !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
        }
        dirs
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_architecture_override_must_run_on_the_device() {
        assert_eq!(arch_override("sm_90", 90).unwrap(), "sm_90");
        assert_eq!(arch_override("sm_90a", 90).unwrap(), "sm_90a");
        assert_eq!(arch_override("sm_80", 90).unwrap(), "compute_80");
        assert_eq!(arch_override("sm_89", 89).unwrap(), "sm_89");
        for bad in ["sm_100", "sm_80a", "compute_90", "90", "sm_9", "sm_x0", ""] {
            match arch_override(bad, 90) {
                Err(Error::Input { file, message }) => {
                    assert_eq!(file, ARCH_VARIABLE);
                    assert!(message.contains(&format!("`{bad}`")), "{message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_hopper_path_is_compiled_for_sm_90a_unless_another_is_asked() {
        let wgmma = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#endif";
        assert_eq!(target_arch(wgmma, 90, None).unwrap(), "sm_90a");
        assert_eq!(target_arch("plain", 90, None).unwrap(), "sm_90");
        assert_eq!(target_arch(wgmma, 89, None).unwrap(), "sm_89");
        assert_eq!(target_arch(wgmma, 90, Some("sm_90")).unwrap(), "sm_90");
        assert_eq!(target_arch(wgmma, 90, Some("sm_80")).unwrap(), "compute_80");
        assert!(target_arch(wgmma, 90, Some("sm_100")).is_err());
        // The C ABI compiles PTX: the architecture's virtual form keeps
        // the Hopper-only path.
        assert_eq!(virtual_arch("sm_90a").unwrap(), "compute_90a");
    }

    #[test]
    fn a_kernels_tensor_maps_follow_its_common_arguments() {
        let slots = [ArgSlot::Long(5), ArgSlot::Step(0)];
        let maps = [TensorMapValue([1; 16]), TensorMapValue([2; 16])];
        let args = launch_args(&slots, &[], &[9], &maps);
        let kinds: Vec<String> = args
            .iter()
            .map(|a| match a {
                sys::Arg::Buffer(_) => "buffer".to_string(),
                sys::Arg::Long(v) => format!("long {v}"),
                sys::Arg::TensorMap(m) => format!("map {}", m.0[0]),
            })
            .collect();
        assert_eq!(kinds, ["long 5", "long 9", "map 1", "map 2"]);
        // A kernel without maps takes the common arguments alone.
        assert_eq!(launch_args(&slots, &[], &[9], &[]).len(), 2);
    }

    #[test]
    fn architectures_become_virtual() {
        assert_eq!(virtual_arch("sm_90").unwrap(), "compute_90");
        assert_eq!(virtual_arch("sm_90a").unwrap(), "compute_90a");
        assert_eq!(virtual_arch("compute_80").unwrap(), "compute_80");
        for bad in ["90", "sm90", "sm_", "sm_9", "gfx_90", "sm_x0"] {
            assert!(
                matches!(virtual_arch(bad), Err(Error::Input { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn real_architectures_give_machine_code() {
        // Without NVRTC (no CUDA toolkit) there is nothing to test here;
        // scripts/cuda-compile-check.sh says so in CI's log.
        if require_nvrtc().is_err() {
            return;
        }
        let src = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }";
        let out = nvrtc(src, "--gpu-architecture=sm_90").unwrap_or_else(|e| panic!("{e}"));
        assert!(out.cubin.is_some_and(|c| c.starts_with(b"\x7fELF")));
        let out = nvrtc(src, "--gpu-architecture=compute_90").unwrap_or_else(|e| panic!("{e}"));
        assert!(out.ptx.is_some_and(|p| p.contains(".entry k")));
        assert!(sys::nvrtc_archs().contains(&90));
    }
}
