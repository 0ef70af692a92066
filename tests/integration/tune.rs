//! `polyfuse compare`, `polyfuse tune` and the compilation cache, through
//! the binary (and the C ABI for the cache): tables and JSON of CPU-only
//! comparisons, measured comparisons on the CPU, cache hits and misses,
//! key stability under renaming, concurrent writers, search determinism,
//! tuning against the default, and bad input.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::ptr::null_mut;

use polyfuse::tune::cache::{Cache, Key};
use polyfuse::tune::Variant;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("polyfuse-tune-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs polyfuse with the cache at `cache` (None: disabled).
fn polyfuse(args: &[&str], cache: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polyfuse"));
    cmd.args(args).current_dir(ROOT);
    match cache {
        Some(p) => cmd.env("POLYFUSE_CACHE", p),
        None => cmd.env("POLYFUSE_CACHE", "off"),
    };
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

const SMALL_GEMM: &str = r#"{"name": "gemm", "params": {"M": 48, "N": 40, "K": 32},
  "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
  "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
  "body": ["C(i, j) +=! A(i, k) * B(k, j)"]}"#;

/// The same program, renamed and written differently.
const SMALL_GEMM_RENAMED: &str = r#"{"name": "matmul",
  "params": {"R": 48, "S": 40, "T": 32},
  "inputs": {"X": {"dtype": "f32", "shape": ["R", "T"]},
             "W": {"dtype": "f32", "shape": ["T", "S"]}},
  "outputs": {"Y": {"dtype": "f32", "shape": ["R", "S"]}},
  "body": ["Y(r,s)   +=!   (X(r, u)) * W(u,s)"]}"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn compare_table_without_a_target_has_no_measured_columns() {
    let out = ok(&polyfuse(
        &[
            "compare",
            "examples/softmax.json",
            "--strategies",
            "isl,min,max",
            "--variant",
            "tile=16x16,shared=off",
        ],
        None,
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("softmax: 4 variants (N=128 D=256)"),
        "{out}"
    );
    let head = lines[1];
    for col in [
        "variant",
        "kernels",
        "launches",
        "blocks",
        "threads/blk",
        "smem/blk",
        "regs",
        "spills",
        "read MB",
        "write MB",
        "flop/B",
        "model us",
    ] {
        assert!(head.contains(col), "{col} in {head}");
    }
    assert!(!head.contains("time") && !head.contains("check"), "{head}");
    let rows: Vec<Vec<&str>> = lines[2..6]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    // --variant first, then --strategies
    assert_eq!(rows[0][1], "tile=16x16,shared=off");
    assert_eq!(rows[1][1], "default");
    assert_eq!(rows[2][1], "strategy=min");
    assert_eq!(rows[3][1], "strategy=max");
    for r in &rows {
        // "model us" is two words of the head, one cell of a row.
        assert_eq!(r.len(), 13, "{r:?}");
        let model_us: f64 = r[12].parse().unwrap();
        assert!(model_us > 0.0, "{r:?}");
        let kernels: usize = r[2].parse().unwrap();
        assert!(kernels >= 1);
        let read_mb: f64 = r[9].parse().unwrap();
        // softmax reads X (128 x 256 f32 = 0.131 MB) at least once
        assert!(read_mb >= 0.131, "{r:?}");
    }
    // minimal fusion launches more kernels than maximal fusion
    let k = |r: &Vec<&str>| r[3].parse::<usize>().unwrap();
    assert!(k(&rows[2]) > k(&rows[3]), "{out}");
    // the schedule trees follow the table
    assert!(
        out.contains("# 3 strategy=min") && out.contains("mark: kernel_0"),
        "{out}"
    );
}

