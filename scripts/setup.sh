#!/usr/bin/env bash
# Makes a polyfuse build possible on a fresh Debian/Ubuntu machine that has
# only Rust and gcc.
#
# The isl-rs crate builds its bundled copy of isl with
# `./autogen.sh && ./configure && make`, which needs autoconf, automake,
# libtool and make; `polyfuse run --target cpu` compiles the generated C with
# `cc`. Whatever of these is missing is installed with apt-get. When all of
# it is present the script does nothing and prints nothing, so it is safe to
# run before every build.
set -euo pipefail

fail() {
    echo "polyfuse setup: $*" >&2
    exit 1
}

# tool -> Debian package that provides it
declare -A package_of=(
    [autoreconf]=autoconf
    [aclocal]=automake
    [automake]=automake
    [libtoolize]=libtool
    [make]=make
    [cc]=gcc
)

missing_tools=()
packages=()
for tool in autoreconf aclocal automake libtoolize make cc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        missing_tools+=("$tool")
        pkg=${package_of[$tool]}
        case " ${packages[*]-} " in
            *" $pkg "*) ;;
            *) packages+=("$pkg") ;;
        esac
    fi
done

if ((${#missing_tools[@]} > 0)); then
    # pkg-config is not strictly needed, but harmless and often expected by
    # configure scripts.
    packages+=(pkg-config)

    command -v apt-get >/dev/null 2>&1 ||
        fail "missing ${missing_tools[*]}, and apt-get is not available; install ${packages[*]} by hand"

    if [[ $(id -u) -eq 0 ]]; then
        as_root=(env DEBIAN_FRONTEND=noninteractive)
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
    else
        fail "missing ${missing_tools[*]}; not root and no sudo, so cannot install ${packages[*]}; install them by hand"
    fi

    echo "polyfuse setup: missing ${missing_tools[*]}; installing ${packages[*]} with apt-get" >&2
    "${as_root[@]}" apt-get update -qq >&2 ||
        fail "apt-get update failed"
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2 ||
        fail "apt-get install ${packages[*]} failed"

    for tool in "${missing_tools[@]}"; do
        command -v "$tool" >/dev/null 2>&1 ||
            fail "$tool is still missing after installing ${packages[*]}"
    done
fi

command -v cargo >/dev/null 2>&1 ||
    fail "cargo not found; install Rust (https://rustup.rs) first"
