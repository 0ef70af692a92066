//! A compilation watched for time.
//!
//! isl's scheduler can spend minutes, or fail to end, in the integer
//! programs of some fusion problems: `attention_decode_gqa` at KV = 300
//! split 37 stays in `isl_tab_basic_set_non_trivial_lexmin`, pivoting on
//! ever larger integers, while minimal fusion takes under a second. isl's
//! operation quota is not checked in that loop, so the compilation cannot be
//! stopped from outside. [`compile_watched`] runs it on a thread of its own:
//! after [`Watch::notice`] it reports that it is still compiling, and after
//! [`Watch::fallback`] it compiles again with minimal fusion
//! ([`Strategy::Min`]) and leaves the first compilation behind. That thread
//! keeps running until it ends or the process does; its isl context is its
//! own, so nothing is shared with the compilation that replaces it. Every
//! check (dependences, legality, repair proofs) runs on the result as on
//! any other.

use std::sync::mpsc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::schedule::Strategy;

use super::{compile, Compiled, Options};

/// The environment variable that sets [`Watch::fallback`], in seconds.
pub const TIMEOUT_VAR: &str = "POLYFUSE_SCHEDULE_TIMEOUT";

/// When a watched compilation is reported and when it is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watch {
    /// After this long the compilation says it is still running.
    pub notice: Duration,
    /// After this long a compilation with another strategy than minimal
    /// fusion is abandoned for one with minimal fusion.
    pub fallback: Duration,
}

impl Default for Watch {
    fn default() -> Watch {
        Watch {
            notice: Duration::from_secs(10),
            fallback: Duration::from_secs(60),
        }
    }
}

impl Watch {
    /// The default watch with its fallback read from
    /// `POLYFUSE_SCHEDULE_TIMEOUT` (whole seconds) where that is set.
    pub fn from_env() -> Result<Watch> {
        let mut w = Watch::default();
        if let Ok(v) = std::env::var(TIMEOUT_VAR) {
            let s: u64 = v.trim().parse().map_err(|_| Error::Input {
                file: TIMEOUT_VAR.into(),
                message: format!("expected whole seconds, got `{v}`"),
            })?;
            w.fallback = Duration::from_secs(s);
        }
        Ok(w)
    }
}

/// What a watched compilation reports while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Still compiling after this long.
    StillCompiling(Duration),
    /// Not finished after this long: compiling again with minimal fusion.
    FellBack(Duration),
}

impl WatchEvent {
    /// The line polyfuse prints for the event, for the program `source`.
    pub fn message(&self, source: &str) -> String {
        match self {
            WatchEvent::StillCompiling(t) => format!(
                "polyfuse: {source}: still compiling after {} s (isl's scheduler)",
                t.as_secs()
            ),
            WatchEvent::FellBack(t) => format!(
                "polyfuse: {source}: isl's scheduler did not finish in {} s; compiling with minimal fusion (--strategy min) instead",
                t.as_secs()
            ),
        }
    }
}

/// [`compile`] under `watch`, reporting to `report`. After a fallback
/// `options.strategy` is [`Strategy::Min`], so the caller can say which
/// strategy its result has.
pub fn compile_watched(
    program: &Program,
    options: &mut Options,
    watch: Watch,
    mut report: impl FnMut(WatchEvent),
) -> Result<Compiled> {
    let (tx, rx) = mpsc::channel();
    let (p, o) = (program.clone(), options.clone());
    let spawned = std::thread::Builder::new()
        .name("polyfuse-compile".into())
        .spawn(move || {
            let _ = tx.send(compile(&p, &o));
        });
    if spawned.is_err() {
        // No thread to watch from: compile here, unwatched.
        return compile(program, options);
    }
    // The thread drops its sender without sending only if `compile`
    // panicked.
    let lost = || Error::Internal("the compilation thread ended without a result".into());
    let notice = watch.notice.min(watch.fallback);
    match rx.recv_timeout(notice) {
        Ok(r) => return r,
        Err(mpsc::RecvTimeoutError::Disconnected) => return Err(lost()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            if notice < watch.fallback {
                report(WatchEvent::StillCompiling(notice));
            }
        }
    }
    if options.strategy == Strategy::Min {
        return rx.recv().unwrap_or_else(|_| Err(lost()));
    }
    match rx.recv_timeout(watch.fallback - notice) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(lost()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            report(WatchEvent::FellBack(watch.fallback));
            options.strategy = Strategy::Min;
            compile(program, options)
        }
    }
}
