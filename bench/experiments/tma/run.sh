#!/usr/bin/env bash
# Builds gemm_tma.cu on the device machine and runs it at a few sizes,
# with polyfuse's default kernel for the same program timed in the same call.
#
#   POLYFUSE=target/release/polyfuse OUT=$OUT bash bench/experiments/tma/run.sh
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
OUT=${OUT:-/tmp/tma}
POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
SIZES=${SIZES:-"4096,4096,4096 2000,2000,2000 1000,1000,1000 8192,8192,8192"}
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v "$here/gemm_tma.cu" -o "$OUT/gemm_tma" \
    -lcuda -lcublas 2>"$OUT/nvcc.log" || { cat "$OUT/nvcc.log"; exit 1; }
grep -E "registers|spill" "$OUT/nvcc.log"
for s in $SIZES; do
    IFS=, read -r m n k <<<"$s"
    timeout 120 "$OUT/gemm_tma" "$m" "$n" "$k" 2>&1 | tee -a "$OUT/gemm_tma.log"
    json=$(timeout 200 "$POLYFUSE" run "$root/bench/programs/gemm_f16_4096.json" --target cuda --bench --json --runs 50 \
        --param M=$m --param N=$n --param K=$k 2>>"$OUT/errors.log")
    echo "$json" >>"$OUT/polyfuse.jsonl"
    echo "polyfuse M $m N $n K $k: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["median_us"],1), "us", round(d["tflop_per_s"],1), "TFLOP/s", d.get("check"))' 2>/dev/null)"
done
