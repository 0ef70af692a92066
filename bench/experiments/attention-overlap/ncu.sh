#!/bin/bash
# usage: ncu.sh OUT POLYFUSE [PERL]: Nsight Compute stall samples of the emitted global prefill kernel
# (optionally edited by a perl -0 script), one launch, in the harness of ../attention-prefill.
set -u
OUT=$1; P=$2; ED=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$HERE/../../..; W=$(mktemp -d)
"$P" schedule "$ROOT/bench/programs/attention_global_b4h16s4096d64.json" --emit cuda | perl -0pe "$ED" > "$W/kernel.cu"
echo "#define EMITTED_REST $(grep -m1 '__global__' "$W/kernel.cu" | grep -o 'float \*__restrict__' | sed 's/.*/nullptr/' | paste -sd, -)" > "$W/rest.h"
(cd "$W" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=49664 -DEMITTED_GX=64 -DEMITTED_GY=64 \
  -include rest.h -I. -o run "$ROOT/bench/experiments/attention-prefill/harness.cu") || exit 1
timeout 150 ncu --launch-skip 3 --launch-count 1 -k kernel_0 --metrics \
gpu__time_duration.sum,smsp__pcsamp_warps_issue_stalled_no_instructions,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_selected,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_branch_resolving,smsp__inst_executed.sum,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
  "$W/run" x "" 5 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -15
