//! The stages of a compilation after the dependences: the schedule, the
//! GPU mapping, the GPU kernels and the CPU kernel, each a value the next
//! takes (see [`super::compile`] for their order).

use std::collections::HashMap;
use std::fmt::Write;

use crate::codegen::{self, c::Boxes};
use crate::deps;
use crate::error::{Error, Result};
use crate::frontend::ast::{collect_reads, Affine, Program, Statement, WhereClause};
use crate::gpu::{self, CudaProgram, GpuOptions};
use crate::isl::ast::c_expr;
use crate::isl::{aff_in_params, schedule_yaml, Isl, IslPrint};
use crate::model;
use crate::model::count::Counts;
use crate::schedule::{self, ScheduleTree, Strategy};

use super::analysis::Analysis;
use super::mapping::Mapping;
use super::probe::{self, RowsProbe};
use super::proxy;

/// Stage `schedule`: the program's schedule before tiling, checked
/// against every dependence, and how it was made.
pub(crate) struct Scheduled {
    pub schedule: crate::isl::Schedule,
    /// The strategy in effect: the options', or maximal fusion where a
    /// rolling update or the rows probe chose it.
    pub strategy: Strategy,
    /// Whether the program scheduled has loop blocks.
    pub blocks: bool,
    /// The schedule's mapping where the rows probe made it already (not
    /// yet proven): the gpu stage proves it rather than mapping again.
    pub premapped: Option<Mapping>,
    pub untiled_tree: ScheduleTree,
    /// How the schedule was made, for the dump.
    pub made_by: &'static str,
}

impl Scheduled {
    /// The schedule of the program `analysis` holds (`program` is the
    /// user's: the proxy repairs it again at its own sizes).
    pub fn new(isl: &Isl, program: &Program, analysis: &Analysis) -> Result<Scheduled> {
        let r = &analysis.repaired;
        let (scop, deps, options) = (&r.scop, &analysis.deps, analysis.options());
        let program_k = r.program(program);
        let blocks = program_k.statements.iter().any(|s| !s.blocks.is_empty());
        // Strategy probing, step 1 (`probe::rows_on_chip`): a rolling
        // update fuses a chain of reductions into one pass over each row;
        // isl's scheduler would then split the row's consumers (a
        // softmax's output, attention's division) into a kernel of their
        // own, which reads the row again from memory. Maximal fusion keeps
        // them in the row's loop, where the GPU keeps the row on chip
        // (`gpu::lanes`).
        //
        // Without a rolling update the same holds for a chain of plain row
        // reductions and maps (layer norm): on the GPU, maximal fusion is
        // chosen where it gives fewer kernels than isl's schedule and every
        // one of them keeps its rows across lanes. A split-k repair keeps
        // isl's schedule of its symbolic sizes (scheduling its pinned sizes
        // a second time cost seconds, and its partial reductions are no
        // rows of lanes).
        //
        // The probe's schedule, where it chose maximal fusion, is the one
        // used below; where maximal fusion cannot be mapped, isl's schedule
        // stays (and reports its own errors).
        //
        // Not for a program with loop blocks: the probe schedules the whole
        // program twice more with its sizes pinned, which for a recurrence
        // takes tens of seconds (a stacked LSTM at T = 256, H = 256: 30 s),
        // and its steps' rows run on the host's steps anyway.
        let probe = match (options.strategy, &options.gpu) {
            (Strategy::Isl, Some(gpu)) if r.rewrite.is_none() && !blocks => {
                probe::rows_on_chip(isl, program_k, scop, deps, options, gpu).unwrap_or_default()
            }
            _ => RowsProbe::default(),
        };
        let rows_fused = probe.fused.is_some();
        let strategy = match options.strategy {
            Strategy::Isl if program_k.rolling.is_some() || rows_fused => Strategy::Max,
            s => s,
        };
        let (sched, premapped, made_by) = if options.strategy == Strategy::Canonical {
            let sched = match &r.rewrite {
                Some(_) => {
                    schedule::annotate_bands(isl, r.order.copy()?, deps, &scop.param_prefix)?
                }
                None => schedule::compute(isl, scop, deps, strategy)?,
            };
            (sched, None, "program order (canonical)")
        } else {
            scheduler(isl, program, analysis, strategy, blocks, probe)?
        };
        let sched = fused_further(
            isl, program_k, analysis, sched, strategy, rows_fused, blocks,
        )?;
        schedule::check_legal(&program.source, &sched, scop, deps)?;
        let untiled_tree = ScheduleTree::from_isl(&sched.get_root()?)?;
        Ok(Scheduled {
            schedule: sched,
            strategy,
            blocks,
            premapped,
            untiled_tree,
            made_by,
        })
    }

