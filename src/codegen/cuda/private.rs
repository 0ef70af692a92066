//! Private arrays (`gpu::private`): a region's buffers, their declarations, copies in and out, and the statements that index them.

use super::*;

impl Ctx<'_> {
    /// The thread-private region (see `gpu::private`): declare each
    /// array, load the elements that come from outside the kernel, run
    /// `body` on the arrays, store the elements that leave it. Elements of
    /// a box outside the tensor are neither loaded nor stored.
    pub(super) fn private_region(
        &self,
        region: &PrivateRegion,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}{{");
        for (d, v) in region.prefix_values.iter().enumerate() {
            if let Some(v) = v {
                let _ = writeln!(out, "{pad}  const pf_i c{d} = {}; (void)c{d};", self.e(v));
            }
        }
        // A region isl printed in several pieces (one iteration of the
        // thread loops split by the AST into separate code) passes its
        // values from piece to piece through memory: each piece loads and
        // stores every array (the boxes are exact and the thread's own).
        let repeated = self.repeated_private.contains(&region.mark);
        let arrays: Vec<PrivateBuffer> = region
            .arrays
            .iter()
            .map(|a| self.private_buffer(a, repeated))
            .collect();
        let views = self.declare_private_arrays(region, &arrays, depth, out);
        // The copies run on the threads that run the region's statements
        // (thread 0 where a thread loop above was not generated): another
        // thread's copy was never computed.
        let store_guard = self.statement_guard(pending, in_thread);
        // With lanes sharing the rows, every lane keeps its own copy (and
        // lane 0 stores it).
        let load_guard = if self.lanes().is_some() && in_thread {
            self.guard(pending)
        } else {
            store_guard.clone()
        };
        // An array's copies are made only in the iterations that own its
        // box (the plan's condition).
        let owned = |guard: &str, a: &crate::gpu::private::PrivateArray| -> String {
            match &a.owned {
                None => guard.to_string(),
                Some(c) if guard.is_empty() => format!("({})", self.e(c)),
                Some(c) => format!("{guard} && ({})", self.e(c)),
            }
        };
        for (k, a) in region.arrays.iter().enumerate() {
            if a.load || repeated {
                let convert = match (arrays[k].wide, a.dtype.narrow_conversions()) {
                    (true, Some((widen, _))) => widen,
                    _ => "",
                };
                let guard = owned(&load_guard, a);
                self.private_copies(
                    region,
                    k,
                    &arrays[k].name,
                    depth,
                    &guard,
                    false,
                    out,
                    &|p, g| format!("{p} = {convert}({g});"),
                );
            }
        }
        self.private_body(views, body, depth, pending, in_thread, out);
        for (k, a) in region.arrays.iter().enumerate() {
            if a.store || repeated {
                let convert = match (arrays[k].wide, a.dtype.narrow_conversions()) {
                    (true, Some((_, narrow))) => Some(narrow),
                    _ => None,
                };
                let guard = owned(&store_guard, a);
                self.private_copies(
                    region,
                    k,
                    &arrays[k].name,
                    depth,
                    &guard,
                    true,
                    out,
                    &|p, g| match convert {
                        Some(f) => format!("{g} = {f}({p});"),
                        None => format!("{g} = {p};"),
                    },
                );
            }
        }
        let _ = writeln!(out, "{pad}}}");
    }

    /// How a private array is held: its buffer's name and whether it is
    /// widened to f32.
    ///
    /// A read-only copy of an f16 or bf16 input is held in f32, converted
    /// once when it is loaded, not at every read (attention reads each
    /// element of its query row once per key). Its view tells the printer
    /// to read it without conversion (`PrivateView::unconverted`); its name
    /// starts with `WIDE_REGISTER_PREFIX`, for the reader of the CUDA. Not
    /// in a repeated region: that stores every array back to its tensor,
    /// which holds f16 or bf16.
    ///
    /// An f16 or bf16 array the region writes is held in f32 too, and
    /// rounded once when it is stored: a reduction into it accumulates in
    /// f32, as the declared-precision run and every other path do (held in
    /// its storage type, each step rounded the running value: the fuzzer's
    /// f16 private-accumulator find, 1.6e-2 against 1e-2).
    pub(super) fn private_buffer(
        &self,
        a: &crate::gpu::private::PrivateArray,
        repeated: bool,
    ) -> PrivateBuffer {
        let read_only_input = self.t.widens_inputs()
            && a.load
            && !a.store
            && self
                .program
                .tensor(&a.tensor)
                .is_some_and(|t| t.role == crate::frontend::ast::TensorRole::Input);
        let wide = !repeated && a.dtype.is_narrow_float() && (read_only_input || a.store);
        let name = if wide {
            a.buffer
                .replacen("pf_", crate::codegen::expr::WIDE_REGISTER_PREFIX, 1)
        } else {
            a.buffer.clone()
        };
        PrivateBuffer { name, wide }
    }

    /// Declares the region's arrays and their box offsets; returns how the
    /// printer addresses each tensor inside the region.
    pub(super) fn declare_private_arrays(
        &self,
        region: &PrivateRegion,
        arrays: &[PrivateBuffer],
        depth: usize,
        out: &mut String,
    ) -> std::collections::HashMap<String, crate::codegen::expr::PrivateView> {
        let pad = "  ".repeat(depth);
        let mut views = std::collections::HashMap::new();
        for (k, a) in region.arrays.iter().enumerate() {
            let storage = if arrays[k].wide {
                "float"
            } else {
                self.t.storage_type(a.dtype)
            };
            let buffer = &arrays[k].name;
            let offsets: Vec<String> = (0..a.offset.len())
                .map(|d| format!("pf_p{k}_{d}"))
                .collect();
            for (d, o) in a.offset.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{pad}  const pf_i {} = {}; (void){};",
                    offsets[d],
                    self.e(o),
                    offsets[d]
                );
            }
            let len: i64 = a.sizes.iter().product();
            if a.is_scalar() {
                let _ = writeln!(out, "{pad}  {storage} {buffer};");
            } else {
                let _ = writeln!(out, "{pad}  {storage} {buffer}[{len}];");
            }
            views.insert(
                a.tensor.clone(),
                crate::codegen::expr::PrivateView {
                    buffer: buffer.clone(),
                    unconverted: arrays[k].wide,
                    sizes: a.sizes.clone(),
                    offset: offsets,
                },
            );
        }
        views
    }

    /// The region's body with its arrays in view, and the rows of inputs
    /// the lanes read in several loops of the row held in registers (see
    /// `lanes::RowCache`).
    pub(super) fn private_body(
        &self,
        views: std::collections::HashMap<String, crate::codegen::expr::PrivateView>,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let outer = self.printer.privates.borrow().clone();
        self.printer.privates.borrow_mut().extend(views);
        let caches = if self.lanes().is_some()
            && in_thread
            && matches!(self.threads.lane_axis, crate::gpu::lanes::LaneAxis::X)
        {
            self.row_caches(body)
        } else {
            Vec::new()
        };
        self.declare_row_caches(&caches, depth + 1, out);
        let inner = Ctx {
            row_caches: &caches,
            ..*self
        };
        inner.node(body, depth + 1, pending, in_thread, out);
        *self.printer.privates.borrow_mut() = outer;
    }

    /// One loop nest over the box of array `k` (held in `buffer`),
    /// `statement(private, global)` at each element inside the tensor and
    /// where `guard` holds.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn private_copies(
        &self,
        region: &PrivateRegion,
        k: usize,
        buffer: &str,
        depth: usize,
        guard: &str,
        write: bool,
        out: &mut String,
        statement: &dyn Fn(&str, &str) -> String,
    ) {
        let a = &region.arrays[k];
        let tensor = self
            .scop
            .tensor(&a.tensor)
            .expect("private arrays come from the model");
        let mut inner = depth + 1;
        let mut conds = Vec::new();
        let mut global = String::new();
        let mut local = String::new();
        for (d, size) in a.sizes.iter().enumerate() {
            let g = if *size == 1 {
                format!("pf_p{k}_{d}")
            } else {
                self.t.unroll(&"  ".repeat(inner), out);
                let _ = writeln!(
                    out,
                    "{}for (int pf_l{d} = 0; pf_l{d} < {size}; pf_l{d}++) {{",
                    "  ".repeat(inner)
                );
                inner += 1;
                local = if local.is_empty() {
                    format!("pf_l{d}")
                } else {
                    format!("({local}) * {size} + pf_l{d}")
                };
                format!("(pf_p{k}_{d} + pf_l{d})")
            };
            let extent = self
                .printer
                .affine(&tensor.shape[d], &std::collections::HashMap::new());
            conds.push(format!("{g} >= 0 && {g} < {extent}"));
            global = if d == 0 {
                g
            } else {
                format!("({global}) * {extent} + {g}")
            };
        }
        if global.is_empty() {
            global = "0".into();
        }
        let private = if local.is_empty() {
            buffer.to_string()
        } else {
            format!("{buffer}[{local}]")
        };
        if !guard.is_empty() {
            conds.push(guard.to_string());
        }
        let cond = if conds.is_empty() {
            "1".to_string()
        } else {
            conds.join(" && ")
        };
        let el = self.global_element(&a.tensor, &global, Some(write));
        let _ = writeln!(
            out,
            "{}if ({cond}) {}",
            "  ".repeat(inner),
            statement(&private, &el)
        );
        for _ in a.sizes.iter().filter(|s| **s != 1) {
            inner -= 1;
            let _ = writeln!(out, "{}}}", "  ".repeat(inner));
        }
    }

    /// Whether loop `iterator` over `body` moves the subscript of a
    /// non-scalar private array along one of its box dimensions (then the
    /// loop is unrolled: see `private_region`).
    pub(super) fn indexes_private(&self, body: &Node, iterator: &str) -> bool {
        let views = self.printer.privates.borrow();
        if views.values().all(|v| v.sizes.iter().all(|s| *s == 1)) {
            return false;
        }
        type Views = std::collections::HashMap<String, crate::codegen::expr::PrivateView>;
        fn walk(c: &Ctx, views: &Views, n: &Node, name: &str) -> bool {
            match n {
                Node::User { statement, args } => {
                    let Some(s) = c.scop.statement(statement) else {
                        return false;
                    };
                    s.accesses(c.program).iter().any(|acc| {
                        let Some(a) = views.get(&acc.tensor) else {
                            return false;
                        };
                        acc.subscripts.iter().enumerate().any(|(d, sub)| {
                            a.sizes[d] > 1
                                && sub.terms.iter().any(|(var, _)| {
                                    s.iterators
                                        .iter()
                                        .position(|i| i == var)
                                        .and_then(|p| args.get(p))
                                        .is_some_and(|e| e.mentions(name))
                                })
                        })
                    })
                }
                other => other
                    .children()
                    .into_iter()
                    .any(|x| walk(c, views, x, name)),
            }
        }
        walk(self, &views, body, iterator)
    }

    /// Whether a region whose outer iterators have the unique values
    /// `values` (None: several values) would name an iterator that no loop
    /// around this point defines. isl prints no loop for a dimension with a
    /// single value in one piece of a loop it split (the initialisation
    /// before a split-k slice's loop, for instance); that piece then runs
    /// its statements without the region (on global memory), which is
    /// correct, instead of printing code that names an undefined iterator.
    pub(super) fn names_unbound(&self, values: &[Option<Expr>]) -> bool {
        values.iter().enumerate().any(|(d, v)| {
            let name = format!("c{d}");
            v.is_none() && !self.bound.contains(&name)
        })
    }
}
