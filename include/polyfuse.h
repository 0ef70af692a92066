/*
 * polyfuse.h: the C ABI of polyfuse, a polyhedral compiler for small
 * machine-learning kernels. Usable from C99 and C++.
 *
 * A context holds one program (the JSON program format) and its options;
 * pf_compile turns it into a result: CUDA kernels with their launch
 * configuration and argument order (target "cuda"), or C source (target
 * "cpu"), plus the schedule tree.
 *
 * Conventions
 * - Every function that can fail returns a pf_status: PF_OK or an error
 *   code. The codes mirror the command line's exit statuses (2 bad input or
 *   illegal transformation, 3 environment, 4 internal). No function unwinds
 *   or aborts: a bug inside polyfuse is PF_ERR_INTERNAL.
 * - Handles are opaque and never dereferenced by the library: a null,
 *   destroyed or forged handle is refused with PF_ERR_INVALID_HANDLE, so
 *   destroying a handle twice is an error, not a crash.
 * - The message of a failed call is kept on the handle it was about
 *   (pf_context_error_message, pf_result_error_message) and on the calling
 *   thread (pf_last_error_message).
 * - Every char * handed out is owned by the caller and freed with
 *   pf_string_free (pf_version's static string excepted).
 * - Contexts are independent: several threads may compile with several
 *   contexts at once. Calls on one context are serialised. A result is
 *   immutable and may be queried from several threads.
 * - "params" arrays hold the values of the parameters that have no
 *   compile-time value, in pf_result_param_name order
 *   (pf_result_num_params of them; may be NULL when there are none).
 *
 * Link with -lpolyfuse (libpolyfuse.so or libpolyfuse.a; the static
 * library also needs -lpthread -ldl -lm).
 */
#ifndef POLYFUSE_H
#define POLYFUSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes; compare with pf_abi_version(). */
#define PF_ABI_VERSION 1

typedef int32_t pf_status;
enum {
    PF_OK = 0,
    PF_ERR_INPUT = 2,            /* bad JSON, program or option; illegal transformation */
    PF_ERR_ENVIRONMENT = 3,      /* no CUDA driver, NVRTC or CUDA context */
    PF_ERR_INTERNAL = 4,         /* a bug in polyfuse */
    PF_ERR_INVALID_HANDLE = 5,   /* null, destroyed or forged handle or string */
    PF_ERR_INVALID_ARGUMENT = 6  /* null output, index out of range, not UTF-8, wrong target */
};

typedef int32_t pf_dtype;
enum {
    PF_DTYPE_F32 = 0,
    PF_DTYPE_F16 = 1, /* stored as 16-bit IEEE half */
    PF_DTYPE_BF16 = 2, /* stored as 16-bit bfloat16 */
    PF_DTYPE_F64 = 3,
    PF_DTYPE_I32 = 4,
    PF_DTYPE_I64 = 5,
    PF_DTYPE_U8 = 6,
    PF_DTYPE_BOOL = 7,   /* one byte, 0 or 1 */
    PF_DTYPE_F8E4M3 = 8, /* one byte: 8-bit float, 4 exponent bits (no infinity, max 448) */
    PF_DTYPE_F8E5M2 = 9  /* one byte: 8-bit float, 5 exponent bits (max 57344) */
};

/* What a tensor argument is to the program (pf_result_arg_role). */
typedef int32_t pf_role;
enum {
    PF_ROLE_INPUT = 0,  /* read by the kernels, never written */
    PF_ROLE_OUTPUT = 1, /* written by the kernels, every element */
    PF_ROLE_TEMP = 2    /* an intermediate the program declared or inferred */
};

/* The most dimensions pf_tensor_info holds. */
#define PF_MAX_RANK 8

/* One tensor argument, as pf_result_tensors describes it. */
typedef struct pf_tensor_info {
    const char *name;             /* valid while the result lives */
    size_t arg_index;             /* its index among the kernel arguments */
    pf_role role;
    int32_t dtype;                /* a pf_dtype */
    size_t rank;
    int64_t extents[PF_MAX_RANK]; /* for the given parameters; 0 past rank */
    size_t bytes;                 /* to allocate: row-major, storage type */
} pf_tensor_info;

typedef int32_t pf_arg_kind;
enum {
    PF_ARG_TENSOR = 0, /* a device pointer */
    PF_ARG_PARAM = 1,  /* a parameter value, passed as a 64-bit long */
    PF_ARG_STEP = 2    /* a host loop's iterator, passed as a 64-bit long: set by
                        * pf_result_launch_all for each launch (see below) */
};

