//! Algebraic repair: fusing reduction chains whose loop-carried dependences
//! forbid ordinary fusion (softmax, attention) by breaking those dependences
//! on purpose and repairing the result, after Neptune (rolling and split-k
//! update). The stage sits between the model and scheduling:
//!
//! ```text
//!   Program, Scop  --chain-->  Chain (target L_t, predecessors L_r, g, f)
//!                  --solve-->  h, proven in an e-graph (Eq. 4, Eq. 5)
//!                  --rolling / splitk-->  Program' (+ its defining order)
//!                  --dataflow-->  proof by dependences, before and after
//! ```
//!
//! The repaired program's meaning is its defining order (for a rolling
//! update the fused order, statements interleaved in the rolling loop), so
//! its dependences are computed under that order and every later schedule
//! is checked against them. The f64 reference stays the original program's.

pub mod algebra;
pub mod chain;
pub mod dataflow;
pub mod directive;
pub mod factor;
pub mod prove;
pub mod rewrite;
pub mod rolling;
pub mod solve;
pub mod splitk;

use std::fmt::Write;

use crate::deps::Dependences;
use crate::error::{Error, Result};
use crate::frontend::ast::{AssignOp, Program};
use crate::isl::tree::ScheduleTree;
use crate::isl::Isl;
use crate::model::{self, Scop};
pub use directive::Step;
pub use solve::Fault;

/// A repaired program with the order that defines it.
#[derive(Debug, Clone)]
pub struct Repaired {
    pub program: Program,
    /// The defining order (isl schedule tree over the repaired model);
    /// `None` for a rewrite whose meaning is plain program order.
    pub order: Option<ScheduleTree>,
    /// What was matched, solved and proven, for `--emit deps`.
    pub report: String,
}

/// Reduction loops at least this long are fused automatically...
pub const AUTO_LONG_REDUCTION: u64 = 1024;
/// ...by rolling update when the outer loops have at least this many
/// iterations (enough blocks), else by split-k.
pub const AUTO_OUTER_PARALLELISM: u64 = 256;
/// The split factor of an automatic split-k.
pub const AUTO_SPLIT: i64 = 16;

/// Which algebraic repair a compilation applies: what the program asks
/// for, or an override (`--repair`, and a gene of `polyfuse tune`: rolling
/// and split-k update trade one pass over the data against parallelism,
/// and the best split factor depends on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Choice {
    /// The program's `schedule` key, or the automatic choice without one.
    #[default]
    Program,
    /// No rolling or split-k update: every reduction runs as written.
    Off,
    /// Rolling update of the program's repairable chains.
    Rolling,
    /// Split-k update of the program's repairable chains, in this many
    /// slices.
    SplitK(i64),
}

