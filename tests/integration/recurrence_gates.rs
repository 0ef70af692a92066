//! An LSTM step's gates in one kernel (issues 35 and 36): under a loop
//! block's host loops, the initialisation of the gates `G`, both products
//! into it and its bias (`G +=! H W; G += H' U; G = G + b`) share one band
//! (`schedule::sums` on the sequence of one host step), so each step
//! launches two kernels (the gates, the cell) instead of five: the default
//! (`GpuOptions::fuse_step_sums`; `--no-fuse-step-sums` keeps them apart).
//! Checked here: the kernels per step of the LSTM programs in both recurrence
//! modes, the accumulators in registers, the fused programs executed in
//! the emulation (race detector on) at sizes off every tile grid, and
//! programs the rewrite must not fuse.

use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn polyfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .current_dir(ROOT)
        .args(args)
        .output()
        .expect("polyfuse starts")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `polyfuse schedule FILE ARGS --emit EMIT`'s output; it must succeed.
fn emit(file: &str, emit: &str, args: &[&str]) -> String {
    let mut all = vec![
        "schedule",
        file,
        "--emit",
        emit,
        "--no-cache",
        "--fuse-step-sums",
    ];
    all.extend(args);
    let out = polyfuse(&all);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The filter above each kernel below the first host loop of the mapped
/// tree (the statements of each kernel a host step launches).
fn kernels_per_step(file: &str, args: &[&str]) -> Vec<String> {
    let tree = emit(file, "gpu-tree", args);
    let lines: Vec<&str> = tree.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let Some(host) = lines.iter().position(|l| l.contains("mark: host_loop_")) else {
        panic!("no host loop:\n{tree}");
    };
    let below: Vec<&str> = lines[host + 1..]
        .iter()
        .take_while(|l| indent(l) > indent(lines[host]))
        .copied()
        .collect();
    below
        .windows(2)
        .filter(|w| w[1].trim_start().starts_with("mark: kernel_"))
        .map(|w| w[0].trim().to_string())
        .collect()
}

/// Whether `run FILE --check` with `args` checks.
fn checks(file: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["run", file, "--check", "--no-cache", "--fuse-step-sums"];
    all.extend(args);
    let out = polyfuse(&all);
    let ok = out.status.success()
        && String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("check: ok"));
    if ok {
        Ok(())
    } else {
        Err(format!("polyfuse {}\n{}", all.join(" "), text(&out)))
    }
}

/// `--param` for each of `params`.
fn with_params<'a>(args: &[&'a str], params: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    for p in params {
        all.extend(["--param", p]);
    }
    all
}

#[test]
fn an_lstm_steps_gates_are_one_kernel_with_the_bias() {
    // (file, options, the gates' statements: initialisation, both sums,
    // bias). Before: five kernels a step (init, each sum, bias, cell).
    let cases: [(&str, &[&str], [&str; 4]); 4] = [
        (
            "bench/recurrences/stacked_lstm.json",
            &[],
            ["S3_init[", "S3[", "S4[", "S5["],
        ),
        (
            "bench/recurrences/stacked_lstm.json",
            &["--recurrence", "steps"],
            ["S3_init[", "S3[", "S4[", "S5["],
        ),
        ("examples/lstm.json", &[], ["S2_init[", "S2[", "S3[", "S4["]),
        (
            "examples/lstm.json",
            &["--recurrence", "wavefront"],
            ["S2_init[", "S2[", "S3[", "S4["],
        ),
    ];
    for (file, args, gates) in cases {
        let kernels = kernels_per_step(file, args);
        assert_eq!(kernels.len(), 2, "{file} {args:?}: {kernels:#?}");
        for s in gates {
            assert!(kernels[0].contains(s), "{file} {args:?}: {s} {kernels:#?}");
        }
    }
}

