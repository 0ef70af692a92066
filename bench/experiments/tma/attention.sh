#!/usr/bin/env bash
# Attention prefill with its key and value tiles copied by the copy engine
# (TMA, the default) against the threads' cp.async (--no-tma), one binary,
# interleaved: checks at sizes the CPU's f64 reference computes quickly,
# then the bench programs timed (median of 30 runs), ROUNDS rounds, and
# cuDNN / FlexAttention / FlashAttention-2 peers in the same call.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/tma/attention.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/tma-attention}
mkdir -p "$OUT"
PROGRAMS="attention_global_b4h16s4096d64 attention_global_f16w_b4h16s4096d64 attention_causal_b4h16s4096d64 attention_causal_f16w_b4h16s4096d64 attention_bigbird_f16_s4096"
CHECKS=""
for p in $PROGRAMS; do CHECKS+="bench/programs/$p.json|B=1 H=2 S=1000
"; done
LINES=""
for p in $PROGRAMS; do LINES+="bench/programs/$p.json|
"; done
CHECKS="$CHECKS" LINES="$LINES" ROUNDS=${ROUNDS:-2} OUT="$OUT" bash bench/experiments/tma/ab.sh
python3 scripts/peers.py $PROGRAMS --compile none --out "$OUT/peers.jsonl" >/dev/null 2>>"$OUT/errors.log"
python3 - "$OUT/peers.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print("peer", d["program"], d["peer"], round(d["median_us"] or 0, 1))
PY
