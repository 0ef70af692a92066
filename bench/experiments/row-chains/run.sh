#!/usr/bin/env bash
# A chain of maps and row sums (chain10.json, 16384 x 1024, f32) on the GPU
# machine, one call: checked off the grid, then timed under the default
# (one kernel, rows across lanes), --no-fusion-by-cost and --strategy min
# (a kernel per statement: what the default chose before), then its
# PyTorch peers (peers.py) in the same call.
#   bash bench/experiments/row-chains/run.sh   # POLYFUSE=..., OUT=/tmp/row-chains
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/row-chains}
mkdir -p "$OUT"
f=bench/experiments/row-chains/chain10.json
"$POLYFUSE" run $f --target cuda --check --param R=1001 --param C=777 2>&1 | grep '^check:'
for v in "" "--no-fusion-by-cost" "--strategy min"; do
    # shellcheck disable=SC2086
    json=$("$POLYFUSE" run $f --target cuda --bench --json --runs 20 $v 2>>"$OUT/errors.log")
    echo "{\"variant\": \"${v:-default}\", \"result\": ${json:-null}}" | tee -a "$OUT/chain.jsonl"
done
python3 bench/experiments/row-chains/peers.py | tee -a "$OUT/chain.jsonl"