    /// The dump: the strategy and how the schedule was made, then the
    /// schedule as isl's YAML.
    pub fn dump(&self) -> String {
        format!(
            "strategy: {}\nmade by: {}\n{}",
            self.strategy.name(),
            self.made_by,
            schedule_yaml(&self.schedule)
        )
    }
}

/// isl's scheduler's schedule under `strategy`: at proxy sizes or with
/// the sizes symbolic for a repaired program (and one with loop blocks),
/// the rows probe's where it made one, else computed here. Gives its
/// mapping where the probe made it, and how it was made.
fn scheduler(
    isl: &Isl,
    program: &Program,
    analysis: &Analysis,
    strategy: Strategy,
    blocks: bool,
    probe: RowsProbe,
) -> Result<(crate::isl::Schedule, Option<Mapping>, &'static str)> {
    let r = &analysis.repaired;
    let (scop, deps) = (&r.scop, &analysis.deps);
    let program_k = r.program(program);
    // A repaired program, and one with loop blocks, is scheduled with its
    // sizes symbolic (see `schedule_symbolic`); others with the sizes they
    // have. (A stacked LSTM at T = 256, H = 256 took 26 s with its sizes
    // pinned, 0.9 s without.)
    let order = r.rewrite.as_ref().map(|rw| rw.order.as_ref());
    let proxy = match &r.rewrite {
        Some(rw) if !blocks => proxy::schedule_at_proxy_sizes(
            isl,
            &proxy::Real {
                program,
                repaired: &rw.program,
                steps: &r.steps,
                scop,
                deps,
                options: analysis.options(),
            },
            strategy,
        ),
        _ => None,
    };
    let proxied = proxy.is_some();
    let symbolic = proxy.or_else(|| {
        (r.rewrite.is_some() || blocks).then_some(())?;
        let s = schedule_symbolic(isl, program_k, order.flatten(), strategy)?;
        let s = s.intersect_domain(scop.domain().ok()?).ok()?;
        // Valid for every size, so for these; checked all the same.
        schedule::check_legal(&program.source, &s, scop, deps).ok()?;
        Some(s)
    });
    Ok(match (symbolic, probe.fused) {
        (Some(s), _) if proxied => (s, None, "isl's scheduler at proxy sizes"),
        (Some(s), _) => (s, None, "isl's scheduler with the sizes symbolic"),
        (None, Some((s, mapped))) if probe.siblings => (
            s,
            Some(mapped),
            "the rows probe: isl's scheduler, sibling loops that read the same rows fused",
        ),
        (None, Some((s, mapped))) => (
            s,
            Some(mapped),
            "the rows probe: maximal fusion keeps rows across lanes in fewer kernels",
        ),
        // The probe computed isl's schedule as this would, and mapped it.
        (None, None) => match probe.isl.filter(|_| strategy == Strategy::Isl) {
            Some((s, mapped)) => (s, mapped, "isl's scheduler (the rows probe's)"),
            None => (
                schedule::compute(isl, scop, deps, strategy)?,
                None,
                "isl's scheduler",
            ),
        },
    })
}

