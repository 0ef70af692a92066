#!/usr/bin/env bash
# Times variants of suite programs on the GPU machine, one call: each line
# of $LINES (default bench/suite/variants.txt) is `name [polyfuse args...]`,
# timed with `--target cuda --bench --json --runs 10` (median after a
# warm-up; kernels listed). For diagnosis: the same program at its file's
# sizes and at sizes rounded to the tile grid, with tuning options, etc.
#
#   LINES=bench/suite/variants.txt OUT=/tmp/v bash bench/suite/variants.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/variants}
LINES=${LINES:-bench/suite/variants.txt}
mkdir -p "$OUT"
: >"$OUT/variants.jsonl"
while read -r name args; do
    [[ -z $name || $name == \#* ]] && continue
    f=bench/suite/$name.json
    [[ -f $f ]] || f=$name
    # shellcheck disable=SC2086
    json=$(timeout 300 "$POLYFUSE" run "$f" --target cuda --bench --json --runs 10 $args </dev/null 2>>"$OUT/errors.log")
    echo "{\"program\": \"$name\", \"args\": \"$args\", \"result\": ${json:-null}}" >>"$OUT/variants.jsonl"
    us=$(echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["median_us"], d.get("tflop_per_s"))' 2>/dev/null)
    echo "$name $args: ${us:-failed}"
done <"$LINES"
