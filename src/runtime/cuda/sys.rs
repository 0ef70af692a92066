//! The only `unsafe` code of the CUDA runtime: loading the CUDA libraries,
//! the NVRTC calls cudarc has no safe form for (CUBIN output, supported
//! architectures, version), encoding TMA tensor maps, and kernel launches.
//!
//! cudarc loads `libcuda` and `libnvrtc` lazily by file name and *panics*
//! when neither name resolves. So before cudarc is first used, each library
//! is looked for here ([`load_driver`], [`load_nvrtc`]): first by the names
//! cudarc tries (the dynamic loader's usual search: `LD_LIBRARY_PATH`, the
//! ld.so cache), then by full path in the directories the caller lists. A
//! library found by path is opened and deliberately never closed: glibc's
//! `dlopen` matches an already loaded object by its soname, so cudarc's
//! later `dlopen("libnvrtc.so.13")` returns that same object.

use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::driver::PushKernelArg;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
};
use cudarc::nvrtc::result as nvrtc;
use cudarc::nvrtc::sys as nvrtc_sys;

use crate::frontend::ast::DType;
use crate::gpu::TensorMap;

/// Where a library was found (its name or path), or the folders that were
/// searched after the loader's own search by name failed.
pub type Found = std::result::Result<String, Vec<String>>;

/// Opens `name` (a file name, searched by the dynamic loader, or a path)
/// for the life of the process.
fn open_forever(name: &str) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated string that outlives the call. The
    // handle is intentionally leaked (see the module comment); running the
    // library's initialisers is what loading it for cudarc would do too.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    !handle.is_null()
}

/// Finds one of cudarc's candidate names of library `lib` by name, then in
/// each of `dirs`.
fn find(lib: &str, dirs: &[PathBuf]) -> Found {
    let names = cudarc::get_lib_name_candidates(lib);
    // cudarc tries the same names in the same order: it gets the library
    // opened here.
    if let Some(n) = names.iter().find(|n| open_forever(n)) {
        return Ok(n.clone());
    }
    let mut searched = Vec::new();
    for d in dirs {
        for n in &names {
            let p = d.join(n);
            if p.is_file() {
                let s = p.to_string_lossy().into_owned();
                if open_forever(&s) {
                    return Ok(s);
                }
                searched.push(format!("{s} (present, but it does not load)"));
            }
        }
        if d.is_dir() {
            searched.push(d.display().to_string());
        }
    }
    Err(searched)
}

/// Loads the CUDA driver library (`libcuda.so.1`) once per process.
pub fn load_driver(dirs: &[PathBuf]) -> &'static Found {
    static DRIVER: OnceLock<Found> = OnceLock::new();
    DRIVER.get_or_init(|| find("cuda", dirs))
}

static NVRTC: OnceLock<Found> = OnceLock::new();

/// Loads NVRTC (`libnvrtc.so.13`, or another version's name) once per
/// process.
pub fn load_nvrtc(dirs: &[PathBuf]) -> &'static Found {
    NVRTC.get_or_init(|| find("nvrtc", dirs))
}

/// The path NVRTC was loaded from, when it was found by path (not by name).
pub fn nvrtc_path() -> Option<&'static str> {
    match NVRTC.get() {
        Some(Ok(p)) if p.contains('/') => Some(p.as_str()),
        _ => None,
    }
}

/// NVRTC's version (major, minor). Call only after [`load_nvrtc`] found it.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loaded (the caller checked); both pointers are to
    // live locals.
    let r = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    r.result().ok().map(|_| (major, minor))
}

