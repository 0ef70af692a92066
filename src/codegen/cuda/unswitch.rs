//! Unswitching an innermost loop on a select whose condition the loop
//! does not change.
//!
//! A rolling update's repair is guarded per element:
//! `O(i, d) = (M' == M ? O(i, d) : O(i, d) * exp(M' - M)) + ..` inside the
//! loop over `d`. Printed as it is, every one of the loop's (unrolled)
//! copies branches on `M' == M` on its own, so the compiler cannot batch
//! the loop's loads across them nor share `exp(M' - M)`. The condition
//! reads only thread-private scalars that the loop does not write, so it
//! has one value for the whole loop, and
//!
//! ```text
//!   for d: S(c ? a : b)   ==   if (c) { for d: S(a) } else { for d: S(b) }
//! ```
//!
//! exactly (the select's arms are expressions without effects, and `c` is
//! evaluated once instead of at every `d` with the same value).

use super::Ctx;
use crate::frontend::ast::{Expr, ExprKind};
use crate::isl::ast::{Expr as AstExpr, Node};

impl Ctx<'_> {
    /// A select's condition in the statements of `body` (an innermost
    /// loop's body), printed and as the program's expression, whose value
    /// the loop does not change: it reads nothing but thread-private
    /// scalars, none of which the loop's statements write. None where there is no such select, where the
    /// loop holds a loop or a mark, or where the condition is fixed
    /// already (the unswitched copies themselves).
    pub(super) fn invariant_select(&self, body: &Node) -> Option<(String, Expr)> {
        let mut users = Vec::new();
        if !innermost_statements(body, true, &mut users) {
            return None;
        }
        let views = self.printer.privates.borrow();
        let written: Vec<&str> = users
            .iter()
            .filter_map(|(stmt, _)| self.scop.statement(stmt))
            .map(|s| self.program.statements[s.source].lhs_tensor.as_str())
            .collect();
        let scalar = |t: &str| {
            views
                .get(t)
                .is_some_and(|v| v.sizes.iter().all(|s| *s == 1))
                && !written.contains(&t)
        };
        for (stmt, args) in users {
            let Some(s) = self.scop.statement(stmt) else {
                continue;
            };
            let st = &self.program.statements[s.source];
            let mut conds = Vec::new();
            selects(&st.rhs, &mut conds);
            for c in conds {
                if !reads_only(c, &scalar) {
                    continue;
                }
                if self
                    .printer
                    .fixed_selects
                    .borrow()
                    .iter()
                    .any(|(e, _)| e == c)
                {
                    continue;
                }
                let env = self.statement_env(&s.iterators, args);
                return Some((self.printer.expr(c, &env), c.clone()));
            }
        }
        None
    }
}

/// The statements of a loop body made of statements and blocks, and
/// guards where `guards` allows; false where it holds a loop or a mark (or
/// a guard it does not allow).
pub(super) fn innermost_statements<'n>(
    n: &'n Node,
    guards: bool,
    out: &mut Vec<(&'n String, &'n Vec<AstExpr>)>,
) -> bool {
    match n {
        Node::User { statement, args } => {
            out.push((statement, args));
            true
        }
        Node::Block(v) => v.iter().all(|c| innermost_statements(c, guards, out)),
        Node::If {
            then, otherwise, ..
        } => {
            guards
                && innermost_statements(then, guards, out)
                && otherwise
                    .as_deref()
                    .is_none_or(|o| innermost_statements(o, guards, out))
        }
        Node::For { .. } | Node::Mark { .. } => false,
    }
}

/// The conditions of the selects in `e`, outermost first.
fn selects<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match &e.kind {
        ExprKind::Select(c, a, b) => {
            out.push(c);
            selects(c, out);
            selects(a, out);
            selects(b, out);
        }
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => selects(a, out),
        ExprKind::Binary(_, a, b) => {
            selects(a, out);
            selects(b, out);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| selects(a, out)),
        _ => {}
    }
}

/// Whether `e` reads only tensors `ok` accepts, and no index or parameter.
fn reads_only(e: &Expr, ok: &dyn Fn(&str) -> bool) -> bool {
    match &e.kind {
        ExprKind::Number(_) | ExprKind::Inf { .. } => true,
        ExprKind::Index(_) | ExprKind::Param(_) => false,
        ExprKind::Access { tensor, .. } => ok(tensor),
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => reads_only(a, ok),
        ExprKind::Binary(_, a, b) => reads_only(a, ok) && reads_only(b, ok),
        ExprKind::Select(c, a, b) => reads_only(c, ok) && reads_only(a, ok) && reads_only(b, ok),
        ExprKind::Call(_, args) => args.iter().all(|a| reads_only(a, ok)),
    }
}
