#!/bin/bash
# usage: sass.sh POLYFUSE OUTDIR: the SASS of polyfuse's emitted kernel and of the hand-written
# cp.async kernel (cpa_gemm<32, 1>) for gemm f16 128 x 1024 x 1024, for comparing instruction counts.
set -u
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
"$1" schedule "$HERE/../../programs/gemm_f16_128x1024x1024.json" --emit cuda > "$W/kernel.cu" || exit 1
cd "$W" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=229376 -DEMITTED_GX=32 -DEMITTED_GY=2 -DEMITTED_GZ=1 -I. -o run "$HERE/harness.cu" -lcuda -lcublas > build.log 2>&1 || { tail build.log; exit 1; }
cuobjdump -sass -fun kernel_0 run > "$2/emitted.sass"
cuobjdump -sass run | awk '/Function : .*cpa_gemmILi32ELi1E/{p=1} p&&/Function : / && !/cpa_gemmILi32ELi1E/{p=0} p' > "$2/cpa.sass"
wc -l "$2"/*.sass
