//! `pf_result_launch` on the caller's memory and stream, through the CUDA
//! driver API (cudarc, loaded at run time).
//!
//! The caller owns the CUDA context: we launch in the context of the stream
//! it passes, never create one, and leave the thread's current context as
//! we found it. For the null stream (and the driver's `CU_STREAM_LEGACY`
//! and `CU_STREAM_PER_THREAD` handles, which also mean "the null stream of
//! the current context") the context is the one the tensors live in: the
//! context a pointer was allocated in (`CU_POINTER_ATTRIBUTE_CONTEXT`), or
//! for memory that has none (virtual memory management, as PyTorch's
//! expandable segments use) the primary context of its device
//! (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, `cuDevicePrimaryCtxRetain`).
//! The thread's current context is never used by accident: a fresh thread,
//! which has none, launches on the default stream as well as any
//! (issue 33; [`launch_context`] decides, tested against a fake driver).
//! The CUDA source is compiled with NVRTC once per compute capability and
//! loaded once per context; the modules live as long as the result, and
//! so does the workspace the result allocates in a context when the
//! caller passes none ([`Workspace::Own`]).
//!
//! A module can only be unloaded while its context lives, and callers
//! release their context in any order relative to `pf_result_destroy` (the
//! C++ example releases the primary context first). So when the context is
//! its device's primary context, the result takes a reference of its own
//! on it (`cuDevicePrimaryCtxRetain`) when it loads the module, and drops
//! it (`cuDevicePrimaryCtxRelease`) only after the module is unloaded with
//! that context current ([`unload`]). A context made with `cuCtxCreate`
//! has no reference count: the header asks callers to destroy the results
//! that launched in it first. The calls that order this go through
//! [`ContextCalls`], so the order is tested without a GPU.
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
use crate::gpu::{CudaProgram, Kernel, KernelArg, TensorMap};
use crate::runtime::cuda::TensorMapValue;

/// One kernel argument, 8 bytes once resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arg {
    /// A device address the caller gave (or null).
    Pointer(u64),
    /// A C `long` (a parameter's value).
    Long(i64),
    /// A temp's place in the workspace, at this byte offset.
    Workspace(usize),
}

/// Where a launch's temps live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workspace {
    /// The caller's device buffer at this address.
    Caller(u64),
    /// The result's own buffer in the launch's context, of at least this
    /// many bytes (allocated, or grown, on first need).
    Own(usize),
}

/// The 8-byte values of `args`, with workspace offsets added to `base`.
fn resolve(args: &[Arg], base: u64) -> Vec<u64> {
    args.iter()
        .map(|a| match *a {
            Arg::Pointer(p) => p,
            Arg::Long(v) => v as u64,
            Arg::Workspace(offset) => base + offset as u64,
        })
        .collect()
}

/// `map` encoded for the buffer at `address`; a misaligned address is the
/// caller's error (`PF_ERR_INPUT`), no driver `PF_ERR_ENVIRONMENT`.
pub(crate) fn encode_map(map: &TensorMap, address: u64) -> Outcome<TensorMapValue> {
    crate::runtime::cuda::check_tensor_address(map, address).map_err(Failure::input)?;
    crate::runtime::cuda::encode_tensor_map(map, address).map_err(Failure::from)
}

/// Encoded tensor maps by (kernel index, map index), with the address each
/// was encoded for: a launch whose tensor sits where it did last time
/// reuses the map instead of encoding it again (a host call per map and
/// launch; a framework often launches a result on the same buffers).
pub(crate) type MapCache = HashMap<(usize, usize), (u64, TensorMapValue)>;

/// Kernel `index`'s (`kernel`'s) tensor maps, each for the address its
/// tensor's argument resolved to (`values`, in `cuda.args` order): the
/// caller's pointer, or the temp's place in the workspace, known only once
/// the workspace is; from `cache` where it holds the map for that address,
/// else encoded and kept there. Every address is checked before any is
/// encoded, so a misaligned one is reported as such whichever map it is.
fn tensor_maps(
    cuda: &CudaProgram,
    index: usize,
    kernel: &Kernel,
    values: &[u64],
    cache: &mut MapCache,
) -> Outcome<Vec<TensorMapValue>> {
    let mut placed = Vec::with_capacity(kernel.tensor_maps.len());
    for m in &kernel.tensor_maps {
        let i = cuda
            .args
            .iter()
            .position(|a| matches!(a, KernelArg::Tensor { name, .. } if *name == m.tensor))
            .ok_or_else(|| {
                Failure::internal(format!(
                    "kernel {} maps {}, no argument",
                    kernel.name, m.tensor
                ))
            })?;
        crate::runtime::cuda::check_tensor_address(m, values[i]).map_err(Failure::input)?;
        placed.push((m, values[i]));
    }
    let mut maps = Vec::with_capacity(placed.len());
    for (j, (m, address)) in placed.into_iter().enumerate() {
        let map = match cache.get(&(index, j)) {
            Some((at, map)) if *at == address => *map,
            _ => {
                let map = encode_map(m, address)?;
                cache.insert((index, j), (address, map));
                map
            }
        };
        maps.push(map);
    }
    Ok(maps)
}

