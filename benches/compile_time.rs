//! Compile time (issue 34): how long `polyfuse schedule FILE --emit cuda`
//! takes to schedule, map and print, for every example and bench program
//! and for generated programs that grow along one axis each:
//!
//! - a chain of N statements of maps and row reductions (N = 10 to 80);
//! - split-k decoding (`examples/attention_decode_gqa.json`) with the key
//!   length KV from 64 to 32768, the sizes pinned into every domain;
//! - a stacked recurrence unrolled by hand, one statement pair per cell of
//!   an L x T grid (2 x 4 to 4 x 8), no loop blocks.
//!
//! Each row: wall time of one compilation (after one untimed compilation of
//! the first program, so the process is warm), kernels, and whether the
//! watch fell back to minimal fusion (isl's scheduler past the limit).
//! Compilations run as the command line runs them (`compile_watched`, the
//! default options for the GPU, no cache).
//!
//! ```text
//! cargo bench --bench compile_time                 # print the table
//! cargo bench --bench compile_time -- --write      # also bench/COMPILE.md
//! cargo bench --bench compile_time -- chain        # rows whose name has `chain`
//! ```
//!
//! `POLYFUSE_SCHEDULE_TIMEOUT` sets the watch's limit (default 60 s).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use polyfuse::frontend::ast::Program;
use polyfuse::gpu::GpuOptions;
use polyfuse::pipeline::{compile_watched, Options, Watch, WatchEvent};

/// One measured compilation.
struct Row {
    name: String,
    group: &'static str,
    statements: usize,
    seconds: Option<f64>,
    kernels: usize,
    fallback: bool,
    error: Option<String>,
    /// Milliseconds of each stage (`Compiled::timings`), in order.
    stages: Vec<f64>,
}

/// `--emit cuda`'s options: the GPU mapping, no CPU kernel.
fn options() -> Options {
    Options {
        gpu: Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        }),
        cpu_kernel: false,
        ..Options::default()
    }
}

fn measure(name: String, group: &'static str, program: &Program, watch: Watch) -> Row {
    let mut options = options();
    let mut fallback = false;
    let t0 = Instant::now();
    let result = compile_watched(program, &mut options, watch, |e| {
        if matches!(e, WatchEvent::FellBack(_)) {
            fallback = true;
        }
    });
    let seconds = t0.elapsed().as_secs_f64();
    let statements = program.statements.len();
    match result {
        Ok(c) => Row {
            name,
            group,
            statements,
            seconds: Some(seconds),
            kernels: c.cuda.map(|p| p.kernels.len()).unwrap_or(0),
            fallback,
            error: None,
            stages: c.timings.iter().map(|t| t.seconds * 1e3).collect(),
        },
        Err(e) => Row {
            name,
            group,
            statements,
            seconds: None,
            kernels: 0,
            fallback,
            error: Some(e.to_string().lines().next().unwrap_or("").to_string()),
            stages: Vec::new(),
        },
    }
}

/// A chain of `n` statements over an R x C matrix: maps and row
/// reductions in turn (a map, a row sum of it, the map minus its row's
/// sum, ...), the last one an output.
fn chain(n: usize) -> String {
    let mut body = Vec::new();
    let mut temps = Vec::new();
    let mut cur = "X".to_string();
    let mut sum: Option<String> = None;
    for k in 1..=n {
        let last = k == n;
        let t = if last {
            "Y".to_string()
        } else {
            format!("t{k}")
        };
        match (k % 3, &sum) {
            (2, _) if !last => {
                let s = format!("s{k}");
                body.push(format!("{s}(r) +=! {cur}(r, c)"));
                temps.push(format!(
                    "\"{s}\": {{\"dtype\": \"f32\", \"shape\": [\"R\"]}}"
                ));
                sum = Some(s);
                continue;
            }
            (0, Some(s)) => body.push(format!("{t}(r, c) = {cur}(r, c) - {s}(r) * 0.01")),
            _ => body.push(format!("{t}(r, c) = exp({cur}(r, c) * 0.5)")),
        }
        if !last {
            temps.push(format!(
                "\"{t}\": {{\"dtype\": \"f32\", \"shape\": [\"R\", \"C\"]}}"
            ));
        }
        cur = t;
    }
    format!(
        r#"{{"name": "chain{n}", "params": {{"R": 4096, "C": 1024}},
 "inputs": {{"X": {{"dtype": "f32", "shape": ["R", "C"]}}}},
 "outputs": {{"Y": {{"dtype": "f32", "shape": ["R", "C"]}}}},
 "temps": {{{}}},
 "body": [{}]}}"#,
        temps.join(", "),
        body.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(",\n  ")
    )
}

