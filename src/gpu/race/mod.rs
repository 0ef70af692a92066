//! The proof, per kernel, that a mapping is free of data races, in isl, on
//! the mapped schedule tree before any code is printed.
//!
//! The conflicts of a kernel `K` with instances `D_K` are the pairs of
//! distinct instances that touch one element, at least one of them a
//! write (memory-based, one statement with itself included, an update
//! with its own initialisation too):
//!
//! `C = (W ∘ W⁻¹ ∪ W ∘ R⁻¹ ∪ R ∘ W⁻¹) ∩ (D_K × D_K) ∩ (P ∘ P⁻¹) \ id`
//!
//! with `W` and `R` the write and read relations and `P` the schedule
//! above the kernel's mark: a kernel below a host loop is launched once per
//! iteration, and two launches never overlap. A conflict is harmless
//! when the two instances run on one thread (that thread runs them in
//! schedule order), or when a barrier that both threads pass lies
//! between them. Walking the tree from the kernel's mark, a pair is
//! decided at the node that separates it:
//! * a block-mapped member: the two run on different blocks, which never
//!   synchronise: a race;
//! * a thread-mapped member: different threads with nothing between them:
//!   a race (but for the pairs of one reduction that a `reduce_x` loop
//!   combines across lanes);
//! * a sequence, or a member of a sequential band, outside every thread
//!   loop: the printer ends each child and each iteration with
//!   `__syncthreads()` (a band under a `nosync` mark: without it), so
//!   the pair is ordered by a barrier, or else must be on one thread;
//! * a node inside the thread loops: no barrier, so one thread or a race;
//! * never separated: one thread.
//!
//! "One thread" is decided by each instance's thread identity: for each
//! axis, the value of the member mapped to it (`thread_A_D` marks), or
//! none where the instance is outside such a loop (the printer then runs it
//! on index 0 alone; a value and none count as different). The printer
//! distributes a thread loop so that the index that runs value `v` of an
//! axis of `B` threads is `v mod B` in every loop of the kernel
//! (`codegen::cuda`, `distributed_head`), so equal values mean one thread;
//! a register region with grouped slots distributes its own way, so its
//! values are only compared with each other.
//! Unequal values may still share a thread; counting them as different
//! only makes the proof stricter. A loop isl leaves out (one iteration)
//! runs on index 0, not `v mod B`: an instance that could be alone in its
//! loop, at a value other than 0, counts as on a thread of its own
//! ([`loopless_nonzero`]). Blocks of one thread (`block` 1 x 1 x 1) run
//! every instance of a block on it.
//!
//! A thread's private copy of a tensor that is not loaded from memory must
//! be written before it is read, in each run of its region
//! ([`prove_private_reads`]).
//!
//! A refusal is an [`Error::Race`]; the pipeline then maps again with the
//! barriers back in ([`with_barriers`]), with minimal fusion, or with
//! blocks of one thread, before it gives up.
//!
//! Rows whose loops the lanes of a warp share (`reduce_x` and `lanes_K`
//! marks; the rows on y and z) are proven with the lanes abstracted: a
//! row's lanes count as one thread, whose loops `mapping::check_parallel`
//! has shown to carry no dependence but the reduction chains that the
//! lanes' combination reassembles.
//!
//! A column kernel (lanes on y, `lanes::LaneAxis::Y`) is proven to bring
//! every thread to every barrier, and its lanes' shared part arrays to be
//! free of races ([`columns`]).
//!
//! The memories the statements do not name are proven too: the shared
//! copies of promoted tensors ([`shared`]: no copy overwrites a tile
//! another step still reads), a register tile ([`registers`]: one element,
//! one thread of one block), and kernels printed whole from a template
//! (tensor-core contractions, attention on tensor cores; [`template`]):
//! their own synchronisation inside a block is the template's, and what
//! is proven is that no two of their blocks conflict.

use crate::isl::{ScheduleNode, ScheduleNodeType, UnionMap, UnionSet};

mod columns;
mod registers;
mod shared;
mod template;

use super::mapping::{parse_mapping_mark, project_members, KernelPlan};
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::isl::IslPrint;
use crate::model::Scop;

/// Where in the walk a node sits.
#[derive(Clone, Copy)]
pub(super) struct Place {
    /// Below a thread-mapped member.
    in_thread: bool,
    /// The next band runs without a barrier after each iteration.
    nosync: bool,
    /// The mapping the next band's (single) member has, from its mark.
    mapped: Option<Mapped>,
}

impl Place {
    /// Right below a kernel's mark.
    const START: Place = Place {
        in_thread: false,
        nosync: false,
        mapped: None,
    };
}

#[derive(Clone, Copy, PartialEq)]
enum Mapped {
    Block,
    Thread,
    /// The reduction loop whose lanes a warp combines (`reduce_x_D`).
    Reduce,
}

