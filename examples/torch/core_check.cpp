// core_check.cpp: the extension's core (polyfuse_ext_core.cpp) without
// torch or a GPU: what it reads from the C ABI for the programs the GPU
// check runs (inputs, outputs, temps, the workspace), and its errors.
// Built and run by scripts/abi-test.sh.
//
// usage: core_check EXAMPLES_DIR     exit status: 0 ok, 1 a check failed
#include "polyfuse_ext_core.hpp"

#include <cstdio>
#include <string>

namespace {

int failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                          \
        }                                                                        \
    } while (0)

std::string names(const std::vector<polyfuse_ext::TensorSpec> &specs) {
    std::string s;
    for (const auto &t : specs) s += (s.empty() ? "" : ",") + t.name;
    return s;
}

// The status of the Error `f` throws; -1 when it throws none.
template <typename F> pf_status status_of(F f) {
    try {
        f();
    } catch (const polyfuse_ext::Error &e) {
        std::printf("  (expected) %s\n", e.what());
        return e.status;
    }
    return -1;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: core_check EXAMPLES_DIR\n");
        return 1;
    }
    const std::string dir = argv[1];
    try {
        // gemm: two inputs, one output, no temp, sizes set by name.
        polyfuse_ext::Program gemm(dir + "/gemm_f16.json", {{"M", 96}, {"N", 64}, {"K", 48}});
        CHECK(names(gemm.inputs()) == "A,B" && names(gemm.outputs()) == "C");
        CHECK(gemm.io().size() == 3 && gemm.num_kernels() >= 1);
        CHECK(gemm.inputs()[0].dtype == PF_DTYPE_F16 && gemm.outputs()[0].dtype == PF_DTYPE_F32);
        CHECK(gemm.inputs()[0].extents == (std::vector<int64_t>{96, 48}));
        CHECK(gemm.outputs()[0].bytes == 96 * 64 * 4);
        CHECK(gemm.num_temps() == 0 && gemm.workspace_bytes() == 0);
        CHECK(gemm.cuda_source().find("__global__") != std::string::npos);
        // Launching: the wrong number of pointers is the caller's error;
        // without a GPU the launch fails cleanly (with one, these pointers
        // are no device memory the driver knows).
        CHECK(status_of([&] { gemm.launch({nullptr}, nullptr, 0, nullptr); }) ==
              PF_ERR_INVALID_ARGUMENT);
        std::vector<void *> fake = {reinterpret_cast<void *>(0x10000),
                                    reinterpret_cast<void *>(0x20000),
                                    reinterpret_cast<void *>(0x30000)};
        pf_status st = status_of([&] { gemm.launch(fake, nullptr, 0, nullptr); });
        CHECK(st == PF_ERR_ENVIRONMENT || st == PF_ERR_INVALID_ARGUMENT);

        // Causal attention: seven temps, none of which reaches memory (the
        // caller allocated 3.0 GiB of them before, issue 33).
        polyfuse_ext::Program attention(dir + "/attention_causal.json",
                                        {{"B", 1}, {"H", 2}, {"S", 128}, {"D", 64}});
        CHECK(names(attention.inputs()) == "Q,K,V" && names(attention.outputs()) == "Y");
        CHECK(attention.num_temps() >= 7 && attention.num_temps_in_memory() == 0);
        CHECK(attention.workspace_bytes() == 0);

        // softmax: its kernels pass temps through memory, in the workspace.
        polyfuse_ext::Program softmax(dir + "/softmax.json", {{"N", 33}, {"D", 65}});
        CHECK(softmax.num_temps() == 3 && softmax.num_temps_in_memory() >= 1);
        CHECK(softmax.workspace_bytes() >= 33 * 4);
        std::printf("core_check: gemm %zu kernel(s); attention %zu temps, %zu in memory; "
                    "softmax %zu temps, %zu in memory, workspace %zu bytes\n",
                    gemm.num_kernels(), attention.num_temps(), attention.num_temps_in_memory(),
                    softmax.num_temps(), softmax.num_temps_in_memory(), softmax.workspace_bytes());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "core_check: unexpected error: %s\n", e.what());
        return 1;
    }
    // An artifact (pf_result_save's text) is loaded, not compiled.
    {
        pf_context *ctx = nullptr;
        pf_result *res = nullptr;
        char *doc = nullptr;
        CHECK(pf_context_create(&ctx) == PF_OK);
        CHECK(pf_context_load_file(ctx, (dir + "/gemm_f16.json").c_str()) == PF_OK);
        CHECK(pf_context_set_target(ctx, "cuda") == PF_OK);
        CHECK(pf_context_set_param_value(ctx, "M", 80) == PF_OK);
        CHECK(pf_compile(ctx, &res) == PF_OK);
        CHECK(pf_result_save(res, nullptr, &doc) == PF_OK && doc != nullptr);
        const std::string artifact = doc ? doc : "";
        pf_string_free(doc);
        pf_result_destroy(res);
        pf_context_destroy(ctx);
        try {
            polyfuse_ext::Program loaded(artifact, {});
            CHECK(names(loaded.inputs()) == "A,B" && loaded.num_kernels() >= 1);
            CHECK(loaded.inputs()[0].extents[0] == 80);
        } catch (const std::exception &e) {
            std::fprintf(stderr, "core_check: the artifact did not load: %s\n", e.what());
            failures++;
        }
        CHECK(status_of([&] { polyfuse_ext::Program p(artifact, {{"M", 3}}); }) == PF_ERR_INPUT);
    }
    // Errors come back as polyfuse_ext::Error with the library's status.
    CHECK(status_of([&] { polyfuse_ext::Program p("{\"name\": ", {}); }) == PF_ERR_INPUT);
    CHECK(status_of([&] { polyfuse_ext::Program p(dir + "/gemm_f16.json", {{"Q", 3}}); }) ==
          PF_ERR_INPUT);
    CHECK(status_of([&] {
              polyfuse_ext::Program p(
                  "{\"name\": \"s\", \"params\": {\"N\": null},"
                  " \"inputs\": {\"X\": {\"dtype\": \"f32\", \"shape\": [\"N\"]}},"
                  " \"outputs\": {\"Y\": {\"dtype\": \"f32\", \"shape\": [\"N\"]}},"
                  " \"body\": [\"Y(i) = X(i) * 2.0\"]}",
                  {});
          }) == PF_ERR_INPUT);
    if (failures == 0) std::printf("core_check: ok\n");
    return failures == 0 ? 0 : 1;
}
