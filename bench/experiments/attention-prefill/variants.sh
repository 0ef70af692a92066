#!/bin/bash
# usage: variants.sh OUTDIR BASE_POLYFUSE NEW_POLYFUSE: the attention prefill kernels (global and
# causal, B4 H16 S4096 D64 f16) emitted by two polyfuse builds, and hand edits of the new one
# (perl, below), each built with harness.cu, its SASS counted by opcode (OUTDIR/NAME.ops), and
# timed in two rounds; every output compared with the base build's (ref-*.bin).
set -u
OUT=$1; BASE=$2; NEW=$3
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); ROOT=$HERE/../../..
mkdir -p "$OUT"
for p in global causal; do
  "$BASE" schedule "$ROOT/bench/programs/attention_${p}_b4h16s4096d64.json" --emit cuda > "$W/base-$p.cu" || exit 1
  "$NEW" schedule "$ROOT/bench/programs/attention_${p}_b4h16s4096d64.json" --emit cuda > "$W/new-$p.cu" || exit 1
done
# the kernel's parameters after the output (temporaries it never touches), as null pointers; in a
# header, since nvcc splits -D values at commas
echo "#define EMITTED_REST $(grep -m1 '__global__' "$W/base-global.cu" | grep -o 'float \*__restrict__' | sed 's/.*/nullptr/' | paste -sd, -)" > "$W/rest.h"
v() { # name, program, perl -0 script[, source prefix other than new]
  local d="$W/$1-$2"; mkdir -p "$d"; perl -0pe "$3" "$W/${4:-new}-$2.cu" > "$d/kernel.cu"
  (cd "$d" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -DEMITTED_SMEM=40960 \
     -DEMITTED_GX=64 -DEMITTED_GY=64 -include "$W/rest.h" -I. -o run "$HERE/harness.cu" > build.log 2>&1 \
     || echo "$1-$2: build failed: $(grep error build.log | head -3)"
   grep -A1 "kernel_0" build.log | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | paste -sd' ' - > regs.txt
   cuobjdump -sass -fun kernel_0 run > sass.txt 2>/dev/null
   grep -oP '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?\K[A-Z0-9_]+(\.[A-Z0-9_]+)*' sass.txt | sed 's/\..*//' | sort | uniq -c | sort -rn > "$OUT/$1-$2.ops") &
}
for p in global causal; do
  v base $p '' base
  v fold $p ''
done
# more variants: VARIANT_name='perl script' in the environment, named in VARIANTS
for x in ${VARIANTS:-}; do
  eval "script=\${VARIANT_$x}"
  for p in global causal; do v "$x" $p "$script"; done
done
wait
for p in global causal; do
  for n in base fold ${VARIANTS:-}; do
    [ -f "$OUT/$n-$p.ops" ] && printf '%-14s %-7s SASS %5d instructions, %s\n' "$n" "$p" "$(awk '{s+=$1} END {print s}' "$OUT/$n-$p.ops")" "$(cat "$W/$n-$p/regs.txt")"
  done
done
for rep in 1 2; do
  for p in global causal; do
    for n in base fold ${VARIANTS:-}; do
      [ -x "$W/$n-$p/run" ] && "$W/$n-$p/run" "$n-$p" "$OUT/ref-$p.bin" 30
    done
  done
done
