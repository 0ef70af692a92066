#!/usr/bin/env bash
# The GPU check, run on the H100 machine (CUDA 13, PyTorch, compute-sanitizer;
# no Rust there): give it a polyfuse binary built beforehand.
#
#   bash scripts/gpu-check.sh            # POLYFUSE=target/release/polyfuse
#
# For every program in examples/:
#   polyfuse run F --target cuda --check                 at the file's sizes
#   polyfuse run F --target cuda --check --param ...     at sizes no multiple of 32
#   polyfuse run F --target cuda --bench --json          at the file's sizes
#   compute-sanitizer --tool memcheck and --tool racecheck on the odd-size check
# for every program in bench/programs/:
#   polyfuse run F --target cuda --check --bench --json  (gemm_4096 is checked
#                     at about 1024^3 instead: its f64 reference runs on the CPU)
# then the PyTorch peers of all of them and the device-to-device copy
# (scripts/peers.py, one process), the C ABI's context order (program
# capi_context_order: examples/cpp/context_order.c launches gemm in the
# primary context and releases it *before* pf_result_destroy; run plainly
# and under compute-sanitizer, it fails on any CUDA error, issue 30), and a
# table: $OUT/RESULTS.md, printed last.
#
# One failing program does not stop the others; its row says what happened
# and the log under $OUT/logs/ says why. Every step has a time limit, and
# steps that would start after the overall budget (GPU_CHECK_BUDGET_S,
# default 480 s) are skipped and marked so, to stay under 9 minutes.
#
# Exit status: 0 when every step passed, 1 when any failed (the table is
# written either way), 3 when there is no polyfuse binary.
#
# The C ABI step needs libpolyfuse.so next to the binary (cargo build
# --release makes both; carry target/release/libpolyfuse.so too, or set
# POLYFUSE_LIB) and a C compiler (cc), or a context_order built beforehand
# against that library (CAPI_CONTEXT_ORDER; `make -C examples/cpp
# PROFILE=release` makes target/cpp-examples/context_order).
#
# Environment: POLYFUSE (binary), OUT (default /tmp/gpu-check),
# GPU_CHECK_BUDGET_S, PYTHON (default python3), GPU_CHECK_COMMIT (the
# commit to name in the table where the copy has no .git).
#
# Splitting a run that does not fit one call (the device allows 10 minutes
# a command): GPU_CHECK_ONLY and GPU_CHECK_SKIP are extended regular
# expressions on program names (whole names) that select or drop programs
# (examples and benchmark programs alike, their peers too); then
#   GPU_CHECK_MERGE="dir1 dir2" OUT=dir bash scripts/gpu-check.sh
# runs nothing: it merges the steps, peers and JSON of those runs' OUT
# folders (env.txt from the first) and writes the table of all programs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

POLYFUSE=${POLYFUSE:-$root/target/release/polyfuse}
OUT=${OUT:-/tmp/gpu-check}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
PYTHON=${PYTHON:-python3}
start=$SECONDS

MERGE=${GPU_CHECK_MERGE:-}
# Which parts run: examples, benches, peers, sanitizers (default all).
PARTS=" ${GPU_CHECK_PARTS:-examples benches peers sanitizers capi} "
part() { [[ $PARTS == *" $1 "* ]]; }
ONLY=${GPU_CHECK_ONLY:-.*}
SKIP=${GPU_CHECK_SKIP:-}
# selected NAME: whether this run covers program NAME.
selected() {
    [[ $1 =~ ^($ONLY)$ ]] || return 1
    [[ -z "$SKIP" ]] || ! [[ $1 =~ ^($SKIP)$ ]]
}

# This run's files only (a reused $OUT keeps no stale timings).
rm -rf "$OUT/logs" "$OUT/json" "$OUT/peers.jsonl" "$OUT/RESULTS.md" "$OUT/results.json"
mkdir -p "$OUT/logs" "$OUT/json"
steps="$OUT/steps.tsv"
: >"$steps"

progress() { printf '[%4ds] %s\n' $((SECONDS - start)) "$*"; }

