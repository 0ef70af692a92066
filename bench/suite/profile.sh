#!/usr/bin/env bash
# Nsight Compute on one kernel of a suite program, on the GPU machine:
#   KERNEL=kernel_0 bash bench/suite/profile.sh BINARY PROGRAM [polyfuse args...]
# Prints the speed-of-light, occupancy and launch sections and the
# instruction mix of one launch (the first after two warm-up launches).
set -uo pipefail
bin=$1; prog=$2; shift 2
command -v ncu >/dev/null || { echo "profile: no ncu on this machine" >&2; exit 3; }
ncu --kernel-name "${KERNEL:-kernel_0}" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section InstructionStats \
    "$bin" run "$prog" --target cuda --bench --runs 3 "$@" 2>&1 |
    grep -vE '^\s*$|^==PROF==' | grep -E 'Duration|Throughput|Occupancy|Registers|Grid Size|Block Size|Waves|Stall|Executed Ipc|Instructions|Warp Cycles|Active Warps|Eligible|kernel_' | head -60
