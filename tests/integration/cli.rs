//! The command-line program as a shell user meets it.

use std::io::Read;
use std::process::{Command, Stdio};

/// `polyfuse schedule F --emit cuda | head -c 0`: the reader has closed
/// the pipe before polyfuse prints (it compiles first); polyfuse ends
/// quietly (SIGPIPE), with no panic message.
#[test]
fn a_reader_that_closes_the_pipe_early_gets_no_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["schedule", "examples/layernorm.json", "--emit", "cuda"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(status.code(), Some(101), "{stderr}");
}

/// Index names are the user's: `t` (a name polyfuse once used inside its
/// own isl text) must mean the user's index and nothing else.
#[test]
fn an_index_named_t_is_an_ordinary_index() {
    let dir = std::env::temp_dir().join(format!("polyfuse-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gemm_t.json");
    std::fs::write(
        &file,
        r#"{ "name": "gemm_t", "params": {"M": 37, "N": 53, "K": 29},
             "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
             "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
             "body": ["C(t, j) +=! A(t, k) * B(k, j)"] }"#,
    )
    .unwrap();
    for target in ["cpu", "emulate"] {
        let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .args(["run", file.to_str().unwrap(), "--check", "--target", target])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{target}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("check: ok"), "{target}: {stdout}");
    }
}

/// `--vector N` groups a thread's register points (and lays shared tiles
/// out for them); the emulation of the grouped mapping passes its check
/// at sizes no multiple of the tiles, and a width polyfuse does not print
/// is an input error (exit 2) naming the file.
#[test]
fn register_groups_are_chosen_on_the_command_line() {
    let polyfuse = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .args(["--no-cache"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let sizes = ["--param", "M=300", "--param", "N=260", "--param", "K=44"];
    let with_sizes = |args: &[&'static str]| [args, &sizes[..]].concat();
    // At these sizes a thread has 2 x 2 registers: groups of 2.
    let cuda_args = [
        "schedule",
        "examples/gemm.json",
        "--emit",
        "cuda",
        "--vector",
        "2",
    ];
    let (code, cuda, err) = polyfuse(&with_sizes(&cuda_args));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        cuda.contains("(pf_i)threadIdx.x * 2 + pf_rx % 2;"),
        "{cuda}"
    );
    let run_args = [
        "run",
        "examples/gemm.json",
        "--target",
        "emulate",
        "--check",
        "--vector",
        "2",
    ];
    let (code, out, err) = polyfuse(&with_sizes(&run_args));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("check: ok"), "{out}");
    let (code, _, err) = polyfuse(&[
        "schedule",
        "examples/gemm.json",
        "--emit",
        "cuda",
        "--vector",
        "3",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("examples/gemm.json") && err.contains("vector 3"),
        "{err}"
    );
}

/// `--version` names the build's source fingerprint, which
/// `scripts/gpu-check.sh` writes into its table: two builds of different
/// sources never print the same line.
#[test]
fn the_version_names_the_source_fingerprint() {
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.trim();
    let prefix = concat!("polyfuse ", env!("CARGO_PKG_VERSION"), " (source ");
    let hash = line
        .strip_prefix(prefix)
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(hash.len(), 16, "{line}");
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{line}");
}

/// `polyfuse schedule` of the GQA decoding example at KV = 300 in 37
/// slices, with `extra` arguments and, where given, a schedule timeout.
fn schedule_gqa_split_37(extra: &[&str], timeout: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polyfuse"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("POLYFUSE_CACHE", "off")
        .args([
            "schedule",
            "examples/attention_decode_gqa.json",
            "--param",
            "KV=300",
            "--split",
            "37",
        ])
        .args(extra);
    if let Some(t) = timeout {
        cmd.env("POLYFUSE_SCHEDULE_TIMEOUT", t);
    }
    cmd.output().unwrap()
}

#[test]
fn a_schedule_that_does_not_finish_falls_back_to_minimal_fusion() {
    // A split-k factor that does not divide the row: isl's scheduler does
    // not finish its integer lexicographic minimum (it ran for over 20
    // minutes); after the timeout polyfuse says so and compiles with
    // minimal fusion, and the result is a schedule like any other.
    let out = schedule_gqa_split_37(&[], Some("3"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("isl's scheduler did not finish in 3 s; compiling with minimal fusion"),
        "{stderr}"
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.starts_with("domain: "), "{tree}");
    // The same with the minimal fusion asked for: the same tree.
    let min = schedule_gqa_split_37(&["--strategy", "min"], None);
    assert!(min.status.success());
    assert_eq!(String::from_utf8_lossy(&min.stdout), tree);
    // A timeout that is no number of seconds: a bad input, before any
    // compilation.
    let bad = schedule_gqa_split_37(&[], Some("ten"));
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("POLYFUSE_SCHEDULE_TIMEOUT: expected whole seconds, got `ten`"),
        "{stderr}"
    );
    assert!(bad.stdout.is_empty());
}

#[test]
fn help_names_the_exit_statuses_and_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "2 bad input or an illegal transformation",
        "POLYFUSE_SCHEDULE_TIMEOUT (seconds, default 60)",
        "POLYFUSE_CACHE",
        "POLYFUSE_CUDA_ARCH",
        "POLYFUSE_DUMP:",
        "POLYFUSE_DUMP_DIR=DIR",
    ] {
        assert!(help.contains(needle), "--help lacks `{needle}`:\n{help}");
    }
}

