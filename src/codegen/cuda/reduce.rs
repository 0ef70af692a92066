//! A reduction across the threads of a block or the lanes of a warp (`Ctx::reduce`).

use super::*;

impl Ctx<'_> {
    /// Prints the reduction loop `iterator` in `body` across the lanes of a
    /// warp: each lane folds its share of the loop (lane `l` takes
    /// iterations `l, l + 32, ...`) into a private partial result, the
    /// partials are combined with shuffles (on the CPU: one after the
    /// other), and lane 0 folds the total into the accumulator. Returns
    /// false (printing nothing) when `body` is not one loop over guards and
    /// a single update statement.
    pub(super) fn reduce(
        &self,
        body: &Node,
        iterator: &str,
        depth: usize,
        pending: &[Pending],
        out: &mut String,
    ) -> bool {
        // Guards around the loop are printed as they are.
        if let Node::If {
            cond,
            then,
            otherwise: None,
        } = body
        {
            let mut inner = String::new();
            if !self.reduce(then, iterator, depth + 1, pending, &mut inner) {
                return false;
            }
            let pad = "  ".repeat(depth);
            let _ = writeln!(out, "{pad}if ({}) {{", self.e(cond));
            out.push_str(&inner);
            let _ = writeln!(out, "{pad}}}");
            return true;
        }
        let Node::For {
            iterator: it,
            init,
            cond,
            inc,
            body: loop_body,
        } = body
        else {
            return false;
        };
        if it != iterator {
            return false;
        }
        // The loop body: guards and sequential loops (the reduction's
        // other members, which each lane runs whole for its share of this
        // loop, as `mapping::reduction_site` plans), around one update
        // statement.
        let Some(Folded {
            op,
            t,
            steps: guarded,
            fold,
            ..
        }) = self.folded(loop_body, Some(iterator))
        else {
            return false;
        };
        let pad = "  ".repeat(depth);
        let ty = self.printer.ctype(t);
        let ident = self.printer.identity(op, t);
        // Four lanes' worth of steps at once, into four partial results,
        // while the fourth step is still inside the loop (isl's loop
        // conditions are upper bounds, so the three before it are too):
        // four independent chains keep four loads in flight per lane.
        let ahead = match inc {
            Expr::Int(step) => Some(self.e(&shift(cond, iterator, 3 * 32 * step))),
            _ => None,
        };
        let stride = match inc {
            Expr::Int(v) => *v,
            _ => 1,
        };
        let (init, cond, inc) = (self.e(init), self.e(cond), self.e(inc));
        // One lane's share, `lane` naming the lane: iterations `lane, lane +
        // 32, ...` folded into `pf_red`, four at a time into four chains
        // while the fourth is still inside the loop. The CPU emulation runs
        // the same code for each lane, so CI executes it.
        let per_lane = |out: &mut String, pad: &str, lane: &str| {
            let _ = writeln!(out, "{pad}{ty} pf_red = {ident};");
            let _ = writeln!(out, "{pad}pf_i {iterator} = {init} + {lane} * {inc};");
            if let Some(ahead) = &ahead {
                let _ = writeln!(
                    out,
                    "{pad}{ty} pf_red1 = {ident}, pf_red2 = {ident}, pf_red3 = {ident};"
                );
                let _ = writeln!(
                    out,
                    "{pad}for (; {ahead}; {iterator} += {}) {{",
                    4 * 32 * stride
                );
                let _ = writeln!(out, "{pad}  {guarded}");
                for k in 1..4 {
                    let _ = writeln!(
                        out,
                        "{pad}  {{ const pf_i pf_c = {iterator} + {}; {{ const pf_i {iterator} = pf_c; {} }} }}",
                        k * 32 * stride,
                        guarded.replace("pf_red", &format!("pf_red{k}"))
                    );
                }
                let _ = writeln!(out, "{pad}}}");
                let c01 = self.printer.combine(op, t, "pf_red", "pf_red1");
                let c23 = self.printer.combine(op, t, "pf_red2", "pf_red3");
                let all = self.printer.combine(op, t, "pf_red", "pf_red2");
                let _ = writeln!(out, "{pad}pf_red = {c01};");
                let _ = writeln!(out, "{pad}pf_red2 = {c23};");
                let _ = writeln!(out, "{pad}pf_red = {all};");
            }
            let _ = writeln!(
                out,
                "{pad}for (; {cond}; {iterator} += 32 * {inc}) {guarded}"
            );
        };
        let _ = writeln!(out, "{pad}{{");
        let r = WarpReduce {
            pad: &pad,
            ty,
            ident: &ident,
            op,
            t,
            fold: &fold,
            pending,
            per_lane: &per_lane,
        };
        self.t.warp_reduce(self, &r, out);
        let _ = writeln!(out, "{pad}}}");
        true
    }
}
