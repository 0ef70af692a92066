//! The first three stages of a compilation, which every compilation runs
//! (`--emit deps` stops after them): the model of the user's program, the
//! repair, and the dependences of the program that is scheduled.

use std::fmt::Write;

use crate::deps;
use crate::error::Result;
use crate::frontend::ast::Program;
use crate::isl::{schedule_yaml, Isl};
use crate::model;
use crate::repair;
use crate::schedule;

use super::Options;

/// Stage `model`: the user's program as isl sets and maps, with every
/// element a statement reads written before (`model::check_reads_written`).
pub(crate) struct Model {
    pub scop: model::Scop,
}

impl Model {
    pub fn build(isl: &Isl, program: &Program) -> Result<Model> {
        let scop = model::build(isl, program)?;
        model::check_reads_written(isl, program, &scop)?;
        Ok(Model { scop })
    }

    /// The dump: the context, then each statement's domain and accesses.
    pub fn dump(&self) -> String {
        describe(&self.scop)
    }
}

/// A model as text: the parameters' context, then per statement its
/// domain, write and reads as isl prints them.
fn describe(scop: &model::Scop) -> String {
    let d = scop.describe();
    let mut out = format!("context: {}\n", d.context);
    for s in &d.statements {
        let _ = writeln!(
            out,
            "{} (statement {}, {:?}):\n  domain: {}\n  write:  {}",
            s.name, s.source, s.kind, s.domain, s.write
        );
        for r in &s.reads {
            let _ = writeln!(out, "  read:   {r}");
        }
    }
    out
}

/// Stage `repair`: the repair's steps (from the program's `schedule` key
/// or chosen automatically) applied, or, where none applies, the sums'
/// invariant factors moved out; the program that is scheduled from here
/// on, its model and its defining order.
pub(crate) struct Repaired {
    /// The model of the user's program (the f64 reference is its).
    pub original: model::Scop,
    /// The repair's rewrite, where it made one, with its defining order
    /// and report.
    pub rewrite: Option<repair::Repaired>,
    /// Without a rewrite: the program with its sums' invariant factors
    /// moved out (`repair::factor`), where any moved; and what moved.
    pub factored: repair::factor::Hoisted,
    /// The repair's steps (size-free: targets by name, split factors).
    pub steps: Vec<repair::Step>,
    /// The options with the repair's tile sizes, where it chose some.
    pub options: Options,
    /// The model of the program scheduled.
    pub scop: model::Scop,
    /// The defining order the dependences are computed under.
    pub order: crate::isl::Schedule,
    /// The dependences the repair's proof computed (the same program,
    /// modelled alike, in the same order).
    proven: Option<deps::Dependences>,
}

impl Repaired {
    /// The repair of `program` that `options` ask for.
    pub fn choose(
        isl: &Isl,
        program: &Program,
        model: Model,
        options: &Options,
    ) -> Result<Repaired> {
        let steps = repair::steps_for(isl, program, &model.scop, options.repair)?;
        Repaired::with_steps(isl, program, model.scop, options, steps)
    }

    /// `program` (modelled as `original`) repaired by `steps`: the proxy
    /// of `proxy::schedule_at_proxy_sizes` takes the real program's steps,
    /// not a choice made again at its own sizes.
    pub fn with_steps(
        isl: &Isl,
        program: &Program,
        original: model::Scop,
        options: &Options,
        steps: Vec<repair::Step>,
    ) -> Result<Repaired> {
        let applied =
            repair::apply_with_dependences(isl, program, &original, &steps, repair::Fault::None)?;
        let (rewrite, proven) = match applied {
            Some((r, deps)) => (Some(r), deps),
            None => (None, None),
        };
        let mut options = options.clone();
        if let Some(t) = repair::tile_sizes(&steps) {
            options.tile = t;
        }
        // A factor out of a sum, where no repair took the program (a
        // repair's own rewrites stay as they are) and the user did not
        // ask for the program as written (`--repair off`).
        let factored = if rewrite.is_none() && options.repair != repair::Choice::Off {
            repair::factor::hoist(isl, program, &original)?
        } else {
            repair::factor::Hoisted::none()
        };
        let scop = match (&rewrite, &factored.program) {
            (Some(r), _) => model::build(isl, &r.program)?,
            (None, Some(p)) => model::build(isl, p)?,
            (None, None) => model::build(isl, program)?,
        };
        let order = match rewrite.as_ref().and_then(|r| r.order.as_ref()) {
            Some(tree) => isl.schedule(&tree.to_isl_text())?,
            None => schedule::canonical(isl, &scop)?,
        };
        Ok(Repaired {
            original,
            rewrite,
            factored,
            steps,
            options,
            scop,
            order,
            proven,
        })
    }

