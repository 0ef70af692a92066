#!/bin/bash
# usage: run.sh POLYFUSE : emits the kernel, builds every variant, times them
set -u
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
"$1" schedule "$HERE/../../programs/softmax_fused_16k.json" --emit cuda > "$W/emitted.cu" || exit 1
names=$(python3 "$HERE/variants.py" "$W/emitted.cu" "$W")
for v in $names; do (cd "$W/$v" && nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o run "$HERE/harness.cu" > build.log 2>&1 || echo "$v: build failed: $(tail -3 build.log)") & done; wait
for rep in 1 2; do for v in $names; do printf "%-18s " $v; [ -x "$W/$v/run" ] && "$W/$v/run" || echo failed; done; done
