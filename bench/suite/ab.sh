#!/usr/bin/env bash
# A/B of two polyfuse binaries on the GPU machine, interleaved in one call:
# $LINES (variants.sh's format) timed with binary $A, then $B, $ROUNDS
# times; then $CHECKS (same format, lines carrying --check) run with $B.
#
#   A=target/exp/polyfuse-old B=target/exp/polyfuse-new LINES=... CHECKS=... OUT=$OUT bash bench/suite/ab.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
ROUNDS=${ROUNDS:-2}
for r in $(seq 1 "$ROUNDS"); do
    for side in A B; do
        bin=${!side}
        echo "== round $r, $side ($bin)"
        POLYFUSE=$bin OUT=$OUT/$side-$r bash bench/suite/variants.sh
    done
done
# CHECK_SIDES="A B" checks with both binaries (default B).
if [[ -n ${CHECKS:-} ]]; then
    for side in ${CHECK_SIDES:-B}; do
        bin=${!side}
        echo "== checks with $side"
        while read -r name args; do
            [[ -z $name || $name == \#* ]] && continue
            f=bench/suite/$name.json
            [[ -f $f ]] || f=$name
            # shellcheck disable=SC2086
            res=$(timeout 300 "$bin" run "$f" --target cuda $args </dev/null 2>&1 | grep -E '^check|error' | head -3)
            echo "$side $name $args: $res" | tee -a "$OUT/checks.txt"
        done <"$CHECKS"
    done
fi
