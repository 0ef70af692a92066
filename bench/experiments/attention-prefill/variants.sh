#!/bin/bash
# usage: variants.sh OUTDIR NAME=POLYFUSE...: the attention prefill kernels (global and causal,
# B4 H16 S4096 D64 f16) emitted by several polyfuse builds (the first is the reference), and hand
# edits of the last one (perl: VARIANT_<name>, named in VARIANTS), each built with harness.cu, its
# SASS counted by opcode (OUTDIR/NAME-PROGRAM.ops), and timed in two rounds; every output compared
# with the first build's (ref-*.bin).
set -u
OUT=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); ROOT=$HERE/../../..
mkdir -p "$OUT"
NAMES=()
for nb in "$@"; do
  n=${nb%%=*}; b=${nb#*=}; NAMES+=("$n"); LAST=$n
  for p in global causal; do
    "$b" schedule "$ROOT/bench/programs/attention_${p}_b4h16s4096d64.json" --emit cuda > "$W/$n-$p.cu" || exit 1
  done
done
# the kernel's parameters after the output (temporaries it never touches), as null pointers; in a
# header, since nvcc splits -D values at commas
echo "#define EMITTED_REST $(grep -m1 '__global__' "$W/${NAMES[0]}-global.cu" | grep -o 'float \*__restrict__' | sed 's/.*/nullptr/' | paste -sd, -)" > "$W/rest.h"
v() { # name, program, perl -0 script, source build
  local d="$W/v-$1-$2"; mkdir -p "$d"; perl -0pe "$3" "$W/$4-$2.cu" > "$d/kernel.cu"
  # the dynamic shared bytes: the last buffer's offset plus up to three stages (or a tile of ones)
  (cd "$d" && smem=$(perl -ne 'print "$1 $2\n" if /\*const (pf_fa_\w+) = pf_dynamic_shared \+ (\d+);/' kernel.cu | tail -1 |
       awk '{ print ($1 == "pf_fa_one") ? ($2 + 1024) * 2 : ($1 == "pf_fa_pin") ? ($2 + 256) * 2 : ($2 + 12288) * 2 }') &&
   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -DEMITTED_SMEM=$smem \
     -DEMITTED_GX=64 -DEMITTED_GY=64 -include "$W/rest.h" -I. -o run "$HERE/harness.cu" > build.log 2>&1 \
     || echo "$1-$2: build failed: $(grep error build.log | head -3)"
   grep -A1 "kernel_0" build.log | grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" | paste -sd' ' - > regs.txt
   echo "smem $smem" >> regs.txt
   cuobjdump -sass -fun kernel_0 run > sass.txt 2>/dev/null
   grep -oP '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?\K[A-Z0-9_]+(\.[A-Z0-9_]+)*' sass.txt | sed 's/\..*//' | sort | uniq -c | sort -rn > "$OUT/$1-$2.ops") &
}
ALL=("${NAMES[@]}")
for p in global causal; do
  for n in "${NAMES[@]}"; do v "$n" $p '' "$n"; done
  for x in ${VARIANTS:-}; do eval "script=\${VARIANT_$x}"; v "$x" $p "$script" "$LAST"; done
done
ALL+=(${VARIANTS:-})
wait
for p in global causal; do
  for n in "${ALL[@]}"; do
    [ -f "$OUT/$n-$p.ops" ] && printf '%-14s %-7s SASS %5d instructions, %s\n' "$n" "$p" "$(awk '{s+=$1} END {print s}' "$OUT/$n-$p.ops")" "$(cat "$W/v-$n-$p/regs.txt" | paste -sd' ' -)"
  done
done
for rep in 1 2; do
  for p in global causal; do
    for n in "${ALL[@]}"; do
      [ -x "$W/v-$n-$p/run" ] && "$W/v-$n-$p/run" "$n-$p" "$OUT/ref-$p.bin" 30
    done
  done
done
rm -f "$OUT"/ref-*.bin