/// What the walk of one kernel needs.
pub(super) struct Kernel<'a> {
    /// Pairs of instances on one thread.
    same_thread: UnionMap,
    /// Pairs of instances with equal thread identities that isl prints
    /// alike at every thread band (see `decide`).
    same_identity: UnionMap,
    /// The kernel runs below a skewed host loop (a wavefront or chains,
    /// `schedule::host`), whose corners leave thread loops of one
    /// iteration: there `same_identity` counts as one thread. (Only there:
    /// elsewhere the stricter rule stands, under which the fuzzer's
    /// programs were found. With the refinement everywhere,
    /// `tests/programs/skewed_block_single_thread.json` got a mapping that
    /// the stricter rule refused and that computes wrong values: a register
    /// tile on a schedule isl skewed across a block's loop, the printer's
    /// fault the README describes, which the refusal happened to avoid.)
    skewed: bool,
    /// Pairs of steps of one reduction, which a `reduce_x` loop combines.
    reorderable: &'a UnionMap,
    /// Whether any loop of the kernel is thread-mapped (without, the
    /// printer prints no barrier at all, and one thread runs everything).
    has_threads: bool,
    mark: &'a str,
    file: &'a str,
    /// The memory the conflicts are on.
    memory: Memory<'a>,
    /// Join each member with itself on the statement pairs of the pending
    /// pairs alone ([`super::mapping::same_value_on`]) rather than on every
    /// two statements: the same pairs kept and separated, so the same
    /// answer, but isl may write them with other pieces, and a refusal's
    /// example pair is a sample of them. [`walk_kernel`] walks fast and,
    /// where that refuses, again the other way, for the example the
    /// refusal has always given.
    fast: bool,
}

/// The memory a walk's conflicts are on.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Memory<'a> {
    /// Global memory: every block sees every element.
    Global,
    /// A block's shared copy of a tensor (`shared::prove_copies`): each
    /// block has its own, so pairs on different blocks never conflict;
    /// the copy is made by all threads of the block together, so no pair
    /// is on one thread.
    SharedCopy(&'a str),
}

/// Proves every kernel of `schedule` (mapped, with the kernel plans
/// `plans`) free of races, or says which pair of instances races. A
/// kernel mark without a plan is proven as a generic kernel.
pub fn prove(
    program: &Program,
    scop: &Scop,
    schedule: &crate::isl::Schedule,
    plans: &[KernelPlan],
) -> Result<()> {
    let reorderable = scop.reorderable_pairs()?;
    let mut kernels = Vec::new();
    find_kernels(schedule.get_root()?, &mut kernels)?;
    for node in kernels {
        let mark = node.mark_get_id()?.get_name()?.to_string();
        let plan = plans.iter().find(|p| p.mark == mark);
        if let Some(p) = plan.filter(|p| p.contraction().is_some() || p.attention().is_some()) {
            template::prove_blocks(program, scop, &node, p)?;
            continue;
        }
        // Register tiles in groups give a thread its values in groups
        // (`registers::RegisterTile::group`), not one value in `count`.
        let grouped = plan
            .and_then(|p| p.register_tile())
            .is_some_and(|r| r.vector > 1);
        // Blocks of one thread: every instance of a block runs on it.
        let single_thread = plan.is_some_and(|p| p.block == [1, 1, 1]);
        let threads = Threads {
            grouped,
            single_thread,
        };
        if let Some(t) = plan.and_then(KernelPlan::threads) {
            for region in &t.private {
                prove_private_reads(program, scop, &node, region)?;
            }
        }
        // The kernel's thread identities, made once for the proofs below
        // that ask for them (the walk's and the register tile's).
        let identities = Identities::default();
        // The register tile first: once every access of its tensor is
        // proven to stay in one register of one thread (`prove_tile`), the
        // tensor's global element is touched only by that thread, at the
        // region's load and store, and its accesses leave the global
        // proof. (Counted there, an instance isl prints without its
        // thread loop, such as the corner of a triangle, counts as on a
        // thread of its own, and the proof would put a barrier in every
        // step of the reduction.)
        let thread_plan = plan.and_then(KernelPlan::threads);
        let tile = thread_plan.and_then(|t| t.registers.as_ref().map(|r| r.tile()));
        if let Some(tile) = tile {
            registers::prove_tile(program, scop, &node, &mark, tile, threads, &identities)?;
        }
        let in_registers = tile.map(|t| t.tensor.as_str());
        prove_kernel(
            program,
            scop,
            node.copy()?,
            &mark,
            &reorderable,
            threads,
            in_registers,
            &identities,
        )?;
        if let Some(super::lanes::LaneAxis::Y(c)) = thread_plan.map(|t| t.lane_axis) {
            columns::prove(program, &node, &mark, c)?;
        }
        if let Some(scope) = thread_plan.and_then(|t| t.scope.as_ref()) {
            shared::prove_copies(program, scop, &node, &mark, scope, threads)?;
        }
    }
    Ok(())
}

