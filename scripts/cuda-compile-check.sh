#!/usr/bin/env bash
# CI's CUDA check without a GPU: the CUDA of every program in examples/ and
# bench/programs/ (or of the files given as arguments) is compiled
#
#   scripts/nvrtc.py F.cu sm_90 F.ptx       must succeed (NVRTC, as polyfuse's
#                                            `--emit ptx` calls it)
#   ptxas -arch=sm_90 -v F.ptx               must succeed
#
# and the same for sm_90a where the code has a wgmma path. It prints
# ptxas's resource report per kernel: registers, static shared memory,
# spill stores and loads, stack frame. Any failure makes the exit status
# non-zero (after every program has been tried).
#
# Where F.cu comes from: with no arguments, the golden files
# (tests/golden/{examples,bench/programs}/NAME/cuda.cu), which the golden
# test holds byte-equal to `polyfuse schedule NAME.json --emit cuda`, so
# that CI does not compile every program a second time; one program
# (examples/gemm.json) then also goes through `polyfuse schedule --emit
# cuda` and `--emit ptx --arch sm_90`, whose outputs must equal the golden
# CUDA and this script's PTX of it. With program files as arguments, or
# CUDA_CHECK_FROM=polyfuse, each program's CUDA comes from `polyfuse
# schedule F --emit cuda`.
#
# NVRTC, the CUDA headers and ptxas come from scripts/cuda-tools.sh (PyPI
# wheels in ./.cuda-tools). The polyfuse binary is $POLYFUSE; without it the
# script runs `cargo build --tests` and uses target/debug/polyfuse. The generated
# files and logs stay in $CUDA_CHECK_DIR (default: a temporary folder that
# is removed at the end).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

say() { echo "cuda-compile-check: $*" >&2; }

# The tools: NVRTC on LD_LIBRARY_PATH, headers, ptxas on PATH.
env_lines=$(scripts/cuda-tools.sh) || {
    say "scripts/cuda-tools.sh failed; cannot check the CUDA code"
    exit 3
}
eval "$env_lines"
command -v ptxas >/dev/null 2>&1 || {
    say "ptxas not found after scripts/cuda-tools.sh"
    exit 3
}

if [[ -z "${POLYFUSE:-}" ]]; then
    # The binary as `cargo test` builds it (`--tests`: the test targets'
    # features), so that after `cargo test` nothing is compiled again.
    cargo build --quiet --tests
    POLYFUSE="$root/target/debug/polyfuse"
fi
[[ -x "$POLYFUSE" ]] || {
    say "polyfuse binary $POLYFUSE not found or not executable"
    exit 3
}