/* Where the library's notices go (pf_context_set_log): called on the thread
 * that called pf_compile, with the user pointer given, a level and a
 * message valid for the call only. It must not throw into polyfuse. */
typedef void (*pf_log_fn)(void *user, int32_t level, const char *message);
enum {
    PF_LOG_INFO = 0,   /* something to know (a tuned configuration from the cache was used) */
    PF_LOG_WARNING = 1 /* polyfuse did other than asked and says what (a schedule isl did
                          not finish replaced by minimal fusion; a cache it could not read) */
};

typedef struct pf_context pf_context;
typedef struct pf_result pf_result;

/* The CUDA driver's stream type, declared here so that no cuda.h is needed;
 * pass a CUstream or a cudaStream_t. The declaration is the same as cuda.h's;
 * C99 forbids repeating a typedef, so in C99 include cuda.h first. */
#ifndef __cuda_cuda_h__
typedef struct CUstream_st *CUstream;
#endif

/* ---- version, strings, errors ---------------------------------------- */

/* The library version, e.g. "0.1.0"; static, do not free. */
const char *pf_version(void);
/* PF_ABI_VERSION of the library. */
int32_t pf_abi_version(void);
/* Frees a string handed out by polyfuse; NULL is ignored; a string freed
 * already or not handed out is refused (PF_ERR_INVALID_HANDLE). */
pf_status pf_string_free(char *s);
/* The message of the latest failed call on this thread, or NULL. */
char *pf_last_error_message(void);
/* The message of the latest call on ctx if it failed, or NULL. */
char *pf_context_error_message(const pf_context *ctx);
/* The message of the latest call on result if it failed, or NULL. */
char *pf_result_error_message(const pf_result *result);

/* ---- contexts -------------------------------------------------------- */

/* A context with the defaults: target cpu, strategy isl, tile 32, sinking
 * on, GPU block and grid chosen by polyfuse, shared-memory promotion on. */
pf_status pf_context_create(pf_context **out);
/* Results compiled from ctx stay valid. */
pf_status pf_context_destroy(pf_context *ctx);
/* Loads a program from JSON text, replacing any program loaded before.
 * The text ends at its first NUL byte; to pass text whose length you know
 * (a buffer that is not NUL-terminated, or to have a NUL inside refused
 * rather than the prefix before it compiled), use pf_context_load_json_n. */
pf_status pf_context_load_json(pf_context *ctx, const char *json);
/* Loads a program from the `len` bytes at `json` (UTF-8, no terminator
 * needed). A NUL byte among them is an input error naming its offset. */
pf_status pf_context_load_json_n(pf_context *ctx, const char *json, size_t len);
/* Loads a program file. */
pf_status pf_context_load_file(pf_context *ctx, const char *path);
/* "cpu" or "cuda". */
pf_status pf_context_set_target(pf_context *ctx, const char *target);
/* "isl", "min", "max" or "canonical". */
pf_status pf_context_set_strategy(pf_context *ctx, const char *strategy);
/* "NAME=VALUE" (a positive integer); overrides the file. */
pf_status pf_context_set_param(pf_context *ctx, const char *assignment);
/* The same by name and value. */
pf_status pf_context_set_param_value(pf_context *ctx, const char *name, int64_t value);
/* Tile sizes per band member (the last repeats); count 0: no tiling.
   Never called: the "cuda" target chooses its tiles per kernel, as the
   command line does without --tile (contractions and attention on
   tensor cores among them); the "cpu" target tiles by 32. */
pf_status pf_context_set_tile(pf_context *ctx, const int64_t *sizes, size_t count);
/* Sink point loops below inner tile loops (TC's tiling): nonzero on. */
pf_status pf_context_set_sink(pf_context *ctx, int enabled);
/* GPU threads per block, x, y, z (1 to 3 values); count 0: automatic. */
pf_status pf_context_set_block(pf_context *ctx, const uint32_t *sizes, size_t count);
/* Upper bounds on GPU blocks, x, y, z; count 0: one block per tile. */
pf_status pf_context_set_grid(pf_context *ctx, const uint32_t *sizes, size_t count);
/* Shared-memory promotion: nonzero on. */
pf_status pf_context_set_shared(pf_context *ctx, int enabled);
/* Directives as JSON (the program's "schedule" key: a list of steps, see
 * the README); NULL clears them. A template that cannot be applied makes
 * pf_compile fail with PF_ERR_INPUT or PF_ERR_ILLEGAL. */
pf_status pf_context_set_directives(pf_context *ctx, const char *json);
/* The compilation cache pf_compile consults when no schedule option was set
 * on the context (tuned options from `polyfuse tune`; said to the log): path
 * to its SQLite file, or NULL for none. Default: none (the library reads and
 * writes no file of the user's unless asked). */
