//! The check's rule (spec, "Numerics"): an output passes when its error
//! against the f64 reference is at most the larger of its dtype's bound and
//! twice the error of the declared-precision run (the unoptimised program
//! with every stored value rounded to its dtype). On the CPU and the CPU
//! emulation of the GPU mapping; the CUDA target applies the same
//! `runtime::data::compare` to the same reference outputs.

use polyfuse::frontend::ast::DType;
use polyfuse::frontend::load_str;
use polyfuse::gpu::GpuOptions;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::runtime::data::{tolerance, CheckResult};
use polyfuse::{compile, Compiled, Options};

/// LayerNorm-like normalised rows stored in a temp `Y` of dtype `temp`,
/// then a product into an f32 output. Sizes off every tile grid.
fn normalised_product(temp: &str) -> String {
    format!(
        r#"{{
  "name": "normalised_product_{temp}",
  "params": {{"M": 67, "K": 130, "N": 45}},
  "inputs": {{
    "X": {{"dtype": "f32", "shape": ["M", "K"]}},
    "W": {{"dtype": "f32", "shape": ["K", "N"]}}
  }},
  "outputs": {{"O": {{"dtype": "f32", "shape": ["M", "N"]}}}},
  "temps": {{
    "Mean": {{"dtype": "f32", "shape": ["M"]}},
    "Var": {{"dtype": "f32", "shape": ["M"]}},
    "Y": {{"dtype": "{temp}", "shape": ["M", "K"]}}
  }},
  "body": [
    "Mean(i) +=! X(i, k) / f32(K)",
    "Var(i) +=! (X(i, k) - Mean(i)) * (X(i, k) - Mean(i)) / f32(K)",
    "Y(i, k) = (X(i, k) - Mean(i)) * rsqrt(Var(i) + 1e-5)",
    "O(i, j) +=! f32(Y(i, k)) * W(k, j)"
  ]
}}"#
    )
}

fn compiled(json: &str, gpu: bool) -> Compiled {
    let p = load_str(json, "numerics.json").unwrap();
    let options = Options {
        gpu: gpu.then(GpuOptions::default),
        ..Options::default()
    };
    compile(&p, &options).unwrap()
}

fn check(c: &Compiled) -> CheckResult {
    let opts = RunOptions {
        check: true,
        bench_runs: 0,
        seed: 1,
    };
    run(c, &opts).unwrap().check.unwrap()
}

/// The checks of `json` on the CPU and of its GPU mapping emulated.
fn checks(json: &str) -> Vec<(&'static str, CheckResult)> {
    let cpu = compiled(json, false);
    let mut emulated = compiled(json, true);
    emulated.kernel_c = emulated.emulation_c.clone().unwrap();
    vec![("cpu", check(&cpu)), ("emulate", check(&emulated))]
}

#[test]
fn an_f16_temp_costs_f16_rounding_and_the_check_allows_twice_that() {
    let c = compiled(&normalised_product("f16"), false);
    // The declared-precision run rounds the stores into Y to f16.
    let reference = c.reference_c.as_deref().unwrap();
    assert!(reference.contains("void pf_declared("), "{reference}");
    assert!(reference.contains("(_Float16)"), "{reference}");
    for (target, r) in checks(&normalised_product("f16")) {
        let line = r.line();
        assert!(r.ok, "{target}: {line}");
        // Over the f32 bound alone: the check as it was failed this program
        // (`polyfuse run --check`, seed 0: 1.477e-2 against 1e-4).
        assert!(r.max_rel_err > tolerance(DType::F32), "{target}: {line}");
        // f16 rounding of the normalised rows (2^-11 relative), magnified
        // where the product cancels: far from zero, far from f16's whole
        // bound.
        assert!(
            r.declared_rel_err > 1e-3 && r.declared_rel_err < 1e-1,
            "{target}: {line}"
        );
        let o = &r.per_output[0];
        assert_eq!(o.bound, 2.0 * o.declared, "{target}: {line}");
        assert!(o.bound_from_declared());
        assert!(
            line.starts_with(&format!(
                "check: ok max relative error {:.3e} (declared precision: {:.3e}) [O (f32): ",
                r.max_rel_err, r.declared_rel_err
            )),
            "{target}: {line}"
        );
        assert!(line.contains("= 2 x declared]"), "{target}: {line}");
    }
}