/// One CUDA context's loaded module and its kernels, in kernel order.
struct Loaded {
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
    /// Compute capability 9.0 or later: kernels marked
    /// [`Kernel::dependent`] are launched as programmatic dependents.
    hopper: bool,
    /// The device whose primary context `ctx` is, when the result holds a
    /// reference on it (see the module comment); released after unloading.
    retained: Option<sys::CUdevice>,
    /// The result's own workspace in `ctx` (address, bytes), for launches
    /// whose caller passed none; freed with the module.
    workspace: Option<(u64, usize)>,
    /// The kernels' tensor maps last encoded in this context.
    maps: MapCache,
}

/// The driver calls that tie a loaded module to its context's life. The
/// real ones are [`Driver`]'s; the tests below count references with a
/// fake.
pub(crate) trait ContextCalls {
    /// Whether the primary context of `dev` is active (exists).
    fn primary_active(&self, dev: sys::CUdevice) -> Result<bool, String>;
    /// `cuDevicePrimaryCtxRetain`: a new reference on `dev`'s primary
    /// context, created when it is not active.
    fn retain_primary(&self, dev: sys::CUdevice) -> Result<sys::CUcontext, String>;
    /// `cuDevicePrimaryCtxRelease`: drops one reference.
    fn release_primary(&self, dev: sys::CUdevice) -> Result<(), String>;
    fn push(&self, ctx: sys::CUcontext) -> Result<(), String>;
    fn pop(&self) -> Result<(), String>;
    fn unload(&self, module: sys::CUmodule) -> Result<(), String>;
    /// `cuMemFree` of memory allocated in the current context.
    fn free(&self, address: u64) -> Result<(), String>;
    /// The thread's current context, if any.
    fn current(&self) -> Result<Option<sys::CUcontext>, String>;
    /// The context `address` was allocated in (`None` where the driver
    /// names none, as for memory mapped with virtual memory management),
    /// or an error for an address the driver does not know.
    fn pointer_context(&self, address: u64) -> Result<Option<sys::CUcontext>, String>;
    /// The device `address` lives on.
    fn pointer_device(&self, address: u64) -> Result<sys::CUdevice, String>;
}

/// The CUDA driver (cudarc's bindings; the library is loaded already by
/// whoever made a [`Loaded`]).
struct Driver;

fn named(what: &str) -> impl Fn(drv::DriverError) -> String + '_ {
    move |e| {
        format!(
            "{what}: {}",
            crate::runtime::cuda::describe_driver_error(&e)
        )
    }
}

impl ContextCalls for Driver {
    fn primary_active(&self, dev: sys::CUdevice) -> Result<bool, String> {
        let (mut flags, mut active): (c_uint, std::ffi::c_int) = (0, 0);
        // SAFETY: `dev` came from the driver; both outputs are live locals.
        unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
            .result()
            .map_err(named("cuDevicePrimaryCtxGetState"))?;
        Ok(active != 0)
    }
    fn retain_primary(&self, dev: sys::CUdevice) -> Result<sys::CUcontext, String> {
        // SAFETY: `dev` came from the driver (cuCtxGetDevice).
        unsafe { drv::primary_ctx::retain(dev) }.map_err(named("cuDevicePrimaryCtxRetain"))
    }
    fn release_primary(&self, dev: sys::CUdevice) -> Result<(), String> {
        // SAFETY: as for `retain_primary`; called once per retain.
        unsafe { drv::primary_ctx::release(dev) }.map_err(named("cuDevicePrimaryCtxRelease"))
    }
    fn push(&self, ctx: sys::CUcontext) -> Result<(), String> {
        // SAFETY: `ctx` is a context a module was loaded in; the result
        // holds a reference on it, or the caller keeps it alive (header).
        unsafe { sys::cuCtxPushCurrent_v2(ctx) }
            .result()
            .map_err(named("cuCtxPushCurrent"))
    }
    fn pop(&self) -> Result<(), String> {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what `push` pushed; `popped` is a live local.
        unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }
            .result()
            .map_err(named("cuCtxPopCurrent"))
    }
    fn unload(&self, module: sys::CUmodule) -> Result<(), String> {
        // SAFETY: `module` was loaded and not unloaded yet; its context is
        // current.
        unsafe { drv::module::unload(module) }.map_err(named("cuModuleUnload"))
    }
    fn free(&self, address: u64) -> Result<(), String> {
        // SAFETY: `address` came from cuMemAlloc in the current context and
        // is freed once (the workspace forgets it).
        unsafe { sys::cuMemFree_v2(address) }
            .result()
            .map_err(named("cuMemFree"))
    }
    fn current(&self) -> Result<Option<sys::CUcontext>, String> {
        drv::ctx::get_current().map_err(named("cuCtxGetCurrent"))
    }
    fn pointer_context(&self, address: u64) -> Result<Option<sys::CUcontext>, String> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the attribute CONTEXT writes one CUcontext into `ctx`; the
        // driver only looks the address up, never dereferences it.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut ctx as *mut sys::CUcontext).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                address,
            )
        }
        .result()
        .map_err(named("cuPointerGetAttribute(CONTEXT)"))?;
        Ok((!ctx.is_null()).then_some(ctx))
    }
    fn pointer_device(&self, address: u64) -> Result<sys::CUdevice, String> {
        let mut ordinal: std::ffi::c_int = -1;
        // SAFETY: the attribute DEVICE_ORDINAL writes one int; the address
        // is only looked up.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut std::ffi::c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                address,
            )
        }
        .result()
        .map_err(named("cuPointerGetAttribute(DEVICE_ORDINAL)"))?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `dev` is a live local; the ordinal came from the driver.
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) }
            .result()
            .map_err(named("cuDeviceGet"))?;
        Ok(dev)
    }
}