/// How the threads of a kernel run its instances, beyond its tree.
#[derive(Clone, Copy)]
pub(super) struct Threads {
    /// Register tiles in groups (see [`thread_identity`]).
    grouped: bool,
    /// Blocks of one thread.
    single_thread: bool,
}

/// The `kernel_K` marks of the tree.
fn find_kernels(node: ScheduleNode, out: &mut Vec<ScheduleNode>) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Mark
        && node.mark_get_id()?.get_name()?.starts_with("kernel_")
    {
        out.push(node);
        return Ok(());
    }
    for i in 0..node.n_children()? {
        find_kernels(node.get_child(i)?, out)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn prove_kernel(
    program: &Program,
    scop: &Scop,
    kernel: ScheduleNode,
    mark: &str,
    reorderable: &UnionMap,
    threads: Threads,
    in_registers: Option<&str>,
    identities: &Identities,
) -> Result<()> {
    let conflicts = conflicts(scop, &kernel, in_registers)?;
    if conflicts.is_empty()? {
        return Ok(());
    }
    let skewed = below_skewed_host_loop(&kernel)?;
    let pairs = same_thread(&kernel, threads, false, skewed, identities)?;
    let same_identity = match pairs.same_identity {
        Some(m) => m,
        None => UnionMap::empty(conflicts.get_space()?)?,
    };
    let k = Kernel {
        same_thread: pairs.same_thread,
        same_identity,
        skewed,
        reorderable,
        has_threads: pairs.has_threads,
        mark,
        file: &program.source,
        memory: Memory::Global,
        fast: true,
    };
    walk_kernel(k, &kernel, conflicts)
}

/// [`walk`]s the tree below `kernel` with the pairs `pending` the fast way
/// (`Kernel::fast`); where that refuses, walks it again the other way,
/// whose refusal (the same, by the same sets) gives the example pair it
/// always gave. Should the second walk accept what the first refused, the
/// first refusal stands.
pub(super) fn walk_kernel(k: Kernel, kernel: &ScheduleNode, pending: UnionMap) -> Result<()> {
    match walk(&k, kernel.get_child(0)?, pending.copy()?, Place::START) {
        Ok(()) => Ok(()),
        Err(refused) if k.fast => {
            let k = Kernel { fast: false, ..k };
            walk(&k, kernel.get_child(0)?, pending, Place::START).and(Err(refused))
        }
        Err(refused) => Err(refused),
    }
}

/// The conflicts among the instances of `kernel`: the pairs of distinct
/// instances that touch one element, one of them writing (`C` above), at
/// one value of the schedule above the kernel's mark (`P`): below a host
/// loop (`schedule::host`) each iteration is a launch of its own, after
/// the previous one finished. The accesses of tensor `in_registers` are
/// left out: a proven register tile keeps each of its elements on one
/// thread (`registers::prove_tile`).
pub(super) fn conflicts(
    scop: &Scop,
    kernel: &ScheduleNode,
    in_registers: Option<&str>,
) -> Result<UnionMap> {
    let domain = kernel.get_domain()?;
    let (mut writes, mut reads) = (scop.writes()?, scop.reads()?);
    if let Some(tensor) = in_registers {
        let (tile_reads, tile_writes) = accesses_of(scop, tensor, &domain)?;
        writes = writes.subtract(tile_writes)?;
        reads = reads.subtract(tile_reads)?;
    }
    let writes = writes.intersect_domain(domain.copy()?)?;
    let reads = reads.intersect_domain(domain.copy()?)?;
    let touch = |a: &UnionMap, b: &UnionMap| -> Result<UnionMap> {
        Ok(a.copy()?.apply_range(b.copy()?.reverse()?)?)
    };
    Ok(touch(&writes, &writes)?
        .union(touch(&writes, &reads)?)?
        .union(touch(&reads, &writes)?)?
        .subtract(domain.identity()?)?
        .intersect(one_launch(kernel)?)?)
}

/// The pairs of instances of `kernel` at one value of the schedule above
/// its mark: in one launch of it.
pub(super) fn one_launch(kernel: &ScheduleNode) -> Result<UnionMap> {
    let prefix = kernel.get_prefix_schedule_union_map()?;
    Ok(prefix.copy()?.apply_range(prefix.reverse()?)?)
}

/// Which instances of a kernel run on one thread.
pub(super) struct ThreadPairs {
    /// Pairs of instances on one thread.
    pub same_thread: UnionMap,
    /// Pairs with equal thread identities that isl prints alike at every
    /// thread band (see `decide`), where asked for.
    pub same_identity: Option<UnionMap>,
    /// Whether the kernel has thread loops at all.
    pub has_threads: bool,
}

/// The pairs of instances of `kernel` that run on one thread, and whether
/// the kernel has thread loops at all. An instance that isl may print
/// without its thread loop counts as on a thread of its own
/// ([`loopless_nonzero`]), unless `by_owner`: inside a register region
/// the printer runs such an instance on the thread that owns its element
/// (`RegisterTile::owned_axes`), which its thread values name. The pairs
/// of equal identity only `with_identity`: the walk uses them below a
/// skewed host loop alone, and elsewhere building them is wasted time.
pub(super) fn same_thread(
    kernel: &ScheduleNode,
    threads: Threads,
    by_owner: bool,
    with_identity: bool,
    identities: &Identities,
) -> Result<ThreadPairs> {
    let domain = kernel.get_domain()?;
    let ThreadIdentity {
        identity,
        same,
        has_threads,
        unknown,
        bands,
    } = identities.of(kernel, &domain, threads.grouped)?;
    let has_threads = *has_threads;
    let all = domain.copy()?.universe()?;
    // Pairs with one identity that, at every thread band, are both among
    // the instances isl may print without a loop or both not: see `decide`.
    let same_identity = match with_identity {
        true => Some(same_identity(identity, &domain, bands)?),
        false => None,
    };
    let same_thread = if threads.single_thread {
        UnionMap::from_domain_and_range(all.copy()?, all)?
    } else if by_owner {
        same.copy()?
    } else {
        let either_unknown = UnionMap::from_domain_and_range(unknown.copy()?, all.copy()?)?
            .union(UnionMap::from_domain_and_range(all, unknown.copy()?)?)?;
        same.copy()?.subtract(either_unknown)?
    };
    Ok(ThreadPairs {
        same_thread,
        same_identity,
        has_threads,
    })
}

/// The pairs of instances of `domain` with one thread `identity` that, at
/// every thread band (`bands`: its instances isl may print without a
/// loop), are both among those instances or both not.
fn same_identity(identity: &UnionMap, domain: &UnionSet, bands: &[UnionSet]) -> Result<UnionMap> {
    let mut same = identity.copy()?.apply_range(identity.copy()?.reverse()?)?;
    for u in bands {
        let rest = domain.copy()?.subtract(u.copy()?)?;
        let agree = UnionMap::from_domain_and_range(u.copy()?, u.copy()?)?
            .union(UnionMap::from_domain_and_range(rest.copy()?, rest)?)?;
        same = same.intersect(agree)?;
    }
    Ok(same)
}

/// The pairs of instances of `kernel` that run on one block: equal values
/// of every block-mapped member (an instance outside the loops of an axis
/// counts as at value 0 there, as the printer runs it).
pub(super) fn same_block(kernel: &ScheduleNode) -> Result<UnionMap> {
    let domain = kernel.get_domain()?;
    let mut per_axis: Vec<Option<UnionMap>> = vec![None, None, None];
    collect_block_values(kernel.copy()?, &mut per_axis)?;
    let identity = axes_identity(&domain, per_axis)?;
    Ok(identity.copy()?.apply_range(identity.reverse()?)?)
}

/// Adds, for every `block_A_D` mark below `node`, the value of the member
/// below it for each instance it runs to `per_axis[A]`.
fn collect_block_values(node: ScheduleNode, per_axis: &mut [Option<UnionMap>]) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Mark {
        let name = node.mark_get_id()?.get_name()?.to_string();
        if let Some((false, axis, _)) = parse_mapping_mark(&name) {
            add_member_values(&node.get_child(0)?, 1, axis, per_axis)?;
        }
    }
    for i in 0..node.n_children()? {
        collect_block_values(node.get_child(i)?, per_axis)?;
    }
    Ok(())
}

