//! The pipeline's direction (issue 31): no stage of `src/` imports a later
//! one, so there is no cycle between stages and each folder can be read
//! knowing only the ones before it. The order is the one `src/lib.rs`
//! documents: the stages, then `pipeline`, which drives them, and
//! `runtime`, which runs what it returns; the front doors (`session`,
//! `tune`, the C ABI) above all of them.

use std::path::Path;

const ORDER: &[&str] = &[
    "isl", "error", "frontend", "model", "deps", "repair", "schedule", "gpu", "codegen",
    "pipeline", "runtime",
];

/// Stages (and the crate's top-level orchestrators) a file of `stage` names
/// with `crate::`.
fn named(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
    }
    out
}

#[test]
fn no_stage_imports_a_later_one() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    for (rank, stage) in ORDER.iter().enumerate() {
        let mut stack = vec![src.join(stage), src.join(format!("{stage}.rs"))];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                for entry in std::fs::read_dir(&path).unwrap() {
                    stack.push(entry.unwrap().path());
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || !path.exists() {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for name in named(&text) {
                let later = ORDER
                    .iter()
                    .position(|s| *s == name)
                    .is_some_and(|r| r > rank)
                    && !(*stage == "isl" && name == "error");
                // Nothing here reaches the front doors (tune, the C ABI, the
                // session).
                let driver = ["tune", "capi", "session"].contains(&name.as_str());
                if later || driver {
                    offenders.push(format!("{}: crate::{name}", path.display()));
                }
            }
        }
    }
    offenders.sort();
    offenders.dedup();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The library holds no command-line code (issue 31): argument parsing,
/// exit statuses and progress bars are the binary's, under `src/bin/`.
#[test]
fn the_command_line_lives_in_the_binary() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(path) = stack.pop() {
        if path == src.join("bin") {
            continue;
        }
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for needle in ["clap::", "indicatif::", "ExitCode"] {
            if text.contains(needle) {
                offenders.push(format!("{}: {needle}", path.display()));
            }
        }
    }
    assert!(!src.join("main.rs").exists() && !src.join("cli").exists());
    offenders.sort();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The `.rs` files under `src/`, leaving out the folders in `skip`.
fn sources(skip: &[&str]) -> Vec<(std::path::PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let skip: Vec<_> = skip.iter().map(|s| src.join(s)).collect();
    let mut out = Vec::new();
    let mut stack = vec![src];
    while let Some(path) = stack.pop() {
        if skip.contains(&path) {
            continue;
        }
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path, text));
        }
    }
    out
}

/// isl is bound in one place (issue 31): every stage names isl's types
/// through `crate::isl`, never the binding crate itself.
#[test]
fn isl_is_reached_only_through_its_module() {
    let offenders: Vec<String> = sources(&["isl"])
        .into_iter()
        .filter(|(_, text)| text.contains("isl_rs"))
        .map(|(path, _)| path.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The library writes nothing to stderr (issue 31): a C++ framework that
/// embeds it through the C ABI gets errors and events as values; only the
/// binary prints.
#[test]
fn the_library_prints_nothing() {
    let offenders: Vec<String> = sources(&["bin"])
        .into_iter()
        .filter(|(_, text)| {
            // a macro call, not a name that ends in one (`isl_print!`)
            ["eprintln!", "eprint!(", "println!", "print!("]
                .iter()
                .any(|n| {
                    text.match_indices(n).any(|(at, _)| {
                        !text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                    })
                })
        })
        .map(|(path, _)| path.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
