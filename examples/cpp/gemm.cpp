// gemm.cpp: a C++17 program that uses polyfuse through its C ABI only.
//
// It compiles examples/gemm.json for the CUDA target (the C target where the
// CUDA target is not available), prints every kernel's name, launch
// configuration, arguments and source, and, where a CUDA driver and a GPU
// are present, launches the kernels on buffers it allocates itself and
// checks C = A B against a plain CPU loop.
//
// The CUDA driver is opened with dlopen, so the program builds and runs on
// machines without CUDA (it then skips the launch and says so).
//
// usage: gemm [PROGRAM.json]     (default: examples/gemm.json)
// exit status: 0 ok (or launch skipped), 1 a result mismatch, 2 an error.

#include <polyfuse.h>

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// ---- RAII over the C ABI ---------------------------------------------------

// A string handed out by polyfuse, freed with pf_string_free.
std::string take(char *s) {
    if (s == nullptr) return std::string();
    std::string out(s);
    pf_string_free(s);
    return out;
}

struct ContextDeleter {
    void operator()(pf_context *c) const { pf_context_destroy(c); }
};
struct ResultDeleter {
    void operator()(pf_result *r) const { pf_result_destroy(r); }
};
using Context = std::unique_ptr<pf_context, ContextDeleter>;
using Result = std::unique_ptr<pf_result, ResultDeleter>;

struct Error : std::runtime_error {
    pf_status status;
    Error(pf_status s, const std::string &m) : std::runtime_error(m), status(s) {}
};

// Throws with the handle's message unless `s` is PF_OK.
void check(pf_status s, const pf_context *ctx, const char *what) {
    if (s == PF_OK) return;
    std::string m = take(ctx ? pf_context_error_message(ctx) : pf_last_error_message());
    throw Error(s, std::string(what) + ": " + m);
}
void check(pf_status s, const pf_result *r, const char *what) {
    if (s == PF_OK) return;
    throw Error(s, std::string(what) + ": " + take(pf_result_error_message(r)));
}

std::string result_string(const pf_result *r,
                          pf_status (*f)(const pf_result *, char **), const char *what) {
    char *s = nullptr;
    check(f(r, &s), r, what);
    return take(s);
}

const char *dtype_name(pf_dtype t) {
    switch (t) {
    case PF_DTYPE_F32: return "f32";
    case PF_DTYPE_F16: return "f16";
    case PF_DTYPE_BF16: return "bf16";
    case PF_DTYPE_F64: return "f64";
    case PF_DTYPE_I32: return "i32";
    case PF_DTYPE_I64: return "i64";
    case PF_DTYPE_U8: return "u8";
    case PF_DTYPE_BOOL: return "bool";
    case PF_DTYPE_F8E4M3: return "f8e4m3";
    case PF_DTYPE_F8E5M2: return "f8e5m2";
    default: return "?";
    }
}

// ---- the CUDA driver, through dlopen ---------------------------------------

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st *;
using CUdeviceptr = unsigned long long;

struct Driver {
    void *lib = nullptr;
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDeviceGetCount)(int *) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
    CUresult (*cuStreamDestroy)(CUstream) = nullptr;
    CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = nullptr;
    CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = nullptr;
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = nullptr;
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = nullptr;

    template <class F> bool sym(F &f, const char *name) {
        f = reinterpret_cast<F>(dlsym(lib, name));
        return f != nullptr;
    }
    // False when there is no driver library or it lacks a function.
    bool open() {
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) return false;
        return sym(cuInit, "cuInit") && sym(cuDeviceGetCount, "cuDeviceGetCount") &&
               sym(cuDeviceGet, "cuDeviceGet") &&
               sym(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
               sym(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
               sym(cuCtxSetCurrent, "cuCtxSetCurrent") &&
               sym(cuStreamCreate, "cuStreamCreate") &&
               sym(cuStreamDestroy, "cuStreamDestroy_v2") &&
               sym(cuStreamSynchronize, "cuStreamSynchronize") &&
               sym(cuMemAlloc, "cuMemAlloc_v2") && sym(cuMemFree, "cuMemFree_v2") &&
               sym(cuMemcpyHtoD, "cuMemcpyHtoD_v2") && sym(cuMemcpyDtoH, "cuMemcpyDtoH_v2") &&
               sym(cuMemsetD8, "cuMemsetD8_v2");
    }
    ~Driver() {
        if (lib != nullptr) dlclose(lib);
    }
};

