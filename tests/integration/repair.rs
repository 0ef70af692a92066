//! Algebraic repair: refusals (wrong repairs, no inverse, non-monotone
//! max), the proof by dependences, automation, and a golden repaired
//! schedule tree paired with its execution check.

use std::path::{Path, PathBuf};
use std::process::Command;

use polyfuse::frontend;
use polyfuse::isl::Isl;
use polyfuse::repair::{self, Fault};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.json"))
}

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

/// Writes `text` to a fresh file for one test.
fn program_file(tag: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("polyfuse-repair-{tag}-{}.json", std::process::id()));
    std::fs::write(&p, text).expect("temp file");
    p
}

/// Rolling update of `targets` in the softmax example with a deliberate
/// `fault`, through the library.
fn rolling_with(fault: Fault) -> polyfuse::Result<repair::Repaired> {
    let program = frontend::load_file(&example("softmax_fused"))?;
    let isl = Isl::new();
    let scop = polyfuse::model::build(&isl, &program)?;
    repair::rolling_update(&isl, &program, &scop, &["S".to_string()], fault)
}

#[test]
fn the_correct_repair_is_proven() {
    let r = rolling_with(Fault::None).expect("softmax repairs");
    for goal in [
        "proved Eq. 4",
        "proved Eq. 5",
        "violated flow",
        "M^<prev(j)> through M_prev",
    ] {
        assert!(r.report.contains(goal), "missing `{goal}` in\n{}", r.report);
    }
}

#[test]
fn a_flipped_sign_in_h_is_refused_by_the_proof() {
    let e = rolling_with(Fault::FlipSign).unwrap_err().to_string();
    assert!(
        e.contains("fails a proof goal") && e.contains("Eq. 4"),
        "{e}"
    );
    assert_eq!(rolling_with(Fault::FlipSign).unwrap_err().exit_code(), 2);
}

#[test]
fn an_omitted_cache_is_caught_by_the_dependence_check() {
    let e = rolling_with(Fault::OmitCache).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("does not read M at the previous step"), "{m}");
    assert!(matches!(e, polyfuse::Error::Illegal { .. }), "{e:?}");
}

