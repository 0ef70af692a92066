//! The operating system, where the standard library leaves something out:
//! the one place polyfuse calls libc itself.

/// Restores the default action of SIGPIPE, which the Rust runtime ignores
/// at start-up: `polyfuse schedule F | head` then ends quietly when the
/// reader closes the pipe, as `cat` does, instead of failing to print
/// (a panic in `println!`). Only for the command-line program: a library
/// must not change its host's signal handling.
pub fn default_sigpipe() {
    // SAFETY: `signal` with a valid signal number and `SIG_DFL` has no
    // preconditions; it runs before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
