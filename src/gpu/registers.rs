//! Register tiles: the elements of a tensor that one thread owns, kept in
//! registers across the sequential loops of a block.
//!
//! When every access to a tensor `T` in a kernel reads or writes the element
//! `e = E(b, t)` that is a function of the block values `b` (tile loops
//! mapped to blocks) and the thread point `t` (point loops mapped to
//! threads), and `E` is injective (no two thread points share an element),
//! then each element is touched by exactly one thread of one block. That
//! thread can load its elements into registers once, below the block loops,
//! work on the registers through the sequential tile loops (a gemm's `k`
//! tiles), and store them once at the end. With a cyclic distribution of a
//! tile of `S` points over `B` threads, a thread owns `ceil(S / B)` points
//! along each thread axis; the thread loops are printed as counted loops
//! over that many registers (unrolled, so the registers stay registers).
//! This is TC's and PPCG's private-memory promotion for the accumulator.

use std::collections::HashSet;

mod closed;
mod store;
pub use store::{store_statements, StoreStatement};

use crate::isl::{PwMultiAff, ScheduleNode, UnionMap};

use crate::error::Result;
use crate::frontend::ast::{AssignOp, DType, Program, Reducer};
use crate::isl::ast::Expr;
use crate::isl::Isl;
use crate::model::Scop;
use crate::model::StmtKind;

/// The name prefix of registers that hold an f16 or bf16 element in f32 (a
/// register tile's accumulator, a widened private copy), so that a
/// reduction rounds once, when the register is stored. A name for the
/// reader of the CUDA: the printer is told by `codegen::expr::Element`,
/// not by the name, to read and write them without conversion.
pub const WIDE_REGISTER_PREFIX: &str = "pf_reg_";

/// The most register updates (steps times a thread's register slots) an
/// unrolled step loop may print: a gemm's 16 steps on 8 x 8 registers.
/// Beyond, the unrolled body grows the compile time of NVRTC by minutes
/// for no gain.
pub const MAX_UNROLLED_UPDATES: i64 = 1024;

/// One register-tiled tensor of a kernel.
#[derive(Debug, Clone)]
pub struct RegisterTile {
    pub tensor: String,
    pub dtype: DType,
    /// The register array's C name.
    pub buffer: String,
    /// Element subscripts in `pf_b<j>` (block values, outer first) and
    /// `pf_t<j>` (thread point values, outer first).
    pub element: Vec<Expr>,
    /// Where `element` is meaningful: the points `(b, t)` of the domain of
    /// `E`, as a condition in `pf_b<j>` and `pf_t<j>` beyond what the block
    /// values and the tile box already say (`None`: no further condition).
    /// The loads and stores of the registers run over every register slot
    /// of the box; outside `dom E` the printed subscripts are `E`'s formula
    /// extended, which need not be injective there: with `B = 1` the batch
    /// member `b` is 0 in the domain, `E` drops `t_b`, and every slot along
    /// `t_b` names the same element, so the store of a slot the loops never
    /// updated overwrote the result.
    pub guard: Option<Expr>,
    /// The AST iterators of the block-mapped loops, outer first (`c<depth>`).
    pub block_iterators: Vec<String>,
    /// Number of thread-mapped members.
    pub thread_dims: usize,
    /// `(statement, model::AccessKey)` of every access to the tensor.
    pub accesses: HashSet<(String, crate::model::AccessKey)>,
    /// Tile sizes of the thread-mapped members, outer first.
    pub thread_tiles: Vec<i64>,
    /// Unique values of the block iterators at the region (see
    /// `promote::unique_prefix_values`).
    pub prefix_values: Vec<Option<Expr>>,
    /// The reduction's initialisation (`S_init` of an `op=!` statement),
    /// when it can start the region instead of running inside it: see
    /// [`hoistable_init`].
    pub init: Option<HoistedInit>,
    /// The requested group width (`GpuOptions::vector`); see [`Self::group`].
    pub vector: u32,
    /// The constant sequential point loops (the step loops) of at most
    /// this many steps are printed unrolled (`GpuOptions::unroll`; see
    /// [`Self::unrollable_steps`]); `None`: none is.
    pub unrolled_steps: Option<i64>,
    /// Statements that may run at a slot of a partial tile moved onto a
    /// valid point, into the slot's dead register (see [`clamp_safe`]): in
    /// a tile cut by the end of the tensor, the printer runs them on every
    /// slot, so a thread's slots run the same straight-line code as in a
    /// full tile; the other statements keep the test of their slot.
    pub clamp_safe: HashSet<String>,
    /// Statements of `clamp_safe` that may also run at a slot beyond a
    /// bound in other slots or the block values (a triangle's diagonal
    /// tile), moved onto the bound, into the slot's register, which no
    /// statement of the tile uses there (see [`closed`]).
    pub slot_closed: HashSet<String>,
    /// Epilogue statements run where the registers are stored, after the
    /// region's loops, instead of at the last step inside them (see
    /// [`store_statements`]); the gpu stage fills it once the kernel's
    /// promotions are known.
    pub store: Vec<StoreStatement>,
}

