//! A product's epilogue in the product's tensor-core kernel, in the forms
//! a user writes it (issue 35's "near variants"): into another tensor
//! through an f32 accumulator temp, with a cast, transposed, after an
//! in-place step, in bf16; and, where the accumulator is read elsewhere,
//! not moved (the accumulator must reach memory). Each checks on the CPU
//! and in the emulation of the GPU mapping, at sizes off every tile.

use std::process::{Command, Output};

fn polyfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn scratch(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("polyfuse-epilogue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    file
}

/// A product of `dtype` operands through an f32 `acc`, then `body`.
fn program(dtype: &str, outputs: &str, body: &[&str]) -> String {
    let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"{{"name": "epi", "params": {{"M": 4096, "N": 4096, "K": 4096}},
            "inputs": {{"A": {{"dtype": "{dtype}", "shape": ["M", "K"]}},
                       "B": {{"dtype": "{dtype}", "shape": ["K", "N"]}},
                       "bias": {{"dtype": "{dtype}", "shape": ["N"]}}}},
            "outputs": {{ {outputs} }},
            "temps": {{"acc": {{"dtype": "f32", "shape": ["M", "N"]}}}},
            "body": ["acc(m, n) +=! f32(A(m, k)) * f32(B(k, n))", {}]}}"#,
        body.join(", ")
    )
}

/// The CUDA the default prints at the file's sizes (4096^3: isl's own
/// grouping keeps no tiles there), and the check at sizes off the tiles.
fn cuda_and_checks(name: &str, json: &str) -> String {
    let file = scratch(name, json);
    let f = file.to_str().unwrap();
    let out = polyfuse(&["schedule", f, "--emit", "cuda"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cuda = String::from_utf8_lossy(&out.stdout).into_owned();
    for target in ["cpu", "emulate"] {
        let out = polyfuse(&[
            "run", f, "--target", target, "--check", "--param", "M=77", "--param", "N=90",
            "--param", "K=70",
        ]);
        assert!(
            text(&out).contains("check: ok"),
            "{name} {target}: {}",
            text(&out)
        );
    }
    cuda
}

#[test]
fn an_epilogue_into_another_tensor_runs_in_the_product_kernel() {
    let f16 = r#""D": {"dtype": "f16", "shape": ["M", "N"]}"#;
    let cases = [
        (
            "cast",
            program(
                "f16",
                f16,
                &["D(m, n) = f16(tanh(acc(m, n) + f32(bias(n))))"],
            ),
        ),
        (
            "bf16",
            program(
                "bf16",
                r#""D": {"dtype": "bf16", "shape": ["M", "N"]}"#,
                &["D(m, n) = bf16(max(acc(m, n) + f32(bias(n)), 0))"],
            ),
        ),
        (
            "in_place_then_moved",
            program(
                "f16",
                f16,
                &[
                    "acc(m, n) = acc(m, n) + f32(bias(n))",
                    "D(i, j) = f16(acc(i, j) * sigmoid(acc(i, j)))",
                ],
            ),
        ),
        (
            "transposed",
            program(
                "f16",
                r#""D": {"dtype": "f16", "shape": ["N", "M"]}"#,
                &["D(j, i) = f16(acc(i, j) + f32(bias(j)))"],
            ),
        ),
    ];
    for (name, json) in cases {
        let cuda = cuda_and_checks(name, &json);
        // One kernel; the accumulator stays in registers and the value
        // moved to D is what is stored.
        assert_eq!(cuda.matches("__global__").count(), 1, "{name}\n{cuda}");
        assert!(cuda.contains("pf_dv"), "{name}\n{cuda}");
    }
}

/// The accumulator is an output, or read again after the epilogue: it
/// must reach memory, so it is not moved; an output of a type the region
/// does not store (f8) is not moved to either. Each program still checks.
#[test]
fn an_accumulator_read_elsewhere_is_stored() {
    let cases = [
        (
            "acc_read_later",
            program(
                "f16",
                r#""D": {"dtype": "f16", "shape": ["M", "N"]}, "E": {"dtype": "f32", "shape": ["M"]}"#,
                &[
                    "D(m, n) = f16(acc(m, n) + f32(bias(n)))",
                    "E(m) +=! acc(m, n)",
                ],
            ),
        ),
        (
            "acc_an_output",
            program(
                "f16",
                r#""D": {"dtype": "f16", "shape": ["M", "N"]}, "acc": {"dtype": "f32", "shape": ["M", "N"]}"#,
                &["D(m, n) = f16(acc(m, n))"],
            )
            .replace(r#""temps": {"acc": {"dtype": "f32", "shape": ["M", "N"]}},"#, ""),
        ),
        (
            "f8_output",
            program(
                "f16",
                r#""D": {"dtype": "f8e4m3", "shape": ["M", "N"]}"#,
                &["D(m, n) = f8e4m3(acc(m, n) * 0.01)"],
            ),
        ),
    ];
    for (name, json) in cases {
        let cuda = cuda_and_checks(name, &json);
        assert!(!cuda.contains("pf_dv"), "{name}\n{cuda}");
    }
}
