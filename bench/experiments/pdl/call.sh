#!/bin/bash
# One device call: every kernel launched as a programmatic dependent (2676f26) against the build
# before it (OLD), whole programs through `polyfuse run --target cuda --check --bench` (graph
# replays of one execution), two alternating rounds; the emitted latency gemm in a graph of 20
# (gemm-latency harness, plain and programmatic launches); the attention peers' accuracy under
# polyfuse's elementwise check (attention-numerics); sanitizers on the new build.
# usage (repository root): call.sh OUT OLD NEW
set -u
OUT=$1; OLD=$2; NEW=$3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
P=bench/programs; E=examples
cases=(
  "$P/gemm_f16_128x1024x1024.json"
  "$E/gemm_f16.json --param M=129 --param N=255 --param K=1000"
  "$E/softmax.json --param N=4096 --param D=1000"
  "$E/softmax.json --param N=64 --param D=256"
  "$E/gemm_chain.json --param M=256 --param K=256 --param N=256 --param L=256"
  "$E/attention_decode_alibi.json --param H=32 --param KV=8191 --param D=128"
  "$P/attention_decode_causal_b1h32kv32768d128.json"
)
{
for r in 1 2; do for c in "${cases[@]}"; do for b in "$OLD" "$NEW"; do
  printf '%-6s %-4s %s: ' "r$r" "$(basename "$b" | sed 's/polyfuse-old/old/;s/polyfuse/new/')" "$c"
  timeout 120 "$b" run $c --target cuda --check --bench --runs 50 2>&1 | grep -E "^check|time" | tr '\n' ' '; echo
done; done; done
} > "$OUT/ab.txt" 2>&1
cat "$OUT/ab.txt"
# the latency gemm's emitted kernel in a graph of 20 (new build: it waits first)
H=bench/experiments/gemm-latency; W=$(mktemp -d)
"$NEW" schedule $P/gemm_f16_128x1024x1024.json --emit cuda > $W/kernel.cu
(cd $W && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=229376 -DEMITTED_GX=32 -DEMITTED_GY=2 -DEMITTED_GZ=1 -I. -o run "$OLDPWD/$H/harness.cu" -lcuda -lcublas > build.log 2>&1 || tail -5 build.log)
{ for r in 1 2 3; do for v in emitted emitted_pdl cublas; do $W/run $v; done; done; } > "$OUT/graph20.txt" 2>&1
cat "$OUT/graph20.txt"
# sanitizers on programmatic dependents (several kernels, each waiting for the last)
{ for c in "$E/softmax.json --param N=100 --param D=77" "$E/gemm_chain.json" "$E/attention_decode_alibi.json" "$E/gemm_f16.json --param M=129 --param N=255 --param K=100"; do
  for tool in memcheck racecheck; do echo "== $tool $c"; timeout 120 compute-sanitizer --tool $tool "$NEW" run $c --target cuda --check 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check:" | head -3; done
done; } > "$OUT/san.txt" 2>&1
cat "$OUT/san.txt"
# accuracy of the attention peers under polyfuse's check, and polyfuse's own
{ timeout 300 python bench/experiments/attention-numerics/numerics.py 1 2 1031 64 1 16 4096 64
  for p in global causal; do for s in 1031 4096; do
    echo "polyfuse $p B=1 H=2 S=$s: $(timeout 120 "$NEW" run $P/attention_${p}_b4h16s4096d64.json --param B=1 --param H=2 --param S=$s --target cuda --check 2>&1 | grep check)"
  done; done; } > "$OUT/numerics.txt" 2>&1
cat "$OUT/numerics.txt"
