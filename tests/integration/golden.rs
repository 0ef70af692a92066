//! Golden (snapshot) files, in the manner of Cranelift's filetests: for
//! every program in `examples/` and `bench/programs/`, what
//! `polyfuse schedule FILE --emit STAGE` prints for each stage in
//! [`STAGES`] (default strategy and options, no cache) is kept under
//! `tests/golden/`, the program's path without `.json` as a folder, e.g.
//! `tests/golden/examples/gemm/cuda.cu`.
//!
//! The test makes every program's stages in this process, through the
//! same session calls as the command line (two compilations a program,
//! not five processes; a second test holds the two equal), and compares
//! each output with its file byte for byte. A difference fails it, naming
//! each program and stage that differ with an excerpt of the first
//! difference; so does a missing file, and a folder or file under
//! `tests/golden/` that no program or stage makes any more.
//! `BLESS=1 cargo test --test integration golden::` writes the files anew
//! instead (creating missing ones, removing stale ones) and passes. See `tests/golden/README.md` for how they are meant to be used.
//!
//! The output is deterministic (two runs of every program and stage, one
//! serial and one three at a time, gave the same bytes), so nothing in it is
//! normalised. The environment is pinned in one place, [`stages`]: no
//! cache is read, and the watch's fall-back to minimal fusion after 60 s is
//! moved out of reach, so that a loaded machine cannot change a schedule.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Each stage: the `--emit` value and the file its output is kept in.
const STAGES: [(&str, &str); 5] = [
    ("tree", "tree.txt"),
    ("gpu-tree", "gpu-tree.txt"),
    ("deps", "deps.txt"),
    ("c", "c.c"),
    ("cuda", "cuda.cu"),
];

/// The folders (relative to the crate) whose `*.json` programs have golden
/// files.
const PROGRAM_DIRS: [&str; 2] = ["examples", "bench/programs"];

/// Programs left out (none now: BigBird at S = 4096, left out while
/// isl's scheduler did not settle its union within minutes, compiles in
/// seconds since the model's domains are disjoint).
const NOT_SNAPSHOTTED: [&str; 0] = [];

/// Files under `tests/golden/` that are no snapshot.
const NOT_SNAPSHOTS: [&str; 1] = ["README.md"];

/// Lines of context around a difference, and the most lines shown of each
/// side of it.
const CONTEXT: usize = 3;
const SHOWN: usize = 12;

/// The most characters shown of a line (a dependence or a band can take
/// thousands); the changed lines are shown from a little before the first
/// column where the first pair differs.
const WIDTH: usize = 200;
const BEFORE: usize = 40;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn golden_root() -> PathBuf {
    root().join("tests").join("golden")
}

/// The programs, as paths relative to the crate without `.json`
/// (`examples/gemm`), sorted.
fn programs() -> Vec<String> {
    let mut out = Vec::new();
    for dir in PROGRAM_DIRS {
        let entries =
            std::fs::read_dir(root().join(dir)).unwrap_or_else(|e| panic!("reading {dir}: {e}"));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|x| x == "json") && path.is_file() {
                let stem = path.file_stem().unwrap().to_str().unwrap();
                let program = format!("{dir}/{stem}");
                if !NOT_SNAPSHOTTED.contains(&program.as_str()) {
                    out.push(program);
                }
            }
        }
    }
    out.sort();
    out
}

/// One run of polyfuse: its stdout, or a description of the failure.
type Run = Result<Vec<u8>, String>;

/// A program's output for each of [`STAGES`], or a description of the
/// failure.
type Stages = Result<Vec<Vec<u8>>, String>;

/// `polyfuse schedule PROGRAM.json --emit EMIT` on the command line.
fn schedule_cli(program: &str, emit: &str) -> Run {
    let args = [
        "schedule".to_string(),
        format!("{program}.json"),
        "--emit".to_string(),
        emit.to_string(),
        // A tuned entry in the user's cache would replace the default
        // options.
        "--no-cache".to_string(),
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .args(&args)
        .current_dir(root())
        .env("POLYFUSE_SCHEDULE_TIMEOUT", "86400")
        .output()
        .map_err(|e| format!("polyfuse {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "polyfuse {}: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))
    }
}

