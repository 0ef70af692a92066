//! Disjunctive `where` clauses (spec, "Statements"): a condition
//! `(a && b) || c` makes a statement's domain a union, through every
//! stage: the model, the reference, the schedule, the GPU mapping and
//! the repair (a reduction over a union is one reduction).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use polyfuse::frontend::load_str;
use polyfuse::isl::Isl;
use polyfuse::model;

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("polyfuse-disjunction-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    file
}

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

fn checks(file: &Path, target: &str, strategy: Option<&str>) {
    let mut args = vec!["run", file.to_str().unwrap(), "--check", "--target", target];
    if let Some(s) = strategy {
        args.extend(["--strategy", s]);
    }
    let out = polyfuse(&args);
    let t = text(&out);
    assert!(t.contains("check: ok"), "{target} {strategy:?}: {t}");
}

fn row_sum(condition: &str, n: i64) -> String {
    format!(
        r#"{{"name": "rows", "params": {{"N": {n}, "W": 3, "G": 5}},
            "inputs": {{"A": {{"dtype": "f32", "shape": ["N", "N"]}}}},
            "outputs": {{"O": {{"dtype": "f32", "shape": ["N"]}}}},
            "body": ["O(i) +=! A(i, j) where {condition}"]}}"#
    )
}

/// The instances of the (only) statement of `json` (not its initialisation), counted by the model.
fn instances(json: &str) -> u64 {
    let p = load_str(json, "t.json").unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let s0 = scop.statement("S0").expect("statement S0");
    model::count::count_points(&s0.domain).unwrap()
}

/// Overlapping alternatives: an instance that satisfies several counts
/// once (a union, not a sum of the alternatives), checked against a
/// count by enumeration.
#[test]
fn an_instance_in_several_alternatives_is_one_instance() {
    let n = 19;
    for (condition, keep) in [
        (
            "(j >= i - W && j <= i + W) || j < G",
            &(|i: i64, j: i64| (j >= i - 3 && j <= i + 3) || j < 5) as &dyn Fn(i64, i64) -> bool,
        ),
        ("j <= i || j >= i - 1", &|_, _| true),
        ("(j < 2 && i < 2) || (j > 15 && i > 15)", &|i, j| {
            (j < 2 && i < 2) || (j > 15 && i > 15)
        }),
    ] {
        let expected = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .filter(|&(i, j)| keep(i, j))
            .count() as u64;
        assert_eq!(instances(&row_sum(condition, n)), expected, "{condition}");
    }
}

/// A windowed sum with global columns, at a size no tile divides, under
/// every strategy, on the CPU and in the emulation of the GPU mapping;
/// also beside another condition on the same statement, which the
/// reference joins to the union with `&&` (the fuzzer found the union
/// printed there without its parentheses, `a || b && c`: the reference
/// itself was wrong, 1.4 on `tests/fuzz/fixed/seed-91090.json`).
#[test]
fn a_window_with_global_columns_checks_everywhere() {
    for (name, condition) in [
        ("window_global.json", "(j >= i - W && j <= i + W) || j < G"),
        (
            "window_global_lower.json",
            "(j >= i - W && j <= i + W) || j < G, j <= i",
        ),
        ("two_conditions.json", "j >= i || j < 1, j <= i + 5"),
    ] {
        let file = scratch(name, &row_sum(condition, 45));
        for target in ["cpu", "emulate"] {
            for strategy in [None, Some("isl"), Some("min"), Some("max")] {
                checks(&file, target, strategy);
            }
        }
    }
}

/// The parser keeps a parenthesised left side apart from a parenthesised
/// conjunction, and a single conjunction is the same as its comparisons
/// written as separate clauses.
#[test]
fn parentheses_group_a_conjunction_or_a_left_side() {
    let a = instances(&row_sum("(i + 1) <= j", 13));
    let b = instances(&row_sum("i + 1 <= j", 13));
    assert_eq!(a, b);
    let c = instances(&row_sum("(j >= i - W && j <= i + W)", 13));
    let d = instances(&row_sum("j >= i - W, j <= i + W", 13));
    assert_eq!(c, d);
}

/// A malformed condition is an error with the statement and exit 2.
#[test]
fn a_malformed_condition_is_an_input_error() {
    for (condition, says) in [
        ("(j <= i || j > 3", "expected"),
        ("j <= i ||", "expected an expression"),
        ("(j <= i && ) || j > 3", "expected an expression"),
        ("j || i", "comparison"),
    ] {
        let file = scratch("bad.json", &row_sum(condition, 8));
        let out = polyfuse(&["run", file.to_str().unwrap(), "--check"]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{condition}: {t}");
        assert!(t.contains("statement 1"), "{condition}: {t}");
        assert!(t.contains(says), "{condition}: {t}");
    }
}

/// BigBird's pattern (a window, global columns and global rows) on
/// attention: the rolling update repairs the union's reductions into one
/// kernel, which checks on the CPU and in the emulation.
#[test]
fn bigbird_attention_is_one_repaired_kernel() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/attention_bigbird.json");
    let out = polyfuse(&["schedule", file.to_str().unwrap(), "--emit", "cuda"]);
    let cuda = String::from_utf8_lossy(&out.stdout);
    assert_eq!(cuda.matches("__global__").count(), 1, "{}", text(&out));
    for target in ["cpu", "emulate"] {
        checks(&file, target, None);
    }
}

/// Attention sinks and a sliding window at decoding (StreamingLLM's
/// pattern) under the split-k update: the union is split into slices and
/// combined like any other reduction.
#[test]
fn sink_and_window_decoding_splits_and_checks() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/decode_sink_window.json");
    for target in ["cpu", "emulate"] {
        checks(&file, target, None);
    }
}
