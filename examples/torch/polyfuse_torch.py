"""polyfuse_torch: polyfuse programs as callables on torch tensors.

    import polyfuse_torch
    gemm = polyfuse_torch.compile("examples/gemm_f16.json", M=4096, N=4096, K=4096)
    C = gemm(A, B)              # inputs positionally, in the program's order
    C = gemm(B=B, A=A)          # or by name
    C = gemm(A, B, out=C)       # outputs given (one tensor, or a tuple)

The work is done by a C++ extension (polyfuse_ext.cpp) built on polyfuse's
C ABI alone (include/polyfuse.h, libpolyfuse.so): it launches the kernels
on torch's current stream and allocates nothing for temps (polyfuse's
workspace holds the ones that reach memory). The extension is built on
first use with torch.utils.cpp_extension.load.

Where polyfuse is: POLYFUSE_ROOT (the repository: include/ and
target/release/libpolyfuse.so), else the repository this file is in;
POLYFUSE_LIB_DIR overrides the library's folder. POLYFUSE_TORCH_BUILD
names the build folder (default: torch's).
"""

import json
import os
import threading

__all__ = ["compile", "Compiled", "extension"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.environ.get("POLYFUSE_ROOT", os.path.abspath(os.path.join(_HERE, "..", "..")))
_LIB_DIR = os.environ.get("POLYFUSE_LIB_DIR", os.path.join(_ROOT, "target", "release"))

_lock = threading.Lock()
_ext = None


_SOURCES = [os.path.join(_HERE, "polyfuse_ext.cpp"), os.path.join(_HERE, "polyfuse_ext_core.cpp")]
_INCLUDES = [os.path.join(_ROOT, "include"), _HERE]
_LDFLAGS = [f"-L{_LIB_DIR}", "-lpolyfuse", f"-Wl,-rpath,{_LIB_DIR}"]


def extension(verbose=False):
    """The built extension module (built once per process):
    torch.utils.cpp_extension.load where ninja is available, else the same
    compile and link with g++ directly (_build_without_ninja)."""
    global _ext
    with _lock:
        if _ext is None:
            from torch.utils import cpp_extension

            lib = os.path.join(_LIB_DIR, "libpolyfuse.so")
            if not os.path.exists(lib):
                raise RuntimeError(
                    f"polyfuse_torch: {lib} not found (cargo build --release, or set POLYFUSE_LIB_DIR)"
                )
            build = os.environ.get("POLYFUSE_TORCH_BUILD")
            if build:
                os.makedirs(build, exist_ok=True)
            if cpp_extension.is_ninja_available():
                kwargs = {"build_directory": build} if build else {}
                _ext = cpp_extension.load(
                    name="polyfuse_ext",
                    sources=_SOURCES,
                    extra_include_paths=_INCLUDES,
                    # torch chooses the C++ standard its headers need.
                    extra_cflags=["-O2"],
                    extra_ldflags=_LDFLAGS,
                    with_cuda=True,
                    verbose=verbose,
                    **kwargs,
                )
            else:
                _ext = _build_without_ninja(build or "/tmp/polyfuse_torch_build", verbose)
    return _ext


def _build_without_ninja(build, verbose):
    """What cpp_extension.load does, for a machine without ninja: one g++
    command with torch's and Python's include folders and libraries."""
    import importlib.util
    import subprocess
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    os.makedirs(build, exist_ok=True)
    try:
        includes = cpp_extension.include_paths(device_type="cuda")
        libdirs = cpp_extension.library_paths(device_type="cuda")
    except TypeError:  # torch before 2.6: include_paths(cuda=True)
        includes = cpp_extension.include_paths(cuda=True)
        libdirs = cpp_extension.library_paths(cuda=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = os.path.join(build, "polyfuse_ext" + suffix)
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    errors = []
    # Newer torch headers need C++20; older ones build as C++17.
    for std in ("c++20", "c++17"):
        cmd = (["g++", "-shared", "-fPIC", "-O2", f"-std={std}",
                "-DTORCH_EXTENSION_NAME=polyfuse_ext", "-DTORCH_API_INCLUDE_EXTENSION_H",
                f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
               + [f"-I{d}" for d in _INCLUDES + includes + [sysconfig.get_paths()["include"]]]
               + _SOURCES + ["-o", target]
               + [f"-L{d}" for d in libdirs] + [f"-Wl,-rpath,{d}" for d in libdirs]
               + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lc10_cuda",
                  "-ltorch_cuda"]
               + _LDFLAGS)
        if verbose:
            print("polyfuse_torch: ninja not found; building with:", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode == 0:
            break
        errors.append(f"-std={std}:\n{p.stderr[-3000:]}")
    else:
        raise RuntimeError("polyfuse_torch: building the extension failed:\n" + "\n".join(errors))
    spec = importlib.util.spec_from_file_location("polyfuse_ext", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Compiled:
    """A program compiled for fixed sizes; call it on tensors."""

    def __init__(self, program, params, arch="", torch_workspace=False):
        ext = extension()
        if isinstance(program, dict):
            program = json.dumps(program)
        self._c = ext.Compiled(str(program), sorted(params.items()), arch, torch_workspace)
        specs = self._c.specs()
        self.inputs = [s for s in specs if s["role"] == "input"]
        self.outputs = [s for s in specs if s["role"] == "output"]

    @property
    def workspace_bytes(self):
        """Bytes of the workspace: the temps some kernel touches in memory."""
        return self._c.workspace_bytes

    @property
    def num_temps(self):
        return self._c.num_temps

    @property
    def num_temps_in_memory(self):
        return self._c.num_temps_in_memory

    @property
    def num_kernels(self):
        return self._c.num_kernels

    def cuda_source(self):
        return self._c.cuda_source()

    def __call__(self, *args, out=None, **kwargs):
        names = [s["name"] for s in self.inputs]
        if len(args) > len(names):
            raise TypeError(f"takes {len(names)} inputs ({', '.join(names)}), {len(args)} given")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"no input named {k} (inputs: {', '.join(names)})")
            if k in given:
                raise TypeError(f"input {k} given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing inputs: {', '.join(missing)}")
        inputs = [given[n] for n in names]
        if out is None:
            outs = []
        elif isinstance(out, (tuple, list)):
            outs = list(out)
        else:
            outs = [out]
        result = self._c.run(inputs, outs)
        return result[0] if len(result) == 1 else tuple(result)


def compile(program, arch="", torch_workspace=False, **params):
    """Compiles `program` (a path to a JSON program, its text, or a dict)
    with every size parameter given by name (e.g. M=4096): the kernels run
    with constant sizes. An artifact (`polyfuse schedule --emit artifact`)
    is loaded instead, without compiling, with its own sizes. `arch` overrides the architecture ("sm_90");
    `torch_workspace` takes the workspace from torch's caching allocator
    instead of polyfuse's own buffer."""
    return Compiled(program, params, arch=arch, torch_workspace=torch_workspace)
