#!/usr/bin/env bash
# Nsight Compute on the hand-written products of gemm_tma.cu and on
# cuBLAS's, one launch each (clocks left alone): where does cuBLAS's lead
# come from? Speed of light (SM, tensor pipe, L2, DRAM), launch shape
# (grid, cluster, registers, shared memory) and warp stalls.
#
#   OUT=$OUT bash bench/experiments/tma/profile.sh [M N K]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/tma-profile}
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v "$here/gemm_tma.cu" -o "$OUT/gemm_tma" \
    -lcuda -lcublas 2>"$OUT/nvcc.log" || { cat "$OUT/nvcc.log"; exit 1; }
"$OUT/gemm_tma" "${@:-4096 4096 4096}" | tee "$OUT/times.log"
# Per kernel: its 25th launch (past warm-up).
: >"$OUT/ncu.log"
for k in 'regex:^(?!gemm_)' 'regex:^gemm_tma$' 'regex:^gemm_ws$' 'regex:^gemm_ws_mc$'; do
    timeout 150 ncu --clock-control none -k "$k" --launch-skip 24 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        "$OUT/gemm_tma" "${@:-4096 4096 4096}" >>"$OUT/ncu.log" 2>&1
    echo "ncu $k rc $?"
done
grep -E '^  [a-zA-Z_].*\(|Duration|Throughput|Registers Per|Dynamic Shared|Grid Size|Cluster Size|Block Size|Hit Rate|Pipe|Issue Slots|Waves|Warp Cycles' "$OUT/ncu.log" | head -150
# polyfuse's own kernel for the same product, if a binary is given.
if [ -n "${POLYFUSE:-}" ]; then
    timeout 200 ncu --clock-control none --launch-skip 10 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        "$POLYFUSE" run "$(dirname "$here")/../programs/gemm_f16_4096.json" --target cuda --bench --runs 20 >"$OUT/ncu-polyfuse.log" 2>&1
    echo "ncu polyfuse rc $?"
    grep -E '^  [a-zA-Z_].*\(|Duration|Throughput|Registers Per|Dynamic Shared|Grid Size|Cluster Size|Block Size|Hit Rate|Pipe|Issue Slots|Waves|Warp Cycles' "$OUT/ncu-polyfuse.log" | head -60
fi
