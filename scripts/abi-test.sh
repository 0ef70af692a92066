#!/usr/bin/env bash
# CI for the C ABI: builds libpolyfuse (cdylib and staticlib), checks that
# the functions include/polyfuse.h declares are the library's exported pf_
# symbols (nm; that the header is what cbindgen makes of src/capi is
# tests/integration/capi_header.rs's check, under cargo test), builds
# the C99 check (shared and static), the C99 context-order check and the
# C++17 gemm example with gcc and g++, runs them, and runs them under
# valgrind, failing on any memory error or definite leak. (The registries of live handles are static hash tables,
# which valgrind may count as "possibly lost" at exit; those are not leaks.)
#
# It also compiles the PyTorch extension's ABI-facing part
# (examples/torch/polyfuse_ext_core.cpp, which includes polyfuse.h and no
# torch header) with g++ and runs its check (core_check.cpp), so CI builds
# the extension's C++ against the header where torch is not installed, and
# tests the Python module's call handling with a fake extension.
#
# usage: scripts/abi-test.sh     (run by scripts/test.sh beside cargo test)
# ABI_PROFILE=release uses `cargo build --release` and target/release
# (default: debug).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# What this script needs beyond scripts/setup.sh: g++ for the C++ example,
# valgrind, python3 for the torch module's test and nm (binutils) for the
# exports check. Missing ones are installed with apt-get, as setup.sh does.
declare -A package_of=([g++]=g++ [valgrind]=valgrind [python3]=python3 [nm]=binutils [make]=make)
packages=()
for tool in g++ valgrind python3 nm make; do
    command -v "$tool" > /dev/null 2>&1 || packages+=("${package_of[$tool]}")
done
if ((${#packages[@]} > 0)); then
    as_root=(env DEBIAN_FRONTEND=noninteractive)
    [[ $(id -u) -eq 0 ]] || as_root=(sudo "${as_root[@]}")
    echo "abi-test: installing ${packages[*]} with apt-get" >&2
    "${as_root[@]}" apt-get update -qq >&2
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
fi

# The header is generated from the Rust definitions, so it declares what
# they define; what only the built library shows is a `pf_` function that
# is exported but not declared (defined outside src/capi, where cbindgen
# does not look) or declared but not exported (a linker script or
# visibility change). Declarations start a line in the generated header;
# comments never do.
check_exports() {
    local declared exported
    declared=$(grep -E '^[a-z]' include/polyfuse.h | grep -oE '\bpf_[a-z0-9_]+\(' | tr -d '(' | sort -u)
    exported=$(nm -D --defined-only "$1" | awk '$2 == "T" && $3 ~ /^pf_/ { print $3 }' | sort -u)
    if [[ "$declared" != "$exported" ]]; then
        echo "abi-test: include/polyfuse.h's functions (<) and $1's exports (>) differ:" >&2
        diff <(echo "$declared") <(echo "$exported") >&2 || true
        exit 1
    fi
    echo "abi-test: the header's $(echo "$declared" | wc -l) functions are the library's exports"
}

profile=${ABI_PROFILE:-debug}
case "$profile" in
    # `--lib --tests`: the library as `cargo test` builds it (the
    # test targets' features), so that after `cargo test` (scripts/test.sh)
    # nothing is compiled again.
    debug) cargo build --lib --tests ;;
    release) cargo build --release --lib ;;
    *) echo "abi-test: ABI_PROFILE is debug or release, not $profile" >&2; exit 2 ;;
esac
check_exports "target/$profile/libpolyfuse.so"
make -s -C examples/cpp CC=gcc CXX=g++ PROFILE="$profile" all
make -s -C examples/torch -f core.mk CXX=g++ PROFILE="$profile" all

bin=target/cpp-examples
echo "== abi_check (shared)"
"$bin/abi_check" examples/gemm.json
echo "== abi_check (static)"
"$bin/abi_check_static" examples/gemm.json
echo "== gemm"
"$bin/gemm" examples/gemm.json > "$bin/gemm.out"
head -n 4 "$bin/gemm.out"
tail -n 1 "$bin/gemm.out"

echo "== context_order"
"$bin/context_order" examples/gemm.json

echo "== torch extension core (no torch)"
target/torch-core/core_check examples
echo "== polyfuse_torch's calls (no torch: a fake extension)"
python3 -B examples/torch/test_polyfuse_torch.py

for prog in abi_check gemm context_order; do
    echo "== valgrind $prog"
    log="$bin/$prog.valgrind"
    if ! valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite \
        --show-leak-kinds=definite --error-exitcode=1 --log-file="$log" \
        "$bin/$prog" examples/gemm.json > /dev/null; then
        cat "$log" >&2
        echo "abi-test: valgrind found errors or definite leaks in $prog" >&2
        exit 1
    fi
    echo "no memory errors, no definite leaks"
done
echo "abi-test: ok"