void cu(CUresult r, const char *what) {
    if (r != 0) throw Error(PF_ERR_ENVIRONMENT, std::string(what) + " failed with CUDA error " +
                                                    std::to_string(r));
}

// Runs every kernel of `r` on the GPU on random A, B and compares C with a
// CPU loop. Returns the process exit status.
int launch_and_check(const pf_result *r, Driver &d) {
    int count = 0;
    if (d.cuInit(0) != 0 || d.cuDeviceGetCount(&count) != 0 || count == 0) {
        std::printf("no CUDA device: skipping the launch\n");
        return 0;
    }
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    cu(d.cuDeviceGet(&dev, 0), "cuDeviceGet");
    cu(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    cu(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUstream stream = nullptr;
    cu(d.cuStreamCreate(&stream, 0), "cuStreamCreate");

    // The tensors, in argument order: A, B, C (each checked by name).
    size_t nargs = 0;
    check(pf_result_num_args(r, &nargs), r, "pf_result_num_args");
    std::vector<std::string> names;
    std::vector<size_t> bytes;
    std::vector<int64_t> extents;  // M, N, K from C's and A's shapes
    for (size_t i = 0; i < nargs; i++) {
        pf_arg_kind kind = 0;
        check(pf_result_arg_kind(r, i, &kind), r, "pf_result_arg_kind");
        if (kind != PF_ARG_TENSOR) continue;
        char *name = nullptr;
        check(pf_result_arg_name(r, i, &name), r, "pf_result_arg_name");
        names.push_back(take(name));
        size_t b = 0;
        check(pf_result_arg_bytes(r, i, nullptr, 0, &b), r, "pf_result_arg_bytes");
        bytes.push_back(b);
    }
    if (names != std::vector<std::string>{"A", "B", "C"}) {
        std::printf("not gemm's arguments: skipping the check\n");
        return 0;
    }
    int64_t M = 0, K = 0, N = 0;
    check(pf_result_arg_extent(r, 0, 0, nullptr, 0, &M), r, "extent");
    check(pf_result_arg_extent(r, 0, 1, nullptr, 0, &K), r, "extent");
    check(pf_result_arg_extent(r, 1, 1, nullptr, 0, &N), r, "extent");

    std::mt19937 gen(42);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> A(M * K), B(K * N), C(M * N, 0.0f);
    for (auto &x : A) x = uni(gen);
    for (auto &x : B) x = uni(gen);

    std::vector<CUdeviceptr> dptr(3, 0);
    for (int i = 0; i < 3; i++) cu(d.cuMemAlloc(&dptr[i], bytes[i]), "cuMemAlloc");
    cu(d.cuMemcpyHtoD(dptr[0], A.data(), bytes[0]), "cuMemcpyHtoD");
    cu(d.cuMemcpyHtoD(dptr[1], B.data(), bytes[1]), "cuMemcpyHtoD");
    cu(d.cuMemsetD8(dptr[2], 0, bytes[2]), "cuMemsetD8");

    std::vector<void *> ptrs;
    for (CUdeviceptr p : dptr) ptrs.push_back(reinterpret_cast<void *>(p));
    size_t nk = 0;
    check(pf_result_num_kernels(r, &nk), r, "pf_result_num_kernels");
    for (size_t k = 0; k < nk; k++)
        check(pf_result_launch(r, k, nullptr, ptrs.data(), stream), r, "pf_result_launch");
    cu(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    cu(d.cuMemcpyDtoH(C.data(), dptr[2], bytes[2]), "cuMemcpyDtoH");
    for (CUdeviceptr p : dptr) d.cuMemFree(p);
    d.cuStreamDestroy(stream);
    d.cuDevicePrimaryCtxRelease(dev);

    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = 0;
            for (int64_t k = 0; k < K; k++) ref += double(A[i * K + k]) * double(B[k * N + j]);
            worst = std::fmax(worst, std::fabs(C[i * N + j] - ref) / std::fmax(std::fabs(ref), 1e-2));
        }
    bool ok = worst <= 1e-4;
    std::printf("check: %s (largest relative error %.3g)\n", ok ? "ok" : "FAILED", worst);
    return ok ? 0 : 1;
}

int run(const std::string &path) {
    std::printf("polyfuse %s (ABI %d)\n", pf_version(), int(pf_abi_version()));
    if (pf_abi_version() != PF_ABI_VERSION) {
        std::fprintf(stderr, "the library's ABI differs from this header's\n");
        return 2;
    }
    pf_context *raw = nullptr;
    check(pf_context_create(&raw), static_cast<const pf_context *>(nullptr), "pf_context_create");
    Context ctx(raw);
    check(pf_context_load_file(ctx.get(), path.c_str()), ctx.get(), "pf_context_load_file");
    check(pf_context_set_strategy(ctx.get(), "isl"), ctx.get(), "pf_context_set_strategy");
    const int64_t tile[] = {32, 32, 16};
    check(pf_context_set_tile(ctx.get(), tile, 3), ctx.get(), "pf_context_set_tile");
    check(pf_context_set_target(ctx.get(), "cuda"), ctx.get(), "pf_context_set_target");

    pf_result *rraw = nullptr;
    pf_status s = pf_compile(ctx.get(), &rraw);
    if (s == PF_ERR_ENVIRONMENT) {
        std::printf("no CUDA target (%s); compiling for the cpu\n",
                    take(pf_context_error_message(ctx.get())).c_str());
        check(pf_context_set_target(ctx.get(), "cpu"), ctx.get(), "pf_context_set_target");
        s = pf_compile(ctx.get(), &rraw);
    }
    check(s, ctx.get(), "pf_compile");
    Result result(rraw);
    const pf_result *r = result.get();

    size_t nk = 0;
    check(pf_result_num_kernels(r, &nk), r, "pf_result_num_kernels");
    std::printf("target %s, %zu kernel(s)\n",
                result_string(r, pf_result_target, "pf_result_target").c_str(), nk);

    size_t nargs = 0;
    check(pf_result_num_args(r, &nargs), r, "pf_result_num_args");
    std::printf("arguments:");
    for (size_t i = 0; i < nargs; i++) {
        pf_arg_kind kind = 0;
        char *name = nullptr;
        check(pf_result_arg_kind(r, i, &kind), r, "pf_result_arg_kind");
        check(pf_result_arg_name(r, i, &name), r, "pf_result_arg_name");
        std::string line = " " + take(name);
        if (kind == PF_ARG_TENSOR) {
            pf_dtype t = 0;
            size_t rank = 0;
            check(pf_result_arg_dtype(r, i, &t), r, "pf_result_arg_dtype");
            check(pf_result_arg_rank(r, i, &rank), r, "pf_result_arg_rank");
            line += std::string(": ") + dtype_name(t) + "[";
            for (size_t dim = 0; dim < rank; dim++) {
                char *e = nullptr;
                check(pf_result_arg_dim(r, i, dim, &e), r, "pf_result_arg_dim");
                line += (dim ? ", " : "") + take(e);
            }
            line += "]";
        } else {
            line += ": long";
        }
        std::printf("%s%s", line.c_str(), i + 1 < nargs ? "," : "\n");
    }

    for (size_t k = 0; k < nk; k++) {
        char *name = nullptr;
        uint32_t grid[3], block[3];
        size_t dyn = 0, stat = 0;
        check(pf_result_kernel_name(r, k, &name), r, "pf_result_kernel_name");
        check(pf_result_kernel_grid(r, k, nullptr, 0, grid), r, "pf_result_kernel_grid");
        check(pf_result_kernel_block(r, k, block), r, "pf_result_kernel_block");
        check(pf_result_kernel_shared_memory(r, k, &dyn, &stat), r, "shared memory");
        std::printf("kernel %zu: %s grid (%u, %u, %u) block (%u, %u, %u) shared %zu dynamic + %zu "
                    "static bytes\n",
                    k, take(name).c_str(), grid[0], grid[1], grid[2], block[0], block[1],
                    block[2], dyn, stat);
    }
    std::printf("--- schedule tree\n%s",
                result_string(r, pf_result_schedule_tree, "pf_result_schedule_tree").c_str());
    if (nk > 0) {
        std::printf("--- CUDA source\n%s",
                    result_string(r, pf_result_cuda_source, "pf_result_cuda_source").c_str());
    } else {
        std::printf("--- C source\n%s",
                    result_string(r, pf_result_c_source, "pf_result_c_source").c_str());
        return 0;
    }

    Driver driver;
    if (!driver.open()) {
        std::printf("no CUDA driver: skipping the launch\n");
        return 0;
    }
    return launch_and_check(r, driver);
}

}  // namespace

int main(int argc, char **argv) {
    std::string path = argc > 1 ? argv[1] : "examples/gemm.json";
    try {
        return run(path);
    } catch (const Error &e) {
        std::fprintf(stderr, "error (status %d): %s\n", int(e.status), e.what());
        return 2;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
