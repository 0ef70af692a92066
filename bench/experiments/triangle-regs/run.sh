#!/usr/bin/env bash
# Registers and spills of the triangular products' kernels (issue 32), on
# the GPU machine: the CUDA of syrk and covariance from each binary given
# (carried, e.g. target/exp/polyfuse-*) through nvcc/ptxas for sm_90.
#
#   bash bench/experiments/triangle-regs/run.sh target/exp/polyfuse-a target/exp/polyfuse-b
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
tmp=$(mktemp -d)
for bin in "$@"; do
    for p in syrk covariance; do
        f=$tmp/$p-$(basename "$bin").cu
        "$bin" schedule "$root/bench/suite/$p.json" --emit cuda >"$f"
        echo "== $p, $(basename "$bin")"
        /usr/local/cuda/bin/nvcc -arch=sm_90 -c -o /dev/null -Xptxas -v "$f" 2>&1 |
            grep -E 'Compiling entry|registers' | sed 's/ptxas info    ://'
    done
done