    /// The program scheduled from here on: the repaired one, the one with
    /// its factors moved, or `program` as written.
    pub fn program<'a>(&'a self, program: &'a Program) -> &'a Program {
        match (&self.rewrite, &self.factored.program) {
            (Some(r), _) => &r.program,
            (None, Some(p)) => p,
            (None, None) => program,
        }
    }

    /// The dump: the steps, which program is scheduled and what the
    /// repair reported, its model where it is not the user's, and the
    /// defining order as isl's YAML.
    pub fn dump(&self) -> Result<String> {
        let mut out = match self.steps.is_empty() {
            true => "steps: none\n".to_string(),
            false => format!("steps: {:?}\n", self.steps),
        };
        let _ = writeln!(out, "tile sizes: {:?}", self.options.tile);
        let (which, report) = match (&self.rewrite, &self.factored.program) {
            (Some(r), _) => ("the repaired program", r.report.as_str()),
            (None, Some(_)) => ("the program with its factors moved", &*self.factored.report),
            (None, None) => ("the program as written", &*self.factored.report),
        };
        let _ = writeln!(out, "scheduled: {which}");
        out += report;
        if self.rewrite.is_some() || self.factored.program.is_some() {
            out += "its model:\n";
            out += &describe(&self.scop);
        }
        out += "defining order:\n";
        out += &schedule_yaml(&self.order);
        Ok(out)
    }
}

/// Stage `deps`: the repaired program with its dependences, what every
/// later stage takes.
pub(crate) struct Analysis {
    pub repaired: Repaired,
    pub deps: deps::Dependences,
}

impl Analysis {
    /// The dependences of the program `repaired` schedules, under its
    /// defining order.
    pub fn of(mut repaired: Repaired) -> Result<Analysis> {
        let deps = match repaired.proven.take() {
            Some(d) => d,
            None => deps::compute(&repaired.scop, &repaired.order)?,
        };
        Ok(Analysis { repaired, deps })
    }

    /// The model of the program scheduled.
    pub fn scop(&self) -> &model::Scop {
        &self.repaired.scop
    }

    /// The options with the repair's tile sizes.
    pub fn options(&self) -> &Options {
        &self.repaired.options
    }

    /// `flow:`, `anti:`, `output:` lines, after the repair's report; for a
    /// program with loop blocks, then the distances over the blocks'
    /// indices.
    pub fn deps_text(&self, isl: &Isl, program: &Program) -> Result<String> {
        let r = &self.repaired;
        let text = match (&r.rewrite, &r.factored.program) {
            (Some(rw), _) => format!(
                "{}dependences of the repaired program:\n{}",
                rw.report,
                self.deps.describe()
            ),
            (None, Some(_)) => format!(
                "{}dependences of the program with its factors moved:\n{}",
                r.factored.report,
                self.deps.describe()
            ),
            (None, None) => format!("{}{}", r.factored.report, self.deps.describe()),
        };
        let fixed = program.params.iter().all(|p| p.value.is_some());
        Ok(text + &self.deps.describe_carried(isl, &r.scop, fixed)?)
    }

    /// The dump: the three relations as isl prints them.
    pub fn dump(&self) -> String {
        self.deps.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> Program {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name);
        crate::frontend::load_file(&path).unwrap()
    }

    fn analysis(isl: &Isl, program: &Program) -> Analysis {
        let model = Model::build(isl, program).unwrap();
        let repaired = Repaired::choose(isl, program, model, &Options::default()).unwrap();
        Analysis::of(repaired).unwrap()
    }

    #[test]
    fn a_program_no_repair_takes_is_scheduled_as_written() {
        let isl = Isl::new();
        let gemm = example("gemm.json");
        let a = analysis(&isl, &gemm);
        assert!(a.repaired.steps.is_empty() && a.repaired.rewrite.is_none());
        assert!(std::ptr::eq(a.repaired.program(&gemm), &gemm));
        assert_eq!(a.scop().statements.len(), 2);
        assert!(!a.deps.flow.is_empty().unwrap());
        assert!(a
            .repaired
            .dump()
            .unwrap()
            .contains("scheduled: the program as written"));
    }

    #[test]
    fn a_rolling_update_replaces_the_program_and_its_dependences() {
        let isl = Isl::new();
        let softmax = example("softmax_fused.json");
        let a = analysis(&isl, &softmax);
        let rewrite = a.repaired.rewrite.as_ref().expect("a rolling update");
        assert!(std::ptr::eq(a.repaired.program(&softmax), &rewrite.program));
        // The dependences are the repaired program's: its statements, not
        // the user's, appear in them.
        let names: Vec<&str> = a
            .scop()
            .statements
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let flow = a.deps.describe();
        assert!(
            names.iter().any(|n| flow.contains(&format!("{n}["))),
            "{flow}"
        );
        assert_ne!(a.repaired.scop.describe(), a.repaired.original.describe());
    }
}
