#!/usr/bin/env bash
# run2.sh's programs again with their PyTorch peers in the same call (the
# first call timed no peers): both binaries interleaved, one round, then
# bench/suite/peers.py (eager and torch.compile, no TF32).
#
#   A=target/exp/polyfuse-old B=target/release/polyfuse OUT=$OUT bash bench/experiments/fused-runs/run3.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
here=bench/experiments/fused-runs
OUT=${OUT:-/tmp/fused-runs-3}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/device.txt"
A=$A B=$B LINES=$here/lines2.txt OUT=$OUT ROUNDS=1 bash bench/suite/ab.sh 2>&1 | tee "$OUT/ab.txt"
python3 bench/suite/peers.py correlation syrk syr2k covariance --out "$OUT/peers.jsonl" >/dev/null 2>"$OUT/peers.err"
python3 -c "
import json
for l in open('$OUT/peers.jsonl'):
    d = json.loads(l); print('peer', d['program'], d['peer'], round(d['median_us'], 1))
"