/// Each instance of the kernel's `domain` mapped to its thread identity
/// `[f_x, v_x, f_y, v_y, f_z, v_z]`, and whether the kernel has thread
/// loops at all. Along each axis, `v` is the value of the member mapped to
/// it and `f` says how the printer distributes that loop: 1 for one value
/// in `count` per thread (`codegen::cuda`'s `distributed_head`), 2 inside
/// a register region whose slots come in groups (`grouped`), `0, 0` where
/// no loop of the axis runs the instance (index 0 runs it). Equal
/// identities run on one thread.
fn thread_identity(
    kernel: &ScheduleNode,
    domain: &UnionSet,
    grouped: bool,
) -> Result<ThreadIdentity> {
    let mut per_axis: Vec<Option<UnionMap>> = vec![None, None, None];
    let mut bands = Vec::new();
    let form = Distribution { grouped };
    collect_thread_values(kernel.copy()?, &mut per_axis, &mut bands, form, false)?;
    let mut unknown = UnionSet::empty(domain.get_space()?)?;
    for u in &bands {
        unknown = unknown.union(u.copy()?)?;
    }
    let has_threads = per_axis.iter().any(Option::is_some);
    let identity = axes_identity(domain, per_axis)?;
    let same = identity.copy()?.apply_range(identity.copy()?.reverse()?)?;
    Ok(ThreadIdentity {
        identity,
        same,
        has_threads,
        unknown,
        bands,
    })
}

