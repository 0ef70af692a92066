#!/bin/bash
# One device call of this experiment: variants.sh over the builds given (the first the reference,
# the last the candidate) and the hand edits in VARIANTS, then the candidate's GPU check (GC_ONLY,
# GC_PARTS, GC_BUDGET) and, unless NO_GEMM, the gemm shapes of the deeper pipeline checked and
# timed with the first and the last build.  usage: call.sh OUT NAME=POLYFUSE...
set -u
OUT=$1; shift; ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
FIRST=${1#*=}; for nb in "$@"; do LAST=${nb#*=}; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
timeout 300 bash "$ROOT/bench/experiments/attention-prefill/variants.sh" "$OUT/ab" "$@" > "$OUT/ab.log" 2>&1
cat "$OUT/ab.log"
cd "$ROOT"
[ -n "${NO_GEMM:-}" ] || for s in "M=128 N=4096 K=4096" "M=256 N=1024 K=4096" "M=512 N=512 K=8192" "M=128 N=1024 K=1024"; do
  args=(); for x in $s; do args+=(--param "$x"); done
  echo "== gemm f16 $s"
  for b in "$FIRST" "$LAST"; do
    timeout 60 "$b" run bench/programs/gemm_f16_128x1024x1024.json "${args[@]}" --target cuda --check --bench --runs 50 2>&1 | grep -E "check|time" | sed "s|^|$(basename $b): |"
  done
done 2>&1 | tee "$OUT/gemm.log"
# the candidate's prefill kernels (the wgmma path) under compute-sanitizer at a small odd size
[ -n "${SAN:-}" ] && for p in global causal; do for tool in memcheck racecheck; do
  echo "== $tool attention_$p B=1 H=2 S=1031 (D=64, and D=128 S=333)"
  timeout 120 compute-sanitizer --tool $tool "$LAST" run bench/programs/attention_${p}_b4h16s4096d64.json --param B=1 --param H=2 --param S=1031 --target cuda --check 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check:" | head -3
  timeout 120 compute-sanitizer --tool $tool "$LAST" run bench/programs/attention_${p}_b4h16s4096d64.json --param B=1 --param H=2 --param S=333 --param D=128 --target cuda --check 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check:" | head -3
done; done 2>&1 | tee "$OUT/san.log"
[ -n "${GC_PARTS:-}" ] || exit 0
# the check's files stay on the machine; its table, peers and log come back in one file
GPU_CHECK_ONLY="${GC_ONLY:-attention_.*}" GPU_CHECK_PARTS="$GC_PARTS" GPU_CHECK_BUDGET_S=${GC_BUDGET:-220} POLYFUSE=$LAST OUT=/tmp/gc \
  timeout 500 bash scripts/gpu-check.sh > /tmp/gc.log 2>&1
{ cat /tmp/gc.log; echo; cat /tmp/gc/peers.jsonl 2>/dev/null; } > "$OUT/gc.txt"
grep -v "^| [a-z]" /tmp/gc.log | tail -30; grep "^| attention\|^| gemm\|^| [a-z_0-9]* | [A-Z]=.* | [0-9]" /tmp/gc.log | head -40
