//! Running the `polyfuse` binary from a test, and its output as text for
//! assertion messages.

use std::process::{Command, Output};

/// `polyfuse ARGS`, waited for.
pub fn polyfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .args(args)
        .output()
        .unwrap()
}

/// The exit status, stdout and stderr of `out`.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
