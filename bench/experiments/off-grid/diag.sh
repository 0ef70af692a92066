#!/usr/bin/env bash
# Where f16 gemm off the tile grid loses its time: the sizes with one,
# two or three of M, N, K off the grid (times), then Nsight Compute's
# warp states and memory sections for 1024^3 and 1000^3 (one launch each,
# clocks left alone).
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/off-grid/diag.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/off-grid-diag}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
mkdir -p "$OUT"
prog=bench/programs/gemm_f16_4096.json
for s in 1024,1024,1024 1024,1000,1024 1000,1000,1024 1024,1000,1000 1000,1024,1000 1000,1000,1000 1024,1024,1008 1024,1024,1040; do
    IFS=, read -r m n k <<<"$s"
    json=$(timeout 200 "$POLYFUSE" run "$prog" --target cuda --bench --json --runs 20 --param M=$m --param N=$n --param K=$k 2>>"$OUT/errors.log")
    echo "$s: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["median_us"],1))' 2>/dev/null)" | tee -a "$OUT/times.txt"
done
for s in 1024 1000; do
    timeout 200 ncu --clock-control none --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
        "$POLYFUSE" run "$prog" --target cuda --bench --runs 1 --param M=$s --param N=$s --param K=$s >"$OUT/ncu-$s.txt" 2>&1
    grep -E "Duration|Stall|Warp Cycles|Issued|Eligible|Active Warps|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Registers|Block Limit" "$OUT/ncu-$s.txt" | head -40
done