/// `sched` with the fusions isl's scheduler does not make: a producer's
/// loop aligned with its consumer's (maximal fusion), sums into one
/// accumulator in one band (the default strategy).
fn fused_further(
    isl: &Isl,
    program: &Program,
    analysis: &Analysis,
    sched: crate::isl::Schedule,
    strategy: Strategy,
    rows_fused: bool,
    blocks: bool,
) -> Result<crate::isl::Schedule> {
    let (scop, deps) = (analysis.scop(), &analysis.deps);
    // Maximal fusion also takes in a producer's loop that isl left beside
    // its consumer's (attention's scores beside its rolling loop). Not
    // where maximal fusion was chosen for its rows across lanes: a map
    // fused into a reduction's loop leaves that loop no lane split (a
    // row's `t = f(x)` then `s += t` ran a row a thread, 5 kernels' worth
    // of time in one).
    let sched = if strategy == Strategy::Max && !rows_fused {
        schedule::fuse::aligned_loops(isl, sched, scop, deps)?
    } else {
        sched
    };
    // Under the default strategy, sums into one accumulator that isl left
    // in loop nests of their own (an LSTM cell's `G +=! X W; G += H U`)
    // share one band: one kernel, the accumulator never in memory between
    // them (`schedule::sums`; kept only where legal). With loop blocks
    // the host steps' schedule is made in the gpu stage, and the sums in
    // each step are fused there (`probe::step_on_host`).
    Ok(match strategy {
        Strategy::Isl if analysis.repaired.rewrite.is_none() && !blocks => {
            schedule::sums::fuse_sibling_sums(isl, program, scop, deps, &sched)?.unwrap_or(sched)
        }
        _ => sched,
    })
}

/// Stage `gpu`: the schedule mapped to kernels, blocks and threads and
/// proven, after the probes that may replace it (race freedom, host
/// steps, the grouping by cost); the cost model's estimate where one was
/// made or asked for, and what the mapping refused.
pub(crate) struct Mapped {
    pub mapping: Mapping,
    pub estimate: Option<gpu::cost::Estimate>,
    pub notes: Vec<String>,
}

impl Mapped {
    pub fn new(
        isl: &Isl,
        program: &Program,
        analysis: &Analysis,
        scheduled: &mut Scheduled,
        g: &GpuOptions,
    ) -> Result<Mapped> {
        let r = &analysis.repaired;
        let (scop, deps, options) = (&r.scop, &analysis.deps, analysis.options());
        let program_k = r.program(program);
        let strategy = scheduled.strategy;
        let mapped = probe::map_for_race_freedom(
            isl,
            program_k,
            scop,
            deps,
            &scheduled.schedule,
            scheduled.premapped.take(),
            strategy,
            options,
            g,
        )?;
        // Recurrences the mapping serialised run on the host's steps.
        let (mapped, stepped) =
            probe::step_on_host(isl, program_k, scop, deps, mapped, strategy, options, g)?;
        // The grouping by cost (issue 32): under the default strategy,
        // minimal fusion where the model expects it to be faster (not for
        // loop blocks: minimal fusion at pinned sizes is as slow as the
        // rows probe, and the model counts no host loop).
        // The cost model's counted sets, for every estimate made here.
        let counts = Counts::default();
        let (mapped, estimate) = match (options.strategy, &r.rewrite) {
            (Strategy::Isl, None) if g.fusion_by_cost && !scheduled.blocks => {
                probe::choose_by_cost(isl, program_k, scop, deps, mapped, options, g, &counts)?
            }
            _ => (mapped, None),
        };
        let estimate = match estimate {
            None if g.estimate => gpu::cost::estimate(
                scop,
                program_k,
                &mapped.schedule,
                &mapped.plans,
                &gpu::cost::Machine::H100,
                &counts,
            )?,
            e => e.filter(|_| g.estimate),
        };
        Ok(Mapped {
            mapping: mapped,
            estimate,
            notes: stepped.map(|s| s.refused).unwrap_or_default(),
        })
    }

