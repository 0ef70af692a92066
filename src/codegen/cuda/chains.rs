//! A thread's reduction along an unrolled loop, in four chains.
//!
//! Attention's score `P = Σ_d Q(d) K(j, d)` is, per thread, one chain of
//! `D` dependent additions: each waits for the one before (four cycles of
//! latency on the H100), and with one row per thread and few warps per
//! multiprocessor nothing else hides the wait. Where an unrolled loop
//! (constant trip count, it indexes a private array) holds one reduction
//! step into a thread-private scalar `X`,
//!
//! ```text
//!   for t:  X = X ⊕ e(t)
//!     =>  a_k = identity (k < 4);  for t: a_{t mod 4} = a_{t mod 4} ⊕ e(t);
//!         X = X ⊕ ((a_0 ⊕ a_1) ⊕ (a_2 ⊕ a_3))
//! ```
//!
//! which is the same reduction in another association order (the order
//! the warp reductions and the lanes already use); `t mod 4` is a constant
//! in each unrolled copy, so the four partial values stay in registers.

use std::fmt::Write;

use super::{CountedLoop, Ctx};
use crate::isl::ast::Node;

/// Independent partial results.
const CHAINS: i64 = 4;

impl Ctx<'_> {
    /// Prints loop `l` over `body` in four chains where it is such a
    /// reduction (module documentation); false, printing nothing, where
    /// it is not.
    pub(super) fn split_chain(
        &self,
        body: &Node,
        l: &CountedLoop,
        depth: usize,
        out: &mut String,
    ) -> bool {
        let (iterator, start, step) = (l.iterator, l.start, l.step);
        if l.trips < 2 * CHAINS {
            return false;
        }
        let mut users = Vec::new();
        if !super::unswitch::innermost_statements(body, false, &mut users) {
            return false;
        }
        let [(statement, args)] = users[..] else {
            return false;
        };
        let Some(s) = self.scop.statement(statement) else {
            return false;
        };
        let st = &self.program.statements[s.source];
        let scalar = self
            .printer
            .privates
            .borrow()
            .get(&st.lhs_tensor)
            .is_some_and(|v| v.sizes.iter().all(|n| *n == 1));
        // The step must not read the accumulator itself (beyond the
        // update's own read of it, the write and that read come first):
        // in the chains it is not the running value.
        let own = if s.kind == crate::model::StmtKind::Update {
            2
        } else {
            1
        };
        let reads_itself = s
            .accesses(self.program)
            .iter()
            .skip(own)
            .any(|a| a.tensor == st.lhs_tensor);
        if !scalar || reads_itself {
            return false;
        }
        let env = self.statement_env(&s.iterators, args);
        self.statement_overrides(statement, &env);
        let step_value = self.printer.reduction(st, &env);
        self.printer.overrides.borrow_mut().clear();
        let Some((op, t, rhs)) = step_value else {
            return false;
        };
        let pad = "  ".repeat(depth);
        let ty = self.printer.ctype(t);
        let ident = self.printer.identity(op, t);
        let slot = format!("pf_acc[(({iterator}) - {start}) / {step} % {CHAINS}]");
        let (cond_text, inc_text) = (self.e(l.cond), self.e(l.inc));
        let _ = writeln!(out, "{pad}{{");
        let idents = vec![ident; CHAINS as usize].join(", ");
        let _ = writeln!(out, "{pad}  {ty} pf_acc[{CHAINS}] = {{{idents}}};");
        let _ = writeln!(out, "{pad}  #pragma unroll");
        let _ = writeln!(
            out,
            "{pad}  for (pf_i {iterator} = {start}; {cond_text}; {iterator} += {inc_text}) {slot} = {};",
            self.printer.combine(op, t, &slot, &rhs)
        );
        let pair = |a: &str, b: &str| format!("({})", self.printer.combine(op, t, a, b));
        let all = pair(
            &pair("pf_acc[0]", "pf_acc[1]"),
            &pair("pf_acc[2]", "pf_acc[3]"),
        );
        let _ = writeln!(out, "{pad}  {}", self.printer.fold_into_lhs(st, &env, &all));
        let _ = writeln!(out, "{pad}}}");
        true
    }
}