/// An `op=!` initialisation executed on the registers before the region's
/// loops: the registers start at the reducer's identity instead of being
/// loaded from the tensor, and the initialisation statement is not printed
/// inside the loops (where it costs a test on every reduction step).
#[derive(Debug, Clone)]
pub struct HoistedInit {
    /// The model statement (`S0_init`).
    pub statement: String,
    pub reducer: Reducer,
}

impl RegisterTile {
    /// The thread axes (`x`, `y`, `z`) along which the tile's element
    /// moves: the tile has several points there and an element subscript
    /// names the thread point `pf_t<j>`. Where isl leaves such a member
    /// without a loop, a statement on the tile runs on the thread and slot
    /// that own its element (`codegen::cuda`'s `owned_statement`); along
    /// another axis its point is fixed and index 0 runs it. The race proof
    /// does not rely on this (`gpu::race`'s `loopless_nonzero` counts such
    /// an instance as on a thread of its own): a piece of the region that
    /// the printer prints without its registers runs it on index 0.
    pub fn owned_axes(&self) -> Vec<char> {
        let nt = self.thread_dims;
        (0..nt)
            .filter(|&j| {
                self.thread_tiles.get(j).is_some_and(|t| *t > 1)
                    && self.element.iter().any(|e| e.mentions(&format!("pf_t{j}")))
            })
            .map(|j| ['x', 'y', 'z'][nt - 1 - j])
            .collect()
    }

    /// How a thread's points are spread along thread member `j` (outer
    /// first) with `block`: in groups of `w` consecutive points, `w` the
    /// requested width when it divides the thread's register count `R`
    /// there, else 1. Slot `r` of thread `t` (of `B` along the axis) holds
    /// point `p = (r / w) B w + t w + r mod w`, a bijection from
    /// `[0, B) x [0, R)` onto `[0, B R)` like the cyclic `p = t + r B`
    /// (`w = 1`), so the tile's guards and the full-tile test are the same
    /// for both; with `w = 4` a thread's four neighbouring points sit
    /// side by side in a shared row and load as one 16-byte vector.
    pub fn group(&self, block: [u32; 3], j: usize) -> i64 {
        let w = i64::from(self.vector.max(1));
        match self.counts(block).get(j) {
            Some(r) if r % w == 0 => w,
            _ => 1,
        }
    }

    /// Registers along each thread member (outer first) for `block`.
    /// The most steps of a step loop that may be unrolled with `block`'s
    /// threads: [`MAX_UNROLLED_UPDATES`] over the thread's register slots.
    pub fn unrollable_steps(&self, block: [u32; 3]) -> i64 {
        let slots: i64 = self.counts(block).iter().product();
        if slots > 0 {
            MAX_UNROLLED_UPDATES / slots
        } else {
            i64::MAX
        }
    }

    pub fn counts(&self, block: [u32; 3]) -> Vec<i64> {
        let nt = self.thread_dims;
        (0..nt)
            .map(|j| {
                let b = i64::from(block[nt - 1 - j].max(1));
                (self.thread_tiles[j] + b - 1) / b
            })
            .collect()
    }
}

