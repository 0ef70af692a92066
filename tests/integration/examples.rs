//! Executes every program in `examples/` through the command line and checks
//! it against the f64 reference: `polyfuse run FILE --target cpu --check`,
//! under every scheduling strategy, with tiling on and off, and the GPU
//! mapping emulated on the CPU (`--target emulate`), at the default sizes
//! and at sizes that are no multiple of the tile sizes: every tiling at
//! both sizes, each under one strategy, the strategies in turn
//! ([`Sampling`]; fewer for the programs whose compilation takes seconds).
//! (Every strategy with every tiling, 16 runs a program, took a sixth of
//! CI's time; each strategy still runs twice a program, once on the CPU
//! and once emulated or at the other size.)
//!
//! One test function per example, so that a failure names the example; each
//! runs all its variants and reports every failing one, not just the first.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const STRATEGIES: [&str; 4] = ["isl", "min", "max", "canonical"];

fn polyfuse() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polyfuse"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.json"))
}

fn describe(args: &[String], out: &Output) -> String {
    format!(
        "polyfuse {}\n  status: {}\n  stdout: {}\n  stderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end(),
    )
}

/// Runs `name` with `--check` in its variants ([`Sampling::Strategies`]).
/// `odd_sizes` are `--param` overrides chosen so that no extent is a
/// multiple of a tile size while all shapes stay valid.
fn check_example(name: &str, odd_sizes: &[(&str, i64)]) {
    check_variants(name, odd_sizes, Sampling::Strategies)
}

/// Which of the 32 combinations (2 sizes x 4 strategies x 4 tilings) run.
#[derive(Clone, Copy)]
enum Sampling {
    /// Every tiling at both sizes, each under one strategy, the
    /// strategies in turn (8 runs).
    Strategies,
    /// Strategy i with tiling i, at the odd sizes for odd i (4 runs): the
    /// programs whose compilation alone takes seconds, and the attention
    /// examples, prefill and decoding (one template kernel whatever the
    /// strategy, checked on their own paths by tests/integration/attention.rs).
    Diagonal,
}

impl Sampling {
    fn runs(self, size: usize, strategy: usize, tiling: usize) -> bool {
        match self {
            Sampling::Strategies => (tiling + size) % STRATEGIES.len() == strategy,
            Sampling::Diagonal => strategy == tiling && tiling % 2 == size,
        }
    }
}