/// Whether `stream` names the null stream of "the current context": null,
/// `CU_STREAM_LEGACY` (1) or `CU_STREAM_PER_THREAD` (2).
fn names_the_null_stream(stream: sys::CUstream) -> bool {
    stream.addr() <= 2
}

/// The context a launch runs in, and whether a reference on a device's
/// primary context was taken to find it (released after the launch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LaunchContext {
    ctx: sys::CUcontext,
    release: Option<sys::CUdevice>,
}

/// The context of a launch on the null stream (see the module comment):
/// that of `probe`, a device pointer of the launch (the first tensor's, or
/// the workspace's), else, with no pointer to look at, the thread's
/// current one.
fn launch_context(d: &impl ContextCalls, probe: Option<u64>) -> Outcome<LaunchContext> {
    let Some(address) = probe else {
        let ctx = d.current().map_err(Failure::environment)?.ok_or_else(|| {
            Failure::environment(
                "no tensor pointer to find the device from and no current CUDA context on this thread: pass a stream",
            )
        })?;
        return Ok(LaunchContext { ctx, release: None });
    };
    if let Ok(Some(ctx)) = d.pointer_context(address) {
        return Ok(LaunchContext { ctx, release: None });
    }
    let dev = d.pointer_device(address).map_err(|e| {
        Failure::argument(format!(
            "the device pointer {address:#x} is not memory the CUDA driver knows ({e}); pass device pointers"
        ))
    })?;
    let ctx = d.retain_primary(dev).map_err(Failure::environment)?;
    Ok(LaunchContext {
        ctx,
        release: Some(dev),
    })
}

/// Takes a reference on `ctx`, the current context, when it is the primary
/// context of its device `dev`; returns `dev` then (to release after the
/// module is unloaded), `None` for a context made with `cuCtxCreate`. An
/// inactive primary context is not `ctx` (which lives): it is not retained,
/// which would create it.
fn retain_context(
    d: &impl ContextCalls,
    ctx: sys::CUcontext,
    dev: sys::CUdevice,
) -> Result<Option<sys::CUdevice>, String> {
    if !d.primary_active(dev)? {
        return Ok(None);
    }
    let primary = d.retain_primary(dev)?;
    if primary == ctx {
        Ok(Some(dev))
    } else {
        d.release_primary(dev)?;
        Ok(None)
    }
}

/// Unloads `l`'s module with its context current, then releases the
/// reference the result held on that context. The first error is returned;
/// the release happens in any case. A context the result holds no
/// reference on that cannot be made current was destroyed by the caller,
/// and its modules with it: that is no error here (the header asks callers
/// not to do it).
fn unload(d: &impl ContextCalls, l: &Loaded) -> Result<(), String> {
    let mut outcome = match d.push(l.ctx) {
        Ok(()) => {
            let freed = l.workspace.map_or(Ok(()), |(address, _)| d.free(address));
            let unloaded = d.unload(l.module);
            freed.and(unloaded).and(d.pop())
        }
        Err(e) if l.retained.is_some() => Err(e),
        Err(_) => Ok(()),
    };
    if let Some(dev) = l.retained {
        let released = d.release_primary(dev);
        outcome = outcome.and(released);
    }
    outcome
}

