//! The command-line program as a shell user meets it.

use std::io::Read;
use std::process::{Command, Stdio};

/// `polyfuse schedule F --emit cuda | head -c 100`: the reader closes the
/// pipe early; polyfuse ends quietly (SIGPIPE), with no panic message.
#[test]
fn a_reader_that_closes_the_pipe_early_gets_no_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["schedule", "examples/layernorm.json", "--emit", "cuda"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
}
