#!/usr/bin/env bash
# The program fuzzer (tests/fuzz.rs) on the release build, for as long as
# asked:
#
#   scripts/fuzz.sh [--minutes M] [--seed S] [--out DIR]
#
# Defaults: 10 minutes, a seed from the clock, failures under
# target/fuzz-failures/SEED/ (one folder per failing program: program.json
# and report.txt with each command, its exit status and output), and
# SUMMARY.txt there (programs tried, outcomes, failure classes).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

minutes=10
seed=$(date +%s)
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
out=${out:-target/fuzz-failures/$seed}
mkdir -p "$out"

cargo build --release
# The run keeps a copy of the binary: rebuilding the tree meanwhile does not
# change what is fuzzed.
mkdir -p "$out/bin"
cp target/release/polyfuse "$out/bin/polyfuse"
POLYFUSE_FUZZ_BIN="$(cd "$out/bin" && pwd)/polyfuse" \
POLYFUSE_FUZZ_SECONDS=$(awk "BEGIN { print int($minutes * 60) }") \
POLYFUSE_FUZZ_SEED="$seed" \
POLYFUSE_FUZZ_OUT="$(cd "$out" && pwd)" \
    cargo test --release --test fuzz -- --ignored --exact long --nocapture