/// Looks for a tensor to keep in registers in the kernel whose tiled band
/// is `tile_band` (its first `nb` members map to blocks) with point band
/// `point_band` (its first `nt` members map to threads).
#[allow(clippy::too_many_arguments)]
pub fn candidate(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    tile_band: &ScheduleNode,
    point_band: &ScheduleNode,
    nb: usize,
    nt: usize,
    tiles: &[i64],
    kernel: &str,
) -> Result<Option<RegisterTile>> {
    let domain = tile_band.get_domain()?;
    let stmts = scop.statements_in(&domain)?;
    let n = tile_band.band_n_member()? as usize;
    let blocks = super::mapping::project_members(
        &tile_band.band_get_partial_schedule_union_map()?,
        0,
        nb,
        n,
    )?;
    let threads = super::mapping::project_members(
        &point_band.band_get_partial_schedule_union_map()?,
        0,
        nt,
        n,
    )?;
    // The loops the host runs around the kernel (a recurrence's steps,
    // `schedule::host`) fix their iterators for each launch, as the
    // blocks fix theirs: a wavefront's cell is its block's and the
    // diagonal's `l = w - t`. Their names are the AST's (`c<depth>`),
    // which the kernel's code binds to the launch's argument.
    let prefix = tile_band.get_prefix_schedule_union_map()?;
    let np = tile_band.get_schedule_depth()? as usize;
    let band_maps = closed::BandMaps::new(
        tile_band,
        point_band,
        nb,
        nt,
        (np > 0).then(|| prefix.copy()).transpose()?,
        blocks.copy()?,
        threads.copy()?,
    )?;
    let mapped = if np > 0 {
        prefix.flat_range_product(blocks)?
    } else {
        blocks
    }
    .flat_range_product(threads)?
    .intersect_domain(domain.copy()?)?;
    let written: Vec<String> = stmts
        .iter()
        .map(|s| s.written_tensor())
        .collect::<Result<_>>()?;
    'tensors: for t in &written {
        let Some(tensor) = scop.tensor(t) else {
            continue;
        };
        let mut e = UnionMap::empty(mapped.get_space()?)?;
        let mut accesses = HashSet::new();
        for s in &stmts {
            for a in s.accesses(program) {
                if &a.tensor != t {
                    continue;
                }
                let rel = UnionMap::from_map(a.relation.copy()?)?;
                e = e.union(mapped.copy()?.reverse()?.apply_range(rel)?)?;
                accesses.insert((s.name.clone(), a.key()));
            }
        }
        if e.is_empty()? || !e.is_single_valued()? || !e.is_injective()? {
            continue;
        }
        let map = crate::isl::Map::from_union_map(e)?;
        let names: Vec<String> = (0..np)
            .map(|j| format!("c{j}"))
            .chain((0..nb).map(|j| format!("pf_b{j}")))
            .chain((0..nt).map(|j| format!("pf_t{j}")))
            .collect();
        let running = crate::isl::Set::from_union_set(mapped.copy()?.range()?)?;
        let guard = domain_guard(
            isl,
            scop,
            map.copy()?.domain()?,
            running,
            &names,
            np + nb,
            tiles,
        )?;
        let pma = PwMultiAff::from_map(map)?;
        let mut element = Vec::new();
        for d in 0..tensor.shape.len() {
            match super::promote::expr_in(isl, pma.get_pw_aff(d as i32)?, &names) {
                Ok(x) => element.push(x),
                Err(_) => continue 'tensors,
            }
        }
        let init = hoistable_init(isl, program, scop, &stmts, t)?;
        let clamp_safe = clamp_safe(program, &stmts, t);
        let slot_closed =
            closed::slot_closed(program, &stmts, t, &clamp_safe, &domain, &band_maps)?;
        return Ok(Some(RegisterTile {
            clamp_safe,
            slot_closed,
            init,
            tensor: t.clone(),
            dtype: tensor.dtype,
            buffer: format!("{}{kernel}_{t}", WIDE_REGISTER_PREFIX),
            element,
            guard,
            block_iterators: Vec::new(),
            thread_dims: nt,
            accesses,
            thread_tiles: Vec::new(),
            prefix_values: Vec::new(),
            vector: 1,
            unrolled_steps: None,
            store: Vec::new(),
        }));
    }
    Ok(None)
}