/// The compiled and loaded forms of one result's CUDA program.
#[derive(Default)]
pub(crate) struct Modules {
    /// The architecture `pf_context_set_arch` asked for (else
    /// `POLYFUSE_CUDA_ARCH`, else the device's choice).
    pub(crate) arch: Option<String>,
    /// NUL-terminated PTX per compute capability.
    ptx: HashMap<(i32, i32), Vec<u8>>,
    /// PTX per architecture (`sm_90a`) that came with a loaded artifact.
    pub(crate) stored: HashMap<String, String>,
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

/// The architecture (`sm_90`) of device `ordinal`, or where `None` of the
/// device of the thread's current context, else device 0: what the C
/// ABI's tuning cache is keyed by (`pf_context_set_device`). Asks the
/// driver without making or retaining a context.
pub(crate) fn device_arch(ordinal: Option<i32>) -> Outcome<String> {
    require_driver()?;
    drv::init().map_err(driver_error("cuInit"))?;
    let mut dev: sys::CUdevice = 0;
    match ordinal {
        Some(n) => {
            // SAFETY: `dev` is a live local; a bad ordinal is an error.
            unsafe { sys::cuDeviceGet(&mut dev, n) }
                .result()
                .map_err(|e| Failure::argument(format!("CUDA device {n}: {e:?}")))?
        }
        None => match Driver.current().map_err(Failure::environment)? {
            // SAFETY: a context is current; `dev` is a live local.
            Some(_) => unsafe { sys::cuCtxGetDevice(&mut dev) }
                .result()
                .map_err(driver_error("cuCtxGetDevice"))?,
            // SAFETY: as above, device 0.
            None => unsafe { sys::cuDeviceGet(&mut dev, 0) }
                .result()
                .map_err(driver_error("cuDeviceGet"))?,
        },
    }
    use sys::CUdevice_attribute as A;
    // SAFETY: `dev` came from the driver.
    let (major, minor) = unsafe {
        (
            drv::device::get_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .map_err(driver_error("cuDeviceGetAttribute"))?,
            drv::device::get_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                .map_err(driver_error("cuDeviceGetAttribute"))?,
        )
    };
    Ok(format!("sm_{}", major * 10 + minor))
}

/// NUL-terminated PTX of `cuda` for compute capability `cc`, through the
/// CUDA runtime's NVRTC compile (which finds NVRTC and the CUDA headers the
/// same way `polyfuse run --target cuda` does), for the architecture the
/// command line would choose (`runtime::cuda::target_arch`: `sm_90a` for
/// kernels with a `wgmma` path on an H100, `POLYFUSE_CUDA_ARCH` honoured).
/// PTX a loaded artifact brought (`pf_result_load`) is used as it is, where
/// it was made for that architecture: no NVRTC is needed then.
fn compile_ptx(
    cuda: &CudaProgram,
    cc: (i32, i32),
    arch: Option<&str>,
    stored: &HashMap<String, String>,
) -> Outcome<Vec<u8>> {
    let requested = arch
        .map(str::to_string)
        .or_else(crate::runtime::cuda::requested_arch);
    let arch =
        crate::runtime::cuda::target_arch(&cuda.source, cc.0 * 10 + cc.1, requested.as_deref())?;
    let mut bytes = match stored.get(&arch) {
        Some(ptx) => ptx.clone().into_bytes(),
        None => crate::runtime::cuda::compile_ptx(&cuda.source, &arch)?.into_bytes(),
    };
    bytes.push(0);
    Ok(bytes)
}

impl Modules {
    /// No module yet; launches compile for `arch` (see the field).
    pub(crate) fn for_arch(arch: Option<String>) -> Modules {
        let mut m = Modules::default();
        m.arch = arch;
        m
    }

