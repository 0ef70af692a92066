#!/bin/bash
# Builds and times variants of the emitted decoding kernels (harness.cu).
# Usage: variants.sh POLYFUSE OUTDIR
set -u
P=$1; OUT=$2; HERE=$(cd "$(dirname "$0")" && pwd)
F=$HERE/../../programs/attention_decode_causal_b1h32kv32768d128.json
W=$(mktemp -d)
"$P" schedule "$F" --emit cuda > "$W/base.cu" || exit 1
cp "$W/base.cu" "$OUT/base.cu"
v() { # name, sed script, extra nvcc flags
  mkdir -p "$W/$1"; sed -e "$2" "$W/base.cu" > "$W/$1/kernel.cu"
  (cd "$W/$1" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a $3 -I. -o run "$HERE/harness.cu" -lcuda > build.log 2>&1 || echo "build failed: $(tail -3 build.log)") &
}
PDLK='s/^const int pf_t = threadIdx.x, pf_w = pf_t \/ 32, pf_l = pf_t % 32, pf_g/asm volatile("griddepcontrol.launch_dependents;");\n&/; s/^const int pf_t = threadIdx.x, pf_w = pf_t \/ 32, pf_l = pf_t % 32;$/asm volatile("griddepcontrol.wait;" ::: "memory");\n&/'
v base '' ''
v l2_128 's/cp.async.cg.shared.global \[/cp.async.cg.shared.global.L2::128B [/' ''
v l2_256 's/cp.async.cg.shared.global \[/cp.async.cg.shared.global.L2::256B [/' ''
v full 's/const int pf_full = 0;/const int pf_full = 1;/' ''
v pdl "$PDLK" '-DPDL=1'
v l2_256_full_pdl "s/cp.async.cg.shared.global \[/cp.async.cg.shared.global.L2::256B [/; s/const int pf_full = 0;/const int pf_full = 1;/; $PDLK" '-DPDL=1'
wait
for n in base l2_128 l2_256 full pdl l2_256_full_pdl; do
  echo "== $n"; [ -x "$W/$n/run" ] && "$W/$n/run" || cat "$W/$n/build.log" | tail -5
done
