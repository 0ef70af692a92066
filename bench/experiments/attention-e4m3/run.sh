#!/bin/bash
# usage (repository root): run.sh OUT POLYFUSE: the emitted global and causal prefill kernels
# (B4 H16 S4096 D64) and their e4m3-remainder edits (transform.py), each built with the
# attention-prefill harness and timed in two rounds; every output compared with the emitted
# kernel's (the f16 remainder).
set -u
OUT=$1; P=$2; R=$PWD; H=$R/bench/experiments/attention-prefill; W=$(mktemp -d)
for p in global causal; do
  "$P" schedule bench/programs/attention_${p}_b4h16s4096d64.json --emit cuda > $W/base-$p.cu
  python3 bench/experiments/attention-e4m3/transform.py $W/base-$p.cu $W/e4m3-$p.cu || exit 1
done
echo "#define EMITTED_REST $(grep -m1 '__global__' $W/base-global.cu | grep -o 'float \*__restrict__' | sed 's/.*/nullptr/' | paste -sd, -)" > $W/rest.h
for v in base e4m3; do for p in global causal; do
  smem=40960; [ $v = e4m3 ] && smem=49152
  mkdir -p $W/$v-$p; cp $W/$v-$p.cu $W/$v-$p/kernel.cu
  (cd $W/$v-$p && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -DEMITTED_SMEM=$smem -DEMITTED_GX=64 -DEMITTED_GY=64 -include $W/rest.h -I. -o run $H/harness.cu > build.log 2>&1 || { echo "$v-$p build failed"; grep -m3 error build.log; }; grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" build.log | paste -sd' ' - | sed "s/^/$v-$p: /") &
done; done; wait
for rep in 1 2; do for p in global causal; do
  $W/base-$p/run base-$p $OUT/ref-$p.bin 30; $W/e4m3-$p/run e4m3-$p $OUT/ref-$p.bin 30
done; done
rm -f $OUT/ref-*.bin
