#!/usr/bin/env bash
# Recurrences on the GPU (issue 36 items 3 and 4), one device call: each
# program checked at small sizes off every tile grid (CUDA against the f64
# reference), then timed at its file's sizes under polyfuse's default (host
# loops: a wavefront over (layer, time) or (row, column), a dilated layer's
# chains in one launch) and with --recurrence steps (one step per launch, no
# skew); with SERIAL=1 also --recurrence serial (the mapping before host
# loops, on a handful of threads: minutes at these sizes, cut at 120 s),
# then the PyTorch peers
# (bench/recurrences/peers.py) in the same call: torch.nn.LSTM (cuDNN) for
# the stacked LSTM, the same loops in eager PyTorch and under torch.compile
# for all three.
#
#   cargo build --release && bash bench/recurrences/run.sh
#   POLYFUSE=target/release/polyfuse OUT=/tmp/recurrences NAMES="stacked_lstm" ...
#   PEERS="torch.nn.LSTM (cuDNN)" times only the peers named (comma-separated)
#
# Writes $OUT/runs.jsonl (one line per polyfuse run: the check line, or the
# `run --bench --json` object), $OUT/peers.jsonl and $OUT/errors.log
# (polyfuse's stderr). Issue 36's targets (H100): stacked LSTM at most 0.7x
# torch.nn.LSTM; stacked dilated RNN and grid RNN at most 0.5x the loop under
# torch.compile.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/recurrences}
RUNS=${RUNS:-10}
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
: >"$OUT/errors.log"
# Sizes for the check: off every tile grid, small enough for the f64
# reference on the CPU.
small() {
    case $1 in
        stacked_lstm) echo "--param L=3 --param T=37 --param B=13 --param H=67" ;;
        stacked_dilated_rnn) echo "--param T=41 --param B=7 --param N=67" ;;
        grid_rnn) echo "--param R=9 --param S=11 --param B=5 --param N=67" ;;
    esac
}
names=${NAMES:-stacked_lstm stacked_dilated_rnn grid_rnn}
for name in $names; do
    f=bench/recurrences/$name.json
    for rec in wavefront steps; do
        # shellcheck disable=SC2046
        line=$(timeout 300 "$POLYFUSE" run "$f" --target cuda --check --recurrence "$rec" $(small "$name") 2>>"$OUT/errors.log" | grep '^check:')
        echo "{\"program\": \"$name\", \"what\": \"check\", \"recurrence\": \"$rec\", \"line\": \"$line\"}" >>"$OUT/runs.jsonl"
    done
    recs="wavefront steps"
    [[ ${SERIAL:-0} == 1 ]] && recs="$recs serial"
    for rec in $recs; do
        limit=300
        [[ $rec == serial ]] && limit=120
        json=$(timeout "$limit" "$POLYFUSE" run "$f" --target cuda --bench --json --runs "$RUNS" --recurrence "$rec" 2>>"$OUT/errors.log")
        echo "{\"program\": \"$name\", \"what\": \"bench\", \"recurrence\": \"$rec\", \"result\": ${json:-null}}" >>"$OUT/runs.jsonl"
    done
    echo "recurrences: $name done" >&2
done
# shellcheck disable=SC2086
python3 bench/recurrences/peers.py ${NAMES:-} ${PEERS:+--peers "$PEERS"} --out "$OUT/peers.jsonl"
# A summary: polyfuse's default time over each peer's.
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def lines(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except FileNotFoundError:
        return []
runs = lines(f"{out}/runs.jsonl")
peers = lines(f"{out}/peers.jsonl")
for r in runs:
    if r["what"] == "check":
        print(f'{r["program"]:22} check ({r["recurrence"]}): {r["line"]}')
for r in runs:
    if r["what"] != "bench":
        continue
    res = r["result"] or {}
    us = res.get("median_us")
    print(f'{r["program"]:22} polyfuse --recurrence {r["recurrence"]:9}: {us if us is not None else "failed"} us'
          + (f' ({res.get("launches")} launches)' if us is not None else ''))
    if r["recurrence"] != "wavefront" or us is None:
        continue
    for p in peers:
        if p["program"] == r["program"] and "median_us" in p:
            print(f'{"":22}   vs {p["peer"]:16} {p["median_us"]:10.1f} us: {us / p["median_us"]:.2f}x')
PY
