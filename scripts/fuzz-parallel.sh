#!/usr/bin/env bash
# The program fuzzer (tests/fuzz.rs, `long`) in JOBS processes at once, for
# machines with many cores and no Rust (the GPU machine's 16 cores): give it
# the fuzz test binary and the polyfuse binary built beforehand.
#
#   scripts/fuzz-parallel.sh FUZZ_TEST_BINARY POLYFUSE_BINARY \
#       [--jobs J] [--minutes M] [--seed S] [--out DIR]
#
# FUZZ_TEST_BINARY is target/release/deps/fuzz-<hash> (`cargo test --release
# --test fuzz --no-run` prints it). Process k fuzzes from seed S + 100000 k,
# so the processes never try one program twice. Each writes its failures
# and SUMMARY.txt under DIR/job-k/ (see scripts/fuzz.sh); DIR/SUMMARY.txt
# adds them up at the end. Defaults: jobs = cores - 2, 10 minutes, seed
# from the clock, DIR = /tmp/fuzz-parallel.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,15p' "$0"; exit 2; }
fuzz=$(realpath "$1")
bin=$(realpath "$2")
shift 2
jobs=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
minutes=10
seed=$(date +%s)
out=/tmp/fuzz-parallel
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) jobs="$2"; shift 2 ;;
        --minutes) minutes="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "fuzz-parallel.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
out=$(realpath "$out")
secs=$(awk "BEGIN { print int($minutes * 60) }")
echo "fuzz-parallel: $jobs jobs, $minutes min each, seeds from $seed, out $out" >&2
for k in $(seq 0 $((jobs - 1))); do
    mkdir -p "$out/job-$k"
    (
        cd "$out/job-$k"
        POLYFUSE_FUZZ_BIN="$bin" POLYFUSE_FUZZ_SECONDS="$secs" \
        POLYFUSE_FUZZ_SEED=$((seed + 100000 * k)) POLYFUSE_FUZZ_OUT="$out/job-$k" \
            "$fuzz" --ignored --exact long --nocapture >"$out/job-$k/log.txt" 2>&1 || true
    ) &
done
wait
# The sum of the jobs' summaries: programs, mutants, runs, failure classes.
{
    echo "fuzz-parallel: $jobs jobs x $minutes min, seeds from $seed"
    cat "$out"/job-*/SUMMARY.txt 2>/dev/null | awk '
        /^fuzz: / { p += $2; m += $4; r += $6 }
        /^failure classes: / { f += $3 }
        END { printf "total: %d programs, %d mutants, %d runs, %d failure classes\n", p, m, r, f }'
    for s in "$out"/job-*/SUMMARY.txt; do
        echo "--- $s"
        cat "$s"
    done
} >"$out/SUMMARY.txt"
cat "$out/SUMMARY.txt"
