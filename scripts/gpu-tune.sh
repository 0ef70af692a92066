#!/usr/bin/env bash
# Tune one program on the GPU machine and time it against its peers, in one
# call (the device allows 10 minutes a command; no Rust there: give it a
# polyfuse binary built beforehand).
#
#   bash scripts/gpu-tune.sh PROGRAM BUDGET [-- TUNE-ARGS...]
#   bash scripts/gpu-tune.sh gemm_4096 5m -- --check-param M=517 --check-param N=389 --check-param K=263
#
# PROGRAM is a name in bench/programs/ or examples/ (or a path). Steps, each
# logged under $OUT/NAME/:
#   default.json  polyfuse run --target cuda --bench --json --no-cache
#                 (the default schedule, 50 timed runs)
#   tune.json     polyfuse tune --target cuda --budget BUDGET --json into a
#                 fresh cache (TUNE_CACHE, default /tmp/gpu-tune-cache/NAME.sqlite:
#                 SQLite needs a local file system); progress in tune.log
#   tuned.json    polyfuse run --target cuda --bench --json with that cache
#                 (the tuned options, found there by the program's key)
#   peers.jsonl   scripts/peers.py NAME (the PyTorch peers, same call)
#   summary.txt   default, tuned and peer medians and their ratios
#
# Environment: POLYFUSE (binary, default target/release/polyfuse), OUT
# (default /tmp/gpu-tune), PYTHON (default python3), TUNE_RUNS (timed runs
# per candidate, default 5), PEERS_COMPILE (peers.py --compile, default all),
# TARGET (default cuda; cpu to try the script without a GPU), TUNE_TIMEOUT_S
# (a hard limit on the tune step, default 420 s: the rest must fit the call).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if (($# < 2)); then
    sed -n '2,22p' "${BASH_SOURCE[0]}" >&2
    exit 2
fi
program=$1
budget=$2
shift 2
[[ ${1:-} == "--" ]] && shift

POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/gpu-tune}
PYTHON=${PYTHON:-python3}
[[ -x "$POLYFUSE" ]] || { echo "gpu-tune: no polyfuse binary at $POLYFUSE" >&2; exit 3; }

file=$program
for dir in bench/programs examples; do
    [[ -f "$file" ]] || file=$dir/$program.json
done
[[ -f "$file" ]] || { echo "gpu-tune: no program $program" >&2; exit 2; }
name=$(basename "$file" .json)
dir=$OUT/$name
mkdir -p "$dir"
# The cache lives on the machine's local disk: SQLite's locking and WAL
# need a file system that supports them, which $OUT need not be.
cache=${TUNE_CACHE:-/tmp/gpu-tune-cache/$name.sqlite}
mkdir -p "$(dirname "$cache")"
rm -f "$cache" "$cache"-* "$dir"/*.json "$dir"/*.jsonl "$dir"/*.log

echo "gpu-tune: $name ($file), budget $budget, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" | tee "$dir/summary.txt"

"$POLYFUSE" run "$file" --target "${TARGET:-cuda}" --bench --runs 50 --json --no-cache >"$dir/default.json" 2>"$dir/default.log"
timeout "${TUNE_TIMEOUT_S:-420}" "$POLYFUSE" tune "$file" --target "${TARGET:-cuda}" --budget "$budget" --runs "${TUNE_RUNS:-5}" --json \
    --cache "$cache" "$@" >"$dir/tune.json" 2>"$dir/tune.log" ||
    { echo "gpu-tune: tune failed or passed TUNE_TIMEOUT_S; the end of tune.log:" | tee -a "$dir/summary.txt"
      tail -5 "$dir/tune.log" | tee -a "$dir/summary.txt"; exit 1; }
"$POLYFUSE" run "$file" --target "${TARGET:-cuda}" --bench --runs 50 --json --cache "$cache" \
    >"$dir/tuned.json" 2>"$dir/tuned.log"
"$PYTHON" scripts/peers.py "$name" --out "$dir/peers.jsonl" --compile "${PEERS_COMPILE:-all}" \
    >"$dir/peers.log" 2>&1 || echo "gpu-tune: peers failed (see peers.log)" | tee -a "$dir/summary.txt"

"$PYTHON" - "$dir" <<'EOF' | tee -a "$dir/summary.txt"
import json, sys, os
d = sys.argv[1]
def load(f):
    with open(os.path.join(d, f)) as h:
        return json.load(h)
default, tuned, tune = load("default.json"), load("tuned.json"), load("tune.json")
dm, tm = default["median_us"], tuned["median_us"]
peers = []
if os.path.exists(os.path.join(d, "peers.jsonl")):
    for line in open(os.path.join(d, "peers.jsonl")):
        p = json.loads(line)
        if "median_us" in p and p.get("check", {}).get("ok"):
            peers.append((p["median_us"], p["peer"]))
best, dflt = tune.get("best") or {}, tune.get("default") or {}
n = len(tune.get("candidates", []))
ok = sum(1 for c in tune.get("candidates", []) if c.get("time_us") is not None)
print(f"tune: {n} candidates ({ok} checked and timed), {tune['search']} search, seed {tune['seed']}, {tune['seconds']:.0f} s, space of {tune['space_size']}")
print(f"tune's own figures: default {dflt.get('time_us')} us, best {best.get('time_us')} us ({best.get('variant')}), speedup {tune.get('speedup')}")
print(f"run --bench (50 runs): default {dm:.1f} us, tuned {tm:.1f} us, tuned/default {tm / dm:.3f}")
if peers:
    pu, pn = min(peers)
    print(f"best peer: {pn} {pu:.1f} us; default/peer {dm / pu:.2f}, tuned/peer {tm / pu:.2f}")
EOF
