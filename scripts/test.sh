#!/usr/bin/env bash
# Everything CI checks: formatting, lints (warnings are errors) and the tests.
# Extra arguments go to `cargo test`, e.g. scripts/test.sh --test integration examples::
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

scripts/setup.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# The tests compile hundreds of small C programs (the CPU targets and the
# GPU emulation, at check sizes); -O0 compiles them about four times as
# fast. tests/integration/examples.rs keeps -O2 for its tiled CPU runs.
export POLYFUSE_CFLAGS=${POLYFUSE_CFLAGS:--O0}
cargo test --no-run "$@"

# The C ABI's checks (valgrind) and the CUDA compile check (NVRTC, ptxas)
# need no more building, so they run beside the tests: cargo test keeps
# the two cores of a small machine busy only about 85% of the time (a
# test binary's last tests run alone). Their output is printed after the
# tests', whole.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# the C ABI: header vs exports, C99 and C++ programs, valgrind
scripts/abi-test.sh >"$logs/abi" 2>&1 &
abi=$!
# CUDA of every example and bench program through NVRTC and ptxas for
# sm_90 (no GPU)
POLYFUSE="$root/target/debug/polyfuse" scripts/cuda-compile-check.sh >"$logs/cuda" 2>&1 &
cuda=$!

tests=0
cargo test "$@" || tests=$?
abi_status=0
wait "$abi" || abi_status=$?
cuda_status=0
wait "$cuda" || cuda_status=$?
echo "== scripts/abi-test.sh (exit $abi_status)"
cat "$logs/abi"
echo "== scripts/cuda-compile-check.sh (exit $cuda_status)"
cat "$logs/cuda"
if ((tests != 0)); then
    echo "test.sh: cargo test failed (exit $tests)" >&2
fi
if ((abi_status != 0)); then
    echo "test.sh: scripts/abi-test.sh failed (exit $abi_status)" >&2
fi
if ((cuda_status != 0)); then
    echo "test.sh: scripts/cuda-compile-check.sh failed (exit $cuda_status)" >&2
fi
((tests == 0 && abi_status == 0 && cuda_status == 0))
