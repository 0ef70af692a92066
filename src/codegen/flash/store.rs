//! The end of a block: the rows' states merged across warps, the output stored, the split-k partials and the combine kernel's body, and the epilogue.

use super::*;

impl Emit<'_> {
    /// A split kernel's end: the warps' states (each over its share of the
    /// slice's keys) combined into the block's, as the rewrite's proven
    /// combination joins two partial states (`M = M_a fr M_b`, each target
    /// moved to `M` by its repair, then summed), and stored as the slice's
    /// local states. Through shared memory: each warp's rows' predecessor
    /// values, then each warp's repaired states, summed over the warps.
    pub(super) fn merge_and_store(&mut self) {
        let a = self.a;
        let Some(sp) = &a.split else {
            return;
        };
        let per_row = a.merge_row_floats();
        let mg = self.t.merge_buffer(a.merge_floats());
        self.out.push_str(&mg);
        let slot =
            |w: &str, row: &str, k: String| format!("pf_mg[({w} * 16 + {row}) * {per_row} + {k}]");
        let env = self.env();
        // Each warp's predecessor values.
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n\
             const int pf_rl = pf_g + 8 * (pf_r % 2);\n\
             if (pf_c == 0) {} = {}; }}",
            slot("pf_w", "pf_rl", "0".into()),
            self.t.at("pf_m", "pf_r")
        );
        self.threads(&c);
        self.sync();
        // The block's value, each warp's states repaired to it.
        let printer = self.printer(HashMap::new(), false);
        let ident = printer.identity(a.reducer, DType::F32);
        let rov = self.repair_overrides(HashMap::new(), &self.t.at("pf_m", "pf_r"), "pf_mb");
        let printer = self.printer(rov, false);
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n\
             const int pf_rl = pf_g + 8 * (pf_r % 2);\n\
             float pf_mb = {ident};\n\
             for (int pf_v = 0; pf_v < {WARPS}; pf_v++) pf_mb = {};\n\
             {}\n\