#[test]
fn the_fused_gates_keep_their_accumulators_in_registers() {
    // The gates' kernel of the stacked LSTM (the first below the host
    // loop, `kernel_3`) accumulates in a register tile and writes `G` to
    // memory once per element, after the bias: no `t_G[..] = t_G[..] + ..`.
    let cuda = emit("bench/recurrences/stacked_lstm.json", "cuda", &[]);
    let start = cuda
        .find("void __launch_bounds__(256) kernel_3(")
        .unwrap_or_else(|| panic!("{cuda}"));
    let end = cuda[start..]
        .find("\n}\n")
        .map_or(cuda.len(), |e| start + e);
    let kernel = &cuda[start..end];
    assert!(kernel.contains("pf_reg_kernel_3_G"), "{kernel}");
    assert!(
        kernel.contains("= (pf_reg_kernel_3_G[pf_rz][pf_ry][pf_rx] + pf_shared_kernel_3_bias["),
        "the bias on the registers: {kernel}"
    );
    for line in kernel.lines().filter(|l| l.contains("t_G[")) {
        let (lhs, rhs) = line.split_once("] = ").unwrap_or(("", line));
        if lhs.contains("t_G[") {
            assert!(rhs.starts_with("(pf_reg_kernel_3_G"), "{line}");
        }
    }
}

