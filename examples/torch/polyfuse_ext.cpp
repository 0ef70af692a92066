// polyfuse_ext.cpp: the torch glue of the PyTorch extension. Everything
// that talks to polyfuse is in polyfuse_ext_core.cpp (polyfuse.h only);
// here tensors become pointers, torch's current stream becomes the
// CUstream, and outputs are allocated by torch. Temps are never allocated
// here: the kernels' temps live in polyfuse's workspace (the result's own,
// or with torch_workspace=True one buffer from torch's caching allocator,
// allocated on the current stream, of pf_result_workspace_size bytes).
//
// Built by polyfuse_torch.py with torch.utils.cpp_extension.load.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>

#include <dlfcn.h>

#include <memory>
#include <string>
#include <vector>

#include "polyfuse_ext_core.hpp"

namespace {

at::ScalarType torch_dtype(pf_dtype t) {
    switch (t) {
    case PF_DTYPE_F32: return at::ScalarType::Float;
    case PF_DTYPE_F16: return at::ScalarType::Half;
    case PF_DTYPE_BF16: return at::ScalarType::BFloat16;
    case PF_DTYPE_F64: return at::ScalarType::Double;
    case PF_DTYPE_I32: return at::ScalarType::Int;
    case PF_DTYPE_I64: return at::ScalarType::Long;
    case PF_DTYPE_U8: return at::ScalarType::Byte;
    case PF_DTYPE_BOOL: return at::ScalarType::Bool;
    case PF_DTYPE_F8E4M3: return at::ScalarType::Float8_e4m3fn;
    case PF_DTYPE_F8E5M2: return at::ScalarType::Float8_e5m2;
    default: break;
    }
    throw polyfuse_ext::Error(PF_ERR_INTERNAL, "polyfuse: unknown dtype code " + std::to_string(t));
}

// A compiled program, callable on tensors.
class Compiled {
public:
    Compiled(const std::string &program, const std::vector<std::pair<std::string, int64_t>> &params,
             const std::string &arch, bool torch_workspace)
        : program_(std::make_unique<polyfuse_ext::Program>(program, params, options(arch))),
          torch_workspace_(torch_workspace) {}

    // Inputs and outputs, each a dict (name, role, dtype, shape).
    py::list specs() const {
        py::list out;
        for (const auto &t : program_->io()) {
            py::dict d;
            d["name"] = t.name;
            d["role"] = t.role == PF_ROLE_INPUT ? "input" : "output";
            d["dtype"] = polyfuse_ext::dtype_name(t.dtype);
            d["shape"] = t.extents;
            out.append(d);
        }
        return out;
    }

    // Runs the kernels on `inputs` (in inputs() order) on torch's current
    // stream; `outputs` are given (in outputs() order) or allocated here.
    // Returns the outputs.
    std::vector<at::Tensor> run(const std::vector<at::Tensor> &inputs,
                                std::vector<at::Tensor> outputs) const {
        const auto &ins = program_->inputs();
        const auto &outs = program_->outputs();
        TORCH_CHECK(inputs.size() == ins.size(), "polyfuse: ", program_->name(), " takes ",
                    ins.size(), " inputs, ", inputs.size(), " given");
        TORCH_CHECK(!inputs.empty() || !outputs.empty(), "polyfuse: no tensor to run on");
        at::Device device = inputs.empty() ? outputs[0].device() : inputs[0].device();
        TORCH_CHECK(device.is_cuda(), "polyfuse: tensors must be on a CUDA device");
        for (size_t i = 0; i < ins.size(); i++) check(inputs[i], ins[i], device);
        if (outputs.empty()) {
            for (const auto &o : outs) {
                outputs.push_back(at::empty(o.extents, at::TensorOptions()
                                                           .dtype(torch_dtype(o.dtype))
                                                           .device(device)));
            }
        }
        TORCH_CHECK(outputs.size() == outs.size(), "polyfuse: ", program_->name(), " has ",
                    outs.size(), " outputs, ", outputs.size(), " given");
        for (size_t i = 0; i < outs.size(); i++) check(outputs[i], outs[i], device);
        // Pointers in argument order: inputs and outputs interleave as the
        // program declares them (io()).
        std::vector<void *> ptrs;
        size_t next_in = 0, next_out = 0;
        for (const auto &t : program_->io()) {
            ptrs.push_back(t.role == PF_ROLE_INPUT ? inputs[next_in++].data_ptr()
                                                   : outputs[next_out++].data_ptr());
        }
        // torch's current stream on the tensors' device; its handle is 0
        // for the default (legacy) stream, which polyfuse resolves to the
        // tensors' context.
        cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
        void *workspace = nullptr;
        size_t bytes = program_->workspace_bytes();
        at::Tensor buffer;
        if (torch_workspace_ && bytes > 0) {
            // The caching allocator records the buffer's use on the current
            // stream, so it is not reused before the kernels are done.
            buffer = at::empty({static_cast<int64_t>(bytes)},
                               at::TensorOptions().dtype(at::ScalarType::Byte).device(device));
            workspace = buffer.data_ptr();
        }
        program_->launch(ptrs, workspace, bytes, stream);
        return outputs;
    }