/// The statements of a register tile's band that may also run at points
/// they do not own. In a tile cut by the end of the tensor, a thread's
/// slot whose element lies beyond the tensor runs them at the last valid
/// point along that axis, into its own register, which is dead: no
/// statement owns its element and the store of the tile tests each slot's
/// element (`codegen::cuda`'s clamp). The thread's slots then run the same
/// straight-line code as in a full tile. Such a run changes only the dead
/// register, and is harmless exactly when the statement
/// - writes nothing but the tile's element (anything else would be a
///   write the program does not make), and
/// - reads nothing another statement of the band writes, except the tile
///   itself through the registers (every access to the tile goes to the
///   slot: `RegisterTile::accesses`): what it reads at the valid point is
///   in memory for the whole kernel, so the extra read is ordered with no
///   writer and the race proof's argument is unchanged.
///
/// The reads are of a point of the statement's domain (the printer keeps
/// the point in the loop's bounds and in isl's guards), so they stay
/// inside the tensors and the shared tiles.
fn clamp_safe(
    program: &Program,
    stmts: &[&crate::model::ModelStmt],
    tensor: &str,
) -> HashSet<String> {
    let written: HashSet<&str> = stmts
        .iter()
        .map(|s| program.statements[s.source].lhs_tensor.as_str())
        .collect();
    stmts
        .iter()
        .filter(|s| {
            s.accesses(program).iter().all(|a| {
                if a.write {
                    a.tensor == tensor
                } else {
                    a.tensor == tensor || !written.contains(a.tensor.as_str())
                }
            })
        })
        .map(|s| s.name.clone())
        .collect()
}

/// The condition, in `names` (`pf_b<j>` for the first `nb` dimensions of
/// `domain`, `pf_t<j>` for the rest), for `(b, t) ∈ domain`, simplified
/// under what the printed loops already know: the block values `b` range
/// over the block values of every instance of the band (`running`, the
/// points `(b, t)` of all its statements, the tensor's or not: the printed
/// block loops run over all of them, and the region with them), each `t_j`
/// lies in its tile `0 <= t_j < tiles[j]` and the parameters satisfy the
/// context. `None` when that leaves nothing to test.
///
/// `gist(domain, π_b(running) × box(tiles) ∩ context)` keeps the constraints
/// that tie `t` to `b` or fix `t` (`t_0 = 0` where a member has one value),
/// and bounds of `b + t` by the tensor's extents, which the printed copy
/// tests again; only the first kind changes which slots are copied. Where
/// other statements of the band run in blocks that touch no element of the
/// tensor, it also keeps the test of the tensor's blocks: the fuzzer found
/// a fused kernel whose statements on `Y1` ran in one block along `z` of
/// five, while the gist against the tensor's own blocks dropped `b_0 = 4`,
/// so every block started its registers at the identity and stored them
/// (a race between blocks, and zeros over the result).
fn domain_guard(
    isl: &Isl,
    scop: &Scop,
    domain: crate::isl::Set,
    running: crate::isl::Set,
    names: &[String],
    nb: usize,
    tiles: &[i64],
) -> Result<Option<Expr>> {
    let nt = names.len() - nb;
    let domain = domain.intersect_params(scop.context.copy()?)?;
    let mut known = running
        .intersect_params(scop.context.copy()?)?
        .project_out(crate::isl::DimType::Set, nb as u32, nt as u32)?
        .insert_dims(crate::isl::DimType::Set, nb as u32, nt as u32)?
        .intersect_params(scop.context.copy()?)?;
    for (j, &size) in tiles.iter().enumerate().take(nt) {
        let pos = (nb + j) as u32;
        known = known
            .lower_bound_si(crate::isl::DimType::Set, pos, 0)?
            .upper_bound_si(crate::isl::DimType::Set, pos, (size - 1) as i32)?;
    }
    let rest = domain.gist(known)?;
    if rest.plain_is_universe()? {
        return Ok(None);
    }
    let ids = super::promote::ids(isl, rest.get_space()?, names)?;
    let bound = rest.bind(ids)?.from_params()?;
    let context = crate::isl::Set::universe(bound.get_space()?.params()?)?.from_params()?;
    let e = crate::isl::ast_build_expr_from_set(context, bound).ok_or_else(|| {
        crate::error::Error::Internal("isl could not print a register guard".into())
    })?;
    Ok(Some(crate::isl::ast::expr_from_isl(&e)?))
}

