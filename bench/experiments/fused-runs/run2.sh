#!/usr/bin/env bash
# The fused runs' grouping also changes three suite programs (correlation,
# syrk, syr2k; found by comparing both binaries' --emit gpu-tree over
# bench/suite/): the binary before ($A) and after ($B) interleaved, two
# rounds, covariance (unchanged) as the control, and the changed programs
# checked with $B at sizes off the tiles.
#
#   A=target/exp/polyfuse-old B=target/exp/polyfuse-new OUT=$OUT bash bench/experiments/fused-runs/run2.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
here=bench/experiments/fused-runs
OUT=${OUT:-/tmp/fused-runs-2}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/device.txt"
A=$A B=$B LINES=$here/lines2.txt CHECKS=$here/checks2.txt OUT=$OUT ROUNDS=2 bash bench/suite/ab.sh 2>&1 | tee "$OUT/ab.txt"
for s in A B; do
    bin=${!s}
    for n in correlation syrk syr2k; do
        "$bin" run bench/suite/$n.json --target cuda --bench --json --runs 10 2>/dev/null |
            python3 -c "import json,sys; d=json.load(sys.stdin); print('$s $n kernels:', [(k.get('name'), round(k.get('median_us', 0), 1)) for k in d.get('kernels', [])])" 2>&1 | tee -a "$OUT/kernels.txt"
    done
done