/// A kernel's [`thread_identity`]: each instance's identity, the pairs of
/// one identity, whether the kernel has thread loops, the instances that
/// may run without their thread loop (all, and per thread band).
pub(super) struct ThreadIdentity {
    identity: UnionMap,
    /// Pairs of one identity.
    same: UnionMap,
    has_threads: bool,
    unknown: UnionSet,
    bands: Vec<UnionSet>,
}

/// One kernel's [`ThreadIdentity`], made when first asked for and kept for
/// the kernel's other proofs: it depends on the kernel's tree and on
/// whether its register tile comes in groups alone, which are the same for
/// every proof of one kernel (`prove` makes one per kernel), so each gets
/// the relations it would have made itself (what was two walks of the tree
/// and two [`loopless_nonzero`] per thread band for gemm).
#[derive(Default)]
pub(super) struct Identities {
    made: std::cell::OnceCell<(bool, ThreadIdentity)>,
}

impl Identities {
    fn of(
        &self,
        kernel: &ScheduleNode,
        domain: &UnionSet,
        grouped: bool,
    ) -> Result<&ThreadIdentity> {
        if self.made.get().is_none() {
            let made = thread_identity(kernel, domain, grouped)?;
            let _ = self.made.set((grouped, made));
        }
        match self.made.get() {
            Some((g, made)) if *g == grouped => Ok(made),
            _ => Err(Error::Internal(
                "one kernel's thread identities asked for with and without groups".into(),
            )),
        }
    }
}

/// Each instance of `domain` mapped to its values `[f_x, v_x, f_y, v_y,
/// f_z, v_z]` along the three axes (`[0, 0]` on an axis with no value).
fn axes_identity(domain: &UnionSet, per_axis: Vec<Option<UnionMap>>) -> Result<UnionMap> {
    let none = UnionSet::read_from_str(&domain.get_ctx(), "{ [0, 0] }")?;
    let mut identity: Option<UnionMap> = None;
    for values in per_axis {
        let axis = match values {
            Some(v) => {
                let mapped = v.copy()?.domain()?;
                v.union(UnionMap::from_domain_and_range(
                    domain.copy()?.subtract(mapped)?,
                    none.copy()?,
                )?)?
            }
            None => UnionMap::from_domain_and_range(domain.copy()?, none.copy()?)?,
        };
        identity = Some(match identity {
            None => axis,
            Some(i) => i.range_product(axis)?,
        });
    }
    identity.ok_or_else(|| Error::Internal("no thread axes".into()))
}

/// Adds, for every `thread_A_D` mark below `node`, the tagged value `[f,
/// v]` (see [`thread_identity`]) of the member below it for each instance
/// it runs to `per_axis[A]`.
///
/// A statement whose member value is fixed by the loops above it may get no
/// loop of its own from isl's AST generator, and the printer runs a
/// mapped member without a loop on index 0 (`codegen::cuda`'s `guard`),
/// not on `v mod B`. Its instances whose value is not 0 (where the two
/// readings differ) are added to `unknown`: they count as on one thread
/// with no other instance.
fn collect_thread_values(
    node: ScheduleNode,
    per_axis: &mut [Option<UnionMap>],
    unknown: &mut Vec<UnionSet>,
    form: Distribution,
    in_registers: bool,
) -> Result<()> {
    let mut in_registers = in_registers;
    if node.get_type()? == ScheduleNodeType::Mark {
        let name = node.mark_get_id()?.get_name()?.to_string();
        in_registers |= name == "registers";
        if let Some((true, axis, _)) = parse_mapping_mark(&name) {
            let band = node.get_child(0)?;
            let tag = if form.grouped && in_registers { 2 } else { 1 };
            add_member_values(&band, tag, axis, per_axis)?;
            unknown.push(loopless_nonzero(&band)?);
        }
    }
    for i in 0..node.n_children()? {
        collect_thread_values(node.get_child(i)?, per_axis, unknown, form, in_registers)?;
    }
    Ok(())
}

/// Adds the tagged value `[tag, v]` of the single member of `band` (mapped
/// to `axis`) for each instance it runs to `per_axis[axis]`.
fn add_member_values(
    band: &ScheduleNode,
    tag: u8,
    axis: char,
    per_axis: &mut [Option<UnionMap>],
) -> Result<()> {
    let tag = UnionMap::read_from_str(&band.get_ctx(), &format!("{{ [v] -> [{tag}, v] }}"))?;
    let values = band
        .band_get_partial_schedule_union_map()?
        .intersect_domain(band.get_domain()?)?
        .apply_range(tag)?;
    let a = (axis as u8).saturating_sub(b'x') as usize;
    let slot = &mut per_axis[a.min(2)];
    *slot = Some(match slot.take() {
        None => values,
        Some(v) => v.union(values)?,
    });
    Ok(())
}