/// The real architectures NVRTC can compile for (`90` for sm_90). Call only
/// after [`load_nvrtc`] found it.
pub fn nvrtc_archs() -> Vec<i32> {
    let mut n: c_int = 0;
    // SAFETY: NVRTC is loaded; `n` is a live local.
    if unsafe { nvrtc_sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .is_err()
        || n <= 0
    {
        return Vec::new();
    }
    let mut archs = vec![0 as c_int; n as usize];
    // SAFETY: `archs` has room for the `n` entries NVRTC reported.
    if unsafe { nvrtc_sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .is_err()
    {
        return Vec::new();
    }
    archs
}

/// The CUDA version the driver supports (`12040` for 12.4). Call only
/// after [`load_driver`] found it.
pub fn driver_version() -> Option<i32> {
    let mut v: c_int = 0;
    // SAFETY: the driver library is loaded; `v` is a live local.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    r.result().ok().map(|_| v)
}

/// What NVRTC produced.
pub struct NvrtcOutput {
    /// PTX text, when NVRTC kept it (a virtual `compute_XX` target).
    pub ptx: Option<String>,
    /// Machine code, for a real `sm_XX` target.
    pub cubin: Option<Vec<u8>>,
    pub log: String,
}

/// Why NVRTC failed: its error and log.
pub struct NvrtcFailure {
    pub error: String,
    pub log: String,
}

/// An NVRTC program, destroyed on drop on every path.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` was created by `create_program` and is destroyed
        // only here.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// Reads NVRTC's `(size, fill)` pair of calls into a byte vector.
fn read_bytes(
    size: impl FnOnce(&mut usize) -> nvrtc_sys::nvrtcResult,
    fill: impl FnOnce(*mut c_char) -> nvrtc_sys::nvrtcResult,
) -> Option<Vec<u8>> {
    let mut n = 0usize;
    size(&mut n).result().ok()?;
    let mut buf = vec![0u8; n];
    fill(buf.as_mut_ptr() as *mut c_char).result().ok()?;
    Some(buf)
}

fn text(mut bytes: Vec<u8>) -> String {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles CUDA `source` with NVRTC under `options`. Call only after
/// [`load_nvrtc`] found NVRTC.
pub fn nvrtc_compile(
    source: &str,
    name: &str,
    options: &[String],
) -> std::result::Result<NvrtcOutput, NvrtcFailure> {
    let fail = |error: String| NvrtcFailure {
        error,
        log: String::new(),
    };
    let src = CString::new(source).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| fail("the name contains a NUL byte".into()))?;
    if options.iter().any(|o| o.contains('\0')) {
        return Err(fail("an option contains a NUL byte".into()));
    }
    let prog =
        Program(nvrtc::create_program(&src, Some(&cname)).map_err(|e| fail(format!("{e:?}")))?);
    let p = prog.0;
    // SAFETY: `p` is a live program (destroyed when `prog` drops, after
    // every use below); the options contain no NUL byte (checked above).
    let compiled = unsafe { nvrtc::compile_program(p, options) };
    // SAFETY: as above; the log exists once compilation was attempted.
    let log = read_bytes(
        |n| unsafe { nvrtc_sys::nvrtcGetProgramLogSize(p, n) },
        |b| unsafe { nvrtc_sys::nvrtcGetProgramLog(p, b) },
    )
    .map(text)
    .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(NvrtcFailure {
            error: format!("{e:?}"),
            log,
        });
    }
    // SAFETY: as above; each getter writes at most the size it reported.
    let ptx = read_bytes(
        |n| unsafe { nvrtc_sys::nvrtcGetPTXSize(p, n) },
        |b| unsafe { nvrtc_sys::nvrtcGetPTX(p, b) },
    )
    .map(text)
    .filter(|s| !s.is_empty());
    // SAFETY: as above.
    let cubin = read_bytes(
        |n| unsafe { nvrtc_sys::nvrtcGetCUBINSize(p, n) },
        |b| unsafe { nvrtc_sys::nvrtcGetCUBIN(p, b) },
    )
    .filter(|b| !b.is_empty());
    Ok(NvrtcOutput { ptx, cubin, log })
}

/// Creates the primary context of device `ordinal`. Call only after
/// [`load_driver`] found the driver. cudarc panics where a driver entry
/// point it expects is missing (a driver older than the bindings); that
/// panic is caught and returned as an error message.
pub fn context(ordinal: usize) -> std::result::Result<Arc<CudaContext>, String> {
    let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|p| panic_text(p.as_ref()))?
        .map_err(|e| describe(&e))?;
    // SAFETY: polyfuse uses one stream of this context, and orders every
    // copy and launch on it, so cudarc's per-buffer events (which would add
    // event records to every launch that is timed) are not needed.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// The text of a panic caught around a cudarc call.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    crate::error::panic_text(p).unwrap_or_else(|| "a panic inside cudarc".to_string())
}

