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
