#!/usr/bin/env bash
# The short-reduction rule (gpu::contraction::two_blocks_per_sm: 128 x 128
# tiles, 3 stages, two blocks a multiprocessor where k <= 1024 and the
# output has 528 tiles or more) against the tile it replaces (--tile
# 128,256,64: one block, 4 stages), one binary, interleaved, ROUNDS
# rounds; checks first at sizes off the tiles that take the rule.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/two_blocks/ab.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/two-blocks-ab}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
summary() { python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("check") or {}; print(round(d["median_us"] or 0,1), "us", [round(k.get("median_us") or 0,1) for k in d.get("kernels") or []], "check", c.get("ok") if isinstance(c, dict) else c, c.get("max_rel_error") if isinstance(c, dict) else "")' 2>/dev/null || echo failed; }
run() { # label file flags...
    local label=$1 file=$2; shift 2
    json=$(timeout 300 "$POLYFUSE" run "$file" --target cuda --json "$@" 2>>"$OUT/errors.log")
    echo "{\"label\": \"$label\", \"program\": \"$file\", \"flags\": \"$*\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
    echo "$label $(basename "$file") $*: $(echo "$json" | summary)"
}
run check bench/programs/gemm_bias_gelu_f16_4096.json --check --param M=2051 --param N=4099 --param K=1000
run check bench/programs/gemm_f16_4096.json --check --param M=2051 --param N=4104 --param K=1000
run check bench/programs/gemm_f16_4096.json --check --param M=2051 --param N=4104 --param K=1000 --no-tma
LINES="bench/suite/mlp_gelu_f16.json|
bench/programs/gemm_f16_4096.json|--param K=1024
bench/programs/gemm_f16_4096.json|--param K=512
bench/programs/gemm_f16_4096.json|--param M=8192 --param N=8192 --param K=1024
bench/programs/gemm_bias_gelu_f16_4096.json|--param K=1024
bench/suite/product_bias_tanh_f16.json|--param K=1024
bench/programs/gemm_f16_4096.json|"
for r in $(seq "$ROUNDS"); do
    while IFS='|' read -r file flags; do
        run rule "$file" --bench --runs 30 $flags
        run one_block "$file" --bench --runs 30 --tile 128,256,64 $flags
    done <<<"$LINES"
done
