//! Printing the loops a warp's lanes share (see `gpu::lanes`): map loops
//! strided over the lanes, and reduction loops split over them with the
//! partial states combined by shuffles (on the CPU: lane after lane, then
//! the same butterfly over arrays, so CI executes the combination).

use std::collections::HashMap;
use std::fmt::Write;

use super::target::MapLoop;
use super::{storage_type, Ctx, Pending};
use crate::frontend::ast::{DType, TensorRole};
use crate::gpu::lanes::{LaneAxis, LaneLoop, State};
use crate::isl::ast::Node;
use crate::model::{AccessKey, ModelStmt};

/// One state of a split loop as printed: its private scalar and C type.
pub(super) struct Slot<'s> {
    pub(super) buffer: String,
    pub(super) ty: &'static str,
    dtype: DType,
    state: &'s State,
}

impl Ctx<'_> {
    /// Threads sharing a row: a warp, or a whole block of warps.
    pub(super) fn lane_width(&self) -> u32 {
        match self.threads.lane_axis {
            LaneAxis::X => self.plan.block[0],
            LaneAxis::Y(_) => self.plan.block[1],
        }
    }

    /// This thread's lane: its index along the lanes' axis.
    pub(super) fn lane_index(&self) -> &'static str {
        match self.threads.lane_axis {
            LaneAxis::X => "(pf_i)threadIdx.x",
            LaneAxis::Y(_) => "(pf_i)threadIdx.y",
        }
    }

    /// The barrier of the threads sharing a row: [`barrier`] for lanes on
    /// x; with lanes on y, the lanes of a row are in different warps, each
    /// warp holding lanes of several rows, so the whole block (every thread
    /// of a column block has a row: `lanes::Columns::rows` divides the
    /// rows).
    pub(super) fn lane_barrier(&self) -> &'static str {
        match self.threads.lane_axis {
            LaneAxis::X => barrier(self.plan.block),
            LaneAxis::Y(_) => "__syncthreads()",
        }
    }

    /// Whether every lane runs statement `s` (no lane-0 guard): inside a
    /// loop the lanes share, or writing a thread-private tensor (each lane
    /// keeps its own copy of the row's states).
    pub(super) fn all_lanes(&self, s: &ModelStmt) -> bool {
        if self.lanes().is_none() {
            return false;
        }
        if self.in_lanes {
            return true;
        }
        let t = &self.program.statements[s.source].lhs_tensor;
        self.printer.privates.borrow().contains_key(t)
    }

    /// Prints the loop under mark `lanes_K` (`k`, `l`; guards around it
    /// as they are): a map loop strided over the lanes, or a reduction
    /// loop split over them ([`Self::split_loop`]). A loop that reads a
    /// cached row runs in counted, unrolled form, so the row's registers
    /// are indexed by constants.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lane_loop(
        &self,
        k: usize,
        l: &LaneLoop,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        match body {
            Node::If {
                cond,
                then,
                otherwise: None,
            } => {
                let _ = writeln!(out, "{pad}if ({}) {{", self.e(cond));
                self.lane_loop(k, l, then, depth + 1, pending, in_thread, out);
                let _ = writeln!(out, "{pad}}}");
            }
            whole @ Node::For {
                iterator,
                init,
                cond,
                inc,
                body,
            } => {
                let inner = Ctx {
                    in_lanes: true,
                    lane_loop: Some(k),
                    ..*self
                };
                let (init, cond, inc) = (self.e(init), self.e(cond), self.e(inc));
                let width = self.lane_width();
                let cached: Vec<&RowCache> = self
                    .row_caches
                    .iter()
                    .filter(|c| c.loops.contains(&k))
                    .collect();
                let slots = cached.first().map(|c| c.slots);
                // Lane `lane`'s share: iterations `lane, lane + width, ..`.
                let share = |out: &mut String, pad: &str, lane: &str, depth: usize| match slots {
                    Some(slots) => {
                        self.t.unroll(pad, out);
                        let _ = writeln!(out, "{pad}for (int pf_t = 0; pf_t < {slots}; pf_t++) {{");
                        let _ = writeln!(
                            out,
                            "{pad}  const pf_i {iterator} = {init} + {} * ({inc});",
                            self.slot_iteration(lane)
                        );
                        let _ = writeln!(out, "{pad}  if ({cond}) {{");
                        inner.node(body, depth + 2, pending, in_thread, out);
                        let _ = writeln!(out, "{pad}  }}");
                        let _ = writeln!(out, "{pad}}}");
                    }
                    None if self.t.loads_ahead()
                        && matches!(self.threads.lane_axis, LaneAxis::Y(_)) =>
                    {
                        let head = (
                            iterator.as_str(),
                            init.as_str(),
                            cond.as_str(),
                            inc.as_str(),
                        );
                        inner.column_steps(head, lane, width, body, depth, pending, in_thread, out);
                    }
                    None => {
                        let _ = writeln!(
                                out,
                                "{pad}for (pf_i {iterator} = {init} + {lane} * ({inc}); {cond}; {iterator} += {width} * ({inc})) {{"
                            );
                        inner.node(body, depth + 1, pending, in_thread, out);
                        let _ = writeln!(out, "{pad}}}");
                    }
                };
                // What the row's statements before the loop wrote to memory
                // (on lane 0: a value not kept in registers) is visible to
                // every lane.
                self.t.row_barrier(self, &pad, out);
                // Rows this loop is the first to read: loaded here.
                for c in self
                    .row_caches
                    .iter()
                    .filter(|c| c.loops.first() == Some(&k))
                {
                    self.load_row_cache(c, depth, out);
                }
                match &l.states {
                    None => {
                        let m = MapLoop {
                            inner: &inner,
                            whole,
                            body,
                            head: (iterator, &init, &cond, &inc),
                            slots,
                            share: &share,
                            depth,
                            pending,
                            in_thread,
                        };
                        self.t.map_loop(self, &m, out);
                    }
                    Some(states) => match self.slots(states) {
                        Some(slots) => self.split_loop(&slots, &share, depth, out),
                        // Not private scalars after all (the mapping checks
                        // that they are, so not expected): the whole loop on
                        // every lane, as a loop the lanes do not share.
                        None => self.node(whole, depth, pending, in_thread, out),
                    },
                }
            }
            // No loop (one iteration): as it is.
            other => self.node(other, depth, pending, in_thread, out),
        }
    }

    /// A column lane's share of a loop (`gpu::lanes::LaneAxis::Y`,
    /// iterations `lane, lane + width, ..` of `for (iterator = init; cond;
    /// iterator += inc)`), in batches of [`COLUMN_UNROLL`] steps whose
    /// reads of the program's inputs are all issued before the first step
    /// computes. A step's arithmetic waits for the states of the step
    /// before it (a rolling maximum's rescaling branches on it), so loads
    /// written inside the steps would each wait for that too, one in
    /// flight per lane; loaded ahead, a batch's are in flight together
    /// (eight per lane: at 512 threads and 4 bytes, 16 KB per block, what
    /// an H100's memory needs in flight, 3.35 TB/s x ~0.6 us over 132
    /// multiprocessors, with two blocks on each).
    ///
    /// Only inputs are loaded ahead (nothing in the kernel writes them, so
    /// the early load reads what the step would), and only for a loop
    /// whose body is statements alone (no guard of isl's: each runs at
    /// every iteration the loop's condition admits, which is the test of
    /// the load; an input read by a statement at an instance of its domain
    /// is in bounds). The condition is an upper bound on the iterator
    /// (isl's loops count up), so the batch's first failing step ends the
    /// loop. Other bodies run the plain strided loop.
    #[allow(clippy::too_many_arguments)]
    fn column_steps(
        &self,
        (iterator, init, cond, inc): (&str, &str, &str, &str),
        lane: &str,
        width: u32,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let Some((loads, reads)) = self.inputs_ahead(body) else {
            let _ = writeln!(
                out,
                "{pad}for (pf_i {iterator} = {init} + {lane} * ({inc}); {cond}; {iterator} += {width} * ({inc})) {{"
            );
            self.node(body, depth + 1, pending, in_thread, out);
            let _ = writeln!(out, "{pad}}}");
            return;
        };
        let k = COLUMN_UNROLL;
        let step = |out: &mut String, p: &str| {
            let _ = writeln!(
                out,
                "{p}const pf_i {iterator} = pf_base + pf_k * {width} * ({inc});"
            );
        };
        let _ = writeln!(
            out,
            "{pad}for (pf_i pf_base = {init} + {lane} * ({inc}); ; pf_base += {} * ({inc})) {{",
            k * width
        );
        let _ = writeln!(
            out,
            "{pad}  {{ const pf_i {iterator} = pf_base; if (!({cond})) break; }}"
        );
        for (j, (_, ty)) in loads.iter().enumerate() {
            let _ = writeln!(out, "{pad}  {ty} pf_ld{j}[{k}];");
        }
        let _ = writeln!(out, "{pad}  #pragma unroll");
        let _ = writeln!(out, "{pad}  for (int pf_k = 0; pf_k < {k}; pf_k++) {{");
        step(out, &format!("{pad}    "));
        let _ = writeln!(out, "{pad}    if ({cond}) {{");
        for (j, (element, _)) in loads.iter().enumerate() {
            let _ = writeln!(out, "{pad}      pf_ld{j}[pf_k] = {element};");
        }
        let _ = writeln!(out, "{pad}    }}");
        let _ = writeln!(out, "{pad}  }}");
        let _ = writeln!(out, "{pad}  #pragma unroll");
        let _ = writeln!(out, "{pad}  for (int pf_k = 0; pf_k < {k}; pf_k++) {{");
        step(out, &format!("{pad}    "));
        let _ = writeln!(out, "{pad}    if ({cond}) {{");
        let n = reads.len();
        self.printer.run_reads.borrow_mut().extend(reads);
        self.node(body, depth + 3, pending, in_thread, out);
        self.drop_run_reads(n);
        let _ = writeln!(out, "{pad}    }}");
        let _ = writeln!(out, "{pad}  }}");
        let _ = writeln!(out, "{pad}}}");
    }

    /// The reads of inputs by the statements of `body` (statements alone,
    /// see [`Self::column_steps`]): each distinct element once, as the
    /// global access and the storage type of its register array
    /// `pf_ld<j>`, and each read as (statement, access text, `pf_ld<j>[pf_k]`)
    /// for the printer's overrides. `None` for another body, or none read.
    #[allow(clippy::type_complexity)]
    fn inputs_ahead(
        &self,
        body: &Node,
    ) -> Option<(
        Vec<(String, &'static str)>,
        Vec<(String, AccessKey, String)>,
    )> {
        let users: Vec<(&String, &Vec<crate::isl::ast::Expr>)> = match body {
            Node::User { statement, args } => vec![(statement, args)],
            Node::Block(v) => v
                .iter()
                .map(|n| match n {
                    Node::User { statement, args } => Some((statement, args)),
                    _ => None,
                })
                .collect::<Option<_>>()?,
            _ => return None,
        };
        let mut loads: Vec<(String, &'static str)> = Vec::new();
        let mut reads = Vec::new();
        for (statement, args) in users {
            let s = self.scop.statement(statement)?;
            let env = self.statement_env(&s.iterators, args);
            for a in s.accesses(self.program).into_iter().skip(1) {
                let t = self.scop.tensor(&a.tensor)?;
                if t.role != TensorRole::Input || t.shape.is_empty() {
                    continue;
                }
                let element = self.printer.element(&a.tensor, &a.subscripts, &env);
                let j = match loads.iter().position(|(e, _)| *e == element) {
                    Some(j) => j,
                    None => {
                        loads.push((element, storage_type(t.dtype)));
                        loads.len() - 1
                    }
                };
                reads.push((statement.clone(), a.key(), format!("pf_ld{j}[pf_k]")));
            }
        }
        (!loads.is_empty()).then_some((loads, reads))
    }

    /// The printed states of a split loop, when all are private scalars
    /// here.
    fn slots<'s>(&self, states: &'s [(String, State)]) -> Option<Vec<Slot<'s>>> {
        let views = self.printer.privates.borrow();
        states
            .iter()
            .map(|(tensor, state)| {
                let v = views.get(tensor)?;
                if v.sizes.iter().any(|s| *s != 1) {
                    return None;
                }
                let dtype = self.scop.tensor(tensor)?.dtype;
                Some(Slot {
                    buffer: v.buffer.clone(),
                    ty: self.t.storage_type(dtype),
                    dtype,
                    state,
                })
            })
            .collect()
    }

    /// A reduction loop split over the lanes: each lane runs its share
    /// from the identities (lane 0 from the state before the loop), then
    /// a butterfly over each warp's lanes combines the partial states,
    /// leaving the combined state in every lane (each step pairs lanes `l`
    /// and `l ^ o`, which compute the same commutative combination); with
    /// several warps on a row, the warps' states are then combined through
    /// shared memory. The emulation runs the butterfly over all lanes
    /// (`KernelTarget::split_loop`).
    fn split_loop(
        &self,
        slots: &[Slot],
        share: &dyn Fn(&mut String, &str, &str, usize),
        depth: usize,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let carried: Vec<&Slot> = slots
            .iter()
            .filter(|s| !matches!(s.state, State::Cache { .. }))
            .collect();
        let _ = writeln!(out, "{pad}{{");
        self.t.split_loop(self, slots, &carried, share, depth, out);
        let _ = writeln!(out, "{pad}}}");
    }

    /// The identity of a carried state's reducer (a lane's share starts
    /// from it).
    pub(super) fn slot_identity(&self, s: &Slot) -> String {
        let r = match s.state {
            State::Reduce(r) | State::Target { reducer: r, .. } => *r,
            State::Cache { .. } => unreachable!("caches are not carried"),
        };
        self.printer.identity(r, s.dtype.compute())
    }

    /// Declares the partner's value of each carried state,
    /// `pf_b_<buffer> = partner(buffer)`, and combines (see
    /// [`Self::combine_step`]).
    pub(super) fn combine_with(
        &self,
        carried: &[&Slot],
        slots: &[Slot],
        pad: &str,
        partner: &dyn Fn(&str) -> String,
        out: &mut String,
    ) {
        for s in carried {
            let _ = writeln!(
                out,
                "{pad}{} pf_b_{} = {};",
                s.ty,
                s.buffer,
                partner(&s.buffer)
            );
        }
        self.combine_step(carried, slots, pad, out);
    }

    /// Combines this lane's states (their buffers) with the partner's
    /// (`pf_b_<buffer>`), in place: the reductions' combined values first
    /// (`pf_n_<buffer>`), then each target from both partial targets moved
    /// by its repair term to the combined predecessors, then the
    /// reductions take their combined values.
    fn combine_step(&self, carried: &[&Slot], slots: &[Slot], pad: &str, out: &mut String) {
        // Buffers of the caches by the buffer of their predecessor.
        let buffer_of = |tensor: &str| -> Option<String> {
            self.printer
                .privates
                .borrow()
                .get(tensor)
                .map(|v| v.buffer.clone())
        };
        let mut caches: Vec<(String, String)> = Vec::new();
        for s in slots {
            if let State::Cache { of } = s.state {
                if let Some(p) = buffer_of(of) {
                    caches.push((s.buffer.clone(), p));
                }
            }
        }
        for s in carried {
            if let State::Reduce(r) = s.state {
                let _ = writeln!(
                    out,
                    "{pad}const {} pf_n_{b} = {};",
                    s.ty,
                    self.printer.combine(
                        *r,
                        s.dtype.compute(),
                        &s.buffer,
                        &format!("pf_b_{}", s.buffer)
                    ),
                    b = s.buffer
                );
            }
        }
        for s in carried {
            if let State::Target { reducer, repair } = s.state {
                let h = self.printer.expr(repair, &HashMap::new());
                let mut mine = HashMap::new();
                let mut theirs = HashMap::new();
                theirs.insert(s.buffer.clone(), format!("pf_b_{}", s.buffer));
                for (cache, pred) in &caches {
                    mine.insert(cache.clone(), pred.clone());
                    mine.insert(pred.clone(), format!("pf_n_{pred}"));
                    theirs.insert(cache.clone(), format!("pf_b_{pred}"));
                    theirs.insert(pred.clone(), format!("pf_n_{pred}"));
                }
                let value = self.printer.combine(
                    *reducer,
                    s.dtype.compute(),
                    &format!("({})", rename_identifiers(&h, &mine)),
                    &format!("({})", rename_identifiers(&h, &theirs)),
                );
                let _ = writeln!(out, "{pad}{} = {value};", s.buffer);
            }
        }
        for s in carried {
            if let State::Reduce(_) = s.state {
                let _ = writeln!(out, "{pad}{b} = pf_n_{b};", b = s.buffer);
            }
        }
    }
}

