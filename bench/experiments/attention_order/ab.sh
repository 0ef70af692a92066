#!/usr/bin/env bash
# Causal attention's row tiles last first (gpu::block_order::
# attention_rows_reversed) against index order: two polyfuse binaries,
# NEW (this tree) and OLD (built before the change), interleaved, ROUNDS
# rounds of medians of --runs; each program checked first at S = 1000 with
# NEW; then PyTorch's SDPA backends (cuDNN among them) on the same
# programs in the same call.
#
#   NEW=target/release/polyfuse OLD=target/release/polyfuse-rows-in-order OUT=$OUT \
#       bash bench/experiments/attention_order/ab.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/attention-order}
NEW=${NEW:-target/release/polyfuse}
OLD=${OLD:-target/release/polyfuse-rows-in-order}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
PROGRAMS=${PROGRAMS:-"bench/programs/attention_causal_f16w_b4h16s4096d64.json
bench/programs/attention_causal_b4h16s4096d64.json
bench/programs/attention_global_f16w_b4h16s4096d64.json"}
summary() { python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("check") or {}; print(round(d["median_us"] or 0,1), "us", "check", c.get("ok") if isinstance(c, dict) else c)' 2>/dev/null || echo failed; }
for f in $PROGRAMS; do
    echo "check $(basename "$f") S=1000: $(timeout 300 "$NEW" run "$f" --target cuda --check --json --param B=1 --param H=2 --param S=1000 2>>"$OUT/errors.log" | summary)"
done
for r in $(seq "$ROUNDS"); do
    for f in $PROGRAMS; do
        for label in new old; do
            bin=$NEW
            [ "$label" = old ] && bin=$OLD
            json=$(timeout 300 "$bin" run "$f" --target cuda --bench --json --runs 20 2>>"$OUT/errors.log")
            echo "{\"label\": \"$label\", \"program\": \"$f\", \"round\": $r, \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
            echo "$label $(basename "$f") round $r: $(echo "$json" | summary)"
        done
    done
done
timeout 400 python3 scripts/peers.py --out "$OUT/peers.jsonl" --compile none $PROGRAMS 2>&1 | tail -30
