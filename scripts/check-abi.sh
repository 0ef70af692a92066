#!/usr/bin/env bash
# Fails when include/polyfuse.h and the C ABI's Rust definitions (src/capi/)
# disagree: a `pf_` function declared but not defined or the reverse, or a
# parameter count, parameter type or return type that differs. With a built
# library it also compares the header with the library's exported `pf_`
# symbols (nm), so a definition that lost #[no_mangle] is caught too.
#
# usage: scripts/check-abi.sh [--header FILE] [--src DIR] [--lib FILE | --no-lib]
# Defaults: include/polyfuse.h, src/capi, target/debug/libpolyfuse.so when
# it exists.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
header="$root/include/polyfuse.h"
src="$root/src/capi"
lib="$root/target/debug/libpolyfuse.so"
[ -e "$lib" ] || lib=""
while [ $# -gt 0 ]; do
    case "$1" in
        --header) header="$2"; shift 2 ;;
        --src) src="$2"; shift 2 ;;
        --lib) lib="$2"; shift 2 ;;
        --no-lib) lib=""; shift ;;
        *) echo "check-abi: unknown argument $1" >&2; exit 2 ;;
    esac
done

exports=""
if [ -n "$lib" ]; then
    exports=$(nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^pf_/ { print $3 }')
fi

HEADER="$header" SRC="$src" EXPORTS="$exports" python3 - <<'PY'
import os, re, sys, glob

header_path, src_dir = os.environ["HEADER"], os.environ["SRC"]
exports = set(os.environ["EXPORTS"].split())
errors = []

# ---- the header --------------------------------------------------------
text = open(header_path).read()
text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
text = re.sub(r"//[^\n]*", " ", text)
text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
text = text.replace('extern "C" {', " ").replace("}", " } ")

C_BASE = {"char": "c_char", "void": "c_void", "int": "c_int", "int32_t": "i32",
          "int64_t": "i64", "uint32_t": "u32", "uint64_t": "u64", "size_t": "usize",
          "double": "f64", "float": "f32"}

# Function-pointer typedefs (`typedef void (*pf_log_fn)(...);`) are compared
# by name: the Rust side declares `pub type pf_log_fn = ... fn(...)` and
# takes `Option<pf_log_fn>`.
fn_typedefs = set(re.findall(r"typedef\s+[\w\s\*]+\(\s*\*\s*(\w+)\s*\)\s*\([^()]*\)\s*;", text))
text = re.sub(r"typedef\s+[\w\s\*]+\(\s*\*\s*\w+\s*\)\s*\([^()]*\)\s*;", " ", text)

c_typedefs = {}
for m in re.finditer(r"typedef\s+([^;{}]+?)\s*;", text):
    decl = m.group(1).strip()
    name = re.search(r"(\w+)$", decl).group(1)
    c_typedefs[name] = decl[: -len(name)].strip()

def c_type(tokens):
    """C type tokens (no parameter name) -> canonical Rust-like text."""
    stars = tokens.count("*")
    words = [t for t in tokens if t != "*"]
    first_star = tokens.index("*") if stars else len(tokens)
    base_const = "const" in tokens[:first_star]
    if "const" in tokens[first_star:]:
        raise ValueError("const pointers are not supported by the checker")
    base = [w for w in words if w not in ("const", "struct", "enum")]
    if len(base) != 1:
        raise ValueError("cannot read type " + " ".join(tokens))
    t = resolve_c(base[0])
    for i in range(stars):
        t = "*%s %s" % ("const" if i == 0 and base_const else "mut", t)
    return t

def resolve_c(name):
    if name in fn_typedefs:
        return "fn " + name
    if name in c_typedefs and c_typedefs[name] not in ("struct " + name,):
        inner = c_typedefs[name]
        if inner.startswith("struct ") and "*" not in inner:
            return name
        return c_type(tokenize(inner))
    return C_BASE.get(name, name)

def tokenize(s):
    return re.findall(r"\*|\w+", s)

def c_param(p):
    toks = tokenize(p)
    if "[" in p:
        raise ValueError("array parameters are not supported by the checker: " + p)
    # The last word is the parameter's name unless the type ends in `*` only.
    if len(toks) >= 2 and toks[-1] != "*" and toks[-1] not in ("const",):
        toks = toks[:-1]
    return c_type(toks)

header_fns = {}
for m in re.finditer(r"([\w\s\*]+?)\b(pf_\w+)\s*\(([^()]*)\)\s*;", text):
    ret, name, params = m.group(1), m.group(2), m.group(3).strip()
    ret_toks = [t for t in tokenize(ret) if t not in ("extern",)]
    try:
        r = "()" if ret_toks == ["void"] else c_type(ret_toks)
        ps = [] if params in ("", "void") else [c_param(p) for p in params.split(",")]
    except ValueError as e:
        errors.append("%s: %s" % (name, e)); continue
    if name in header_fns:
        errors.append("%s is declared twice in the header" % name)
    header_fns[name] = (ps, r)

# ---- the Rust definitions ---------------------------------------------
rust = ""
for f in sorted(glob.glob(os.path.join(src_dir, "**", "*.rs"), recursive=True)):
    rust += open(f).read() + "\n"
rust = re.sub(r"//[^\n]*", " ", rust)

rust_types = {}
for m in re.finditer(r"pub\s+type\s+(\w+)\s*=\s*([^;]+);", rust):
    rust_types[m.group(1)] = m.group(2).strip()

def rust_type(s):
    s = re.sub(r"\b(?:std|core|libc)::(?:ffi::|os::raw::)?", "", s)
    s = re.sub(r"Option\s*<\s*(\w+)\s*>", r"\1", s)
    if s.strip() in rust_types and "fn(" in rust_types[s.strip()].replace(" ", ""):
        return "fn " + s.strip()
    toks = re.findall(r"\*|\w+", s)
    out, i = [], 0
    while i < len(toks):
        if toks[i] == "*":
            out.append("*" + toks[i + 1]); i += 2
        else:
            out.append(toks[i]); i += 1
    base = out[-1]
    if base in rust_types:
        inner = rust_type(rust_types[base])
    else:
        inner = {"c_uint": "u32", "c_long": "i64"}.get(base, base)
    for q in reversed(out[:-1]):
        inner = "%s %s" % (q, inner)
    return inner

rust_fns = {}
pat = re.compile(r"(#\[(?:unsafe\()?no_mangle\)?\]\s*)?pub\s+(?:unsafe\s+)?extern\s+\"C\"\s+fn\s+(pf_\w+)\s*\(([^)]*)\)\s*(?:->\s*([^{]+?))?\s*\{", re.S)
for m in pat.finditer(rust):
    mangled, name, params, ret = m.group(1) is None, m.group(2), m.group(3), m.group(4)
    ps = []
    for p in [p for p in params.split(",") if p.strip()]:
        if ":" not in p:
            errors.append("%s: cannot read Rust parameter `%s`" % (name, p.strip())); continue
        ps.append(rust_type(p.split(":", 1)[1]))
    r = "()" if ret is None else rust_type(ret)
    if mangled:
        errors.append("%s: the Rust definition lacks #[no_mangle]" % name)
    rust_fns[name] = (ps, r)

# ---- compare ------------------------------------------------------------
for name in sorted(set(header_fns) | set(rust_fns)):
    if name not in rust_fns:
        errors.append("%s is declared in the header but not defined in %s" % (name, src_dir)); continue
    if name not in header_fns:
        errors.append("%s is defined in Rust but not declared in the header" % name); continue
    (hp, hr), (rp, rr) = header_fns[name], rust_fns[name]
    if len(hp) != len(rp):
        errors.append("%s: the header has %d parameters, Rust %d" % (name, len(hp), len(rp)))
    else:
        for i, (a, b) in enumerate(zip(hp, rp)):
            if a != b:
                errors.append("%s: parameter %d is `%s` in the header, `%s` in Rust" % (name, i + 1, a, b))
    if hr != rr:
        errors.append("%s: returns `%s` in the header, `%s` in Rust" % (name, hr, rr))

if exports:
    for name in sorted(set(header_fns) - exports):
        errors.append("%s is declared in the header but the library does not export it" % name)
    for name in sorted(exports - set(header_fns)):
        errors.append("the library exports %s, which the header does not declare" % name)

if errors:
    print("check-abi: the header and the C ABI disagree:", file=sys.stderr)
    for e in errors:
        print("  " + e, file=sys.stderr)
    sys.exit(1)
print("check-abi: ok, %d functions agree%s" % (len(header_fns), " (exports checked)" if exports else ""))
PY
