//! Factors out of sums (`repair::factor`): which sums give up a factor,
//! the three forms of the rewrite, the epilogue's domain where a sum
//! leaves elements without terms, refusals, and every rewritten program
//! checked against the f64 reference on the CPU and in the GPU emulation
//! at sizes off the tile grids.

use std::path::{Path, PathBuf};
use std::process::Command;

use polyfuse::frontend::{self, ast::AssignOp};
use polyfuse::isl::Isl;
use polyfuse::repair::factor;

fn polyfuse(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("polyfuse starts");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn program_file(tag: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("polyfuse-factor-{tag}-{}.json", std::process::id()));
    std::fs::write(&p, text).expect("temp file");
    p
}

fn hoisted(path: &Path) -> factor::Hoisted {
    let program = frontend::load_file(path).expect("loads");
    let isl = Isl::new();
    let scop = polyfuse::model::build(&isl, &program).expect("model");
    factor::hoist(&isl, &program, &scop).expect("hoist")
}

/// `--check` on the CPU and in the emulation, both `ok`.
fn checks(path: &Path, extra: &[&str]) {
    for target in ["cpu", "emulate"] {
        let p = path.to_str().unwrap();
        let mut args = vec!["run", p, "--target", target, "--check"];
        args.extend_from_slice(extra);
        let (code, out, err) = polyfuse(&args);
        assert_eq!(code, Some(0), "{p} on {target}:\n{out}\n{err}");
        assert!(out.contains("check: ok"), "{p} on {target}:\n{out}");
    }
}

#[test]
fn covariance_divides_once_per_element() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/suite/covariance.json");
    let h = hoisted(&path);
    let p = h.program.expect("covariance's division moves");
    let sum = p
        .statements
        .iter()
        .position(|s| s.lhs_tensor == "upper" && matches!(s.op, AssignOp::Reduce { .. }))
        .expect("the sum");
    assert!(
        !p.statements[sum].text.contains('/'),
        "{}",
        p.statements[sum].text
    );
    let epilogue = &p.statements[sum + 1];
    assert_eq!(epilogue.op, AssignOp::Assign);
    assert!(
        epilogue
            .text
            .starts_with("upper(i, j) = (upper(i, j) / f32(")
            && epilogue.text.ends_with("where j >= i"),
        "{}",
        epilogue.text
    );
    assert!(
        h.report.contains("moved out of its sum over k"),
        "{}",
        h.report
    );
    checks(&path, &["--param", "N=61", "--param", "M=37"]);
    // The user can keep the program as written.
    let (code, out, _) = polyfuse(&["schedule", path.to_str().unwrap(), "--emit", "deps"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("factor: statement 3"), "{out}");
    let (code, out, _) = polyfuse(&[
        "schedule",
        path.to_str().unwrap(),
        "--emit",
        "deps",
        "--repair",
        "off",
    ]);
    assert_eq!(code, Some(0));
    assert!(!out.contains("factor:"), "{out}");
}

/// Every form of the rewrite (in place, a new temp for a narrow target,
/// a new temp for `+=`), with a scalar, a per-row and a constant factor,
/// multiplying or dividing: rewritten, and checked.
#[test]
fn every_form_is_rewritten_and_checks() {
    let factors = [
        ("alpha() * A(i, k) * B(k, j)", "scalar"),
        ("A(i, k) * B(k, j) * s(i)", "row"),
        ("A(i, k) * B(k, j) / f32(K)", "divisor"),
    ];
    for dtype in ["f32", "f16"] {
        for init in [true, false] {
            for (body, tag) in factors {
                let (first, op) = if init {
                    (String::new(), "+=!")
                } else {
                    ("\"C(i, j) = f32(C0(i, j))\", ".to_string(), "+=")
                };
                let text = format!(
                    r#"{{"name": "f", "params": {{"M": 37, "N": 29, "K": 45}},
  "inputs": {{"A": {{"dtype": "f32", "shape": ["M", "K"]}}, "B": {{"dtype": "f32", "shape": ["K", "N"]}},
             "s": {{"dtype": "f32", "shape": ["M"]}}, "alpha": {{"dtype": "f32", "shape": []}},
             "C0": {{"dtype": "f32", "shape": ["M", "N"]}}}},
  "outputs": {{"C": {{"dtype": "{dtype}", "shape": ["M", "N"]}}}},
  "body": [{first}"C(i, j) {op} {body}"]}}"#
                );
                let path = program_file(&format!("{dtype}-{init}-{tag}"), &text);
                let h = hoisted(&path);
                let p = h
                    .program
                    .unwrap_or_else(|| panic!("{dtype} {op} {tag}: nothing moved\n{}", h.report));
                let in_place = init && dtype == "f32";
                let sum = p.statements.len() - 2;
                assert_eq!(
                    p.statements[sum].lhs_tensor == "C",
                    in_place,
                    "{dtype} {op} {tag}: {}",
                    p.statements[sum].text
                );
                assert_eq!(p.statements[sum + 1].lhs_tensor, "C");
                assert!(
                    matches!(p.statements[sum].op, AssignOp::Reduce { init: true, .. }),
                    "{}",
                    p.statements[sum].text
                );
                if !init {
                    assert!(
                        p.statements[sum + 1]
                            .text
                            .starts_with("C(i, j) = (C(i, j) + "),
                        "{}",
                        p.statements[sum + 1].text
                    );
                }
                checks(&path, &[]);
            }
        }
    }
}