if (($# > 0)); then
    programs=("$@")
    from=polyfuse
else
    programs=(examples/*.json bench/programs/*.json)
    from=${CUDA_CHECK_FROM:-golden}
fi
[[ $from == golden || $from == polyfuse ]] || {
    say "CUDA_CHECK_FROM is golden or polyfuse, not $from"
    exit 3
}

# golden_cuda FILE: the golden CUDA of program FILE.
golden_cuda() {
    local name
    name=$(basename "$1" .json)
    case "$1" in
        bench/*) echo "$root/tests/golden/bench/programs/$name/cuda.cu" ;;
        *) echo "$root/tests/golden/examples/$name/cuda.cu" ;;
    esac
}

if [[ -n "${CUDA_CHECK_DIR:-}" ]]; then
    work=$CUDA_CHECK_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

# assemble NAME CU ARCH OUT PATTERN WHAT: NVRTC compiles CU for ARCH into
# OUT.ptx, which must match PATTERN (WHAT in the message when it does
# not), then `ptxas -arch=ARCH -v` into OUT.cubin with its report in
# OUT.ptxas. On a failure it adds NAME's line to `failures` and returns 1.
assemble() {
    local name=$1 cu=$2 arch=$3 out=$4 pattern=$5 what=$6 status=0
    python3 "$root/scripts/nvrtc.py" "$cu" "$arch" "$out.ptx" 2>"$out.ptx.err" || status=$?
    if ((status != 0)); then
        failures+=("$name: NVRTC for $arch failed (status $status): $(first_line "$out.ptx.err")")
        say "$name: NVRTC for $arch FAILED"
        return 1
    fi
    if ! grep -q "$pattern" "$out.ptx"; then
        failures+=("$name: the $arch PTX has no $what")
        say "$name: the $arch PTX has no $what"
        return 1
    fi
    if ! ptxas -arch="$arch" -v -o "$out.cubin" "$out.ptx" >"$out.ptxas" 2>&1; then
        failures+=("$name: ptxas -arch=$arch failed: $(grep -m1 -i error "$out.ptxas" || first_line "$out.ptxas")")
        say "$name: ptxas -arch=$arch FAILED"
        return 1
    fi
}

# Runs polyfuse; stdout to $1, stderr to $2; returns polyfuse's status.
polyfuse_to() {
    local out=$1 err=$2
    shift 2
    "$POLYFUSE" "$@" >"$out" 2>"$err"
}

first_line() { head -n 3 "$1" | tr '\n' ' ' | sed 's/ *$//'; }

# check_one FILE: one program's checks, adding to the arrays `rows` (a
# line per kernel), `failures` (a line per failure) and `wgmma_programs`,
# which are its caller's (check_and_record's).
check_one() {
    local file=$1 name base start status kernels
    name=$(basename "$file" .json)
    case "$file" in
        bench/*) name="bench/$name" ;;
    esac
    base="$work/${name//\//_}"
    start=$SECONDS

    if [[ $from == golden ]]; then
        if [[ ! -f $(golden_cuda "$file") ]]; then
            failures+=("$name: no golden CUDA ($(golden_cuda "$file")); BLESS=1 cargo test --test integration golden:: writes it")
            say "$name: no golden CUDA"
            return 0
        fi
        cp "$(golden_cuda "$file")" "$base.cu"
    else
        status=0
        polyfuse_to "$base.cu" "$base.cu.err" schedule "$file" --emit cuda || status=$?
        if ((status != 0)); then
            failures+=("$name: --emit cuda failed (status $status): $(first_line "$base.cu.err")")
            say "$name: --emit cuda FAILED"
            return 0
        fi
    fi
    if [[ ! -s "$base.cu" ]]; then
        failures+=("$name: no CUDA (an empty file)")
        say "$name: no CUDA"
        return 0
    fi

    assemble "$name" "$base.cu" sm_90 "$base" '\.entry' "a kernel entry" || return 0

    # ptxas -v, per entry:
    #   ptxas info    : Compiling entry function 'kernel_0' for 'sm_90'
    #   ptxas info    : Function properties for kernel_0
    #       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    #   ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, ...
    kernels=$(awk -v prog="$name" '
        /Compiling entry function/ {
            k = $0; sub(/.*entry function '\''/, "", k); sub(/'\''.*/, "", k)
            stack[k] = 0; sst[k] = 0; sld[k] = 0; regs[k] = 0; smem[k] = 0
            order[n++] = k; cur = k
        }
        /bytes stack frame/ {
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) == "bytes" && $(i + 2) == "stack") stack[cur] = $i
                if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^stores/) sst[cur] = $i
                if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^loads/) sld[cur] = $i
            }
        }
        /Used [0-9]+ registers/ {
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) ~ /^registers/) regs[cur] = $i
                if ($(i + 1) == "bytes" && $(i + 2) ~ /^smem/) smem[cur] = $i
            }
        }
        END {
            for (j = 0; j < n; j++) {
                k = order[j]
                printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", prog, k, regs[k], smem[k], sst[k], sld[k], stack[k]
            }
        }' "$base.ptxas" | sort -t $'\t' -k2,2V)
    if [[ -z "$kernels" ]]; then
        failures+=("$name: ptxas reported no kernel")
        say "$name: ptxas reported no kernel"
        return 0
    fi
    while IFS= read -r line; do rows+=("$line"); done <<<"$kernels"

    # Kernels with a wgmma path (only compiled for sm_90a, under
    # __CUDA_ARCH_FEAT_SM90_ALL): assemble that path too.
    if grep -q 'wgmma.mma_async' "$base.cu"; then
        assemble "$name" "$base.cu" sm_90a "$base.90a" 'wgmma\.mma_async' "wgmma" || return 0
        wgmma_programs+=("$name")
        say "$name: wgmma path assembled for sm_90a: $(grep -m1 -o 'Used [0-9]* registers' "$base.90a.ptxas"), $(grep -m1 -o '[0-9]* bytes spill stores' "$base.90a.ptxas")"
    fi
    say "$name: ok ($(wc -l <<<"$kernels") kernels, $((SECONDS - start)) s)"
}