pf_status pf_context_set_cache(pf_context *ctx, const char *path);
/* Sends the library's notices to callback (see pf_log_fn); NULL: nowhere,
 * the default. The library never writes to stderr. */
pf_status pf_context_set_log(pf_context *ctx, pf_log_fn callback, void *user);
/* Seconds after which a compilation whose schedule isl has not finished is
 * replaced by one with minimal fusion (said to the log as a warning). isl's scheduler can
 * run for minutes, or not end, on some fusion problems; the abandoned
 * compilation is stopped. Default: POLYFUSE_SCHEDULE_TIMEOUT, else 60. */
pf_status pf_context_set_schedule_timeout(pf_context *ctx, uint32_t seconds);
/* The GPU architecture launches compile for: "sm_NN" or "sm_NNa" ("sm_90"
 * runs the portable paths of kernels that also have a Hopper-only one);
 * NULL: the device's choice, "sm_90a" where a kernel has a wgmma path on an
 * sm_90 device, unless POLYFUSE_CUDA_ARCH names one. A malformed name is
 * refused here (PF_ERR_INPUT); one the device cannot run fails the launch. */
pf_status pf_context_set_arch(pf_context *ctx, const char *arch);
/* The CUDA device (driver ordinal) a cuda result is meant for: the tuning
 * cache (pf_context_set_cache) is looked up for its architecture. -1, the
 * default: the device of the thread's current CUDA context at pf_compile,
 * else device 0. Launches run on the device of their stream or tensors
 * whatever this says. A value below -1 is refused (PF_ERR_INPUT). */
pf_status pf_context_set_device(pf_context *ctx, int32_t device);
/* Compiles the loaded program under the context's options. */
pf_status pf_compile(pf_context *ctx, pf_result **out);

/* ---- results ---------------------------------------------------------- */

/* Destroys a result. A result that launched kernels unloads its CUDA
 * modules here, and frees the workspaces it allocated, each with its
 * context current. When that context is the
 * device's primary context (cuDevicePrimaryCtxRetain, or the CUDA runtime's
 * context), the result holds a reference of its own on it from its first
 * launch there until the module is unloaded, so the caller may release the
 * primary context (cuDevicePrimaryCtxRelease, cudaDeviceReset) before or
 * after destroying the result. A context made with cuCtxCreate cannot be
 * retained: destroy the results that launched in it before cuCtxDestroy.
 * The handle is destroyed in every case; PF_ERR_ENVIRONMENT says that the
 * driver refused to unload a module (the message says why). */
pf_status pf_result_destroy(pf_result *result);
/* "cpu" or "cuda". */
pf_status pf_result_target(const pf_result *result, char **out);
/* Where the result came from: 0 the context's options, 1 tuned options from
 * the cache (compiled now), 2 a compiled program from the cache, 3 an
 * artifact (pf_result_load). */
pf_status pf_result_from_cache(const pf_result *result, int32_t *out);
/* CUDA kernels, to be launched in index order on one stream; 0 for cpu. */
pf_status pf_result_num_kernels(const pf_result *result, size_t *out);
/* The kernel's extern "C" __global__ function name in the CUDA source. */
pf_status pf_result_kernel_name(const pf_result *result, size_t kernel, char **out);
/* The complete CUDA source of all kernels (NVRTC or nvcc). */
pf_status pf_result_cuda_source(const pf_result *result, char **out);
/* Threads per block: block[0..2] = x, y, z. */
pf_status pf_result_kernel_block(const pf_result *result, size_t kernel, uint32_t *block);
/* Blocks for the given parameter values: grid[0..2] = x, y, z. A zero
 * dimension means there is nothing to do: skip the kernel. A contraction
 * whose reduction is split (sm_90 and later) declares its cluster in the
 * source (__cluster_dims__, blocks along z): launch it with this grid as
 * it is; cuLaunchKernel and <<<>>> both honour the declared cluster. */
pf_status pf_result_kernel_grid(const pf_result *result, size_t kernel, const int64_t *params,
                                size_t num_params, uint32_t *grid);
/* Dynamic shared memory to launch with, and static shared memory the
 * kernel declares, in bytes; either output may be NULL. */
pf_status pf_result_kernel_shared_memory(const pf_result *result, size_t kernel,
                                         size_t *dynamic_bytes, size_t *static_bytes);
