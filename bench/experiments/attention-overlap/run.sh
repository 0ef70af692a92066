#!/bin/bash
# usage: run.sh OUT POLYFUSE: the global prefill kernel (B4 H16 S4096 D64 f16) as polyfuse emits it
# and with body.cu's kernel (the same preamble), each built with ../attention-prefill/harness.cu,
# timed alone in three alternating rounds (median of 50 launches) with the variant's output compared
# with the emitted kernel's; then Nsight Compute of one launch of each.
set -u
OUT=$1; P=$2
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$HERE/../../..; W=$(mktemp -d)
mkdir -p "$OUT"
"$P" schedule "$ROOT/bench/programs/attention_global_b4h16s4096d64.json" --emit cuda > "$W/base.cu" || exit 1
sed -n '1,/^extern "C" __global__/p' "$W/base.cu" | sed '$d' > "$W/pre.cu"
cat "$W/pre.cu" "$HERE/body.cu" > "$W/ov.cu"
echo "#define EMITTED_REST $(grep -m1 '__global__' "$W/base.cu" | grep -o 'float \*__restrict__' | sed 's/.*/nullptr/' | paste -sd, -)" > "$W/rest.h"
build() { # name smem
  mkdir -p "$W/$1"; cp "$W/$1.cu" "$W/$1/kernel.cu"
  (cd "$W/$1" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -DEMITTED_SMEM=$2 \
    -DEMITTED_GX=64 -DEMITTED_GY=64 -include "$W/rest.h" -I. -o run "$ROOT/bench/experiments/attention-prefill/harness.cu" > build.log 2>&1 \
    || { echo "$1: build failed"; grep -i error build.log | head; }
   grep -o "Used [0-9]* registers\|[0-9]* bytes spill stores" build.log | paste -sd' ' - | sed "s/^/$1: /")
}
build base 40960 & build ov 49152 & wait
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
for rep in 1 2 3; do
  "$W/base/run" "base" "$OUT/ref.bin" 50
  "$W/ov/run" "overlap" "$OUT/ref.bin" 50
done
rm -f "$OUT/ref.bin"
[ -n "${NO_NCU:-}" ] && exit 0
for v in base ov; do
  echo "== ncu $v"
  timeout 120 ncu --launch-skip 3 --launch-count 1 -k kernel_0 --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section Occupancy "$W/$v/run" "$v" "" 5 2>&1 | grep -vE "^==PROF==|^\s*$|----" | \
    grep -E "Duration|Issue Slots Busy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Stall|Warp Cycles Per Issued|Executed Ipc|SM Busy|Achieved Occupancy|Registers|Compute \(SM\)|Memory Throughput|Pipe|Tensor|stall" | head -40
  timeout 120 ncu --launch-skip 3 --launch-count 1 -k kernel_0 --metrics \
smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_selected,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_sleeping,smsp__pcsamp_warps_issue_stalled_misc,smsp__pcsamp_warps_issue_stalled_lg_throttle,smsp__pcsamp_warps_issue_stalled_tex_throttle,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_no_instructions,smsp__pcsamp_warps_issue_stalled_drain,smsp__pcsamp_warps_issue_stalled_imc_miss,smsp__pcsamp_warps_issue_stalled_branch_resolving,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum \
    "$W/$v/run" "$v" "" 5 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -28
done