    /// The dump: the mapped schedule as isl's YAML, each kernel's plan (its
    /// launch and its decisions, a line each: `gpu::describe`), the
    /// estimate and the notes.
    pub fn dump(&self) -> String {
        let mut out = schedule_yaml(&self.mapping.schedule);
        for p in &self.mapping.plans {
            out.push_str(&p.to_string());
        }
        if let Some(e) = &self.estimate {
            let _ = writeln!(out, "estimate: {e:#?}");
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        out
    }
}

/// Stage `kernels`: the mapped tree, the CUDA program (source, launch
/// records, arguments) and its C emulation, printed from the proven
/// mapping; the estimate and notes of the mapping carried along.
pub(crate) struct Kernels {
    pub tree: ScheduleTree,
    pub cuda: CudaProgram,
    pub emulation: String,
    pub estimate: Option<gpu::cost::Estimate>,
    pub notes: Vec<String>,
}

impl Kernels {
    pub fn print(program: &Program, analysis: &Analysis, mapped: Mapped) -> Result<Kernels> {
        let program_k = analysis.repaired.program(program);
        let scop = analysis.scop();
        let schedule = &mapped.mapping.schedule;
        let tree = ScheduleTree::from_isl(&schedule.get_root()?)?;
        let ast = codegen::build_ast(scop, schedule)?;
        let (cuda, emulation) =
            codegen::cuda::program(program_k, scop, &ast, &mapped.mapping.plans)?;
        Ok(Kernels {
            tree,
            cuda,
            emulation,
            estimate: mapped.estimate,
            notes: mapped.notes,
        })
    }