/// How the printer distributes the thread loops of a kernel, as far as
/// the identity of the thread that runs an instance goes.
#[derive(Clone, Copy)]
struct Distribution {
    /// Register tiles in groups (see [`thread_identity`]).
    grouped: bool,
}

/// The instances below the single-member `band` that isl may print
/// without a loop (the printer then runs them on index 0) and whose member
/// value is not 0 (where index 0 and `v mod B` may differ): every instance
/// whose value is the only one at its value of the schedule above (and of
/// the sizes). isl's AST generator may also split a statement's domain into
/// pieces (a diagonal `i = j` apart from `i > j`) and leave a piece without
/// a loop where the statement as a whole has one; this counts every
/// instance that could be alone in its loop at its prefix, which covers
/// the pieces the fuzzer found (`race_param_dependent_single_row.json`).
fn loopless_nonzero(band: &ScheduleNode) -> Result<UnionSet> {
    let domain = band.get_domain()?;
    let (prefix, member) = super::mapping::prefix_and_member(band)?;
    let zero = UnionSet::read_from_str(&band.get_ctx(), "{ [0] }")?;
    let mut out = UnionSet::empty(domain.get_space()?)?;
    let sets = domain.get_set_list()?;
    for k in 0..sets.size()? {
        let own = UnionSet::from_set(sets.get_at(k)?)?;
        let m = member.copy()?.intersect_domain(own.copy()?)?;
        let p = prefix.copy()?.intersect_domain(own)?;
        // The member's values at each value of the prefix (parameters
        // included: with symbolic sizes a loop may have one iteration at
        // some sizes only), and the prefix values where it has two or more.
        let values = p.copy()?.reverse()?.apply_range(m.copy()?)?;
        let ctx = band.get_ctx();
        let less = UnionMap::read_from_str(&ctx, "{ [a] -> [b] : a < b }")?;
        let several = values
            .copy()?
            .apply_range(less)?
            .intersect(values)?
            .domain()?;
        // Instances at a prefix value with one member value, not 0.
        let single = p.subtract_range(several)?.domain()?;
        out = out.union(
            m.intersect_domain(single)?
                .subtract_range(zero.copy()?)?
                .domain()?,
        )?;
    }
    Ok(out)
}

/// Decides the pairs of `pending` (both instances below `node`, not yet
/// separated) that `node` and the nodes below it separate.
pub(super) fn walk(k: &Kernel, node: ScheduleNode, pending: UnionMap, place: Place) -> Result<()> {
    if pending.is_empty()? {
        return Ok(());
    }
    match node.get_type()? {
        ScheduleNodeType::Mark => {
            let name = node.mark_get_id()?.get_name()?.to_string();
            let mut inner = place;
            match parse_mapping_mark(&name) {
                Some((true, _, _)) => inner.mapped = Some(Mapped::Thread),
                Some((false, _, _)) => inner.mapped = Some(Mapped::Block),
                None if name.starts_with("reduce_x_") => inner.mapped = Some(Mapped::Reduce),
                None if name == "nosync" => inner.nosync = true,
                None => {}
            }
            walk(k, node.get_child(0)?, pending, inner)
        }
        ScheduleNodeType::Band => {
            let n = node.band_n_member()? as usize;
            let partial = node
                .band_get_partial_schedule_union_map()?
                .intersect_domain(node.get_domain()?)?;
            let mut pending = pending;
            let matters = separation_matters(k, place, Separator::Member);
            for m in 0..n {
                let member = project_members(&partial, m, m + 1, n)?;
                // `m⁻¹ ∘ m` on the statement pairs of `pending` alone
                // (`mapping::same_value_on`; see `Kernel::fast`).
                let same = match k.fast {
                    true => super::mapping::same_value_on(&pending, &member)?,
                    false => member.copy()?.apply_range(member.reverse()?)?,
                };
                if matters {
                    let separated = pending.copy()?.subtract(same.copy()?)?;
                    decide(k, &node, separated, place, Separator::Member)?;
                }
                pending = pending.intersect(same)?;
            }
            let inner = Place {
                in_thread: place.in_thread || place.mapped == Some(Mapped::Thread),
                nosync: false,
                mapped: None,
            };
            walk(k, node.get_child(0)?, pending, inner)
        }
        ScheduleNodeType::Sequence | ScheduleNodeType::Set => {
            let mut together = UnionMap::empty(pending.get_space()?)?;
            let mut parts = Vec::new();
            for i in 0..node.n_children()? {
                let child = node.get_child(i)?;
                let filter = child.filter_get_filter()?;
                let part = pending
                    .copy()?
                    .intersect_domain(filter.copy()?)?
                    .intersect_range(filter)?;
                together = together.union(part.copy()?)?;
                parts.push((child, part));
            }
            if separation_matters(k, place, Separator::Sequence) {
                let separated = pending.subtract(together)?;
                decide(k, &node, separated, place, Separator::Sequence)?;
            }
            let inner = Place {
                mapped: None,
                nosync: false,
                ..place
            };
            for (child, part) in parts {
                walk(k, child, part, inner)?;
            }
            Ok(())
        }
        _ => {
            if node.n_children()? == 0 {
                // Never separated: both run on the thread the marks
                // above give them, one after the other.
                return Ok(());
            }
            walk(k, node.get_child(0)?, pending, place)
        }
    }
}

