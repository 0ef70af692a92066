//! A compilation watched for time.
//!
//! isl's scheduler can spend minutes, or fail to end, in the integer
//! programs of some fusion problems: `attention_decode_gqa` at KV = 300
//! split 37 stays in `isl_tab_basic_set_non_trivial_lexmin`, pivoting on
//! ever larger integers, while minimal fusion takes under a second. A
//! fixed operation quota does not tell the two apart (each pivot on those
//! integers is slower than the last, so a quota that stops it in
//! reasonable time also stops ordinary compilations). Time does:
//! [`compile_watched`] runs the compilation on a thread of its own; after
//! [`Watch::notice`] it reports that it is still compiling, and after
//! [`Watch::fallback`] it stops it (the quota lowered to 1 from this
//! thread, which isl's next pivot obeys: [`Abort`]) and compiles again with
//! minimal fusion ([`Strategy::Min`]). Every check (dependences, legality, repair
//! proofs) runs on the result as on any other.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::error::{panic_text, Error, Result};
use crate::frontend::ast::Program;
use crate::isl::Abort;
use crate::schedule::Strategy;

use super::{compile, Compiled, Options};

/// The environment variable that sets [`Watch::fallback`], in seconds.
const TIMEOUT_VAR: &str = "POLYFUSE_SCHEDULE_TIMEOUT";

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
                "polyfuse: {source}: still compiling after {} s",
                t.as_secs()
            ),
            WatchEvent::FellBack(t) => format!(
                "polyfuse: {source}: {}; compiling with minimal fusion (--strategy min) instead",
                unfinished(*t)
            ),
        }
    }
}

/// Why a compilation given `limit` has no result (a search's candidate,
/// or the line of a fallback).
pub fn unfinished(limit: Duration) -> String {
    format!("isl's scheduler did not finish in {} s", limit.as_secs())
}

/// A compilation on a thread of its own, which can be stopped.
struct Running {
    /// The compilation's result (a panic as an internal error).
    result: mpsc::Receiver<Result<Compiled>>,
    abort: Arc<Abort>,
}

/// How long a stopped compilation is given to end (isl checks its operation
/// quota at every simplex pivot, so it ends within a pivot).
const STOP_WAIT: Duration = Duration::from_secs(10);

impl Running {
    /// [`compile`] on a thread of its own; `None` where no thread could be
    /// started.
    fn start(program: &Program, options: &Options) -> Option<Running> {
        let (tx, result) = mpsc::channel();
        let abort = Arc::new(Abort::default());
        let (p, o, a) = (program.clone(), options.clone(), Arc::clone(&abort));
        std::thread::Builder::new()
            .name("polyfuse-compile".into())
            .spawn(move || {
                a.install();
                // A panic (a bug) comes back as an internal error with its
                // message, as it would from a compilation on the caller's
                // thread under the C ABI's guard.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compile(&p, &o)))
                    .unwrap_or_else(|payload| {
                        let message = panic_text(&*payload).unwrap_or_else(|| "a panic".into());
                        Err(Error::Internal(format!(
                            "the compilation panicked: {message}"
                        )))
                    });
                let _ = tx.send(r);
            })
            .ok()?;
        Some(Running { result, abort })
    }

    /// Aborts the compilation's isl work and waits up to [`STOP_WAIT`] for
    /// its thread to end; its result, an isl error, is dropped. A thread
    /// that has not ended by then is left to end on its own.
    fn stop(self) {
        self.abort.abort();
        let _ = self.result.recv_timeout(STOP_WAIT);
    }
}

/// The thread ended without sending (it cannot, short of an abort of the
/// process).
fn lost() -> Error {
    Error::Internal("the compilation thread ended without a result".into())
}

/// [`compile`] given at most `limit`: `Ok(None)` where it has not finished
/// by then (it is stopped, as [`compile_watched`] stops it). For searches
/// that try many options: a candidate isl does not schedule in time is
/// dropped, not replaced.
pub fn compile_within(
    program: &Program,
    options: &Options,
    limit: Duration,
) -> Result<Option<Compiled>> {
    let Some(running) = Running::start(program, options) else {
        return compile(program, options).map(Some);
    };
    match running.result.recv_timeout(limit) {
        Ok(r) => r.map(Some),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(lost()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            running.stop();
            Ok(None)
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
    let Some(running) = Running::start(program, options) else {
        // No thread to watch from: compile here, unwatched.
        return compile(program, options);
    };
    let notice = watch.notice.min(watch.fallback);
    match running.result.recv_timeout(notice) {
        Ok(r) => return r,
        Err(mpsc::RecvTimeoutError::Disconnected) => return Err(lost()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            if notice < watch.fallback {
                report(WatchEvent::StillCompiling(notice));
            }
        }
    }
    if options.strategy == Strategy::Min {
        return running.result.recv().unwrap_or_else(|_| Err(lost()));
    }
    match running.result.recv_timeout(watch.fallback - notice) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(lost()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            report(WatchEvent::FellBack(watch.fallback));
            running.stop();
            options.strategy = Strategy::Min;
            compile(program, options)
        }
    }
}
