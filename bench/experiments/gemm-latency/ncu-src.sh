#!/bin/bash
# usage (from the repository root): ncu-src.sh [POLYFUSE]: Nsight Compute source counters and warp
# states of polyfuse's emitted gemm f16 128 x 1024 x 1024 kernel and of the hand-written one
# (cpa_64x32_split1), written to $OUT/ncu_*.txt.
set -u
P=${1:-bench-bin/polyfuse}
R=$PWD; HERE=$R/bench/experiments/gemm-latency; W=$(mktemp -d)
"$P" schedule bench/programs/gemm_f16_128x1024x1024.json --emit cuda > $W/kernel.cu
(cd $W && nvcc -O3 -lineinfo -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=229376 -DEMITTED_GX=32 -DEMITTED_GY=2 -DEMITTED_GZ=1 -I. -o run $HERE/harness.cu -lcuda -lcublas > build.log 2>&1 || tail build.log)
cd $W
NCU=$(which ncu || echo /usr/local/cuda/bin/ncu)
for v in emitted cpa_64x32_split1_nocluster; do
  QUICK=1 $NCU -c 1 -k regex:"kernel_0|cpa_gemm" --section SourceCounters --section WarpStateStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum --print-details all ./run $v > $OUT/ncu_$v.txt 2>&1
  $NCU --version | head -1
done
ls -la $OUT