#[test]
fn the_fused_gates_check_in_the_emulation_off_the_tile_grid() {
    // Sizes off every tile grid (32, 16, 8, 4), in both recurrence modes,
    // with default and with small tiles, blocks and grids; the gates are
    // one kernel a step at these sizes too.
    let programs: [(&str, &[&str]); 2] = [
        (
            "bench/recurrences/stacked_lstm.json",
            &["L=3", "T=7", "B=5", "H=37"],
        ),
        ("examples/lstm.json", &["T=7", "B=5", "I=19", "H=37"]),
    ];
    let mut failures = Vec::new();
    for (file, params) in programs {
        for recurrence in ["wavefront", "steps"] {
            let mode = ["--recurrence", recurrence];
            let kernels = kernels_per_step(file, &with_params(&mode, params));
            assert_eq!(kernels.len(), 2, "{file} {recurrence}: {kernels:#?}");
            for small in [false, true] {
                let mut args = vec!["--target", "emulate", "--recurrence", recurrence];
                if small {
                    args.extend(["--tile", "16,8,4", "--block", "4,2", "--grid", "2,3"]);
                }
                if let Err(e) = checks(file, &with_params(&args, params)) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// examples/lstm.json with `extra` (statements, each with a trailing
/// comma) before its first statement, `between` between the two sums, and
/// the second sum (the recurrent product) as `second`; with a temp `P`.
fn lstm_variant(extra: &str, between: &str, second: &str) -> String {
    let text = std::fs::read_to_string(format!("{ROOT}/examples/lstm.json")).unwrap();
    let replace = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1)
    };
    let original = r#""G(t, g, b, h) += Hs(t - 1, b, j) * Wh(g, j, h) * 0.15","#;
    let text = replace(text, original, &format!("{between}\"{second}\","));
    let body = r#""body": ["#;
    let text = replace(text, body, &format!("{body} {extra}"));
    let temps = r#""G": { "dtype": "f32", "shape": ["T+1", 4, "B", "H"] }"#;
    let p = r#""P": { "dtype": "f32", "shape": ["T+1", "B", "H"] }"#;
    replace(text, temps, &format!("{temps}, {p}"))
}

#[test]
fn sums_the_rewrite_must_not_fuse_stay_apart_and_check() {
    let dir = std::env::temp_dir().join(format!("polyfuse-gates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = "G(t, g, b, h) += Hs(t - 1, b, j) * Wh(g, j, h) * 0.15";
    // (what, the program, its first sum's initialisation, its second sum)
    let variants = [
        // The second sum reads the accumulator itself (the last step's
        // gate 0, its first step from a row written before the block):
        // not a sum of tensors the run does not write.
        (
            "reads G",
            lstm_variant(
                r#""G(t, g, b, h) = bias(g, h) where t in 0:1","#,
                "",
                "G(t, g, b, h) += G(t - 1, 0, b, j) * Wh(g, j, h) * 0.01",
            ),
            "S3_init[",
            "S4[",
        ),
        // A sum between the two reads the first's result at every element
        // of gate 0: the two sums are no run of consecutive children, and
        // one band would let the second update elements before it reads
        // them.
        (
            "read between",
            lstm_variant("", r#""P(t, b, h) +=! G(t, 0, b, j) * 0.01","#, plain),
            "S2_init[",
            "S4[",
        ),
    ];
    let mut failures = Vec::new();
    for (what, json, init, second) in variants {
        let file = dir.join(format!("{}.json", what.replace(' ', "_")));
        std::fs::write(&file, &json).unwrap();
        let file = file.to_str().unwrap();
        let kernels = kernels_per_step(file, &[]);
        assert!(
            kernels.iter().any(|k| k.contains(init)),
            "{what}: {kernels:#?}\n{json}"
        );
        assert!(
            !kernels
                .iter()
                .any(|k| k.contains(init) && k.contains(second)),
            "{what}: {kernels:#?}\n{json}"
        );
        for recurrence in ["wavefront", "steps"] {
            let args = ["--target", "emulate", "--recurrence", recurrence];
            let params = ["T=5", "B=3", "I=11", "H=13"];
            if let Err(e) = checks(file, &with_params(&args, &params)) {
                failures.push(format!("{what}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn an_accumulator_that_every_step_reuses_is_fused_too() {
    // `Y(b, n)` names no block index: each step starts it over (`+=!`),
    // sums both products into it and reads it (at two elements, so after
    // the band). The host loop orders the steps; inside one, the
    // initialisation and both sums share one kernel.
    let json = r#"{"name": "reuse", "params": {"T": 6, "B": 5, "I": 19, "H": 37},
        "inputs": {"X": {"dtype": "f32", "shape": ["T", "B", "I"]},
                   "W": {"dtype": "f32", "shape": ["I", "H"]},
                   "U": {"dtype": "f32", "shape": ["H", "H"]},
                   "H0": {"dtype": "f32", "shape": ["B", "H"]}},
        "outputs": {"Hs": {"dtype": "f32", "shape": ["T+1", "B", "H"]}},
        "temps": {"Y": {"dtype": "f32", "shape": ["B", "H"]}},
        "body": ["Hs(t, b, h) = H0(b, h) where t in 0:1",
                 {"for": "t in 1:T+1", "body": [
                    "Y(b, n) +=! X(t - 1, b, k) * W(k, n) * 0.1",
                    "Y(b, n) += Hs(t - 1, b, j) * U(j, n) * 0.1",
                    "Hs(t, b, h) = tanh(Y(b, h)) * Y(b, H - 1 - h)"]}]}"#;
    let dir = std::env::temp_dir().join(format!("polyfuse-gates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reuse.json");
    std::fs::write(&file, json).unwrap();
    let file = file.to_str().unwrap();
    let mut failures = Vec::new();
    for recurrence in ["wavefront", "steps"] {
        let kernels = kernels_per_step(file, &["--recurrence", recurrence]);
        assert_eq!(kernels.len(), 2, "{recurrence}: {kernels:#?}");
        for s in ["S1_init[", "S1[", "S2["] {
            assert!(kernels[0].contains(s), "{recurrence}: {s} {kernels:#?}");
        }
        for small in [false, true] {
            let mut args = vec!["--target", "emulate", "--recurrence", recurrence];
            if small {
                args.extend(["--tile", "16,8,4", "--block", "4,2", "--grid", "2,3"]);
            }
            if let Err(e) = checks(file, &args) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn with_no_fuse_step_sums_a_steps_gates_stay_in_kernels_of_their_own() {
    // The initialisation, each sum and the bias keep a kernel each.
    let out = polyfuse(&[
        "schedule",
        "bench/recurrences/stacked_lstm.json",
        "--emit",
        "gpu-tree",
        "--no-cache",
        "--no-fuse-step-sums",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let tree = String::from_utf8_lossy(&out.stdout);
    let host = tree.find("mark: host_loop_").expect("a host loop");
    let kernels = tree[host..].matches("mark: kernel_").count();
    // Five a step (init, two sums, bias, cell) and the output's copy.
    assert_eq!(kernels, 6, "{tree}");
}
