#!/usr/bin/env bash
# The copy engine's kernels under compute-sanitizer (memcheck, racecheck,
# synccheck): products with refills at sizes off the tiles.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/tma/sanitize.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/tma-sanitize}
POLYFUSE=${POLYFUSE:-target/release/polyfuse}
mkdir -p "$OUT"
status=0
while IFS='|' read -r file flags; do
    for tool in memcheck racecheck synccheck; do
        log="$OUT/$(basename "$file" .json)-$tool-$(echo "$flags" | tr -c 'a-zA-Z0-9' _).log"
        timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$POLYFUSE" run "$file" --target cuda --check $flags >"$log" 2>&1
        rc=$?
        [ $rc -ne 0 ] && status=1
        echo "$tool $(basename "$file") $flags: rc $rc $(grep -E 'ERROR SUMMARY|check:' "$log" | tr '\n' ' ')"
    done
done <<'LIST'
examples/gemm_f16.json|--k-split 1 --tile 128,64,64 --param M=136 --param N=72 --param K=1544
examples/gemm_f16.json|--k-split 1 --tile 64,32,64 --param M=136 --param N=72 --param K=1544
bench/programs/gemm_f16_4096.json|--param M=1000 --param N=1000 --param K=1000
bench/programs/gemm_bias_gelu_f16_4096.json|--param M=520 --param N=1000 --param K=1000
LIST
exit $status
