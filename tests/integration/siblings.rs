//! Sibling reductions (issue 35, Blockbuster's first rule; issue 32):
//! independent reductions of the same rows, each into its own output, run
//! in one kernel that reads every row once (`schedule::siblings`, chosen
//! by the rows probe). Generated programs: 2 to 4 siblings, sums and
//! maxima of the element or of a map of it (a square, an exponential, a
//! cast through f64), executed in the emulation against the f64 reference
//! at sizes off the lanes' grid; and the cases the rewrite must leave
//! alone.

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::load_str;
use polyfuse::gpu::GpuOptions;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::{compile, Options};

/// The right side of sibling `k`: which map of `X(r, c)` it reduces.
fn term(k: usize, x: &str) -> String {
    match k % 4 {
        0 => format!("{x}(r, c)"),
        1 => format!("{x}(r, c) * {x}(r, c)"),
        2 => format!("exp({x}(r, c) * 0.25)"),
        _ => format!("f32(f64({x}(r, c)) * 0.5)"),
    }
}

/// `n` sibling reductions of rows of `X` (sum, maximum in turn), each into
/// output `Yk`; with `other`, the last one reads `Z` instead (no shared
/// read: not siblings).
fn siblings(n: usize, r: i64, c: i64, other: bool) -> Program {
    let mut body = Vec::new();
    let mut outputs = Vec::new();
    for k in 0..n {
        let op = if k % 2 == 0 { "+=!" } else { "max=!" };
        let x = if other && k + 1 == n { "Z" } else { "X" };
        body.push(format!("\"Y{k}(r) {op} {}\"", term(k, x)));
        outputs.push(format!(
            "\"Y{k}\": {{\"dtype\": \"f32\", \"shape\": [\"R\"]}}"
        ));
    }
    let json = format!(
        r#"{{"name": "siblings{n}", "params": {{"R": {r}, "C": {c}}},
 "inputs": {{"X": {{"dtype": "f32", "shape": ["R", "C"]}}, "Z": {{"dtype": "f32", "shape": ["R", "C"]}}}},
 "outputs": {{{}}},
 "body": [{}]}}"#,
        outputs.join(", "),
        body.join(", ")
    );
    load_str(&json, "siblings.json").unwrap()
}

fn gpu() -> Options {
    Options {
        gpu: Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        }),
        ..Options::default()
    }
}

#[test]
fn sibling_row_reductions_share_one_kernel_with_their_rows_across_lanes() {
    for n in [2, 3, 4] {
        let c = compile(&siblings(n, 8192, 4000, false), &gpu()).unwrap();
        let cuda = c.cuda.as_ref().unwrap();
        let tree = c.gpu_tree.as_ref().unwrap().to_string();
        assert_eq!(cuda.kernels.len(), 1, "{n} siblings:\n{tree}");
        assert!(tree.contains("lanes_"), "{n} siblings: no lanes\n{tree}");
        // The siblings read each element in one iteration on one thread:
        // no reuse for shared memory to serve (`gpu::promote`), so X is
        // read straight from memory, not copied to a shared tile first.
        assert!(
            !cuda.source.contains("pf_shared_kernel_0_X"),
            "{n} siblings: X copied to shared memory"
        );
        // Every sibling is a state of the one split loop: X is read in one
        // loop of the kernel.
        assert_eq!(
            tree.matches("mark: lanes_").count(),
            1,
            "{n} siblings: more than one loop over the row\n{tree}"
        );
    }
}

#[test]
fn reductions_of_different_tensors_are_not_fused_as_siblings() {
    let c = compile(&siblings(2, 8192, 4000, true), &gpu()).unwrap();
    assert_eq!(c.cuda.as_ref().unwrap().kernels.len(), 2);
}

#[test]
fn sibling_reductions_compute_what_the_reference_computes() {
    for (n, r, c, other) in [
        (2, 37, 1001, false),
        (3, 5, 2000, false),
        (4, 40, 700, false),
        (3, 9, 513, true),
    ] {
        let mut compiled = compile(&siblings(n, r, c, other), &gpu()).unwrap();
        compiled.kernel_c = compiled.emulation_c.clone().unwrap();
        let out = run(
            &compiled,
            &RunOptions {
                check: true,
                bench_runs: 0,
                seed: n as u64,
            },
        )
        .unwrap();
        let check = out.check.unwrap();
        assert!(check.ok, "{n} siblings at {r} x {c}: {}", check.line());
    }
}

/// A sibling that depends on another (it reads the other's result) is no
/// sibling: the pair keeps its order, and the result is still right.
#[test]
fn a_dependent_reduction_keeps_its_order() {
    let json = r#"{"name": "dep", "params": {"R": 37, "C": 1001},
 "inputs": {"X": {"dtype": "f32", "shape": ["R", "C"]}},
 "outputs": {"S": {"dtype": "f32", "shape": ["R"]}, "V": {"dtype": "f32", "shape": ["R"]}},
 "body": ["S(r) +=! X(r, c)", "V(r) +=! (X(r, c) - S(r) / f32(C)) * (X(r, c) - S(r) / f32(C))"]}"#;
    let mut compiled = compile(&load_str(json, "dep.json").unwrap(), &gpu()).unwrap();
    compiled.kernel_c = compiled.emulation_c.clone().unwrap();
    let out = run(
        &compiled,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed: 3,
        },
    )
    .unwrap();
    let check = out.check.unwrap();
    assert!(check.ok, "{}", check.line());
}