/// A triangle leaves row 0 without terms: there the original keeps 0 and
/// never divides, so the epilogue (which divides by `i`) must not run on
/// it. Its domain starts at row 1, and the check would see the NaN of
/// `0 / 0` otherwise.
#[test]
fn an_element_without_terms_keeps_its_value() {
    let text = r#"{"name": "tri", "params": {"N": 37, "K": 41},
  "inputs": {"A": {"dtype": "f32", "shape": ["N", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
  "outputs": {"Y": {"dtype": "f32", "shape": ["N", "N"]}},
  "body": ["Y(i, j) +=! A(i, k) * B(k, j) / f32(i) where k < i"]}"#;
    let path = program_file("triangle", text);
    let h = hoisted(&path);
    let p = h.program.expect("moves");
    let epilogue = p.statements.last().unwrap();
    assert!(
        epilogue.text.contains("where i in 1:37"),
        "{}",
        epilogue.text
    );
    checks(&path, &[]);
}

/// Refused: the sum's elements are not a box with conditions of the
/// statement's own (`k >= i + j` leaves a triangle of elements without
/// terms that no clause on `i, j` names); row sums (one read); integer
/// sums; a factor that moves with the sum's index. Each program still
/// checks as written.
#[test]
fn refusals() {
    let triangle = r#"{"name": "t", "params": {"N": 23, "K": 40},
  "inputs": {"A": {"dtype": "f32", "shape": ["N", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
  "outputs": {"Y": {"dtype": "f32", "shape": ["N", "N"]}},
  "body": ["Y(i, j) +=! A(i, k) * B(k, j) / f32(j + 1) where k >= i + j"]}"#;
    let path = program_file("skew", triangle);
    let h = hoisted(&path);
    assert!(h.program.is_none());
    assert!(h.report.contains("stays in its sum"), "{}", h.report);
    checks(&path, &[]);

    for (tag, body, dtype) in [
        ("row", "Y(i) +=! X(i, k) / f32(K)", "f32"),
        ("int", "Y(i) +=! X(i, k) * X(k, i) * 3", "i32"),
        ("moving", "Y(i) +=! X(i, k) * X(k, i) / f32(k + 1)", "f32"),
    ] {
        let text = format!(
            r#"{{"name": "r", "params": {{"K": 31}},
  "inputs": {{"X": {{"dtype": "{dtype}", "shape": ["K", "K"]}}}},
  "outputs": {{"Y": {{"dtype": "{dtype}", "shape": ["K"]}}}},
  "body": ["{body}"]}}"#
        );
        let path = program_file(tag, &text);
        let h = hoisted(&path);
        assert!(h.program.is_none(), "{tag}: {}", h.report);
        assert!(h.report.is_empty(), "{tag}: {}", h.report);
    }
}

#[test]
fn the_reference_finds_the_original_tensors_where_the_repair_put_them() {
    // Moving `* s()` out of Y's sum adds a temp `Y_sum`, which the model
    // lists before `T`, a temp whose shape is inferred (listed last). The
    // f64 reference, printed from the original program, binds each of its
    // tensors to that tensor's position among the compiled program's, not
    // to its own: by its own it wrote T (N x N) into Y_sum (N), a heap
    // corruption (tests/fuzz/found/factor_temp_before_inferred_temp.json).
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/found/factor_temp_before_inferred_temp.json");
    let program = frontend::load_file(&path).unwrap();
    let c = polyfuse::compile(&program, &polyfuse::Options::default()).unwrap();
    let position = |name: &str| c.tensors.iter().position(|t| t.name == name).unwrap();
    assert!(
        position("Y_sum") < position("T"),
        "the premise: {:?}",
        c.tensors.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let reference = c.reference_c.as_ref().unwrap();
    for name in ["A", "s", "Y", "Z", "T"] {
        let binding = format!(
            "double *restrict t_{name} = (double *)pf_tensors[{}];",
            position(name)
        );
        assert!(reference.contains(&binding), "{binding}\n{reference}");
    }
    assert!(
        !reference.contains("t_Y_sum"),
        "the reference is the original program's"
    );
    let (code, out, err) = polyfuse(&["run", path.to_str().unwrap(), "--target", "cpu", "--check"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("check: ok"), "{out}");
}