#[test]
fn an_all_f32_program_keeps_the_f32_bound() {
    for (target, r) in checks(&normalised_product("f32")) {
        let line = r.line();
        assert!(r.ok, "{target}: {line}");
        // f32 rounding of the stores (the product's running sum among
        // them): about 1e-5 where the sum cancels, below half the f32
        // bound, so the bound stays the dtype's.
        assert!(
            r.declared_rel_err > 0.0 && r.declared_rel_err < 0.5 * tolerance(DType::F32),
            "{target}: {line}"
        );
        let o = &r.per_output[0];
        assert_eq!(o.bound, tolerance(DType::F32), "{target}: {line}");
        assert!(!o.bound_from_declared());
        assert!(line.ends_with(" <= 1e-4]"), "{target}: {line}");
    }
}

/// `c` with its kernel followed by `corrupt`, C run with `float *o` the
/// output `O` (tensor 2: inputs, then outputs) of `n` elements.
fn corrupted(mut c: Compiled, corrupt: &str) -> Compiled {
    c.kernel_c = format!(
        "{}\nvoid pf_kernel(const long *pf_params, void **pf_tensors) {{\n  pf_kernel_real(pf_params, pf_tensors);\n  float *o = (float *)pf_tensors[2];\n  const long n = 67 * 45;\n  {corrupt}\n}}\n",
        c.kernel_c.replace("void pf_kernel(", "void pf_kernel_real(")
    );
    c
}

#[test]
fn a_wrong_result_still_fails_with_an_f16_temp() {
    let json = normalised_product("f16");
    let c = compiled(&json, false);
    let good = check(&c);
    assert!(good.ok, "{}", good.line());
    // One element moved by 5% of the largest output: an error of at least
    // 5e-2 against a bound of twice the declared-precision error (3e-2).
    let one = corrupted(
        c.clone(),
        "float m = 0; for (long e = 0; e < n; e++) m = fmaxf(m, fabsf(o[e]));\n  o[1234] += 0.05f * m;",
    );
    let r = check(&one);
    assert!(!r.ok, "{}", r.line());
    assert!(r.line().starts_with("check: FAILED"), "{}", r.line());
    assert!(r.line().contains("worst at O[flat 1234]"), "{}", r.line());
    // The allowance was in effect, and was not enough.
    assert_eq!(r.declared_rel_err, good.declared_rel_err);
    assert!(r.per_output[0].bound_from_declared());
    assert!(r.max_rel_err > r.per_output[0].bound, "{}", r.line());

    // A realistic bug: the product's kernel misses its last reduction
    // step (the kernel of `where k < K - 1`, checked against the program).
    let bug = json.replace(
        "\"O(i, j) +=! f32(Y(i, k)) * W(k, j)\"",
        "\"O(i, j) +=! f32(Y(i, k)) * W(k, j) where k < K - 1\"",
    );
    assert_ne!(bug, json);
    let mut wrong = c.clone();
    wrong.kernel_c = compiled(&bug, false).kernel_c;
    let r = check(&wrong);
    assert!(!r.ok, "{}", r.line());
    assert_eq!(r.declared_rel_err, good.declared_rel_err);
}

/// `run --check` prints both errors; `--json` gives both, per output too,
/// with the bound applied.
#[test]
fn the_command_line_reports_the_declared_precision_error() {
    let dir = std::env::temp_dir().join(format!("polyfuse-numerics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("normalised_product_f16.json");
    std::fs::write(&file, normalised_product("f16")).unwrap();
    let run = |json: bool| {
        let mut args = vec!["run", file.to_str().unwrap(), "--check", "--target", "cpu"];
        if json {
            args.push("--json");
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let text = run(false);
    let line = text.lines().find(|l| l.starts_with("check: ")).unwrap();
    assert!(line.starts_with("check: ok max relative error "), "{line}");
    assert!(line.contains(" (declared precision: "), "{line}");
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let check = &v["check"];
    let declared = check["declared_rel_error"].as_f64().unwrap();
    assert!(declared > 1e-3, "{check}");
    let o = &check["outputs"][0];
    assert_eq!(o["name"], "O");
    assert_eq!(o["bound"].as_f64().unwrap(), 2.0 * declared);
    assert!(check["max_rel_error"].as_f64().unwrap() <= 2.0 * declared);
    let _ = std::fs::remove_dir_all(&dir);
}
