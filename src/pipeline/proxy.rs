//! Scheduling a repaired program at proxy sizes (issue 34): compile time
//! that does not grow with the sizes where a repair wrote a constant of
//! its own (a split's chunk) into the domains.

use crate::deps;
use crate::frontend::ast::{Affine, Program, WhereClause};
use crate::isl::{Isl, IslPrint};
use crate::model;
use crate::repair;
use crate::schedule::{self, ScheduleTree, Strategy};

use super::analysis::{Analysis, Repaired};
use super::Options;

/// The sizes a proxy program takes for the sizes of the real one that are
/// larger than [`PROXY_KEEP`] (see [`schedule_at_proxy_sizes`]), tried in
/// turn: odd, so that a split's slices rarely divide them evenly (at an
/// even divisor isl may order a slice's statements by the chunk's length,
/// a constant that does not carry over), and at least three times the
/// largest split factor, so every slice keeps a few iterations.
fn proxy_sizes(steps: &[repair::Step]) -> [i64; 3] {
    let factor = steps
        .iter()
        .map(|s| match s {
            repair::Step::SplitK { factor, .. } | repair::Step::Privatize { factor, .. } => *factor,
            _ => 1,
        })
        .max()
        .unwrap_or(1);
    let base = (3 * factor).max(PROXY_KEEP) + 1;
    [base, base + 4, base + 12]
}

/// Sizes up to this are kept as they are in a proxy program (and a bound
/// that several sizes share stays a constant in `schedule_symbolic`).
pub(super) const PROXY_KEEP: i64 = 32;

/// The schedule of a repaired program computed on a proxy: the same
/// program with its large sizes shrunk, repaired by the same steps and
/// scheduled at those sizes, then put over the real program's domain.
///
/// Why: a split-k repair writes its slices with a constant chunk,
/// `j = ⌈KV/f⌉ j_s + j_u` with `0 <= j_u < ⌈KV/f⌉`, which no parameter
/// names; isl's scheduler carries that constant through its integer
/// programs, and their pivots grow with it (decoding at KV = 1535 took
/// 10 s, at 4096 past the watch's minute). At proxy sizes the chunk is a
/// few iterations and the problem has the same shape, so the schedule's
/// functions (affine in the statements' iterators) are in general the
/// ones the real sizes would get.
///
/// Nothing of the proxy is trusted: the schedule must cover the real
/// domain (every instance: its filters name statements, not sizes), its
/// bands' permutable and coincident flags are recomputed from the real
/// dependences ([`schedule::reannotate_bands`]), and it must respect them
/// ([`schedule::is_legal`]; a schedule that orders two statements by a
/// constant of the proxy's sizes does not). The next proxy size is tried
/// where one fails; `None` where all fail, or the repaired program has no
/// constant of its own (then the caller schedules the real program).
pub(super) fn schedule_at_proxy_sizes(
    isl: &Isl,
    real: &Real,
    strategy: Strategy,
) -> Option<crate::isl::Schedule> {
    let large = real
        .program
        .params
        .iter()
        .any(|p| p.value.is_some_and(|v| v > PROXY_KEEP));
    if !large || !has_derived_constant(real.repaired, real.program) {
        return None;
    }
    proxy_sizes(real.steps)
        .into_iter()
        .find_map(|size| try_proxy(isl, real, strategy, size))
}

/// The real program a proxy stands for: the user's program, its repaired
/// form with the repair's steps, its model and dependences, the options.
pub(super) struct Real<'a> {
    pub program: &'a Program,
    pub repaired: &'a Program,
    pub steps: &'a [repair::Step],
    pub scop: &'a model::Scop,
    pub deps: &'a deps::Dependences,
    pub options: &'a Options,
}

/// The schedule of the real program at proxy size `size` (each size
/// above [`PROXY_KEEP`] lowered to it), put over its domain and verified
/// against its dependences; `None` where it fails.
fn try_proxy(
    isl: &Isl,
    real: &Real,
    strategy: Strategy,
    size: i64,
) -> Option<crate::isl::Schedule> {
    let (scop, deps) = (real.scop, real.deps);
    let mut proxy = real.program.clone();
    for p in &mut proxy.params {
        if p.value.is_some_and(|v| v > PROXY_KEEP) {
            p.value = Some(size);
        }
    }
    let s = schedule_proxy(isl, &proxy, real.steps, real.options, strategy)?;
    let mut tree = ScheduleTree::from_isl(&s.get_root().ok()?).ok()?;
    let domain = scop.domain().ok()?;
    tree.domain = domain.text();
    let s = isl.schedule(&tree.to_isl_text()).ok()?;
    let covered = s.get_map().ok()?.domain().ok()?;
    if !domain.is_subset(&covered).ok()? {
        return None;
    }
    let s = schedule::reannotate_bands(isl, s, deps, &scop.param_prefix).ok()?;
    schedule::is_legal(&s, scop, deps).ok()?.then_some(s)
}

/// `proxy` repaired by `steps` and scheduled, as [`super::compile`] would.
fn schedule_proxy(
    isl: &Isl,
    proxy: &Program,
    steps: &[repair::Step],
    options: &Options,
    strategy: Strategy,
) -> Option<crate::isl::Schedule> {
    let original = model::build(isl, proxy).ok()?;
    let r = Repaired::with_steps(isl, proxy, original, options, steps.to_vec()).ok()?;
    let a = Analysis::of(r).ok()?;
    schedule::compute(isl, a.scop(), &a.deps, strategy).ok()
}

