//! Typed errors. Every failure a user can cause is an [`Error`] that names the
//! file, the statement where there is one, and the reason; the binary maps the
//! variant to the exit status of the spec (2 bad input or illegal
//! transformation, 3 environment fault).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// The file as a whole is wrong (bad JSON, a bad key, a bad shape).
    #[error("{file}: {message}")]
    Input { file: String, message: String },

    /// One statement is wrong; `position` counts from 1 as users do.
    #[error("{file}: statement {position} `{text}`: {message}")]
    Statement {
        file: String,
        position: usize,
        text: String,
        message: String,
    },

    /// A schedule or rewrite that the dependences forbid, or an option that
    /// cannot be honoured.
    #[error("{file}: {message}")]
    Illegal { file: String, message: String },

    /// A GPU mapping that `gpu::race` could not prove free of data races
    /// (never printed; the pipeline tries a mapping with fewer fused
    /// statements before it gives up).
    #[error("{file}: {message}")]
    Race { file: String, message: String },

    /// The environment lacks something (C compiler, GPU, driver).
    #[error("{0}")]
    Environment(String),

    /// A failure inside isl or in polyfuse itself: a bug, never the user's.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Exit status of the command line for this error (see the spec).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Input { .. }
            | Error::Statement { .. }
            | Error::Illegal { .. }
            | Error::Race { .. } => 2,
            Error::Environment(_) => 3,
            Error::Internal(_) => 4,
        }
    }
}

impl From<crate::isl::LibISLError> for Error {
    fn from(e: crate::isl::LibISLError) -> Self {
        Error::Internal(format!("isl: {e:?}"))
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The message of a caught panic (`panic!` with a literal or a formatted
/// string); `None` for any other payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::panic_text;

    #[test]
    fn panic_text_reads_literal_and_formatted_messages_only() {
        let text = |f: fn()| panic_text(&*std::panic::catch_unwind(f).unwrap_err());
        assert_eq!(text(|| panic!("a literal")), Some("a literal".into()));
        assert_eq!(
            text(|| panic!("formatted {}", 7)),
            Some("formatted 7".into())
        );
        assert_eq!(text(|| std::panic::panic_any(7_u8)), None);
    }
}
