#!/bin/bash
# One device call of this experiment: variants.sh (base build against the new one and hand edits),
# then the new build's GPU check of the attention examples and benchmark programs, and the gemm
# shapes of the deeper pipeline (128 x 4096 x 4096, 256 x 1024 x 4096, 512 x 512 x 8192) checked
# and timed.  usage: call.sh OUT BASE NEW
set -u
OUT=$1; BASE=$2; NEW=$3; ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
# the weights rounded once (FlashAttention's numerics; fails polyfuse's check): what the split costs
export VARIANTS="single lb5"
export VARIANT_lb5='s/__launch_bounds__\(128, 4\)/__launch_bounds__(128, 5)/' 
export VARIANT_single='s/pf_fa_wgmma_rs_n64\(pf_o0, &pf_pl0\[pf_kc \* 4\], pf_db\);//g'
timeout 240 bash "$ROOT/bench/experiments/attention-prefill/variants.sh" "$OUT/ab" "$BASE" "$NEW" > "$OUT/ab.log" 2>&1
cat "$OUT/ab.log"
cd "$ROOT"
[ -n "${NO_GEMM:-}" ] || for s in "M=128 N=4096 K=4096" "M=256 N=1024 K=4096" "M=512 N=512 K=8192" "M=128 N=1024 K=1024"; do
  args=(); for x in $s; do args+=(--param "$x"); done
  echo "== gemm f16 $s"
  for b in "$BASE" "$NEW"; do
    timeout 60 "$b" run bench/programs/gemm_f16_128x1024x1024.json "${args[@]}" --target cuda --check --bench --runs 50 2>&1 | grep -E "check|time" | sed "s|^|$(basename $b): |"
  done
done 2>&1 | tee "$OUT/gemm.log"
GPU_CHECK_ONLY="${GC_ONLY:-attention_.*}" GPU_CHECK_PARTS="${GC_PARTS:-examples}" GPU_CHECK_BUDGET_S=${GC_BUDGET:-220} POLYFUSE=$NEW OUT=$OUT/gc \
  timeout 300 bash scripts/gpu-check.sh > "$OUT/gc.log" 2>&1
tail -40 "$OUT/gc.log"