/// Whether the repair wrote a constant into a statement's conditions that
/// is neither a size of the program nor a constant of the program's own
/// conditions (a split's chunk), which the symbolic schedule cannot turn
/// back into a parameter, and that is larger than [`MAX_CONSTANT`].
fn has_derived_constant(repaired: &Program, program: &Program) -> bool {
    fn constants(p: &Program) -> impl Iterator<Item = i64> + '_ {
        p.statements.iter().flat_map(|st| {
            st.wheres.iter().flat_map(|w| {
                let affs: Vec<&Affine> = match w {
                    WhereClause::Range { lo, hi, .. } => vec![lo, hi],
                    WhereClause::Constraint { lhs, rhs, .. } => vec![lhs, rhs],
                    WhereClause::Union(_) => Vec::new(),
                };
                affs.into_iter()
                    .flat_map(|a| std::iter::once(a.constant).chain(a.terms.values().copied()))
            })
        })
    }
    let known: std::collections::HashSet<i64> = program
        .params
        .iter()
        .filter_map(|p| p.value)
        .chain(constants(program))
        .collect();
    constants(repaired).any(|c| c.abs() > MAX_CONSTANT && !known.contains(&c))
}

/// Derived constants up to this size leave the scheduler's integer
/// programs as fast as the program's own sizes do (decoding with a chunk
/// of 251 schedules in a second, one of 384 took 10 s), and scheduling
/// the real program keeps the schedule isl gives at those sizes (at KV =
/// 1000 its scores' dot product has a band of its own, which the mapping
/// runs as a warp per score); the bound on a schedule's constant terms.
const MAX_CONSTANT: i64 = schedule::MAX_CONSTANT_SHIFT as i64;

#[cfg(test)]
mod tests {
    use super::*;

    /// Split-k decoding (`examples/attention_decode_gqa.json`) at key
    /// length `kv`: the program, its repair, model and dependences, as
    /// `compile` has them.
    struct Decoding {
        isl: Isl,
        program: Program,
        repaired: Program,
        steps: Vec<repair::Step>,
        scop: model::Scop,
        deps: deps::Dependences,
        options: Options,
    }

    impl Decoding {
        fn new(kv: i64) -> Decoding {
            let isl = Isl::new();
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/attention_decode_gqa.json");
            let mut program = crate::frontend::load_file(&path).unwrap();
            crate::frontend::apply_param_overrides(&mut program, &[("KV".into(), kv)]).unwrap();
            let options = Options::default();
            let original = model::build(&isl, &program).unwrap();
            let steps =
                repair::steps_for(&isl, &program, &original, repair::Choice::Program).unwrap();
            let r = Repaired::with_steps(&isl, &program, original, &options, steps.clone());
            let a = Analysis::of(r.unwrap()).unwrap();
            Decoding {
                repaired: a.repaired.rewrite.unwrap().program,
                scop: a.repaired.scop,
                deps: a.deps,
                isl,
                program,
                steps,
                options,
            }
        }

        fn real(&self) -> Real<'_> {
            Real {
                program: &self.program,
                repaired: &self.repaired,
                steps: &self.steps,
                scop: &self.scop,
                deps: &self.deps,
                options: &self.options,
            }
        }

        fn proxy(&self) -> Option<crate::isl::Schedule> {
            schedule_at_proxy_sizes(&self.isl, &self.real(), Strategy::Isl)
        }
    }

    #[test]
    fn a_split_chunk_is_a_derived_constant_a_programs_own_is_not() {
        let d = Decoding::new(4096);
        assert!(has_derived_constant(&d.repaired, &d.program));
        assert!(!has_derived_constant(&d.program, &d.program));
    }

    #[test]
    fn decoding_at_a_large_key_length_is_scheduled_at_proxy_sizes_and_legal() {
        let d = Decoding::new(4096);
        let s = d.proxy().expect("a proxy schedule");
        // Legal at the real sizes, with the error path's own check too.
        schedule::check_legal("decoding", &s, &d.scop, &d.deps).unwrap();
        let domain = d.scop.domain().unwrap();
        assert!(domain
            .is_subset(&s.get_map().unwrap().domain().unwrap())
            .unwrap());
    }

    #[test]
    fn a_proxy_whose_schedule_orders_by_its_own_chunk_is_refused() {
        // At KV = 32 the chunk of 4 slices is 8, and isl orders a slice's
        // statements by a constant of that chunk: illegal at KV = 4096.
        let d = Decoding::new(4096);
        assert!(try_proxy(&d.isl, &d.real(), Strategy::Isl, 32).is_none());
        assert!(try_proxy(&d.isl, &d.real(), Strategy::Isl, 33).is_some());
    }

    #[test]
    fn a_chunk_within_the_schedules_constant_bound_takes_no_proxy() {
        // KV = 1000 in 4 slices: a chunk of 250.
        let d = Decoding::new(1000);
        assert!(!has_derived_constant(&d.repaired, &d.program));
        assert!(d.proxy().is_none());
    }

    #[test]
    fn small_sizes_take_no_proxy() {
        assert!(Decoding::new(32).proxy().is_none());
    }
}
