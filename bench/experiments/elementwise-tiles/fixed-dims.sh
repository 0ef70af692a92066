#!/usr/bin/env bash
# Promoted boxes one element wide along a dimension a folded block member
# fixes (gpu::promote::fixed_dimensions), one device call: binaries $A
# (before) and $B (after) interleaved over $ROUNDS rounds on the programs
# whose CUDA it changes, then checks with $B at sizes off every tile grid
# and at sizes that keep the file's mapping, then the suite peers.
#
#   A=target/exp/polyfuse-ew B=target/exp/polyfuse-fixed OUT=$OUT bash bench/experiments/elementwise-tiles/fixed-dims.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/fixed}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
progs="bench/recurrences/stacked_lstm.json bench/suite/grouped_conv.json bench/suite/depthwise_conv.json bench/programs/conv2d_large.json"
for r in $(seq 1 "$ROUNDS"); do
    for side in A B; do
        bin=${!side}
        for f in $progs; do
            json=$(timeout 300 "$bin" run "$f" --target cuda --bench --json --runs 10 2>>"$OUT/errors.log")
            echo "{\"round\": $r, \"side\": \"$side\", \"program\": \"$f\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
            echo "$r $side $f: $(echo "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_us"])' 2>/dev/null)"
        done
    done
done
while read -r f args; do
    # shellcheck disable=SC2086
    echo "check $f $args: $(timeout 300 "$B" run "$f" --target cuda --check $args 2>&1 | grep -E '^check|error' | head -3)" | tee -a "$OUT/checks.txt"
done <<'LIST'
bench/recurrences/stacked_lstm.json --param L=3 --param T=37 --param B=13 --param H=67
bench/recurrences/stacked_lstm.json --param L=2 --param T=9 --param B=61 --param H=255
bench/suite/grouped_conv.json --param B=2 --param G=3 --param C=5 --param H=11 --param W=13 --param F=4
bench/suite/grouped_conv.json --param B=1 --param H=13 --param W=11
bench/suite/depthwise_conv.json --param B=2 --param C=5 --param H=19 --param W=23
bench/suite/depthwise_conv.json --param B=1 --param H=13 --param W=29
bench/programs/conv2d_large.json --param N=1 --param H=13 --param W=21
bench/programs/conv2d_large.json --param N=1 --param C=7 --param F=9 --param H=13 --param W=21
LIST
python3 bench/suite/peers.py grouped_conv depthwise_conv --out "$OUT/peers.jsonl"