/// Sibling reductions down the columns (`S(c) +=! X(r, c)`, `M(c) max=!
/// X(r, c)`): one column kernel, right at sizes off its grid.
#[test]
fn sibling_column_reductions_share_one_kernel() {
    let program = |r: i64, c: i64| {
        let json = format!(
            r#"{{"name": "columns", "params": {{"R": {r}, "C": {c}}},
 "inputs": {{"X": {{"dtype": "f32", "shape": ["R", "C"]}}}},
 "outputs": {{"S": {{"dtype": "f32", "shape": ["C"]}}, "M": {{"dtype": "f32", "shape": ["C"]}}}},
 "body": ["S(c) +=! X(r, c)", "M(c) max=! X(r, c) * 0.5"]}}"#
        );
        load_str(&json, "columns.json").unwrap()
    };
    let c = compile(&program(8000, 4096), &gpu()).unwrap();
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    assert_eq!(c.cuda.as_ref().unwrap().kernels.len(), 1, "{tree}");
    assert!(tree.contains("columns_on_x"), "{tree}");
    let mut compiled = compile(&program(333, 77), &gpu()).unwrap();
    compiled.kernel_c = compiled.emulation_c.clone().unwrap();
    let out = run(
        &compiled,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed: 5,
        },
    )
    .unwrap();
    let check = out.check.unwrap();
    assert!(check.ok, "{}", check.line());
}

/// Near variants (one kernel each, right in the emulation at odd sizes):
/// a sum through a temp with its epilogue into another tensor beside the
/// maximum (the epilogue moves after the fused loop), a triangular
/// domain, literal sizes (each in one loop), and a consumer of both
/// siblings (one kernel).
#[test]
fn near_variants_of_siblings_fuse_and_compute_what_the_reference_computes() {
    let program = |body: &str, temps: &str, outputs: &str, params: &str, shape: &str| {
        let json = format!(
            r#"{{"name": "v", "params": {{{params}}},
 "inputs": {{"X": {{"dtype": "f32", "shape": {shape}}}}},
 "outputs": {{{outputs}}}, "temps": {{{temps}}}, "body": {body}}}"#
        );
        load_str(&json, "variant.json").unwrap()
    };
    let row = r#"{"dtype": "f32", "shape": ["R"]}"#;
    let cases = [
        (
            r#"["T(r) +=! X(r, c)", "S(r) = T(r) * 2.0", "M(r) max=! X(r, c)"]"#.to_string(),
            format!(r#""T": {row}"#),
            format!(r#""S": {row}, "M": {row}"#),
        ),
        (
            r#"["S(r) +=! X(r, c) where c <= r", "M(r) max=! X(r, c) where c <= r"]"#.to_string(),
            String::new(),
            format!(r#""S": {row}, "M": {row}"#),
        ),
        (
            r#"["S(r) +=! X(r, c)", "M(r) max=! X(r, c)", "Y(r) = S(r) - M(r)"]"#.to_string(),
            format!(r#""S": {row}, "M": {row}"#),
            format!(r#""Y": {row}"#),
        ),
    ];
    for (body, temps, outputs) in &cases {
        let big = program(
            body,
            temps,
            outputs,
            r#""R": 4000, "C": 4000"#,
            r#"["R", "C"]"#,
        );
        let c = compile(&big, &gpu()).unwrap();
        let tree = c.gpu_tree.as_ref().unwrap().to_string();
        assert_eq!(c.cuda.as_ref().unwrap().kernels.len(), 1, "{body}\n{tree}");
        // (A consumer of both takes maximal fusion's rows first, which
        // keeps the two loops apart in the one kernel.)
        if !body.contains("Y(r)") {
            assert_eq!(tree.matches("mark: lanes_").count(), 1, "{body}\n{tree}");
        }
        let small = program(
            body,
            temps,
            outputs,
            r#""R": 37, "C": 1001"#,
            r#"["R", "C"]"#,
        );
        let mut compiled = compile(&small, &gpu()).unwrap();
        compiled.kernel_c = compiled.emulation_c.clone().unwrap();
        let out = run(
            &compiled,
            &RunOptions {
                check: true,
                bench_runs: 0,
                seed: 7,
            },
        )
        .unwrap();
        let check = out.check.unwrap();
        assert!(check.ok, "{body}: {}", check.line());
    }
    // Literal sizes.
    let literal = r#"{"name": "lit", "params": {},
 "inputs": {"X": {"dtype": "f32", "shape": [37, 1001]}},
 "outputs": {"S": {"dtype": "f32", "shape": [37]}, "M": {"dtype": "f32", "shape": [37]}},
 "body": ["S(r) +=! X(r, c)", "M(r) max=! X(r, c)"]}"#;
    let mut compiled = compile(&load_str(literal, "lit.json").unwrap(), &gpu()).unwrap();
    assert_eq!(compiled.cuda.as_ref().unwrap().kernels.len(), 1);
    compiled.kernel_c = compiled.emulation_c.clone().unwrap();
    let out = run(
        &compiled,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed: 8,
        },
    )
    .unwrap();
    let check = out.check.unwrap();
    assert!(check.ok, "literal sizes: {}", check.line());
}