/// The barrier of the threads sharing a row of a block `block`: a warp;
/// the whole block; or, where the block's rows run side by side in groups
/// along y (`mapping::block_row_groups`), the row's group on its own named
/// barrier `1 + threadIdx.y` (a group is whole warps, and barrier 0,
/// `__syncthreads`, stays the block's).
pub(super) fn barrier(block: [u32; 3]) -> &'static str {
    if block[0] <= 32 {
        "__syncwarp()"
    } else if block[1] > 1 {
        "asm volatile(\"bar.sync %0, %1;\" :: \"r\"(threadIdx.y + 1), \"r\"(blockDim.x) : \"memory\")"
    } else {
        "__syncthreads()"
    }
}

/// Steps of a column lane's loop unrolled together (see
/// `gpu::lanes::LaneAxis::Y`): eight loads of 4 bytes in flight per lane
/// keep about 16 KB in flight per multiprocessor at 16 warps, what an
/// H100's memory needs (3.35 TB/s x ~0.6 us over 132 multiprocessors).
const COLUMN_UNROLL: u32 = 8;

/// Four consecutive elements of one slot group `pf_q` accessed at once:
/// `vector` (lines of a 16-byte access through `pf_a`, the address of the first
/// element, declared as `pointer.0 *`) where the group's first and last
/// iterations satisfy the loop's condition `cond` (a conjunction of
/// affine bounds, so the two between do too) and `pf_a` is 16-byte
/// aligned (checked at run time), else `scalar` for each element in the
/// loop (`pf_r`). `at(r)` declares the loop's iterator at element `r`.
fn four_at_once(
    pad: &str,
    at: &dyn Fn(&str) -> String,
    cond: &str,
    pointer: (&str, &str),
    vector: &str,
    scalar: &str,
    out: &mut String,
) {
    let (ty, first) = pointer;
    let _ = writeln!(out, "{pad}int pf_last;");
    let _ = writeln!(out, "{pad}{{ {} pf_last = ({cond}); }}", at("3"));
    let _ = writeln!(out, "{pad}{}", at("0"));
    let _ = writeln!(out, "{pad}{ty} *pf_a = &{first};");
    let _ = writeln!(
        out,
        "{pad}if (pf_last && ({cond}) && (((unsigned long long)pf_a) & 15) == 0) {{"
    );
    for line in vector.lines() {
        let _ = writeln!(out, "{pad}  {line}");
    }
    let _ = writeln!(out, "{pad}}} else {{");
    let _ = writeln!(out, "{pad}  #pragma unroll");
    let _ = writeln!(out, "{pad}  for (int pf_r = 0; pf_r < 4; pf_r++) {{");
    let _ = writeln!(out, "{pad}    {}", at("pf_r"));
    let _ = writeln!(out, "{pad}    if ({cond}) {scalar}");
    let _ = writeln!(out, "{pad}  }}");
    let _ = writeln!(out, "{pad}}}");
}

