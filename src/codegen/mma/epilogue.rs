//! The epilogue: each lane computes the epilogue's statements on the
//! accumulator elements it owns (of a split, those its block owns) and
//! stores them through the statement's element map, two neighbours along
//! n at a time where the output allows, or (`gpu::stores::Stores::Staged`)
//! writes them into the block's tile in shared memory, which the block
//! then copies out a row at a time in 16-byte pieces.

use super::engine::Engine;
use super::writer::Lines;
use crate::frontend::ast::DType;
use crate::gpu::stores::{Stores, PIECE_BYTES};

impl Engine<'_, '_> {
    /// The stores. The value stored is `pf_cv` into the update's tensor,
    /// or `pf_dv` into the tensor the epilogue moves it to. Two neighbours
    /// along n are stored as one access (4 bytes for 16-bit outputs, 8 for
    /// f32) where both are inside, adjacent in memory and the first is
    /// aligned to the pair; otherwise one at a time. Measured on the H100
    /// (f16 4096^3, wgmma): single 2-byte stores took 17 us more.
    pub(super) fn store(&self, o: &mut Lines) {
        if let Stores::Staged { pitch, piece } = self.c.stores {
            return self.store_staged(o, pitch, piece);
        }
        let stored_dtype = self.stored_dtype();
        let d = self.target.open_threads(o, 1, self.threads);
        match self.target.pair_type(stored_dtype) {
            Some(pair_type) => {
                self.fragments(o, d, true, |o, d| self.store_pair(o, d, pair_type));
            }
            None => self.fragments(o, d, false, |o, d| self.store_one(o, d)),
        }
        self.target.close_threads(o, 1);
    }

    /// The type of the stored tensor's elements.
    fn stored_dtype(&self) -> DType {
        match self.region.moved {
            Some((_, t)) => t,
            None => self.region.c_dtype,
        }
    }

    /// The stores through shared memory (the pipeline's stages are free:
    /// its last step waited for every product and copy, behind a barrier):
    /// each thread writes its values, two neighbours at a time, into the
    /// tile of `pitch` elements a row; after a barrier, the block copies
    /// the tile out, `piece` elements (16 bytes) a thread, consecutive
    /// threads along a row. A piece is one vector store where it is inside,
    /// contiguous in the stored tensor and aligned, else its elements one
    /// at a time. A last barrier keeps the tile until every thread has
    /// read it (a block's next tile, in a cyclic grid, refills the stages).
    fn store_staged(&self, o: &mut Lines, pitch: i64, piece: i64) {
        let stored_dtype = self.stored_dtype();
        let ty = self.target.storage_type(stored_dtype);
        let pair = self
            .target
            .pair_type(stored_dtype)
            .expect("a staged type has pairs");
        let emulated = self.emulated();
        o.line(
            1,
            format!(
                "{{ /* the stores through shared memory: {} rows of {pitch}, copied out {piece} elements a thread */",
                self.tm
            ),
        );
        if emulated {
            o.line(2, format!("static {ty} pf_staged[{}];", self.tm * pitch));
        } else {
            o.line(
                2,
                format!("{ty} *const pf_staged = ({ty} *)pf_dynamic_shared;"),
            );
        }
        let d = self.target.open_threads(o, 2, self.threads);
        self.fragments(o, d, true, |o, d| {
            self.pair_values(o, d);
            let first = format!("pf_staged[pf_lm * {pitch} + pf_ln]");
            o.line(d, "if (pf_inside[0] && pf_inside[1]) {");
            if emulated {
                o.line(d + 1, format!("memcpy(&{first}, pf_two, sizeof({pair}));"));
            } else {
                o.line(d + 1, format!("*({pair} *)&{first} = *({pair} *)pf_two;"));
            }
            o.line(d, "} else {");
            o.line(d + 1, format!("if (pf_inside[0]) {first} = pf_two[0];"));
            o.line(
                d + 1,
                format!("if (pf_inside[1]) pf_staged[pf_lm * {pitch} + pf_ln + 1] = pf_two[1];"),
            );
            o.line(d, "}");
        });
        self.target.close_threads(o, 2);
        if !emulated {
            o.line(2, "__syncthreads();");
        }
        let d = self.target.open_threads(o, 2, self.threads);
        self.copy_out(o, d, pitch, piece);
        self.target.close_threads(o, 2);
        if !emulated {
            o.line(2, "__syncthreads();");
        }
        o.line(1, "}");
    }

