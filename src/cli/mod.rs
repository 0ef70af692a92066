//! The command line's own modules: the binary's, not the library's (the
//! library prints nothing and leaves its host's signals alone; these do
//! both). `src/main.rs` holds the commands and their arguments.

pub mod sys;
pub mod tune;
