//! Runs programs through the `polyfuse` binary under a timeout and sorts
//! what comes back.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one command did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Exit 0 (with `check: ok` where `--check` was asked).
    Ok,
    /// Exit 1: `check: FAILED`.
    CheckFailed,
    /// Exit 2: an input error, with a message.
    Rejected,
    /// Exit 2 without a `polyfuse:` message.
    RejectedSilently,
    /// Exit 3: an environment fault.
    Environment,
    /// Exit 4: an internal error.
    Internal,
    /// Exit 101 or a panic message.
    Panic,
    /// Killed by a signal.
    Signal,
    /// Still running at the timeout (killed).
    Timeout,
    /// Exit 0 without the check line, or another status.
    Other,
}

pub struct Run {
    pub args: Vec<String>,
    pub outcome: Outcome,
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    pub secs: f64,
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    })
}

/// Runs `bin args` with the compilation cache off, killing it after
/// `timeout`.
pub fn run(bin: &Path, args: &[String], timeout: Duration) -> Run {
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .env("POLYFUSE_CACHE", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start polyfuse");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            timed_out = true;
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out.join().unwrap();
    let stderr = err.join().unwrap();
    let checks = args.iter().any(|a| a == "--check");
    let outcome = if timed_out {
        Outcome::Timeout
    } else if stderr.contains("panicked") || status.code() == Some(101) {
        Outcome::Panic
    } else if status.signal().is_some() {
        Outcome::Signal
    } else {
        match status.code() {
            Some(0) if !checks || stdout.contains("check: ok") => Outcome::Ok,
            Some(1) => Outcome::CheckFailed,
            Some(2) if stderr.contains("polyfuse:") => Outcome::Rejected,
            Some(2) => Outcome::RejectedSilently,
            Some(3) => Outcome::Environment,
            Some(4) => Outcome::Internal,
            _ => Outcome::Other,
        }
    };
    Run {
        args: args.to_vec(),
        outcome,
        status: match (status.code(), status.signal()) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "?".into(),
        },
        stdout,
        stderr,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// The open class a failing run (`kind`: `valid` or the mutation)
/// belongs to, if any: none is open now (issue 30's classes and every
/// class the fuzzer found are fixed, their reproducers in
/// `tests/fuzz/found/`). Add a match here, with its reason, for a class
/// found and not yet fixed, so that CI counts it apart; remove it with
/// the fix.
pub fn known_class(_kind: &str, _r: &Run) -> Option<&'static str> {
    None
}

/// The reproducer in `tests/fuzz/found/` (listed open in `FOUND`) whose
/// class a failing run seems to belong to: none is open now (see
/// [`known_class`]).
pub fn found_class(_kind: &str, _r: &Run) -> Option<&'static str> {
    None
}

/// A short signature of a failure, for grouping: the outcome and the first
/// line of the message with numbers, names in backticks and the file left
/// out.
pub fn signature(kind: &str, r: &Run) -> String {
    let text = if r.outcome == Outcome::CheckFailed {
        "check FAILED".to_string()
    } else {
        let lines: Vec<&str> = r.stderr.lines().collect();
        let i = lines
            .iter()
            .position(|l| l.contains("panicked") || l.starts_with("polyfuse:"))
            .unwrap_or(0);
        let mut t = lines.get(i).copied().unwrap_or("").to_string();
        if t.contains("panicked") {
            if let Some(n) = lines.get(i + 1) {
                t = format!("{t} {n}");
            }
        }
        t
    };
    let mut out = String::new();
    let mut tick = false;
    for c in text.chars() {
        if c == '`' {
            tick = !tick;
            out.push('`');
        } else if tick {
            continue;
        } else if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    // Drop the file name ("polyfuse: /tmp/.../x.json: ").
    if let Some(rest) = out.strip_prefix("polyfuse: ") {
        if let Some((_, r)) = rest.split_once(".json: ") {
            out = format!("polyfuse: {r}");
        }
    }
    // Drop a statement's text, kept in backticks, and what follows a `{`
    // (isl sets).
    if let Some(i) = out.find('{') {
        out.truncate(i);
    }
    out.truncate(160);
    format!("{kind} / {:?} / {out}", r.outcome)
}

/// Tallies and the failures found, by signature.
#[derive(Default)]
pub struct Tally {
    pub programs: usize,
    pub mutants: usize,
    pub runs: usize,
    pub outcomes: BTreeMap<String, usize>,
    /// Signature -> (count, first saved example).
    pub failures: BTreeMap<String, (usize, String)>,
    pub known: BTreeMap<String, usize>,
    pub timeouts: usize,
}

impl Tally {
    pub fn count(&mut self, what: &str, r: &Run) {
        self.runs += 1;
        *self
            .outcomes
            .entry(format!("{what} {:?}", r.outcome))
            .or_default() += 1;
        if r.outcome == Outcome::Timeout {
            self.timeouts += 1;
        }
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "fuzz: {} programs, {} mutants, {} runs\n",
            self.programs, self.mutants, self.runs
        );
        for (k, v) in &self.outcomes {
            s += &format!("  {k}: {v}\n");
        }
        for (k, v) in &self.known {
            s += &format!("  known-open ({k}): {v}\n");
        }
        s += &format!("failure classes: {}\n", self.failures.len());
        for (k, (n, ex)) in &self.failures {
            s += &format!("  [{n}x] {k}\n      e.g. {ex}\n");
        }
        s
    }
}

/// Writes a failing program, its commands and their outputs to
/// `dir/name/`; returns the folder.
pub fn save(dir: &Path, name: &str, json: &str, runs: &[&Run]) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("program.json"), json).unwrap();
    let mut rep = String::new();
    for r in runs {
        rep += &format!(
            "$ polyfuse {}\n{} ({:?}, {:.2} s)\n--- stdout\n{}--- stderr\n{}\n",
            r.args.join(" "),
            r.status,
            r.outcome,
            r.secs,
            r.stdout,
            r.stderr
        );
    }
    std::fs::write(d.join("report.txt"), rep).unwrap();
    d
}