    /// The staged tile copied out by thread `pf_tid` (see
    /// [`Engine::store_staged`]).
    fn copy_out(&self, o: &mut Lines, d: usize, pitch: i64, piece: i64) {
        let (tm, tn, threads) = (self.tm, self.tn, self.threads);
        let per_row = tn / piece;
        let full = self.region.full_tiles;
        o.line(
            d,
            format!(
                "for (int pf_q = pf_tid; pf_q < {}; pf_q += {threads}) {{",
                tm * per_row
            ),
        );
        o.line(
            d + 1,
            format!("const pf_i pf_lm = pf_q / {per_row}, pf_ln = (pf_q % {per_row}) * {piece};"),
        );
        if !full {
            o.line(d + 1, "if (pf_m0 + pf_lm >= pf_em) continue;");
        }
        let stored = self.stored_dtype();
        // The gpu stage sized the pieces for this type.
        debug_assert_eq!(piece * stored.size() as i64, PIECE_BYTES);
        let ty = self.target.storage_type(stored);
        o.line(
            d + 1,
            format!("const {ty} *const pf_src = &pf_staged[pf_lm * {pitch} + pf_ln];"),
        );
        let first = self.target_element("pf_lm", "pf_ln");
        let last = self.target_element("pf_lm", &format!("pf_ln + {}", piece - 1));
        let inside = if full {
            String::new()
        } else {
            format!("pf_n0 + pf_ln + {} < pf_en && ", piece - 1)
        };
        o.line(
            d + 1,
            format!(
                "if ({inside}&{last} == &{first} + {} && ((unsigned long long)&{first}) % {PIECE_BYTES} == 0) {{",
                piece - 1
            ),
        );
        if self.emulated() {
            o.line(d + 2, format!("memcpy(&{first}, pf_src, {PIECE_BYTES});"));
        } else {
            o.line(
                d + 2,
                format!("*(uint4 *)&{first} = *(const uint4 *)pf_src;"),
            );
        }
        o.line(d + 1, "} else {");
        let element = self.target_element("pf_lm", "pf_ln + pf_j");
        let test = if full {
            String::new()
        } else {
            "if (pf_n0 + pf_ln + pf_j < pf_en) ".to_string()
        };
        o.line(
            d + 2,
            format!("for (int pf_j = 0; pf_j < {piece}; pf_j++) {test}{element} = pf_src[pf_j];"),
        );
        o.line(d + 1, "}");
        o.line(d, "}");
    }

    /// ` && ` the test of the block's ownership of the register, in a
    /// split.
    fn owned(&self) -> String {
        if self.split > 1 {
            format!(" && {}", self.owner())
        } else {
            String::new()
        }
    }

    /// The element's value as the stored type, `pf_cv`, then (where the
    /// epilogue moves it to another tensor) that tensor's `pf_dv`, and the
    /// epilogue's statements on them.
    fn epilogue_statements(&self, o: &mut Lines, d: usize) {
        let r = self.region;
        let acc = self.target.accumulator();
        let store = match r.c_dtype {
            DType::F16 => format!("pf_f2h({acc})"),
            DType::BF16 => format!("pf_f2b({acc})"),
            _ => acc.to_string(),
        };
        let storage = self.target.storage_type(r.c_dtype);
        o.line(d, format!("{storage} pf_cv = {store};"));
        if let Some((_, t)) = r.moved {
            o.line(d, format!("{} pf_dv;", self.target.storage_type(t)));
        }
        for line in r.epilogue.lines() {
            o.line(d, line);
        }
    }

