#!/bin/bash
# usage: run.sh POLYFUSE [VARIANT]: emits polyfuse's kernel, builds the harness, times every variant
# (EMITTED_GX, _GY, _GZ and EMITTED_SMEM: the emitted kernel's launch; polyfuse before 2026-11-26
# took a grid of 16 x 2 x 4 and 98304 bytes)
set -u
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
"$1" schedule "$HERE/../../programs/gemm_f16_128x1024x1024.json" --emit cuda > "$W/kernel.cu" || exit 1
cd "$W" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=${EMITTED_SMEM:-229376} -DEMITTED_GX=${EMITTED_GX:-32} -DEMITTED_GY=${EMITTED_GY:-2} -DEMITTED_GZ=${EMITTED_GZ:-1} -I. -o run "$HERE/harness.cu" -lcuda -lcublas || exit 1
./run ${2:-}
if [ -n "${NCU:-}" ]; then
  QUICK=1 $NCU --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread ./run ${2:-} 2>&1 | grep -E "^  [a-z_]|gpu__time|grid_size|registers|^[a-z]" | head -80
fi
