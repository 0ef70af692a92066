#!/bin/bash
# usage: ab.sh BASE_POLYFUSE NEW_POLYFUSE: the kernels two polyfuse builds emit for gemm f16
# 128 x 1024 x 1024, each built with harness.cu, timed in two alternating rounds beside the
# hand-written cp.async kernel of the same tiles and cuBLAS (every one checked against f64).
set -u
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
for nb in base="$1" new="$2"; do
  n=${nb%%=*}; b=${nb#*=}; mkdir -p "$W/$n"
  "$b" schedule "$HERE/../../programs/gemm_f16_128x1024x1024.json" --emit cuda > "$W/$n/kernel.cu" || exit 1
  (cd "$W/$n" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=229376 -DEMITTED_GX=32 -DEMITTED_GY=2 -DEMITTED_GZ=1 -I. -o run "$HERE/harness.cu" -lcuda -lcublas > build.log 2>&1 || { echo "$n: build failed"; tail -5 build.log; }) &
done
wait
for rep in 1 2; do
  for n in base new; do echo "== $n"; "$W/$n/run" emitted; done
  "$W/new/run" cpa_64x32_split1; "$W/new/run" cublas
done