    /// The dump: each kernel's launch record, a line each, then the
    /// arguments and the host loops (the CUDA source is `--emit cuda`'s).
    pub fn dump(&self) -> String {
        let name = |n: &str| n.to_string();
        let mut out = String::new();
        for k in &self.cuda.kernels {
            let grid: Vec<String> = k.grid.iter().map(|e| c_expr(e, &name)).collect();
            let _ = writeln!(
                out,
                "{}: grid [{}], block {:?}, shared {} B dynamic, {} B static, dependent {}, globals [{}]",
                k.name,
                grid.join(", "),
                k.block,
                k.dynamic_shared,
                k.static_shared,
                k.dependent,
                k.globals.join(", ")
            );
        }
        for a in &self.cuda.args {
            let _ = writeln!(out, "arg: {a}");
        }
        for l in &self.cuda.host_loops {
            let _ = writeln!(out, "host loop: {l}");
        }
        out
    }
}

/// Stage `cpu`: the CPU kernel (the schedule tiled and sunk as the options
/// say, checked against the dependences, and its C) where the options ask
/// for it, and the f64 reference of the user's program where every size
/// has a value.
pub(crate) struct CpuKernel {
    /// The final schedule tree; without a CPU kernel, the untiled one.
    pub tree: ScheduleTree,
    /// Its isl schedule, without a CPU kernel none.
    schedule: Option<crate::isl::Schedule>,
    pub kernel_c: String,
    pub reference_c: Option<String>,
}

/// Tensor names, comma-separated, for a message.
fn names(tensors: &[model::ModelTensor]) -> String {
    tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl CpuKernel {
    pub fn new(
        isl: &Isl,
        program: &Program,
        analysis: &Analysis,
        sched: crate::isl::Schedule,
        untiled_tree: &ScheduleTree,
    ) -> Result<CpuKernel> {
        let r = &analysis.repaired;
        let (tree, schedule, kernel_c) = if analysis.options().cpu_kernel {
            let program_k = r.program(program);
            let (scop, deps) = (&r.scop, &analysis.deps);
            let (tree, final_schedule) =
                tiled(isl, program_k, scop, deps, sched, analysis.options())?;
            let ast = codegen::build_ast(scop, &final_schedule)?;
            let c = codegen::c::kernel(program_k, scop, &ast);
            (tree, Some(final_schedule), c)
        } else {
            (untiled_tree.clone(), None, String::new())
        };
        let values = program.known_params();
        let reference_c = if values.len() == program.params.len() {
            // The reference is the original program's, whatever was
            // repaired, run on the compiled program's tensors: each of the
            // original's at its position there.
            let slots = r
                .original
                .tensors
                .iter()
                .map(|t| {
                    r.scop
                        .tensors
                        .iter()
                        .position(|c| c.name == t.name)
                        .ok_or_else(|| {
                            Error::Internal(format!(
                                "tensor {} of the program is not among the repaired program's ({})",
                                t.name,
                                names(&r.scop.tensors)
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            let boxes = bounding_boxes(&r.original, &values)?;
            Some(codegen::c::reference(program, &r.original, &slots, &boxes))
        } else {
            None
        };
        Ok(CpuKernel {
            tree,
            schedule,
            kernel_c,
            reference_c,
        })
    }

    /// The dump: the tiled schedule as isl's YAML and the kernel's C.
    pub fn dump(&self) -> String {
        match &self.schedule {
            Some(s) => format!("{}{}", schedule_yaml(s), self.kernel_c),
            None => "no CPU kernel (only the GPU side was asked for)\n".into(),
        }
    }
}

/// `sched` tiled and sunk as `options` say and checked against the
/// dependences (as every schedule codegen sees): its tree and its isl
/// schedule.
fn tiled(
    isl: &Isl,
    program: &Program,
    scop: &model::Scop,
    deps: &deps::Dependences,
    sched: crate::isl::Schedule,
    options: &super::Options,
) -> Result<(ScheduleTree, crate::isl::Schedule)> {
    let tiled = schedule::tile(isl, sched, &options.tile)?;
    let mut tree = ScheduleTree::from_isl(&tiled.get_root()?)?;
    if options.sink && !options.tile.is_empty() {
        tree.root = schedule::sink_point_bands(isl, tree.root)?;
    }
    let final_schedule = isl.schedule(&tree.to_isl_text())?;
    schedule::check_legal(&program.source, &final_schedule, scop, deps)?;
    Ok((tree, final_schedule))
}

/// isl's schedule for `program` with every parameter symbolic (`>= 1`),
/// or `None` where that model cannot be built.
///
/// Why: a parameter with a value is pinned in the context, and isl then
/// folds it into every constraint (`j <= 4095`). The scheduler's integer
/// programs with such constants can need very many cutting planes: causal
/// attention took 4 s at S = 256 and minutes at S = 4096. A schedule valid
/// for all sizes is valid for the pinned ones (the caller intersects its
/// domain and checks it against the pinned dependences). It is used for
/// repaired programs only: isl fuses differently without the sizes (gemm's
/// initialisation leaves the k band), and the programs a repair writes are
/// the ones whose integer programs grow (isl's operation quota does not
/// catch it: few pivots, each on huge integers).
fn schedule_symbolic(
    isl: &Isl,
    program: &Program,
    order: Option<&ScheduleTree>,
    strategy: Strategy,
) -> Option<crate::isl::Schedule> {
    if program.params.iter().all(|p| p.value.is_none()) {
        return None;
    }
    let mut symbolic = program.clone();
    for p in &mut symbolic.params {
        p.value = None;
    }
    // A repair writes its statements' ranges with the sizes' values
    // (`i in 0:4096`); a bound equal to one parameter's value alone is read
    // as that parameter here (see `range_parameter`).
    let mut by_value: HashMap<i64, Vec<&str>> = HashMap::new();
    for p in &program.params {
        if let Some(v) = p.value {
            by_value.entry(v).or_default().push(p.name.as_str());
        }
    }
    for (st, original) in symbolic.statements.iter_mut().zip(&program.statements) {
        for w in &mut st.wheres {
            if let WhereClause::Range { index, hi, .. } = w {
                let name = hi
                    .as_constant()
                    .and_then(|c| range_parameter(program, original, index, c, by_value.get(&c)?));
                if let Some(name) = name {
                    *hi = Affine::var(name);
                }
            }
        }
    }
    let scop = model::build(isl, &symbolic).ok()?;
    let order = match order {
        Some(tree) => {
            let mut tree = tree.clone();
            tree.domain = scop.domain().ok()?.text();
            isl.schedule(&tree.to_isl_text()).ok()?
        }
        None => schedule::canonical(isl, &scop).ok()?,
    };
    // Only the scheduler sees these dependences (its result is checked
    // against the pinned ones, which are printed).
    let deps = deps::compute_flat(&scop, &order).ok()?;
    schedule::compute(isl, &scop, &deps, strategy).ok()
}

/// The parameter a range's constant bound `value` stands for, of `names`
/// (the parameters whose value it is): the only one, or, where several
/// share a value larger than `proxy::PROXY_KEEP` (`D = W = 64`), the only
/// one of them that is the extent of a tensor dimension that `index`
/// alone subscripts in the statement (`d` in `O(b, h, i, d)`, `O` of
/// shape `[B, H, S, D]`: `D`). A large bound left a constant kept the
/// scheduler's integer programs from finishing (bigbird attention at S =
/// 4096 with `d in 0:64`: past two minutes, against seconds with `D`); a
/// small shared one (`B = H = 2`) stays a constant, as isl schedules it
/// fast and the examples' schedules were made with it.
fn range_parameter<'a>(
    program: &Program,
    st: &Statement,
    index: &str,
    value: i64,
    names: &[&'a str],
) -> Option<&'a str> {
    if let [name] = names {
        return Some(name);
    }
    if value <= proxy::PROXY_KEEP {
        return None;
    }
    let mut accesses = vec![(
        st.lhs_tensor.clone(),
        st.lhs_indices.iter().map(|i| Affine::var(i)).collect(),
    )];
    collect_reads(&st.rhs, &mut accesses);
    let by_index = Affine::var(index);
    let mut found: Vec<&'a str> = Vec::new();
    for (tensor, subscripts) in &accesses {
        let Some(shape) = program.tensor(tensor).and_then(|t| t.shape.as_ref()) else {
            continue;
        };
        for (subscript, extent) in subscripts.iter().zip(shape) {
            let named = names.iter().find(|n| *extent == Affine::var(n));
            if let (true, Some(&n)) = (*subscript == by_index, named) {
                if !found.contains(&n) {
                    found.push(n);
                }
            }
        }
    }
    match found.as_slice() {
        [name] => Some(name),
        _ => None,
    }
}

/// Integer bounds of each statement's iterators (all parameters fixed by
/// the context). Statements with an empty domain are left out.
fn bounding_boxes(scop: &model::Scop, values: &HashMap<String, i64>) -> Result<Boxes> {
    let mut boxes = Boxes::new();
    for s in &scop.statements {
        if s.domain.is_empty()? {
            continue;
        }
        let mut b = Vec::new();
        for pos in 0..s.iterators.len() as i32 {
            let lo = fixed_value(s.domain.copy()?.dim_min(pos)?, scop, values)?;
            let hi = fixed_value(s.domain.copy()?.dim_max(pos)?, scop, values)?;
            b.push((lo, hi));
        }
        boxes.insert(s.name.clone(), b);
    }
    Ok(boxes)
}

fn fixed_value(
    pa: crate::isl::PwAff,
    scop: &model::Scop,
    values: &HashMap<String, i64>,
) -> Result<i64> {
    let pa = pa.gist_params(scop.context.copy()?)?;
    if !pa.isa_aff()? {
        return Err(Error::Internal(format!(
            "bound {} is not one affine piece",
            pa.text()
        )));
    }
    let (c, terms) = aff_in_params(&pa.as_aff()?)?;
    let mut v = c;
    for (name, k) in terms {
        v += k * values
            .get(&name)
            .ok_or_else(|| Error::Internal(format!("parameter {name} has no value")))?;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::analysis::{Model, Repaired};
    use crate::pipeline::Options;

    fn gemm_analysis(isl: &Isl, program: &Program, options: &Options) -> Analysis {
        let model = Model::build(isl, program).unwrap();
        Analysis::of(Repaired::choose(isl, program, model, options).unwrap()).unwrap()
    }

    fn gemm() -> Program {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gemm.json");
        crate::frontend::load_file(&path).unwrap()
    }

    #[test]
    fn a_range_bound_shared_by_two_sizes_reads_as_the_subscripted_dimensions() {
        let program = crate::frontend::load_str(
            r#"{"name": "t", "params": {"D": 64, "W": 64},
                "inputs": {"A": {"dtype": "f32", "shape": ["W", "D"]}},
                "outputs": {"Y": {"dtype": "f32", "shape": ["D"]}},
                "temps": {},
                "body": ["Y(d) +=! A(w, d) where d in 0:64, w in 0:64"]}"#,
            "<test>",
        )
        .unwrap();
        let st = &program.statements[0];
        let both = ["D", "W"];
        assert_eq!(range_parameter(&program, st, "d", 64, &both), Some("D"));
        assert_eq!(range_parameter(&program, st, "w", 64, &both), Some("W"));
        // An index that subscripts no dimension of those sizes stays a
        // constant, and so does a small shared value; a value of one size
        // alone reads as that size.
        assert_eq!(range_parameter(&program, st, "k", 64, &both), None);
        assert_eq!(range_parameter(&program, st, "d", 2, &both), None);
        assert_eq!(range_parameter(&program, st, "k", 64, &["W"]), Some("W"));
    }

    #[test]
    fn the_cpu_stages_schedule_then_tile_the_program() {
        let (isl, program) = (Isl::new(), gemm());
        let a = gemm_analysis(&isl, &program, &Options::default());
        let s = Scheduled::new(&isl, &program, &a).unwrap();
        assert_eq!((s.strategy, s.made_by), (Strategy::Isl, "isl's scheduler"));
        assert!(s.premapped.is_none() && !s.blocks);
        let untiled = s.untiled_tree.clone();
        let cpu = CpuKernel::new(&isl, &program, &a, s.schedule, &untiled).unwrap();
        assert!(cpu.tree.to_string().contains("mark: tile"), "{}", cpu.tree);
        assert!(!untiled.to_string().contains("mark: tile"));
        assert!(cpu.kernel_c.contains("pf_kernel") && cpu.reference_c.is_some());
    }

    #[test]
    fn without_a_cpu_kernel_the_tree_stays_untiled() {
        let (isl, program) = (Isl::new(), gemm());
        let options = Options {
            cpu_kernel: false,
            ..Options::default()
        };
        let a = gemm_analysis(&isl, &program, &options);
        let s = Scheduled::new(&isl, &program, &a).unwrap();
        let untiled = s.untiled_tree.clone();
        let cpu = CpuKernel::new(&isl, &program, &a, s.schedule, &untiled).unwrap();
        assert_eq!(cpu.tree, untiled);
        assert!(cpu.kernel_c.is_empty() && cpu.schedule.is_none());
        assert!(cpu.dump().starts_with("no CPU kernel"));
    }

    #[test]
    fn a_grouping_by_cost_equal_to_the_default_keeps_the_default_unmapped_again() {
        // fcrelu: isl's schedule already runs the product's bias and ReLU
        // in its band, as the contraction-epilogue candidate would; that
        // candidate is the default's own schedule, so the default stays
        // (with no mark of the probe) without the candidate being mapped.
        let isl = Isl::new();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fcrelu.json");
        let program = crate::frontend::load_file(&path).unwrap();
        let options = Options {
            gpu: Some(GpuOptions::default()),
            ..Options::default()
        };
        let a = gemm_analysis(&isl, &program, &options);
        let mut s = Scheduled::new(&isl, &program, &a).unwrap();
        let (scop, deps) = (a.scop(), &a.deps);
        let min = schedule::compute(&isl, scop, deps, Strategy::Min).unwrap();
        let fused = schedule::epilogue::contraction_epilogues(&isl, &program, scop, deps, &min)
            .unwrap()
            .expect("an epilogue candidate");
        assert!(fused.plain_is_equal(&s.schedule).unwrap());
        let mapped = Mapped::new(&isl, &program, &a, &mut s, &GpuOptions::default()).unwrap();
        assert!(mapped.mapping.source.plain_is_equal(&s.schedule).unwrap());
        let tree = ScheduleTree::from_isl(&mapped.mapping.schedule.get_root().unwrap()).unwrap();
        assert!(!tree.to_string().contains("_by_cost"), "{tree}");
    }

    #[test]
    fn the_gpu_stages_map_then_print_one_launch_record_a_kernel() {
        let (isl, program) = (Isl::new(), gemm());
        let options = Options {
            gpu: Some(GpuOptions::default()),
            ..Options::default()
        };
        let a = gemm_analysis(&isl, &program, &options);
        let mut s = Scheduled::new(&isl, &program, &a).unwrap();
        let mapped = Mapped::new(&isl, &program, &a, &mut s, &GpuOptions::default()).unwrap();
        let plans = mapped.mapping.plans.len();
        assert!(plans >= 1);
        let k = Kernels::print(&program, &a, mapped).unwrap();
        assert_eq!(k.cuda.kernels.len(), plans);
        assert_eq!(
            k.dump().lines().filter(|l| l.contains(": grid [")).count(),
            plans
        );
    }
}
