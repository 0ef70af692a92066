//! Statements: one instance printed with its accesses (overridden by registers, private arrays and shared tiles), its owner thread and its guards.

use super::*;

impl Ctx<'_> {
    /// A statement of the AST: printed with the overrides of where it is
    /// (shared copies, registers, lanes), on the thread and register slot
    /// that own its element in a register tile, else under the guard of
    /// the mappings still pending.
    pub(super) fn statement(
        &self,
        statement: &str,
        args: &[Expr],
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        if self.in_regs
            && self.regs.is_some_and(|r| {
                r.init.as_ref().is_some_and(|i| i.statement == statement)
                    || r.store.iter().any(|e| e.statement == statement)
            })
        {
            // Hoisted to the start of the register region, or run where
            // its registers are stored (`registers::store_statements`).
            return;
        }
        let s = self
            .scop
            .statement(statement)
            .expect("AST statements come from the model");
        let env = self.statement_env(&s.iterators, args);
        let st = &self.program.statements[s.source];
        self.statement_overrides(statement, &env);
        if self.store_in_fours {
            let subs: Vec<Affine> = st.lhs_indices.iter().map(|i| Affine::var(i)).collect();
            self.printer.overrides.borrow_mut().insert(
                crate::model::AccessKey::new(&st.lhs_tensor, &subs),
                "pf_vs[pf_r]".into(),
            );
        }
        let text = self.printer.statement(st, s.kind, &env);
        self.printer.overrides.borrow_mut().clear();
        if let Some((regs, axes, lost)) = self.lost_owner(statement, pending) {
            // The mappings along the axes the element moves on are the
            // owner's to run.
            let pending: Vec<Pending> = pending
                .iter()
                .filter(|p| !(p.0 && lost.contains(&p.1)))
                .cloned()
                .collect();
            let subs: Vec<String> = s
                .accesses(self.program)
                .iter()
                .find(|a| a.tensor == regs.tensor)
                .map(|a| {
                    a.subscripts
                        .iter()
                        .map(|e| self.printer.affine(e, &env))
                        .collect()
                })
                .unwrap_or_default();
            self.owned_statement(
                regs,
                &axes,
                &lost,
                &subs,
                &self.with_slot_tests(self.guard(&pending), None),
                in_thread,
                &text,
                depth,
                out,
            );
            return;
        }
        let guard = if self.all_lanes(s) && in_thread {
            self.guard(pending)
        } else {
            self.statement_guard(pending, in_thread)
        };
        // At a clamped slot (its register dead: the element beyond the
        // tensor, or no statement of the tile's there), a statement that
        // allows it runs at the clamped point without a test.
        let guard = self.with_slot_tests(guard, Some(statement));
        if guard.is_empty() {
            let _ = writeln!(out, "{pad}{text}");
        } else {
            let _ = writeln!(out, "{pad}if ({guard}) {text}");
        }
    }

    /// A statement on the register tile whose thread loop isl did not
    /// generate (the member has one value here, folded into the
    /// statement's arguments) must run on the thread and register slot
    /// that own its element, not on thread 0: the tile, its thread axes,
    /// and the pending axes whose loop was lost. `None` elsewhere.
    pub(super) fn lost_owner(
        &self,
        statement: &str,
        pending: &[Pending],
    ) -> Option<(&RegisterTile, Vec<char>, Vec<char>)> {
        let regs = self
            .regs
            .filter(|r| self.in_regs && r.accesses.iter().any(|(st, _)| st == statement))?;
        let nt = regs.thread_dims;
        let axes: Vec<char> = (0..nt).map(|j| ['x', 'y', 'z'][nt - 1 - j]).collect();
        let owned_axes = regs.owned_axes();
        let lost: Vec<char> = pending
            .iter()
            .filter(|p| p.0 && owned_axes.contains(&p.1))
            .map(|p| p.1)
            .collect();
        (!lost.is_empty()).then_some((regs, axes, lost))
    }

    /// `text`, a statement on register tile `regs` reached where the
    /// thread loops of axes `lost` were not generated: every thread tries
    /// each of its register slots along those axes and runs `text` on the
    /// one whose element (`regs.element`) is the statement's (`subs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn owned_statement(
        &self,
        regs: &RegisterTile,
        axes: &[char],
        lost: &[char],
        subs: &[String],
        guard: &str,
        in_thread: bool,
        text: &str,
        depth: usize,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}{{");
        let (inner, mut conds) = self.open_slots(regs, axes, lost, depth + 1, out);
        for (d, e) in regs.element.iter().enumerate() {
            if let Some(sub) = subs.get(d) {
                conds.push(format!("({}) == {sub}", self.e(e)));
            }
        }
        if !guard.is_empty() {
            conds.push(guard.to_string());
        }
        if !in_thread && self.has_threads() {
            // Axes outside the tile: their thread 0.
            for a in ['x', 'y', 'z'] {
                if !axes.contains(&a) {
                    conds.extend(self.t.index_zero(true, a));
                }
            }
        }
        let _ = writeln!(
            out,
            "{}if ({}) {text}",
            "  ".repeat(inner),
            conds.join(" && ")
        );
        for d in (depth + 1..inner).rev() {
            let _ = writeln!(out, "{}}}", "  ".repeat(d));
        }
        let _ = writeln!(out, "{pad}}}");
    }

    /// Sets the printer's overrides for `statement` at `env`: reads of
    /// shared copies, register tiles, cached rows and runs loaded ahead.
    pub(super) fn statement_overrides(
        &self,
        statement: &str,
        env: &std::collections::HashMap<String, String>,
    ) {
        if let (true, Some(scope)) = (self.in_scope, self.scope()) {
            let mut o = self.printer.overrides.borrow_mut();
            o.clear();
            for ((stmt, key), (k, subs)) in &scope.accesses {
                if stmt != statement {
                    continue;
                }
                let a = &scope.arrays[*k];
                let idx: Vec<String> = subs
                    .iter()
                    .zip(&a.layout.pitch)
                    .enumerate()
                    .map(|(d, (e, p))| {
                        format!("({} - pf_o{k}_{d}) * {p}", self.printer.affine(e, env))
                    })
                    .collect();
                let idx = if idx.is_empty() {
                    "0".to_string()
                } else {
                    idx.join(" + ")
                };
                let stage = if self.staged {
                    this_stage(a)
                } else {
                    String::new()
                };
                let el = if self.race() {
                    let slot = self.scop.tensors.len() + k;
                    format!("{}[pf_race_r({slot}, {stage}{idx})]", a.buffer)
                } else {
                    format!("{}[{stage}{idx}]", a.buffer)
                };
                o.insert(key.clone(), el.into());
            }
        }
        if let (true, Some(regs)) = (self.in_regs, self.regs) {
            let mut o = self.printer.overrides.borrow_mut();
            for (stmt, key) in &regs.accesses {
                if stmt == statement {
                    o.insert(key.clone(), self.register_element(regs));
                }
            }
        }
        self.cached_row_reads();
        {
            let mut o = self.printer.overrides.borrow_mut();
            for (stmt, key, element) in self.printer.run_reads.borrow().iter() {
                if stmt == statement {
                    o.insert(key.clone(), element.clone().into());
                }
            }
        }
    }

    /// Forgets the last `n` run reads (those of the loop just printed).
    pub(super) fn drop_run_reads(&self, n: usize) {
        let mut reads = self.printer.run_reads.borrow_mut();
        let kept = reads.len() - n;
        reads.truncate(kept);
    }

    /// The C text of each of a statement's iterators at an AST call
    /// (`args`, the statement's arguments there).
    pub(super) fn statement_env(
        &self,
        iterators: &[String],
        args: &[Expr],
    ) -> std::collections::HashMap<String, String> {
        iterators
            .iter()
            .zip(args)
            .map(|(i, a)| (i.clone(), self.e(a)))
            .collect()
    }

    /// The threads that run a statement printed here: with `pending`
    /// mappings whose loops were not generated, index 0 of each; outside
    /// the thread loops, thread 0; in a warp-reduced kernel, lane 0.
    /// Empty: every thread (and always in the emulation).
    pub(super) fn statement_guard(&self, pending: &[Pending], in_thread: bool) -> String {
        let zero: &[char] = if !in_thread && self.has_threads() {
            &['x', 'y', 'z']
        } else if in_thread && self.threads.reduce_x {
            match self.threads.lane_axis {
                crate::gpu::lanes::LaneAxis::X => &['x'],
                crate::gpu::lanes::LaneAxis::Y(_) => &['y'],
            }
        } else {
            &[]
        };
        let guard = self.guard(pending);
        (!guard.is_empty())
            .then_some(guard)
            .into_iter()
            .chain(zero.iter().filter_map(|a| self.t.index_zero(true, *a)))
            .collect::<Vec<_>>()
            .join(" && ")
    }

    /// `idx == 0` for every mapping in `pending` (their loops have a single
    /// iteration, which one index runs).
    pub(super) fn guard(&self, pending: &[Pending]) -> String {
        pending
            .iter()
            .filter_map(|p| self.t.index_zero(p.0, p.1))
            .collect::<Vec<_>>()
            .join(" && ")
    }
}