    size_t workspace_bytes() const { return program_->workspace_bytes(); }
    size_t num_temps() const { return program_->num_temps(); }
    size_t num_temps_in_memory() const { return program_->num_temps_in_memory(); }
    size_t num_kernels() const { return program_->num_kernels(); }
    std::string cuda_source() const { return program_->cuda_source(); }

private:
    static polyfuse_ext::Options options(const std::string &arch) {
        polyfuse_ext::Options o;
        o.arch = arch;
        return o;
    }

    void check(const at::Tensor &t, const polyfuse_ext::TensorSpec &s, at::Device device) const {
        TORCH_CHECK(t.device() == device, "polyfuse: ", s.name, " is on ", t.device(),
                    ", the others on ", device);
        TORCH_CHECK(t.scalar_type() == torch_dtype(s.dtype), "polyfuse: ", s.name, " is ",
                    t.scalar_type(), ", the program declares ", polyfuse_ext::dtype_name(s.dtype));
        TORCH_CHECK(t.sizes().vec() == s.extents, "polyfuse: ", s.name, " has shape ", t.sizes(),
                    ", the program ", at::IntArrayRef(s.extents));
        TORCH_CHECK(t.is_contiguous(), "polyfuse: ", s.name, " must be contiguous (row-major)");
    }

    std::unique_ptr<polyfuse_ext::Program> program_;
    bool torch_workspace_;
};

// Whether the calling thread has a current CUDA driver context (for the
// check script: a fresh Python thread has none until the CUDA runtime
// makes one current). Asks the driver torch loaded; -1 if not found.
int thread_has_cuda_context() {
    using GetCurrent = int (*)(void **);
    auto f = reinterpret_cast<GetCurrent>(dlsym(RTLD_DEFAULT, "cuCtxGetCurrent"));
    if (f == nullptr) return -1;
    void *ctx = nullptr;
    if (f(&ctx) != 0) return -1;
    return ctx != nullptr ? 1 : 0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    // polyfuse's errors (polyfuse_ext::Error) become RuntimeError with the
    // library's message.
    py::register_exception<polyfuse_ext::Error>(m, "PolyfuseError", PyExc_RuntimeError);
    py::class_<Compiled>(m, "Compiled")
        .def(py::init<const std::string &, const std::vector<std::pair<std::string, int64_t>> &,
                      const std::string &, bool>(),
             py::arg("program"), py::arg("params"), py::arg("arch") = "",
             py::arg("torch_workspace") = false)
        .def("specs", &Compiled::specs)
        .def("run", &Compiled::run, py::arg("inputs"), py::arg("outputs"))
        .def_property_readonly("workspace_bytes", &Compiled::workspace_bytes)
        .def_property_readonly("num_temps", &Compiled::num_temps)
        .def_property_readonly("num_temps_in_memory", &Compiled::num_temps_in_memory)
        .def_property_readonly("num_kernels", &Compiled::num_kernels)
        .def("cuda_source", &Compiled::cuda_source);
    m.def("thread_has_cuda_context", &thread_has_cuda_context);
}