if [[ -n "$MERGE" ]]; then
    first=1
    for d in $MERGE; do
        [[ -d "$d" ]] || { echo "gpu-check: GPU_CHECK_MERGE: no folder $d" >&2; exit 3; }
        if ((first)); then cp "$d/env.txt" "$OUT/env.txt"; first=0; fi
        [[ -f "$d/steps.tsv" ]] && cat "$d/steps.tsv" >>"$steps"
        [[ -f "$d/peers.jsonl" ]] && cat "$d/peers.jsonl" >>"$OUT/peers.jsonl"
        if compgen -G "$d/json/*.json" >/dev/null; then cp "$d"/json/*.json "$OUT/json/"; fi
    done
fi

if [[ -z "$MERGE" && ! -x "$POLYFUSE" ]]; then
    echo "gpu-check: no polyfuse binary at $POLYFUSE (build it with cargo build --release and carry it, or set POLYFUSE)" >&2
    exit 3
fi
case "$POLYFUSE" in /*) ;; *) POLYFUSE="$root/$POLYFUSE" ;; esac

# The CUDA libraries polyfuse loads at run time (NVRTC, the driver): the
# toolkit's folder when the loader does not already know libnvrtc.
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        if compgen -G "$d/libnvrtc.so*" >/dev/null; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            break
        fi
    done
fi
sanitizer=$(command -v compute-sanitizer || true)
[[ -n "$sanitizer" || ! -x /usr/local/cuda/bin/compute-sanitizer ]] ||
    sanitizer=/usr/local/cuda/bin/compute-sanitizer

# The checkout's commit, marked where its tracked files differ from it (the
# binary may be built from another tree: its --version names its sources).
checkout_commit() {
    local c
    c=$(git -C "$root" rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
    if [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        c="$c with uncommitted changes"
    fi
    echo "$c"
}

[[ -n "$MERGE" ]] || {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
    echo "polyfuse: $("$POLYFUSE" --version 2>&1 | head -n 1)"
    echo "commit: ${GPU_CHECK_COMMIT:-$(checkout_commit)}"
    echo "cuda: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo unknown)"
    echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)"
    echo "sanitizer: ${sanitizer:-not found}"
    echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
} >"$OUT/env.txt"
progress "gpu-check: $(sed -n 2p "$OUT/env.txt"); logs in $OUT"

# Sizes that are no multiple of 32 (as tests/integration/examples.rs), for the checks
# and the sanitizers.
declare -A ODD=(
    [gemm]="M=37 N=53 K=29"
    [matvec]="M=37 N=53"
    [fcrelu]="B=37 M=53 N=29"
    [conv2d]="N=3 C=5 F=7 H=37 W=29 KH=3 KW=5"
    [conv2d_strided]="N=3 C=5 F=7 OH=13 OW=11 KH=3 KW=3"
    [maxpool2x2]="B=3 C=5 H=19 W=13"
    [tbmm]="B=3 N=37 M=53 K=29"
    [gemm_chain]="M=37 K=29 N=53 L=23"
    [softmax]="N=37 D=53"
    [layernorm]="N=37 D=53"
    [gemm_f16]="M=37 N=53 K=29"
    [fcrelu_f16]="B=37 M=53 N=29"
    [tbmm_bf16]="B=3 N=37 M=53 K=29"
    [softmax_fused]="N=37 D=53"
    [attention_global]="S=131 D=32"
    [attention_causal]="S=131 D=32"
    [attention_alibi]="S=131 D=32"
    [attention_gqa]="S=131 D=32"
    [attention_softcap]="S=131 D=32"
    [attention_window]="S=131 D=32 W=37"
    [attention_lse]="S=131 D=32 E=16"
    [attention_decode_causal]="KV=61 D=32"
    [attention_decode_alibi]="KV=61 D=13"
    [attention_decode_gqa]="KV=61 D=32"
    [attention_decode_softcap]="KV=61 D=13"
    [attention_bigbird]="S=300 D=16 W=9 G=5"
    [quant_fp8]="M=37 N=53 K=29"
    [rnn]="T=11 N=37"
    [lstm]="T=7 B=5 I=19 H=37"
    [stacked_rnn]="L=3 T=7 N=29"
    [stacked_lstm]="L=3 T=5 B=3 H=37"
    [dilated_rnn]="T=19 N=37"
    [grid_rnn]="R=7 S=5 N=37"
    [gemm_bias_gelu_f16]="M=37 N=53 K=29"
    [layernorm_matmul]="T=37 D=53 N=29"
    [rmsnorm_ffn_swiglu]="T=37 D=29 F=53"
    [lstm_cell]="B=37 I=29 H=13"
)
# Contraction examples checked once more with the reduction split over a
# cluster (--k-split) at sizes no multiple of the tiles, with the
# sanitizers too: the split leaves the last block a shorter range of k.
declare -A SPLIT=(
    [gemm_f16]="--tile 64,64,64 --k-split 3 --param M=130 --param N=200 --param K=777"
    [fcrelu_f16]="--tile 64,64,64 --k-split 4 --param B=70 --param N=90 --param M=777"
)
# Benchmark programs whose f64 reference is too slow at full size: checked
# at these sizes in a separate run, then timed at full size.
declare -A CHECK_AT=(
    [gemm_4096]="M=1031 N=1043 K=1021"
    [gemm_f16_4096]="M=1031 N=1043 K=1021"
    [gemm_bf16_4096]="M=1031 N=1043 K=1021"
    [gemm_nt_f16_4096]="M=1031 N=1043 K=1021"
    [gemm_bias_gelu_f16_4096]="M=1031 N=1043 K=1021"
    [layernorm_matmul_f16_4096]="T=1031 D=1043 N=1021"
    [rmsnorm_ffn_swiglu_f16_t4096d4096f11008]="T=1031 D=1043 F=1021"
    [attention_global_b4h16s4096d64]="B=1 H=2 S=1031"
    [attention_causal_b4h16s4096d64]="B=1 H=2 S=1031"
    [attention_decode_causal_b1h32kv32768d128]="H=4 KV=8191"
    [attention_global_f16w_b4h16s4096d64]="B=1 H=2 S=1031"
    [attention_causal_f16w_b4h16s4096d64]="B=1 H=2 S=1031"
    [attention_decode_causal_f16w_b1h32kv32768d128]="H=4 KV=8191"
    [attention_bigbird_f16_s4096]="B=1 H=2 S=1031"
)
# Timed runs per benchmark program (default 30).
declare -A BENCH_RUNS=(
    [gemm_4096]=20
    [attention_global_b4h16s4096d64]=10
    [attention_causal_b4h16s4096d64]=10
    [attention_global_f16w_b4h16s4096d64]=10
    [attention_causal_f16w_b4h16s4096d64]=10
    [attention_bigbird_f16_s4096]=10
)

# to_args "M=1 N=2" sets args=(--param M=1 --param N=2)
to_args() {
    args=()
    local p
    for p in $1; do args+=(--param "$p"); done
}

# step PROGRAM KIND LIMIT_S LOG CMD...: runs CMD with a time limit, stdout
# to LOG and stderr to LOG.err; records "program kind status seconds log detail" in
# steps.tsv; never fails.
step() {
    local prog=$1 kind=$2 limit=$3 log=$4
    shift 4
    local left=$((BUDGET - (SECONDS - start)))
    if ((left <= 0)); then
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$prog" "$kind" "skipped" 0 "" "over the time budget" >>"$steps"
        progress "$prog: $kind skipped (over the ${BUDGET} s budget)"
        return 0
    fi
    ((limit > left + 30)) && limit=$((left + 30))
    local t0=$SECONDS rc=0
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>"$log.err" || rc=$?
    local secs=$((SECONDS - t0)) status detail=""
    case "$kind" in
        check*)
            detail=$(cat "$log" "$log.err" | grep -m1 -E '^check: ' || true)
            if ((rc == 0)) && [[ $detail == "check: ok"* ]]; then
                status=ok
            elif ((rc == 1)); then
                status=FAILED
            else
                status="exit $rc"
            fi
            ;;
        bench*)
            if ((rc == 0)); then
                status=ok
            elif ((rc == 1)); then
                status="check FAILED"
            else
                status="exit $rc"
            fi
            detail=$(cat "$log" "$log.err" | grep -m1 -E '^check: ' || true)
            ;;
        memcheck | racecheck | memcheck_split | racecheck_split)
            # memcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK
            # SUMMARY: N hazards displayed (N errors, N warnings)".
            local errors
            errors=$(cat "$log" "$log.err" | grep -oE 'ERROR SUMMARY: [0-9]+ error|\([0-9]+ errors?' |
                grep -oE '[0-9]+' | sort -n | tail -n 1 || true)
            if ((rc == 124 || rc == 137)); then
                status=timeout
            elif [[ -z "$errors" ]]; then
                status="exit $rc"
            elif ((errors > 0)); then
                status="$errors errors"
            elif ((rc == 0)); then
                status=clean
            else
                status="clean (run exit $rc)"
            fi
            detail=$(cat "$log" "$log.err" | grep -m1 -E 'SUMMARY' || true)
            ;;
        *) if ((rc == 0)); then status=ok; else status="exit $rc"; fi ;;
    esac
    ((rc == 124 || rc == 137)) && status=timeout
    if [[ $status != ok && $status != clean && -z "$detail" ]]; then
        detail=$(cat "$log" "$log.err" | grep -v '^\s*$' | tail -n 1 | cut -c1-200 || true)
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$prog" "$kind" "$status" "$secs" "$log" "${detail//$'\t'/ }" >>"$steps"
    progress "$prog: $kind $status (${secs} s)${detail:+  $detail}"
}

# bench_json PROGRAM LOG: the JSON document polyfuse printed (on stdout, in
# LOG), to json/PROGRAM.json.
bench_json() {
    [[ -s "$2" ]] || return 0
    "$PYTHON" - "$2" "$OUT/json/$1.json" <<'EOF' || true
import json, sys
text = open(sys.argv[1], errors="replace").read()
doc = None
try:
    doc = json.loads(text)
except ValueError:
    # Anything before it: take the last line, or the last block that
    # starts with "{", that parses.
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith("{"):
            try:
                doc = json.loads("\n".join(lines[i:]))
                break
            except ValueError:
                try:
                    doc = json.loads(lines[i])
                    break
                except ValueError:
                    continue
if doc is not None:
    json.dump(doc, open(sys.argv[2], "w"))
EOF
}

examples=()
all_examples=()
for f in examples/*.json; do
    n=$(basename "$f" .json)
    all_examples+=("$n")
    selected "$n" && examples+=("$n")
done
benches=()
all_benches=()
for f in bench/programs/*.json; do
    n=$(basename "$f" .json)
    all_benches+=("$n")
    selected "$n" && benches+=("$n")
done
P=$POLYFUSE
L=$OUT/logs
if [[ -n "$MERGE" ]]; then
    examples=()
    benches=()
fi

# 1. The examples: --check at the file's sizes and at odd sizes, then --bench.
ex_run=("${examples[@]}")
part examples || ex_run=()
for name in "${ex_run[@]}"; do
    f=examples/$name.json
    step "$name" check 120 "$L/$name.check.log" "$P" run "$f" --target cuda --check
    if [[ -n "${ODD[$name]:-}" ]]; then
        to_args "${ODD[$name]}"
        step "$name" check_odd 120 "$L/$name.check_odd.log" "$P" run "$f" --target cuda --check "${args[@]}"
    else
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" check_odd "no odd sizes" 0 "" "add it to ODD in gpu-check.sh" >>"$steps"
    fi
    if [[ -n "${SPLIT[$name]:-}" ]]; then
        read -ra split_args <<<"${SPLIT[$name]}"
        step "$name" check_split 120 "$L/$name.check_split.log" "$P" run "$f" --target cuda --check "${split_args[@]}"
    fi
    step "$name" bench 120 "$L/$name.bench.log" "$P" run "$f" --target cuda --bench --json --runs 100
    bench_json "$name" "$L/$name.bench.log"
done

# 2. The benchmark programs: --check --bench --json at full size (or the
# check at CHECK_AT's sizes, then --bench --json at full size).
bench_run=("${benches[@]}")
part benches || bench_run=()
for name in "${bench_run[@]}"; do
    f=bench/programs/$name.json
    runs=${BENCH_RUNS[$name]:-30}
    if [[ -n "${CHECK_AT[$name]:-}" ]]; then
        to_args "${CHECK_AT[$name]}"
        step "$name" check 180 "$L/$name.check.log" "$P" run "$f" --target cuda --check "${args[@]}"
        step "$name" bench 180 "$L/$name.bench.log" "$P" run "$f" --target cuda --bench --json --runs "$runs"
    else
        step "$name" bench_check 180 "$L/$name.bench.log" "$P" run "$f" --target cuda --check --bench --json --runs "$runs"
    fi
    bench_json "$name" "$L/$name.bench.log"
done

# 3. The PyTorch peers of every program at the same sizes, and the copy
# bandwidth, in one process (torch.compile for the programs named, or for
# PEERS_COMPILE's list). Its JSON lines go to peers.jsonl as they come, so
# a time-out keeps the rest.
peer_specs=()
for name in "${examples[@]}"; do peer_specs+=("examples/$name.json"); done
for name in "${benches[@]}"; do peer_specs+=("bench/programs/$name.json"); done
((${#peer_specs[@]} == 0)) || ! part peers || step peers peers 420 "$L/peers.log" "$PYTHON" scripts/peers.py --out "$OUT/peers.jsonl" \
    --target-ms 200 --compile "${PEERS_COMPILE:-softmax,layernorm,scale_add,transpose,rowsum,softmax_16k,layernorm_16k,softmax_fused_16k,gemm_bias_gelu_f16_4096,layernorm_matmul_f16_4096,rmsnorm_ffn_swiglu_f16_t4096d4096f11008}" \
    copy@MIB=256 copy@MIB=1024 "${peer_specs[@]}"

# 4. compute-sanitizer on every example at the odd sizes.
san_run=("${examples[@]}")
part sanitizers || san_run=()
for name in "${san_run[@]}"; do
    f=examples/$name.json
    to_args "${ODD[$name]:-}"
    for tool in memcheck racecheck; do
        if [[ -z "$sanitizer" ]]; then
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$tool" "no sanitizer" 0 "" "compute-sanitizer not found" >>"$steps"
            continue
        fi
        step "$name" "$tool" 120 "$L/$name.$tool.log" \
            "$sanitizer" --tool "$tool" "$P" run "$f" --target cuda --check "${args[@]}"
        if [[ -n "${SPLIT[$name]:-}" ]]; then
            read -ra split_args <<<"${SPLIT[$name]}"
            step "$name" "${tool}_split" 120 "$L/$name.${tool}_split.log" \
                "$sanitizer" --tool "$tool" "$P" run "$f" --target cuda --check "${split_args[@]}"
        fi
    done
done

# 5. The C ABI: a result must outlive the caller's release of its CUDA
# context (examples/cpp/context_order.c; issue 30). Built here with cc
# against libpolyfuse.so unless CAPI_CONTEXT_ORDER names a built one; run
# plainly (it checks the context's state and pf_result_destroy's status)
# and under compute-sanitizer, where a CUDA API error polyfuse swallowed
# (cuModuleUnload's CUDA_ERROR_INVALID_HANDLE) counts as an error.
if [[ -z "$MERGE" ]] && part capi && selected capi_context_order; then
    lib=${POLYFUSE_LIB:-$(dirname "$POLYFUSE")/libpolyfuse.so}
    order=${CAPI_CONTEXT_ORDER:-}
    if [[ -z "$order" ]]; then
        if [[ ! -f "$lib" ]]; then
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' capi_context_order capi "not built" 0 "" "no $lib (set POLYFUSE_LIB)" >>"$steps"
        elif ! command -v cc >/dev/null 2>&1; then
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' capi_context_order capi "not built" 0 "" "no cc (set CAPI_CONTEXT_ORDER)" >>"$steps"
        else
            libdir=$(cd "$(dirname "$lib")" && pwd)
            order=$OUT/context_order
            step capi_context_order build 60 "$L/capi_context_order.build.log" \
                cc -std=c99 -O1 -I"$root/include" -o "$order" examples/cpp/context_order.c \
                "$lib" -Wl,-rpath,"$libdir" -ldl
            [[ -x "$order" ]] || order=""
        fi
    fi
    if [[ -n "$order" ]]; then
        step capi_context_order capi 120 "$L/capi_context_order.log" "$order" examples/gemm.json
        if [[ -n "$sanitizer" ]]; then
            # A failed CUDA API call is reported and counted as an error
            # (--report-api-errors explicit, the default); memcheck also
            # checks the launches.
            step capi_context_order memcheck 120 "$L/capi_context_order.memcheck.log" \
                "$sanitizer" --tool memcheck --error-exitcode 1 \
                "$order" examples/gemm.json
        else
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' capi_context_order memcheck "no sanitizer" 0 "" "compute-sanitizer not found" >>"$steps"
        fi
    fi
fi

# 6. The table: $OUT/RESULTS.md (and results.json), the short form printed.
table_status=0
"$PYTHON" - "$OUT" "$root" "${all_examples[@]}" -- "${all_benches[@]}" <<'PY' || table_status=$?
import json, os, sys

out, root = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]
cut = rest.index("--")
examples, benches = rest[:cut], rest[cut + 1:]

env = {}
for line in open(os.path.join(out, "env.txt")):
    k, _, v = line.partition(": ")
    env[k] = v.strip()

steps = {}
for line in open(os.path.join(out, "steps.tsv")):
    prog, kind, status, secs, log, detail = (line.rstrip("\n").split("\t") + [""] * 6)[:6]
    steps[(prog, kind)] = {"status": status, "secs": secs, "log": log, "detail": detail}

peers, copy = {}, {}
path = os.path.join(out, "peers.jsonl")
if os.path.exists(path):
    for line in open(path):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("program") == "copy":
            if "median_us" in d:
                copy[d["params"]["MIB"]] = d
            continue
        peers.setdefault(d.get("program"), []).append(d)


def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def fmt(x, spec):
    return format(x, spec) if num(x) else "—"


def params_of(folder, name):
    try:
        doc = json.load(open(os.path.join(root, folder, name + ".json")))
        return ",".join(f"{k}={v}" for k, v in doc["params"].items())
    except Exception:
        return "?"


def bench_doc(name):
    p = os.path.join(out, "json", name + ".json")
    try:
        return json.load(open(p))
    except Exception:
        return None


def check_word(s):
    if s is None:
        return "—"
    if s["status"] == "FAILED":
        # "check: FAILED max relative error 3.2e-2 [...]"
        words = s["detail"].split()
        errs = [w for w in words if any(ch.isdigit() for ch in w) and "e" in w.lower()]
        return "FAILED" + (f" {errs[0]}" if errs else "")
    return s["status"]


def san(name, tool):
    # A sanitizer's status, and its run on the k-split variant where the
    # program has one.
    status = steps.get((name, tool), {}).get("status", "—")
    split = steps.get((name, f"{tool}_split"))
    return status + (f"; k split {split['status']}" if split else "")


def best_peer(name):
    ok = [p for p in peers.get(name, []) if num(p.get("median_us")) and p.get("check", {}).get("ok")]
    return min(ok, key=lambda p: p["median_us"]) if ok else None


copy_gbs = max((c["gb_per_s"] for c in copy.values()), default=None)
head = ["program", "size", "polyfuse us", "GB/s", "TFLOP/s", "peer", "peer us",
        "polyfuse/peer", "check", "memcheck", "racecheck"]
rows, targets, failures = [], [], []
for folder, names in (("examples", examples), ("bench/programs", benches)):
    for name in names:
        doc = bench_doc(name) or {}
        us, gbs, tfs = doc.get("median_us"), doc.get("gb_per_s"), doc.get("tflop_per_s")
        peer = best_peer(name)
        ratio = us / peer["median_us"] if num(us) and peer else None
        if folder == "examples":
            c = check_word(steps.get((name, "check")))
            o = check_word(steps.get((name, "check_odd")))
            check = f"{c}; odd {o}"
            if (name, "check_split") in steps:
                check += f"; k split {check_word(steps[(name, 'check_split')])}"
        elif (name, "check") in steps:  # checked at smaller sizes (CHECK_AT)
            check = check_word(steps[(name, "check")]) + " (smaller)"
        else:
            check = check_word(steps.get((name, "bench_check")))
            jc = doc.get("check")
            if isinstance(jc, dict):
                check = "ok" if jc.get("ok") else "FAILED"
                if num(jc.get("max_rel_error")):
                    check += f" {jc['max_rel_error']:.0e}"
        if num(us):
            us_text = f"{us:.1f}"
        else:
            b = steps.get((name, "bench")) or steps.get((name, "bench_check"))
            us_text = b["status"] if b and b["status"] != "ok" else "no JSON"
        rows.append([
            name, params_of(folder, name), us_text, fmt(gbs, ".0f"), fmt(tfs, ".2f"),
            peer["peer"] if peer else "—", fmt(peer["median_us"], ".1f") if peer else "—",
            fmt(ratio, ".2f"), check,
            san(name, "memcheck"),
            san(name, "racecheck"),
        ])
        if name == "gemm_4096" and num(ratio):
            targets.append(f"gemm_4096: {ratio:.2f}x the time of {peer['peer']} (target: at most 2.0x)")
        if name in ("scale_add", "transpose", "rowsum") and num(gbs) and copy_gbs:
            targets.append(f"{name}: {gbs:.0f} GB/s, {100 * gbs / copy_gbs:.0f}% of the copy's "
                           f"{copy_gbs:.0f} GB/s (target: at least 80%)")

for (prog, kind), s in steps.items():
    if s["status"] not in ("ok", "clean"):
        log = os.path.relpath(s["log"], out) if s["log"] else "no log"
        failures.append(f"- {prog} {kind}: {s['status']}: {s['detail'][:160]} ({log})")
for name, plist in peers.items():
    for p in plist:
        if "skipped" in p:
            continue
        if "error" in p or not p.get("check", {}).get("ok"):
            failures.append(f"- {name} peer {p.get('peer')}: {p.get('error') or p.get('check')}")


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


copy_text = ", ".join(f"{m} MiB: {c['gb_per_s']:.0f} GB/s" for m, c in sorted(copy.items())) or "not measured"
summary = [
    f"Date: {env.get('date', '?')}. Device: {env.get('device', '?')}.",
    f"polyfuse {env.get('polyfuse', '?')} (checkout {env.get('commit', '?')}), "
    f"CUDA {env.get('cuda', '?')}, PyTorch {env.get('torch', '?')}.",
    f"Device-to-device copy, bytes read + written: {copy_text}.",
]
md = ["# GPU results", "", "Written by `scripts/gpu-check.sh` (see bench/README.md).", ""] + summary + [""]
md += [
    "polyfuse us: median of `polyfuse run --target cuda --bench` (device events; a program "
    "under 100 us as replays of a CUDA graph of one run, 20 per event pair). peer: the "
    "fastest PyTorch peer whose output matched a float64 reference (TF32 off), timed with "
    "device events in the same run, short ones the same way (all peers below). check: `--check` at the file's sizes "
    "and, for the examples, at sizes no multiple of 32 (odd); `(smaller)`: checked at smaller "
    "sizes, as the f64 reference runs on the CPU. memcheck, racecheck: compute-sanitizer on "
    "the odd-size check.",
    "",
    table(head, rows),
    "",
]
if targets:
    md += ["## Targets", ""] + [f"- {t}" for t in targets] + [""]
prow = []
for name in examples + benches:
    for p in peers.get(name, []):
        if num(p.get("median_us")):
            c = p.get("check", {})
            prow.append([name, p["peer"], fmt(p["median_us"], ".1f"), fmt(p.get("gb_per_s"), ".0f"),
                         fmt(p.get("tflop_per_s"), ".2f"), fmt(c.get("rel_error"), ".1e"),
                         fmt(c.get("elementwise"), ".1e"), "ok" if c.get("ok") else "FAILED"])
        elif "skipped" in p:
            prow.append([name, p.get("peer"), "not applicable", "", "", "", "", str(p["skipped"])[:80]])
        else:
            prow.append([name, p.get("peer"), "error", "", "", "", "", str(p.get("error", ""))[:80]])
if prow:
    md += ["## Peers", "",
           "rel error: normwise, the peers' check; elementwise: the error polyfuse's --check bounds "
           "(f16 1e-2, bf16 6e-2, f32 1e-4), on the peers' inputs (normal).", "",
           table(["program", "peer", "us", "GB/s", "TFLOP/s", "rel error", "elementwise", "check"], prow), ""]
md += ["## Failures", ""] + (failures or ["none"]) + [""]
with open(os.path.join(out, "RESULTS.md"), "w") as f:
    f.write("\n".join(md))
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"env": env, "rows": [dict(zip(head, r)) for r in rows], "targets": targets,
               "failures": failures}, f, indent=1)

print()
print("\n".join(summary))
print(table(head, rows))
for t in targets:
    print(t)
print(f"{len(failures)} failing steps, listed in {out}/RESULTS.md" if failures else "no failures")
sys.exit(1 if failures else 0)
PY
progress "gpu-check: done; the table is in $OUT/RESULTS.md"
exit "$table_status"
