// polyfuse_ext_core.cpp: see polyfuse_ext_core.hpp. Only polyfuse.h and
// the C++ standard library: no torch, no CUDA header.
#include "polyfuse_ext_core.hpp"

#include <fstream>
#include <memory>
#include <sstream>

namespace polyfuse_ext {
namespace {

// A string handed out by polyfuse, freed here.
std::string take(char *s) {
    if (s == nullptr) return std::string();
    std::string out(s);
    pf_string_free(s);
    return out;
}

struct ContextDeleter {
    void operator()(pf_context *c) const { pf_context_destroy(c); }
};
using Context = std::unique_ptr<pf_context, ContextDeleter>;

void check(pf_status s, const pf_context *ctx, const std::string &what) {
    if (s == PF_OK) return;
    std::string m = take(ctx != nullptr ? pf_context_error_message(ctx) : pf_last_error_message());
    throw Error(s, "polyfuse: " + what + ": " + m);
}

void check(pf_status s, const pf_result *r, const std::string &what) {
    if (s == PF_OK) return;
    throw Error(s, "polyfuse: " + what + ": " + take(pf_result_error_message(r)));
}

}  // namespace

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

namespace {

// The text of `program` (itself when it is JSON text, else its file's).
std::string text_of(const std::string &program) {
    if (!program.empty() && program[0] == '{') return program;
    std::ifstream in(program, std::ios::binary);
    if (!in) throw Error(PF_ERR_INPUT, "polyfuse: cannot read " + program);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

}  // namespace

Program::Program(const std::string &program,
                 const std::vector<std::pair<std::string, int64_t>> &params,
                 const Options &options) {
    const std::string text = text_of(program);
    // An artifact names itself so at its top level (a program's text, which
    // an artifact holds escaped, cannot contain the quoted key as is).
    if (text.find("\"polyfuse_artifact\"") != std::string::npos) {
        if (!params.empty()) {
            throw Error(PF_ERR_INPUT, "polyfuse: an artifact's sizes are its own; give no parameters");
        }
        check(pf_result_load(text.data(), text.size(), &result_),
              static_cast<pf_context *>(nullptr), "loading the artifact " + program);
        describe(program);
        return;
    }
    pf_context *raw = nullptr;
    check(pf_context_create(&raw), static_cast<pf_context *>(nullptr), "pf_context_create");
    Context ctx(raw);
    if (!program.empty() && program[0] == '{') {
        check(pf_context_load_json_n(ctx.get(), program.data(), program.size()), ctx.get(),
              "loading the program text");
    } else {
        check(pf_context_load_file(ctx.get(), program.c_str()), ctx.get(),
              "loading " + program);
    }
    check(pf_context_set_target(ctx.get(), options.target.c_str()), ctx.get(), "target");
    for (const auto &p : params) {
        check(pf_context_set_param_value(ctx.get(), p.first.c_str(), p.second), ctx.get(),
              "parameter " + p.first);
    }
    if (!options.arch.empty()) {
        check(pf_context_set_arch(ctx.get(), options.arch.c_str()), ctx.get(), "arch");
    }
    check(pf_context_set_device(ctx.get(), options.device), ctx.get(), "device");
    if (!options.cache.empty()) {
        check(pf_context_set_cache(ctx.get(), options.cache.c_str()), ctx.get(), "cache");
    }
    check(pf_compile(ctx.get(), &result_), ctx.get(), "pf_compile");
    describe(program);
}

void Program::describe(const std::string &program) {
    try {
        size_t symbolic = 0;
        check(pf_result_num_params(result_, &symbolic), result_, "pf_result_num_params");
        if (symbolic != 0) {
            std::string names;
            for (size_t i = 0; i < symbolic; i++) {
                char *n = nullptr;
                check(pf_result_param_name(result_, i, &n), result_, "pf_result_param_name");
                names += (i ? ", " : "") + take(n);
            }
            throw Error(PF_ERR_INPUT, "polyfuse: give every size a value (missing: " + names + ")");
        }
        check(pf_result_num_kernels(result_, &kernels_), result_, "pf_result_num_kernels");
        check(pf_result_workspace_size(result_, nullptr, 0, &workspace_), result_,
              "pf_result_workspace_size");
        size_t count = 0;
        check(pf_result_tensors(result_, nullptr, 0, nullptr, 0, &count), result_,
              "pf_result_tensors");
        std::vector<pf_tensor_info> infos(count);
        check(pf_result_tensors(result_, nullptr, 0, infos.data(), infos.size(), &count), result_,
              "pf_result_tensors");
        for (const pf_tensor_info &t : infos) {
            if (t.role == PF_ROLE_TEMP) {
                int64_t offset = -1;
                check(pf_result_arg_workspace_offset(result_, t.arg_index, nullptr, 0, &offset),
                      result_, "pf_result_arg_workspace_offset");
                temps_++;
                temps_in_memory_ += offset >= 0 ? 1 : 0;
                continue;
            }
            TensorSpec spec{t.name, t.role, t.dtype,
                            std::vector<int64_t>(t.extents, t.extents + t.rank), t.bytes};
            io_.push_back(spec);
            (t.role == PF_ROLE_INPUT ? inputs_ : outputs_).push_back(spec);
        }
    } catch (...) {
        pf_result_destroy(result_);
        throw;
    }
    // The program's name: the file name or "program" for text.
    size_t slash = program.find_last_of('/');
    name_ = program[0] == '{' ? "program" : program.substr(slash == std::string::npos ? 0 : slash + 1);
}

Program::~Program() { pf_result_destroy(result_); }

std::string Program::cuda_source() const {
    char *s = nullptr;
    check(pf_result_cuda_source(result_, &s), result_, "pf_result_cuda_source");
    return take(s);
}

void Program::launch(const std::vector<void *> &io_ptrs, void *workspace, size_t workspace_bytes,
                     void *stream) const {
    if (io_ptrs.size() != io_.size()) {
        throw Error(PF_ERR_INVALID_ARGUMENT,
                    "polyfuse: " + std::to_string(io_ptrs.size()) + " pointers for " +
                        std::to_string(io_.size()) + " inputs and outputs");
    }
    // pf_result_launch_workspace takes a void **; it only reads the array.
    std::vector<void *> ptrs(io_ptrs);
    for (size_t k = 0; k < kernels_; k++) {
        check(pf_result_launch_workspace(result_, k, nullptr, ptrs.data(), workspace,
                                         workspace_bytes, static_cast<CUstream>(stream)),
              result_, "launching kernel " + std::to_string(k));
    }
}

}  // namespace polyfuse_ext
