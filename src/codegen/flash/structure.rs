//! The kernel's frame: declarations, the block's rows and key range, the query's fragments, and the rolling loop over key tiles.

use super::*;

impl Emit<'_> {
    pub(super) fn declare(&mut self) {
        let a = self.a;
        let layout = a.shared_layout();
        // One array, the buffers at the layout's offsets (the same on the
        // CPU, so a layout whose buffers overlap fails there too).
        self.out.push_str(&self.t.shared_memory(a));
        if !self.copies.is_empty() {
            self.out
                .push_str(&self.t.tile_barriers(TILE_BARRIERS, a.stages()));
        }
        let ty = self.t.u16();
        for b in layout.all() {
            let _ = writeln!(
                self.out,
                "{ty} *const {} = pf_dynamic_shared + {};",
                b.name, b.start
            );
        }
        // Per-thread state: name, C type (on the CPU), elements.
        let nb = a.warp_keys() / 8;
        let mut vars: Vec<(String, &str, i64)> = vec![
            ("pf_qf".into(), "uint32_t", WARP_TILES * a.depth / 16 * 4),
            ("pf_kb".into(), "uint32_t", 4),
            ("pf_s".into(), "float", WARP_TILES * nb * 4),
        ];
        for k in 0..a.maps.len() {
            vars.push((format!("pf_x{k}"), "float", WARP_TILES * nb * 4));
        }
        for n in ["pf_m", "pf_mn", "pf_mt"] {
            vars.push((n.into(), "float", SLOTS));
        }
        for k in 0..a.sums.len() {
            vars.push((format!("pf_sum{k}"), "float", SLOTS));
            vars.push((format!("pf_st{k}"), "float", SLOTS));
        }
        for (k, c) in a.contractions.iter().enumerate() {
            let frags = WARP_TILES * a.warp_keys() / 16 * 4;
            vars.push((format!("pf_o{k}"), "float", Self::accumulators(c)));
            if c.promoted {
                // A key tile's value sums, added to `pf_o` in IEEE f32.
                vars.push((format!("pf_ot{k}"), "float", Self::accumulators(c)));
            }
            vars.push((format!("pf_cf{k}"), "float", SLOTS));
            vars.push((format!("pf_pa{k}"), "uint32_t", frags));
            if !c.rounded_once {
                vars.push((format!("pf_pl{k}"), "uint32_t", frags));
            }
        }
        if a.wgmma() {
            // The operand descriptors' fields other than the start
            // address, once: each tile's descriptor is one of these moved
            // by its offset (`pf_wgmma_desc_at`).
            self.out.push_str(&self.t.wgmma_descriptors());
        }
        for (name, ty, len) in vars {
            let decl = self.t.per_thread(a.threads(), ty, &name, len);
            self.out.push_str(&decl);
        }
    }

    /// The kernel: the block (a loop over the blocks in the emulation),
    /// its buffers and range of key tiles, the prologue's copies, the
    /// query's fragments, the rolling loop over the key tiles, and the
    /// end (the split kernel's merge of the warps' states, else the
    /// epilogue).
    pub(super) fn kernel(&mut self) {
        self.open_block();
        self.declare();
        self.key_range();
        self.prologue();
        self.query_fragments();
        self.rolling_loop();
        self.wait(0);
        if self.a.split.is_some() {
            self.sync();
            self.merge_and_store();
        } else {
            self.epilogue();
        }
        self.out.push_str(self.t.close_block());
    }

    /// The block's indices and the batch values it runs: a row tile (and
    /// in a split kernel, a slice) along x, a batch combination along y.
    /// The emulation opens its loop over the blocks here (closed at the
    /// kernel's end); on the GPU the thread's own indices come first.
    pub(super) fn open_block(&mut self) {
        let a = self.a;
        let mut batch_decl = self.batch_values();
        let tile = if self.rows_reversed {
            format!("({} - pf_bx % {})", a.row_tiles() - 1, a.row_tiles())
        } else {
            format!("(pf_bx % {})", a.row_tiles())
        };
        let _ = writeln!(
            batch_decl,
            "const pf_i pf_i0 = {tile} * {}; (void)pf_i0;",
            a.block_rows()
        );
        if a.split.is_some() {
            let _ = writeln!(
                batch_decl,
                "const pf_i pf_sl = pf_bx / {}; (void)pf_sl;",
                a.row_tiles()
            );
        }
        let open = self.t.open_block(a, &batch_decl);
        self.out.push_str(&open);
    }

    /// The block's key tiles: the loop runs over `pf_kt` in `pf_klo ..
    /// pf_khi` (none where no key of the block's rows is in the domain).
    /// For a range, `pf_kt` is the tile; for runs, its position among the
    /// runs' tiles, from 0: run `r` starts at tile `pf_rs{r}` and holds
    /// `pf_rn{r}` tiles (0 where the block has no such run), positions
    /// `.. pf_re{r}`, and a position's tile is the position plus its run's
    /// `pf_rd{r}` ([`Self::tile_of`]). The positions keep the loop's
    /// stages and copies ahead as they are, across the gaps.
    pub(super) fn key_range(&mut self) {
        let a = self.a;
        match &a.key_tiles {
            KeyTiles::Range { any, lo, hi } => {
                let any = self.cond(any);
                let lo = self.cond(lo);
                let hi = self.cond(hi);
                let _ = writeln!(
                    self.out,
                    "const int pf_any = {any};\n\
                     const pf_i pf_klo = pf_any ? ({lo}) / {BLOCK_KEYS} : 0;\n\
                     const pf_i pf_khi = pf_any ? ({hi}) / {BLOCK_KEYS} + 1 : 0;"
                );
            }
            KeyTiles::Runs(runs) => {
                let mut end = "0".to_string();
                for (r, run) in runs.iter().enumerate() {
                    let any = self.cond(&run.any);
                    let first = self.cond(&run.first);
                    let last = self.cond(&run.last);
                    let _ = writeln!(
                        self.out,
                        "const int pf_ra{r} = {any};\n\
                         const pf_i pf_rs{r} = pf_ra{r} ? ({first}) : 0;\n\
                         const pf_i pf_rn{r} = pf_ra{r} ? ({last}) - pf_rs{r} + 1 : 0;\n\
                         const pf_i pf_rd{r} = pf_rs{r} - {end};\n\
                         const pf_i pf_re{r} = {end} + pf_rn{r};"
                    );
                    end = format!("pf_re{r}");
                }
                let _ = writeln!(
                    self.out,
                    "const pf_i pf_klo = 0;\nconst pf_i pf_khi = {end};"
                );
            }
        }
    }

    /// The key tile at loop position `pos` ([`Self::key_range`]): the
    /// position itself for a range, else the position plus the offset of
    /// the run it falls in (the first run whose end is past it).
    pub(super) fn tile_of(&self, pos: &str) -> String {
        let KeyTiles::Runs(runs) = &self.a.key_tiles else {
            return pos.to_string();
        };
        let last = runs.len() - 1;
        let mut offset = format!("pf_rd{last}");
        for r in (0..last).rev() {
            offset = format!("({pos} < pf_re{r} ? pf_rd{r} : {offset})");
        }
        format!("({pos} + {offset})")
    }

    /// Prologue: the query tile and the first key and value tiles (one
    /// `cp.async` group with stage 0; each further stage but the last its
    /// own group), the states; then the wait for the query and the first
    /// key tile.
    pub(super) fn prologue(&mut self) {
        let a = self.a;
        let layout = a.shared_layout();
        let stages = layout.keys.stages;
        let ptr = self.t.u16();
        let mut c = self.copy(&a.query, "pf_i0", a.block_rows(), a.depth, "pf_fa_q");
        c.push_str(&self.copy_key_tile("pf_klo", "pf_fa_k", "pf_fa_v", "0"));
        for st in 1..stages - 1 {
            let _ = writeln!(
                self.out,
                "{ptr} *const pf_kpre{st} = pf_fa_k + {};",
                st * layout.keys.stage_len
            );
            for (k, v) in layout.values.iter().enumerate() {
                let _ = writeln!(
                    self.out,
                    "{ptr} *const pf_vpre{st}_{k} = pf_fa_v{k} + {};",
                    st * v.stage_len
                );
            }
            c.push_str(&self.copy_key_tile(
                &format!("(pf_klo + {st})"),
                &format!("pf_kpre{st}"),
                &format!("pf_vpre{st}_"),
                &st.to_string(),
            ));
        }
        self.threads(&c);
        self.init_states();
        // The query and the first key tile have landed.
        self.tile_landed((stages - 2) as i32, false);
    }

    /// The query fragments, for `mma.sync` (`wgmma` reads the query tile
    /// from shared memory, so the emulation, which runs that path, has
    /// none).
    pub(super) fn query_fragments(&mut self) {
        self.mma_sync_path(Self::load_query_fragments);
    }

    /// The query fragments through `ldmatrix`, each warp its rows'.
    pub(super) fn load_query_fragments(&mut self) {
        let a = self.a;
        let kq = a.depth / 16;
        let mut w = String::new();
        let _ = writeln!(
            w,
            "{u}for (int pf_mi = 0; pf_mi < {WARP_TILES}; pf_mi++)\n{u}for (int pf_kk = 0; pf_kk < {kq}; pf_kk++) {{",
            u = self.t.unroll()
        );
        let at = self.tile_at(
            a.block_rows(),
            a.depth,
            &format!(
                "pf_mi * {} + {} + pf_l % 16",
                16 * a.warps(),
                self.warp_row()
            ),
            "pf_kk * 16 + (pf_l / 16) * 8",
        );
        w.push_str(&self.t.ldsm(
            "pf_qf",
            &format!("(pf_mi * {kq} + pf_kk) * 4"),
            &format!("&pf_fa_q[{at}]"),
            false,
        ));
        w.push_str("}\n");
        self.warps(&w);
    }

    /// The rolling loop in tiles: the copies of the tiles `stages - 1`
    /// ahead run while the block computes on the current ones; the stage
    /// they overwrite was last read in the previous iteration, which ended
    /// with a barrier. Each iteration: the scores, the softmax step, the
    /// value products.
    pub(super) fn rolling_loop(&mut self) {
        let a = self.a;
        let wg = a.wgmma();
        let stages = a.stages();
        self.tile_stages();
        let c = self.copy_key_tile(
            &format!("(pf_kt + {})", stages - 1),
            "pf_knext",
            "pf_vnext",
            &self.next_stage(),
        );
        if wg {
            // This tile's copies land and are ordered before the tensor
            // cores' reads (the proxy fence) before the next ones are
            // issued: a fence after them would wait for them too. They go
            // into the stage the previous tile took, which every warp is
            // done with once past the barrier (its `wgmma` waited for), so
            // the loop needs one barrier a tile.
            self.tile_landed((stages - 2) as i32, true);
            self.threads(&c);
        } else {
            self.threads(&c);
            self.tile_landed((stages - 1) as i32, true);
        }
        self.either(Self::wgmma_scores, Self::mma_scores);
        // Whole tiles (the test `pf_full`, uniform in the block) skip the
        // element test: two copies of the step, or one where every tile
        // the kernel visits is whole.
        if a.every_tile_whole() {
            self.softmax_step(true);
        } else {
            self.line("if (pf_full) {");
            self.softmax_step(true);
            self.line("} else {");
            self.softmax_step(false);
            self.line("}");
        }
        // The value products.
        self.either(Self::wgmma_values, Self::mma_values);
        if !wg {
            self.sync();
        }
        self.line("}");
    }
}
