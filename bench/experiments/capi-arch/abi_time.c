/* abi_time.c: a program's kernels launched through the C ABI
 * (pf_result_launch), timed with CUDA events: the median over RUNS
 * launches of all kernels after a warm-up, on zeroed buffers. Issue 33:
 * the ABI compiled every program for plain compute_90, leaving out the
 * wgmma path; compare POLYFUSE_CUDA_ARCH=sm_90 (that old choice) with the
 * default in one process each, on one device.
 *
 * usage: abi_time PROGRAM.json [RUNS]   (fixed sizes) */
#include <polyfuse.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventRecord)(CUevent, void *);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
} cu;

static int sym(void *lib, void *f, size_t size, const char *name) {
    void *p = dlsym(lib, name);
    if (p == NULL) return 0;
    memcpy(f, &p, size);
    return 1;
}
#define SYM(field, name) sym(lib, &cu.field, sizeof cu.field, name)

static void check_cu(CUresult r, const char *what) {
    if (r != 0) { fprintf(stderr, "abi_time: %s: CUDA error %d\n", what, r); exit(2); }
}
static void check_pf(pf_status s, const char *what) {
    if (s != PF_OK) {
        char *m = pf_last_error_message();
        fprintf(stderr, "abi_time: %s: %s\n", what, m ? m : "");
        exit(2);
    }
}
static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    pf_context *ctx = NULL;
    pf_result *res = NULL;
    size_t nargs = 0, nk = 0, i, k;
    void *args[64];
    int runs = argc > 2 ? atoi(argv[2]) : 50, r;
    float *ms;
    CUdevice dev;
    CUcontext primary;
    CUevent a, b;
    if (argc < 2 || lib == NULL) { fprintf(stderr, "usage: abi_time PROGRAM.json [RUNS]\n"); return 2; }
    if (!(SYM(cuInit, "cuInit") && SYM(cuDeviceGet, "cuDeviceGet") &&
          SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
          SYM(cuCtxSetCurrent, "cuCtxSetCurrent") && SYM(cuCtxSynchronize, "cuCtxSynchronize") &&
          SYM(cuMemAlloc, "cuMemAlloc_v2") && SYM(cuMemsetD8, "cuMemsetD8_v2") &&
          SYM(cuEventCreate, "cuEventCreate") && SYM(cuEventRecord, "cuEventRecord") &&
          SYM(cuEventSynchronize, "cuEventSynchronize") &&
          SYM(cuEventElapsedTime, "cuEventElapsedTime_v2")))
        return 2;
    check_cu(cu.cuInit(0), "cuInit");
    check_cu(cu.cuDeviceGet(&dev, 0), "cuDeviceGet");
    check_cu(cu.cuDevicePrimaryCtxRetain(&primary, dev), "retain");
    check_cu(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent");
    check_pf(pf_context_create(&ctx), "pf_context_create");
    check_pf(pf_context_load_file(ctx, argv[1]), "load");
    check_pf(pf_context_set_target(ctx, "cuda"), "target");
    check_pf(pf_context_set_cache(ctx, NULL), "cache");
    check_pf(pf_compile(ctx, &res), "pf_compile");
    check_pf(pf_result_num_args(res, &nargs), "num_args");
    for (i = 0; i < nargs; i++) {
        size_t bytes = 0;
        CUdeviceptr p;
        check_pf(pf_result_arg_bytes(res, i, NULL, 0, &bytes), "arg_bytes");
        check_cu(cu.cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
        check_cu(cu.cuMemsetD8(p, 0, bytes ? bytes : 1), "cuMemsetD8");
        args[i] = (void *)(size_t)p;
    }
    check_pf(pf_result_num_kernels(res, &nk), "num_kernels");
    check_cu(cu.cuEventCreate(&a, 0), "event");
    check_cu(cu.cuEventCreate(&b, 0), "event");
    for (r = 0; r < 5; r++)
        for (k = 0; k < nk; k++) check_pf(pf_result_launch(res, k, NULL, args, NULL), "launch");
    check_cu(cu.cuCtxSynchronize(), "sync");
    ms = malloc(sizeof(float) * (size_t)runs);
    for (r = 0; r < runs; r++) {
        check_cu(cu.cuEventRecord(a, NULL), "record");
        for (k = 0; k < nk; k++) check_pf(pf_result_launch(res, k, NULL, args, NULL), "launch");
        check_cu(cu.cuEventRecord(b, NULL), "record");
        check_cu(cu.cuEventSynchronize(b), "sync");
        check_cu(cu.cuEventElapsedTime(&ms[r], a, b), "elapsed");
    }
    qsort(ms, (size_t)runs, sizeof(float), cmp);
    printf("%s: %zu kernel(s), median %.1f us over %d runs (arch %s)\n", argv[1], nk,
           ms[runs / 2] * 1000.0f, runs,
           getenv("POLYFUSE_CUDA_ARCH") ? getenv("POLYFUSE_CUDA_ARCH") : "default");
    return 0;
}
