#!/usr/bin/env bash
# Installs the CUDA compile tools that CI needs without a GPU into
# ./.cuda-tools (gitignored), from PyPI wheels, and prints the environment
# to use them:
#
#   eval "$(scripts/cuda-tools.sh)"
#
# - nvidia-cuda-nvrtc: libnvrtc.so.13 (NVRTC loads and compiles without a GPU
#   or driver); polyfuse's `--emit ptx` finds it on LD_LIBRARY_PATH.
# - nvidia-cuda-runtime: the CUDA headers (cuda_fp16.h, cuda_bf16.h, ...);
#   exported as POLYFUSE_CUDA_INCLUDE and, with CUDA_HOME, as the toolkit
#   root (CUDA_HOME/include).
# - nvidia-cuda-nvcc: ptxas (in nvidia/cu13/bin), for the resource report.
#
# The versions are pinned to the 13.0 line, the toolkit of the H100 machine
# (driver 580, CUDA 13.0), so that the PTX CI checks is what that driver
# accepts. Running it again when everything is there installs nothing; it
# then only checks the tools and prints the environment. Everything it says
# besides the environment goes to stderr.
#
# Options: --check   also compile a tiny kernel that includes cuda_fp16.h and
#                    cuda_bf16.h for sm_90 through libnvrtc (scripts/nvrtc.py)
#                    and run `ptxas -v` on its PTX (a self-test).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir="$root/.cuda-tools"
version=13.0.88
packages=(
    "nvidia-cuda-nvrtc==$version"
    "nvidia-cuda-runtime==$version"
    "nvidia-cuda-nvcc==$version"
)
stamp="$dir/.installed-$version"

say() { echo "cuda-tools: $*" >&2; }
fail() {
    say "$*"
    exit 3
}

self_test=0
for arg in "$@"; do
    case "$arg" in
        --check) self_test=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
            exit 0
            ;;
        *) fail "unknown argument $arg (use --check or nothing)" ;;
    esac
done

command -v python3 >/dev/null 2>&1 || fail "python3 not found; it is needed to install the CUDA wheels"

if [[ ! -f "$stamp" ]]; then
    python3 -m pip --version >/dev/null 2>&1 ||
        fail "python3 has no pip; install python3-pip (apt-get) first"
    say "installing ${packages[*]} into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    # --no-deps: nvidia-cuda-nvcc would pull in nvvm and crt, which ptxas
    # does not need.
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
        --no-compile --only-binary=:all: --target "$dir/site" "${packages[@]}" >&2 ||
        fail "pip install of ${packages[*]} failed"
    touch "$stamp"
fi

cuda="$dir/site/nvidia/cu13"
lib="$cuda/lib"
include="$cuda/include"
bin="$cuda/bin"
[[ -f "$lib/libnvrtc.so.13" ]] || fail "$lib/libnvrtc.so.13 is missing; remove $dir and run again"
[[ -f "$include/cuda_fp16.h" && -f "$include/cuda_bf16.h" ]] ||
    fail "cuda_fp16.h or cuda_bf16.h missing in $include; remove $dir and run again"
[[ -x "$bin/ptxas" ]] || fail "$bin/ptxas is missing; remove $dir and run again"
# libnvrtc.so (no version) for loaders that look for the plain name.
[[ -e "$lib/libnvrtc.so" ]] || ln -s libnvrtc.so.13 "$lib/libnvrtc.so"

if ((self_test)); then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    cat >"$work/probe.cu" <<'EOF'
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void probe(const __half *__restrict__ a,
                                 const __nv_bfloat16 *__restrict__ b,
                                 float *__restrict__ c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = __half2float(a[i]) * __bfloat162float(b[i]) + 1.0f;
}
EOF
    LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" POLYFUSE_CUDA_INCLUDE="$include" \
        python3 "$root/scripts/nvrtc.py" "$work/probe.cu" sm_90 "$work/probe.ptx" >&2 ||
        fail "the NVRTC self-test failed"
    say "NVRTC compiled probe.cu (cuda_fp16.h, cuda_bf16.h) for compute_90: $(wc -c <"$work/probe.ptx") bytes of PTX"
    "$bin/ptxas" -arch=sm_90 -v -o "$work/probe.cubin" "$work/probe.ptx" >&2 ||
        fail "ptxas -arch=sm_90 failed on the self-test PTX"
    say "self-test passed: NVRTC and ptxas work for sm_90"
fi

cat <<EOF
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUDA_HOME="$cuda"
export POLYFUSE_CUDA_INCLUDE="$include"
export PATH="$bin:\$PATH"
EOF