/// A driver error as `CUDA_ERROR_NAME: description`.
pub fn describe(e: &DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name}: {}", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// The kernels' `PfTensorMap` parameter: the driver's 128-byte
/// `CUtensorMap`, which the kernel declares 64-byte aligned, so the value
/// the launch reads it from is aligned alike.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapValue(pub [u64; 16]);

// SAFETY: plain bytes of the kernel parameter's exact size and alignment
// (`struct __align__(64) PfTensorMap { unsigned long long opaque[16]; }`).
unsafe impl DeviceRepr for TensorMapValue {}

/// One kernel argument.
pub enum Arg<'a> {
    /// A tensor's device buffer, passed as its device pointer.
    Buffer(&'a CudaSlice<u8>),
    /// A parameter, passed as a C `long`.
    Long(&'a i64),
    /// A TMA tensor map, passed by value (`const __grid_constant__
    /// PfTensorMap`), after the other arguments.
    TensorMap(TensorMapValue),
}

/// The largest rank a tiled tensor map has (`cuTensorMapEncodeTiled`).
const MAX_MAP_RANK: usize = 5;
/// The most elements a box spans along one dimension.
const MAX_BOX: u32 = 256;

/// Refuses what `cuTensorMapEncodeTiled` would refuse in `map` itself, each
/// reason named (the driver's answer is only `CUDA_ERROR_INVALID_VALUE`);
/// pure, so it is tested without a driver. A failure is polyfuse's bug:
/// the code generator made the map.
pub fn check_map(map: &TensorMap) -> std::result::Result<(), String> {
    let t = &map.tensor;
    let rank = map.dims.len();
    let bad = |what: String| Err(format!("tensor {t}'s map is malformed: {what}"));
    if !(1..=MAX_MAP_RANK).contains(&rank) {
        return bad(format!("rank {rank}, where TMA takes 1 to {MAX_MAP_RANK}"));
    }
    if map.strides.len() + 1 != rank || map.boxes.len() != rank {
        return bad(format!(
            "{} strides and {} box extents for rank {rank} (want {} and {rank})",
            map.strides.len(),
            map.boxes.len(),
            rank - 1
        ));
    }
    if let Some(s) = map.strides.iter().find(|s| !s.is_multiple_of(16)) {
        return bad(format!("the stride {s} bytes is not a multiple of 16"));
    }
    if let Some(b) = map.boxes.iter().find(|b| !(1..=MAX_BOX).contains(*b)) {
        return bad(format!(
            "a box extent of {b}, where TMA takes 1 to {MAX_BOX}"
        ));
    }
    if map.dims.contains(&0) {
        return bad("an extent of 0".to_string());
    }
    if !matches!(map.dtype, DType::F16 | DType::BF16) {
        return bad(format!(
            "element type {}, where maps take f16 or bf16",
            map.dtype
        ));
    }
    if !matches!(map.swizzle, 64 | 128) {
        return bad(format!(
            "a {}-byte swizzle, where maps take 64 or 128",
            map.swizzle
        ));
    }
    Ok(())
}

/// Refuses a buffer the copy engine cannot address: TMA needs its global
/// address 16-byte aligned. Pure; a failure is the caller's (a C ABI
/// caller's pointer).
pub fn check_address(map: &TensorMap, address: u64) -> std::result::Result<(), String> {
    if !address.is_multiple_of(16) {
        return Err(format!(
            "tensor {}'s buffer at {address:#x} is not 16-byte aligned, which the kernel's TMA \
             copies need",
            map.tensor
        ));
    }
    Ok(())
}

/// Encodes `map` for the buffer at device `address` with
/// `cuTensorMapEncodeTiled` (elements of 1, no interleave, L2 promotion of
/// 256 bytes, out-of-bounds elements read as zeros). Checks both first
/// ([`check_map`], [`check_address`]) so that a refusal says why. Call
/// only after [`load_driver`] found the driver; a driver without the entry
/// point (older than CUDA 12.0) is an error, not a panic.
pub fn encode_tensor_map(map: &TensorMap, address: u64) -> std::result::Result<[u64; 16], String> {
    use cudarc::driver::sys as cu;
    check_map(map)?;
    check_address(map, address)?;
    let dtype = match map.dtype {
        DType::BF16 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        _ => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    let swizzle = match map.swizzle {
        64 => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        _ => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let element_strides = vec![1u32; map.dims.len()];
    // SAFETY: an all-zero map is a valid place for the driver to write.
    let mut out: cu::CUtensorMap = unsafe { std::mem::zeroed() };
    let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `out` is a live, aligned CUtensorMap; the arrays hold
        // `rank` (dims, boxes, element strides) and `rank - 1` (strides)
        // values, as checked above, and outlive the call. The address is
        // only recorded in the map, never dereferenced here.
        unsafe {
            cu::cuTensorMapEncodeTiled(
                &mut out,
                dtype,
                map.dims.len() as u32,
                std::ptr::without_provenance_mut(address as usize),
                map.dims.as_ptr(),
                map.strides.as_ptr(),
                map.boxes.as_ptr(),
                element_strides.as_ptr(),
                cu::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                cu::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                cu::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
    }))
    .map_err(|p| {
        format!(
            "encoding tensor {}'s map: {}",
            map.tensor,
            panic_text(p.as_ref())
        )
    })?;
    encoded.result().map_err(|e| {
        format!(
            "cuTensorMapEncodeTiled refused tensor {}'s map ({}; dims {:?}, strides {:?}, box {:?}, \
             swizzle {})",
            map.tensor,
            describe(&e),
            map.dims,
            map.strides,
            map.boxes,
            map.swizzle
        )
    })?;
    Ok(out.opaque)
}

/// Launches `f` on `stream` with `args`.
///
/// The caller guarantees that `args` match the kernel's C signature: the
/// CUDA printer declares every kernel with one pointer per tensor in the
/// model's order and then one `long` per symbolic parameter, then one
/// `PfTensorMap` per [`crate::gpu::Kernel::tensor_maps`] entry, and the
/// runtime builds `args` from the same [`crate::gpu::CudaProgram::args`]
/// and maps; each buffer holds its tensor's full extent.
pub fn launch(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &[Arg],
) -> std::result::Result<(), DriverError> {
    let mut b = stream.launch_builder(f);
    for a in args {
        match a {
            Arg::Buffer(s) => b.arg(*s),
            Arg::Long(v) => b.arg(*v),
            Arg::TensorMap(m) => b.arg(m),
        };
    }
    // SAFETY: the arguments match the kernel's parameters in number, order
    // and type (see above), every buffer outlives the launch (the caller
    // synchronizes the stream before dropping them), and the launch bounds
    // were checked against the device's limits.
    unsafe { b.launch(cfg) }.map(|_| ())
}

/// Launches `f` on `stream` with `args` like [`launch`], as a programmatic
/// dependent of the kernel before it on the stream
/// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, sm_90 and
/// later): its blocks may start before that kernel has finished, and wait
/// for it in their code (see [`crate::gpu::Kernel::dependent`]).
pub fn launch_dependent(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &[Arg],
) -> std::result::Result<(), DriverError> {
    use cudarc::driver::{sys as cu, DevicePtr};
    stream.context().bind_to_thread()?;
    // Every pointer and long as its 8-byte value, the buffers' guards held
    // until the launch has been queued; a map is read where it lies in
    // `args` (aligned, as its type is).
    let mut guards = Vec::new();
    let mut values: Vec<u64> = vec![0; args.len()];
    let mut params: Vec<*mut std::ffi::c_void> = Vec::with_capacity(args.len());
    for (a, v) in args.iter().zip(values.iter_mut()) {
        match a {
            Arg::Buffer(s) => {
                let (ptr, guard) = s.device_ptr(stream);
                *v = ptr;
                guards.push(guard);
            }
            Arg::Long(l) => *v = **l as u64,
            Arg::TensorMap(m) => {
                params.push(std::ptr::from_ref(m).cast_mut().cast());
                continue;
            }
        }
        params.push(std::ptr::from_mut(v).cast());
    }
    // SAFETY: an all-zero attribute is a valid (ignored) one; its id and
    // value are set below.
    let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = cu::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as for [`launch`]: the arguments match the kernel's
    // parameters (an 8-byte value each, a map's 128 bytes), and live until
    // the call returns (the driver copies them, and only reads the maps
    // through their pointers); the configuration and its attribute live
    // until then too.
    unsafe {
        cu::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    drop(guards);
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The checks made before `cuTensorMapEncodeTiled` is called: pure, so
    //! they run without a driver (CI has none).
    use super::*;

    /// A's 128 x 64 f16 tile map: 64-element rows of 128 bytes, 64 x 64
    /// boxes under the 128-byte swizzle.
    fn map() -> TensorMap {
        TensorMap {
            tensor: "A".into(),
            dtype: DType::F16,
            dims: vec![64, 128],
            strides: vec![128],
            boxes: vec![64, 64],
            swizzle: 128,
        }
    }

    #[test]
    fn a_well_formed_map_on_an_aligned_buffer_passes() {
        assert_eq!(check_map(&map()), Ok(()));
        assert_eq!(check_address(&map(), 0x7f00_0000_0100), Ok(()));
        let bf16 = TensorMap {
            dtype: DType::BF16,
            swizzle: 64,
            boxes: vec![32, 64],
            ..map()
        };
        assert_eq!(check_map(&bf16), Ok(()));
    }

    #[test]
    fn a_misaligned_buffer_is_refused_naming_the_tensor() {
        let e = check_address(&map(), 0x7f00_0000_0108).unwrap_err();
        assert_eq!(
            e,
            "tensor A's buffer at 0x7f0000000108 is not 16-byte aligned, which the kernel's TMA \
             copies need"
        );
        // Before any driver call: this runs without one.
        assert_eq!(encode_tensor_map(&map(), 0x7f00_0000_0108), Err(e));
    }

    #[test]
    fn malformed_maps_are_refused_with_their_reason() {
        let cases: [(TensorMap, &str); 7] = [
            (
                TensorMap {
                    strides: vec![100],
                    ..map()
                },
                "stride 100 bytes",
            ),
            (
                TensorMap {
                    dims: vec![],
                    strides: vec![],
                    boxes: vec![],
                    ..map()
                },
                "rank 0",
            ),
            (
                TensorMap {
                    dims: vec![2; 6],
                    strides: vec![16; 5],
                    boxes: vec![1; 6],
                    ..map()
                },
                "rank 6",
            ),
            (
                TensorMap {
                    boxes: vec![64, 257],
                    ..map()
                },
                "box extent of 257",
            ),
            (
                TensorMap {
                    boxes: vec![64],
                    ..map()
                },
                "1 box extents for rank 2",
            ),
            (
                TensorMap {
                    swizzle: 32,
                    ..map()
                },
                "32-byte swizzle",
            ),
            (
                TensorMap {
                    dtype: DType::F32,
                    ..map()
                },
                "element type f32",
            ),
        ];
        for (m, why) in cases {
            let e = check_map(&m).unwrap_err();
            assert!(e.starts_with("tensor A's map is malformed: "), "{e}");
            assert!(e.contains(why), "{why}: {e}");
            // Checked before the driver is called.
            assert_eq!(encode_tensor_map(&m, 0x1000), Err(e));
        }
    }

    #[test]
    fn a_map_parameter_is_the_kernels_128_aligned_bytes() {
        assert_eq!(std::mem::size_of::<TensorMapValue>(), 128);
        assert_eq!(std::mem::align_of::<TensorMapValue>(), 64);
        // An argument holding one keeps it aligned for the launch to read.
        let a = Arg::TensorMap(TensorMapValue([7; 16]));
        let Arg::TensorMap(m) = &a else {
            unreachable!()
        };
        assert!(std::ptr::from_ref(m).addr().is_multiple_of(64));
    }
}
