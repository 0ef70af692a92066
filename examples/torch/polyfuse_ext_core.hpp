// polyfuse_ext_core.hpp: the part of the PyTorch extension that talks to
// polyfuse, through include/polyfuse.h alone. It includes no torch header,
// so CI compiles it with plain g++ where torch is not installed
// (scripts/abi-test.sh builds polyfuse_ext_core.cpp and core_check.cpp).
// The torch glue (polyfuse_ext.cpp) turns tensors into the pointers and
// the stream this file takes.
//
// One Program is one compiled result for fixed parameter values: every
// parameter gets its value at compile time (pf_context_set_param_value),
// so the kernels run with constant sizes, as `polyfuse run --bench` runs
// them, and no parameter is passed at launch.
#ifndef POLYFUSE_EXT_CORE_HPP
#define POLYFUSE_EXT_CORE_HPP

#include <polyfuse.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace polyfuse_ext {

// A failed polyfuse call: its status and the library's message.
struct Error : std::runtime_error {
    pf_status status;
    Error(pf_status s, const std::string &m) : std::runtime_error(m), status(s) {}
};

// One tensor argument the caller passes (an input or an output).
struct TensorSpec {
    std::string name;
    pf_role role;
    pf_dtype dtype;
    std::vector<int64_t> extents;
    size_t bytes;
};

// The compile-time options of a Program.
struct Options {
    std::string target = "cuda";
    std::string arch;     // "" : the device's choice (pf_context_set_arch)
    int32_t device = -1;  // for the tuning cache only (pf_context_set_device)
    std::string cache;    // "" : no cache (pf_context_set_cache)
};

class Program {
public:
    // Compiles `program` (a path to a JSON file, or the JSON text itself
    // when it starts with '{') with each parameter of `params` set by name.
    // An artifact (`polyfuse schedule --emit artifact`, pf_result_save;
    // its text or its file) is loaded instead, without compiling: its
    // sizes are its own, and `params` must be empty.
    Program(const std::string &program, const std::vector<std::pair<std::string, int64_t>> &params,
            const Options &options = Options());
    ~Program();
    Program(const Program &) = delete;
    Program &operator=(const Program &) = delete;

    const std::string &name() const { return name_; }
    // Inputs, then outputs, each in argument order: the order launch()
    // takes their pointers in (pf_result_launch_workspace's io_ptrs).
    const std::vector<TensorSpec> &inputs() const { return inputs_; }
    const std::vector<TensorSpec> &outputs() const { return outputs_; }
    // Inputs and outputs interleaved in argument order (io_ptrs' order).
    const std::vector<TensorSpec> &io() const { return io_; }
    size_t num_kernels() const { return kernels_; }
    // Bytes of the workspace the temps that reach memory need.
    size_t workspace_bytes() const { return workspace_; }
    // Temps declared or made by the program, and how many take memory.
    size_t num_temps() const { return temps_; }
    size_t num_temps_in_memory() const { return temps_in_memory_; }
    std::string cuda_source() const;

    // Launches every kernel in order on `stream` (a CUstream; NULL: the
    // default stream of the tensors' context). `io_ptrs` are device
    // pointers in io() order. `workspace` is the caller's buffer of
    // `workspace_bytes` (at least workspace_bytes()), or NULL for the one
    // the result keeps. Returns once the launches are queued.
    void launch(const std::vector<void *> &io_ptrs, void *workspace, size_t workspace_bytes,
                void *stream) const;

private:
    // Reads what the result says of its tensors, kernels and workspace;
    // destroys it and throws if it cannot be used with fixed sizes.
    void describe(const std::string &program);

    pf_result *result_ = nullptr;
    std::string name_;
    std::vector<TensorSpec> inputs_, outputs_, io_;
    size_t kernels_ = 0, workspace_ = 0, temps_ = 0, temps_in_memory_ = 0;
};

// The name polyfuse's dtype has in the program format ("f16", ...).
const char *dtype_name(pf_dtype t);

}  // namespace polyfuse_ext

#endif
