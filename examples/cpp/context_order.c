/* context_order.c: a result outlives the caller's CUDA context (issue 30).
 *
 * Compiles PROGRAM.json (default examples/gemm.json, whose sizes are fixed)
 * for the CUDA target, launches every kernel in the primary context of
 * device 0 on zeroed buffers, then releases the primary context *before*
 * pf_result_destroy, the order the C++ example's RAII gives. The result
 * holds its own reference on the context (include/polyfuse.h), so:
 *   - after the caller's release the primary context is still active;
 *   - pf_result_destroy returns PF_OK (its module unloads in a live
 *     context: no CUDA_ERROR_INVALID_HANDLE from cuModuleUnload);
 *   - after it the primary context is inactive (the reference released).
 * Every CUDA call is checked. scripts/gpu-check.sh runs it, also under
 * compute-sanitizer, which reports any CUDA API error polyfuse swallowed.
 *
 * The driver is opened with dlopen: without a driver, a GPU or NVRTC the
 * program says so and destroys what it made (exit status 0).
 *
 * usage: context_order [PROGRAM.json]
 * exit status: 0 ok or skipped, 1 a check failed, 2 an error. */

#include <polyfuse.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
} cu;

/* Sets the function pointer at `f` (of `size` bytes) to `name` in `lib`. */
static int sym(void *lib, void *f, size_t size, const char *name) {
    void *p = dlsym(lib, name);
    if (p == NULL) return 0;
    memcpy(f, &p, size); /* ISO C has no cast from void * to a function */
    return 1;
}
#define SYM(lib, field, name) sym(lib, &cu.field, sizeof cu.field, name)

static int open_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return 0;
    return SYM(lib, cuInit, "cuInit") && SYM(lib, cuDeviceGetCount, "cuDeviceGetCount") &&
           SYM(lib, cuDeviceGet, "cuDeviceGet") &&
           SYM(lib, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
           SYM(lib, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
           SYM(lib, cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState") &&
           SYM(lib, cuCtxSetCurrent, "cuCtxSetCurrent") &&
           SYM(lib, cuCtxSynchronize, "cuCtxSynchronize") &&
           SYM(lib, cuMemAlloc, "cuMemAlloc_v2") && SYM(lib, cuMemFree, "cuMemFree_v2") &&
           SYM(lib, cuMemsetD8, "cuMemsetD8_v2");
}

static int failures = 0;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "context_order: FAILED: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    failures++;
}

/* Exits with status 2 unless the CUDA call succeeded. */
static void check_cu(CUresult r, const char *what) {
    if (r != 0) {
        fprintf(stderr, "context_order: %s failed with CUDA error %d\n", what, r);
        exit(2);
    }
}

/* Exits with status 2 unless the polyfuse call succeeded. */
static void check_pf(pf_status s, const char *what) {
    if (s != PF_OK) {
        char *m = pf_last_error_message();
        fprintf(stderr, "context_order: %s: status %d: %s\n", what, (int)s, m ? m : "");
        pf_string_free(m);
        exit(2);
    }
}

static int primary_active(CUdevice dev) {
    unsigned flags = 0;
    int active = 0;
    check_cu(cu.cuDevicePrimaryCtxGetState(dev, &flags, &active), "cuDevicePrimaryCtxGetState");
    return active;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "examples/gemm.json";
    pf_context *ctx = NULL;
    pf_result *res = NULL;
    size_t nargs = 0, nkernels = 0, ntensors = 0, i;
    CUdeviceptr ptrs[64];
    void *args[64];
    int count = 0, held = 0;
    CUdevice dev = 0;
    CUcontext primary = NULL;
    pf_status s;

    check_pf(pf_context_create(&ctx), "pf_context_create");
    check_pf(pf_context_load_file(ctx, path), "pf_context_load_file");
    check_pf(pf_context_set_target(ctx, "cuda"), "pf_context_set_target");
    /* No cache: its lookup reads the device's architecture through a
     * context of its own. */
    check_pf(pf_context_set_cache(ctx, NULL), "pf_context_set_cache");
    s = pf_compile(ctx, &res);
    if (s == PF_ERR_ENVIRONMENT) {
        char *m = pf_context_error_message(ctx);
        printf("context_order: no CUDA target (%s): skipped\n", m ? m : "");
        pf_string_free(m);
        check_pf(pf_context_destroy(ctx), "pf_context_destroy");
        return 0;
    }
    check_pf(s, "pf_compile");
    if (!open_driver() || cu.cuInit(0) != 0 || cu.cuDeviceGetCount(&count) != 0 || count == 0) {
        printf("context_order: no CUDA driver or device: skipped\n");
        check_pf(pf_result_destroy(res), "pf_result_destroy without a driver");
        check_pf(pf_context_destroy(ctx), "pf_context_destroy");
        return 0;
    }
    check_cu(cu.cuDeviceGet(&dev, 0), "cuDeviceGet");
    /* Whether something else in the process holds the primary context
     * (then its state says nothing about the result's reference). */
    held = primary_active(dev);
    check_cu(cu.cuDevicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain");
    check_cu(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent");

    check_pf(pf_result_num_args(res, &nargs), "pf_result_num_args");
    for (i = 0; i < nargs; i++) {
        pf_arg_kind kind = 0;
        size_t bytes = 0;
        check_pf(pf_result_arg_kind(res, i, &kind), "pf_result_arg_kind");
        if (kind != PF_ARG_TENSOR) {
            fprintf(stderr, "context_order: %s has symbolic sizes; give a program with fixed ones\n", path);
            return 2;
        }
        if (ntensors == 64) return 2;
        check_pf(pf_result_arg_bytes(res, i, NULL, 0, &bytes), "pf_result_arg_bytes");
        check_cu(cu.cuMemAlloc(&ptrs[ntensors], bytes ? bytes : 1), "cuMemAlloc");
        check_cu(cu.cuMemsetD8(ptrs[ntensors], 0, bytes ? bytes : 1), "cuMemsetD8");
        args[ntensors] = (void *)(size_t)ptrs[ntensors];
        ntensors++;
    }
    check_pf(pf_result_num_kernels(res, &nkernels), "pf_result_num_kernels");
    for (i = 0; i < nkernels; i++)
        check_pf(pf_result_launch(res, i, NULL, args, NULL), "pf_result_launch");
    check_cu(cu.cuCtxSynchronize(), "cuCtxSynchronize");
    for (i = 0; i < ntensors; i++) check_cu(cu.cuMemFree(ptrs[i]), "cuMemFree");
    printf("context_order: %zu kernel(s) launched in the primary context\n", nkernels);

    /* The caller is done with CUDA: it releases its context first. */
    check_cu(cu.cuCtxSetCurrent(NULL), "cuCtxSetCurrent(NULL)");
    check_cu(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
    if (!held && !primary_active(dev))
        fail("the primary context died with the caller's release", "the result holds no reference on it");

    s = pf_result_destroy(res);
    if (s != PF_OK) {
        char *m = pf_last_error_message();
        fail("pf_result_destroy after the context's release", m);
        pf_string_free(m);
    }
    if (!held && primary_active(dev))
        fail("the primary context is still active after pf_result_destroy", "the result's reference leaked");
    check_pf(pf_context_destroy(ctx), "pf_context_destroy");
    if (failures == 0) printf("context_order: ok (context released before pf_result_destroy)\n");
    return failures ? 1 : 0;
}