#[test]
fn compare_json_without_a_target() {
    let out = ok(&polyfuse(
        &[
            "compare",
            "examples/gemm.json",
            "--json",
            "--variant",
            "default",
            "--variant",
            "tile=off",
        ],
        None,
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["program"], "gemm");
    assert_eq!(v["params"]["K"], 64);
    assert!(v.get("target").is_none());
    let rows = v["variants"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert!(
            r.get("time_us").is_none() && r.get("check").is_none(),
            "{r}"
        );
        assert!(r["schedule_tree"].as_str().unwrap().starts_with("domain:"));
        assert!(!r["kernels"].as_array().unwrap().is_empty());
        assert_eq!(r["flops"], 2 * 128 * 256 * 64);
        assert!(r["read_bytes"].as_u64().unwrap() >= 4 * (128 * 64 + 64 * 256));
        assert!(r["write_bytes"].as_u64().unwrap() >= 4 * 128 * 256);
        assert!(r["arithmetic_intensity"].as_f64().unwrap() > 0.0);
    }
    // tiling lowers the traffic of gemm
    let bytes = |r: &serde_json::Value| {
        r["read_bytes"].as_u64().unwrap() + r["write_bytes"].as_u64().unwrap()
    };
    assert!(
        bytes(&rows[0]) * 4 < bytes(&rows[1]),
        "{} vs {}",
        bytes(&rows[0]),
        bytes(&rows[1])
    );
}

#[test]
fn compare_measures_on_the_cpu_and_plots() {
    let dir = scratch("compare-cpu");
    let svg = dir.join("plot.svg");
    let out = ok(&polyfuse(
        &[
            "compare",
            "examples/softmax.json",
            "--strategies",
            "min,max",
            "--target",
            "cpu",
            "--runs",
            "2",
            "--no-trees",
            "--svg",
            svg.to_str().unwrap(),
        ],
        None,
    ));
    assert!(
        out.lines().nth(1).unwrap().ends_with("check  time us"),
        "{out}"
    );
    for row in out.lines().skip(2).take(2) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[cells.len() - 2], "ok", "{row}");
        assert!(
            cells[cells.len() - 1].parse::<f64>().unwrap() > 0.0,
            "{row}"
        );
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<svg") && text.contains("time (us)") && text.contains("#2 strategy=max"),
        "{text}"
    );
    let json = ok(&polyfuse(
        &[
            "compare",
            "examples/softmax.json",
            "--strategies",
            "max",
            "--target",
            "cpu",
            "--runs",
            "1",
            "--json",
        ],
        None,
    ));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["target"], "cpu");
    assert_eq!(v["variants"][0]["check"]["ok"], true);
    assert!(v["variants"][0]["time_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let dir = scratch("bad");
    let bad_file = write(
        &dir,
        "variants.txt",
        "# two variants\nstrategy=min\ntile=banana\n",
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "compare",
                "examples/gemm.json",
                "--variant",
                "strategy=fastest",
            ],
            "unknown strategy `fastest`",
        ),
        (
            vec!["compare", "examples/gemm.json", "--variant", "colour=red"],
            "unknown key `colour`",
        ),
        (
            vec![
                "compare",
                "examples/gemm.json",
                "--variants",
                bad_file.to_str().unwrap(),
            ],
            "line 3",
        ),
        (
            vec!["compare", "examples/nonexistent.json"],
            "nonexistent.json",
        ),
        (
            vec!["compare", "examples/gemm.json", "--variant", "split=4"],
            "no reduction chain",
        ),
        (
            vec!["tune", "examples/gemm.json", "--budget", "5 parsecs"],
            "budget",
        ),
        (
            vec![
                "tune",
                "examples/gemm.json",
                "--target",
                "cpu",
                "--mutation",
                "2",
            ],
            "probability",
        ),
        (vec!["tune", "examples/gemm.json", "--param", "M=0"], "M=0"),
        (
            vec![
                "compare",
                "examples/gemm.json",
                "--variant",
                "block=64x64x64",
            ],
            "larger than CUDA allows",
        ),
    ];
    for (args, message) in cases {
        let o = polyfuse(&args, None);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
    }
    // a symbolic parameter must be given
    let sym = write(
        &dir,
        "sym.json",
        &SMALL_GEMM.replace("\"M\": 48", "\"M\": null"),
    );
    for cmd in ["compare", "tune"] {
        let o = polyfuse(&[cmd, sym.to_str().unwrap(), "--target", "cpu"], None);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--param M=VALUE"), "{}", stderr(&o));
    }
}

