//! The epilogue: each lane stores the accumulator elements it owns (of a
//! split, those its block owns) through the statement's element map,
//! after the epilogue's statements, two neighbours along n at a time where
//! the output allows.

use super::engine::Engine;
use super::writer::Lines;
use crate::frontend::ast::DType;

impl Engine<'_, '_> {
    /// The stores. The value stored is `pf_cv` into the update's tensor,
    /// or `pf_dv` into the tensor the epilogue moves it to. Two neighbours
    /// along n are stored as one access (4 bytes for 16-bit outputs, 8 for
    /// f32) where both are inside, adjacent in memory and the first is
    /// aligned to the pair; otherwise one at a time. Measured on the H100
    /// (f16 4096^3, wgmma): single 2-byte stores took 17 us more.
    pub(super) fn store(&self, o: &mut Lines) {
        let stored_dtype = match self.region.moved {
            Some((_, t)) => t,
            None => self.region.c_dtype,
        };
        let d = self.target.open_threads(o, 1, self.threads);
        match self.target.pair_type(stored_dtype) {
            Some(pair_type) => {
                self.fragments(o, d, true, |o, d| self.store_pair(o, d, pair_type));
            }
            None => self.fragments(o, d, false, |o, d| self.store_one(o, d)),
        }
        self.target.close_threads(o, 1);
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
        let stored_dtype = match self.region.moved {
            Some((_, t)) => t,
            None => self.region.c_dtype,
        };
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
}
