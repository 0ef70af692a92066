//! Key and value tiles: their copies into shared memory (by `cp.async` or TMA boxes), the stages of the pipeline and the waits for them.

use super::*;

impl Emit<'_> {
    /// The copy of `rows` rows of operand `x` from row `first` into the
    /// shared tile `buf` (pitch for `width` elements), zero-filled past the
    /// tensor's rows; a `cp.async` group on the GPU (not committed).
    pub(super) fn copy(
        &self,
        x: &TileOperand,
        first: &str,
        rows: i64,
        width: i64,
        buf: &str,
    ) -> String {
        let chunks = width / 8;
        let mut env = self.env();
        env.insert(x.row.clone(), "pf_gr".into());
        env.insert(x.col.clone(), "pf_q".into());
        let printer = self.printer(HashMap::new(), false);
        let src = printer.element(&x.tensor, &x.subscripts, &env);
        let mut c = String::new();
        let total = rows * chunks;
        let threads = self.a.threads() as i64;
        let unrolled = threads % chunks == 0 && total % threads == 0;
        if unrolled {
            // A thread's chunks share their column and lie a whole number
            // of lines apart: unrolled, so that the compiler computes the
            // first chunk's addresses once and offsets the others by
            // constants (H100, prefill: the generic loop took about a
            // quarter of the loop's instructions).
            let _ = writeln!(
                c,
                "{}for (int pf_n = 0; pf_n < {}; pf_n++) {{\n\
                 const int pf_r = pf_t / {chunks} + pf_n * {}, pf_q = (pf_t % {chunks}) * 8;",
                self.t.unroll(),
                total / threads,
                threads / chunks
            );
        } else {
            let _ = writeln!(
                c,
                "for (int pf_x = pf_t; pf_x < {total}; pf_x += {threads}) {{\n\
                 const int pf_r = pf_x / {chunks}, pf_q = (pf_x % {chunks}) * 8;"
            );
        }
        let _ = writeln!(
            c,
            "const pf_i pf_gr = {first} + pf_r;\n\
             {} *pf_dst = &{buf}[{}];",
            self.t.u16(),
            self.tile_at(rows, width, "pf_r", "pf_q")
        );
        let head = c;
        self.globals.note(&x.tensor);
        let tensor = crate::codegen::expr::tensor_name(&x.tensor);
        let (line, zero) = self.t.copy_chunk(&src, &tensor);
        // Every tile a kernel copies starts at a multiple of its rows
        // (`first` is `tile * rows`: a key tile `kt * 64`, the query tile
        // `pf_i0`) and below the tensor's extent (a key tile holds a key of
        // the domain, a query tile a row of it, and the domain reads the
        // tensor in bounds). Where the extent is a multiple of the rows,
        // every such tile is whole: the copy has neither the test nor the
        // row tests of a partial tile (H100, B4 H16 S4096 D64 prefill, the
        // kernel with the test edited out: 843-845 against 894-897 us
        // global, 476-478 against 504 us causal; the partial tiles' copies,
        // never run there, still cost their code in the loop).
        if x.rows % rows == 0 {
            return format!("{head}{line}\n}}\n");
        }
        let guarded = format!("{head}if (pf_gr < {}) {line} else {zero}\n}}\n", x.rows);
        if !unrolled {
            return guarded;
        }
        // A tile wholly inside the tensor (a test uniform in the block)
        // copies without testing each row.
        format!(
            "if ({first} + {rows} <= {}) {{\n{head}{line}\n}}\n}} else {{\n{guarded}}}\n",
            x.rows
        )
    }

    /// Index in a shared tile of `rows` lines of `width` elements of the
    /// element at line `row`, column `col` (a multiple of 8): `row * pitch
    /// + col`, or, with a `wgmma` path, in the 128-byte swizzle: atoms of
    /// 64 columns (`rows` lines of 128 bytes each, the atoms one after the
    /// other), the 16-byte chunk `(col % 64) / 8` of a line stored at
    /// chunk `(col % 64) / 8 ^ row % 8`. The eight lines an `ldmatrix`
    /// reads at one chunk then fall in eight different chunks (all banks),
    /// and the layout is the canonical one `wgmma`'s descriptors name.
    pub(super) fn tile_at(&self, rows: i64, width: i64, row: &str, col: &str) -> String {
        if self.a.wgmma() {
            format!(
                "(({col}) / 64) * {} + ({row}) * 64 + (((({col}) % 64) / 8) ^ (({row}) % 8)) * 8",
                rows * 64
            )
        } else {
            format!("({row}) * {} + ({col})", self.a.pitch(width))
        }
    }

    /// The copies of key tile `tile` (when it is below `pf_khi`): the key
    /// operand into `key_buf`, value operand `k` into `{value_buf}{k}`;
    /// one committed `cp.async` group. Where the copy engine copies the
    /// tiles (on the `wgmma` path), thread 0 asks for their boxes instead,
    /// counted on stage `stage`'s barrier; the group is then empty.
    pub(super) fn copy_key_tile(
        &self,
        tile: &str,
        key_buf: &str,
        value_buf: &str,
        stage: &str,
    ) -> String {
        let a = self.a;
        let first = format!("{} * {BLOCK_KEYS}", self.tile_of(tile));
        let mut c = format!("if ({tile} < pf_khi) {{\n");
        c.push_str(&self.copy(&a.key_operand, &first, BLOCK_KEYS, a.depth, key_buf));
        for (k, x) in a.contractions.iter().enumerate() {
            c.push_str(&self.copy(
                &x.value,
                &first,
                BLOCK_KEYS,
                x.width,
                &format!("{value_buf}{k}"),
            ));
        }
        c.push_str("}\n");
        if !self.copies.is_empty() {
            let boxes = self.tile_boxes(tile, &first, key_buf, value_buf, stage);
            c = self.t.tma_or(&boxes, &c);
        }
        c.push_str(self.t.commit());
        c
    }

    /// Thread 0's copies of key tile `tile` (its first key `first`) by the
    /// copy engine: the bytes its stage's barrier expects, then each
    /// operand's boxes, one per 64-column atom, at the operand's
    /// coordinates (from its element at the tile's first row and column
    /// 0: the map's dimensions are the tensor's, contiguous first).
    pub(super) fn tile_boxes(
        &self,
        tile: &str,
        first: &str,
        key_buf: &str,
        value_buf: &str,
        stage: &str,
    ) -> String {
        let a = self.a;
        let bar = format!("&{TILE_BARRIERS}[{stage}]");
        let bytes: i64 = self.copies.iter().map(TmaOperand::stage_bytes).sum();
        let mut c = format!("if ({tile} < pf_khi && pf_t == 0) {{\n");
        c.push_str(&self.t.expect_bytes(&bar, bytes));
        let operands =
            std::iter::once(&a.key_operand).chain(a.contractions.iter().map(|x| &x.value));
        for (which, (op, x)) in self.copies.iter().zip(operands).enumerate() {
            let buf = if which == 0 {
                key_buf.to_string()
            } else {
                format!("{value_buf}{}", which - 1)
            };
            let mut env = self.env();
            env.insert(x.row.clone(), format!("({first})"));
            env.insert(x.col.clone(), "0".into());
            let element =
                self.printer(HashMap::new(), false)
                    .element(&x.tensor, &x.subscripts, &env);
            let tensor = crate::codegen::expr::tensor_name(&x.tensor);
            let _ = writeln!(c, "{{ const long pf_at = (long)(&{element} - {tensor});");
            for line in crate::codegen::mma::coordinate_lines(&op.map, "pf_at", "pf_c", None) {
                let _ = writeln!(c, "{line}");
            }
            let coords: Vec<String> = (0..op.map.dims.len()).map(|d| format!("pf_c{d}")).collect();
            for g in 0..op.boxes {
                let mut at = coords.clone();
                at[op.k_dim] = format!("pf_c{} + {}", op.k_dim, 64 * g);
                let dst = format!("&{buf}[{}]", g * op.box_len);
                let load = crate::codegen::mma::box_copy(
                    &op.map,
                    &map_param(which),
                    &dst,
                    &bar,
                    &at,
                    self.t.emulated(),
                );
                let _ = writeln!(c, "{load}");
            }
            c.push_str("}\n");
        }
        c.push_str("}\n");
        c
    }

    /// The key and value tiles of the current tile have landed (the
    /// prologue's first tile, or the rolling loop's `pf_kt`), with all but
    /// the newest `n` `cp.async` groups: where the copy engine copies the
    /// tiles, once the stage's barrier has completed the tile's phase
    /// (`(tile / stages) % 2`), the query's `cp.async` group (the
    /// prologue's only one) waited for; then the block's barrier.
    pub(super) fn tile_landed(&mut self, n: i32, in_loop: bool) {
        if self.copies.is_empty() {
            return self.landed(n);
        }
        let (stage, parity) = if in_loop {
            (
                "pf_st".to_string(),
                format!("(unsigned)(((pf_kt - pf_klo) / {}) & 1)", self.a.stages()),
            )
        } else {
            ("0".to_string(), "0u".to_string())
        };
        let bar = format!("&{TILE_BARRIERS}[{stage}]");
        let w = self.t.tile_landed(n, &bar, &parity);
        self.out.push_str(&w);
        self.sync();
    }

    /// The copies of all but the newest `n` `cp.async` groups have landed
    /// and are visible to the block; with a `wgmma` path also to the tensor
    /// cores, which read shared memory through the async proxy (each
    /// thread orders its copies before them, then the barrier).
    pub(super) fn landed(&mut self, n: i32) {
        self.wait(n);
        if self.a.wgmma() {
            self.out.push_str(self.t.proxy_fence());
        }
        self.sync();
    }

    /// Waits for all but the newest `n` groups of copies.
    pub(super) fn wait(&mut self, n: i32) {
        let w = self.t.wait(n);
        self.out.push_str(&w);
    }

    /// The stage the tile `stages - 1` ahead of `pf_kt` (at stage
    /// `pf_st`) is copied into.
    pub(super) fn next_stage(&self) -> String {
        let stages = self.a.stages();
        if stages == 2 {
            "(pf_st ^ 1)".to_string()
        } else {
            format!("((pf_st + {}) % {stages})", stages - 1)
        }
    }

    /// The rolling loop's head: the key tile `pf_kt`, whether it is whole
    /// (`pf_full`), and the stages it is read from (`pf_kcur`, `pf_vcurK`)
    /// and the tile ahead is copied into (`pf_knext`, `pf_vnextK`).
    pub(super) fn tile_stages(&mut self) {
        let a = self.a;
        let layout = a.shared_layout();
        let stages = layout.keys.stages;
        let ptr = self.t.u16();
        let full = self.cond(&a.full_tile);
        let kl = layout.keys.stage_len;
        let cur = if stages == 2 {
            "(int)((pf_kt - pf_klo) & 1)".to_string()
        } else {
            format!("(int)((pf_kt - pf_klo) % {stages})")
        };
        let next = self.next_stage();
        let _ = writeln!(
            self.out,
            "for (pf_i pf_kt = pf_klo; pf_kt < pf_khi; pf_kt++) {{\n\
             const pf_i pf_j0 = {} * {BLOCK_KEYS};\n\
             const int pf_full = {full}; (void)pf_full;\n\
             const int pf_st = {cur};\n\
             {ptr} *const pf_kcur = pf_fa_k + pf_st * {kl};\n\
             {ptr} *const pf_knext = pf_fa_k + {next} * {kl};",
            self.tile_of("pf_kt")
        );
        for (k, v) in layout.values.iter().enumerate() {
            let vl = v.stage_len;
            let _ = writeln!(
                self.out,
                "{ptr} *const pf_vcur{k} = pf_fa_v{k} + pf_st * {vl};\n\
                 {ptr} *const pf_vnext{k} = pf_fa_v{k} + {next} * {vl};"
            );
        }
    }
}