#[test]
fn schedule_timings_name_every_stage_and_leave_the_output_alone() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "schedule",
            "examples/softmax_fused.json",
            "--emit",
            "cuda",
            "--no-cache",
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(&args)
            .output()
            .unwrap()
    };
    let plain = run(&[]);
    let timed = run(&["--timings"]);
    assert!(plain.status.success() && timed.status.success());
    assert_eq!(
        plain.stdout, timed.stdout,
        "--timings changed what is printed"
    );
    let err = String::from_utf8_lossy(&timed.stderr);
    let stages: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("timing: "))
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        stages,
        ["analysis", "schedule", "gpu", "gpu", "cpu", "total"],
        "{err}"
    );
    let ms = |l: &str| -> f64 { l.split_whitespace().rev().nth(1).unwrap().parse().unwrap() };
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("timing: ")).collect();
    let sum: f64 = lines[..5].iter().map(|l| ms(l)).sum();
    let total = ms(lines[5]);
    assert!(
        (sum - total).abs() < 0.5,
        "stages add to {sum} ms, total says {total} ms"
    );
    assert!(String::from_utf8_lossy(&plain.stderr)
        .lines()
        .all(|l| !l.starts_with("timing: ")));
}

/// The mapping's register tiles unroll and double-buffer on their own;
/// `--no-unroll --no-pipeline` turn both off, and a switch with its
/// `--no-` form is a usage error (status 2).
#[test]
fn the_unrolled_pipeline_has_switches_both_ways() {
    let cuda = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("POLYFUSE_CACHE", "off")
            .args(["schedule", "examples/gemm.json", "--emit", "cuda"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, on) = cuda(&[]);
    assert_eq!(code, Some(0));
    assert!(
        on.contains("pf_stage") && on.contains("#pragma unroll"),
        "{on}"
    );
    let (code, off) = cuda(&["--no-unroll", "--no-pipeline"]);
    assert_eq!(code, Some(0));
    assert!(!off.contains("pf_stage"), "{off}");
    let (code, _) = cuda(&["--unroll", "--no-unroll"]);
    assert_eq!(code, Some(2));
}

/// `POLYFUSE_DUMP`: the named stages on stderr, the output unchanged; with
/// `POLYFUSE_DUMP_DIR` one file a stage; an unknown stage is bad input
/// (status 2) that names the stages there are.
#[test]
fn stage_dumps_go_to_stderr_or_a_directory() {
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_polyfuse"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "schedule",
            "examples/gemm.json",
            "--no-cache",
        ]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let plain = run(&[]);
    let dumped = run(&[("POLYFUSE_DUMP", "deps,schedule")]);
    assert!(plain.status.success() && dumped.status.success());
    assert_eq!(plain.stdout, dumped.stdout, "a dump changed the output");
    let err = String::from_utf8_lossy(&dumped.stderr);
    let heads: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("polyfuse: dump of stage"))
        .collect();
    assert_eq!(
        heads,
        [
            "polyfuse: dump of stage deps (gemm):",
            "polyfuse: dump of stage schedule (gemm):"
        ],
        "{err}"
    );
    assert!(
        err.contains("S0[i, j, k] -> S0[i' = i, j' = j, k' = 1 + k]"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("polyfuse-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let to_dir = run(&[
        ("POLYFUSE_DUMP", "all"),
        ("POLYFUSE_DUMP_DIR", dir.to_str().unwrap()),
    ]);
    assert!(to_dir.status.success());
    assert!(!String::from_utf8_lossy(&to_dir.stderr).contains("dump of stage"));
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "gemm.cpu.txt",
            "gemm.deps.txt",
            "gemm.gpu.txt",
            "gemm.kernels.txt",
            "gemm.model.txt",
            "gemm.repair.txt",
            "gemm.schedule.txt"
        ]
    );
    let cpu = std::fs::read_to_string(dir.join("gemm.cpu.txt")).unwrap();
    assert!(cpu.contains("void pf_kernel("), "{cpu}");
    std::fs::remove_dir_all(&dir).unwrap();

    let bad = run(&[("POLYFUSE_DUMP", "deps,tiles")]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("unknown stage `tiles`") && err.contains("kernels"),
        "{err}"
    );
}

/// `POLYFUSE_CFLAGS` replaces the C compiler's flags (the test script
/// asks for `-O0`): a flag the compiler rejects reaches it, and the run
/// stops with the compiler's message instead of running old code.
#[test]
fn polyfuse_cflags_reach_the_c_compiler() {
    let run = |flags: &str| {
        Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["run", "examples/matvec.json", "--check", "--no-cache"])
            .env("POLYFUSE_CFLAGS", flags)
            .output()
            .unwrap()
    };
    let good = run("-O1");
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(good.status.success(), "{stdout}");
    assert!(stdout.contains("check: ok"), "{stdout}");
    let bad = run("-O1 --no-such-flag-for-polyfuse");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{stderr}");
    assert!(stderr.contains("no-such-flag-for-polyfuse"), "{stderr}");
}