/// What `polyfuse schedule PROGRAM.json --emit STAGE --no-cache` prints
/// for each of [`STAGES`], in their order, made in this process as the
/// command line makes it (the same session calls), from two compilations
/// instead of five processes: the CPU one gives `tree` and `c`, the GPU
/// one (no CPU kernel) `gpu-tree` and `cuda`; `deps` schedules nothing.
/// [`in_process_output_is_the_command_lines`] holds the two equal.
fn stages(program: &str) -> Stages {
    use polyfuse::session::{load_program, Session, Target};
    let fail = |what: &str, e: polyfuse::Error| format!("{program}.json, {what}: {e}");
    // Relative to the crate, as the command line is given it (the name
    // is printed in the output).
    let file = format!("{program}.json");
    let loaded = load_program(Path::new(&file), &[]).map_err(|e| fail("load", e))?;
    let session = |target: Target, cpu_kernel: bool| {
        Session::new(loaded.clone())
            .target(target)
            .cpu_kernel(cpu_kernel)
            // The watch recompiles with minimal fusion after 60 s (see
            // `src/pipeline/watch.rs`); the slowest program takes about
            // 2 s alone, but on a machine loaded by other tests it must
            // never fall back, or its snapshot would change.
            .fallback_after(Some(std::time::Duration::from_secs(86400)))
    };
    let deps = session(Target::Cpu, true)
        .dependences()
        .map_err(|e| fail("deps", e))?;
    let cpu = session(Target::Cpu, true)
        .compile()
        .map_err(|e| fail("cpu", e))?
        .compiled;
    let gpu = session(Target::Gpu(Default::default()), false)
        .compile()
        .map_err(|e| fail("gpu", e))?
        .compiled;
    let text = |emit: &str| -> Vec<u8> {
        match emit {
            "tree" => cpu.tree.to_string(),
            "c" => cpu.c_source(),
            "deps" => deps.clone(),
            "gpu-tree" => gpu
                .gpu_tree
                .as_ref()
                .map(|t| t.to_string())
                .unwrap_or_default(),
            "cuda" => gpu
                .cuda
                .as_ref()
                .map(|c| c.source.clone())
                .unwrap_or_default(),
            other => panic!("no stage {other}"),
        }
        .into_bytes()
    };
    Ok(STAGES.iter().map(|(emit, _)| text(emit)).collect())
}

/// `line` cut to [`WIDTH`] characters from character `from`, with `...`
/// where something was left out.
fn clip(line: &str, from: usize) -> String {
    let chars: Vec<char> = line.chars().collect();
    if chars.len() <= WIDTH && from == 0 {
        return line.to_string();
    }
    let start = from.min(chars.len());
    let end = (start + WIDTH).min(chars.len());
    let mut s = String::new();
    if start > 0 {
        s.push_str("...");
    }
    s.extend(&chars[start..end]);
    if end < chars.len() {
        let _ = write!(s, "... ({} more characters)", chars.len() - end);
    }
    s
}

