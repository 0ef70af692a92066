//! Register tiles on the SIMT units and tensor-core regions: their slots, loads, stores and the contraction's engine.

use super::*;

impl Ctx<'_> {
    /// The register of the current thread point: `pf_reg[pf_ry][pf_rx]` (on
    /// the CPU also indexed by the emulated thread), read and written
    /// without conversion (`expr::Element::unconverted`).
    pub(super) fn register_element(&self, regs: &RegisterTile) -> crate::codegen::expr::Element {
        let nt = regs.thread_dims;
        let axes: Vec<char> = (0..nt).map(|j| ['x', 'y', 'z'][nt - 1 - j]).collect();
        let mut idx = self.t.thread_row(&axes);
        for a in &axes {
            let _ = write!(idx, "[pf_r{a}]");
        }
        crate::codegen::expr::Element::unconverted(format!("{}{idx}", regs.buffer))
    }

    /// The register region: declare the registers, load the thread's
    /// elements (those inside the tensor), run `body` on them, store them.
    pub(super) fn registers(
        &self,
        regs: &RegisterTile,
        body: &Node,
        depth: usize,
        pending: &[Pending],
        in_thread: bool,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let nt = regs.thread_dims;
        let counts = regs.counts(self.plan.block);
        let axes: Vec<char> = (0..nt).map(|j| ['x', 'y', 'z'][nt - 1 - j]).collect();
        let tensor = self
            .scop
            .tensor(&regs.tensor)
            .expect("register tiles come from the model");
        // f16 and bf16 elements are held in f32 (see
        // `expr::WIDE_REGISTER_PREFIX`): converted when loaded and stored.
        let narrow = regs.dtype.is_narrow_float();
        let storage = if narrow {
            "float"
        } else {
            self.t.storage_type(regs.dtype)
        };
        let (widen, narrow_to) = regs.dtype.narrow_conversions().unwrap_or(("", ""));
        let (qualifier, mut dims) = self.t.thread_rows(self.plan.block, &axes);
        for c in &counts {
            let _ = write!(dims, "[{c}]");
        }
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  {qualifier}{storage} {}{dims};", regs.buffer);
        // The loops over the thread's elements, with the element's
        // subscripts and the test that it lies inside the tensor.
        let each =
            |out: &mut String, write: Option<bool>, statement: &dyn Fn(&str, &str) -> String| {
                let open = |out: &mut String, depth: usize, text: String| {
                    let _ = writeln!(out, "{}{text}", "  ".repeat(depth));
                };
                let (mut depth, mut conds) = self.open_slots(regs, &axes, &axes, depth + 1, out);
                let mut global = String::new();
                for (d, e) in regs.element.iter().enumerate() {
                    let extent = self
                        .printer
                        .affine(&tensor.shape[d], &std::collections::HashMap::new());
                    open(out, depth, format!("const pf_i pf_g{d} = {};", self.e(e)));
                    conds.push(format!("pf_g{d} >= 0 && pf_g{d} < {extent}"));
                    global = if d == 0 {
                        format!("pf_g{d}")
                    } else {
                        format!("({global}) * {extent} + pf_g{d}")
                    };
                }
                if global.is_empty() {
                    global = "0".into();
                }
                if let Some(g) = &regs.guard {
                    conds.push(format!("({})", self.e(g)));
                }
                let cond = if conds.is_empty() {
                    "1".to_string()
                } else {
                    conds.join(" && ")
                };
                let el = self.global_element(&regs.tensor, &global, write);
                open(
                    out,
                    depth,
                    format!(
                        "if ({cond}) {}",
                        statement(&self.register_element(regs).text, &el)
                    ),
                );
                for _ in &axes {
                    depth -= 1;
                    open(out, depth, "}".into());
                }
            };
        // A thread axis whose loop isl did not generate (a single point)
        // is register 0 of thread 0; counted loops shadow these.
        for a in &axes {
            let _ = writeln!(out, "{pad}  const int pf_r{a} = 0; (void)pf_r{a};");
            self.t.thread_zero(*a, &format!("{pad}  "), out);
        }
        // Unique values of the block iterators isl generated no loop for.
        for (d, v) in regs.prefix_values.iter().enumerate() {
            if let Some(v) = v {
                let _ = writeln!(out, "{pad}  const pf_i c{d} = {}; (void)c{d};", self.e(v));
            }
        }
        match &regs.init {
            // The registers start at the reducer's identity (see
            // `registers::hoistable_init`); the initialisation statement is
            // skipped inside the loops.
            Some(init) => {
                let value = self.printer.stored_identity(init.reducer, regs.dtype);
                each(out, None, &|reg, _| format!("{reg} = {value};"));
            }
            None => each(out, Some(false), &|reg, el| {
                format!("{reg} = {widen}({el});")
            }),
        }
        let inner = Ctx {
            in_regs: true,
            ..*self
        };
        match self.full_tile_test(regs, body) {
            Some(tile) if tile.whole_box => {
                let full = Ctx {
                    full_tile: Some(&tile),
                    ..inner
                };
                full.node(body, depth + 1, pending, in_thread, out);
            }
            Some(tile) => {
                // Full tiles (most of them) without bound tests, so that
                // the compiler can keep operands in registers across a
                // thread's points; partial tiles with them.
                let _ = writeln!(out, "{pad}  if ({}) {{", tile.test);
                let full = Ctx {
                    full_tile: Some(&tile),
                    ..inner
                };
                full.node(body, depth + 2, pending, in_thread, out);
                let _ = writeln!(out, "{pad}  }} else {{");
                inner.node(body, depth + 2, pending, in_thread, out);
                let _ = writeln!(out, "{pad}  }}");
            }
            None => inner.node(body, depth + 1, pending, in_thread, out),
        }
        let epilogue = self.store_statements(regs);
        each(out, Some(true), &|reg, el| {
            if epilogue.is_empty() {
                format!("{el} = {narrow_to}({reg});")
            } else {
                format!("{{ {epilogue}{el} = {narrow_to}({reg}); }}")
            }
        });
        let _ = writeln!(out, "{pad}}}");
    }

    /// The statements `regs` runs where its registers are stored (see
    /// `gpu::registers::store_statements`), in order, on the slot's
    /// element `pf_g<d>` and its register, as one line.
    pub(super) fn store_statements(&self, regs: &RegisterTile) -> String {
        let mut text = String::new();
        for e in &regs.store {
            let Some(s) = self.scop.statement(&e.statement) else {
                continue;
            };
            let env: std::collections::HashMap<String, String> = s
                .iterators
                .iter()
                .zip(&e.element_dims)
                .map(|(it, d)| (it.clone(), format!("pf_g{d}")))
                .collect();
            {
                let mut o = self.printer.overrides.borrow_mut();
                o.clear();
                for (stmt, key) in &regs.accesses {
                    if *stmt == e.statement {
                        o.insert(key.clone(), self.register_element(regs));
                    }
                }
            }
            let st = &self.program.statements[s.source];
            let line = self.printer.statement(st, s.kind, &env);
            self.printer.overrides.borrow_mut().clear();
            let _ = write!(text, "{} ", line.trim());
        }
        text
    }

    /// The register region of a contraction on tensor cores (see
    /// `codegen::mma`): the block's tile origins are the block iterators
    /// (each band member is one iterator of the statement), operand
    /// elements are addressed through the statement's subscripts, and the
    /// output through the register tile's element map.
    pub(super) fn mma_region(
        &self,
        c: &Contraction,
        regs: &RegisterTile,
        depth: usize,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}{{");
        for (d, v) in regs.prefix_values.iter().enumerate() {
            if let Some(v) = v {
                let _ = writeln!(out, "{pad}  const pf_i c{d} = {}; (void)c{d};", self.e(v));
            }
        }
        let subst = |e: &Expr, map: &[(String, String)]| {
            e.replace_ids(&|s| {
                map.iter()
                    .find(|(k, _)| k == s)
                    .map(|(_, v)| Expr::Id(v.clone()))
            })
        };
        let tensor = self
            .scop
            .tensor(&regs.tensor)
            .expect("register tiles come from the model");
        let no_env = std::collections::HashMap::new();
        let c_element = |lm: &str, ln: &str| -> String {
            let mut map: Vec<(String, String)> = regs
                .block_iterators
                .iter()
                .enumerate()
                .map(|(j, it)| (format!("pf_b{j}"), it.clone()))
                .collect();
            let nb = regs.block_iterators.len();
            for j in 0..nb {
                let local = match (nb - j) as i64 {
                    2 => lm.to_string(),
                    1 => ln.to_string(),
                    _ => "0".to_string(),
                };
                map.push((format!("pf_t{j}"), local));
            }
            let mut global = String::new();
            for (d, e) in regs.element.iter().enumerate() {
                let g = self.e(&subst(e, &map));
                global = if d == 0 {
                    g
                } else {
                    let extent = self.printer.affine(&tensor.shape[d], &no_env);
                    format!("({global}) * {extent} + {g}")
                };
            }
            if global.is_empty() {
                global = "0".into();
            }
            self.printer.globals.note(&regs.tensor);
            format!("{}[{global}]", tensor_name(&regs.tensor))
        };
        let address =
            |x: &crate::gpu::contraction::Operand, row_it: &str, k_it: &str, batch: &[String]| {
                let x = x.clone();
                let row_it = row_it.to_string();
                let k_it = k_it.to_string();
                // A batch iterator's value is its block iterator's (tiles of
                // one point).
                let batch: Vec<(String, String)> = batch
                    .iter()
                    .cloned()
                    .zip(regs.block_iterators.iter().cloned())
                    .collect();
                move |row: &str, k: &str| -> String {
                    let mut env: std::collections::HashMap<String, String> = [
                        (row_it.clone(), row.to_string()),
                        (k_it.clone(), k.to_string()),
                    ]
                    .into_iter()
                    .collect();
                    env.extend(batch.iter().cloned());
                    format!("&{}", self.printer.element(&x.tensor, &x.subscripts, &env))
                }
            };
        let a_address = address(&c.a, &c.m, &c.k, &c.batch);
        let b_address = address(&c.b, &c.n, &c.k, &c.batch);
        // The further sums' operands, by their own iterators.
        type Address<'x> = Box<dyn Fn(&str, &str) -> String + 'x>;
        let term_addresses: Vec<(Address, Address)> = c
            .terms
            .iter()
            .map(|t| {
                (
                    Box::new(address(&t.a, &t.m, &t.k, &t.batch)) as Address,
                    Box::new(address(&t.b, &t.n, &t.k, &t.batch)) as Address,
                )
            })
            .collect();
        // The epilogue: each statement on the element's value `pf_cv`;
        // one that moves it into another tensor sets `pf_dv`.
        let mut epilogue = String::new();
        let nb = regs.block_iterators.len();
        let epilogue_env = |iterators: &[String], lm: &str, ln: &str| {
            iterators
                .iter()
                .enumerate()
                .map(|(j, it)| {
                    let v = match (nb - j) as i64 {
                        2 => format!("pf_m0 + {lm}"),
                        1 => format!("pf_n0 + {ln}"),
                        _ => regs.block_iterators[j].clone(),
                    };
                    (it.clone(), v)
                })
                .collect::<std::collections::HashMap<String, String>>()
        };
        let mut moved_to: Option<(String, Vec<crate::frontend::ast::Affine>, Vec<String>)> = None;
        for e in &c.epilogue {
            let Some(s) = self.scop.statement(&e.statement) else {
                continue;
            };
            let st = &self.program.statements[s.source];
            let env = epilogue_env(&e.iterators, "pf_lm", "pf_ln");
            let lhs: Vec<crate::frontend::ast::Affine> = st
                .lhs_indices
                .iter()
                .map(|i| crate::frontend::ast::Affine::var(i))
                .collect();
            let element: Vec<crate::frontend::ast::Affine> = e
                .element
                .iter()
                .map(|i| crate::frontend::ast::Affine::var(i))
                .collect();
            self.printer.overrides.borrow_mut().insert(
                crate::model::AccessKey::new(&regs.tensor, &element),
                "pf_cv".into(),
            );
            // The statement the gpu stage chose to move the value out
            // (`Contraction::stored`): the one that writes that tensor.
            if c.stored != regs.tensor && st.lhs_tensor == c.stored {
                self.printer.overrides.borrow_mut().insert(
                    crate::model::AccessKey::new(&st.lhs_tensor, &lhs),
                    "pf_dv".into(),
                );
                moved_to = Some((st.lhs_tensor.clone(), lhs, e.iterators.clone()));
            }
            let _ = writeln!(epilogue, "{}", self.printer.statement(st, s.kind, &env));
            self.printer.overrides.borrow_mut().clear();
        }
        let moved_element = |lm: &str, ln: &str| -> String {
            let Some((tensor, lhs, iterators)) = &moved_to else {
                return String::new();
            };
            let env = epilogue_env(iterators, lm, ln);
            self.printer.element(tensor, lhs, &env)
        };
        let moved_dtype = moved_to
            .as_ref()
            .and_then(|(t, _, _)| self.scop.tensor(t))
            .map(|t| t.dtype);
        let terms: Vec<crate::codegen::mma::TermRegion> = c
            .terms
            .iter()
            .zip(&term_addresses)
            .map(|(t, (a, b))| crate::codegen::mma::TermRegion {
                a_address: a.as_ref(),
                b_address: b.as_ref(),
                k_extent: self.e(&t.k_extent),
            })
            .collect();
        let region = crate::codegen::mma::Region {
            c,
            mark: self.kernel_mark(),
            emulate: self.t.mma_threads(c.threads()),
            origin: [
                regs.block_iterators[regs.block_iterators.len() - 2].clone(),
                regs.block_iterators[regs.block_iterators.len() - 1].clone(),
            ],
            extents: [
                self.e(&c.extents[0]),
                self.e(&c.extents[1]),
                self.e(&c.extents[2]),
            ],
            a_address: &a_address,
            b_address: &b_address,
            c_element: &c_element,
            c_dtype: regs.dtype,
            moved: moved_dtype.map(|t| (&moved_element as &crate::codegen::mma::ElementAt, t)),
            zero_init: regs.init.is_some(),
            epilogue,
            full_tiles: c.every_tile_whole(self.program),
            terms,
        };
        out.push_str(&region.print(depth + 1));
        let _ = writeln!(out, "{pad}}}");
    }

    /// Opens the loops over a thread's register slots of tile `regs` along
    /// the axes `looped` (in the emulation, over the threads of those axes
    /// too), at `depth`, then names the block's tile (`pf_b<j>`) and the
    /// thread point of every axis of `axes` (`pf_t<j>`; slots along other
    /// axes come from loops around). Returns the depth inside the loops
    /// (one brace each to close) and the tests that the points lie in this
    /// block's tile: with more threads than points along an axis, the extra
    /// threads' points belong to the next tile, which another block owns.
    pub(super) fn open_slots(
        &self,
        regs: &RegisterTile,
        axes: &[char],
        looped: &[char],
        mut depth: usize,
        out: &mut String,
    ) -> (usize, Vec<String>) {
        let counts = regs.counts(self.plan.block);
        let threads = |a: char| self.plan.block[(a as u8 - b'x') as usize];
        let line = |out: &mut String, depth: usize, text: String| {
            let _ = writeln!(out, "{}{text}", "  ".repeat(depth));
        };
        for a in axes.iter().filter(|a| looped.contains(a)) {
            let pad = "  ".repeat(depth);
            self.t.thread_loop(self, *a, threads(*a), false, &pad, out);
        }
        for (j, a) in axes.iter().enumerate() {
            if !looped.contains(a) {
                continue;
            }
            self.t.unroll(&"  ".repeat(depth), out);
            line(
                out,
                depth,
                format!(
                    "for (int pf_r{a} = 0; pf_r{a} < {}; pf_r{a}++) {{",
                    counts[j]
                ),
            );
            depth += 1;
        }
        for (j, it) in regs.block_iterators.iter().enumerate() {
            line(out, depth, format!("const pf_i pf_b{j} = {it};"));
        }
        for (j, a) in axes.iter().enumerate() {
            let b = threads(*a);
            let tid = self.t.thread_index(*a);
            let point = slot_point(
                &tid,
                &format!("pf_r{a}"),
                i64::from(b),
                regs.group(self.plan.block, j),
            );
            line(out, depth, format!("const pf_i pf_t{j} = {point};"));
        }
        let conds = regs
            .thread_tiles
            .iter()
            .enumerate()
            .map(|(j, t)| format!("pf_t{j} < {t}"))
            .collect();
        (depth, conds)
    }
}