/* 1 when the kernel is a programmatic dependent of the kernel before it
 * (0 otherwise; every kernel of this version is): its first statement waits
 * (griddepcontrol.wait, sm_90 and later) for that kernel, whichever it is,
 * to finish, so it may be launched with
 * CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION to overlap that
 * kernel's end, as pf_result_launch does on compute capability 9.0 and
 * later. A plain launch is correct too. */
pf_status pf_result_kernel_dependent(const pf_result *result, size_t kernel, int32_t *out);
/* Parameters without a compile-time value (the entries of params arrays). */
pf_status pf_result_num_params(const pf_result *result, size_t *out);
pf_status pf_result_param_name(const pf_result *result, size_t index, char **out);
/* Kernel arguments in order: one per tensor (inputs, outputs, temps), then
 * one per parameter without a compile-time value, then (for a program whose
 * recurrences run on host loops) one per host loop iterator (PF_ARG_STEP). */
pf_status pf_result_num_args(const pf_result *result, size_t *out);
pf_status pf_result_arg_kind(const pf_result *result, size_t index, pf_arg_kind *out);
pf_status pf_result_arg_name(const pf_result *result, size_t index, char **out);
/* Tensor arguments only: element type, rank, extents. */
pf_status pf_result_arg_dtype(const pf_result *result, size_t index, pf_dtype *out);
pf_status pf_result_arg_rank(const pf_result *result, size_t index, size_t *out);
/* Extent as text in the parameters, e.g. "M" or "H - 2". */
pf_status pf_result_arg_dim(const pf_result *result, size_t index, size_t dim, char **out);
/* Extent for the given parameter values. */
pf_status pf_result_arg_extent(const pf_result *result, size_t index, size_t dim,
                               const int64_t *params, size_t num_params, int64_t *out);
/* Bytes to allocate for the tensor (row-major, storage type). */
pf_status pf_result_arg_bytes(const pf_result *result, size_t index, const int64_t *params,
                              size_t num_params, size_t *out);
/* PF_ROLE_INPUT, PF_ROLE_OUTPUT or PF_ROLE_TEMP (tensor arguments only). */
pf_status pf_result_arg_role(const pf_result *result, size_t index, pf_role *out);
/* Every tensor argument in one call, for the given parameter values:
 * *count is set to their number and the first min(capacity, *count) are
 * written to out (NULL with capacity 0 asks for the count). A tensor of
 * more than PF_MAX_RANK dimensions is refused (PF_ERR_INVALID_ARGUMENT).
 * A rank-0 input is a runtime scalar passed like any tensor: a device
 * pointer to its one element. */
pf_status pf_result_tensors(const pf_result *result, const int64_t *params, size_t num_params,
                            pf_tensor_info *out, size_t capacity, size_t *count);
/* The final schedule tree as text (for cuda, the mapped tree). */
pf_status pf_result_schedule_tree(const pf_result *result, char **out);
/* C source: void pf_kernel(const long *pf_params, void **pf_tensors), where
 * pf_params holds every parameter in file order and pf_tensors the tensor
 * arguments in order. Available for both targets. */
pf_status pf_result_c_source(const pf_result *result, char **out);
/* ---- launching --------------------------------------------------------
 *
 * Contexts and streams. A launch runs in the context of its stream
 * (cuStreamGetCtx). For the null stream (NULL, CU_STREAM_LEGACY or
 * CU_STREAM_PER_THREAD) it runs in the context the tensors live in: the
 * context the first tensor pointer the kernel uses was allocated in
 * (CU_POINTER_ATTRIBUTE_CONTEXT), or for memory the driver names no
 * context for (virtual memory management, e.g. PyTorch's expandable
 * segments) the primary context of its device
 * (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, cuDevicePrimaryCtxRetain). The
 * thread's current context is used only when the launch has no pointer at
 * all, and is left as it was. So a fresh thread may launch on the default
 * stream. A pointer the driver does not know is PF_ERR_INVALID_ARGUMENT.
 * The CUDA source is compiled with NVRTC once per compute capability and
 * loaded once per context; the module stays loaded until
 * pf_result_destroy (which says what that means for the context's life).
 *
 * Temps and the workspace. Inputs and outputs are the caller's. A temp
 * takes memory only when some kernel's code reads or writes it in global
 * memory (decided from the kernels' launch records when the result is
 * compiled; every temp of a cpu result); the others (attention's row
 * states and M_prev, an accumulator kept in registers) are never touched
 * and take none. The temps that take memory live in one workspace, in
 * argument order, each at a multiple of PF_WORKSPACE_ALIGN bytes:
 * pf_result_workspace_size gives its size, pf_result_arg_workspace_offset
 * where each temp lies. pf_result_launch_workspace takes the caller's
 * workspace, or NULL to use one the result allocates and keeps. */