/// Whether a wavefront's or chains' host loop (`schedule::host`) is above
/// `node`.
fn below_skewed_host_loop(node: &ScheduleNode) -> Result<bool> {
    use crate::schedule::host::HostStep;
    let mut n = node.copy()?;
    while n.has_parent()? {
        n = n.parent()?;
        if n.get_type()? == ScheduleNodeType::Mark {
            let step = HostStep::from_mark(n.mark_get_id()?.get_name()?);
            if matches!(step, Some(HostStep::Wavefront(_) | HostStep::Chains(_))) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether a thread-mapped member's mark is at or below `node`.
pub(super) fn thread_marks_below(node: &ScheduleNode) -> Result<bool> {
    if node.get_type()? == ScheduleNodeType::Mark
        && matches!(
            parse_mapping_mark(node.mark_get_id()?.get_name()?),
            Some((true, _, _))
        )
    {
        return Ok(true);
    }
    for i in 0..node.n_children()? {
        if thread_marks_below(&node.get_child(i)?)? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[derive(Clone, Copy, PartialEq)]
enum Separator {
    Member,
    Sequence,
}

/// Whether [`decide`] can refuse any pair that a node at `place`
/// separates. Where it cannot (a barrier orders every such pair, or
/// blocks with copies of their own), the walk does not compute the pairs:
/// the difference of two relations is most of the walk's time (gemm: 72
/// of its 120 profile samples).
fn separation_matters(k: &Kernel, place: Place, by: Separator) -> bool {
    match (by, place.mapped) {
        // Different blocks never synchronise; each has its own shared
        // copies.
        (Separator::Member, Some(Mapped::Block)) => k.memory == Memory::Global,
        (Separator::Member, Some(Mapped::Thread | Mapped::Reduce)) => true,
        _ => {
            let barrier =
                k.has_threads && !place.in_thread && (by == Separator::Sequence || !place.nosync);
            !barrier
        }
    }
}

/// Decides the pairs `separated` by a node at `place`: the ones on
/// different threads need a barrier there.
fn decide(
    k: &Kernel,
    node: &ScheduleNode,
    separated: UnionMap,
    place: Place,
    by: Separator,
) -> Result<()> {
    if !separation_matters(k, place, by) || separated.is_empty()? {
        return Ok(());
    }
    let mut racing = match (by, place.mapped) {
        // Different blocks never synchronise (and the thread identity
        // says nothing across blocks).
        (Separator::Member, Some(Mapped::Block)) => {
            return report(k, separated, "run on different blocks");
        }
        // Different threads, nothing between them.
        (Separator::Member, Some(Mapped::Thread)) => separated,
        (Separator::Member, Some(Mapped::Reduce)) => separated.subtract(k.reorderable.copy()?)?,
        _ => {
            // Below every thread loop, a pair not yet separated agrees on
            // every member above, thread-mapped ones included: at each
            // thread band both instances are at one value of the schedule
            // above and of the member. Where both may be printed without
            // a loop there ([`loopless_nonzero`]: their statements have
            // that one value there), both run on index 0; where neither
            // may, both run on `v mod B`: one thread when their identities
            // agree. (A wavefront's corner, one cell on its diagonal, has
            // such loops without a loop.)
            if k.skewed && place.in_thread && !thread_marks_below(node)? {
                separated.subtract(k.same_identity.copy()?)?
            } else {
                separated
            }
        }
    };
    racing = racing.subtract(k.same_thread.copy()?)?;
    let what = match (by, place.mapped) {
        (Separator::Member, Some(_)) => "run on different threads at once",
        _ if place.in_thread => "run on different threads with no barrier between them",
        _ => "run on different threads, in steps of a loop without a barrier between them",
    };
    report(k, racing, what)
}

/// Fails with one pair of `racing`, which `what`, unless it is empty.
fn report(k: &Kernel, racing: UnionMap, what: &str) -> Result<()> {
    if racing.is_empty()? {
        return Ok(());
    }
    let example = crate::isl::Map::from_basic_map(racing.sample()?)?.text();
    let message = match k.memory {
        Memory::Global => format!(
            "{}: the GPU mapping races: two instances that touch one element (one of them a write) {what}: {example}",
            k.mark
        ),
        Memory::SharedCopy(tensor) => format!(
            "{}: the GPU mapping races on the shared copy of {tensor}: the copy made for one of two instances overwrites the one the other reads, and they {what}: {example}",
            k.mark
        ),
    };
    Err(Error::Race {
        file: k.file.to_string(),
        message,
    })
}

/// `schedule` with every `nosync` mark (a step loop whose barrier the
/// mapping found unneeded) replaced by a `barrier_for_race_freedom` mark,
/// so that each step ends with a barrier again: the fallback where the
/// proof refuses a mapping. `None` when there is no such mark.
pub fn with_barriers(
    isl: &crate::isl::Isl,
    schedule: &crate::isl::Schedule,
) -> Result<Option<crate::isl::Schedule>> {
    fn find(node: ScheduleNode) -> Result<Option<ScheduleNode>> {
        if node.get_type()? == ScheduleNodeType::Mark && node.mark_get_id()?.get_name()? == "nosync"
        {
            return Ok(Some(node));
        }
        for i in 0..node.n_children()? {
            if let Some(found) = find(node.get_child(i)?)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
    let mut current = schedule.copy()?;
    let mut changed = false;
    while let Some(node) = find(current.get_root()?)? {
        let id = crate::isl::Id::read_from_str(&isl.ctx, "barrier_for_race_freedom")?;
        current = node.delete()?.insert_mark(id)?.get_schedule()?;
        changed = true;
    }
    Ok(changed.then_some(current))
}

/// A private array that is not loaded from memory (`load` false) must be
/// written before it is read: in each iteration of the loops above its
/// region (which run the region once per thread, so on one thread), every
/// element a statement of the region reads of its tensor was written by an
/// earlier instance of the region. With `R` and `W` the region's reads and
/// writes of the tensor, `P` the prefix schedule of the region's mark and
/// `S` the schedule below it, the elements read uncovered are
///
/// `dom R \ ran ((W ∘ R⁻¹) ∩ (P⁻¹ ∘ P) ∩ (S <_lex S))`,
///
/// which must be empty (issue 30, class 2: the other elements of a private
/// array read without anything writing them). An uncovered read is a
/// [`Error::Race`]: the pipeline maps the program again with less fusion.
pub fn prove_private_reads(
    program: &Program,
    scop: &Scop,
    kernel: &ScheduleNode,
    region: &super::private::PrivateRegion,
) -> Result<()> {
    let mut marks = Vec::new();
    find_marks(kernel.copy()?, &region.mark, &mut marks)?;
    for node in marks {
        let domain = node.get_domain()?;
        let prefix = node
            .get_prefix_schedule_union_map()?
            .intersect_domain(domain.copy()?)?;
        let below = node
            .get_subtree_schedule_union_map()?
            .intersect_domain(domain.copy()?)?;
        let same_iteration = prefix.copy()?.apply_range(prefix.reverse()?)?;
        let earlier = below.copy()?.lex_lt_union_map(below)?;
        for array in region.arrays.iter().filter(|a| !a.load) {
            let (reads, writes) = accesses_of(scop, &array.tensor, &domain)?;
            let covering = writes
                .apply_range(reads.copy()?.reverse()?)?
                .intersect(same_iteration.copy()?)?
                .intersect(earlier.copy()?)?;
            let uncovered = reads.domain()?.subtract(covering.range()?)?;
            if !uncovered.is_empty()? {
                let example = crate::isl::Set::from_basic_set(uncovered.sample()?)?.text();
                return Err(Error::Race {
                    file: program.source.clone(),
                    message: format!(
                        "{}: a thread's private copy of {} would be read before it is written: {example}",
                        region.mark, array.tensor
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The reads and writes of `tensor` by the instances in `domain`.
pub(super) fn accesses_of(
    scop: &Scop,
    tensor: &str,
    domain: &UnionSet,
) -> Result<(UnionMap, UnionMap)> {
    let space = scop.context.get_space()?;
    let (mut reads, mut writes) = (UnionMap::empty(space.copy()?)?, UnionMap::empty(space)?);
    for s in &scop.statements {
        if s.write.get_tuple_name(crate::isl::DimType::Out)? == tensor {
            writes = writes.union(UnionMap::from_map(s.write.copy()?)?)?;
        }
        for r in &s.reads {
            if r.get_tuple_name(crate::isl::DimType::Out)? == tensor {
                reads = reads.union(UnionMap::from_map(r.copy()?)?)?;
            }
        }
    }
    Ok((
        reads.intersect_domain(domain.copy()?)?,
        writes.intersect_domain(domain.copy()?)?,
    ))
}

/// The mark nodes named `name` below `node`.
pub(super) fn find_marks(
    node: ScheduleNode,
    name: &str,
    out: &mut Vec<ScheduleNode>,
) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Mark && node.mark_get_id()?.get_name()? == name {
        out.push(node.copy()?);
    }
    for i in 0..node.n_children()? {
        find_marks(node.get_child(i)?, name, out)?;
    }
    Ok(())
}
