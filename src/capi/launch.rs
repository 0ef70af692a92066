//! `pf_result_launch` on the caller's memory and stream, through the CUDA
//! driver API (cudarc, loaded at run time).
//!
//! The caller owns the CUDA context: we launch in the context of the stream
//! it passes (or the thread's current context for the null stream), never
//! create one, and leave the thread's current context as we found it. The
//! CUDA source is compiled with NVRTC once per compute capability and
//! loaded once per context; the modules live as long as the result.
//!
//! cudarc's dynamic loading panics when `libcuda` or `libnvrtc` is missing,
//! so both are probed first (by `runtime::cuda`, whose NVRTC compile is used
//! here too) and reported as `PF_ERR_ENVIRONMENT`; any panic that still
//! escapes is caught by the caller in `capi`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_uint, c_void, CString};

use cudarc::driver::result as drv;
use cudarc::driver::sys;

use super::{CUstream, Failure, Outcome};
use crate::gpu::{CudaProgram, Kernel};

/// Kernel arguments, each 8 bytes: a device address or a C `long`.
#[derive(Default)]
pub(crate) struct Args {
    values: Vec<u64>,
}

impl Args {
    pub(crate) fn push_pointer(&mut self, address: u64) {
        self.values.push(address);
    }
    pub(crate) fn push_long(&mut self, value: i64) {
        self.values.push(value as u64);
    }
}

/// One CUDA context's loaded module and its kernels, in kernel order.
struct Loaded {
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
    /// Compute capability 9.0 or later: kernels marked
    /// [`Kernel::dependent`] are launched as programmatic dependents.
    hopper: bool,
}

/// The compiled and loaded forms of one result's CUDA program.
#[derive(Default)]
pub(crate) struct Modules {
    /// NUL-terminated PTX per compute capability.
    ptx: HashMap<(i32, i32), Vec<u8>>,
    /// Loaded modules per CUDA context (by address).
    loaded: HashMap<usize, Loaded>,
}

// SAFETY: CUDA driver handles (contexts, modules, functions) are plain
// identifiers that the driver accepts from any thread; `Modules` is only
// used behind the result's mutex.
unsafe impl Send for Modules {}

fn driver_error(what: &str) -> impl Fn(drv::DriverError) -> Failure + '_ {
    move |e| Failure::environment(format!("CUDA driver: {what} failed: {e:?}"))
}

/// Fails with an environment error unless the driver library loads (the
/// CUDA runtime's probe, which also finds a driver outside the loader's
/// path and makes cudarc use it).
fn require_driver() -> Outcome {
    crate::runtime::cuda::probe_driver().map_err(Failure::from)
}

/// NUL-terminated PTX of `cuda` for compute capability `cc`, through the
/// CUDA runtime's NVRTC compile (which finds NVRTC and the CUDA headers the
/// same way `polyfuse run --target cuda` does).
fn compile_ptx(cuda: &CudaProgram, cc: (i32, i32)) -> Outcome<Vec<u8>> {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let mut bytes = crate::runtime::cuda::compile_ptx(&cuda.source, &arch)?.into_bytes();
    bytes.push(0);
    Ok(bytes)
}

