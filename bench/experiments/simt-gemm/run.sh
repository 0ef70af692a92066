#!/usr/bin/env bash
# f32 register tiles on the SIMT units (issue 32): for each line of
# $LINES (`program [polyfuse args...]`), the SASS instruction mix of its
# kernels (shared loads by width, FFMA, registers) and the time on the GPU
# (`run --target cuda --bench --json --runs 10`, median after a warm-up),
# then the PyTorch peers of the programs named in $PEERS, same call.
#
#   LINES=bench/experiments/simt-gemm/variants.txt OUT=/tmp/s bash bench/experiments/simt-gemm/run.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
P=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/simt-gemm}
LINES=${LINES:-bench/experiments/simt-gemm/variants.txt}
mkdir -p "$OUT"
n=0
while read -r name args; do
  [[ -z $name || $name == \#* ]] && continue
  n=$((n + 1))
  f=bench/suite/$name.json
  [[ -f $f ]] || f=$name
  d=$OUT/v$n
  mkdir -p "$d"
  echo "$name $args" >"$d/args.txt"
  # shellcheck disable=SC2086
  "$P" schedule "$f" --emit cuda --no-cache $args >"$d/k.cu" 2>/dev/null
  # shellcheck disable=SC2086
  if "$P" schedule "$f" --emit ptx --no-cache $args >"$d/k.ptx" 2>/dev/null; then
    ptxas -arch=sm_90 -v "$d/k.ptx" -o "$d/k.cubin" >"$d/ptxas.txt" 2>&1
    cuobjdump -sass "$d/k.cubin" >"$d/k.sass"
    rm -f "$d/k.ptx" "$d/k.cubin"
    mix="LDS32 $(grep -cE 'LDS(\.U)?(\.32)? ' "$d/k.sass") LDS64 $(grep -c 'LDS.64' "$d/k.sass") LDS128 $(grep -c 'LDS.128' "$d/k.sass") FFMA $(grep -c 'FFMA' "$d/k.sass") regs $(grep -oE 'Used [0-9]+ registers' "$d/ptxas.txt" | tr '\n' ' ')"
  else
    mix="no ptx"
  fi
  # shellcheck disable=SC2086
  json=$(timeout 300 "$P" run "$f" --target cuda --bench --json --runs 10 $args </dev/null 2>>"$d/errors.log")
  echo "$json" >"$d/run.json"
  [[ -n ${KEEP_SASS:-} ]] || rm -f "$d/k.sass" "$d/k.cu"
  us=$(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["median_us"])' 2>/dev/null)
  echo "$name $args | ${us:-failed} us | $mix" | tee -a "$OUT/summary.txt"
done <"$LINES"
if [[ -n ${PEERS:-} ]]; then
  # shellcheck disable=SC2086
  python3 scripts/peers.py $PEERS --out "$OUT/peers.jsonl" 2>&1 | tail -20
fi
