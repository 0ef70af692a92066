//! The rolling update of a key tile (Neptune's repair): the row states, the tile's reduction, the repair factors applied to the accumulators, and the weights.

use super::*;

impl Emit<'_> {
    /// The states' initial values.
    pub(super) fn init_states(&mut self) {
        let a = self.a;
        let printer = self.printer(HashMap::new(), false);
        let env = self.env();
        let mut c = String::new();
        let _ = writeln!(
            c,
            "{}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n{}",
            self.t.unroll(),
            self.row_of()
        );
        let _ = writeln!(
            c,
            "{} = {};",
            self.t.at("pf_m", "pf_r"),
            printer.expr(&a.pred_init, &env)
        );
        for (k, s) in a.sums.iter().enumerate() {
            let _ = writeln!(
                c,
                "{} = {};",
                self.t.at(&format!("pf_sum{k}"), "pf_r"),
                printer.expr(&s.init, &env)
            );
        }
        for (k, x) in a.contractions.iter().enumerate() {
            let _ = writeln!(
                c,
                "{}for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++) {{\n\
                 const pf_i pf_ee = pf_n * 8 + 2 * pf_c + pf_h; (void)pf_ee;\n\
                 {} = {}; }}",
                self.t.unroll(),
                x.width / 8,
                self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width)),
                printer.expr(&x.init, &env)
            );
        }
        c.push_str("(void)pf_ei; }\n");
        self.threads(&c);
    }

    /// One tile's maps, predecessor, repairs and terms (all but the value
    /// products), in the order the rewrite's step takes them: the tile's
    /// reduction of the scores, the repair factors of the row states and
    /// the accumulators' repair, the terms and weights, then the tile's
    /// sums added to the rows'. `whole`: the tile is known to be whole (no
    /// element test).
    pub(super) fn softmax_step(&mut self, whole: bool) {
        let step = self.step_elements(whole);
        self.tile_reduction(&step);
        let mut c = String::new();
        self.repair_factors(&step, &mut c);
        self.repair_accumulators(&mut c);
        self.tile_terms(&step, &mut c);
        self.threads(&c);
        self.add_tile_sums();
    }

    /// What the parts of a tile's step share (see [`StepElements`]).
    pub(super) fn step_elements(&self, whole: bool) -> StepElements {
        let a = self.a;
        let env = self.env();
        let wk = self.warp_key();
        let element = if whole {
            "1".to_string()
        } else {
            self.cond(&a.element)
        };
        let row_decl = self.row_of();
        let k_idx = self.s_idx();
        // An element's score index, row, key and whether it is inside the
        // domain, at the top of the loop over a thread's elements.
        let head = format!(
            "const int pf_k = {k_idx};\n\
             {row_decl}\n\
             const pf_i pf_ej = pf_j0 + {wk} + pf_n * 8 + 2 * pf_c + pf_h;\n\
             const int pf_ok = ({element}); (void)pf_ok; (void)pf_ei; (void)pf_ej; (void)pf_k;"
        );
        let mut overrides = HashMap::new();
        self.element_overrides(&mut overrides);
        StepElements {
            whole,
            env,
            overrides,
            head,
            key_groups: a.warp_keys() / 8,
        }
    }

    /// The maps of every element of the thread's scores and the tile's
    /// value of the predecessor (the reduction of each row over the tile),
    /// combined over a row's four lanes; a maximum of scaled scores takes
    /// the scaling out of its loop (`ScoreScale::folded`).
    pub(super) fn tile_reduction(&mut self, step: &StepElements) {
        let a = self.a;
        let (env, nb, head) = (&step.env, step.key_groups, &step.head);
        // Maps and the predecessor's tile value.
        let printer = self.printer(step.overrides.clone(), true);
        let ident = printer.identity(a.reducer, DType::F32);
        let mut c = String::new();
        let _ = writeln!(
            c,
            "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {} = {ident};",
            self.t.at("pf_mt", "pf_r")
        );
        let u = self.t.unroll();
        let _ = writeln!(
            c,
            "{u}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++)\n{u}for (int pf_n = 0; pf_n < {nb}; pf_n++)\n{u}for (int pf_h = 0; pf_h < 2; pf_h++) {{\n{head}"
        );
        for (k, (_, rhs)) in a.maps.iter().enumerate() {
            // A map that reads a tensor in memory reads it only inside the
            // domain: a partial tile's other elements (rows or keys past
            // the tensor's extent) are never read (the masked elements'
            // map values are not used).
            let value = printer.expr(rhs, env);
            let value = if !step.whole && !input_reads(self.program, rhs).is_empty() {
                format!("pf_ok ? {value} : 0.0f")
            } else {
                value
            };
            let _ = writeln!(c, "{} = {value};", self.t.at(&format!("pf_x{k}"), "pf_k"));
        }
        let mt = self.t.at("pf_mt", "pf_r");
        // A maximum (or minimum) of scaled scores `c * s` (c > 0) is `c`
        // times the maximum of the scores (`Attention::score_scale`).
        let folded = self.scale.filter(|s| s.folded);
        let body = match folded {
            Some(_) => self.t.at("pf_s", "pf_k"),
            None => printer.expr(&a.pred_body, env),
        };
        let _ = writeln!(
            c,
            "if (pf_ok) {mt} = {};\n}}",
            printer.combine(a.reducer, DType::F32, &mt, &body)
        );
        self.threads(&c);
        self.quad("pf_mt", SLOTS, a.reducer);
        if let Some(s) = folded {
            self.threads(&format!(
                "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {mt} = {mt} * {:?}f;\n",
                s.factor as f32
            ));
        }
    }

    /// New predecessor value, repairs. A sum's repair `H(X; Mp, M)`
    /// distributes over the sum (Eq. 5, proven by the rewrite) and is
    /// continuous in `X`, so it is `X * H(1; Mp, M)`: one factor per row
    /// (shared by targets whose repairs print alike), not one evaluation
    /// per element. The sums are repaired here; the contractions' factors
    /// are kept for [`Emit::repair_accumulators`].
    pub(super) fn repair_factors(&self, step: &StepElements, c: &mut String) {
        let a = self.a;
        let rov = self.repair_overrides(
            step.overrides.clone(),
            &self.t.at("pf_m", "pf_r"),
            &self.t.at("pf_mn", "pf_r"),
        );
        let printer = self.printer(rov, true);
        let (factors, sum_factor, con_factor) =
            self.distinct(&printer, &step.env, |s| &s.repair, |x| &x.repair);
        let _ = writeln!(
            c,
            "{}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{\n{} = {};",
            self.t.unroll(),
            self.t.at("pf_mn", "pf_r"),
            printer.combine(
                a.reducer,
                DType::F32,
                &self.t.at("pf_m", "pf_r"),
                &self.t.at("pf_mt", "pf_r")
            )
        );
        for (k, f) in factors.iter().enumerate() {
            let _ = writeln!(c, "const float pf_f{k} = {f};");
        }
        for (k, f) in sum_factor.iter().enumerate() {
            let x = self.t.at(&format!("pf_sum{k}"), "pf_r");
            let _ = writeln!(c, "{x} = {x} * pf_f{f};");
            let _ = writeln!(c, "{} = 0.0f;", self.t.at(&format!("pf_st{k}"), "pf_r"));
        }
        for (k, f) in con_factor.iter().enumerate() {
            let _ = writeln!(c, "{} = pf_f{f};", self.t.at(&format!("pf_cf{k}"), "pf_r"));
        }
        c.push_str("}\n");
    }

    /// The accumulators' repair, skipped where it multiplies by exactly
    /// one in every row of the warp (a tile that raises no row's
    /// predecessor value: most tiles after the first few), which changes
    /// no value.
    pub(super) fn repair_accumulators(&self, c: &mut String) {
        for (k, x) in self.a.contractions.iter().enumerate() {
            let cf = format!("pf_cf{k}");
            let o = self.t.at(&format!("pf_o{k}"), &Self::o_idx(x.width));
            let any: Vec<String> = (0..SLOTS)
                .map(|r| format!("{} != 1.0f", self.t.at(&cf, &r.to_string())))
                .collect();
            let guard = self.t.any_lane(&any);
            let _ = writeln!(
                c,
                "{guard} {{\n{u}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++)\n\
                 {u}for (int pf_n = 0; pf_n < {}; pf_n++) for (int pf_h = 0; pf_h < 2; pf_h++) {o} = {o} * {};\n}}",
                x.width / 8,
                self.t.at(&cf, "pf_r"),
                u = self.t.unroll()
            );
        }
    }

    /// The tile's terms with the new predecessor value, added to the
    /// tile's sums, and its weights split into the value products'
    /// fragments. The map that scales the scores (`Emit::scale`) is read
    /// as one FFMA of the score.
    pub(super) fn tile_terms(&self, step: &StepElements, c: &mut String) {
        let a = self.a;
        let (nb, head) = (step.key_groups, &step.head);
        let mut tov = step.overrides.clone();
        tov.insert(a.pred_term.clone(), self.t.at("pf_mn", "pf_r"));
        let printer = self.printer(tov, true);
        // `exp(c s - m)` of scaled scores as one FFMA of the score.
        if let Some(s) = self.scale {
            printer.scaled_reads.borrow_mut().insert(
                s.scaled.clone(),
                (self.t.at("pf_s", "pf_k"), s.factor as f32 as f64),
            );
        }
        let u = self.t.unroll();
        let _ = writeln!(
            c,
            "{u}for (int pf_r = 0; pf_r < {SLOTS}; pf_r++)\n{u}for (int pf_n = 0; pf_n < {nb}; pf_n++) {{\n\
             float pf_w0[{n}], pf_w1[{n}];",
            n = a.contractions.len().max(1)
        );
        let _ = writeln!(c, "{u}for (int pf_h = 0; pf_h < 2; pf_h++) {{\n{head}");
        // Each distinct term or weight once per element (a softmax's
        // `exp(T - M)` is both).
        let (values, sum_value, weight_value) =
            self.distinct(&printer, &step.env, |s| &s.term, |x| &x.weight);
        for (k, v) in values.iter().enumerate() {
            let _ = writeln!(c, "const float pf_v{k} = pf_ok ? {v} : 0.0f;");
        }
        for (k, v) in sum_value.iter().enumerate() {
            let st = self.t.at(&format!("pf_st{k}"), "pf_r");
            let _ = writeln!(c, "{st} = {st} + pf_v{v};");
        }
        for (k, v) in weight_value.iter().enumerate() {
            let _ = writeln!(
                c,
                "if (pf_h == 0) pf_w0[{k}] = pf_v{v}; else pf_w1[{k}] = pf_v{v};"
            );
        }
        c.push_str("}\n");
        self.split_weights(c);
        c.push_str("}\n");
    }

    /// Each weight as the sum of two values of the operand type (the
    /// rounded weight and the rounded remainder), so the product with the
    /// values loses no more than the f32 accumulation does; a weight
    /// declared in the operand type is rounded once.
    pub(super) fn split_weights(&self, c: &mut String) {
        let a = self.a;
        for k in 0..a.contractions.len() {
            let idx = format!(
                "((pf_r / 2) * {} + pf_n / 2) * 4 + (pf_n % 2) * 2 + pf_r % 2",
                a.warp_keys() / 16
            );
            let idx = idx.as_str();
            let bf16 = self.t.dtype_arg(a.dtype == DType::BF16);
            if a.contractions[k].rounded_once {
                let _ = writeln!(
                    c,
                    "pf_round2(pf_w0[{k}], pf_w1[{k}], &{}{bf16});",
                    self.t.at(&format!("pf_pa{k}"), idx),
                );
            } else {
                let _ = writeln!(
                    c,
                    "pf_split2(pf_w0[{k}], pf_w1[{k}], &{}, &{}{bf16});",
                    self.t.at(&format!("pf_pa{k}"), idx),
                    self.t.at(&format!("pf_pl{k}"), idx)
                );
            }
        }
    }

    /// The tile's sums, combined over a row's four lanes, added to the
    /// rows'; the new predecessor value becomes the row's.
    pub(super) fn add_tile_sums(&mut self) {
        let a = self.a;
        for k in 0..a.sums.len() {
            self.quad(&format!("pf_st{k}"), SLOTS, Reducer::Sum);
        }
        let mut c = String::new();
        let _ = writeln!(c, "for (int pf_r = 0; pf_r < {SLOTS}; pf_r++) {{");
        for k in 0..a.sums.len() {
            let s = self.t.at(&format!("pf_sum{k}"), "pf_r");
            let _ = writeln!(
                c,
                "{s} = {s} + {};",
                self.t.at(&format!("pf_st{k}"), "pf_r")
            );
        }
        let _ = writeln!(
            c,
            "{} = {}; }}",
            self.t.at("pf_m", "pf_r"),
            self.t.at("pf_mn", "pf_r")
        );
        self.threads(&c);
    }

    /// The expressions `of_sum` picks of the row sums and `of_con` of the
    /// contractions, printed, each distinct text once (see [`Distinct`]).
    pub(super) fn distinct(
        &self,
        printer: &Printer<'_>,
        env: &HashMap<String, String>,
        of_sum: impl Fn(&RowSum) -> &Expr,
        of_con: impl Fn(&RowContraction) -> &Expr,
    ) -> Distinct {
        let mut texts = Vec::new();
        let sums = self
            .a
            .sums
            .iter()
            .map(|s| intern(&mut texts, printer.expr(of_sum(s), env)))
            .collect();
        let cons = self
            .a
            .contractions
            .iter()
            .map(|x| intern(&mut texts, printer.expr(of_con(x), env)))
            .collect();
        (texts, sums, cons)
    }

    /// `overrides` and the reads of a repair `H(X; Mp, M)`: `X` by 1 (the
    /// repair is a factor), the old and the new predecessor values by
    /// `old` and `new`.
    pub(super) fn repair_overrides(
        &self,
        mut o: HashMap<AccessKey, String>,
        old: &str,
        new: &str,
    ) -> HashMap<AccessKey, String> {
        let a = self.a;
        o.insert(a.repair_new.clone(), new.to_string());
        o.insert(a.repair_old.clone(), old.to_string());
        for x in a.sums.iter().map(|s| &s.repair_self) {
            o.insert(x.clone(), "1.0f".into());
        }
        for x in a.contractions.iter().map(|c| &c.repair_self) {
            o.insert(x.clone(), "1.0f".into());
        }
        o
    }
}