impl Choice {
    /// The names of the text form (`--repair`, the `repair` key of a
    /// variant); the split factor is given apart.
    pub const NAMES: &'static [&'static str] = &["program", "off", "rolling", "split-k"];

    /// The choice named `name` (one of [`Choice::NAMES`]) with the split
    /// factor `split`, either optional: a factor alone asks for split-k,
    /// 16 slices ([`AUTO_SPLIT`]) when split-k has none. Other choices
    /// ignore the factor (the command line refuses it with them; a
    /// variant's canonical text always carries one).
    pub fn from_parts(
        name: Option<&str>,
        split: Option<i64>,
    ) -> std::result::Result<Choice, String> {
        let factor = split.unwrap_or(AUTO_SPLIT);
        if factor < 2 {
            return Err(format!(
                "split factor {factor}: a split-k update needs at least 2 slices"
            ));
        }
        Ok(match name {
            None if split.is_some() => Choice::SplitK(factor),
            None | Some("program") => Choice::Program,
            Some("off") => Choice::Off,
            Some("rolling") => Choice::Rolling,
            Some("split-k") => Choice::SplitK(factor),
            Some(other) => {
                return Err(format!(
                    "unknown repair `{other}` ({})",
                    Choice::NAMES.join(", ")
                ))
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Choice::Program => "program",
            Choice::Off => "off",
            Choice::Rolling => "rolling",
            Choice::SplitK(_) => "split-k",
        }
    }
}

/// The template steps of `program`: its `"schedule"` key, or, without one,
/// the automatic choice.
pub fn steps(isl: &Isl, program: &Program, scop: &Scop) -> Result<Vec<Step>> {
    match &program.schedule {
        Some(v) => directive::parse(&program.source, v),
        None => automatic(isl, program, scop),
    }
}

/// The steps of `program` under `choice`. An override replaces the
/// program's rolling-update or split-k step (keeping its targets) or adds
/// one for the chains [`repairable`] finds; `tile` and `privatize` steps
/// stay. An override with nothing to repair is an error, not a silent
/// no-op: the user asked for a fusion the program does not have.
pub fn steps_for(isl: &Isl, program: &Program, scop: &Scop, choice: Choice) -> Result<Vec<Step>> {
    if program.statements.iter().any(|s| !s.blocks.is_empty()) {
        return steps_with_blocks(program, choice);
    }
    if choice == Choice::Program {
        return steps(isl, program, scop);
    }
    // An override starts from the file's template only: the automatic
    // choice is what it replaces (and would cost its proofs for nothing).
    let given = match &program.schedule {
        Some(v) => directive::parse(&program.source, v)?,
        None => Vec::new(),
    };
    if let Choice::SplitK(f) = choice {
        if f < 2 {
            return Err(Error::Input {
                file: program.source.clone(),
                message: format!("split factor {f}: a split-k update needs at least 2 slices"),
            });
        }
    }
    let mut targets: Vec<String> = Vec::new();
    let mut kept: Vec<Step> = Vec::new();
    for step in given {
        match step {
            Step::RollingUpdate(t) | Step::SplitK { targets: t, .. } => targets.extend(t),
            other => kept.push(other),
        }
    }
    if choice == Choice::Off {
        return Ok(kept);
    }
    if targets.is_empty() {
        targets = repairable(isl, program, scop)?;
    }
    if targets.is_empty() {
        return Err(Error::Input {
            file: program.source.clone(),
            message: format!(
                "repair {}: no reduction chain of this program has a proven repair \
                 (a reduction over the same loop as an earlier one, combined \
                 through an invertible function; see --emit deps)",
                choice.name()
            ),
        });
    }
    // One repair step per program (`apply`): it goes first, as in a template.
    let step = match choice {
        Choice::SplitK(factor) => Step::SplitK { targets, factor },
        _ => Step::RollingUpdate(targets),
    };
    kept.insert(0, step);
    Ok(kept)
}

/// The steps of a program with loop blocks: no repair (its proofs and
/// rewrites know nothing of recurrences yet), so none is chosen
/// automatically and one asked for is refused; `tile` steps stay.
fn steps_with_blocks(program: &Program, choice: Choice) -> Result<Vec<Step>> {
    let given = match &program.schedule {
        Some(v) => directive::parse(&program.source, v)?,
        None => Vec::new(),
    };
    let refuse = |what: &str| {
        Error::Input {
        file: program.source.clone(),
        message: format!(
            "{what}: a program with loop blocks cannot be repaired yet (no rolling or split-k update, no privatisation)"
        ),
    }
    };
    match choice {
        Choice::Program | Choice::Off => {}
        c => return Err(refuse(&format!("repair {}", c.name()))),
    }
    let mut kept = Vec::new();
    for step in given {
        match step {
            Step::Tile(t) => kept.push(Step::Tile(t)),
            _ if choice == Choice::Off => {}
            _ => return Err(refuse("`schedule`")),
        }
    }
    Ok(kept)
}

/// The targets of the program's repairable chains, whatever their length:
/// what `--repair rolling` or `split-k` fuses in a program without a
/// `schedule` key (one group per program, as [`automatic`] forms it).
pub fn repairable(isl: &Isl, program: &Program, scop: &Scop) -> Result<Vec<String>> {
    Ok(chain_groups(isl, program, scop, |_, _| true)?
        .into_iter()
        .map(|(tensor, _)| tensor)
        .collect())
}

/// The target statement reducing into `tensor`.
fn target_of(program: &Program, tensor: &str, what: &str) -> Result<usize> {
    program
        .statements
        .iter()
        .position(|s| s.lhs_tensor == tensor && matches!(s.op, AssignOp::Reduce { .. }))
        .ok_or_else(|| Error::Input {
            file: program.source.clone(),
            message: format!("`schedule`: {what}: no reduction writes `{tensor}`"),
        })
}

/// Matches and solves the chain of each target tensor.
pub fn chains(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    targets: &[String],
    what: &str,
    fault: Fault,
) -> Result<Vec<(chain::Chain, solve::Solution)>> {
    let mut out = Vec::new();
    for name in targets {
        let k = target_of(program, name, what)?;
        let st = &program.statements[k];
        let refuse = |why: String| Error::Statement {
            file: program.source.clone(),
            position: st.position + 1,
            text: st.text.clone(),
            message: format!("{what} refused: {why}"),
        };
        let c = chain::find(isl, program, scop, k)?.map_err(refuse)?;
        let s = solve::solve(&c, fault).map_err(refuse)?;
        out.push((c, s));
    }
    Ok(out)
}

pub(crate) fn describe_chains(
    program: &Program,
    chains: &[(chain::Chain, solve::Solution)],
) -> String {
    let mut s = String::new();
    for (c, sol) in chains {
        let st = &program.statements[c.target];
        let preds: Vec<String> = c
            .preds
            .iter()
            .map(|p| {
                format!(
                    "{} = {} (statement {})",
                    p.symbol,
                    p.tensor,
                    program.statements[p.stmt].position + 1
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "target {} (statement {}): {}",
            st.lhs_tensor,
            st.position + 1,
            st.text
        );
        let _ = writeln!(s, "  predecessors: {}", preds.join(", "));
        if !c.inlined.is_empty() {
            let inl: Vec<String> = c
                .inlined
                .iter()
                .map(|k| format!("{}", program.statements[*k].position + 1))
                .collect();
            let _ = writeln!(s, "  inlined map statements: {}", inl.join(", "));
        }
        let consts: Vec<String> = c
            .constants
            .iter()
            .map(|(k, e)| format!("{k} = {}", rewrite::expr_text(e)))
            .collect();
        let _ = writeln!(
            s,
            "  f = {}, g = {}  with {}",
            c.reducer.name(),
            c.g,
            consts.join(", ")
        );
        s.push_str(&sol.describe());
    }
    s
}

/// Applies the repair steps of `steps` (at most one) to `program`.
pub fn apply(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    steps: &[Step],
    fault: Fault,
) -> Result<Option<Repaired>> {
    Ok(apply_with_dependences(isl, program, scop, steps, fault)?.map(|(r, _)| r))
}

/// [`apply`], with the dependences of the repaired program in its defining
/// order where the repair's proof computed them (a rolling update): the
/// analysis takes them instead of computing them a second time (the
/// dataflow analysis of a repaired attention program is a tenth of its
/// compilation).
pub fn apply_with_dependences(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    steps: &[Step],
    fault: Fault,
) -> Result<Option<(Repaired, Option<Dependences>)>> {
    let repairs: Vec<&Step> = steps
        .iter()
        .filter(|s| !matches!(s, Step::Tile(_)))
        .collect();
    if repairs.len() > 1 {
        return Err(Error::Input {
            file: program.source.clone(),
            message: "`schedule`: polyfuse applies one rolling-update, split-k or privatize step per program; name all targets in one step".into(),
        });
    }
    let Some(step) = repairs.first() else {
        return Ok(None);
    };
    Ok(Some(match step {
        Step::RollingUpdate(targets) => {
            let (r, deps) = rolling_update_proven(isl, program, scop, targets, fault)?;
            (r, Some(deps))
        }
        Step::SplitK { targets, factor } => (
            splitk::split_k(isl, program, scop, targets, *factor, fault)?,
            None,
        ),
        Step::Privatize { tensor, factor } => (
            splitk::privatize_step(program, scop, tensor, *factor)?,
            None,
        ),
        Step::Tile(_) => return Ok(None),
    }))
}

/// The tile sizes a `tile` step asks for.
pub fn tile_sizes(steps: &[Step]) -> Option<Vec<i64>> {
    steps.iter().find_map(|s| match s {
        Step::Tile(t) => Some(t.clone()),
        _ => None,
    })
}

/// Rolling update of `targets`, with both proofs.
pub fn rolling_update(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    targets: &[String],
    fault: Fault,
) -> Result<Repaired> {
    Ok(rolling_update_proven(isl, program, scop, targets, fault)?.0)
}

/// [`rolling_update`], with the dependences of the repaired program in
/// its order, which the proof of the repair computes.
fn rolling_update_proven(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    targets: &[String],
    fault: Fault,
) -> Result<(Repaired, Dependences)> {
    let file = &program.source;
    let chains = chains(isl, program, scop, targets, "rolling update", fault)?;
    let mut report = format!("repair: rolling update of {}\n", targets.join(", "));
    report.push_str(&describe_chains(program, &chains));

    let naive = rolling::rewrite(program, scop, &chains, false, Fault::None)?;
    let nscop = model::build(isl, &naive.program)?;
    let theta =
        isl.schedule(&rolling::original_order_tree(&nscop, &naive.origin)?.to_isl_text())?;
    let sigma = isl.schedule(&rolling::order_tree(&nscop, &naive.layout)?.to_isl_text())?;
    report.push_str(
        "naive fusion (dependences in program order, checked against the fused order):\n",
    );
    report.push_str(&dataflow::naive_fusion(
        isl,
        file,
        &nscop,
        &theta,
        &sigma,
        &naive,
        fault != Fault::NoRepair,
    )?);

    let rw = rolling::rewrite(program, scop, &chains, true, fault)?;
    let rscop = model::build(isl, &rw.program)?;
    let order = rolling::order_tree(&rscop, &rw.layout)?;
    let sigma = isl.schedule(&order.to_isl_text())?;
    let (deps, proof) = dataflow::repaired(isl, file, &rscop, &sigma, &rw)?;
    report.push_str("repaired program (dependences in the fused order):\n");
    report.push_str(&proof);
    report.push_str("repaired statements:\n");
    for (k, st) in rw.program.statements.iter().enumerate() {
        let _ = writeln!(report, "  S{k}: {}", st.text);
    }
    let repaired = Repaired {
        program: rw.program,
        order: Some(order),
        report,
    };
    Ok((repaired, deps))
}

/// Without a template: rolling update for long reductions with enough
/// outer parallelism, split-k for long reductions with little (decoding).
/// Short reductions, and chains without a proven repair, stay as written.
pub fn automatic(isl: &Isl, program: &Program, scop: &Scop) -> Result<Vec<Step>> {
    let mut rolling: Vec<String> = Vec::new();
    let mut split: Vec<String> = Vec::new();
    let long = |total: u64, outer: u64| outer > 0 && total / outer >= AUTO_LONG_REDUCTION;
    for (tensor, outer) in chain_groups(isl, program, scop, long)? {
        if outer >= AUTO_OUTER_PARALLELISM {
            rolling.push(tensor);
        } else {
            split.push(tensor);
        }
    }
    Ok(if !rolling.is_empty() && split.is_empty() {
        vec![Step::RollingUpdate(rolling)]
    } else if !split.is_empty() && rolling.is_empty() {
        vec![Step::SplitK {
            targets: split,
            factor: AUTO_SPLIT,
        }]
    } else {
        Vec::new()
    })
}

/// The targets of the chains that `keep` accepts and that have a solved
/// repair, sharing the first such chain's predecessor (one group per
/// program), each with its outer parallelism (the instances of its
/// predecessor's initialisation). `keep` sees the instance counts of the
/// predecessor's update and initialisation (the reduction's whole length,
/// and the outer parallelism) before the solver runs: the proofs cost
/// time, spent only on chains worth fusing.
fn chain_groups(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    keep: impl Fn(u64, u64) -> bool,
) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut first_pred: Option<usize> = None;
    for (k, st) in program.statements.iter().enumerate() {
        if !matches!(st.op, AssignOp::Reduce { init: true, .. }) {
            continue;
        }
        let Ok(c) = chain::find(isl, program, scop, k)? else {
            continue;
        };
        let p = c.preds[0].stmt;
        if first_pred.is_some_and(|f| f != p) {
            continue; // one group per program
        }
        let (Some(upd), Some(init)) = (
            scop.statement(&format!("S{p}")),
            scop.statement(&format!("S{p}_init")),
        ) else {
            continue;
        };
        let count = |s: &model::ModelStmt| -> Result<Option<u64>> {
            let d = s
                .domain
                .copy()?
                .intersect_params(scop.context.copy()?)?
                .project_out_all_params()?;
            Ok(crate::model::count::count_points(&d).ok())
        };
        let (Some(total), Some(outer)) = (count(upd)?, count(init)?) else {
            continue;
        };
        if !keep(total, outer) || solve::solve(&c, Fault::None).is_err() {
            continue;
        }
        first_pred = Some(p);
        out.push((st.lhs_tensor.clone(), outer));
    }
    Ok(out)
}
