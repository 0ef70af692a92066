#!/usr/bin/env bash
# The suite beyond the examples (issue 32) on the GPU machine, one call:
# each program checked at the sizes of bench/suite/check-sizes.txt (off
# the tile grid, and where the mapping depends on the size, sizes mapped
# as its file's are), then timed at its
# file's sizes under polyfuse's default and with --no-fusion-by-cost
# (the grouping isl's scheduler gives, the default before the cost model),
# then its PyTorch peers (bench/suite/peers.py) in the same call.
#
#   bash bench/suite/run.sh        # POLYFUSE=target/release/polyfuse, OUT=/tmp/suite
#
# Writes $OUT/suite.jsonl (polyfuse runs), $OUT/peers.jsonl and
# $OUT/errors.log (polyfuse's stderr). NAMES="syrk covariance" runs those
# programs alone.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/suite}
mkdir -p "$OUT"
: >"$OUT/suite.jsonl"
# Sizes for the check: bench/suite/check-sizes.txt (every line of the
# program: small sizes off every tile grid, and sizes at which it is
# mapped as at its file's sizes), which tests/integration/suite.rs runs too on the
# CPU and in the GPU emulation.
small() {
    awk -v n="$1" '$1 == n { $1 = ""; print; found = 1 } END { if (!found) exit 1 }' \
        bench/suite/check-sizes.txt || echo "suite: $1 has no line in check-sizes.txt" >&2
}
: >"$OUT/errors.log"
names=${NAMES:-$(for f in bench/suite/*.json; do basename "$f" .json; done)}
for name in $names; do
    f=bench/suite/$name.json
    while read -r sizes; do
        # shellcheck disable=SC2086
        line=$(timeout 300 "$POLYFUSE" run "$f" --target cuda --check $sizes </dev/null 2>&1 | grep "^check:")
        echo "{\"program\": \"$name\", \"what\": \"check\", \"sizes\": \"${sizes# }\", \"line\": \"$line\"}" >>"$OUT/suite.jsonl"
    done < <(small "$name")
    for variant in default no-fusion-by-cost; do
        extra=""
        [[ $variant == no-fusion-by-cost ]] && extra="--no-fusion-by-cost"
        # shellcheck disable=SC2086
        json=$(timeout 300 "$POLYFUSE" run "$f" --target cuda --bench --json --runs 10 $extra 2>>"$OUT/errors.log")
        echo "{\"program\": \"$name\", \"what\": \"$variant\", \"result\": ${json:-null}}" >>"$OUT/suite.jsonl"
    done
    echo "suite: $name done" >&2
done
# shellcheck disable=SC2086
python3 bench/suite/peers.py ${NAMES:-} --out "$OUT/peers.jsonl"