fn tune_json(file: &str, extra: &[&str], cache: Option<&Path>) -> serde_json::Value {
    let mut args = vec![
        "tune", file, "--target", "cpu", "--runs", "2", "--json", "--budget", "60s",
    ];
    args.extend_from_slice(extra);
    let out = ok(&polyfuse(&args, cache));
    serde_json::from_str(&out).unwrap()
}

fn candidates(v: &serde_json::Value) -> Vec<String> {
    v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["variant"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn search_is_deterministic_under_a_seed() {
    let dir = scratch("seed");
    let f = write(&dir, "gemm.json", SMALL_GEMM);
    let f = f.to_str().unwrap();
    let random = [
        "--search",
        "random",
        "--seed",
        "11",
        "--max-candidates",
        "6",
        "--population",
        "3",
    ];
    let a = tune_json(f, &random, None);
    let b = tune_json(f, &random, None);
    assert_eq!(candidates(&a).len(), 6);
    assert_eq!(candidates(&a), candidates(&b));
    let mut other = random;
    other[3] = "12";
    assert_ne!(candidates(&a), candidates(&tune_json(f, &other, None)));
    // genetic: the first generation depends on the seed alone
    let genetic = [
        "--search",
        "genetic",
        "--seed",
        "11",
        "--max-candidates",
        "5",
        "--population",
        "5",
    ];
    let a = tune_json(f, &genetic, None);
    let b = tune_json(f, &genetic, None);
    assert_eq!(candidates(&a), candidates(&b));
    // the default is always the first candidate
    assert_eq!(candidates(&a)[0], Variant::default().canonical());
    let mut seen = std::collections::HashSet::new();
    assert!(
        candidates(&a).iter().all(|c| seen.insert(c.clone())),
        "no candidate twice"
    );
}

#[test]
fn tune_equals_or_beats_the_default_and_fills_the_cache() {
    let dir = scratch("tune");
    let cache = dir.join("cache.sqlite");
    let f = write(&dir, "gemm.json", SMALL_GEMM);
    let f = f.to_str().unwrap();
    let v = tune_json(
        f,
        &["--max-candidates", "8", "--population", "4", "--seed", "3"],
        Some(&cache),
    );
    let default = v["default"]["time_us"].as_f64().unwrap();
    let best = v["best"]["time_us"].as_f64().unwrap();
    assert!(best <= default, "{best} > {default}");
    assert!(v["speedup"].as_f64().unwrap() >= 1.0);
    assert_eq!(v["cache"]["path"], cache.to_str().unwrap());
    let best_variant = v["best"]["variant"].as_str().unwrap().to_string();

    // a hit: run uses the tuned options and the cached compiled program
    let o = checked_run_with_tuned_options(f, &cache);
    assert!(
        stderr(&o).contains("compiled program from the cache"),
        "{}",
        stderr(&o)
    );
    let label = Variant::parse(&best_variant).unwrap().label();
    assert!(stderr(&o).contains(&label), "{label}: {}", stderr(&o));
    // schedule too
    let o = polyfuse(&["schedule", f], Some(&cache));
    assert!(ok(&o).starts_with("domain:"));
    assert!(stderr(&o).contains("using tuned options"), "{}", stderr(&o));
    // options given, the cache disabled, another size: no lookup
    for (args, c) in [
        (
            vec!["run", f, "--check", "--strategy", "isl"],
            Some(cache.as_path()),
        ),
        (
            vec!["run", f, "--check", "--no-cache"],
            Some(cache.as_path()),
        ),
        (vec!["run", f, "--check"], None),
        (
            vec!["run", f, "--check", "--param", "M=64"],
            Some(cache.as_path()),
        ),
        (
            vec!["run", f, "--check", "--target", "emulate"],
            Some(cache.as_path()),
        ),
    ] {
        let o = polyfuse(&args, c);
        assert!(ok(&o).contains("check: ok"));
        assert!(!stderr(&o).contains("cache"), "{args:?}: {}", stderr(&o));
    }
    // renamed and reformatted: the tuned options, compiled anew
    let renamed = write(&dir, "renamed.json", SMALL_GEMM_RENAMED);
    let o = polyfuse(&["run", renamed.to_str().unwrap(), "--check"], Some(&cache));
    assert!(ok(&o).contains("check: ok"));
    assert!(stderr(&o).contains("using tuned options"), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("compiled program from the cache"),
        "{}",
        stderr(&o)
    );

    // list, export, clear, import
    let list = ok(&polyfuse(&["cache", "list"], Some(&cache)));
    let tuned: Vec<&str> = list.lines().filter(|l| l.starts_with('*')).collect();
    assert_eq!(tuned.len(), 1, "{list}");
    assert!(
        tuned[0].contains(&best_variant) && tuned[0].contains("p0=48,p1=40,p2=32"),
        "{list}"
    );
    let export = dir.join("export.jsonl");
    ok(&polyfuse(
        &["cache", "export", export.to_str().unwrap()],
        Some(&cache),
    ));
    assert!(ok(&polyfuse(&["cache", "clear"], Some(&cache))).starts_with("removed"));
    let o = polyfuse(&["run", f, "--check"], Some(&cache));
    assert!(!stderr(&o).contains("cache"), "{}", stderr(&o));
    let other = dir.join("other.sqlite");
    assert!(ok(&polyfuse(
        &["cache", "import", export.to_str().unwrap()],
        Some(&other)
    ))
    .starts_with("imported"));
    let o = polyfuse(&["run", f, "--check"], Some(&other));
    assert!(
        stderr(&o).contains("compiled program from the cache"),
        "{}",
        stderr(&o)
    );
    // a broken export is bad input
    let broken = write(&dir, "broken.jsonl", "{\"key\": \"x\"}\n");
    let o = polyfuse(&["cache", "import", broken.to_str().unwrap()], Some(&other));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("line 1"), "{}", stderr(&o));
}

#[test]
fn concurrent_writers_lose_nothing() {
    let dir = scratch("concurrent");
    let path = dir.join("cache.sqlite");
    let program = polyfuse::frontend::load_str(SMALL_GEMM, "gemm.json").unwrap();
    // threads, each with its own connection (as separate processes have)
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            let program = program.clone();
            std::thread::spawn(move || {
                let mut db = Cache::open(&path).unwrap();
                let key = Key::new(&program, &format!("arch{t}"));
                for i in 0..20 {
                    let v = Variant::parse(&format!("tile={}", i + 1)).unwrap();
                    db.record(&key, &v, Some(100.0 - i as f64), None).unwrap();
                    db.set_best(&key, &v, 100.0 - i as f64, None).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let db = Cache::open(&path).unwrap();
    let entries = db.list().unwrap();
    assert_eq!(entries.len(), 80);
    assert_eq!(entries.iter().filter(|e| e.tuned).count(), 4);
    for t in 0..4 {
        let key = Key::new(&program, &format!("arch{t}"));
        assert_eq!(
            db.best(&key).unwrap(),
            Some((Variant::parse("tile=20").unwrap(), Some(81.0)))
        );
    }
    // processes: three imports and a tune at once into one cache
    let shared = dir.join("shared.sqlite");
    let mut files = Vec::new();
    for p in 0..3 {
        let src = dir.join(format!("src{p}.sqlite"));
        let mut db = Cache::open(&src).unwrap();
        for i in 0..10 {
            let prog = polyfuse::frontend::load_str(
                &SMALL_GEMM.replace("\"M\": 48", &format!("\"M\": {}", 100 * p + i + 1)),
                "g.json",
            )
            .unwrap();
            db.set_best(
                &Key::new(&prog, "cpu"),
                &Variant::default(),
                1.0 + i as f64,
                None,
            )
            .unwrap();
        }
        let out = dir.join(format!("export{p}.jsonl"));
        std::fs::write(&out, db.export().unwrap()).unwrap();
        files.push(out);
    }
    let f = write(&dir, "gemm.json", SMALL_GEMM);
    let mut children: Vec<std::process::Child> = files
        .iter()
        .map(|f| {
            Command::new(env!("CARGO_BIN_EXE_polyfuse"))
                .args(["cache", "import", f.to_str().unwrap()])
                .env("POLYFUSE_CACHE", &shared)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    children.push(
        Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .args([
                "tune",
                f.to_str().unwrap(),
                "--target",
                "cpu",
                "--max-candidates",
                "3",
                "--runs",
                "1",
            ])
            .env("POLYFUSE_CACHE", &shared)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let db = Cache::open(&shared).unwrap();
    let entries = db.list().unwrap();
    assert_eq!(
        entries.iter().filter(|e| e.tuned).count(),
        31,
        "30 imported, 1 tuned"
    );
}

#[test]
fn the_c_abi_consults_the_cache() {
    use polyfuse::capi::*;
    let dir = scratch("capi");
    let path = dir.join("cache.sqlite");
    let program =
        polyfuse::frontend::load_file(&Path::new(ROOT).join("examples/gemm.json")).unwrap();
    let tuned = Variant::parse("tile=16x8x4,sink=off").unwrap();
    let compiled = polyfuse::compile(&program, &tuned.options(false)).unwrap();
    Cache::open(&path)
        .unwrap()
        .set_best(&Key::new(&program, "cpu"), &tuned, 5.0, Some(&compiled))
        .unwrap();
    let file = CString::new(format!("{ROOT}/examples/gemm.json")).unwrap();
    let cache = CString::new(path.to_str().unwrap()).unwrap();
    let compile = |set_cache: bool, strategy: Option<&str>| -> (i32, String) {
        let mut ctx = null_mut();
        let mut r = null_mut();
        let mut from = -1;
        let mut tree: *mut c_char = null_mut();
        // SAFETY: valid handles, C strings and output places.
        unsafe {
            assert_eq!(pf_context_create(&mut ctx), PF_OK);
            assert_eq!(pf_context_load_file(ctx, file.as_ptr()), PF_OK);
            let p = if set_cache {
                cache.as_ptr()
            } else {
                std::ptr::null()
            };
            assert_eq!(pf_context_set_cache(ctx, p), PF_OK);
            if let Some(s) = strategy {
                let s = CString::new(s).unwrap();
                assert_eq!(pf_context_set_strategy(ctx, s.as_ptr()), PF_OK);
            }
            assert_eq!(pf_compile(ctx, &mut r), PF_OK);
            assert_eq!(pf_result_from_cache(r, &mut from), PF_OK);
            assert_eq!(pf_result_schedule_tree(r, &mut tree), PF_OK);
            let text = CStr::from_ptr(tree).to_str().unwrap().to_string();
            assert_eq!(pf_string_free(tree), PF_OK);
            assert_eq!(pf_result_destroy(r), PF_OK);
            assert_eq!(pf_context_destroy(ctx), PF_OK);
            (from, text)
        }
    };
    let (from, tree) = compile(true, None);
    assert_eq!(from, 2);
    assert_eq!(tree, compiled.tree.to_string());
    let (from, tree) = compile(true, Some("isl"));
    assert_eq!(from, 0);
    assert_ne!(tree, compiled.tree.to_string());
    assert_eq!(compile(false, None).0, 0);
    // SAFETY: a null output place is refused, not written.
    assert_eq!(
        unsafe { pf_result_from_cache(null_mut(), null_mut()) },
        PF_ERR_INVALID_HANDLE
    );
}

#[test]
fn without_a_driver_the_cuda_target_is_an_environment_fault() {
    if polyfuse::runtime::cuda::probe_driver().is_ok() {
        eprintln!("a CUDA driver is present: scripts/gpu-check.sh runs tune and compare there");
        return;
    }
    for args in [
        vec![
            "tune",
            "examples/gemm.json",
            "--target",
            "cuda",
            "--max-candidates",
            "2",
        ],
        vec!["compare", "examples/gemm.json", "--target", "cuda"],
    ] {
        let o = polyfuse(&args, None);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("no CUDA driver"), "{}", stderr(&o));
    }
    // without --target, tune says it falls back to the CPU
    let dir = scratch("fallback");
    let f = write(&dir, "gemm.json", SMALL_GEMM);
    let o = polyfuse(
        &[
            "tune",
            f.to_str().unwrap(),
            "--max-candidates",
            "1",
            "--runs",
            "1",
        ],
        None,
    );
    ok(&o);
    assert!(stderr(&o).contains("tuning on the CPU"), "{}", stderr(&o));
}

#[test]
fn candidates_can_be_checked_at_other_sizes() {
    let dir = scratch("check-param");
    let f = write(&dir, "gemm.json", SMALL_GEMM);
    let f = f.to_str().unwrap();
    let v = tune_json(
        f,
        &[
            "--check-param",
            "M=13",
            "--check-param",
            "K=7",
            "--max-candidates",
            "4",
            "--population",
            "4",
        ],
        None,
    );
    assert!(v["best"]["time_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["default"]["time_us"].as_f64().unwrap() > 0.0, "{v}");
    let o = polyfuse(
        &["tune", f, "--target", "cpu", "--check-param", "Q=3"],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("Q"), "{}", stderr(&o));
}

#[test]
fn programs_with_repair_directives_use_their_tuned_options_too() {
    // The fused softmax has a `schedule` key (a rolling update): its key
    // holds the directives, and the tuned options were measured with them,
    // so `run` uses them (before, such programs skipped the cache and a
    // tune of them had no effect).
    let dir = scratch("directives");
    let cache = dir.join("cache.sqlite");
    let f = "examples/softmax_fused.json";
    let v = tune_json(
        f,
        &["--max-candidates", "4", "--population", "4", "--seed", "1"],
        Some(&cache),
    );
    assert!(v["best"]["variant"].is_string(), "{v}");
    checked_run_with_tuned_options(f, &cache);
}

/// `run FILE --check` with `cache`: it checks ok and says it used the
/// tuned options.
fn checked_run_with_tuned_options(file: &str, cache: &Path) -> Output {
    let o = polyfuse(&["run", file, "--check"], Some(cache));
    assert!(ok(&o).contains("check: ok"));
    assert!(
        stderr(&o).contains("using tuned options from the cache"),
        "{}",
        stderr(&o)
    );
    o
}

#[test]
fn a_candidate_isl_does_not_schedule_in_time_fails_to_compile() {
    // The GQA decoding example at KV = 300 in 37 split-k slices: isl's
    // scheduler does not finish it with fusion (over 20 minutes). Each
    // such candidate is given the schedule timeout and recorded as failed
    // to compile, and the search ends.
    let dir = scratch("timeout");
    let text = std::fs::read_to_string(format!("{ROOT}/examples/attention_decode_gqa.json"))
        .unwrap()
        .replace("\"factor\": 4", "\"factor\": 37")
        .replace("\"KV\": 64", "\"KV\": 300");
    assert!(text.contains("\"factor\": 37") && text.contains("\"KV\": 300"));
    let file = write(&dir, "gqa37.json", &text);
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .args([
            "tune",
            file.to_str().unwrap(),
            "--target",
            "cpu",
            "--runs",
            "1",
        ])
        .args(["--json", "--max-candidates", "4", "--budget", "10m"])
        .env("POLYFUSE_CACHE", "off")
        .env("POLYFUSE_SCHEDULE_TIMEOUT", "3")
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(300),
        "{}",
        stderr(&out)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let errors: Vec<&str> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["error"].as_str())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("isl's scheduler did not finish in 3 s")),
        "{v}"
    );
    // Without a candidate that compiled and passed, tune says so (exit 2);
    // with one, it succeeds.
    match out.status.code() {
        Some(0) => assert!(v["best"].is_object(), "{v}"),
        Some(2) => assert!(
            stderr(&out).contains("no candidate compiled and passed its check"),
            "{}",
            stderr(&out)
        ),
        c => panic!("exit {c:?}: {}", stderr(&out)),
    }
    // `compare`: the row isl does not finish has that error, the row with
    // minimal fusion its schedule.
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .args(["compare", file.to_str().unwrap(), "--json"])
        .args(["--strategies", "isl,min"])
        .env("POLYFUSE_CACHE", "off")
        .env("POLYFUSE_SCHEDULE_TIMEOUT", "3")
        .current_dir(ROOT)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    let rows = v["variants"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert!(
        rows[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("isl's scheduler did not finish in 3 s")),
        "{v}"
    );
    assert!(rows[1].get("error").is_none(), "{v}");
    assert!(rows[1]["schedule_tree"]
        .as_str()
        .unwrap()
        .starts_with("domain:"));
}
