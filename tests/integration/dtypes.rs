//! The dtypes after the first five: i64, u8, bool, f8e4m3 and f8e5m2
//! (spec, "Keys" and "Numerics"). Programs in `tests/programs/dtypes/`
//! use each of them as inputs, outputs and temps, with casts, comparisons
//! stored to bool, an f8 product dequantised to f32, i64 index arithmetic
//! past 2^31, a u8 image scaled to f32 and integer, u8 and bool products
//! (register tiles of each), at sizes off every tile grid;
//! each runs with `--check` on the CPU and in the emulation of the GPU
//! mapping under every strategy. The 8-bit float conversions of the
//! generated C are compared with the runtime's (which the unit tests of
//! `runtime::data` hold to known values), and the type checker's messages
//! for the new types are checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use polyfuse::frontend::ast::DType;
use polyfuse::frontend::load_str;
use polyfuse::runtime::data::{fp8_from_f64, fp8_to_f64};

fn programs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/dtypes");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    assert!(v.len() >= 5, "{v:?}");
    v
}

fn polyfuse(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn every_new_dtype_checks_on_the_cpu_and_in_the_emulation_under_every_strategy() {
    let mut failures = Vec::new();
    for p in programs() {
        let file = p.to_str().unwrap();
        for target in ["cpu", "emulate"] {
            for strategy in [None, Some("isl"), Some("min"), Some("max")] {
                let mut args = vec!["run", file, "--check", "--target", target];
                if let Some(s) = strategy {
                    args.extend(["--strategy", s]);
                }
                let (ok, text) = polyfuse(&args);
                if !ok || !text.contains("check: ok") {
                    failures.push(format!("{}: {text}", args.join(" ")));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Untiled, and with small blocks and grids (threads and blocks running
/// several points each): the same programs still check.
#[test]
fn new_dtypes_check_untiled_and_with_small_blocks() {
    let mut failures = Vec::new();
    for p in programs() {
        let file = p.to_str().unwrap();
        for extra in [
            &["--target", "cpu", "--no-tile"][..],
            &["--target", "emulate", "--block", "8,4", "--grid", "2,2"][..],
        ] {
            let mut args = vec!["run", file, "--check"];
            args.extend(extra);
            let (ok, text) = polyfuse(&args);
            if !ok || !text.contains("check: ok") {
                failures.push(format!("{}: {text}", args.join(" ")));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The CUDA of every program includes `cuda_fp8.h` where it needs it, and
/// no contraction with an 8-bit float operand or output runs on tensor
/// cores (they take f16 and bf16 only): the ordinary path, never wrong.
/// Nor does one whose f16 operands are quantised by a cast
/// (`quantise_f16_operands.json`: `f32(f8e4m3(A(i, k)))`, `f32(u8(A(i, k)))`;
/// the tensor-core path took them for plain reads of `A` and computed `D`
/// with an error of 1.1e3).
#[test]
fn cuda_uses_cuda_fp8_and_keeps_fp8_contractions_off_tensor_cores() {
    for p in programs() {
        let (ok, cuda) = polyfuse(&["schedule", p.to_str().unwrap(), "--emit", "cuda"]);
        assert!(ok, "{}: {cuda}", p.display());
        let name = p.file_stem().unwrap().to_str().unwrap();
        let fp8 = std::fs::read_to_string(&p).unwrap().contains("f8e");
        assert_eq!(cuda.contains("#include <cuda_fp8.h>"), fp8, "{name}");
        assert!(!cuda.contains("mma"), "{name}: tensor cores");
    }
    // f16 operands into an f8 output: the fragments' store does not know
    // the output, so the contraction keeps the ordinary path, and checks.
    let dir = std::env::temp_dir().join(format!("polyfuse-dtypes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("f16_into_f8.json");
    std::fs::write(
        &file,
        r#"{ "name": "f16_into_f8", "params": {"M": 64, "N": 64, "K": 64},
             "inputs": {"A": {"dtype": "f16", "shape": ["M", "K"]}, "B": {"dtype": "f16", "shape": ["K", "N"]}},
             "outputs": {"C": {"dtype": "f8e4m3", "shape": ["M", "N"]}},
             "body": ["C(i, j) +=! A(i, k) * B(k, j)"] }"#,
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (ok, cuda) = polyfuse(&["schedule", f, "--emit", "cuda"]);
    assert!(ok && !cuda.contains("mma"), "{cuda}");
    for target in ["cpu", "emulate"] {
        let (ok, text) = polyfuse(&["run", f, "--check", "--target", target]);
        assert!(ok && text.contains("check: ok"), "{target}: {text}");
    }
}

/// The generated C's `pf_f2e4m3` / `pf_f2e5m2` / `pf_e4m3_2f` / `pf_e5m2_2f`
/// (CPU, emulation, declared-precision run) against the runtime's
/// conversions (inputs, outputs), over a sweep of f32 bit patterns and
/// every byte.
#[test]
fn c_fp8_conversions_agree_with_the_runtime() {
    let dir = std::env::temp_dir().join(format!("polyfuse-fp8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fp8.c");
    let bin = dir.join("fp8");
    let step: u64 = 9973;
    std::fs::write(
        &src,
        format!(
            "{}{}#include <stdio.h>\nint main(void) {{\n  for (unsigned long u = 0; u < (1ul << 32); u += {step}) {{ unsigned v = (unsigned)u; float f; memcpy(&f, &v, 4); putchar(pf_f2e4m3(f)); putchar(pf_f2e5m2(f)); }}\n  for (int b = 0; b < 256; b++) printf(\"%a %a\\n\", (double)pf_e4m3_2f(b), (double)pf_e5m2_2f(b));\n  return 0;\n}}\n",
            polyfuse::codegen::c::PRELUDE,
            polyfuse::codegen::c::DTYPE_HELPERS
        ),
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .args(["-O2", "-std=gnu11", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-lm")
        .status()
        .unwrap();
    assert!(status.success());
    let out = Command::new(&bin).output().unwrap().stdout;
    let mut at = 0;
    let mut u: u64 = 0;
    while u < 1 << 32 {
        let f = f32::from_bits(u as u32) as f64;
        assert_eq!(out[at], fp8_from_f64(DType::F8E4M3, f), "e4m3 of {f:e}");
        assert_eq!(out[at + 1], fp8_from_f64(DType::F8E5M2, f), "e5m2 of {f:e}");
        at += 2;
        u += step;
    }
    let text = String::from_utf8_lossy(&out[at..]).into_owned();
    for (b, line) in text.lines().enumerate() {
        let parse = |s: &str| -> f64 {
            // C's `%a`: [-]0x1.8p+3, inf, nan.
            let (neg, s) = s.strip_prefix('-').map_or((false, s), |r| (true, r));
            let v = if s == "inf" {
                f64::INFINITY
            } else if s.contains("nan") {
                f64::NAN
            } else {
                let s = s.strip_prefix("0x").unwrap();
                let (m, e) = s.split_once('p').unwrap();
                let (int, frac) = m.split_once('.').unwrap_or((m, ""));
                let mut v = i64::from_str_radix(int, 16).unwrap() as f64;
                for (k, c) in frac.chars().enumerate() {
                    v += c.to_digit(16).unwrap() as f64 / 16f64.powi(k as i32 + 1);
                }
                v * 2f64.powi(e.parse().unwrap())
            };
            if neg {
                -v
            } else {
                v
            }
        };
        let (a, c) = line.split_once(' ').unwrap();
        for (t, got) in [(DType::F8E4M3, parse(a)), (DType::F8E5M2, parse(c))] {
            let want = fp8_to_f64(t, b as u8);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{t} byte {b:#x}: C {got}, runtime {want}"
            );
        }
    }
}

fn error(body: &str, decls: &str) -> String {
    let json = format!(
        r#"{{"name": "t", "params": {{"N": 4}},
            "inputs": {{"X": {{"dtype": "f32", "shape": ["N"]}}, "U": {{"dtype": "u8", "shape": ["N"]}},
                        "L": {{"dtype": "i64", "shape": ["N"]}}, "B": {{"dtype": "bool", "shape": ["N"]}},
                        "E": {{"dtype": "f8e4m3", "shape": ["N"]}}}},
            "outputs": {{{decls}}},
            "body": ["{body}"]}}"#
    );
    match load_str(&json, "t.json") {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn type_rules_of_the_new_dtypes() {
    let f32_out = r#""Y": {"dtype": "f32", "shape": ["N"]}"#;
    let u8_out = r#""Y": {"dtype": "u8", "shape": ["N"]}"#;
    let bool_out = r#""Y": {"dtype": "bool", "shape": ["N"]}"#;
    let i64_out = r#""Y": {"dtype": "i64", "shape": ["N"]}"#;
    let i32_out = r#""Y": {"dtype": "i32", "shape": ["N"]}"#;
    // Accepted: the 8-bit floats compute in f32, u8 with i32, bool in any
    // type, comparisons are bools, every dtype is a cast.
    for (body, decl) in [
        ("Y(i) = E(i) * X(i)", f32_out),
        ("Y(i) = f32(U(i)) / 255 + B(i) * X(i)", f32_out),
        ("Y(i) = X(i) > 0", bool_out),
        ("Y(i) = X(i) * (X(i) > 0)", f32_out),
        ("Y(i) = B(i) ? X(i) : 0", f32_out),
        ("Y(i) = U(i) + 3", u8_out),
        ("Y(i) = U(i) * 2", i32_out),
        ("Y(i) = L(i) * 3 + i", i64_out),
        ("Y(i) = u8(X(i)) + bool(X(i))", u8_out),
        (
            "Y(i) = f8e4m3(X(i)) + f8e5m2(X(i)) + f32(bool(L(i)))",
            f32_out,
        ),
        ("Y(i) = i64(X(i)) + i64(U(i))", i64_out),
        ("Y(i) = bool(X(i))", bool_out),
        ("Y(i) max=! B(j) && X(j) > 0", bool_out),
    ] {
        assert_eq!(error(body, decl), "", "{body}");
    }
    // Refused, with a message that names the types and the cast to add.
    for (body, decl, says) in [
        ("Y(i) = U(i) * X(i)", f32_out, "is u8 (computed in i32)"),
        ("Y(i) = X(i)", bool_out, "add a cast such as bool(...)"),
        ("Y(i) = X(i)", u8_out, "add a cast such as u8(...)"),
        ("Y(i) = L(i) + U(i)", i64_out, "where i64 is expected"),
        ("Y(i) = L(i)", i32_out, "add a cast such as i32(...)"),
        (
            "Y(i) = exp(L(i))",
            i64_out,
            "needs a float argument, not i64",
        ),
        ("Y(i) = U(i) + 0.5", u8_out, "fractional literal"),
        ("Y(i) = X(i) ? 1 : 0", f32_out, "not a condition"),
        ("Y(i) = E(i)", i32_out, "f8e4m3 (computed in f32)"),
    ] {
        let e = error(body, decl);
        assert!(e.contains(says), "{body}: {e:?} should say {says:?}");
    }
    // Unknown dtypes list the spec's.
    let json = r#"{"name": "t", "params": {}, "inputs": {"A": {"dtype": "f8", "shape": [2]}}, "outputs": {}, "body": ["Y() = 1"]}"#;
    let e = load_str(json, "t.json").unwrap_err().to_string();
    assert!(
        e.contains("f32, f16, bf16, f64, i32, i64, u8, bool, f8e4m3, f8e5m2"),
        "{e}"
    );
}

/// A rank-0 input is read as `a()` and works on every target.
#[test]
fn a_rank_0_input_of_a_new_dtype() {
    let dir = std::env::temp_dir().join(format!("polyfuse-rank0-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rank0.json");
    std::fs::write(
        &file,
        r#"{ "name": "rank0", "params": {"N": 37},
             "inputs": {"X": {"dtype": "f8e4m3", "shape": ["N"]}, "s": {"dtype": "f8e5m2", "shape": []},
                        "k": {"dtype": "u8", "shape": []}, "b": {"dtype": "bool", "shape": []}},
             "outputs": {"Y": {"dtype": "f32", "shape": ["N"]}, "Z": {"dtype": "u8", "shape": []}},
             "body": ["Y(i) = X(i) * s() + f32(k()) * b()", "Z() +=! u8(X(i) * 100)"] }"#,
    )
    .unwrap();
    let f = file.to_str().unwrap();
    for target in ["cpu", "emulate"] {
        for strategy in ["isl", "min", "max"] {
            let (ok, text) = polyfuse(&[
                "run",
                f,
                "--check",
                "--target",
                target,
                "--strategy",
                strategy,
            ]);
            assert!(
                ok && text.contains("check: ok"),
                "{target} {strategy}: {text}"
            );
        }
    }
}