/// A unified-style excerpt of the first difference between `old` (the
/// golden file) and `new` (the output): the common lines at both ends are
/// trimmed and what is left between them shown as one hunk, each side cut
/// to [`SHOWN`] lines.
fn excerpt(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a_end, b_end) = (a.len() - suffix, b.len() - suffix);
    // Where the first changed pair of lines starts to differ.
    let column = match (a.get(prefix), b.get(prefix)) {
        (Some(x), Some(y)) => x.chars().zip(y.chars()).take_while(|(p, q)| p == q).count(),
        _ => 0,
    };
    let from = if column + BEFORE > WIDTH {
        column - BEFORE
    } else {
        0
    };
    let start = prefix.saturating_sub(CONTEXT);
    let mut s = String::new();
    if a_end == prefix && b_end == prefix {
        // Same lines: the line ends differ (a final newline, say).
        let _ = writeln!(
            s,
            "    (same lines; the files differ in line ends: {} bytes vs {})",
            old.len(),
            new.len()
        );
        return s;
    }
    let _ = writeln!(
        s,
        "    @@ -{},{} +{},{} @@ (first difference at line {}, column {})",
        start + 1,
        a_end - start,
        start + 1,
        b_end - start,
        prefix + 1,
        column + 1
    );
    for line in &a[start..prefix] {
        let _ = writeln!(s, "     {}", clip(line, 0));
    }
    for (sign, lines) in [('-', &a[prefix..a_end]), ('+', &b[prefix..b_end])] {
        for line in lines.iter().take(SHOWN) {
            let _ = writeln!(s, "    {sign}{}", clip(line, from));
        }
        if lines.len() > SHOWN {
            let _ = writeln!(s, "    {sign}... {} more lines", lines.len() - SHOWN);
        }
    }
    let after = a_end + CONTEXT.min(suffix);
    for line in &a[a_end..after] {
        let _ = writeln!(s, "     {}", clip(line, 0));
    }
    s
}

/// Every file under `dir`, relative to `base`, with `/` between parts.
fn files_under(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(base, &path, out);
        } else {
            let rel = path.strip_prefix(base).unwrap();
            let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
            out.insert(parts.join("/"));
        }
    }
}

/// Removes the empty folders under `dir` (below it, not `dir` itself).
fn remove_empty_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            remove_empty_dirs(&path);
            let _ = std::fs::remove_dir(&path); // fails unless empty
        }
    }
}

#[test]
fn golden_files() {
    let bless = std::env::var_os("BLESS").is_some_and(|v| !v.is_empty() && v != "0");
    let golden = golden_root();
    let programs = programs();
    assert!(!programs.is_empty(), "no programs found");

    // Every program, a few at a time from one queue (each takes at most
    // a few seconds), all its stages at once.
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 4);
    let next = AtomicUsize::new(0);
    let mut per_program: Vec<(usize, Stages)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(program) = programs.get(i) else {
                            break done;
                        };
                        done.push((i, stages(program)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    per_program.sort_by_key(|(i, _)| *i);
    assert_eq!(per_program.len(), programs.len(), "every program ran");
    let mut failures = Vec::new(); // polyfuse failed: never blessed
    let mut differences = Vec::new();
    let mut blessed = Vec::new();
    let mut expected = BTreeSet::new();
    // A program that failed keeps its files (they are expected, so not
    // stale) and counts once among the failures.
    let mut outputs: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    for (program, (_, staged)) in programs.iter().zip(per_program) {
        for (_, file) in STAGES {
            expected.insert(format!("{program}/{file}"));
        }
        match staged {
            Ok(texts) => outputs.extend(
                STAGES
                    .iter()
                    .zip(texts)
                    .map(|((_, file), text)| (program.as_str(), *file, text)),
            ),
            Err(e) => failures.push(e),
        }
    }
    for (program, file, new) in outputs {
        let rel = format!("{program}/{file}");
        let path = golden.join(&rel);
        let old = std::fs::read(&path).ok();
        if old.as_deref() == Some(&new[..]) {
            continue;
        }
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &new).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            blessed.push(format!("  wrote tests/golden/{rel}"));
            continue;
        }
        let report = match old {
            None => format!("{program}.json, {file}: tests/golden/{rel} is missing\n"),
            Some(old) => format!(
                "{program}.json, {file}: differs from tests/golden/{rel}\n{}",
                excerpt(
                    &String::from_utf8_lossy(&old),
                    &String::from_utf8_lossy(&new)
                )
            ),
        };
        differences.push(report);
    }

    // Snapshots of programs or stages that are gone.
    let mut present = BTreeSet::new();
    files_under(&golden, &golden, &mut present);
    let mut stale = Vec::new();
    for rel in present.difference(&expected) {
        if NOT_SNAPSHOTS.contains(&rel.as_str()) {
            continue;
        }
        if bless {
            std::fs::remove_file(golden.join(rel)).unwrap();
            blessed.push(format!("  removed tests/golden/{rel}"));
        } else {
            let why = match rel.rsplit_once('/') {
                Some((program, _)) if !programs.iter().any(|p| p == program) => {
                    format!("{program}.json no longer exists")
                }
                _ => "no stage makes it".to_string(),
            };
            stale.push(format!("  tests/golden/{rel}: {why}"));
        }
    }
    if bless {
        remove_empty_dirs(&golden);
        for line in &blessed {
            eprintln!("{line}");
        }
        eprintln!("BLESS: {} golden files written or removed", blessed.len());
    }

    let mut message = String::new();
    if !failures.is_empty() {
        let _ = writeln!(message, "{} runs of polyfuse failed:", failures.len());
        for f in &failures {
            let _ = writeln!(message, "{f}\n");
        }
    }
    if !differences.is_empty() {
        let _ = writeln!(
            message,
            "{} golden files differ from polyfuse's output:\n",
            differences.len()
        );
        for d in &differences {
            let _ = writeln!(message, "{d}");
        }
    }
    if !stale.is_empty() {
        let _ = writeln!(message, "{} stale golden files:", stale.len());
        for s in &stale {
            let _ = writeln!(message, "{s}");
        }
    }
    if !differences.is_empty() || !stale.is_empty() {
        let _ = writeln!(
            message,
            "\nIf the change is intended, update the files with\n    \
             BLESS=1 cargo test --test integration golden::\n\
             and commit them on their own, saying why they changed \
             (tests/golden/README.md)."
        );
    }
    assert!(message.is_empty(), "\n{message}");
}

