#!/usr/bin/env bash
# The suite's f16 product programs and the f16 bench programs whose CUDA
# the column read changes, binaries $A and $B interleaved (one round, as
# the change only adds the read's test where a tile is whole), checks with
# $B at the suite's check sizes.
#
#   A=... B=... OUT=$OUT bash bench/experiments/off-grid/suite-f16.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/suite-f16}
mkdir -p "$OUT"
progs="bench/suite/mlp_gelu_f16.json bench/suite/product_bias_tanh_f16.json bench/suite/layernorm_product_f16.json bench/suite/rmsnorm_product_f16.json bench/programs/gemm_bias_gelu_f16_4096.json bench/programs/lstm_cell_f16_b256i1024h1024.json"
for side in A B; do
    bin=${!side}
    for f in $progs; do
        json=$(timeout 200 "$bin" run "$f" --target cuda --bench --json --runs 10 2>>"$OUT/errors.log")
        echo "{\"side\": \"$side\", \"program\": \"$f\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
        echo "$side $f: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["median_us"],1))' 2>/dev/null)"
    done
done
grep -E "^(mlp_gelu_f16|product_bias_tanh_f16|layernorm_product_f16|rmsnorm_product_f16) " bench/suite/check-sizes.txt |
    while read -r name args; do
        # shellcheck disable=SC2086
        echo "check $name $args: $(timeout 200 "$B" run bench/suite/$name.json --target cuda --check $args </dev/null 2>&1 | grep -E '^check|error' | head -2)" | tee -a "$OUT/checks.txt"
    done
