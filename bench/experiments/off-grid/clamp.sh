#!/usr/bin/env bash
# MN-major chunks past the columns read the last whole chunk (codegen::mma
# staging's read_row): binaries $A (before) and $B (after) interleaved on
# f16 gemm on and off the tile grid, checks with $B at odd sizes (two under
# compute-sanitizer's memcheck), then torch.matmul at the same sizes.
#
#   A=target/exp/polyfuse-dedupe B=target/exp/polyfuse-clamp OUT=$OUT bash bench/experiments/off-grid/clamp.sh
#   (SIZES, ROUNDS and PEER_SIZES= to change what is timed)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/clamp}
mkdir -p "$OUT"
prog=bench/programs/gemm_f16_4096.json
sizes=${SIZES:-"1024,1024,1024 1024,1000,1024 1000,1000,1000 2000,2000,2000 4000,4000,4000 4096,4096,4096 4096,4000,4096"}
for r in $(seq 1 "${ROUNDS:-2}"); do
    for side in A B; do
        bin=${!side}
        for s in $sizes; do
            IFS=, read -r m n k <<<"$s"
            json=$(timeout 200 "$bin" run "$prog" --target cuda --bench --json --runs 20 --param M=$m --param N=$n --param K=$k 2>>"$OUT/errors.log")
            echo "{\"round\": $r, \"side\": \"$side\", \"size\": \"$s\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
            echo "$r $side $s: $(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["median_us"],1))' 2>/dev/null)"
        done
    done
done
for s in 70,203,72 33,1000,40 1000,1000,1000 1001,999,1003 517,1000,263; do
    IFS=, read -r m n k <<<"$s"
    echo "check $s: $(timeout 200 "$B" run $prog --target cuda --check --param M=$m --param N=$n --param K=$k 2>&1 | grep -E '^check|error' | head -2)" | tee -a "$OUT/checks.txt"
done
for tile in "" "--tile 64,128,64"; do
    # shellcheck disable=SC2086
    echo "check bench/programs/gemm_nt_f16_4096 1001,999,1003 $tile: $(timeout 200 "$B" run bench/programs/gemm_nt_f16_4096.json --target cuda --check --param M=1001 --param N=999 --param K=1003 $tile 2>&1 | grep -E '^check|error' | head -2)" | tee -a "$OUT/checks.txt"
done
for s in 70,203,72 1000,1000,1000; do
    IFS=, read -r m n k <<<"$s"
    timeout 300 compute-sanitizer --tool memcheck "$B" run $prog --target cuda --check --param M=$m --param N=$n --param K=$k >"$OUT/memcheck-$s.txt" 2>&1
    echo "memcheck $s: $(grep -E 'ERROR SUMMARY|^check' "$OUT/memcheck-$s.txt" | tr '\n' ' ')" | tee -a "$OUT/checks.txt"
done
for s in ${PEER_SIZES-1000,1000,1000 2000,2000,2000 4000,4000,4000 4096,4000,4096}; do
    IFS=, read -r m n k <<<"$s"
    python3 scripts/peers.py "gemm_f16_4096@M=$m,N=$n,K=$k" --compile none --out "$OUT/peers-$m-$n-$k.jsonl" >/dev/null 2>>"$OUT/errors.log"
    python3 -c 'import json,sys; [print("peer", sys.argv[2], json.loads(l)["peer"], round(json.loads(l)["median_us"],1)) for l in open(sys.argv[1])]' "$OUT/peers-$m-$n-$k.jsonl" "$s"
done