# Where program FILE's results go: $work/NAME.rows, .fail, .wgmma, .noptx.
result_base() {
    local name
    name=$(basename "$1" .json)
    case "$1" in
        bench/*) name="bench/$name" ;;
    esac
    echo "$work/${name//\//_}"
}

# check_and_record FILE: check_one in a job of its own (as many at once as
# the machine has cores), its results written to files, since a job cannot
# add to the parent's arrays.
check_and_record() {
    local -a failures=() rows=() wgmma_programs=()
    local out
    out=$(result_base "$1")
    check_one "$1"
    if ((${#rows[@]})); then printf '%s\n' "${rows[@]}" >"$out.rows"; fi
    if ((${#failures[@]})); then printf '%s\n' "${failures[@]}" >"$out.fail"; fi
    if ((${#wgmma_programs[@]})); then printf '%s\n' "${wgmma_programs[@]}" >"$out.wgmma"; fi
    touch "$out.done"
}

jobs_at_once=$(nproc 2>/dev/null || echo 2)
for file in "${programs[@]}"; do
    [[ -n $file ]] || continue
    while (($(jobs -rp | wc -l) >= jobs_at_once)); do wait -n || true; done
    check_and_record "$file" &
done

# The round trip through polyfuse itself (golden mode): its CUDA is the
# golden file and its `--emit ptx` this script's PTX of that file, so
# the golden files stand for what polyfuse emits and compiles.
round_trip_failures=()
if [[ $from == golden ]]; then
    probe=examples/gemm.json
    rt="$work/round-trip"
    status=0
    polyfuse_to "$rt.cu" "$rt.cu.err" schedule "$probe" --emit cuda || status=$?
    if ((status != 0)); then
        round_trip_failures+=("$probe: --emit cuda failed (status $status): $(first_line "$rt.cu.err")")
    elif ! cmp -s "$rt.cu" "$(golden_cuda "$probe")"; then
        round_trip_failures+=("$probe: --emit cuda differs from its golden file (run cargo test --test integration golden::)")
    else
        polyfuse_to "$rt.ptx" "$rt.ptx.err" schedule "$probe" --emit ptx --arch sm_90 || status=$?
        if ((status != 0)); then
            round_trip_failures+=("$probe: --emit ptx --arch sm_90 failed (status $status): $(first_line "$rt.ptx.err")")
        elif ! python3 "$root/scripts/nvrtc.py" "$rt.cu" sm_90 "$rt.nvrtc.ptx" 2>"$rt.nvrtc.err"; then
            round_trip_failures+=("$probe: scripts/nvrtc.py failed: $(first_line "$rt.nvrtc.err")")
        elif ! cmp -s "$rt.ptx" "$rt.nvrtc.ptx"; then
            round_trip_failures+=("$probe: polyfuse's --emit ptx differs from scripts/nvrtc.py's PTX of the same CUDA")
        else
            say "$probe: polyfuse's --emit cuda is the golden file and its --emit ptx is NVRTC's PTX of it"
        fi
    fi
fi
wait

rows=()     # one line per kernel, in the programs' order
failures=() # one line per failing program
wgmma_programs=() # programs whose wgmma path was assembled for sm_90a
for file in "${programs[@]}"; do
    [[ -n $file ]] || continue
    name=$(basename "$file" .json)
    case "$file" in
        bench/*) name="bench/$name" ;;
    esac
    base=$(result_base "$file")
    # A job that a failing command stopped (set -e) wrote no marker: a
    # failure, not a program silently left out.
    if [[ ! -f $base.done ]]; then
        failures+=("$name: its check stopped before the end (see the messages above)")
    fi
    if [[ -f $base.rows ]]; then while IFS= read -r line; do rows+=("$line"); done <"$base.rows"; fi
    if [[ -f $base.fail ]]; then while IFS= read -r line; do failures+=("$line"); done <"$base.fail"; fi
    if [[ -f $base.wgmma ]]; then wgmma_programs+=("$name"); fi
done
if ((${#round_trip_failures[@]})); then failures+=("${round_trip_failures[@]}"); fi

{
    printf 'program\tkernel\tregisters\tsmem_bytes\tspill_stores\tspill_loads\tstack_frame\n'
    if ((${#rows[@]})); then printf '%s\n' "${rows[@]}"; fi
} | column -t -s $'\t'

if ((${#failures[@]})); then
    echo
    echo "cuda-compile-check: ${#failures[@]} of ${#programs[@]} programs FAILED:"
    printf '  %s\n' "${failures[@]}"
    exit 1
fi
echo "cuda-compile-check: ${#programs[@]} programs, ${#rows[@]} kernels: all compiled for sm_90; wgmma paths assembled for sm_90a: ${#wgmma_programs[@]} (${wgmma_programs[*]:-none})"