/// One loop's reads of an input tensor: the tensor, the distinct
/// addresses, the accesses, and whether every read is contiguous in
/// the loop's iterator.
type InputReads = (String, Vec<String>, Vec<AccessKey>, bool);

/// Most 32-bit registers a lane gives to cached rows.
const ROW_CACHE_WORDS: i64 = 128;

/// A row of an input tensor that several loops of a row read at the same
/// elements (an online softmax reads `X(r, c)` in its rolling loop and
/// again in its output loop): each lane loads its share once, into
/// registers, before the first of those loops, and the loops read the
/// registers. Without it the second read goes back to memory, and with
/// thousands of rows in flight the row has left the L2 cache by then.
///
/// Sound when the loops are siblings in the row's body (the same guards
/// around them), have the same iterator, start, step and condition (lane
/// `l`'s slot `t` is the same iteration `start + (l + W t) step` in each,
/// `W` the threads of a row)
/// and every read of the tensor in them is the same element at that
/// iteration; the tensor is an input, so no statement changes it.
pub(super) struct RowCache {
    buffer: String,
    ty: &'static str,
    dtype: DType,
    /// Slots per lane: the loops' iterations over the threads of a row,
    /// rounded up.
    slots: i64,
    /// The element a slot holds, in the loops' iterator.
    address: String,
    /// The accesses (printer override keys) that read it.
    keys: Vec<AccessKey>,
    /// The lane loops reading it, in order (the first loads it).
    loops: Vec<usize>,
    iterator: String,
    init: String,
    cond: String,
    inc: String,
    /// Every read is the element at the loop's iterator along the
    /// tensor's last (contiguous) dimension, no other subscript moving
    /// with it: consecutive iterations read consecutive elements.
    contiguous: bool,
}

