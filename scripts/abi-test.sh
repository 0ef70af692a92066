#!/usr/bin/env bash
# CI for the C ABI: builds libpolyfuse (cdylib and staticlib), checks that
# include/polyfuse.h agrees with the exports (scripts/check-abi.sh), builds
# the C99 check (shared and static), the C99 context-order check and the
# C++17 gemm example with gcc and g++, runs them, and runs them under
# valgrind, failing on any memory error or definite leak. (The registries of live handles are static hash tables,
# which valgrind may count as "possibly lost" at exit; those are not leaks.)
#
# usage: scripts/abi-test.sh     (run by scripts/test.sh after cargo test)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# What this script needs beyond scripts/setup.sh: g++ for the C++ example,
# valgrind, python3 and nm (binutils) for the drift check. Missing ones are
# installed with apt-get, as setup.sh does.
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

cargo build --lib
scripts/check-abi.sh --lib target/debug/libpolyfuse.so
make -s -C examples/cpp CC=gcc CXX=g++ all

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
