#!/usr/bin/env bash
# Small elementwise launches on smaller tiles (gpu::mapping::elementwise_tile_sizes),
# one device call: binaries $A (before) and $B (after) interleaved over
# $ROUNDS rounds on the recurrences at their file's sizes and on the
# LSTM-cell bench program; then checks with $B (recurrences at sizes off
# every tile, both host-loop modes; the LSTM cell at its sizes; examples
# with --check --bench, which go through the whole runtime: buffers, check,
# timed runs, per-kernel times); then cuDNN's LSTM in the same call.
#
#   A=target/exp/polyfuse-split B=target/exp/polyfuse-ew OUT=$OUT bash bench/experiments/elementwise-tiles/run.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/ew}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
progs="bench/recurrences/stacked_lstm.json bench/recurrences/stacked_dilated_rnn.json bench/recurrences/grid_rnn.json bench/programs/lstm_cell_f16_b256i1024h1024.json"
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
small() {
    case $1 in
        *stacked_lstm.json) echo "--param L=3 --param T=37 --param B=13 --param H=67" ;;
        *stacked_dilated_rnn.json) echo "--param T=41 --param B=7 --param N=67" ;;
        *grid_rnn.json) echo "--param R=9 --param S=11 --param B=5 --param N=67" ;;
    esac
}
for f in bench/recurrences/stacked_lstm.json bench/recurrences/stacked_dilated_rnn.json bench/recurrences/grid_rnn.json; do
    for rec in wavefront steps; do
        # shellcheck disable=SC2046
        echo "check $f $rec: $(timeout 300 "$B" run "$f" --target cuda --check --recurrence $rec $(small "$f") 2>&1 | grep -E '^check|error' | head -3)" | tee -a "$OUT/checks.txt"
    done
done
echo "check lstm_cell: $(timeout 300 "$B" run bench/programs/lstm_cell_f16_b256i1024h1024.json --target cuda --check 2>&1 | grep -E '^check|error' | head -3)" | tee -a "$OUT/checks.txt"
for e in lstm lstm_cell stacked_lstm stacked_rnn dilated_rnn grid_rnn maxpool2x2 softmax layernorm_matmul rmsnorm_ffn_swiglu gemm; do
    echo "check+bench examples/$e: $(timeout 300 "$B" run examples/$e.json --target cuda --check --bench --runs 5 2>&1 | tail -12 | tr '\n' ' ')" | tee -a "$OUT/checks.txt"
done
python3 bench/recurrences/peers.py stacked_lstm --peers "torch.nn.LSTM (cuDNN)" --out "$OUT/peers.jsonl"