fn check_variants(name: &str, odd_sizes: &[(&str, i64)], sampling: Sampling) {
    let file = example(name);
    assert!(file.is_file(), "{} is missing", file.display());

    let odd: Vec<String> = odd_sizes
        .iter()
        .flat_map(|(p, v)| ["--param".to_string(), format!("{p}={v}")])
        .collect();
    let sizes: [(&str, Vec<String>); 2] = [("default sizes", Vec::new()), ("odd sizes", odd)];
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    // CPU schedules tiled and untiled; the GPU mapping emulated on the CPU
    // with default tiles and blocks, and with blocks smaller than the tiles
    // and a grid smaller than the number of tiles.
    let tilings: [(&str, Vec<String>); 4] = [
        ("cpu, tiled", strs(&["--target", "cpu"])),
        ("cpu, untiled", strs(&["--target", "cpu", "--no-tile"])),
        ("gpu emulated", strs(&["--target", "emulate"])),
        (
            "gpu emulated, small blocks and grid",
            strs(&[
                "--target", "emulate", "--tile", "16,8,4", "--block", "4,2", "--grid", "2,3",
            ]),
        ),
    ];

    let mut failures = Vec::new();
    let mut runs = 0;
    for (n_size, (size_label, size_args)) in sizes.iter().enumerate() {
        for (n_strategy, strategy) in STRATEGIES.into_iter().enumerate() {
            for (n_tiling, (tile_label, tile_args)) in tilings.iter().enumerate() {
                if !sampling.runs(n_size, n_strategy, n_tiling) {
                    continue;
                }
                runs += 1;
                let mut args: Vec<String> = vec![
                    "run".into(),
                    file.display().to_string(),
                    "--check".into(),
                    "--strategy".into(),
                    strategy.into(),
                ];
                args.extend(tile_args.iter().cloned());
                args.extend(size_args.iter().cloned());

                let label = format!("[{size_label}, --strategy {strategy}, {tile_label}]");
                let mut cmd = polyfuse();
                // The tiled CPU runs keep the C compiler's default flags
                // (`-O2`), whatever the test script asks for the others.
                if n_tiling == 0 {
                    cmd.env_remove("POLYFUSE_CFLAGS");
                }
                let out = match cmd.args(&args).output() {
                    Ok(out) => out,
                    Err(e) => {
                        failures.push(format!("{label} could not start polyfuse: {e}"));
                        continue;
                    }
                };
                let stdout = String::from_utf8_lossy(&out.stdout);
                let ok = out.status.code() == Some(0)
                    && stdout.lines().any(|l| l.starts_with("check: ok"));
                if !ok {
                    failures.push(format!("{label} {}", describe(&args, &out)));
                }
            }
        }
    }

    assert!(
        failures.is_empty(),
        "{name}: {} of {runs} runs failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn gemm() {
    check_example("gemm", &[("M", 37), ("N", 53), ("K", 29)]);
}

#[test]
fn matvec() {
    check_example("matvec", &[("M", 37), ("N", 53)]);
}

#[test]
fn fcrelu() {
    check_example("fcrelu", &[("B", 37), ("M", 53), ("N", 29)]);
}

#[test]
fn conv2d() {
    // Output 35 x 25.
    check_example(
        "conv2d",
        &[
            ("N", 3),
            ("C", 5),
            ("F", 7),
            ("H", 37),
            ("W", 29),
            ("KH", 3),
            ("KW", 5),
        ],
    );
}

#[test]
fn conv2d_strided() {
    // Input 2*OH+KH-2 = 27 by 2*OW+KW-2 = 23.
    check_example(
        "conv2d_strided",
        &[
            ("N", 3),
            ("C", 5),
            ("F", 7),
            ("OH", 13),
            ("OW", 11),
            ("KH", 3),
            ("KW", 3),
        ],
    );
}

#[test]
fn maxpool2x2() {
    // Input 38 x 26.
    check_example("maxpool2x2", &[("B", 3), ("C", 5), ("H", 19), ("W", 13)]);
}

#[test]
fn tbmm() {
    check_example("tbmm", &[("B", 3), ("N", 37), ("M", 53), ("K", 29)]);
}

#[test]
fn gemm_chain() {
    check_example("gemm_chain", &[("M", 37), ("K", 29), ("N", 53), ("L", 23)]);
}

#[test]
fn softmax() {
    check_example("softmax", &[("N", 37), ("D", 53)]);
}

#[test]
fn layernorm() {
    check_example("layernorm", &[("N", 37), ("D", 53)]);
}

#[test]
fn gemm_f16() {
    // Tensor cores: fragments, ldmatrix and the pipeline, emulated.
    check_example("gemm_f16", &[("M", 37), ("N", 53), ("K", 29)]);
}

#[test]
fn fcrelu_f16() {
    // Tensor cores with the bias and ReLU applied on the fragments.
    check_example("fcrelu_f16", &[("B", 37), ("M", 53), ("N", 29)]);
}

#[test]
fn tbmm_bf16() {
    check_example("tbmm_bf16", &[("B", 3), ("N", 37), ("M", 53), ("K", 29)]);
}

#[test]
fn softmax_fused() {
    check_example("softmax_fused", &[("N", 37), ("D", 53)]);
}

#[test]
fn attention_global() {
    check_variants(
        "attention_global",
        &[("S", 37), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_causal() {
    check_variants(
        "attention_causal",
        &[("S", 37), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_alibi() {
    check_variants(
        "attention_alibi",
        &[("S", 37), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_gqa() {
    check_variants("attention_gqa", &[("S", 37), ("D", 13)], Sampling::Diagonal);
}

#[test]
fn attention_softcap() {
    check_variants(
        "attention_softcap",
        &[("S", 37), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_window() {
    check_variants(
        "attention_window",
        &[("S", 37), ("D", 13), ("W", 5)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_lse() {
    // Its compilation takes seconds (isl's scheduler on ten statements
    // after the repair): four runs, one per strategy and tiling.
    check_variants(
        "attention_lse",
        &[("S", 37), ("D", 13), ("E", 5)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_decode_causal() {
    check_variants(
        "attention_decode_causal",
        &[("KV", 61), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_decode_alibi() {
    check_variants(
        "attention_decode_alibi",
        &[("KV", 61), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_decode_gqa() {
    check_variants(
        "attention_decode_gqa",
        &[("KV", 61), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn attention_decode_softcap() {
    check_variants(
        "attention_decode_softcap",
        &[("KV", 61), ("D", 13)],
        Sampling::Diagonal,
    );
}

#[test]
fn quant_fp8() {
    check_example("quant_fp8", &[("M", 37), ("N", 53), ("K", 29)]);
}

#[test]
fn attention_bigbird() {
    // A window, global columns and global rows as one disjunctive `where`.
    // Off the grid in S, W and G; D a multiple of 16, so that the odd
    // sizes run the tensor-core kernel its users get (at D = 13 the rolling
    // update's SIMT mapping is refused by the race proof, and its fallback
    // to blocks of one thread took 27 s to map; the other attention
    // examples keep D = 13 and test that fallback).
    // Its compilation takes seconds (isl's dataflow on the union domains):
    // four runs, one per strategy and tiling.
    check_variants(
        "attention_bigbird",
        &[("S", 37), ("D", 16), ("W", 5), ("G", 3)],
        Sampling::Diagonal,
    );
}

#[test]
fn lstm() {
    // Two products into one gate tensor (`+=!` then `+=`) in a loop block.
    check_example("lstm", &[("T", 7), ("B", 3), ("I", 19), ("H", 37)]);
}

#[test]
fn grid_rnn() {
    // Nested blocks over a grid's two axes.
    check_example("grid_rnn", &[("R", 4), ("S", 5), ("N", 37)]);
}

#[test]
fn dilated_rnn() {
    // Layers of dilations 1, 2 and 4 (`H(t - 4, k)`), one block each.
    check_example("dilated_rnn", &[("T", 13), ("N", 37)]);
}

#[test]
fn rnn() {
    // A recurrence in a loop block over time.
    check_example("rnn", &[("T", 13), ("N", 37)]);
}

#[test]
fn stacked_lstm() {
    // LSTM layers stacked in nested loop blocks: each cell's gates two
    // products into one tensor, reading the layer below at the same time
    // and its own layer one step before (a wavefront over l + t).
    check_example("stacked_lstm", &[("L", 2), ("T", 5), ("B", 3), ("H", 37)]);
}

#[test]
fn stacked_rnn() {
    // Nested loop blocks over layers and time.
    check_example("stacked_rnn", &[("L", 2), ("T", 11), ("N", 35)]);
}

#[test]
fn gemm_bias_gelu_f16() {
    // An f16 product through an f32 accumulator temp, then bias and GELU
    // (tanh approximation) cast to f16: the tensor-core kernel's epilogue.
    check_example("gemm_bias_gelu_f16", &[("M", 37), ("N", 53), ("K", 29)]);
}

#[test]
fn layernorm_matmul() {
    // LayerNorm's rows (statistics in f32) feeding an f16 product.
    check_example("layernorm_matmul", &[("T", 37), ("D", 53), ("N", 29)]);
}

#[test]
fn rmsnorm_ffn_swiglu() {
    // RMSNorm, the gate and up products, silu(g) * u, the down product.
    check_example("rmsnorm_ffn_swiglu", &[("T", 37), ("D", 29), ("F", 53)]);
}

#[test]
fn lstm_cell() {
    // One cell: the gates as two products into one tensor (`+=!` then
    // `+=`), then the nonlinearities; 4 * H = 52 gate columns.
    check_example("lstm_cell", &[("B", 37), ("I", 29), ("H", 13)]);
}

#[test]
fn every_example_is_tested() {
    let tested = [
        "attention_alibi",
        "attention_bigbird",
        "attention_causal",
        "attention_decode_alibi",
        "attention_decode_causal",
        "attention_decode_gqa",
        "attention_decode_softcap",
        "attention_global",
        "attention_gqa",
        "attention_lse",
        "attention_softcap",
        "attention_window",
        "conv2d",
        "conv2d_strided",
        "dilated_rnn",
        "fcrelu",
        "fcrelu_f16",
        "gemm",
        "gemm_bias_gelu_f16",
        "gemm_chain",
        "gemm_f16",
        "grid_rnn",
        "layernorm",
        "layernorm_matmul",
        "lstm",
        "lstm_cell",
        "matvec",
        "maxpool2x2",
        "quant_fp8",
        "rmsnorm_ffn_swiglu",
        "rnn",
        "softmax",
        "softmax_fused",
        "stacked_lstm",
        "stacked_rnn",
        "tbmm",
        "tbmm_bf16",
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            if path.extension()? != "json" {
                return None;
            }
            Some(path.file_stem()?.to_string_lossy().into_owned())
        })
        .collect();
    found.sort();
    assert_eq!(
        found, tested,
        "examples/ and the tests in tests/integration/examples.rs disagree; add a test for each new example"
    );
}

#[test]
fn gemm_deps_mention_flow() {
    let args: Vec<String> = vec![
        "schedule".into(),
        example("gemm").display().to_string(),
        "--emit".into(),
        "deps".into(),
    ];
    let out = polyfuse().args(&args).output().expect("polyfuse starts");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("flow"),
        "no flow dependence printed: {}",
        describe(&args, &out)
    );
}

#[test]
fn unknown_tensor_is_a_bad_input() {
    let path = std::env::temp_dir().join(format!(
        "polyfuse-unknown-tensor-{}.json",
        std::process::id()
    ));
    let program = r#"{
  "name": "bad",
  "params": {"M": 8, "N": 8, "K": 8},
  "inputs": {
    "A": {"dtype": "f32", "shape": ["M", "K"]},
    "B": {"dtype": "f32", "shape": ["K", "N"]}
  },
  "outputs": {
    "C": {"dtype": "f32", "shape": ["M", "N"]}
  },
  "body": [
    "C(i, j) +=! A(i, k) * Nowhere(k, j)"
  ]
}
"#;
    std::fs::write(&path, program).expect("write the temporary program");
    let file = path.display().to_string();
    let args: Vec<String> = vec!["schedule".into(), file.clone()];
    let out = polyfuse().args(&args).output();
    let _ = std::fs::remove_file(&path);
    let out = out.expect("polyfuse starts");

    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&file),
        "stderr does not name {file}: {}",
        describe(&args, &out)
    );
}
