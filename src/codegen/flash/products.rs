//! The two products of a key tile on the tensor cores (`wgmma` or `mma.sync`): the scores `Q K^T` and the value sums `P V`, with their accumulators.

use super::*;

impl Emit<'_> {
    /// `wgmma`'s form of a step where the kernel has that path, and
    /// `mma_sync`'s (in the CUDA, compiled where the device is not sm_90a;
    /// the emulation runs the `wgmma` path alone).
    pub(super) fn either(&mut self, wgmma: fn(&mut Self), mma_sync: fn(&mut Self)) {
        if self.a.wgmma() {
            wgmma(self);
        }
        self.mma_sync_path(mma_sync);
    }

    /// A part of the `mma.sync` path, printed by `mma_sync`: as it is in a
    /// kernel without a `wgmma` path, else as the target prints it beside
    /// that path ([`FlashTarget::beside_wgmma`]).
    pub(super) fn mma_sync_path(&mut self, mma_sync: fn(&mut Self)) {
        if self.a.wgmma() {
            let t = self.t;
            t.beside_wgmma(self, mma_sync);
        } else {
            mma_sync(self);
        }
    }

    /// The scores of a key tile on `wgmma` (`S = A Bᵀ`, one warpgroup's 64
    /// rows by the tile's keys, k = the depth in steps of 16): both
    /// operands K-major in the 128-byte swizzle, so the descriptor of step
    /// `kk` starts `kk % 4` 32-byte chunks into atom `kk / 4` (the hardware
    /// applies the XOR to the address it forms), 8-line groups 1024 bytes
    /// apart. The first step overwrites the accumulators (scale-d 0).
    pub(super) fn wgmma_scores(&mut self) {
        let t = self.t;
        t.wgmma_scores(self);
    }

    /// The value products on `wgmma`: the weights (the rounded ones and
    /// their rounded remainders) are A fragments in registers, which is
    /// `wgmma`'s register layout of A for a warpgroup's 64 rows; the value
    /// tile is an MN-major B (its lines are keys, the columns along them)
    /// in the 128-byte swizzle: the descriptor of step `kc` starts 16 lines
    /// further, 8-line groups 1024 bytes apart (SBO), groups of 64 columns
    /// a whole atom apart (LBO, the tile's keys times 128 bytes).
    pub(super) fn wgmma_values(&mut self) {
        let t = self.t;
        t.wgmma_values(self);
    }

    /// The scores of a key tile on `mma.sync`: each warp's key fragments
    /// through `ldmatrix`, times the query fragments it holds.
    pub(super) fn mma_scores(&mut self) {
        let a = self.a;
        let nb = a.warp_keys() / 8;
        let kq = a.depth / 16;
        let mut c = String::new();
        let _ = writeln!(
            c,
            "{}for (int pf_k = 0; pf_k < {}; pf_k++) {} = 0.0f;",
            self.t.unroll(),
            WARP_TILES * nb * 4,
            self.t.at("pf_s", "pf_k")
        );
        self.threads(&c);
        let mut w = String::new();
        let _ = writeln!(
        w,
        "{u}for (int pf_kk = 0; pf_kk < {}; pf_kk++)\n{u}for (int pf_np = 0; pf_np < {}; pf_np++) {{",
        a.depth / 16,
        a.warp_keys() / 16,
        u = self.t.unroll()
    );
        let at = self.tile_at(
            BLOCK_KEYS,
            a.depth,
            &format!(
                "{} + pf_np * 16 + pf_l % 8 + 8 * (pf_l / 16)",
                self.warp_key()
            ),
            "pf_kk * 16 + 8 * ((pf_l / 8) % 2)",
        );
        w.push_str(&self.t.ldsm("pf_kb", "0", &format!("&pf_kcur[{at}]"), false));
        let _ = writeln!(
            w,
            "{}for (int pf_mi = 0; pf_mi < {WARP_TILES}; pf_mi++) {{",
            self.t.unroll()
        );
        for half in 0..2 {
            w.push_str(&self.mma(
                (
                    "pf_s",
                    &format!("(pf_mi * {nb} + 2 * pf_np + {half}) * 4"),
                    WARP_TILES * nb * 4,
                ),
                (
                    "pf_qf",
                    &format!("(pf_mi * {kq} + pf_kk) * 4"),
                    WARP_TILES * kq * 4,
                ),
                ("pf_kb", &format!("{}", 2 * half), 4),
            ));
        }
        w.push_str("}\n}\n");
        self.warps(&w);
    }

    /// The value products on `mma.sync`: the value tile's fragments through
    /// `ldmatrix.trans`, times the weights' A fragments.
    pub(super) fn mma_values(&mut self) {
        let a = self.a;
        for (k, x) in a.contractions.iter().enumerate() {
            self.start_tile_sums(k, x);
            let mut w = String::new();
            let _ = writeln!(
                w,
                "{u}for (int pf_kc = 0; pf_kc < {}; pf_kc++)\n{u}for (int pf_ep = 0; pf_ep < {}; pf_ep++) {{",
                a.warp_keys() / 16,
                x.width / 16,
                u = self.t.unroll()
            );
            let at = self.tile_at(
                BLOCK_KEYS,
                x.width,
                &format!("{} + pf_kc * 16 + pf_l % 16", self.warp_key()),
                "pf_ep * 16 + 8 * (pf_l / 16)",
            );
            w.push_str(
                &self
                    .t
                    .ldsm("pf_kb", "0", &format!("&pf_vcur{k}[{at}]"), true),
            );
            let o = Self::value_sums(k, x);
            let w8 = x.width / 8;
            let kc = a.warp_keys() / 16;
            let _ = writeln!(
                w,
                "{}for (int pf_mi = 0; pf_mi < {WARP_TILES}; pf_mi++) {{",
                self.t.unroll()
            );
            // The rounded weights, then their rounded remainders (without
            // them, H100: global prefill 1519 against 1947 us, and the
            // check's element error 2e-2, over f16's bound) unless the
            // program declares the weights f16 or bf16.
            for part in weight_parts(x) {
                for half in 0..2 {
                    w.push_str(&self.mma(
                        (
                            &o,
                            &format!("(pf_mi * {w8} + 2 * pf_ep + {half}) * 4"),
                            WARP_TILES * w8 * 4,
                        ),
                        (
                            &format!("pf_{part}{k}"),
                            &format!("(pf_mi * {kc} + pf_kc) * 4"),
                            WARP_TILES * kc * 4,
                        ),
                        ("pf_kb", &format!("{}", 2 * half), 4),
                    ));
                }
            }
            w.push_str("}\n");
            w.push_str("}\n");
            self.warps(&w);
            self.add_tile_values(k, x);
        }
    }

    /// A thread's accumulators of contraction `x` (and, promoted, its key
    /// tile's sums).
    pub(super) fn accumulators(x: &RowContraction) -> i64 {
        WARP_TILES * x.width / 8 * 4
    }

    /// Where contraction `k`'s value products go: its accumulators, or
    /// (promoted) the key tile's sums.
    pub(super) fn value_sums(k: usize, x: &RowContraction) -> String {
        if x.promoted {
            format!("pf_ot{k}")
        } else {
            format!("pf_o{k}")
        }
    }

    /// A promoted contraction's key-tile sums start at zero.
    pub(super) fn start_tile_sums(&mut self, k: usize, x: &RowContraction) {
        if x.promoted {
            let code = format!(
                "for (int pf_i = 0; pf_i < {}; pf_i++) {} = 0.0f;\n",
                Self::accumulators(x),
                self.t.at(&format!("pf_ot{k}"), "pf_i")
            );
            self.threads(&code);
        }
    }

    /// A promoted contraction's key-tile sums added to its accumulators in
    /// IEEE f32 (`RowContraction::promoted`).
    pub(super) fn add_tile_values(&mut self, k: usize, x: &RowContraction) {
        if x.promoted {
            let code = format!(
                "for (int pf_i = 0; pf_i < {}; pf_i++) {} += {};\n",
                Self::accumulators(x),
                self.t.at(&format!("pf_o{k}"), "pf_i"),
                self.t.at(&format!("pf_ot{k}"), "pf_i")
            );
            self.threads(&code);
        }
    }
}
