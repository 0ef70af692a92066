#!/usr/bin/env bash
# Two blocks a multiprocessor for wgmma products: 128 x 128 tiles with 2 or
# 3 stages (96 KB or 64 KB of shared memory, 64 accumulators a thread), so
# that one block's epilogue and refills overlap the other's products,
# against the default 128 x 256 tiles with 4 stages, one block each.
# POLYFUSE is a binary built with the experiment's stage override
# (POLYFUSE_EXPERIMENT_STAGES, read in gpu::contraction::recognise; not in
# main): without the variable it is main's binary.
#
#   POLYFUSE=target/release/polyfuse-exp OUT=$OUT bash bench/experiments/two_blocks/run.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/two-blocks}
POLYFUSE=${POLYFUSE:-target/release/polyfuse-exp}
mkdir -p "$OUT"
summary() { python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("check") or {}; print(round(d["median_us"] or 0,1), "us", "check", c.get("ok") if isinstance(c, dict) else c)' 2>/dev/null || echo failed; }
for st in 3 2; do
    echo "check stages $st 1000^3: $(POLYFUSE_EXPERIMENT_STAGES=$st timeout 200 "$POLYFUSE" run bench/programs/gemm_f16_4096.json --target cuda --check --json --tile 128,128,64 --param M=1000 --param N=1000 --param K=1000 2>>"$OUT/errors.log" | summary)"
done
for f in bench/programs/gemm_f16_4096.json bench/programs/gemm_bias_gelu_f16_4096.json bench/suite/mlp_gelu_f16.json bench/programs/layernorm_matmul_f16_4096.json; do
    for v in "default||" "t128x128s4|--tile 128,128,64|" "t128x128s3|--tile 128,128,64|3" "t128x128s2|--tile 128,128,64|2" "t128x256s3||3"; do
        IFS='|' read -r label flags st <<<"$v"
        if [ -n "$st" ]; then
            json=$(POLYFUSE_EXPERIMENT_STAGES=$st timeout 200 "$POLYFUSE" run "$f" --target cuda --bench --json --runs 20 $flags 2>>"$OUT/errors.log")
        else
            json=$(timeout 200 "$POLYFUSE" run "$f" --target cuda --bench --json --runs 20 $flags 2>>"$OUT/errors.log")
        fi
        echo "{\"label\": \"$label\", \"program\": \"$f\", \"result\": ${json:-null}}" >>"$OUT/times.jsonl"
        echo "$label $(basename "$f"): $(echo "$json" | summary)"
    done
done
