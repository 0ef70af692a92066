//! The benchmark suite beyond the examples (`bench/suite/`, issue 32):
//! every program runs through the command line, `polyfuse run FILE
//! --check`, at each line of its sizes in `bench/suite/check-sizes.txt`
//! (the sizes `bench/suite/run.sh` checks on the GPU: small ones off every
//! tile grid, and where the mapping depends on the size, sizes at which
//! it is mapped as at the file's own), on the CPU and with the GPU mapping
//! emulated (`--target emulate`), and must print `check: ok`. At the
//! file's own sizes (the GPU machine's: `run.sh` times them) each program
//! compiles for the GPU and counts its work, without running.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::named;

use polyfuse::frontend::load_file;
use polyfuse::runtime::work;
use polyfuse::{compile, Options};

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/suite")
}

/// The lines of `check-sizes.txt`: a program's name and its `--param`
/// arguments (comments and blank lines skipped).
fn check_sizes() -> Vec<(String, Vec<String>)> {
    let path = suite_dir().join("check-sizes.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace().map(str::to_string);
            let name = words.next().unwrap();
            (name, words.collect())
        })
        .collect()
}

/// Every line of `name` in `check-sizes.txt` (at least one).
fn sizes_of(name: &str) -> Vec<Vec<String>> {
    let found: Vec<_> = check_sizes()
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, args)| args)
        .collect();
    assert!(!found.is_empty(), "{name}: no line in check-sizes.txt");
    found
}

/// At the file's own sizes, `name` compiles for the GPU (as `--target
/// cuda` does; nothing runs) and its work counts (`--bench` divides by it;
/// syrk at 4096 once stopped there). Then it runs with `--check` at each
/// line of its sizes on the CPU and in the GPU emulation; every run must
/// exit 0 and print `check: ok`.
fn check(name: &str) {
    let file = suite_dir().join(format!("{name}.json"));
    let program = named::load_named(&file, name);
    let full = named::compile_for_gpu(&program, name);
    let w = work::measure(&full).unwrap_or_else(|e| panic!("{name}: counting its work: {e}"));
    assert!(w.flops > 0 && w.bytes > 0, "{name}: work {w:?}");
    let mut failures = Vec::new();
    // The first line (small, off every tile grid) on the CPU and in the
    // emulation; a further line (the timed kernels' mapping) in the
    // emulation only: the CPU target's code does not depend on it.
    let lines = sizes_of(name);
    let targets: &[&str] = &["cpu", "emulate"];
    for (sizes, target) in lines.into_iter().enumerate().flat_map(|(i, s)| {
        let on = if i == 0 { targets } else { &targets[1..] };
        on.iter().map(move |t| (s.clone(), *t))
    }) {
        let mut args = vec![
            "run".to_string(),
            file.display().to_string(),
            "--target".to_string(),
            target.to_string(),
            "--check".to_string(),
            "--no-cache".to_string(),
        ];
        args.extend(sizes.iter().cloned());
        let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ok = out.status.success() && stdout.lines().any(|l| l.starts_with("check: ok"));
        if !ok {
            failures.push(format!(
                "polyfuse {}: status {:?}\n{stdout}{}",
                args.join(" "),
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        const SUITE: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
    };
}

suite!(
    atax,
    avgpool2x2,
    bicg,
    column_logsumexp,
    column_softmax,
    column_sum_mean,
    correlation,
    covariance,
    depthwise_conv,
    doitgen,
    gemver,
    gesummv,
    grouped_conv,
    layernorm_product_f16,
    mlp3_f32,
    mlp_gelu_f16,
    mlp_silu_f32,
    mvt,
    product_bias_tanh_f16,
    rmsnorm_product_f16,
    row_sum_max,
    symm_out_of_place,
    syr2k,
    syrk,
    three_mm,
    trmm_out_of_place,
    two_mm,
);

/// Every program file has a test above and a line of check sizes, and
/// every line names a program file: a program added to the suite without
/// its sizes (or a test) fails here.
#[test]
fn every_program_is_checked() {
    let files: BTreeSet<String> = std::fs::read_dir(suite_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let lines = check_sizes();
    let listed: BTreeSet<String> = lines.iter().map(|(n, _)| n.clone()).collect();
    let distinct: BTreeSet<&(String, Vec<String>)> = lines.iter().collect();
    assert_eq!(
        distinct.len(),
        lines.len(),
        "a line repeated in check-sizes.txt"
    );
    let tested: BTreeSet<String> = SUITE.iter().map(|s| s.to_string()).collect();
    assert_eq!(files, listed, "bench/suite/*.json against check-sizes.txt");
    assert_eq!(
        files, tested,
        "bench/suite/*.json against the tests of tests/integration/suite.rs"
    );
    for (name, args) in &lines {
        assert!(
            args.len() % 2 == 0
                && args.chunks(2).all(|p| p[0] == "--param"
                    && p[1]
                        .split_once('=')
                        .is_some_and(|(k, v)| !k.is_empty() && v.parse::<i64>().is_ok())),
            "{name}: want `--param NAME=VALUE` pairs, got {args:?}"
        );
    }
}

/// The triangular programs (a `where` between two indices) count their
/// work at 8192 (issue 32: syrk at 4096 stopped with "the domain needs
/// more than 1048576 slices to count exactly"), and the count of syrk's
/// update is the triangle's, `M N (N + 1) / 2`.
#[test]
fn triangles_count_their_work_at_8192() {
    for (name, params) in [
        ("syrk", &["N", "M"][..]),
        ("syr2k", &["N", "M"]),
        ("trmm_out_of_place", &["M", "N"]),
        ("symm_out_of_place", &["M", "N"]),
        ("covariance", &["N", "M"]),
        ("correlation", &["N", "M"]),
    ] {
        let mut program = load_file(&suite_dir().join(format!("{name}.json"))).unwrap();
        let overrides: Vec<(String, i64)> = params.iter().map(|p| (p.to_string(), 8192)).collect();
        polyfuse::frontend::apply_param_overrides(&mut program, &overrides).unwrap();
        let compiled = compile(&program, &Options::default())
            .unwrap_or_else(|e| panic!("{name} at 8192: {e}"));
        let w = work::measure(&compiled).unwrap_or_else(|e| panic!("{name} at 8192: {e}"));
        assert!(w.flops > 0, "{name}: {w:?}");
        if name == "syrk" {
            let n: u64 = 8192;
            let update = w.statements.iter().map(|s| s.instances).max().unwrap();
            assert_eq!(update, n * n * (n + 1) / 2, "{w:?}");
        }
    }
}
