//! A dump after each stage of [`super::compile`] (`POLYFUSE_DUMP`): each
//! named stage's value as readable text, isl objects as isl prints them
//! and schedules as isl's block YAML, so that a wrong result can be traced
//! to the first stage whose value is wrong without a debugger.
//!
//! The library never prints: a compilation hands each dump to the sink of
//! its [`Options::dump`](super::Options::dump), and the caller decides
//! where it goes (the command line: stderr, or files under
//! `POLYFUSE_DUMP_DIR`). Nothing is formatted for a stage no one asked
//! for, so a compilation without dumps does no more isl work than before.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::error::Result;

/// The named stages of a compilation, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The user's program as isl sets and maps (`model::Scop`).
    Model,
    /// The repair's steps and the program that is scheduled: repaired, with
    /// its factors moved, or as written; its model and defining order.
    Repair,
    /// The flow, anti and output dependences of that program.
    Deps,
    /// The schedule (before tiling) and the strategy that made it.
    Schedule,
    /// The schedule mapped to the GPU, proven, with one plan per kernel.
    Gpu,
    /// The GPU kernels' launch records and arguments.
    Kernels,
    /// The CPU kernel's tiled schedule and its C.
    Cpu,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Model,
        Stage::Repair,
        Stage::Deps,
        Stage::Schedule,
        Stage::Gpu,
        Stage::Kernels,
        Stage::Cpu,
    ];

    /// The stage's name in `POLYFUSE_DUMP` and in dump file names.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Model => "model",
            Stage::Repair => "repair",
            Stage::Deps => "deps",
            Stage::Schedule => "schedule",
            Stage::Gpu => "gpu",
            Stage::Kernels => "kernels",
            Stage::Cpu => "cpu",
        }
    }

    /// `stage[,stage...]` or `all`, as `POLYFUSE_DUMP` takes it; the error
    /// names the stage it does not know and the ones it does.
    pub fn parse_list(text: &str) -> std::result::Result<Vec<Stage>, String> {
        let mut out = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word == "all" {
                return Ok(Stage::ALL.to_vec());
            }
            match Stage::ALL.into_iter().find(|s| s.name() == word) {
                Some(s) if !out.contains(&s) => out.push(s),
                Some(_) => {}
                None => return Err(format!("unknown stage `{word}` ({})", Stage::known())),
            }
        }
        match out.is_empty() {
            true => Err(format!("no stage named ({})", Stage::known())),
            false => Ok(out),
        }
    }

    /// `stages: model, ..., or all`, for messages.
    fn known() -> String {
        let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        format!("stages: {}, or all", names.join(", "))
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One stage's value as text, for the program named `program` (its
/// `name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageDump {
    pub stage: Stage,
    pub program: String,
    pub text: String,
}

/// Where a compilation's dumps go: the stages asked for and a sink that
/// takes each as it is made (so a stage that runs long, or fails, follows
/// the dumps of the ones before it). The sink's error fails the
/// compilation (a dump directory that cannot be written).
#[derive(Clone)]
pub struct Dump {
    stages: Vec<Stage>,
    sink: Arc<Sink>,
}

/// What takes each dump: any thread's (a watched compilation runs on one
/// of its own).
type Sink = dyn Fn(&StageDump) -> Result<()> + Send + Sync;

impl Dump {
    pub fn new(
        stages: Vec<Stage>,
        sink: impl Fn(&StageDump) -> Result<()> + Send + Sync + 'static,
    ) -> Dump {
        Dump {
            stages,
            sink: Arc::new(sink),
        }
    }

    /// A dump of `stages` into a list the caller reads afterwards (tests,
    /// and hosts that show the dumps themselves).
    pub fn collect(stages: Vec<Stage>) -> (Dump, Arc<Mutex<Vec<StageDump>>>) {
        let list = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&list);
        let dump = Dump::new(stages, move |d| {
            into.lock().map(|mut l| l.push(d.clone())).ok();
            Ok(())
        });
        (dump, list)
    }

    pub fn wants(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }

    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }
}

// A sink is called with finished text only, so a panic elsewhere in a
// compilation (which the C ABI catches) never leaves it half-updated; the
// options that hold it stay usable across `catch_unwind`.
impl std::panic::UnwindSafe for Dump {}
impl std::panic::RefUnwindSafe for Dump {}

impl fmt::Debug for Dump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dump")
            .field("stages", &self.stages)
            .finish()
    }
}

/// Hands `stage`'s text to `dump`'s sink where it asks for the stage;
/// `text` runs only then.
pub(super) fn emit(
    dump: Option<&Dump>,
    program: &str,
    stage: Stage,
    text: impl FnOnce() -> Result<String>,
) -> Result<()> {
    match dump {
        Some(d) if d.wants(stage) => (d.sink)(&StageDump {
            stage,
            program: program.to_string(),
            text: text()?,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_stages_parses_in_its_order_and_all_names_every_stage() {
        assert_eq!(
            Stage::parse_list("deps, model,deps").unwrap(),
            [Stage::Deps, Stage::Model]
        );
        assert_eq!(Stage::parse_list("all").unwrap(), Stage::ALL);
        let e = Stage::parse_list("model,tiles").unwrap_err();
        assert!(e.contains("`tiles`") && e.contains("kernels"), "{e}");
        assert!(Stage::parse_list(" , ").is_err());
    }

    #[test]
    fn only_the_stages_asked_for_are_formatted() {
        let (dump, list) = Dump::collect(vec![Stage::Deps]);
        emit(Some(&dump), "p", Stage::Model, || panic!("formatted")).unwrap();
        emit(Some(&dump), "p", Stage::Deps, || Ok("flow".into())).unwrap();
        emit(None, "p", Stage::Deps, || panic!("formatted")).unwrap();
        let list = list.lock().unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(
            (list[0].stage, list[0].text.as_str()),
            (Stage::Deps, "flow")
        );
    }
}
