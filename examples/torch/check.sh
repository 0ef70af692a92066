#!/usr/bin/env bash
# The PyTorch extension on the GPU machine (issue 33 item 7): builds
# examples/torch/polyfuse_ext.cpp against include/polyfuse.h and
# target/release/libpolyfuse.so with torch.utils.cpp_extension.load, runs
# gemm f16 4096^3, causal attention (B4 H16 S2048 D64) and softmax through
# polyfuse_torch.compile on torch's current stream, checks each against
# torch, times it (CUDA events, median of 50 runs after 10 warm-ups)
# beside `polyfuse run --bench` of the same program and sizes and torch's
# own op, launches it again from a fresh Python thread on the default
# stream, loads the command line's ahead-of-time artifact of it without
# compiling, and prints a table. No Rust is needed there: the library and the
# command line are built beforehand (cargo build --release) and carried.
#
#   bash examples/torch/check.sh [check.py options: --runs N --only gemm,...]
#
# Logs go to $OUT (default /tmp/polyfuse-torch-check): check.log,
# results.json, environment.txt, each program's CUDA source (*.cu), the
# command line's JSON (*.cli.json) and artifacts (*.artifact.json). The
# extension is built in /tmp/polyfuse-torch-build (POLYFUSE_TORCH_BUILD).
# Exit status: 0 all checked and gemm within 5% of the command line, 1 not,
# 2 something missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/polyfuse-torch-check}
export OUT
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}

missing=0
for f in target/release/libpolyfuse.so target/release/polyfuse include/polyfuse.h; do
    if [[ ! -e $f ]]; then
        echo "check.sh: $f is missing (cargo build --release here, then carry target/release)" >&2
        missing=1
    fi
done
if ! "$PYTHON" -c 'import torch' 2> /dev/null; then
    echo "check.sh: $PYTHON cannot import torch" >&2
    missing=1
fi
((missing == 0)) || exit 2

{
    echo "== $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null || true
    command -v nvcc > /dev/null && nvcc --version | tail -n 1 || true
    g++ --version | head -n 1 || true
} | tee "$OUT/environment.txt"

# torch.utils.cpp_extension.load needs ninja; without it polyfuse_torch
# runs the same compile and link with g++ itself (said in the log).
set +e
"$PYTHON" examples/torch/check.py --out "$OUT" --polyfuse "$root/target/release/polyfuse" "$@"
status=$?
set -e
echo "check.sh: exit status $status; logs in $OUT"
exit $status
