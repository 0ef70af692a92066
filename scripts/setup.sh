#!/usr/bin/env bash
# Makes a polyfuse build possible on a fresh Debian/Ubuntu machine that has
# Rust and a C compiler.
#
# The build needs nothing else: isl is vendored in vendor/isl-rs and compiled
# by its build script with the `cc` crate (no autotools, no make). The C
# compiler `cc` serves that build and `polyfuse run --target cpu`, which
# compiles the generated C. When `cc` is missing, gcc is installed with
# apt-get (using sudo when not root). When everything is present the script
# does nothing and prints nothing, so it is safe to run before every build.
set -euo pipefail

fail() {
    echo "polyfuse setup: $*" >&2
    exit 1
}

if ! command -v cc >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 ||
        fail "no C compiler (cc), and apt-get is not available; install gcc or clang by hand"

    if [[ $(id -u) -eq 0 ]]; then
        as_root=(env DEBIAN_FRONTEND=noninteractive)
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
    else
        fail "no C compiler (cc); not root and no sudo, so cannot install gcc; install it by hand"
    fi

    echo "polyfuse setup: no C compiler (cc); installing gcc with apt-get" >&2
    "${as_root[@]}" apt-get update -qq >&2 ||
        fail "apt-get update failed"
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends gcc libc6-dev >&2 ||
        fail "apt-get install gcc failed"

    command -v cc >/dev/null 2>&1 ||
        fail "cc is still missing after installing gcc"
fi

command -v cargo >/dev/null 2>&1 ||
    fail "cargo not found; install Rust (https://rustup.rs) first"
