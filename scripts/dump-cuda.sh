#!/usr/bin/env bash
# Dump `polyfuse schedule FILE --emit cuda --no-cache` for every program in
# examples/, bench/programs/ and bench/suite/ into DIR (one .cu per file, and
# the error text where it fails), so that two builds can be diffed:
#   scripts/dump-cuda.sh /tmp/before && (change, rebuild) &&
#   scripts/dump-cuda.sh /tmp/after && diff -r /tmp/before /tmp/after
# Uses target/release/polyfuse (build it first with `cargo build --release`),
# or $POLYFUSE_BIN. EMIT=json (or tree, c, deps, gpu-tree) dumps another
# --emit instead (json holds the model, the dependences, the schedule and
# the C).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: dump-cuda.sh DIR [EXTRA polyfuse ARGS...]}"
shift
bin="${POLYFUSE_BIN:-$root/target/release/polyfuse}"
emit="${EMIT:-cuda}"
mkdir -p "$out"
for f in "$root"/examples/*.json "$root"/bench/programs/*.json "$root"/bench/suite/*.json; do
  name="$(basename "$(dirname "$f")")_$(basename "$f" .json)"
  if ! "$bin" schedule "$f" --emit "$emit" --no-cache "$@" >"$out/$name.$emit" 2>"$out/$name.err"; then
    echo "exit $?" >>"$out/$name.err"
  fi
done
echo "dumped $(ls "$out"/*."$emit" | wc -l) programs into $out"
