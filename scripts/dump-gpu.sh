#!/usr/bin/env bash
# Dumps what the GPU side prints for every program in examples/,
# bench/programs/ and bench/suite/ into folder OUT, one folder per program:
# cuda.cu (`schedule --emit cuda`), and from `--emit artifact --arch none`
# the emulation (emulation.c) and the launch records (launches.json).
# Two dumps made before and after a change that must not change the output
# compare with `diff -r BEFORE AFTER`.
#
# EMIT=json (or tree, c, deps, gpu-tree) also dumps that --emit as
# emit.<kind> (json holds the model, the dependences, the schedule and the C).
#
# Usage: scripts/dump-gpu.sh OUT [POLYFUSE]   (POLYFUSE: default target/debug/polyfuse)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/dump-gpu.sh OUT [POLYFUSE]}
bin=${2:-target/debug/polyfuse}
bin=$(realpath "$bin")
mkdir -p "$out"
export POLYFUSE_SCHEDULE_TIMEOUT=86400
dump() {
  local f=$1 dir="$out/${1%.json}"
  mkdir -p "$dir"
  "$bin" schedule "$f" --emit cuda --no-cache >"$dir/cuda.cu" 2>"$dir/stderr.txt" || echo "exit $?" >>"$dir/stderr.txt"
  if [[ -n ${EMIT:-} ]]; then
    "$bin" schedule "$f" --emit "$EMIT" --no-cache >"$dir/emit.$EMIT" 2>>"$dir/stderr.txt" || echo "exit $?" >>"$dir/stderr.txt"
  fi
  "$bin" schedule "$f" --emit artifact --arch none --no-cache 2>>"$dir/stderr.txt" |
    python3 -c '
import json, sys
d = sys.argv[1]
try:
    c = json.load(sys.stdin)["compiled"]
except Exception as e:
    open(d + "/emulation.c", "w").write("no artifact: %s\n" % e)
    sys.exit(0)
open(d + "/emulation.c", "w").write(c.get("emulation_c") or "")
cuda = c.get("cuda") or {}
cuda = {k: v for k, v in cuda.items() if k != "source"}
open(d + "/launches.json", "w").write(json.dumps(cuda, indent=1, sort_keys=True) + "\n")
' "$dir"
}
export -f dump
export out bin EMIT
ls examples/*.json bench/programs/*.json bench/suite/*.json | xargs -P "${JOBS:-2}" -I{} bash -c 'dump {}'
echo "dumped $(ls examples/*.json bench/programs/*.json bench/suite/*.json | wc -l) programs into $out"
