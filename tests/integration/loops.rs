//! Loop blocks (`{"for": "t in lo:hi", "body": [...]}`, the spec's
//! "Recurrences: loop blocks"): the model's domains and program order,
//! exact loop-carried dependences and their distances, the
//! read-before-write rule instance by instance, the errors, and execution
//! with `--check` on the CPU under every strategy and in the GPU emulation
//! (whose race proof and race detector run on every kernel).

use std::path::Path;
use std::process::{Command, Output};

use polyfuse::frontend::load_str;
use polyfuse::isl::{Isl, IslPrint};
use polyfuse::{deps, model, schedule};

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

/// Runs `file` with `--check` on the CPU under every strategy (and the
/// default), tiled and untiled, and in the GPU emulation with default and
/// with small blocks and grids; every run must check.
fn check_everywhere(file: &str, params: &[&str]) {
    assert!(Path::new(ROOT).join(file).is_file(), "{file}");
    let targets: [&[&str]; 4] = [
        &["--target", "cpu"],
        &["--target", "cpu", "--no-tile"],
        &["--target", "emulate"],
        &[
            "--target", "emulate", "--tile", "16,8,4", "--block", "4,2", "--grid", "2,3",
        ],
    ];
    let mut failures = Vec::new();
    for strategy in [
        None,
        Some("isl"),
        Some("min"),
        Some("max"),
        Some("canonical"),
    ] {
        for target in targets {
            let mut args = vec!["run", file, "--check"];
            if let Some(s) = strategy {
                args.extend(["--strategy", s]);
            }
            args.extend(target);
            for p in params {
                args.extend(["--param", p]);
            }
            let out = polyfuse(&args);
            let ok = out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.starts_with("check: ok"));
            if !ok {
                failures.push(format!("polyfuse {}\n{}", args.join(" "), text(&out)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn rnn_checks_everywhere() {
    // H(t, i) = tanh(sum_k W(i, k) X(t, k) + U(i, k) H(t - 1, k)), its
    // first step outside the block.
    check_everywhere("examples/rnn.json", &["T=13", "N=37"]);
}

#[test]
fn stacked_rnn_checks_everywhere() {
    // Nested blocks (l, t) reading H(l - 1, t, k) and H(l, t - 1, k).
    check_everywhere("examples/stacked_rnn.json", &["L=2", "T=11", "N=35"]);
}

#[test]
fn dilated_rnn_checks_everywhere() {
    // H(t - 3, k): three independent chains.
    check_everywhere("tests/programs/dilated_rnn.json", &["T=19", "N=33"]);
}

#[test]
fn symbolic_block_range_checks_everywhere() {
    // `T` is null in the file: the block `t in 1:T` gets it from --param.
    check_everywhere("tests/programs/rnn_symbolic.json", &["T=13", "N=37"]);
    let out = polyfuse(&["run", "tests/programs/rnn_symbolic.json", "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn elementwise_scan_and_accumulation_check_everywhere() {
    // C(t, i) = a C(t - 1, i) + b: every i its own chain (parallel on the
    // GPU, the t loop inside); S(t, i) +=! U(i, k) S(t - 1, k): a
    // reduction reading its own left side at the step before.
    check_everywhere("tests/programs/scan_recurrence.json", &["T=23", "N=45"]);
    // Y(i) += X(t, i) inside the block: a reduction across iterations.
    check_everywhere("tests/programs/accumulate_in_block.json", &["T=37", "N=41"]);
}

#[test]
fn reductions_that_start_over_in_each_iteration_check_everywhere() {
    // `Y1(i) min=! X1(j)` in a block: the initialisation runs again after
    // the updates of the iteration before, so the reduction may not be
    // spread over a warp's lanes across iterations (found by the fuzzer:
    // the mapping folded both iterations into one, an illegal schedule).
    check_everywhere("tests/programs/reinit_in_block.json", &[]);
}

#[test]
fn register_tiles_that_start_over_in_each_iteration_check_everywhere() {
    // The same with a register tile over the block's loop: its
    // initialisation may not be hoisted out of the loop (found by the
    // fuzzer: the registers started at 0 once and summed both iterations).
    check_everywhere("tests/programs/reinit_registers_in_block.json", &[]);
}

#[test]
fn a_skewed_block_on_blocks_of_one_thread_checks_everywhere() {
    // A block whose statements isl skews together: the race proof sends
    // it to blocks of one thread, which now map the program order (found
    // by the fuzzer: on the skewed schedule a register tile lost elements).
    check_everywhere("tests/programs/skewed_block_single_thread.json", &[]);
}

#[test]
fn a_softmax_in_each_iteration_checks_everywhere() {
    // A softmax applied three times in place, with row reductions (on
    // the lanes of a warp on the GPU) in every iteration.
    check_everywhere("tests/programs/softmax_in_block.json", &["N=37", "D=45"]);
}

#[test]
fn block_indices_lead_the_domains_and_the_program_order_nests() {
    let json = std::fs::read_to_string(Path::new(ROOT).join("examples/rnn.json")).unwrap();
    let p = load_str(&json, "rnn.json").unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let s1 = scop.statement("S1").unwrap();
    assert_eq!(s1.iterators, vec!["t", "i", "k"]);
    assert_eq!(scop.statement("S1_init").unwrap().iterators, vec!["t", "i"]);
    let expected = isl
        .set("[T, N] -> { S1[t, i, k] : T = 12 and N = 40 and 1 <= t < 12 and 0 <= i < 40 and 0 <= k < 40 }")
        .unwrap();
    assert!(
        s1.domain.is_equal(&expected).unwrap(),
        "{}",
        s1.domain.text()
    );
    // Program order: S0; then for each t: S1_init, S1, S2.
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    // The flow from H(t - 1, k) to the next step's product is exact: each
    // S2[t, k] feeds S1[t + 1, i, k] for every i, and the first step comes
    // from S0.
    let expected = isl
        .union_map(
            "[T, N] -> { S2[t, k] -> S1[t + 1, i, k] : T = 12 and N = 40 and 1 <= t <= 10 and 0 <= i < 40 and 0 <= k < 40; \
             S0[0, k] -> S1[1, i, k] : T = 12 and N = 40 and 0 <= i < 40 and 0 <= k < 40 }",
        )
        .unwrap();
    let flow_h = d
        .flow
        .copy()
        .unwrap()
        .intersect(
            isl.union_map("{ S2[t, k] -> S1[t', i, k'] ; S0[t, k] -> S1[t', i, k'] }")
                .unwrap(),
        )
        .unwrap();
    assert!(flow_h.is_equal(&expected).unwrap(), "{}", flow_h.text());
    // The program order itself is legal, and the read-before-write check
    // passes.
    schedule::check_legal("rnn.json", &order, &scop, &d).unwrap();
    model::check_reads_written(&isl, &p, &scop).unwrap();
}

#[test]
fn emit_deps_shows_the_distances_over_the_blocks() {
    let deps = |file: &str| {
        let out = polyfuse(&["schedule", file, "--emit", "deps"]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let rnn = deps("examples/rnn.json");
    assert!(rnn.contains("flow:   S2 -> S1 over (t): { [1] }"), "{rnn}");
    assert!(rnn.contains("flow:   S1 -> S2 over (t): { [0] }"), "{rnn}");
    let stacked = deps("examples/stacked_rnn.json");
    // H(l - 1, t, k) and H(l, t - 1, k): distances (1, 0) and (0, 1).
    assert!(
        stacked.contains("flow:   S3 -> S2 over (l, t): { [0, 1]; [1, 0] }"),
        "{stacked}"
    );
    let dilated = deps("tests/programs/dilated_rnn.json");
    assert!(
        dilated.contains("flow:   S2 -> S1 over (t): { [3] }"),
        "{dilated}"
    );
    // With a symbolic size, the distances as isl writes them.
    let symbolic = deps("tests/programs/rnn_symbolic.json");
    assert!(
        symbolic.contains("flow:   S2 -> S1 over (t): [T, N] -> { [1] : T >= 3 }"),
        "{symbolic}"
    );
    // A program without blocks prints no such section.
    let gemm = deps("examples/gemm.json");
    assert!(!gemm.contains("distances"), "{gemm}");
}

#[test]
fn recurrences_run_across_cuda_blocks_only_between_host_steps() {
    // The RNN's step reads all of H(t - 1, ..): every schedule of it has
    // the step loop outermost, carrying the dependence. By default that
    // loop runs on the host, and each step's kernels run on a grid, the
    // step passed as an argument; with `--recurrence serial` the kernel
    // runs on one block of one thread, never on a grid whose blocks would
    // need to wait for each other.
    for strategy in ["isl", "min", "max", "canonical"] {
        let cuda = |recurrence: &str| {
            let out = polyfuse(&[
                "schedule",
                "examples/rnn.json",
                "--emit",
                "cuda",
                "--strategy",
                strategy,
                "--recurrence",
                recurrence,
            ]);
            assert!(out.status.success(), "{}", text(&out));
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let serial = cuda("serial");
        let stepped = cuda("wavefront");
        for kernel in serial.split("__global__").skip(1) {
            if kernel.contains("tanhf") {
                assert!(
                    !kernel.contains("blockIdx"),
                    "--strategy {strategy}: a recurrent kernel on a grid:\n{kernel}"
                );
            }
        }
        let tanh = stepped
            .split("__global__")
            .skip(1)
            .find(|k| k.contains("tanhf"))
            .unwrap_or_default();
        assert!(
            tanh.contains("blockIdx") && tanh.contains("const pf_i c0 = pf_host_c0;"),
            "--strategy {strategy}: the step's kernel is not on a grid below the host loop:\n{tanh}"
        );
    }
    // An elementwise recurrence has independent chains: those run on the
    // grid (beside a dense one in the same file, on the host's steps).
    let out = polyfuse(&[
        "schedule",
        "tests/programs/scan_recurrence.json",
        "--emit",
        "cuda",
    ]);
    let cuda = String::from_utf8_lossy(&out.stdout);
    assert!(
        cuda.split("__global__")
            .any(|k| k.contains("0.5f") && k.contains("blockIdx.x")),
        "{cuda}"
    );
}

/// The `host_loop_*` marks of the mapped tree of `file` under `args`, in
/// order, and the notes printed on stderr.
fn host_loops(file: &str, args: &[&str]) -> (Vec<String>, String) {
    let mut all = vec!["schedule", file, "--emit", "gpu-tree"];
    all.extend(args);
    let out = polyfuse(&all);
    assert!(out.status.success(), "{}", text(&out));
    let marks = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mark: host_loop_"))
        .map(str::to_string)
        .collect();
    (marks, String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn the_mapped_tree_shows_host_steps_wavefronts_and_chains() {
    for strategy in ["isl", "min", "max", "canonical"] {
        let s = ["--strategy", strategy];
        assert_eq!(host_loops("examples/rnn.json", &s).0, ["steps"]);
        assert_eq!(host_loops("examples/lstm.json", &s).0, ["steps"]);
        // Layer and time skewed to w = l + t: one host loop.
        assert_eq!(host_loops("examples/stacked_rnn.json", &s).0, ["wavefront"]);
        assert_eq!(
            host_loops("examples/stacked_lstm.json", &s).0,
            ["wavefront"]
        );
        assert_eq!(host_loops("examples/grid_rnn.json", &s).0, ["wavefront"]);
        // Dilations 1, 2, 4: the first layer one step at a time, the
        // others 2 and 4 independent chains per launch.
        assert_eq!(
            host_loops("examples/dilated_rnn.json", &s).0,
            ["steps", "chains_2", "chains_4"]
        );
    }
    // Without skewing: the stacked network steps over l, then t.
    assert_eq!(
        host_loops("examples/stacked_rnn.json", &["--recurrence", "steps"]).0,
        ["steps", "steps"]
    );
    assert_eq!(
        host_loops("examples/dilated_rnn.json", &["--recurrence", "steps"]).0,
        ["steps", "steps", "steps"]
    );
    // Serial: no host loop, blocks of one thread.
    let out = polyfuse(&[
        "schedule",
        "examples/rnn.json",
        "--emit",
        "gpu-tree",
        "--recurrence",
        "serial",
    ]);
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(!tree.contains("host_loop_"), "{tree}");
}

#[test]
fn a_nest_whose_dependences_forbid_the_wavefront_is_not_skewed() {
    // Layer l at time t reads layer l - 1 at t + 1: distance (1, -1),
    // which w = l + t would run in one launch. w = 2l + t carries it.
    let (marks, _) = host_loops("tests/programs/antidiagonal_rnn.json", &[]);
    assert_eq!(marks, ["wavefront_2"]);
    check_stepped("tests/programs/antidiagonal_rnn.json", &["T=8", "N=11"]);
    // Layer l at time t reads layer l - 1 at T - t (a reversed layer):
    // distances (1, T - 2t) down to (1, -5) at T = 7, which no skew
    // f l + t with f <= 4 carries. The nest is stepped over l and t
    // instead, and a note says why.
    let (marks, notes) = host_loops("tests/programs/reversed_rnn.json", &[]);
    assert_eq!(marks, ["steps", "steps"]);
    assert!(
        notes.contains("no wavefront over (l, t)") && notes.contains("[1, -5]"),
        "{notes}"
    );
    check_stepped("tests/programs/reversed_rnn.json", &["T=8", "N=11"]);
}

/// Runs `file` with `--check` in the emulation (race detector on) under
/// every strategy, with host steps and with wavefronts, with default and
/// with small blocks and grids (pairwise, below); every run must check.
fn check_stepped(file: &str, params: &[&str]) {
    let mut failures = Vec::new();
    // Every pair of values of two of the three choices (strategy,
    // recurrence, tiles) in eight runs instead of sixteen: each strategy
    // with each recurrence, the two taking the small tiles in turn.
    for (i, strategy) in ["isl", "min", "max", "canonical"].into_iter().enumerate() {
        for (j, recurrence) in ["steps", "wavefront"].into_iter().enumerate() {
            let small = (i + j) % 2 == 1;
            let mut args = vec![
                "run",
                file,
                "--check",
                "--target",
                "emulate",
                "--strategy",
                strategy,
                "--recurrence",
                recurrence,
            ];
            if small {
                args.extend(["--tile", "16,8,4", "--block", "4,2", "--grid", "2,3"]);
            }
            for p in params {
                args.extend(["--param", p]);
            }
            let out = polyfuse(&args);
            let ok = out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.starts_with("check: ok"));
            if !ok {
                failures.push(format!("polyfuse {}\n{}", args.join(" "), text(&out)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// Host steps and wavefronts checked in the emulation, at sizes off every
// tile grid (16, 8, 4, 32, 64); a test each, so that they run side by side.

#[test]
fn host_steps_check_in_the_emulation_rnn() {
    check_stepped("examples/rnn.json", &["T=13", "N=37"]);
}

#[test]
fn host_steps_and_wavefronts_check_in_the_emulation_stacked_rnn() {
    check_stepped("examples/stacked_rnn.json", &["L=3", "T=11", "N=35"]);
}

#[test]
fn host_steps_check_in_the_emulation_lstm() {
    check_stepped("examples/lstm.json", &["T=7", "B=5", "H=33"]);
}

#[test]
fn host_steps_and_wavefronts_check_in_the_emulation_grid_rnn() {
    check_stepped("examples/grid_rnn.json", &["R=5", "S=7", "N=19"]);
}

#[test]
fn host_steps_and_chains_check_in_the_emulation_dilated_rnn() {
    check_stepped("examples/dilated_rnn.json", &["T=19", "N=21"]);
}

/// `{"T": 6, "N": 5}`, an input `X` and an output `H` (both T x N).
fn program(body: &str) -> String {
    format!(
        r#"{{ "name": "b", "params": {{ "T": 6, "N": 5 }},
             "inputs": {{ "X": {{ "dtype": "f32", "shape": ["T", "N"] }} }},
             "outputs": {{ "H": {{ "dtype": "f32", "shape": ["T", "N"] }} }},
             "body": [ {body} ] }}"#
    )
}

/// The message of the exit-2 error that compiling `body` gives.
fn refused(body: &str) -> String {
    let dir = std::env::temp_dir().join(format!("polyfuse-loops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    let file = dir.join(format!(
        "p{}-{}.json",
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        body.len()
    ));
    std::fs::write(&file, program(body)).unwrap();
    let out = polyfuse(&["schedule", file.to_str().unwrap(), "--emit", "deps"]);
    assert_eq!(out.status.code(), Some(2), "{body}\n{}", text(&out));
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn model_errors_in_blocks_name_the_statement() {
    let first = r#""H(t, i) = X(t, i) where t in 0:1""#;
    // No statement writes H(0, ..) before the first step reads it.
    // H(0, ..) is written, but after the block that reads it: loop blocks
    // run in program order.
    let e = refused(
        r#"{"for": "t in 1:T", "body": ["H(t, i) = X(t, i) + H(t - 1, i)"]}, "H(t, i) = X(t, i) where t in 0:1""#,
    );
    assert!(
        e.contains("statement 1 `H(t, i) = X(t, i) + H(t - 1, i)`: reads H(0, 0) before any statement writes it"),
        "{e}"
    );
    // A recurrence on a temp needs its declaration (its dtype is not the
    // right side's own when the right side reads it).
    let e = refused(
        r#"{"for": "t in 1:T", "body": ["G(t, i) = X(t, i) + G(t - 1, i)"]}, "H(t, i) = X(t, i)""#,
    );
    assert!(
        e.contains("statement 1 `G(t, i) = X(t, i) + G(t - 1, i)`: `G` is read by the statement that first writes it"),
        "{e}"
    );
    // Reading the next step: out of nothing written yet (and at the last
    // step out of bounds).
    let e = refused(&format!(
        r#"{first}, {{"for": "t in 1:T", "body": ["H(t, i) = X(t, i) + H(t + 1, i) where t < T - 1", "H(t, i) = X(t, i) where t >= T - 1"]}}"#
    ));
    assert!(
        e.contains("statement 2") && e.contains("before any statement writes it"),
        "{e}"
    );
    // Out of bounds through the block index.
    let e = refused(&format!(
        r#"{first}, {{"for": "t in 1:T+1", "body": ["H(t, i) = H(t - 1, i)"]}}"#
    ));
    assert!(
        e.contains("statement 2") && e.contains("out of bounds"),
        "{e}"
    );
    // A read of elements the statement writes in the same iteration.
    let e = refused(&format!(
        r#"{first}, {{"for": "t in 1:T", "body": ["H(t, i) +=! X(t, k) * H(t, k)"]}}"#
    ));
    assert!(
        e.contains("statement 2") && e.contains("same iteration of its loop blocks"),
        "{e}"
    );
    // An element read inside the block before a later statement of the
    // same iteration writes it.
    let e = refused(&format!(
        r#"{first}, {{"for": "t in 1:T", "body": ["H(t, i) = X(t, i) + H(t, 4) where i < 4", "H(t, i) = X(t, i) where i >= 4"]}}"#
    ));
    assert!(
        e.contains("statement 2") && e.contains("reads H(1, 4) before any statement writes it"),
        "{e}"
    );
    // No repair in a program with blocks.
    let out = polyfuse(&["schedule", "examples/rnn.json", "--repair", "rolling"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("loop blocks cannot be repaired"),
        "{}",
        text(&out)
    );
}

/// A small deterministic generator of recurrences (the fuzzer's blocks
/// repeat statements but never read an earlier iteration): elementwise,
/// dense and stacked recurrences with a dilation `d` of 1 to 3, sizes
/// 1 to 40 off any tile grid, f32 or f16 states, the step count literal or
/// symbolic, and sometimes a reduction over every step after the block.
/// The weights are scaled by 0.1: with weights in [-1, 1) a deep stacked
/// tanh recurrence amplifies f32's rounding inside a statement (which the
/// declared-precision run, in double, does not have) past the check's
/// bound even in program order (`--strategy canonical`), with no
/// transformation involved.
fn recurrence(seed: u64) -> (String, Vec<String>) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let d = 1 + next(3) as i64;
    let t = d + 1 + next(12) as i64;
    let n = 1 + next(40) as i64;
    let layers = 1 + next(3) as i64;
    let half = next(3) == 0;
    let symbolic = next(2) == 0;
    let kind = next(3);
    let dtype = if half { "f16" } else { "f32" };
    let cast = |e: &str| {
        if half {
            format!("f16({e})")
        } else {
            e.to_string()
        }
    };
    let read = |e: &str| {
        if half {
            format!("f32({e})")
        } else {
            e.to_string()
        }
    };
    let (state_shape, body) = match kind {
        // H(t, i) = 0.5 H(t - d, i) + X(t, i)
        0 => (
            r#"["T", "N"]"#.to_string(),
            format!(
                r#""H(t, i) = {} where t in 0:{d}",
                   {{"for": "t in {d}:T", "body": ["H(t, i) = {}"]}}"#,
                cast("X(t, i)"),
                cast(&format!("0.5 * {} + X(t, i)", read("H(t - D, i)")))
                    .replace('D', &d.to_string())
            ),
        ),
        // G(t, i) = sum_k U(i, k) H(t - d, k) + W(i, k) X(t, k); H = tanh(G)
        1 => (
            r#"["T", "N"]"#.to_string(),
            format!(
                r#""H(t, i) = {} where t in 0:{d}",
                   {{"for": "t in {d}:T", "body": [
                     "G(t, i) +=! 0.1 * U(i, k) * {} + 0.1 * W(i, k) * X(t, k)",
                     "H(t, i) = {}"]}}"#,
                cast("X(t, i)"),
                read(&format!("H(t - {d}, k)")),
                cast("tanh(G(t, i))")
            ),
        ),
        // Stacked: layer l reads layer l - 1 at t and itself at t - d.
        _ => (
            r#"["L+1", "T", "N"]"#.to_string(),
            format!(
                r#""H(l, t, i) = {} where l in 0:1",
                   "H(l, t, i) = {} where l in 1:L+1, t in 0:{d}",
                   {{"for": "l in 1:L+1", "body": [{{"for": "t in {d}:T", "body": [
                     "G(l, t, i) +=! 0.1 * U(i, k) * {} + 0.1 * W(i, k) * {}",
                     "H(l, t, i) = {}"]}}]}}"#,
                cast("X(t, i)"),
                cast("X(t, i) * 0.5"),
                read(&format!("H(l, t - {d}, k)")),
                read("H(l - 1, t, k)"),
                cast("tanh(G(l, t, i))")
            ),
        ),
    };
    let g_shape = if kind == 2 {
        r#"["L+1", "T", "N"]"#
    } else {
        r#"["T", "N"]"#
    };
    let (sum, sum_out) = if next(2) == 0 {
        let h = if kind == 2 { "H(L, t, i)" } else { "H(t, i)" };
        (
            format!(r#", "Y(i) +=! {}""#, read(h)),
            r#", "Y": {"dtype": "f32", "shape": ["N"]}"#,
        )
    } else {
        (String::new(), "")
    };
    let json = format!(
        r#"{{ "name": "rec{seed}",
             "params": {{ "T": {}, "N": {n}, "L": {layers} }},
             "inputs": {{ "X": {{ "dtype": "f32", "shape": ["T", "N"] }},
                          "U": {{ "dtype": "f32", "shape": ["N", "N"] }},
                          "W": {{ "dtype": "f32", "shape": ["N", "N"] }} }},
             "outputs": {{ "H": {{ "dtype": "{dtype}", "shape": {state_shape} }}{sum_out} }},
             "temps": {{ "G": {{ "dtype": "f32", "shape": {g_shape} }} }},
             "body": [ {body}{sum} ] }}"#,
        if symbolic {
            "null".to_string()
        } else {
            t.to_string()
        }
    );
    let params = if symbolic {
        vec![format!("T={t}")]
    } else {
        Vec::new()
    };
    (json, params)
}

#[test]
fn generated_recurrences_check_on_the_cpu_and_in_the_emulation() {
    let dir = std::env::temp_dir().join(format!("polyfuse-recurrences-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let strategies = ["isl", "min", "max"];
    let mut failures = Vec::new();
    // `POLYFUSE_RECURRENCE_SEEDS=N` tries N programs instead of 8.
    let seeds: u64 = std::env::var("POLYFUSE_RECURRENCE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for seed in 0..seeds {
        let (json, params) = recurrence(seed);
        let file = dir.join(format!("rec{seed}.json"));
        std::fs::write(&file, &json).unwrap();
        let file = file.to_str().unwrap().to_string();
        let strategy = strategies[seed as usize % 3];
        let targets: [&[&str]; 3] = [
            &["--target", "cpu"],
            &["--target", "emulate"],
            &[
                "--target", "emulate", "--tile", "16,8,4", "--block", "4,2", "--grid", "2,3",
            ],
        ];
        for target in targets {
            let mut args = vec!["run", file.as_str(), "--check", "--strategy", strategy];
            args.extend(target);
            for p in &params {
                args.extend(["--param", p.as_str()]);
            }
            let out = polyfuse(&args);
            let ok = out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.starts_with("check: ok"));
            if !ok {
                failures.push(format!(
                    "polyfuse {}\n{json}\n{}",
                    args.join(" "),
                    text(&out)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_recurrence_benchmarks_check_at_small_sizes_and_step_on_the_host_at_theirs() {
    // bench/recurrences/ (run on the GPU by its run.sh): each checked here
    // at sizes off every tile grid, in the emulation (host steps) and on
    // the CPU; at the file's sizes, the mapped tree has its host loops.
    let programs: [(&str, &[&str], &[&str]); 3] = [
        (
            "bench/recurrences/stacked_lstm.json",
            &["L=2", "T=9", "B=5", "H=19"],
            &["wavefront"],
        ),
        (
            "bench/recurrences/stacked_dilated_rnn.json",
            &["T=19", "B=3", "N=21"],
            &["steps", "chains_2", "chains_4", "chains_8"],
        ),
        (
            "bench/recurrences/grid_rnn.json",
            &["R=5", "S=6", "B=3", "N=19"],
            &["wavefront"],
        ),
    ];
    let mut failures = Vec::new();
    for (file, params, marks) in programs {
        assert_eq!(host_loops(file, &[]).0, marks, "{file}");
        for target in ["emulate", "cpu"] {
            let mut args = vec!["run", file, "--check", "--target", target];
            for p in params {
                args.extend(["--param", p]);
            }
            let out = polyfuse(&args);
            let ok = out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.starts_with("check: ok"));
            if !ok {
                failures.push(format!("polyfuse {}\n{}", args.join(" "), text(&out)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