/// The initialisation of tensor `t` that may run first in its register
/// region, replacing the load of the registers.
///
/// The statements of the kernel that touch `t` must be one `S_init`
/// (identity of reducer `f`), the update steps of the same source
/// statement and later statements (epilogues, further updates without an
/// initialisation of their own), so every value of an element goes `identity, f-steps...`:
/// the first access of each element is its initialisation (a flow
/// dependence orders every step after it), and starting the register at the
/// identity before the loops computes the same values. The registers of a
/// tile are stored back for every element inside the tensor, so the
/// initialisation must write every element of the tensor:
/// `{ t[e] : 0 <= e < shape } ⊆ range(W_init ∩ D_init)`; otherwise an
/// element the program never writes would be overwritten with the identity.
fn hoistable_init(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    stmts: &[&crate::model::ModelStmt],
    t: &str,
) -> Result<Option<HoistedInit>> {
    let touching: Vec<&&crate::model::ModelStmt> = stmts
        .iter()
        .filter(|s| s.accesses(program).iter().any(|a| a.tensor == t))
        .collect();
    let inits: Vec<_> = touching
        .iter()
        .filter(|s| s.kind == StmtKind::Init)
        .collect();
    let [init] = inits.as_slice() else {
        return Ok(None);
    };
    let init: &crate::model::ModelStmt = init;
    // Inside loop blocks an element may be initialised again after its
    // updates (`Y(i) +=! ..` in a block starts over in each iteration),
    // and statements order by the blocks, not by their position: the
    // initialisation stays in the loops.
    if touching.iter().any(|s| !s.blocks.is_empty()) {
        return Ok(None);
    }
    // Updates of the same statement; later statements (an epilogue such as
    // `C = max(C + bias, 0)`, or a further sum without an initialisation
    // of its own, `G += H U` after `G +=! X W`) run after the
    // initialisation of their element, which the dependences order first.
    for s in &touching {
        let ok = match s.kind {
            StmtKind::Init => true,
            StmtKind::Update => {
                s.source == init.source
                    || (s.source > init.source
                        && scop.statement(&format!("{}_init", s.name)).is_none())
            }
            StmtKind::Assign => s.source > init.source,
        };
        if !ok {
            return Ok(None);
        }
    }
    let AssignOp::Reduce { op, init: true } = program.statements[init.source].op else {
        return Ok(None);
    };
    let all = tensor_elements(isl, scop, t)?;
    let written = init
        .write
        .copy()?
        .intersect_domain(init.domain.copy()?)?
        .range()?
        .intersect_params(scop.context.copy()?)?;
    if !all.is_subset(&written)? {
        return Ok(None);
    }
    Ok(Some(HoistedInit {
        statement: init.name.clone(),
        reducer: op,
    }))
}

/// Whether a dependence carried by the sequential band `band` relates
/// instances that run on different threads (different values of the
/// thread band `threads` below it): only then must every iteration of its
/// loop end with a barrier.
pub fn carries_cross_thread_dependences(
    band: &ScheduleNode,
    threads: &UnionMap,
    deps: &crate::deps::Dependences,
) -> Result<bool> {
    // `D ∩ (differ_only_from(band) \ (T⁻¹ ∘ T))` is `E \ (T⁻¹ ∘ T)` with
    // `E` the dependences that differ only at `band`: the same set, with
    // the differences taken from the dependences alone
    // (`mapping::pairs_differing_only_at`).
    let threads = threads.copy()?.intersect_domain(band.get_domain()?)?;
    let same_thread = threads.copy()?.apply_range(threads.reverse()?)?;
    let carried = super::mapping::pairs_differing_only_at(&deps.all()?, band)?;
    Ok(!carried.subtract(same_thread)?.is_empty()?)
}

/// `{ t[e] : 0 <= e < shape(t) }` in the program's context: every element
/// of tensor `t`.
pub fn tensor_elements(isl: &Isl, scop: &Scop, t: &str) -> Result<crate::isl::Set> {
    let tensor = scop
        .tensor(t)
        .ok_or_else(|| crate::error::Error::Internal(format!("unknown tensor {t}")))?;
    let dims: Vec<String> = (0..tensor.shape.len()).map(|d| format!("e{d}")).collect();
    let bounds: Vec<String> = tensor
        .shape
        .iter()
        .zip(&dims)
        .map(|(extent, d)| format!("0 <= {d} < {extent}"))
        .collect();
    let text = format!(
        "{}{{ {t}[{}] : {} }}",
        scop.param_prefix,
        dims.join(", "),
        if bounds.is_empty() {
            "true".to_string()
        } else {
            bounds.join(" and ")
        }
    );
    Ok(isl.set(&text)?.intersect_params(scop.context.copy()?)?)
}