impl Modules {
    /// Launches kernel `index` of `cuda`; see `pf_result_launch`.
    ///
    /// # Safety
    /// `stream` is null or a live stream, and `args` holds device addresses
    /// valid in its context for buffers as large as the kernel indexes.
    pub(crate) unsafe fn launch(
        &mut self,
        cuda: &CudaProgram,
        index: usize,
        grid: [u32; 3],
        kernel: &Kernel,
        args: &mut Args,
        stream: CUstream,
    ) -> Outcome {
        require_driver()?;
        drv::init().map_err(driver_error("cuInit"))?;
        let stream: sys::CUstream = stream.cast();
        let ctx = if stream.is_null() {
            drv::ctx::get_current()
                .map_err(driver_error("cuCtxGetCurrent"))?
                .ok_or_else(|| {
                    Failure::environment(
                        "no current CUDA context on this thread: make one current or pass a stream",
                    )
                })?
        } else {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `stream` is live by the caller's contract; `ctx` is a
            // valid place for the answer.
            unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }
                .result()
                .map_err(driver_error("cuStreamGetCtx"))?;
            ctx
        };
        // SAFETY: `ctx` is the live context of the caller's stream or the
        // thread's current one; it is popped again below.
        unsafe { sys::cuCtxPushCurrent_v2(ctx) }
            .result()
            .map_err(driver_error("cuCtxPushCurrent"))?;
        // SAFETY: as for this function; `ctx` is now current.
        let outcome = unsafe { self.launch_in(ctx, cuda, index, grid, kernel, args, stream) };
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_in(
        &mut self,
        ctx: sys::CUcontext,
        cuda: &CudaProgram,
        index: usize,
        grid: [u32; 3],
        kernel: &Kernel,
        args: &mut Args,
        stream: sys::CUstream,
    ) -> Outcome {
        if !self.loaded.contains_key(&(ctx as usize)) {
            let loaded = self.load(ctx, cuda)?;
            self.loaded.insert(ctx as usize, loaded);
        }
        let f = self.loaded[&(ctx as usize)].functions[index];
        let dependent = kernel.dependent && self.loaded[&(ctx as usize)].hopper;
        if kernel.dynamic_shared > 48 * 1024 {
            let bytes = i32::try_from(kernel.dynamic_shared)
                .map_err(|_| Failure::internal("dynamic shared memory size overflows"))?;
            // SAFETY: `f` belongs to a module loaded in the current context.
            unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes,
                )
            }
            .result()
            .map_err(driver_error("cuFuncSetAttribute"))?;
        }
        let mut params: Vec<*mut c_void> = args
            .values
            .iter_mut()
            .map(|v| (v as *mut u64).cast())
            .collect();
        let shared = c_uint::try_from(kernel.dynamic_shared)
            .map_err(|_| Failure::internal("dynamic shared memory size overflows"))?;
        if dependent {
            // A programmatic dependent of the kernel before it on `stream`
            // (see `Kernel::dependent`).
            // SAFETY: an all-zero attribute is a valid one; its id and
            // value are set next.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: kernel.block[0],
                blockDimY: kernel.block[1],
                blockDimZ: kernel.block[2],
                sharedMemBytes: shared,
                hStream: stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; the configuration and its attribute live
            // until the call returns.
            return unsafe {
                sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(driver_error("cuLaunchKernelEx"));
        }
        // SAFETY: `f` is a loaded kernel whose parameters are one 8-byte
        // value each, in `args` order (gpu::KernelArg); the values live
        // until the call returns, and the driver copies them at launch.
        unsafe {
            drv::launch_kernel(
                f,
                (grid[0], grid[1], grid[2]),
                (kernel.block[0], kernel.block[1], kernel.block[2]),
                shared,
                stream,
                &mut params,
            )
        }
        .map_err(driver_error("cuLaunchKernel"))
    }

    /// Compiles (once per compute capability) and loads `cuda` into the
    /// current context `ctx`.
    unsafe fn load(&mut self, ctx: sys::CUcontext, cuda: &CudaProgram) -> Outcome<Loaded> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: a context is current; `dev` is a valid place.
        unsafe { sys::cuCtxGetDevice(&mut dev) }
            .result()
            .map_err(driver_error("cuCtxGetDevice"))?;
        use sys::CUdevice_attribute as A;
        // SAFETY: `dev` came from the driver.
        let cc = unsafe {
            (
                drv::device::get_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                    .map_err(driver_error("cuDeviceGetAttribute"))?,
                drv::device::get_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                    .map_err(driver_error("cuDeviceGetAttribute"))?,
            )
        };
        let ptx = match self.ptx.entry(cc) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => v.insert(compile_ptx(cuda, cc)?),
        };
        // SAFETY: the PTX is NUL-terminated text, as cuModuleLoadData wants.
        let module = unsafe { drv::module::load_data(ptx.as_ptr().cast()) }
            .map_err(driver_error("cuModuleLoadData"))?;
        let mut functions = Vec::new();
        for k in &cuda.kernels {
            let name = CString::new(k.name.as_str())
                .map_err(|_| Failure::internal("a kernel name contains NUL"))?;
            // SAFETY: `module` was just loaded and is not unloaded yet.
            match unsafe { drv::module::get_function(module, name) } {
                Ok(f) => functions.push(f),
                Err(e) => {
                    // SAFETY: `module` is loaded in the current context.
                    let _ = unsafe { drv::module::unload(module) };
                    return Err(driver_error("cuModuleGetFunction")(e));
                }
            }
        }
        Ok(Loaded {
            ctx,
            module,
            functions,
            hopper: cc.0 >= 9,
        })
    }
}

impl Drop for Modules {
    fn drop(&mut self) {
        for (_, l) in self.loaded.drain() {
            // SAFETY: each module was loaded in `l.ctx`; it is made current
            // for the unload and popped again. A context the caller already
            // destroyed makes the push fail, and its modules went with it.
            unsafe {
                if sys::cuCtxPushCurrent_v2(l.ctx).result().is_ok() {
                    let _ = drv::module::unload(l.module);
                    let mut popped: sys::CUcontext = std::ptr::null_mut();
                    let _ = sys::cuCtxPopCurrent_v2(&mut popped);
                }
            }
        }
    }
}
