//! Loops: a loop distributed over blocks or threads, a sequential loop (with its pipeline's stages), and the folded loops of register tiles.

use super::*;

impl Ctx<'_> {
    /// The head `for (..) {` of a mapped loop `for (c = init; cond; c +=
    /// inc)` distributed cyclically over index `id` of `count`.
    ///
    /// Which thread runs an iteration must depend on the iteration's
    /// value alone, and the same way in every thread loop of a kernel: the
    /// race-freedom proof (`gpu::race`) takes two instances with equal
    /// values of the members mapped to each axis to run on one thread.
    /// Here thread `id` runs exactly the values `v ≡ id (mod count)`.
    /// Starting at `init + id` instead, where `init` depends on an
    /// enclosing loop (a triangular domain: `max(0, c4 - c1)`), handed a
    /// value to another thread at each step of that loop with no barrier
    /// between (issue 30, class 1). For `inc = 1` the first such value at
    /// or after `init` is
    ///
    /// `id - count floor((id - init) / count)`
    ///
    /// (`0 + id` when `init = 0`); a loop of another step tests each of
    /// its values. Blocks never share data within a kernel, so a block
    /// loop keeps `init + id inc`: equal values of the block members
    /// above (all of them) give one start.
    pub(super) fn distributed_head(
        &self,
        iterator: &str,
        (init, cond, inc): (&Expr, &str, &Expr),
        (id, count): (&str, &str),
        thread: bool,
    ) -> String {
        let (init_s, inc_s) = (self.e(init), self.e(inc));
        let one = inc == &Expr::Int(1);
        if !thread || (init == &Expr::Int(0) && one) {
            return format!(
                "for (pf_i {iterator} = {init_s} + {id} * {inc_s}; {cond}; {iterator} += {count} * {inc_s}) {{"
            );
        }
        if one {
            return format!(
                "for (pf_i {iterator} = {id} - {count} * pf_floord({id} - ({init_s}), {count}); {cond}; {iterator} += {count}) {{"
            );
        }
        format!(
            "for (pf_i {iterator} = {init_s}; {cond}; {iterator} += {inc_s}) if ({iterator} - {count} * pf_floord({iterator}, {count}) == {id}) {{"
        )
    }

    /// A loop of the AST (`n`, read as `head`): a narrow reduction folded
    /// into a register, a loop unswitched on a select, a register tile's
    /// slots, or a loop mapped to blocks or threads or run sequentially,
    /// then its body and the barrier after each step.
    pub(super) fn for_loop(
        &self,
        n: &Node,
        head: &LoopHead<'_>,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let (iterator, body) = (head.iterator, head.body);
        let unmapped = pending.iter().all(|p| p.2 != iterator);
        if unmapped
            && (in_thread || !self.has_threads())
            && !self.in_regs
            && self.lanes().is_none()
            && self.narrow_fold_loop(n, depth, pending, in_thread, out)
        {
            return;
        }
        let matched = pending.iter().position(|p| p.2 == iterator);
        // Inside a thread (no barrier in the loop, whose threads
        // may take different copies): unswitched on a select the
        // loop does not change (`unswitch`).
        if matched.is_none() && in_thread && self.lanes().is_none() {
            if let Some((c, cond)) = self.invariant_select(body) {
                for (arm, open) in [(true, format!("if ({c})")), (false, "} else".into())] {
                    let _ = writeln!(out, "{pad}{open} {{");
                    self.printer
                        .fixed_selects
                        .borrow_mut()
                        .push((cond.clone(), arm));
                    self.node(n, depth + 1, pending, in_thread, out);
                    self.printer.fixed_selects.borrow_mut().pop();
                }
                let _ = writeln!(out, "{pad}}}");
                return;
            }
        }
        if let (Some(k), true, Some(regs)) = (matched, self.in_regs, self.regs) {
            if pending[k].0 {
                self.register_slots(regs, &pending[..k], &pending[k], head, depth, out);
                return;
            }
        }
        let opened = match matched {
            Some(k) => {
                self.mapped_loop_head(head, &pending[..k], &pending[k], in_thread, depth, out)
            }
            None => match self.sequential_loop_head(head, pending, in_thread, depth, out) {
                Some(opened) => opened,
                None => return,
            },
        };
        let mut bound = self.bound.to_vec();
        bound.push(iterator.to_string());
        // Each step ends with a barrier on the GPU when a thread's
        // next step may read what another thread wrote.
        let synced = !self.nosync && !opened.in_thread && self.has_threads() && has_work(body);
        // A promotion point right below this loop may be double
        // buffered along it when the steps are ordered by that
        // barrier (in the emulation, by running one after another).
        let shared_body = (synced || self.t.steps_in_order())
            && matches!(body, Node::Mark { name, .. } if name == "shared");
        let step_loop = match (matched, head.inc) {
            (None, Expr::Int(step)) if *step > 0 && !opened.step_guard && shared_body => {
                Some((iterator, head.init, head.cond, *step))
            }
            _ => None,
        };
        let inner = Ctx {
            nosync: false,
            bound: &bound,
            step_loop,
            ..*self
        };
        let body_depth = depth + 1 + usize::from(opened.step_guard);
        inner.node(body, body_depth, &opened.pending, opened.in_thread, out);
        if opened.step_guard {
            let _ = writeln!(out, "{pad}  }}");
        }
        if synced {
            self.t.barrier(self, &format!("{pad}  "), out);
        }
        let _ = writeln!(out, "{pad}}}");
        self.drop_run_reads(opened.run_reads);
    }

    /// The head of a loop mapped to blocks or threads (`p`, with `above`
    /// the mappings pending above it): distributed cyclically over the
    /// index, in the emulation inside a loop over the indexes.
    pub(super) fn mapped_loop_head(
        &self,
        head: &LoopHead<'_>,
        above: &[Pending],
        p: &Pending,
        in_thread: bool,
        depth: usize,
        out: &mut String,
    ) -> OpenLoop {
        let pad = "  ".repeat(depth);
        let (iterator, cond) = (head.iterator, head.printed[1]);
        let (id, count) = self.t.mapped_index(self, above, p, &pad, out);
        let head = self.distributed_head(iterator, (head.init, cond, head.inc), (&id, &count), p.0);
        let _ = writeln!(out, "{pad}{head}");
        OpenLoop {
            pending: Vec::new(),
            in_thread: in_thread || p.0,
            step_guard: false,
            run_reads: 0,
        }
    }

    /// Whether `p` is a block axis the gpu stage starts at the last tile
    /// (`KernelPlan::reversed`): block `b` of `G` runs tile `G - 1 - b`.
    pub(super) fn reversed(&self, p: &Pending) -> bool {
        let axis = (p.1 as u8).saturating_sub(b'x') as usize;
        !p.0 && self.plan.reversed.get(axis).copied().unwrap_or(false)
    }

    /// The head of a loop of an unmapped member (or of a deeper band while
    /// a mapped member has a single iteration): unrolled where it indexes
    /// a private array or is a register tile's step loop (to its constant
    /// bound, the rest of its condition tested inside), with the rows it
    /// reads loaded ahead (`row_copies`). `None` when a chain split
    /// (`split_chain`) printed the whole loop.
    pub(super) fn sequential_loop_head(
        &self,
        head: &LoopHead<'_>,
        pending: &[Pending],
        in_thread: bool,
        depth: usize,
        out: &mut String,
    ) -> Option<OpenLoop> {
        let pad = "  ".repeat(depth);
        let LoopHead {
            iterator,
            init: n_init,
            cond: n_cond,
            inc: n_inc,
            printed: [init, cond, inc],
            body,
        } = *head;
        // A register tile's step loop of at most the steps the gpu stage
        // unrolls (`RegisterTile::unrolled_steps`) runs to its constant
        // bound, the rest of its condition tested inside.
        let steps = match self.regs.and_then(|r| r.unrolled_steps) {
            Some(most) if self.t.unrolls() && self.in_regs && self.in_scope => {
                constant_trip(iterator, n_init, n_cond, n_inc)
                    .filter(|(_, _, trips)| *trips <= most)
            }
            _ => None,
        };
        let unrolled_private = self.t.unrolls() && self.indexes_private(body, iterator);
        let counted = counted_loop(iterator, n_init, n_cond, n_inc);
        // Reads this loop takes from registers loaded ahead of it.
        let mut run_reads = 0;
        if let (true, true, true, Some(l)) = (
            unrolled_private,
            in_thread,
            self.lanes().is_none(),
            &counted,
        ) {
            let copies = self.row_copies(body, l, depth, out);
            run_reads = copies.len();
            self.printer
                .run_reads
                .borrow_mut()
                .extend(copies.into_iter().map(|c| (c.statement, c.key, c.element)));
            if self.split_chain(body, l, depth, out) {
                self.drop_run_reads(run_reads);
                return None;
            }
        }
        if unrolled_private || steps.is_some() {
            // Unrolled: a private array's subscripts become
            // constants and it stays in registers.
            self.t.unroll(&pad, out);
        }
        let test = match (&steps, unrolled_private) {
            (Some((bound, _, _)), false) => self.e(bound),
            _ => cond.to_string(),
        };
        let _ = writeln!(
            out,
            "{pad}for (pf_i {iterator} = {init}; {test}; {iterator} += {inc}) {{"
        );
        // An unrolled step loop's test beyond its constant bound
        // is open around the body.
        let mut step_guard = false;
        if let (Some((_, Some(rest), _)), false) = (&steps, unrolled_private) {
            let _ = writeln!(out, "{pad}  if ({}) {{", self.e(rest));
            step_guard = true;
        }
        Some(OpenLoop {
            pending: pending.to_vec(),
            in_thread,
            step_guard,
            run_reads,
        })
    }

    /// The steps of one reduction folded into a register `pf_red`: `body`
    /// is guards and sequential loops around one update statement whose
    /// element names none of those loops' iterators nor `outer` (the loop
    /// around `body`, if any). Gives the statement, the reducer, its compute
    /// type, the steps as C (the guards and loop heads around `pf_red =
    /// pf_red op rhs;`) and the fold of `pf_red` into the element; `None`
    /// for any other shape.
    pub(super) fn folded(&self, body: &Node, outer: Option<&str>) -> Option<Folded<'_>> {
        let mut around = Vec::new();
        let mut iterators: Vec<&str> = outer.into_iter().collect();
        let mut n = body;
        let (statement, args) = loop {
            match n {
                Node::If {
                    cond,
                    then,
                    otherwise: None,
                } => {
                    around.push(format!("if ({})", self.e(cond)));
                    n = then;
                }
                Node::For {
                    iterator: it,
                    init,
                    cond,
                    inc,
                    body,
                } => {
                    around.push(format!(
                        "for (pf_i {it} = {}; {}; {it} += {})",
                        self.e(init),
                        self.e(cond),
                        self.e(inc)
                    ));
                    iterators.push(it.as_str());
                    n = body;
                }
                Node::Block(v) if v.len() == 1 => n = &v[0],
                Node::User { statement, args } => break (statement, args),
                _ => return None,
            }
        };
        let model = self.scop.statement(statement)?;
        // Only an update folds: an `op=!` initialisation shares its source
        // statement, whose right side names the reduction's indices, which
        // the initialisation does not have (the fuzzer found one alone
        // under a sequential loop, and the printer panicked).
        if model.kind != crate::model::StmtKind::Update {
            return None;
        }
        let st = &self.program.statements[model.source];
        let env = self.statement_env(&model.iterators, args);
        let (op, t, rhs) = self.printer.reduction(st, &env)?;
        let fold = self.printer.fold_into_lhs(st, &env, "pf_red");
        // The accumulator's address must not depend on the reduction's
        // loops.
        if fold
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|tok| iterators.contains(&tok))
        {
            return None;
        }
        let step = self.printer.combine(op, t, "pf_red", &rhs);
        let steps = around
            .iter()
            .rev()
            .fold(format!("pf_red = {step};"), |body, head| {
                format!("{head} {body}")
            });
        Some(Folded {
            model,
            op,
            t,
            steps,
            fold,
        })
    }

    /// A sequential loop whose body is the steps of one reduction into an
    /// f16 or bf16 element that the loop does not move (the element's
    /// address names none of the loop's iterators): the steps accumulate in
    /// a register of the compute type, from the reducer's identity, and
    /// the element takes the total once, one rounding, as the
    /// declared-precision run does (a store per step rounded the running
    /// value to 11 bits each time: the fuzzer's `f16_scalar_reduction`
    /// find). Returns whether it printed the loop.
    pub(super) fn narrow_fold_loop(
        &self,
        n: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) -> bool {
        let Some(f) = self.folded(n, None) else {
            return false;
        };
        let st = &self.program.statements[f.model.source];
        let narrow = self
            .scop
            .tensor(&st.lhs_tensor)
            .is_some_and(|t| t.dtype.is_narrow_float());
        if f.model.kind != crate::model::StmtKind::Update || !narrow {
            return false;
        }
        let pad = "  ".repeat(depth);
        // The threads that run the statement run the whole loop.
        let guard = self.statement_guard(pending, in_thread);
        let open = if guard.is_empty() {
            "{".to_string()
        } else {
            format!("if ({guard}) {{")
        };
        let _ = writeln!(out, "{pad}{open}");
        let _ = writeln!(
            out,
            "{pad}  {} pf_red = {};",
            self.printer.ctype(f.t),
            self.printer.identity(f.op, f.t)
        );
        let _ = writeln!(out, "{pad}  {}", f.steps);
        let _ = writeln!(out, "{pad}  {}", f.fold);
        let _ = writeln!(out, "{pad}}}");
        true
    }
}
