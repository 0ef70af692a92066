#!/usr/bin/env bash
# The stacked LSTM at FractalTensor's shape (batch 256, depth 32, T 64,
# H 256; issue 36's second LSTM target: at most 0.5x cuDNN) and at the
# file's shape, under the default and with --fuse-step-sums, then cuDNN
# at both shapes in the same call.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/elementwise-tiles/ft-shape.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/ft}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
mkdir -p "$OUT"
f=bench/recurrences/stacked_lstm.json
ft="--param L=32 --param T=64 --param B=256 --param H=256"
for r in 1 2; do
    for args in "" "--fuse-step-sums" "$ft" "$ft --fuse-step-sums"; do
        # shellcheck disable=SC2086
        json=$(timeout 300 "$POLYFUSE" run "$f" --target cuda --bench --json --runs 10 $args 2>>"$OUT/errors.log")
        echo "{\"round\": $r, \"args\": \"$args\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
        echo "$r [$args]: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["median_us"], d["launches"])' 2>/dev/null)"
    done
done
# shellcheck disable=SC2086
echo "check fused: $(timeout 300 "$POLYFUSE" run "$f" --target cuda --check --fuse-step-sums --param L=3 --param T=37 --param B=13 --param H=67 2>&1 | grep -E '^check|error' | head -3)" | tee -a "$OUT/checks.txt"
python3 bench/recurrences/peers.py stacked_lstm --peers "torch.nn.LSTM (cuDNN)" --out "$OUT/peers.jsonl"
# shellcheck disable=SC2086
python3 bench/recurrences/peers.py stacked_lstm --peers "torch.nn.LSTM (cuDNN)" ${ft//--param/--param} --out "$OUT/peers-ft.jsonl"
cat "$OUT/peers.jsonl" "$OUT/peers-ft.jsonl"