/// Whether the printed expression `e` names identifier `id`.
fn mentions(e: &str, id: &str) -> bool {
    e.split(|c: char| !c.is_alphanumeric() && c != '_')
        .any(|w| w == id)
}

/// Whether an access with subscripts `subs` (under `env`, the statement's
/// iterators as printed expressions) moves along its last dimension with
/// loop iterator `it` at unit stride and along no other.
fn contiguous_in(
    subs: &[crate::frontend::ast::Affine],
    env: &HashMap<String, String>,
    it: &str,
) -> bool {
    let moving = |a: &crate::frontend::ast::Affine| -> Vec<(String, i64)> {
        a.terms
            .iter()
            .filter(|(v, c)| **c != 0 && env.get(*v).is_some_and(|e| mentions(e, it)))
            .map(|(v, c)| {
                (
                    env[v].trim_matches(|c| c == '(' || c == ')').to_string(),
                    *c,
                )
            })
            .collect()
    };
    let Some((last, rest)) = subs.split_last() else {
        return false;
    };
    rest.iter().all(|a| moving(a).is_empty()) && moving(last) == [(it.to_string(), 1)]
}

impl Ctx<'_> {
    /// Whether the row's lanes take their slots in fours: lane `l`'s slot
    /// `t` is iteration `4 (l + W (t / 4)) + t % 4` (from the start, in
    /// steps), instead of `l + W t`, so that each four consecutive slots
    /// are one 16-byte load of a cached row and one 16-byte store of a map
    /// loop's output. Where a block's rows take all its threads one row
    /// at a time, and every cached row is f32, read contiguously at unit
    /// step, with a multiple of four slots; any other order of the
    /// iterations over the lanes is as legal (a map loop's iterations are
    /// independent, a split loop's shares are combined whatever they
    /// hold), so only the loops reading the cached rows must agree with
    /// them, and they all take this order.
    ///
    /// Measured on the H100 at 16384 x 4096 f32 (100 runs, one call):
    /// layer norm (rows one at a time) 232.4 and 234.5 -> 201.1 and 199.5
    /// us, but the fused softmax with its rows side by side
    /// (`mapping::block_row_groups`) 190.5 and 190.2 -> 194.9 and 194.6
    /// us, so rows side by side (and warps' rows, not measured) keep
    /// `l + W t`.
    pub(super) fn in_fours(&self) -> bool {
        self.plan.block[0] > 32
            && self.plan.block[1] == 1
            && !self.row_caches.is_empty()
            && self
                .row_caches
                .iter()
                .all(|c| c.dtype == DType::F32 && c.inc == "1" && c.slots % 4 == 0 && c.contiguous)
    }

    /// Iteration (from the start, in steps) of slot `pf_t` of lane `lane`.
    fn slot_iteration(&self, lane: &str) -> String {
        if self.in_fours() {
            self.group_iteration(lane, "(pf_t / 4)", "pf_t % 4")
        } else {
            format!("({lane} + {} * pf_t)", self.lane_width())
        }
    }

    /// Iteration (from the start, in steps) of element `r` of lane
    /// `lane`'s group of four slots `q` (an operand of a product: an
    /// identifier or parenthesised; see [`Self::in_fours`]).
    fn group_iteration(&self, lane: &str, q: &str, r: &str) -> String {
        format!("(4 * ({lane} + {} * {q}) + {r})", self.lane_width())
    }

    /// The declaration of a loop's iterator (`iterator = init + i *
    /// inc`) at element `r` of this thread's group of four slots `pf_q`.
    fn group_element(&self, iterator: &str, init: &str, inc: &str, r: &str) -> String {
        format!(
            "const pf_i {iterator} = {init} + {} * ({inc});",
            self.group_iteration("(pf_i)threadIdx.x", "pf_q", r)
        )
    }

    /// The row caches of a private region's `body` (see [`RowCache`]).
    pub(super) fn row_caches(&self, body: &Node) -> Vec<RowCache> {
        let Node::Block(children) = body else {
            return Vec::new();
        };
        let Some(lanes) = self.lanes() else {
            return Vec::new();
        };
        /// What the loops seen so far say of one input tensor.
        struct Seen {
            tensor: String,
            /// Read at another address, or by loops of another shape
            /// somewhere: not cached.
            rejected: bool,
            address: String,
            keys: Vec<AccessKey>,
            loops: Vec<usize>,
            slots: i64,
            signature: [String; 4],
            contiguous: bool,
        }
        let mut seen: Vec<Seen> = Vec::new();
        let width = i64::from(self.lane_width());
        for child in children {
            let Node::Mark { name, body } = child else {
                continue;
            };
            let Some(k) = LaneLoop::index(name) else {
                continue;
            };
            let Some(extent) = lanes.get(k).and_then(|l| l.extent) else {
                continue;
            };
            let Node::For {
                iterator,
                init,
                cond,
                inc,
                body,
            } = &**body
            else {
                continue;
            };
            let signature = [iterator.clone(), self.e(init), self.e(cond), self.e(inc)];
            let slots = (extent + width - 1) / width;
            // This loop's reads of inputs: tensor -> (addresses, keys,
            // contiguous in the iterator).
            let mut reads: Vec<InputReads> = Vec::new();
            if !self.input_reads(body, iterator, &mut reads) {
                continue;
            }
            for (tensor, addresses, keys, contiguous) in reads {
                match seen.iter_mut().find(|s| s.tensor == tensor) {
                    Some(s) => {
                        s.rejected |= addresses != [s.address.clone()]
                            || s.slots != slots
                            || s.signature != signature;
                        s.keys.extend(keys);
                        s.loops.push(k);
                        s.contiguous &= contiguous;
                    }
                    None => seen.push(Seen {
                        tensor,
                        rejected: addresses.len() != 1,
                        address: addresses[0].clone(),
                        keys,
                        loops: vec![k],
                        slots,
                        signature: signature.clone(),
                        contiguous,
                    }),
                }
            }
        }
        let mut words = 0;
        let mut caches = Vec::new();
        for mut s in seen {
            if s.rejected || s.loops.len() < 2 {
                continue;
            }
            let Some(t) = self.scop.tensor(&s.tensor) else {
                continue;
            };
            let w = s.slots * if t.dtype.size() == 8 { 2 } else { 1 };
            if words + w > ROW_CACHE_WORDS {
                continue;
            }
            words += w;
            s.keys.sort();
            s.keys.dedup();
            let [iterator, init, cond, inc] = s.signature;
            caches.push(RowCache {
                buffer: format!("pf_row_{}_{}", self.kernel_mark(), s.tensor),
                dtype: t.dtype,
                ty: self.t.storage_type(t.dtype),
                slots: s.slots,
                address: s.address,
                keys: s.keys,
                loops: s.loops,
                iterator,
                init,
                cond,
                inc,
                contiguous: s.contiguous,
            });
        }
        caches
    }

    /// Collects the reads of input tensors by the statements of `n` (with
    /// guards around them): per tensor, the distinct addresses and the
    /// access texts. False when `n` holds a loop or a mark.
    fn input_reads(&self, n: &Node, iterator: &str, reads: &mut Vec<InputReads>) -> bool {
        match n {
            Node::If {
                then, otherwise, ..
            } => {
                self.input_reads(then, iterator, reads)
                    && otherwise
                        .as_deref()
                        .is_none_or(|o| self.input_reads(o, iterator, reads))
            }
            Node::Block(v) => v.iter().all(|c| self.input_reads(c, iterator, reads)),
            Node::User { statement, args } => {
                let Some(s) = self.scop.statement(statement) else {
                    return false;
                };
                let env = self.statement_env(&s.iterators, args);
                for a in s.accesses(self.program).into_iter().skip(1) {
                    let input = self
                        .program
                        .tensor(&a.tensor)
                        .is_some_and(|t| t.role == TensorRole::Input);
                    if !input || self.printer.privates.borrow().contains_key(&a.tensor) {
                        continue;
                    }
                    let address = self.printer.element(&a.tensor, &a.subscripts, &env);
                    let key = a.key();
                    let contiguous = contiguous_in(&a.subscripts, &env, iterator);
                    match reads.iter_mut().find(|(t, _, _, _)| *t == a.tensor) {
                        Some((_, addresses, keys, c)) => {
                            if !addresses.contains(&address) {
                                addresses.push(address);
                            }
                            keys.push(key);
                            *c &= contiguous;
                        }
                        None => {
                            reads.push((a.tensor.clone(), vec![address], vec![key], contiguous))
                        }
                    }
                }
                true
            }
            Node::For { .. } | Node::Mark { .. } => false,
        }
    }

    /// Declares the registers of `caches` (the emulation: one row of
    /// slots per lane).
    pub(super) fn declare_row_caches(&self, caches: &[RowCache], depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        let lanes = self.t.lane_rows(self.lane_width());
        for c in caches {
            let _ = writeln!(out, "{pad}{} {}{lanes}[{}];", c.ty, c.buffer, c.slots);
        }
    }

    /// Loads each lane's share of cached row `c`.
    fn load_row_cache(&self, c: &RowCache, depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        if self.t.vectors() && self.in_fours() {
            self.load_row_cache_in_fours(c, &pad, out);
            return;
        }
        let slot = format!("{}{}[pf_t]", c.buffer, self.t.lane_row());
        self.t.each_lane(self, &pad, out, &mut |lane, p, out| {
            self.t.unroll(p, out);
            let _ = writeln!(out, "{p}for (int pf_t = 0; pf_t < {}; pf_t++) {{", c.slots);
            let _ = writeln!(
                out,
                "{p}  const pf_i {} = {} + {} * ({});",
                c.iterator,
                c.init,
                self.slot_iteration(lane),
                c.inc
            );
            let _ = writeln!(out, "{p}  if ({}) {slot} = {};", c.cond, c.address);
            let _ = writeln!(out, "{p}}}");
        });
    }

    /// The element a map loop's body stores, as printed in the loop's
    /// iterator, where its four slots can be stored at once: the lanes
    /// take their slots in fours ([`Self::in_fours`]), the body is one
    /// statement, and it writes an f32 tensor at the iterator along the
    /// last dimension at unit stride (consecutive slots, consecutive
    /// elements).
    pub(super) fn stored_in_fours(&self, body: &Node, iterator: &str) -> Option<String> {
        if !self.t.vectors() || !self.in_fours() {
            return None;
        }
        let Node::User { statement, args } = body else {
            return None;
        };
        let s = self.scop.statement(statement)?;
        let st = &self.program.statements[s.source];
        if s.kind != crate::model::StmtKind::Assign
            || self.program.tensor(&st.lhs_tensor)?.dtype != DType::F32
            || self.printer.privates.borrow().contains_key(&st.lhs_tensor)
        {
            return None;
        }
        let env = self.statement_env(&s.iterators, args);
        let subs: Vec<crate::frontend::ast::Affine> = st
            .lhs_indices
            .iter()
            .map(|i| crate::frontend::ast::Affine::var(i))
            .collect();
        contiguous_in(&subs, &env, iterator)
            .then(|| self.printer.element(&st.lhs_tensor, &subs, &env))
    }

    /// A map loop whose lanes store four slots at once: each four slots'
    /// values into `pf_vs`, then one 16-byte store where the four elements
    /// are in the loop and their address is 16-byte aligned (checked at
    /// run time), one element at a time otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn map_loop_in_fours(
        &self,
        (iterator, init, cond, inc): (&str, &str, &str, &str),
        slots: i64,
        body: &Node,
        store: &str,
        depth: usize,
        pending: &[Pending],
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let at = |r: &str| self.group_element(iterator, init, inc, r);
        let inner = Ctx {
            in_lanes: true,
            store_in_fours: true,
            ..*self
        };
        let _ = writeln!(out, "{pad}#pragma unroll");
        let _ = writeln!(
            out,
            "{pad}for (int pf_q = 0; pf_q < {}; pf_q++) {{",
            slots / 4
        );
        let _ = writeln!(out, "{pad}  float pf_vs[4];");
        let _ = writeln!(out, "{pad}  #pragma unroll");
        let _ = writeln!(out, "{pad}  for (int pf_r = 0; pf_r < 4; pf_r++) {{");
        let _ = writeln!(out, "{pad}    const int pf_t = 4 * pf_q + pf_r;");
        let _ = writeln!(out, "{pad}    {}", at("pf_r"));
        let _ = writeln!(out, "{pad}    if ({cond}) {{");
        inner.node(body, depth + 3, pending, true, out);
        let _ = writeln!(out, "{pad}    }}");
        let _ = writeln!(out, "{pad}  }}");
        four_at_once(
            &format!("{pad}  "),
            &at,
            cond,
            ("float", store),
            "*(float4 *)pf_a = make_float4(pf_vs[0], pf_vs[1], pf_vs[2], pf_vs[3]);",
            &format!("{store} = pf_vs[pf_r];"),
            out,
        );
        let _ = writeln!(out, "{pad}}}");
    }

    /// Each four slots of cached row `c` in one 16-byte load where the
    /// four elements are in the loop and their address is 16-byte aligned
    /// (checked at run time: the tensor's base and the row's start are
    /// whatever the caller passed), one element at a time otherwise.
    fn load_row_cache_in_fours(&self, c: &RowCache, pad: &str, out: &mut String) {
        let at = |r: &str| self.group_element(&c.iterator, &c.init, &c.inc, r);
        let b = &c.buffer;
        let _ = writeln!(out, "{pad}#pragma unroll");
        let _ = writeln!(
            out,
            "{pad}for (int pf_q = 0; pf_q < {}; pf_q++) {{",
            c.slots / 4
        );
        four_at_once(
            &format!("{pad}  "),
            &at,
            &c.cond,
            ("const float", &c.address),
            &format!(
                "const float4 pf_v = *(const float4 *)pf_a;\n{b}[4 * pf_q] = pf_v.x; {b}[4 * pf_q + 1] = pf_v.y; {b}[4 * pf_q + 2] = pf_v.z; {b}[4 * pf_q + 3] = pf_v.w;"
            ),
            &format!("{b}[4 * pf_q + pf_r] = {};", c.address),
            out,
        );
        let _ = writeln!(out, "{pad}}}");
    }

    /// In a lane loop reading cached rows: their reads name the registers
    /// (slot `pf_t` of the lane).
    pub(super) fn cached_row_reads(&self) {
        let Some(k) = self.lane_loop else {
            return;
        };
        let mut o = self.printer.overrides.borrow_mut();
        for c in self.row_caches.iter().filter(|c| c.loops.contains(&k)) {
            let slot = format!("{}{}[pf_t]", c.buffer, self.t.lane_row());
            for key in &c.keys {
                o.insert(key.clone(), slot.clone().into());
            }
        }
    }
}

/// `text` with every identifier that is a key of `map` replaced by its
/// value, all at once (a replacement is not renamed again).
fn rename_identifiers(text: &str, map: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if !word.is_empty() {
            match map.get(word.as_str()) {
                Some(v) => out.push_str(v),
                None => out.push_str(word),
            }
            word.clear();
        }
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_renamed_at_once_and_whole() {
        let map: HashMap<String, String> = [
            ("M".to_string(), "pf_n_M".to_string()),
            ("M_prev".to_string(), "M".to_string()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            rename_identifiers("(M_prev == M) ? S : S * expf(M_prev - M)", &map),
            "(M == pf_n_M) ? S : S * expf(M - pf_n_M)"
        );
        assert_eq!(rename_identifiers("xM + M2", &map), "xM + M2");
    }
}
