#!/usr/bin/env bash
# Everything CI checks: formatting, lints (warnings are errors) and the tests.
# Extra arguments go to `cargo test`, e.g. scripts/test.sh --test examples
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

scripts/setup.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# The tests compile hundreds of small C programs (the CPU targets and the
# GPU emulation, at check sizes); -O0 compiles them about four times as
# fast. tests/examples.rs keeps -O2 for its tiled CPU runs.
POLYFUSE_CFLAGS=${POLYFUSE_CFLAGS:--O0} cargo test "$@"
scripts/abi-test.sh   # the C ABI: header vs exports, C99 and C++ programs, valgrind
scripts/cuda-compile-check.sh   # CUDA of every example and bench program through NVRTC and ptxas for sm_90 (no GPU)
