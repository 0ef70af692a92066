#!/usr/bin/env bash
# The check's ratio (error / declared-precision run's error; the check
# admits 2) of f32 products on the GPU over many input seeds, for binaries
# A and B: the tensor cores' truncation measured, not modelled.
#
#   A=... B=... SEEDS="1 2 3" OUT=$OUT bash bench/experiments/promotion/seeds.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
SEEDS=${SEEDS:-$(seq 1 30)}
CASES=${CASES:-"--tile 16|--param M=1000 --param N=1000 --param K=512|--param M=1000 --param N=1000 --param K=1000"}
IFS='|' read -ra cases <<<"$CASES"
for side in A B; do
    bin=${!side}
    for c in "${cases[@]}"; do
        ratios=""
        for s in $SEEDS; do
            # shellcheck disable=SC2086
            l=$("$bin" run bench/suite/diag/product_tanh_f32out.json --target cuda --check --seed "$s" $c 2>&1 | grep '^check')
            r=$(echo "$l" | sed -E 's/.*error ([0-9.e-]+) \(declared precision: ([0-9.e-]+)\).*/\1 \2/' | awk '{printf "%.2f", $1/$2}')
            ratios="$ratios $r"
        done
        echo "$side [$c]: $ratios" | tee -a "$OUT/seeds.txt"
        echo "$ratios" | tr ' ' '\n' | grep . | sort -n | awk -v s="$side" -v c="$c" '{a[NR]=$1; t+=$1} END{printf "%s [%s]: mean %.2f, largest %s %s %s\n", s, c, t/NR, a[NR-2], a[NR-1], a[NR]}' | tee -a "$OUT/seeds.txt"
    done
done