    /// Launches kernel `index` of `cuda`; see `pf_result_launch`. `probe`
    /// is a device pointer of the launch, for the null stream's context.
    ///
    /// # Safety
    /// `stream` is null or a live stream, and `args` holds device addresses
    /// valid in its context for buffers as large as the kernel indexes
    /// (with the workspace's offsets, a caller's workspace as large as
    /// `workspace` says).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &mut self,
        cuda: &CudaProgram,
        index: usize,
        grid: [u32; 3],
        kernel: &Kernel,
        args: &[Arg],
        workspace: Workspace,
        probe: Option<u64>,
        stream: CUstream,
    ) -> Outcome {
        require_driver()?;
        drv::init().map_err(driver_error("cuInit"))?;
        let stream: sys::CUstream = stream.cast();
        let target = if names_the_null_stream(stream) {
            launch_context(&Driver, probe)?
        } else {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `stream` is live by the caller's contract; `ctx` is a
            // valid place for the answer.
            unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }
                .result()
                .map_err(driver_error("cuStreamGetCtx"))?;
            LaunchContext { ctx, release: None }
        };
        let ctx = target.ctx;
        // SAFETY: `ctx` is the live context of the caller's stream or of
        // its memory; it is popped again below.
        let pushed = unsafe { sys::cuCtxPushCurrent_v2(ctx) }
            .result()
            .map_err(driver_error("cuCtxPushCurrent"));
        let outcome = pushed.and_then(|()| {
            // SAFETY: as for this function; `ctx` is now current.
            let launched =
                unsafe { self.launch_in(ctx, cuda, index, grid, kernel, args, workspace, stream) };
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops what was pushed above.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
            launched
        });
        if let Some(dev) = target.release {
            // The primary context retained to find it; a module loaded
            // there holds a reference of its own (`retain_context`).
            let _ = Driver.release_primary(dev);
        }
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
        args: &[Arg],
        workspace: Workspace,
        stream: sys::CUstream,
    ) -> Outcome {
        if !self.loaded.contains_key(&(ctx as usize)) {
            let loaded = self.load(ctx, cuda)?;
            self.loaded.insert(ctx as usize, loaded);
        }
        let loaded = self
            .loaded
            .get_mut(&(ctx as usize))
            .ok_or_else(|| Failure::internal("the module just loaded is missing"))?;
        let base = match workspace {
            Workspace::Caller(address) => address,
            Workspace::Own(bytes) => own_workspace(loaded, bytes)?,
        };
        let mut values = resolve(args, base);
        let mut maps = tensor_maps(cuda, index, kernel, &values, &mut loaded.maps)?;
        let f = loaded.functions[index];
        let dependent = kernel.dependent && loaded.hopper;
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
        // A pointer to each parameter's value: the 8-byte ones, then the
        // maps' 128 bytes (by value, `const __grid_constant__`).
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| std::ptr::from_mut(v).cast())
            .chain(maps.iter_mut().map(|m| std::ptr::from_mut(m).cast()))
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
        // value each, in `args` order (gpu::KernelArg), then one 128-byte
        // map per `Kernel::tensor_maps` entry; the values live until the
        // call returns, and the driver copies them at launch.
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
            Entry::Vacant(v) => {
                v.insert(compile_ptx(cuda, cc, self.arch.as_deref(), &self.stored)?)
            }
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
        let retained = match retain_context(&Driver, ctx, dev) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: `module` is loaded in the current context.
                let _ = unsafe { drv::module::unload(module) };
                return Err(Failure::environment(format!("CUDA driver: {e}")));
            }
        };
        Ok(Loaded {
            ctx,
            module,
            functions,
            hopper: cc.0 >= 9,
            retained,
            workspace: None,
            maps: MapCache::new(),
        })
    }

    /// Unloads every module, each in its context, and releases the
    /// contexts the result retained (see the module comment); the first
    /// error, with every module attempted.
    pub(crate) fn unload_all(&mut self) -> Result<(), String> {
        let mut outcome = Ok(());
        for (_, l) in self.loaded.drain() {
            let done = unload(&Driver, &l);
            outcome = outcome.and(done);
        }
        outcome
    }
}

/// The address of the result's own workspace in `l`'s context (current),
/// at least `bytes` large: allocated on first need, and reallocated when
/// larger sizes need more, after the context's work is done (the old
/// buffer may still be in use by kernels queued before). Null for 0 bytes.
fn own_workspace(l: &mut Loaded, bytes: usize) -> Outcome<u64> {
    if bytes == 0 {
        return Ok(l.workspace.map_or(0, |(address, _)| address));
    }
    if let Some((address, size)) = l.workspace {
        if size >= bytes {
            return Ok(address);
        }
        // SAFETY: the context is current; this waits for its work.
        unsafe { sys::cuCtxSynchronize() }
            .result()
            .map_err(driver_error(
                "cuCtxSynchronize (before growing the workspace)",
            ))?;
        l.workspace = None;
        Driver.free(address).map_err(Failure::environment)?;
    }
    let mut address: sys::CUdeviceptr = 0;
    // SAFETY: the context is current; `address` is a live local.
    unsafe { sys::cuMemAlloc_v2(&mut address, bytes) }
        .result()
        .map_err(driver_error("cuMemAlloc (the workspace)"))?;
    l.workspace = Some((address, bytes));
    Ok(address)
}

