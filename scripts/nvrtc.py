#!/usr/bin/env python3
"""Compiles a CUDA file to PTX with NVRTC, as polyfuse's `--emit ptx` does.

    scripts/nvrtc.py FILE.cu ARCH OUT.ptx

ARCH is an architecture such as sm_90 or sm_90a. NVRTC (libnvrtc.so.13)
is found on LD_LIBRARY_PATH and the CUDA headers in POLYFUSE_CUDA_INCLUDE,
both as `scripts/cuda-tools.sh` sets them; the options are the ones
polyfuse passes (`src/runtime/cuda.rs`, `nvrtc`): the architecture,
C++17 and the include folder. CI's CUDA check (`scripts/cuda-compile-check.sh`)
compiles the golden CUDA files with it, which the golden test holds equal
to what polyfuse emits, so it need not compile every program again; the
check also compares this script's PTX with `--emit ptx`'s for one program.

Exit status: 0 compiled, 1 NVRTC rejected the file (its log on stderr),
3 NVRTC or the headers not found.
"""

import ctypes
import os
import sys


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    src_path, arch, out = sys.argv[1:4]
    include = os.environ.get("POLYFUSE_CUDA_INCLUDE", "")
    try:
        nvrtc = ctypes.CDLL("libnvrtc.so.13")
    except OSError as e:
        sys.stderr.write(f"nvrtc.py: cannot load libnvrtc.so.13 ({e}); run scripts/cuda-tools.sh\n")
        return 3
    if not include or not os.path.isfile(os.path.join(include, "cuda_fp16.h")):
        sys.stderr.write("nvrtc.py: POLYFUSE_CUDA_INCLUDE does not name the CUDA headers\n")
        return 3
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p

    def ok(status, what):
        if status != 0:
            raise SystemExit(f"nvrtc.py: {what}: {nvrtc.nvrtcGetErrorString(status).decode()}")

    prog = ctypes.c_void_p()
    src = open(src_path, "rb").read()
    ok(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"polyfuse.cu", 0, None, None),
       "nvrtcCreateProgram")
    virtual = arch.replace("sm_", "compute_", 1)
    opts = [f"--gpu-architecture={virtual}".encode(), b"--std=c++17",
            f"--include-path={include}".encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if status != 0:
        sys.stderr.write(f"nvrtc.py: {src_path} for {arch}: "
                         f"{nvrtc.nvrtcGetErrorString(status).decode()}\n{log.value.decode()}\n")
        return 1
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    ok(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    with open(out, "wb") as f:
        f.write(ptx.value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