/// The golden files are made in this process ([`stages`]); what they
/// keep is what the command line prints. For a product, a repaired
/// attention program and a recurrence, every stage of `polyfuse schedule`
/// is byte for byte the in-process text.
#[test]
fn in_process_output_is_the_command_lines() {
    for program in [
        "examples/gemm",
        "examples/attention_causal",
        "examples/lstm",
    ] {
        let texts = stages(program).unwrap_or_else(|e| panic!("{e}"));
        for ((emit, _), text) in STAGES.iter().zip(texts) {
            let cli = schedule_cli(program, emit).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                cli == text,
                "{program}.json, --emit {emit}: the command line's output differs from the \
                 in-process one\n{}",
                excerpt(
                    &String::from_utf8_lossy(&cli),
                    &String::from_utf8_lossy(&text)
                )
            );
        }
    }
}

#[test]
fn excerpt_shows_the_first_difference() {
    let old = "a\nb\nc\nd\ne\nf\ng\n";
    let new = "a\nb\nc\nD\ne\nf\ng\n";
    let s = excerpt(old, new);
    assert!(s.contains("first difference at line 4"), "{s}");
    assert!(s.contains("    -d\n    +D\n"), "{s}");
    assert!(s.contains("     c\n"), "{s}");
    assert!(s.contains("     e\n"), "{s}");
    let s = excerpt("a\n", "a");
    assert!(s.contains("line ends"), "{s}");
    let s = excerpt("a\nb\n", "a\nb\nc\n");
    assert!(s.contains("    +c\n"), "{s}");
    // A long line is shown from a little before where it changes.
    let long = "x".repeat(1000);
    let s = excerpt(&format!("{long}a{long}\n"), &format!("{long}b{long}\n"));
    assert!(s.contains("column 1001"), "{s}");
    assert!(
        s.contains(&format!(
            "    -...{}a{}...",
            "x".repeat(40),
            "x".repeat(159)
        )),
        "{s}"
    );
    assert!(s.contains("(841 more characters)"), "{s}");
}