    /// The variable holding the value stored (see [`Engine::store`]).
    fn stored_value(&self) -> &'static str {
        if self.region.moved.is_some() {
            "pf_dv"
        } else {
            "pf_cv"
        }
    }

    /// The stored tensor's element at local `(lm, ln)`.
    fn target_element(&self, lm: &str, ln: &str) -> String {
        match self.region.moved {
            Some((element, _)) => element(lm, ln),
            None => (self.region.c_element)(lm, ln),
        }
    }

    /// One element at a time (outputs without a pair type).
    fn store_one(&self, o: &mut Lines, d: usize) {
        o.line(d, format!("if (pf_in{}) {{", self.owned()));
        self.epilogue_statements(o, d + 1);
        o.line(
            d + 1,
            format!(
                "{} = {};",
                self.target_element("pf_lm", "pf_ln"),
                self.stored_value()
            ),
        );
        o.line(d, "}");
    }

    /// Accumulators `pf_r` and `pf_r + 1` (neighbours along n): both
    /// values computed into `pf_two`, then stored as one `pair_type` where
    /// they can be, else each one that is inside on its own.
    fn store_pair(&self, o: &mut Lines, d: usize, pair_type: &str) {
        let emulated = self.emulated();
        self.pair_values(o, d);
        let first = self.target_element("pf_lm", "pf_ln");
        let second = self.target_element("pf_lm", "pf_ln + 1");
        o.line(
            d,
            format!(
                "if (pf_inside[0] && pf_inside[1] && &{second} == &{first} + 1 && ((unsigned long long)&{first}) % sizeof({pair_type}) == 0) {{"
            ),
        );
        if emulated {
            o.line(
                d + 1,
                format!("memcpy(&{first}, pf_two, sizeof({pair_type}));"),
            );
        } else {
            o.line(
                d + 1,
                format!("*({pair_type} *)&{first} = *({pair_type} *)pf_two;"),
            );
        }
        o.line(d, "} else {");
        o.line(d + 1, format!("if (pf_inside[0]) {first} = pf_two[0];"));
        o.line(d + 1, format!("if (pf_inside[1]) {second} = pf_two[1];"));
        o.line(d, "}");
    }

    /// The values of accumulators `pf_r` and `pf_r + 1` after the
    /// epilogue's statements, in `pf_two`, and whether each is inside the
    /// output (and owned), in `pf_inside`.
    fn pair_values(&self, o: &mut Lines, d: usize) {
        let emulated = self.emulated();
        let stored_dtype = self.stored_dtype();
        let align = if emulated { "" } else { "__align__(8) " };
        o.line(
            d,
            format!(
                "{align}{} pf_two[2];",
                self.target.storage_type(stored_dtype)
            ),
        );
        o.line(d, "int pf_inside[2];");
        self.target.unroll(o, d);
        o.line(d, "for (int pf_c = 0; pf_c < 2; pf_c++) {");
        o.line(d + 1, "const int pf_r2 = pf_r + pf_c;");
        o.line(d + 1, "const pf_i pf_ln2 = pf_ln + pf_c;");
        let bounds = if self.region.full_tiles {
            "1"
        } else {
            "pf_m0 + pf_lm < pf_em && pf_n0 + pf_ln2 < pf_en"
        };
        o.line(
            d + 1,
            format!("pf_inside[pf_c] = {bounds}{};", self.owned()),
        );
        o.line(d + 1, "if (pf_inside[pf_c]) {");
        // The element's own names for the epilogue's statements.
        o.line(d + 2, "const int pf_r = pf_r2; const pf_i pf_ln = pf_ln2;");
        self.epilogue_statements(o, d + 2);
        o.line(d + 2, format!("pf_two[pf_c] = {};", self.stored_value()));
        o.line(d + 1, "}");
        o.line(d, "}");
    }
}