impl Drop for Modules {
    fn drop(&mut self) {
        // `pf_result_destroy` unloads and reports; this is for a result
        // dropped otherwise (a launch on another thread held it last).
        let _ = self.unload_all();
    }
}

#[cfg(test)]
mod tests {
    //! The order of the context calls, against a fake driver that counts
    //! the references on one device's primary context: a module unloaded
    //! in a context with no reference left fails as the real driver does
    //! (`CUDA_ERROR_INVALID_HANDLE`, issue 30).
    use std::cell::RefCell;

    use super::*;

    const DEV: sys::CUdevice = 0;

    struct Fake {
        primary: sys::CUcontext,
        refs: RefCell<u32>,
        current: RefCell<Vec<sys::CUcontext>>,
        log: RefCell<Vec<String>>,
        /// Device memory: address -> (its context, if the driver names
        /// one; its device).
        memory: Vec<(u64, Option<sys::CUcontext>, sys::CUdevice)>,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                primary: std::ptr::without_provenance_mut(0x1000),
                refs: RefCell::new(0),
                current: RefCell::new(Vec::new()),
                log: RefCell::new(Vec::new()),
                memory: Vec::new(),
            }
        }
        fn note(&self, s: &str) {
            self.log.borrow_mut().push(s.to_string());
        }
        fn alive(&self, ctx: sys::CUcontext) -> bool {
            ctx != self.primary || *self.refs.borrow() > 0
        }
    }

    impl ContextCalls for Fake {
        fn primary_active(&self, _: sys::CUdevice) -> Result<bool, String> {
            Ok(*self.refs.borrow() > 0)
        }
        fn retain_primary(&self, _: sys::CUdevice) -> Result<sys::CUcontext, String> {
            *self.refs.borrow_mut() += 1;
            self.note("retain");
            Ok(self.primary)
        }
        fn release_primary(&self, _: sys::CUdevice) -> Result<(), String> {
            let mut r = self.refs.borrow_mut();
            if *r == 0 {
                return Err("cuDevicePrimaryCtxRelease: CUDA_ERROR_INVALID_CONTEXT".into());
            }
            *r -= 1;
            drop(r);
            self.note("release");
            Ok(())
        }
        fn push(&self, ctx: sys::CUcontext) -> Result<(), String> {
            // The primary context's handle stays valid when it is reset:
            // the push succeeds, the unload then fails.
            self.current.borrow_mut().push(ctx);
            self.note("push");
            Ok(())
        }
        fn pop(&self) -> Result<(), String> {
            self.current.borrow_mut().pop();
            self.note("pop");
            Ok(())
        }
        fn unload(&self, _: sys::CUmodule) -> Result<(), String> {
            let ctx = self.current.borrow().last().copied();
            match ctx {
                Some(c) if self.alive(c) => {
                    self.note("unload");
                    Ok(())
                }
                _ => Err("cuModuleUnload: CUDA_ERROR_INVALID_HANDLE".into()),
            }
        }
        fn free(&self, address: u64) -> Result<(), String> {
            let ctx = self.current.borrow().last().copied();
            match ctx {
                Some(c) if self.alive(c) => {
                    self.note(&format!("free {address:#x}"));
                    Ok(())
                }
                _ => Err("cuMemFree: CUDA_ERROR_INVALID_CONTEXT".into()),
            }
        }
        fn current(&self) -> Result<Option<sys::CUcontext>, String> {
            Ok(self.current.borrow().last().copied())
        }
        fn pointer_context(&self, address: u64) -> Result<Option<sys::CUcontext>, String> {
            match self.memory.iter().find(|m| m.0 == address) {
                Some(m) => Ok(m.1),
                None => Err("CUDA_ERROR_INVALID_VALUE".into()),
            }
        }
        fn pointer_device(&self, address: u64) -> Result<sys::CUdevice, String> {
            match self.memory.iter().find(|m| m.0 == address) {
                Some(m) => Ok(m.2),
                None => Err("CUDA_ERROR_INVALID_VALUE".into()),
            }
        }
    }

    fn loaded(ctx: sys::CUcontext, retained: Option<sys::CUdevice>) -> Loaded {
        Loaded {
            ctx,
            module: std::ptr::without_provenance_mut(0x2000),
            functions: Vec::new(),
            hopper: false,
            retained,
            workspace: None,
            maps: MapCache::new(),
        }
    }

    #[test]
    fn a_result_keeps_the_primary_context_until_its_module_is_unloaded() {
        let d = Fake::new();
        // The caller: cuDevicePrimaryCtxRetain, made current.
        let ctx = d.retain_primary(DEV).unwrap();
        // The result's first launch loads its module there and retains it.
        let retained = retain_context(&d, ctx, DEV).unwrap();
        assert_eq!(retained, Some(DEV));
        assert_eq!(*d.refs.borrow(), 2);
        // The caller releases its context before destroying the result
        // (examples/cpp/gemm.cpp): the context lives on.
        d.release_primary(DEV).unwrap();
        assert_eq!(unload(&d, &loaded(ctx, retained)), Ok(()));
        assert_eq!(*d.refs.borrow(), 0, "the result's reference is released");
        assert!(
            d.current.borrow().is_empty(),
            "the current context is restored"
        );
        assert_eq!(
            d.log.borrow()[3..],
            ["push", "unload", "pop", "release"].map(String::from)
        );
    }

    #[test]
    fn without_the_reference_the_unload_fails_as_in_issue_30() {
        // What happened before: no reference of the result's own, the
        // caller's release destroys the context, and the unload fails.
        let d = Fake::new();
        let ctx = d.retain_primary(DEV).unwrap();
        d.release_primary(DEV).unwrap();
        let e = unload(&d, &loaded(ctx, None)).unwrap_err();
        assert!(e.contains("CUDA_ERROR_INVALID_HANDLE"), "{e}");
    }

    #[test]
    fn either_order_of_destruction_releases_every_reference() {
        // The result destroyed first, the caller's release after.
        let d = Fake::new();
        let ctx = d.retain_primary(DEV).unwrap();
        let retained = retain_context(&d, ctx, DEV).unwrap();
        assert_eq!(unload(&d, &loaded(ctx, retained)), Ok(()));
        assert_eq!(*d.refs.borrow(), 1);
        d.release_primary(DEV).unwrap();
        assert_eq!(*d.refs.borrow(), 0);
    }

    #[test]
    fn a_created_context_is_not_retained() {
        // cuCtxCreate's context while the primary context is active: the
        // reference taken to compare is given back at once.
        let d = Fake::new();
        let primary = d.retain_primary(DEV).unwrap();
        let created: sys::CUcontext = std::ptr::without_provenance_mut(0x3000);
        assert_eq!(retain_context(&d, created, DEV), Ok(None));
        assert_eq!(*d.refs.borrow(), 1);
        d.release_primary(DEV).unwrap();
        let _ = primary;
        // With the primary context inactive, nothing is retained (which
        // would create it).
        let d = Fake::new();
        assert_eq!(retain_context(&d, created, DEV), Ok(None));
        assert!(d.log.borrow().is_empty(), "{:?}", d.log.borrow());
        assert_eq!(unload(&d, &loaded(created, None)), Ok(()));
    }

    #[test]
    fn the_result_frees_its_workspace_in_its_context_before_unloading() {
        let d = Fake::new();
        let ctx = d.retain_primary(DEV).unwrap();
        let retained = retain_context(&d, ctx, DEV).unwrap();
        d.release_primary(DEV).unwrap();
        let mut l = loaded(ctx, retained);
        l.workspace = Some((0x7000, 4096));
        assert_eq!(unload(&d, &l), Ok(()));
        assert_eq!(
            d.log.borrow()[3..],
            ["push", "free 0x7000", "unload", "pop", "release"].map(String::from)
        );
        assert_eq!(*d.refs.borrow(), 0);
    }

    #[test]
    fn the_null_stream_runs_where_the_tensors_live_not_where_the_thread_is() {
        // issue 33: a fresh thread (no current context) launching on the
        // default stream failed; a thread whose current context is another
        // device's would have launched there.
        let other: sys::CUcontext = std::ptr::without_provenance_mut(0x5000);
        let mut d = Fake::new();
        d.memory = vec![(0xa000, None, 1), (0xb000, Some(other), 0)];
        // Memory the driver names no context for (virtual memory
        // management): its device's primary context, retained for the
        // launch, whatever is current.
        d.current.borrow_mut().push(other);
        let c = launch_context(&d, Some(0xa000)).unwrap();
        assert_eq!(
            c,
            LaunchContext {
                ctx: d.primary,
                release: Some(1)
            }
        );
        assert_eq!(*d.refs.borrow(), 1, "retained until the launch is done");
        d.current.borrow_mut().clear();
        // Memory of a context: that context, even with none current.
        let c = launch_context(&d, Some(0xb000)).unwrap();
        assert_eq!(
            c,
            LaunchContext {
                ctx: other,
                release: None
            }
        );
        // Not device memory: refused as the caller's mistake.
        let e = launch_context(&d, Some(0xc000)).unwrap_err();
        assert_eq!(e.status, super::super::PF_ERR_INVALID_ARGUMENT);
        assert!(e.message.contains("0xc000"), "{}", e.message);
        // No pointer at all and no current context: an environment error
        // that says what to do.
        let e = launch_context(&d, None).unwrap_err();
        assert!(e.message.contains("pass a stream"), "{}", e.message);
        // No pointer, a current context: that one.
        d.current.borrow_mut().push(other);
        assert_eq!(launch_context(&d, None).unwrap().ctx, other);
    }

    #[test]
    fn special_stream_handles_are_the_null_stream() {
        for s in [0usize, 1, 2] {
            assert!(names_the_null_stream(std::ptr::without_provenance_mut(s)));
        }
        assert!(!names_the_null_stream(std::ptr::without_provenance_mut(
            0x7f00_0000
        )));
    }

    /// A program of tensors A and B around a parameter, whose one kernel
    /// maps B, then A.
    fn mapped_program() -> CudaProgram {
        use crate::frontend::ast::DType;
        use crate::isl::ast::Expr;
        let tensor = |name: &str| KernelArg::Tensor {
            name: name.into(),
            dtype: DType::F16,
            shape: vec!["64".into(), "64".into()],
        };
        let map = |tensor: &str| TensorMap {
            tensor: tensor.into(),
            dtype: DType::F16,
            dims: vec![64, 64],
            strides: vec![128],
            boxes: vec![64, 64],
            swizzle: 128,
        };
        CudaProgram {
            source: String::new(),
            kernels: vec![Kernel {
                name: "k".into(),
                grid: [Expr::Int(1), Expr::Int(1), Expr::Int(1)],
                block: [128, 1, 1],
                dynamic_shared: 0,
                static_shared: 0,
                dependent: false,
                globals: vec!["A".into(), "B".into()],
                tensor_maps: vec![map("B"), map("A")],
            }],
            args: vec![
                tensor("A"),
                KernelArg::Param { name: "N".into() },
                tensor("B"),
            ],
            host_loops: Vec::new(),
        }
    }

    #[test]
    fn each_map_is_encoded_from_its_own_tensors_address() {
        let p = mapped_program();
        let k = &p.kernels[0];
        // B's resolved address is misaligned: its map is refused as the
        // caller's error, before any driver call.
        let mut cache = MapCache::new();
        let e = tensor_maps(&p, 0, k, &[0x1000, 7, 0x2008], &mut cache).unwrap_err();
        assert_eq!(e.status, super::super::PF_ERR_INPUT);
        assert!(
            e.message.contains("tensor B's buffer at 0x2008"),
            "{}",
            e.message
        );
        let e = tensor_maps(&p, 0, k, &[0x1004, 7, 0x2000], &mut cache).unwrap_err();
        assert!(
            e.message.contains("tensor A's buffer at 0x1004"),
            "{}",
            e.message
        );
        // Aligned: encoded where there is a driver (the address is only
        // recorded), an environment error where there is none.
        match tensor_maps(&p, 0, k, &[0x1000, 7, 0x2000], &mut cache) {
            Ok(maps) => {
                assert_eq!(maps.len(), 2);
                assert_ne!(maps[0], maps[1], "B's map and A's differ in the address");
            }
            Err(e) => assert_eq!(e.status, super::super::PF_ERR_ENVIRONMENT, "{}", e.message),
        }
    }

    #[test]
    fn a_map_encoded_for_the_same_address_is_reused() {
        let p = mapped_program();
        let k = &p.kernels[0];
        // The kernel maps B, then A. Maps kept for these addresses
        // (stand-ins no driver made): used as they are, no driver call.
        let (b, a) = (TensorMapValue([2; 16]), TensorMapValue([1; 16]));
        let mut cache = MapCache::from([((0, 0), (0x2000, b)), ((0, 1), (0x1000, a))]);
        let maps = tensor_maps(&p, 0, k, &[0x1000, 7, 0x2000], &mut cache).unwrap();
        assert_eq!(maps, vec![b, a]);
        // B moved: its map is encoded again (an environment error without
        // a driver), A's is not asked for.
        match tensor_maps(&p, 0, k, &[0x1000, 7, 0x3000], &mut cache) {
            Ok(maps) => {
                assert_ne!(maps[0], b);
                assert_eq!(maps[1], a);
                assert_eq!(cache[&(0, 0)].0, 0x3000);
            }
            Err(e) => assert_eq!(e.status, super::super::PF_ERR_ENVIRONMENT, "{}", e.message),
        }
        // Another kernel's maps are its own.
        assert!(!cache.contains_key(&(1, 0)));
    }

    #[test]
    fn workspace_offsets_are_added_to_the_base() {
        let args = [Arg::Pointer(0x10), Arg::Workspace(256), Arg::Long(-3)];
        assert_eq!(resolve(&args, 0x1_0000), [0x10, 0x1_0100, (-3i64) as u64]);
    }
}
