#!/usr/bin/env bash
# Everything CI checks: formatting, lints (warnings are errors) and the tests.
# Extra arguments go to `cargo test`, e.g. scripts/test.sh --test examples
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

scripts/setup.sh
cargo fmt --check
# Clippy's lints (warnings are errors) run inside the build of the tests:
# `cargo clippy` is `cargo check` with clippy-driver wrapping rustc for
# this crate's targets, and wrapping the build instead makes one
# compilation of the dependencies serve both, not a check of them and
# then a build (about two minutes less on a fresh 2-core machine). Every
# target is linted (`--all-targets`, the benches included). Exported, so
# that the cargo commands below (and abi-test.sh's) see the same build
# and compile nothing again. SEPARATE_CLIPPY=1 runs `cargo clippy` first
# instead, as before.
if [[ -n ${SEPARATE_CLIPPY:-} ]]; then
    cargo clippy --all-targets -- -D warnings
else
    clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
    [[ -x $clippy_driver ]] || {
        echo "test.sh: clippy-driver not found at $clippy_driver (rustup component add clippy)" >&2
        exit 1
    }
    export RUSTC_WORKSPACE_WRAPPER=$clippy_driver
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
fi
# The tests compile hundreds of small C programs (the CPU targets and the
# GPU emulation, at check sizes); -O0 compiles them about four times as
# fast. tests/examples.rs keeps -O2 for its tiled CPU runs.
export POLYFUSE_CFLAGS=${POLYFUSE_CFLAGS:--O0}
cargo test --no-run --all-targets

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
