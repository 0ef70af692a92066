#!/usr/bin/env bash
# Issue 32/35 (2026-11-29): a normalisation beside its product, its
# statements in one kernel (schedule::epilogue's fused runs). On the GPU
# machine, one call: the binary before ($A) and after ($B) interleaved
# (bench/suite/ab.sh, two rounds), the checks at odd sizes and at the
# files' sizes with $B, then the PyTorch peers of the same programs.
#
#   A=target/exp/polyfuse-old B=target/release/polyfuse OUT=$OUT bash bench/experiments/fused-runs/run.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
here=bench/experiments/fused-runs
OUT=${OUT:-/tmp/fused-runs}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/device.txt"
A=$A B=$B LINES=$here/lines.txt CHECKS=$here/checks.txt OUT=$OUT ROUNDS=2 bash bench/suite/ab.sh 2>&1 | tee "$OUT/ab.txt"
python3 bench/suite/peers.py layernorm_product_f16 rmsnorm_product_f16 --out "$OUT/suite-peers.jsonl" >/dev/null 2>"$OUT/suite-peers.err"
python3 scripts/peers.py layernorm_matmul_f16_4096 rmsnorm_ffn_swiglu_f16_t4096d4096f11008 --out "$OUT/peers.jsonl" >/dev/null 2>"$OUT/peers.err"
python3 - "$OUT" <<'PY'
import json, sys, glob
out = sys.argv[1]
for f in ["suite-peers.jsonl", "peers.jsonl"]:
    try:
        for line in open(f"{out}/{f}"):
            d = json.loads(line)
            print(f"peer {d['program']} {d['peer']}: {d['median_us']:.1f} us ok={d['check']['ok']}")
    except FileNotFoundError:
        print(f"{f}: missing")
PY