(void)pf_ei;",
            printer.combine(
                a.reducer,
                DType::F32,
                "pf_mb",
                &slot("pf_v", "pf_rl", "0".into())
            ),
            self.row_of()
        );
        let mut off = 1;
        for (k, x) in a.sums.iter().enumerate() {
            let _ = writeln!(
                c,
                "if (pf_c == 0) {} = {} * ({});",
                slot("pf_w", "pf_rl", format!("{off}")),
                self.t.at(&format!("pf_sum{k}"), "pf_r"),
                printer.expr(&x.repair, &env)
            );
            off += 1;
        }
        for (k, x) in a.contractions.iter().enumerate() {
            let _ = writeln!(
                c,
                "{{ const float pf_f = {};\n\
                 for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++)\n\
                 {} = {} * pf_f; }}",
                printer.expr(&x.repair, &env),
                x.width / 8,
                slot(
                    "pf_w",
                    "pf_rl",
                    format!("{off} + pf_n * 8 + 2 * pf_c + pf_h")
                ),
                self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width))
            );
            off += x.width;
        }
        c.push_str("}\n");
        self.threads(&c);
        self.sync();
        // Sums over the warps, stored as the slice's local states.
        let sts = &self.program.statements;
        let printer = self.printer(HashMap::new(), false);
        let store = |pos: usize, v: &str| -> String {
            let st = &sts[pos];
            let subs: Vec<Affine> = st.lhs_indices.iter().map(|n| Affine::var(n)).collect();
            format!("{} = {v};", printer.element(&st.lhs_tensor, &subs, &env))
        };
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_x = pf_t; pf_x < {}; pf_x += {THREADS}) {{\n\
             const int pf_rl = pf_x / {per_row}, pf_q = pf_x % {per_row};\n\
             const pf_i pf_ei = pf_i0 + pf_rl;\n\
             if (pf_ei < {}) {{\n\
             float pf_sv = pf_q == 0 ? {ident} : 0.0f;\n\
             for (int pf_v = 0; pf_v < {WARPS}; pf_v++) pf_sv = pf_q == 0 ? {} : pf_sv + {};",
            SPLIT_ROWS * per_row,
            a.rows,
            printer.combine(
                a.reducer,
                DType::F32,
                "pf_sv",
                &slot("pf_v", "pf_rl", "0".into())
            ),
            slot("pf_v", "pf_rl", "pf_q".into())
        );
        let _ = writeln!(c, "if (pf_q == 0) {{ {} }}", store(sp.pred_local, "pf_sv"));
        let mut off = 1;
        for &pos in &sp.sum_locals {
            let _ = writeln!(c, "else if (pf_q == {off}) {{ {} }}", store(pos, "pf_sv"));
            off += 1;
        }
        for (k, &pos) in sp.con_locals.iter().enumerate() {
            let w = a.contractions[k].width;
            let _ = writeln!(
                c,
                "else if (pf_q < {}) {{ const pf_i pf_ee = pf_q - {off}; {} }}",
                off + w,
                store(pos, "pf_sv")
            );
            off += w;
        }
        c.push_str("}\n}\n");
        self.threads(&c);
    }

    /// The batch iterators' values `pf_b0, ..` from the block's batch
    /// combination `pf_bt` (the last iterator varies fastest).
    pub(super) fn batch_values(&self) -> String {
        let mut decl = String::new();
        let mut stride = 1i64;
        for (k, (_, e)) in self.a.batch.iter().enumerate().rev() {
            let _ = writeln!(
                decl,
                "const pf_i pf_b{k} = (pf_bt / {stride}) % {e}; (void)pf_b{k};"
            );
            stride *= e;
        }
        decl
    }

    pub(super) fn combine(&mut self) {
        let a = self.a;
        let Some(sp) = &a.split else {
            return;
        };
        let sts = &self.program.statements;
        let batch_decl = self.batch_values();
        let row = self.row_subs();
        // Overrides: the combined states as the thread's variables.
        let mut ov = HashMap::new();
        let pg = &sts[sp.pred_global];
        ov.insert(AccessKey::new(&pg.lhs_tensor, &row), "pf_M".to_string());
        for (k, &pos) in sp.sum_globals.iter().enumerate() {
            ov.insert(
                AccessKey::new(&sts[pos].lhs_tensor, &row),
                format!("pf_X{k}"),
            );
        }
        let mut env = self.env();
        let mut c = String::new();
        let _ = writeln!(c, "{batch_decl}");
        // One fold: `var` = the global statement at `pos` reduced over the
        // slices, the lane's slices first, then across the warp.
        let fold = |c: &mut String,
                    ov: &HashMap<AccessKey, String>,
                    env: &mut HashMap<String, String>,
                    pos: usize,
                    var: &str| {
            let st = &sts[pos];
            let op = if pos == sp.pred_global {
                a.reducer
            } else {
                Reducer::Sum
            };
            env.insert(st.reduction_indices[0].clone(), "pf_s".into());
            let printer = self.printer(ov.clone(), false);
            let ident = printer.identity(op, DType::F32);
            let step = printer.combine(op, DType::F32, "pf_v", &printer.expr(&st.rhs, env));
            // The lane's slices unrolled: their loads in flight together.
            let unroll = self.t.unroll4();
            let lanes = format!(
                "float pf_v = {ident};\n{unroll}for (pf_i pf_s = pf_l; pf_s < {}; pf_s += 32) pf_v = {step};\n",
                sp.slices
            );
            let combine = |x: &str, y: &str| printer.combine(op, DType::F32, x, y);
            c.push_str(&self.t.warp_fold(var, &lanes, &combine));
        };
        fold(&mut c, &ov, &mut env, sp.pred_global, "pf_M");
        for (k, &pos) in sp.sum_globals.iter().enumerate() {
            fold(&mut c, &ov, &mut env, pos, &format!("pf_X{k}"));
        }
        // The epilogue over rows (one thread of the grid's first column
        // block), then a warp's column (a column name stands for one
        // width).
        let printer = self.printer(ov.clone(), false);
        for &p in &a.epilogue {
            let st = &sts[p];
            if st.lhs_indices.len() == row.len() {
                let _ = writeln!(
                    c,
                    "if (pf_ez == 0 && pf_t == 0) {}",
                    printer.statement(st, StmtKind::Assign, &env)
                );
            }
        }
        let mut columns: Vec<(&String, i64)> = a
            .contractions
            .iter()
            .map(|x| (&x.column, x.width))
            .collect();
        columns.sort();
        columns.dedup();
        let _ = writeln!(
            c,
            "const pf_i pf_ee = pf_ez * {COMBINE_WARPS} + pf_w; (void)pf_ee;"
        );
        for (column, width) in columns {
            let _ = writeln!(c, "if (pf_ee < {width}) {{");
            let mut cov = ov.clone();
            for (k, x) in a.contractions.iter().enumerate() {
                if &x.column != column {
                    continue;
                }
                cov.insert(
                    AccessKey::new(&sts[sp.con_globals[k]].lhs_tensor, &self.col_subs(column)),
                    format!("pf_O{k}"),
                );
                fold(
                    &mut c,
                    &ov,
                    &mut env,
                    sp.con_globals[k],
                    &format!("pf_O{k}"),
                );
            }
            let printer = self.printer(cov, false);
            for &p in &a.epilogue {
                let st = &sts[p];
                if st.lhs_indices.len() > row.len() && st.lhs_indices.last() == Some(column) {
                    let _ = writeln!(
                        c,
                        "if (pf_l == 0) {}",
                        printer.statement(st, StmtKind::Assign, &env)
                    );
                }
            }
            c.push_str("}\n");
        }
        let grid = self.t.combine_grid(a, &c);
        self.out.push_str(&grid);
    }

    /// The epilogue statements, from the final states.
    pub(super) fn epilogue(&mut self) {
        let a = self.a;
        let env = self.env();
        let row = self.row_subs();
        let mut c = String::new();
        for &p in &a.epilogue {
            let st = &self.program.statements[p];
            let mut ov = HashMap::new();
            ov.insert(AccessKey::new(&a.pred, &row), self.t.at("pf_m", "pf_r"));
            for (k, s) in a.sums.iter().enumerate() {
                ov.insert(
                    AccessKey::new(&s.tensor, &row),
                    self.t.at(&format!("pf_sum{k}"), "pf_r"),
                );
            }
            let column = if st.lhs_indices.len() > row.len() {
                st.lhs_indices.last().cloned()
            } else {
                None
            };
            let width = column
                .as_ref()
                .and_then(|col| a.contractions.iter().find(|x| &x.column == col))
                .map(|x| x.width);
            for (k, x) in a.contractions.iter().enumerate() {
                if column.as_ref() == Some(&x.column) && Some(x.width) == width {
                    ov.insert(
                        AccessKey::new(&x.tensor, &self.col_subs(&x.column)),
                        self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width)),
                    );
                }
            }
            let printer = self.printer(ov, false);
            let text = printer.statement(st, StmtKind::Assign, &env);
            match width {
                Some(w) => {
                    let _ = writeln!(
                        c,
                        "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++) {{\n\
                         {}\nconst pf_i pf_ee = pf_n * 8 + 2 * pf_c + pf_h; (void)pf_ee;\n\
                         if (pf_ei < {}) {text}\n}}",
                        w / 8,
                        self.row_of(),
                        a.rows
                    );
                }
                None => {
                    let _ = writeln!(
                        c,
                        "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n{}\nif (pf_c == 0 && pf_ei < {}) {text}\n}}",
                        self.row_of(),
                        a.rows
                    );
                }
            }
        }
        self.threads(&c);
    }
}
