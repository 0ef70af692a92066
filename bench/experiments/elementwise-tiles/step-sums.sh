#!/usr/bin/env bash
# --fuse-step-sums against the default on the three recurrences at their
# file's sizes, interleaved over two rounds, then the fused mode checked
# at sizes off every tile grid in both host-loop modes.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/elementwise-tiles/step-sums.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/step-sums}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
mkdir -p "$OUT"
for r in 1 2; do
    for name in stacked_dilated_rnn grid_rnn; do
        for args in "" "--fuse-step-sums"; do
            # shellcheck disable=SC2086
            json=$(timeout 300 "$POLYFUSE" run bench/recurrences/$name.json --target cuda --bench --json --runs 10 $args 2>>"$OUT/errors.log")
            echo "{\"round\": $r, \"program\": \"$name\", \"args\": \"$args\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
            echo "$r $name [$args]: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["median_us"], d["launches"])' 2>/dev/null)"
        done
    done
done
while read -r f args; do
    for rec in wavefront steps; do
        # shellcheck disable=SC2086
        echo "check $f $args --recurrence $rec: $(timeout 300 "$POLYFUSE" run "$f" --target cuda --check --fuse-step-sums --recurrence $rec $args 2>&1 | grep -E '^check|error' | head -3)" | tee -a "$OUT/checks.txt"
    done
done <<'LIST'
bench/recurrences/stacked_lstm.json --param L=3 --param T=37 --param B=13 --param H=67
bench/recurrences/stacked_lstm.json --param L=2 --param T=9 --param B=61 --param H=255
bench/recurrences/stacked_dilated_rnn.json --param T=41 --param B=7 --param N=67
bench/recurrences/grid_rnn.json --param R=9 --param S=11 --param B=5 --param N=67
LIST
for e in lstm stacked_lstm stacked_rnn dilated_rnn grid_rnn rnn; do
    echo "check examples/$e: $(timeout 300 "$POLYFUSE" run examples/$e.json --target cuda --check --fuse-step-sums 2>&1 | grep -E '^check|error' | head -3)" | tee -a "$OUT/checks.txt"
done