#[test]
fn a_fusion_without_repair_is_refused_with_the_violated_dependence() {
    let e = rolling_with(Fault::NoRepair).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("reverses the flow dependence") && m.contains("S2[r, c = 255] -> S4"),
        "{m}"
    );
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn a_square_is_not_invertible() {
    // layernorm's variance reads (X - Mean)^2: g uses X twice.
    let text = std::fs::read_to_string(example("layernorm")).unwrap();
    let text = text.replacen(
        "\"body\"",
        "\"schedule\": [{\"rolling-update\": [\"Var\"]}],\n  \"body\"",
        1,
    );
    let f = program_file("layernorm", &text);
    let (code, _, err) = polyfuse(&["schedule", f.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("statement 2") && err.contains("not invertible"),
        "{err}"
    );
}

#[test]
fn max_against_a_non_monotone_g_is_refused() {
    let f = program_file(
        "maxdiv",
        r#"{
  "name": "maxdiv", "params": {"N": 8, "D": 16},
  "inputs": {"X": {"dtype": "f32", "shape": ["N", "D"]}},
  "outputs": {"Z": {"dtype": "f32", "shape": ["N"]}},
  "temps": {"S": {"dtype": "f32", "shape": ["N"]}},
  "body": ["S(r) +=! X(r, c)", "Z(r) max=! X(r, c) / S(r)"],
  "schedule": [{"rolling-update": ["Z"]}]
}"#,
    );
    let (code, _, err) = polyfuse(&["schedule", f.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("FAILED Eq. 5") && err.contains("reducer max"),
        "{err}"
    );
}

#[test]
fn a_target_without_predecessor_is_refused() {
    let text = std::fs::read_to_string(example("softmax")).unwrap();
    let text = text.replacen(
        "\"body\"",
        "\"schedule\": [{\"rolling-update\": [\"M\"]}],\n  \"body\"",
        1,
    );
    let f = program_file("nopred", &text);
    let (code, _, err) = polyfuse(&["schedule", f.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("reads no earlier reduction"), "{err}");
}

#[test]
fn automation_repairs_long_reductions_only() {
    let file = example("softmax");
    let f = file.to_str().unwrap();
    // Default sizes: a short reduction, the program stays as written.
    let (code, out, err) = polyfuse(&["schedule", f, "--emit", "deps"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("repair:"), "{out}");
    // A long reduction with many rows: rolling update.
    let (code, out, err) = polyfuse(&[
        "schedule", f, "--emit", "deps", "--param", "N=512", "--param", "D=2048",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("repair: rolling update of S"), "{out}");
    // A long reduction with few rows: split-k.
    let (code, out, err) = polyfuse(&[
        "schedule", f, "--emit", "deps", "--param", "N=4", "--param", "D=2048",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("repair: split-k update of S into 16 slices"),
        "{out}"
    );
    // An empty template keeps the program as written at any size.
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replacen("\"body\"", "\"schedule\": [],\n  \"body\"", 1);
    let g = program_file("empty-template", &text);
    let (code, out, err) = polyfuse(&[
        "schedule",
        g.to_str().unwrap(),
        "--emit",
        "deps",
        "--param",
        "N=512",
        "--param",
        "D=2048",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("repair:"), "{out}");
}

/// `--repair` overrides the program's choice: the plain softmax (short
/// reduction, left as written by the automation) fused by rolling or
/// split-k update, and the split-k decoding program run unfused; each says
/// so in `--emit deps` and checks against the reference on the CPU and in
/// the GPU emulation.
#[test]
fn the_repair_can_be_chosen_on_the_command_line() {
    let softmax = example("softmax");
    let decode = example("attention_decode_causal");
    let cases: [(&PathBuf, &[&str], Option<&str>); 5] = [
        (
            &softmax,
            &["--repair", "rolling"],
            Some("repair: rolling update of S"),
        ),
        (
            &softmax,
            &["--repair", "split-k", "--split", "3"],
            Some("repair: split-k update of S into 3 slices"),
        ),
        (
            &softmax,
            &["--split", "4"],
            Some("repair: split-k update of S into 4 slices"),
        ),
        (&softmax, &["--repair", "off"], None),
        (&decode, &["--repair", "off"], None),
    ];
    for (file, args, says) in cases {
        let f = file.to_str().unwrap();
        let mut deps = vec!["schedule", f, "--emit", "deps", "--param", "D=53"];
        deps.extend_from_slice(args);
        let (code, out, err) = polyfuse(&deps);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        match says {
            Some(s) => assert!(out.contains(s), "{args:?}: {out}"),
            None => assert!(!out.contains("repair:"), "{args:?}: {out}"),
        }
        for target in ["cpu", "emulate"] {
            let mut run = vec!["run", f, "--check", "--target", target, "--param", "D=53"];
            run.extend_from_slice(args);
            let (code, out, err) = polyfuse(&run);
            assert_eq!(code, Some(0), "{args:?} {target}: {out}{err}");
            assert!(out.contains("check: ok"), "{args:?} {target}: {out}");
        }
    }
    // Through the library, a split factor below 2 is refused too.
    let program = frontend::load_file(&softmax).unwrap();
    let options = polyfuse::Options {
        repair: repair::Choice::SplitK(1),
        ..Default::default()
    };
    match polyfuse::compile(&program, &options) {
        Err(polyfuse::Error::Input { message, .. }) => {
            assert!(message.contains("at least 2 slices"), "{message}")
        }
        other => panic!(
            "split factor 1 compiled: {:?}",
            other.map(|c| c.program.name)
        ),
    }
    // Without --repair the decoding program is split as its file says.
    let (_, out, _) = polyfuse(&["schedule", decode.to_str().unwrap(), "--emit", "deps"]);
    assert!(out.contains("repair: split-k"), "{out}");
    // Nothing to repair, a factor without split-k, a factor below 2: exit 2.
    let gemm = example("gemm");
    for (args, says) in [
        (vec!["--repair", "rolling"], "no reduction chain"),
        (vec!["--repair", "rolling", "--split", "4"], "--split"),
        (vec!["--repair", "split-k", "--split", "1"], "at least 2"),
    ] {
        let file = if says == "no reduction chain" {
            &gemm
        } else {
            &softmax
        };
        let mut a = vec!["run", file.to_str().unwrap()];
        a.extend(args.iter().copied());
        let (code, _, err) = polyfuse(&a);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn split_k_and_privatize_run_and_check() {
    for (tag, step) in [
        ("splitk", r#"{"split-k": ["S"], "factor": 5}"#),
        ("privatize", r#"{"privatize": "M", "factor": 3}"#),
    ] {
        let text = std::fs::read_to_string(example("softmax")).unwrap();
        let text = text.replacen(
            "\"body\"",
            &format!("\"schedule\": [{step}],\n  \"body\""),
            1,
        );
        let f = program_file(tag, &text);
        for target in ["cpu", "emulate"] {
            let (code, out, err) = polyfuse(&[
                "run",
                f.to_str().unwrap(),
                "--check",
                "--target",
                target,
                "--param",
                "D=53",
            ]);
            assert_eq!(code, Some(0), "{tag} {target}: {out}{err}");
            assert!(out.contains("check: ok"), "{tag} {target}: {out}");
        }
    }
}

/// The repaired softmax in its fused order (canonical strategy, untiled):
/// the rolling loop `c` holds the cache, the max and the repaired sum.
#[test]
fn golden_repaired_tree_and_its_execution() {
    let f = example("softmax_fused");
    let f = f.to_str().unwrap();
    let args = ["--strategy", "canonical", "--no-tile"];
    let (code, out, err) = polyfuse(&[&["schedule", f][..], &args[..]].concat());
    assert_eq!(code, Some(0), "{err}");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/repair/softmax_fused.tree");
    let want = std::fs::read_to_string(&golden).expect("golden file");
    assert_eq!(
        out,
        want,
        "the repaired tree changed; compare with {}",
        golden.display()
    );
    let (code, out, err) = polyfuse(&[&["run", f, "--check"][..], &args[..]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("check: ok"), "{out}");
}

/// A map the rolling target takes in (softmax's `E = exp(X - M)`) that the
/// output reads too goes into the output as well: after the repair no
/// statement writes or reads `E`, so the output loop does not read a row
/// of it back from memory. Checked on the CPU, at odd sizes too.
#[test]
fn a_map_the_target_takes_in_goes_into_its_other_readers_too() {
    let program = frontend::load_file(&example("softmax")).expect("softmax loads");
    let isl = Isl::new();
    let scop = polyfuse::model::build(&isl, &program).expect("model");
    let r = repair::rolling_update(&isl, &program, &scop, &["S".to_string()], Fault::None)
        .expect("softmax repairs");
    assert!(
        r.program.statements.iter().all(|s| s.lhs_tensor != "E"),
        "{}",
        r.report
    );
    let y = r
        .program
        .statements
        .iter()
        .find(|s| s.lhs_tensor == "Y")
        .expect("the output");
    assert_eq!(y.text, "Y(r, c) = (exp((X(r, c) - M(r))) / S(r))");
    let f = example("softmax");
    let f = f.to_str().unwrap();
    for params in [&[][..], &["--param", "N=37", "--param", "D=301"][..]] {
        let (code, out, err) = polyfuse(
            &[
                &["run", f, "--check", "--repair", "rolling", "--no-cache"][..],
                params,
            ]
            .concat(),
        );
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("check: ok"), "{out}");
    }
}

/// A map inlined into a reduction's body keeps what its store does to the
/// value (`declared` in `repair::chain`): a u8 temp wraps, so the body is
/// `u8(X - M)`, not `X - M`, and the algebra refuses the cast by name
/// instead of reasoning about an expression the program does not compute.
#[test]
fn an_inlined_map_keeps_its_stores_conversion() {
    let file = program_file(
        "u8_chain",
        r#"{
  "name": "u8_chain",
  "params": {"N": 5, "D": 7},
  "inputs": {"X": {"dtype": "i32", "shape": ["N", "D"]}},
  "outputs": {"Y": {"dtype": "i32", "shape": ["N"]}},
  "temps": {
    "M": {"dtype": "i32", "shape": ["N"]},
    "E": {"dtype": "u8", "shape": ["N", "D"]},
    "S": {"dtype": "i32", "shape": ["N"]}
  },
  "body": [
    "M(r) max=! X(r, c)",
    "E(r, c) = X(r, c) - M(r)",
    "S(r) +=! E(r, c)",
    "Y(r) = S(r)"
  ],
  "schedule": [{"rolling-update": ["S"]}]
}"#,
    );
    let (code, _, err) = polyfuse(&["run", file.to_str().unwrap(), "--check"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("a cast to u8"), "{err}");
}