/// A stacked recurrence unrolled by hand: cell (l, t) computes
/// `H_l_t = tanh(W_l H_{l-1}_t + U_l H_l_{t-1})`, one reduction and one map
/// each; layer 0 is the input `X`, time 0 the initial state `H0`.
fn unrolled_rnn(layers: usize, steps: usize) -> String {
    let state = |l: usize, t: usize| -> String {
        if l == 0 {
            format!("X({}, k)", t - 1)
        } else if t == 0 {
            format!("H0({}, k)", l - 1)
        } else {
            format!("H_{l}_{t}(k)")
        }
    };
    let mut body = Vec::new();
    let mut temps = Vec::new();
    for l in 1..=layers {
        for t in 1..=steps {
            body.push(format!(
                "G_{l}_{t}(i) +=! W({}, i, k) * {} + U({}, i, k) * {}",
                l - 1,
                state(l - 1, t),
                l - 1,
                state(l, t - 1)
            ));
            temps.push(format!(
                "\"G_{l}_{t}\": {{\"dtype\": \"f32\", \"shape\": [\"N\"]}}"
            ));
            if l == layers && t == steps {
                body.push(format!("Y(i) = tanh(G_{l}_{t}(i) * 0.15)"));
            } else {
                body.push(format!("H_{l}_{t}(i) = tanh(G_{l}_{t}(i) * 0.15)"));
                temps.push(format!(
                    "\"H_{l}_{t}\": {{\"dtype\": \"f32\", \"shape\": [\"N\"]}}"
                ));
            }
        }
    }
    format!(
        r#"{{"name": "rnn_{layers}x{steps}", "params": {{"N": 256, "L": {layers}, "T": {steps}}},
 "inputs": {{"X": {{"dtype": "f32", "shape": ["T", "N"]}}, "H0": {{"dtype": "f32", "shape": ["L", "N"]}},
   "W": {{"dtype": "f32", "shape": ["L", "N", "N"]}}, "U": {{"dtype": "f32", "shape": ["L", "N", "N"]}}}},
 "outputs": {{"Y": {{"dtype": "f32", "shape": ["N"]}}}},
 "temps": {{{}}},
 "body": [{}]}}"#,
        temps.join(", "),
        body.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(",\n  ")
    )
}

fn files(root: &Path, dir: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root.join(dir))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| program | group | statements | compile s | kernels | fallback | analysis / schedule / gpu map / gpu print / cpu, ms |\n| --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in rows {
        let time = match (&r.seconds, &r.error) {
            (Some(t), _) => format!("{t:.3}"),
            (None, Some(e)) => format!("error: {e}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.group,
            r.statements,
            time,
            r.kernels,
            if r.fallback { "yes" } else { "no" },
            r.stages
                .iter()
                .map(|m| format!("{m:.0}"))
                .collect::<Vec<_>>()
                .join(" / ")
        );
    }
    s
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let write = args.iter().any(|a| a == "--write");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let wanted =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let watch = Watch::from_env().expect("POLYFUSE_SCHEDULE_TIMEOUT");

    let mut programs: Vec<(String, &'static str, Program)> = Vec::new();
    for (dir, group) in [
        ("examples", "example"),
        ("bench/programs", "bench"),
        ("bench/suite", "suite"),
    ] {
        for f in files(root, dir) {
            let name = f
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if let Ok(p) = polyfuse::frontend::load_file(&f) {
                programs.push((name, group, p));
            }
        }
    }
    for n in [10, 20, 40, 80] {
        let p = polyfuse::frontend::load_str(&chain(n), "chain").expect("chain program");
        programs.push((format!("chain{n}"), "chain", p));
    }
    let decode = polyfuse::frontend::load_file(&root.join("examples/attention_decode_gqa.json"))
        .expect("attention_decode_gqa");
    for kv in [64, 256, 1001, 1535, 4096, 32768] {
        let mut p = decode.clone();
        polyfuse::frontend::apply_param_overrides(&mut p, &[("KV".into(), kv)]).expect("KV");
        programs.push((format!("decode_gqa_kv{kv}"), "decoding", p));
    }
    for (l, t) in [(2, 4), (3, 6), (4, 8)] {
        let p = polyfuse::frontend::load_str(&unrolled_rnn(l, t), "unrolled_rnn")
            .expect("unrolled rnn program");
        programs.push((format!("rnn_unrolled_{l}x{t}"), "unrolled", p));
    }
    programs.retain(|(n, _, _)| wanted(n));

    // One untimed compilation: the first row should not pay for the
    // process's first touches of isl and the allocator.
    if let Some((_, _, p)) = programs.first() {
        let _ = polyfuse::compile(p, &options());
    }
    let mut rows = Vec::new();
    for (name, group, p) in &programs {
        let row = measure(name.clone(), group, p, watch);
        eprintln!(
            "{:<48} {:>8} {:>3} kernels{}{}",
            row.name,
            row.seconds
                .map(|s| format!("{s:.3} s"))
                .unwrap_or("-".into()),
            row.kernels,
            if row.fallback { ", fell back" } else { "" },
            row.error
                .as_deref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default()
        );
        rows.push(row);
    }
    let t = table(&rows);
    print!("{t}");
    if write {
        let head = format!(
            "# Compile time\n\nWritten by `cargo bench --bench compile_time -- --write` \
             (issue 34): one compilation each, `--emit cuda`'s work (schedule, map to the GPU, \
             print; no CPU kernel, so the `cpu` column is the f64 reference alone), default options, no cache, the watch's fallback after {} s. \
             Machine: this project's 2-core development machine, CPU only. Measured {}.\n\n",
            watch.fallback.as_secs(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        );
        // The sections after the table (measurements by hand, profiles)
        // stay as they are.
        let path = root.join("bench/COMPILE.md");
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let sections = old.find("\n## ").map(|at| &old[at..]).unwrap_or("");
        std::fs::write(&path, head + &t + sections).expect("write bench/COMPILE.md");
    }
}
