#!/usr/bin/env bash
# Issue 33, item 1, on the GPU machine: builds abi_time.c against the
# carried target/release/libpolyfuse.so and times f16 programs through the
# C ABI, compiled for plain sm_90 (the ABI's old choice, compute_90: no
# wgmma path) and by default (sm_90a where a kernel has a wgmma path).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
out=${OUT:-/tmp}
cc -std=c99 -O2 -Iinclude -o "$out/abi_time" bench/experiments/capi-arch/abi_time.c \
    -Ltarget/release -lpolyfuse -Wl,-rpath,"$root/target/release" -ldl
for p in bench/programs/gemm_f16_4096.json bench/programs/attention_global_b4h16s4096d64.json; do
    POLYFUSE_CUDA_ARCH=sm_90 "$out/abi_time" "$p" 50
    "$out/abi_time" "$p" 50
done
