#!/usr/bin/env bash
# Tensor-core tiles stored through shared memory (the default, see
# gpu::stores) against each thread's own stores (--no-staged-stores), one
# binary, interleaved, on the programs whose products run on tensor cores:
# each checked at sizes whose f64 reference the CPU computes quickly
# (CHECKS), then timed at the bench sizes (median of --runs), ROUNDS
# rounds; then the staged kernels under compute-sanitizer (SANITIZE=1).
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/stores/ab.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/stores-ab}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
# program|params (empty: the file's)
LINES=${LINES:-"bench/programs/gemm_f16_4096.json|
bench/programs/gemm_f16_4096.json|M=2000 N=2000 K=2000
bench/programs/gemm_f16_4096.json|M=1000 N=1000 K=1000
bench/programs/gemm_f16_4096.json|M=8192 N=8192 K=8192
bench/programs/gemm_bf16_4096.json|
bench/programs/gemm_nt_f16_4096.json|
bench/programs/gemm_f16_128x1024x1024.json|
bench/programs/gemm_bias_gelu_f16_4096.json|
bench/programs/layernorm_matmul_f16_4096.json|
bench/programs/rmsnorm_ffn_swiglu_f16_t4096d4096f11008.json|
bench/suite/mlp_gelu_f16.json|
bench/suite/layernorm_product_f16.json|
bench/suite/product_bias_tanh_f16.json|"}
run() { # label file params...
    local label=$1 file=$2; shift 2
    local args=()
    for p in "$@"; do args+=(--param "$p"); done
    json=$(timeout 300 "$POLYFUSE" run "$file" --target cuda $MODE --json --runs 30 "${args[@]}" $EXTRA 2>>"$OUT/errors.log")
    echo "{\"label\": \"$label\", \"program\": \"$file\", \"params\": \"$*\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
    echo "$label $(basename "$file") $*: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("check") or {}; print(round(d["median_us"] or 0,1), "us", "check", c.get("ok") if isinstance(c, dict) else c, c.get("max_rel_error") if isinstance(c, dict) else "")' 2>/dev/null || echo failed)"
}
CHECKS=${CHECKS:-"bench/programs/gemm_f16_4096.json|M=1000 N=1000 K=1000
bench/programs/gemm_f16_4096.json|M=1024 N=1024 K=1024
bench/programs/gemm_f16_4096.json|M=136 N=72 K=1544
bench/programs/gemm_bf16_4096.json|M=1000 N=1000 K=1000
bench/programs/gemm_nt_f16_4096.json|M=1000 N=1000 K=1000
bench/programs/gemm_bias_gelu_f16_4096.json|M=1000 N=1000 K=1000
bench/programs/gemm_f16_128x1024x1024.json|
bench/suite/mlp_gelu_f16.json|B=1000 D=520 F=1000
bench/programs/layernorm_matmul_f16_4096.json|T=1000 D=1000 N=1000
bench/suite/product_bias_tanh_f16.json|M=1000 N=1000 K=1000
bench/programs/gemm_bias_gelu_f16_4096.json|M=1000 N=1000 K=999
examples/tbmm_bf16.json|
examples/lstm_cell.json|"}
while IFS='|' read -r file params; do
    [ -z "$file" ] && continue
    MODE=--check EXTRA="" run check "$file" $params
done <<<"$CHECKS"
MODE=--bench
for r in $(seq "$ROUNDS"); do
    while IFS='|' read -r file params; do
        [ -z "$file" ] && continue
        EXTRA="" run staged "$file" $params
        EXTRA="--no-staged-stores" run pairs "$file" $params
    done <<<"$LINES"
done

if [ "${SANITIZE:-1}" = 1 ]; then
    while IFS='|' read -r file flags; do
        for tool in memcheck racecheck synccheck; do
            log="$OUT/$(basename "$file" .json)-$tool-$(echo "$flags" | tr -c 'a-zA-Z0-9' _).log"
            timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$POLYFUSE" run "$file" --target cuda --check $flags >"$log" 2>&1
            echo "$tool $(basename "$file") $flags: rc $? $(grep -E 'ERROR SUMMARY|check:' "$log" | tr '\n' ' ')"
        done
    done <<'LIST'
bench/programs/gemm_f16_4096.json|--param M=1000 --param N=1000 --param K=1000
bench/programs/gemm_bias_gelu_f16_4096.json|--param M=520 --param N=999 --param K=1000
examples/gemm_f16.json|--k-split 1 --tile 64,32,64 --param M=136 --param N=72 --param K=1544
LIST
fi
