#!/usr/bin/env bash
# Products off the tile grid (issue 32: "f16 gemm 1000^3 takes 2.7x
# 1024^3's time"): polyfuse's default at sizes on and off the grid, each
# program's kernel times, then torch.matmul (cuBLAS) at the same sizes,
# one device call.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/off-grid/run.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/off-grid}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
mkdir -p "$OUT"
sizes="1024,1024,1024 1000,1000,1000 1024,1024,1000 1000,1024,1024 4096,4096,4096 4000,4000,4000 2000,2000,2000 2048,2048,2048"
for prog in bench/programs/gemm_f16_4096.json bench/programs/gemm_4096.json; do
    for s in $sizes; do
        IFS=, read -r m n k <<<"$s"
        json=$(timeout 200 "$POLYFUSE" run "$prog" --target cuda --bench --json --runs 20 --param M=$m --param N=$n --param K=$k 2>>"$OUT/errors.log")
        echo "{\"program\": \"$prog\", \"size\": \"$s\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
        echo "$prog $s: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["median_us"],1), round(d["tflop_per_s"],1))' 2>/dev/null)"
    done
done
for s in $sizes; do
    IFS=, read -r m n k <<<"$s"
    python3 scripts/peers.py "gemm_f16_4096@M=$m,N=$n,K=$k" "gemm_4096@M=$m,N=$n,K=$k" --compile none --out "$OUT/peers-$m-$n-$k.jsonl" >/dev/null 2>>"$OUT/errors.log"
    python3 - "$OUT/peers-$m-$n-$k.jsonl" "$s" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print("peer", d["program"], sys.argv[2], d["peer"], round(d["median_us"], 1))
PY
done