/* Alignment of each temp in the workspace and of a caller's workspace. */
#define PF_WORKSPACE_ALIGN 256

/* Launches kernel `kernel` on `stream` with the caller's device buffers:
 * device_ptrs holds one device pointer per tensor argument, temps
 * included, in argument order, each at least pf_result_arg_bytes large.
 * A temp no kernel touches (pf_result_arg_workspace_offset -1) may be
 * NULL; a NULL pointer for a tensor this kernel reads or writes is refused
 * (PF_ERR_INVALID_ARGUMENT). Returns once the launch is queued.
 * PF_ERR_ENVIRONMENT when there is no CUDA driver, NVRTC or context. */
pf_status pf_result_launch(const pf_result *result, size_t kernel, const int64_t *params,
                           void **device_ptrs, CUstream stream);
/* Bytes of the workspace for the given parameter values: the temps that
 * take memory (see above), each at a multiple of PF_WORKSPACE_ALIGN. 0
 * when none does. */
pf_status pf_result_workspace_size(const pf_result *result, const int64_t *params,
                                   size_t num_params, size_t *bytes);
/* Where temp argument `index` lies in the workspace: its byte offset, or
 * -1 when no kernel touches it (pass NULL for it). For callers that launch
 * the kernels themselves. Not a temp: PF_ERR_INVALID_ARGUMENT. */
pf_status pf_result_arg_workspace_offset(const pf_result *result, size_t index,
                                         const int64_t *params, size_t num_params,
                                         int64_t *offset);
/* Launches kernel `kernel` with the caller's inputs and outputs only:
 * io_ptrs holds one device pointer per tensor argument whose role is not
 * PF_ROLE_TEMP, in argument order (the pf_tensor_info entries that are
 * inputs or outputs, in order). The temps live in `workspace`, a device
 * buffer of `workspace_bytes` (at least pf_result_workspace_size, aligned
 * to PF_WORKSPACE_ALIGN, else PF_ERR_INVALID_ARGUMENT), or, where
 * workspace is NULL, in a buffer the result allocates in the launch's
 * context on first need and keeps until pf_result_destroy. That buffer is
 * grown when larger sizes need more, after the context's queued work is
 * done (cuCtxSynchronize), and serves one stream at a time: launches that
 * may overlap on several streams, or run inside a CUDA graph capture
 * (where allocating is not allowed), pass their own workspace, or launch
 * once with the largest sizes before. Kernels of one launch sequence use
 * the same workspace. */
pf_status pf_result_launch_workspace(const pf_result *result, size_t kernel,
                                     const int64_t *params, void **io_ptrs, void *workspace,
                                     size_t workspace_bytes, CUstream stream);

/* ---- ahead of time ----------------------------------------------------- */

/* The result as an artifact: one JSON document (freed with pf_string_free)
 * holding the program's text and the values it was compiled with, the
 * compiled program (trees, C and CUDA source, launch records, tensors),
 * and PTX for each architecture of `archs` ("sm_90,sm_80": the devices'
 * architectures, comma-separated; NULL or "" for none), stored under the
 * architecture a launch on such a device compiles for ("sm_90a" on sm_90
 * for kernels with a wgmma path). Making PTX needs NVRTC, not a GPU
 * (PF_ERR_ENVIRONMENT without it). `polyfuse schedule --emit artifact`
 * writes the same document. */
pf_status pf_result_save(const pf_result *result, const char *archs, char **out);
/* A result from an artifact (the `len` bytes at `text`) without compiling:
 * no isl runs. Launches on a device whose architecture the artifact has
 * PTX for load that PTX without NVRTC (the driver finishes it); on other
 * devices they compile the CUDA source with NVRTC as any result does. Not
 * an artifact, or of another version: PF_ERR_INPUT. Destroy it with
 * pf_result_destroy. */
pf_status pf_result_load(const char *text, size_t len, pf_result **out);
/* Launches one execution of the whole program on `stream`: every kernel in
 * index order, and the kernels of a host loop once per iteration with the
 * iterator as their PF_ARG_STEP argument. A program with loop blocks whose
 * loops carry a dependence (a recurrence) runs those loops on the host: its
 * kernels inside them cannot be launched with pf_result_launch (which
 * refuses them with PF_ERR_INVALID_ARGUMENT); launch it with this call.
 * For every other program it is the same as pf_result_launch of each
 * kernel in order. Arguments and errors as for pf_result_launch. */
pf_status pf_result_launch_all(const pf_result *result, const int64_t *params,
                               void **device_ptrs, CUstream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYFUSE_H */
