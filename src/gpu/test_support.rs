//! Programs given as JSON text, compiled through the library up to where
//! the GPU mapping's recognisers run: the unit tests of
//! [`super::attention`], [`super::decoding`] and [`super::contraction`].

use crate::deps::{self, Dependences};
use crate::frontend::{self, ast::Program};
use crate::isl::Isl;
use crate::model::{self, Scop};
use crate::repair;
use crate::schedule::{self, Strategy};

use super::mapping::KernelPlan;
use super::GpuOptions;

/// A program as `pipeline::compile` analyses it: repaired where its
/// `schedule` key (or the automatic choice) asks, modelled, and its
/// dependences under the defining order.
pub(crate) struct Analysed {
    pub(crate) isl: Isl,
    /// The program that is scheduled: the repaired one where there is one.
    pub(crate) program: Program,
    pub(crate) scop: Scop,
    pub(crate) deps: Dependences,
}

impl Analysed {
    /// Loads and analyses `json` (the stages of `pipeline::analysis`:
    /// model, repair, dependences).
    pub(crate) fn new(json: &str) -> Analysed {
        let isl = Isl::new();
        let program = frontend::load_str(json, "unit test").unwrap();
        let original = model::build(&isl, &program).unwrap();
        let steps = repair::steps_for(&isl, &program, &original, repair::Choice::Program).unwrap();
        let repaired =
            repair::apply(&isl, &program, &original, &steps, repair::Fault::None).unwrap();
        let (program, order) = match repaired {
            Some(r) => (r.program, r.order),
            None => (program, None),
        };
        let scop = model::build(&isl, &program).unwrap();
        let order = match order {
            Some(tree) => isl.schedule(&tree.to_isl_text()).unwrap(),
            None => schedule::canonical(&isl, &scop).unwrap(),
        };
        let deps = deps::compute(&scop, &order).unwrap();
        Analysed {
            isl,
            program,
            scop,
            deps,
        }
    }

    /// The position of the statement that writes `tensor` (the first).
    pub(crate) fn writer(&self, tensor: &str) -> usize {
        self.program
            .statements
            .iter()
            .position(|s| s.lhs_tensor == tensor)
            .unwrap_or_else(|| panic!("no statement writes {tensor}"))
    }

    /// The kernels' plans of isl's schedule mapped with `tile` and
    /// `options` (what the GPU stage maps for a program without a repair).
    pub(crate) fn plans(&self, tile: &[i64], options: &GpuOptions) -> Vec<KernelPlan> {
        let sched = schedule::compute(&self.isl, &self.scop, &self.deps, Strategy::Isl).unwrap();
        super::mapping::map(
            &self.isl,
            &self.program,
            &self.scop,
            &self.deps,
            sched,
            tile,
            options,
        )
        .unwrap()
        .1
    }
}
