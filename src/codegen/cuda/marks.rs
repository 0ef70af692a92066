//! Marks of the mapped tree: kernel regions, shared-memory scopes, registers, and the barriers between block-level pieces.

use super::*;

impl Ctx<'_> {
    /// Prints the subtree `body` below mark `name`: each mark the mapping
    /// left opens its part of the plan (shared copies, private and
    /// register regions, lanes, a warp's reduction, a mapping to wait for).
    pub(super) fn mark(
        &self,
        name: &str,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        match name {
            "shared" => self.shared_mark(body, depth, pending, in_thread, out),
            "nosync" => {
                let inner = Ctx {
                    nosync: true,
                    ..*self
                };
                inner.node(body, depth, pending, in_thread, out);
            }
            "registers" => match (self.mma(), self.regs) {
                (Some(c), Some(regs)) => {
                    if runs_statement(body, &c.statement) {
                        self.mma_region(c, regs, depth, out)
                    }
                }
                (Some(_), None) => {}
                (None, regs) => match regs.filter(|r| !self.names_unbound(&r.prefix_values)) {
                    Some(regs) => self.registers(regs, body, depth, pending, in_thread, out),
                    None => self.node(body, depth, pending, in_thread, out),
                },
            },
            _ if name.starts_with("private_") => {
                match self
                    .threads
                    .private
                    .iter()
                    .find(|r| r.mark == name && !self.names_unbound(&r.prefix_values))
                {
                    Some(region) => {
                        self.private_region(region, body, depth, pending, in_thread, out)
                    }
                    None => self.node(body, depth, pending, in_thread, out),
                }
            }
            _ if LaneLoop::index(name).is_some() => {
                let k = LaneLoop::index(name).unwrap_or(usize::MAX);
                match self.lanes().and_then(|l| l.get(k)) {
                    Some(l) => self.lane_loop(k, l, body, depth, pending, in_thread, out),
                    None => self.node(body, depth, pending, in_thread, out),
                }
            }
            _ if name.starts_with("reduce_x_") => {
                let iterator = format!("c{}", name.trim_start_matches("reduce_x_"));
                if !self.reduce(body, &iterator, depth, pending, out) {
                    // Not the expected shape: lane 0 runs it sequentially.
                    self.node(body, depth, pending, in_thread, out);
                }
            }
            _ => match parse_mapping_mark(name) {
                Some(m) => {
                    // With rows across lanes, below the rows' thread
                    // mapping whether or not its loop is left (a single
                    // row has none, and its mark stays pending, a guard
                    // `idx == 0`): the row's threads run what is there.
                    // Taken for code outside the threads, a row's
                    // statements inside a loop its lanes share were
                    // guarded to lane 0 and separated by barriers, which
                    // lanes with different trip counts never all reach.
                    let rows = m.0 && self.lanes().is_some();
                    let mut p = pending.to_vec();
                    p.push(m);
                    self.node(body, depth, &p, in_thread || rows, out);
                }
                None => {
                    let _ = writeln!(out, "{}/* {name} */", "  ".repeat(depth));
                    self.node(body, depth, pending, in_thread, out);
                }
            },
        }
    }

    /// The promotion point (`shared` mark): the kernel's shared copies
    /// loaded (double buffered along the loop around it where the plan
    /// says so) and read inside, where the copies' prefix is bound here.
    pub(super) fn shared_mark(
        &self,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let opens = self
            .scope()
            .is_some_and(|s| !self.in_scope && !self.names_unbound(&s.prefix_values));
        if !opens {
            self.node(body, depth, pending, in_thread, out);
            return;
        }
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}{{");
        let staged = match (self.scope(), self.step_loop) {
            (Some(scope), Some(step)) if scope.double_buffered() => {
                self.copy_in_stages(step, depth + 1, out);
                true
            }
            _ => {
                self.copy_in(depth + 1, out);
                false
            }
        };
        let inner = Ctx {
            in_scope: true,
            staged,
            step_loop: None,
            ..*self
        };
        inner.node(body, depth + 1, pending, in_thread, out);
        if staged {
            self.t.store_next_stage(self, depth + 1, out);
        }
        let _ = writeln!(out, "{pad}}}");
    }
}
