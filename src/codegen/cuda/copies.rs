//! Copies of shared-memory tiles (`gpu::promote`): into their stages, by groups of elements a thread, in boxes.

use super::*;

impl Ctx<'_> {
    /// Copies the promoted tiles into shared memory: the prefix iterators
    /// isl generated no loop for, each tile's offset, one cooperative loop
    /// per tile (consecutive threads on consecutive elements of the
    /// innermost dimension; elements outside the tensor are skipped), and a
    /// barrier before the threads read the copies.
    pub(super) fn copy_in(&self, depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        self.prefix_constants(depth, out);
        self.offsets("pf_o", None, depth, out);
        self.copy_loops("pf_o", "", depth, out);
        self.t.barrier(self, &pad, out);
    }

    /// The start of a double-buffered promotion point right inside the
    /// loop `step = (c, start, condition, s)`: the tiles of step `c` are in
    /// stage `pf_stage = ((c - start) / s) mod 2` of their arrays. The first
    /// step copies its tiles into stage 0 (then a barrier); every step
    /// with a next one (`condition` at `c + s`) then fetches the next
    /// tiles: on the GPU each thread loads its elements into registers
    /// (`pf_next<k>`), the body computes on stage `pf_stage`, and
    /// `KernelTarget::store_next_stage` writes the registers to the other
    /// stage; the barrier at the end of each step of the loop orders that
    /// store before the next step's reads, and the reads of the other
    /// stage by the previous step before it. In the CPU emulation the next
    /// tiles are copied to the other stage here, before the body, which
    /// reads only its own stage (`KernelTarget::fetch_next_stage`).
    pub(super) fn copy_in_stages(
        &self,
        step: (&str, &Expr, &Expr, i64),
        depth: usize,
        out: &mut String,
    ) {
        if self.scope().is_none() {
            return;
        }
        let (it, start, cond, s) = step;
        let pad = "  ".repeat(depth);
        let start = self.e(start);
        // The step loop is the innermost prefix loop: the constants are
        // outer values, the same at the next step.
        self.prefix_constants(depth, out);
        self.offsets("pf_o", None, depth, out);
        let _ = writeln!(
            out,
            "{pad}const pf_i pf_stage = (({it} - ({start})) / {s}) % 2;"
        );
        let _ = writeln!(out, "{pad}if ({it} == ({start})) {{");
        self.copy_loops("pf_o", "", depth + 1, out);
        self.t.barrier(self, &format!("{pad}  "), out);
        let _ = writeln!(out, "{pad}}}");
        let _ = writeln!(
            out,
            "{pad}const int pf_has_next = {};",
            self.e(&shift(cond, it, s))
        );
        self.offsets("pf_n", Some((it, s)), depth, out);
        self.t.fetch_next_stage(self, depth, out);
    }

    /// The prefix iterators isl generated no loop for, as constants.
    pub(super) fn prefix_constants(&self, depth: usize, out: &mut String) {
        let Some(scope) = self.scope() else {
            return;
        };
        let pad = "  ".repeat(depth);
        for (d, v) in scope.prefix_values.iter().enumerate() {
            if let Some(v) = v {
                let _ = writeln!(out, "{pad}const pf_i c{d} = {}; (void)c{d};", self.e(v));
            }
        }
    }

    /// The offset of each promoted tile (`<name><array>_<dim>`), at the
    /// current prefix or, with `next = (iterator, step)`, at the next
    /// iteration of that loop.
    pub(super) fn offsets(
        &self,
        name: &str,
        next: Option<(&str, i64)>,
        depth: usize,
        out: &mut String,
    ) {
        let Some(scope) = self.scope() else {
            return;
        };
        let pad = "  ".repeat(depth);
        for (k, a) in scope.arrays.iter().enumerate() {
            for (d, o) in a.offset.iter().enumerate() {
                let o = match next {
                    Some((it, step)) => shift(o, it, step),
                    None => o.clone(),
                };
                let _ = writeln!(out, "{pad}const pf_i {name}{k}_{d} = {};", self.e(&o));
            }
        }
    }

    /// Four elements per step where the copy of `a` may read 16 bytes.
    pub(super) fn copy_width(&self, a: &Promotion) -> i64 {
        if a.vector4 && self.t.vectors() {
            4
        } else {
            1
        }
    }

    /// Names element `pf_e` (counted in groups of `width`) of array `k`'s
    /// box at offsets `<offsets><k>_<d>`: its box coordinates `pf_a<d>`
    /// and tensor coordinates `pf_g<d>`. Returns the test that it lies in
    /// the tensor, its global index and its index in the shared array
    /// (relative to the buffer's start).
    pub(super) fn box_element(
        &self,
        k: usize,
        a: &Promotion,
        offsets: &str,
        pad: &str,
        out: &mut String,
    ) -> (String, String, String) {
        let tensor = self
            .scop
            .tensor(&a.tensor)
            .expect("promoted tensors come from the model");
        let rank = a.sizes.len();
        let width = self.copy_width(a);
        let mut rest = "pf_e".to_string();
        for d in (0..rank).rev() {
            let size = if d + 1 == rank {
                a.sizes[d] / width
            } else {
                a.sizes[d]
            };
            let scale = if d + 1 == rank && width > 1 {
                format!(" * {width}")
            } else {
                String::new()
            };
            if d == 0 {
                let _ = writeln!(out, "{pad}const pf_i pf_a{d} = {rest}{scale};");
            } else {
                let _ = writeln!(out, "{pad}const pf_i pf_a{d} = ({rest} % {size}){scale};");
                rest = format!("({rest} / {size})");
            }
        }
        let mut conds = Vec::new();
        let mut local = Vec::new();
        let mut global = String::new();
        for d in 0..rank {
            let extent = self
                .printer
                .affine(&tensor.shape[d], &std::collections::HashMap::new());
            let _ = writeln!(out, "{pad}const pf_i pf_g{d} = {offsets}{k}_{d} + pf_a{d};");
            conds.push(format!("pf_g{d} >= 0 && pf_g{d} < {extent}"));
            local.push(format!("pf_a{d} * {}", a.layout.pitch[d]));
            global = if d == 0 {
                format!("pf_g{d}")
            } else {
                format!("({global}) * {extent} + pf_g{d}")
            };
        }
        if rank == 0 {
            global = "0".into();
            local.push("0".into());
        }
        let cond = if conds.is_empty() {
            "1".to_string()
        } else {
            conds.join(" && ")
        };
        (cond, global, local.join(" + "))
    }

    /// The index in `a`'s shared array of element `j` of a group of four
    /// starting at `local`: `j` pitches further along the innermost box
    /// dimension (pitch 1 unless a grouped layout put another dimension
    /// innermost). `base` (empty or `expr + `) selects a stage of a
    /// double-buffered array.
    pub(super) fn group_index(a: &Promotion, base: &str, local: &str, j: i64) -> String {
        let step = j * a.layout.pitch[a.sizes.len().max(1) - 1];
        format!("{base}{local} + {step}")
    }

    /// One cooperative loop per promoted tile copying it from global
    /// memory at offsets `<offsets><k>_<d>` into its shared array, at
    /// `base` (empty, or `expr + ` for a stage of a double buffer).
    pub(super) fn copy_loops(&self, offsets: &str, base: &str, depth: usize, out: &mut String) {
        let Some(scope) = self.scope() else {
            return;
        };
        for k in 0..scope.arrays.len() {
            self.copy_array(offsets, k, base, depth, out);
        }
    }

    /// The cooperative copy of array `k` (see [`Self::copy_loops`]).
    pub(super) fn copy_array(
        &self,
        offsets: &str,
        k: usize,
        base: &str,
        depth: usize,
        out: &mut String,
    ) {
        let Some(a) = self.scope().and_then(|s| s.arrays.get(k)) else {
            return;
        };
        let pad = "  ".repeat(depth);
        let box_len: i64 = a.sizes.iter().product();
        let width = self.copy_width(a);
        self.t.copy_loop(self, a, box_len, width, &pad, out);
        let inner = format!("{pad}  ");
        let (cond, global, local) = self.box_element(k, a, offsets, &inner, out);
        if width == 4 {
            self.load_group(a, &cond, &global, &inner, out, &|j| {
                format!("{}[{}]", a.buffer, Self::group_index(a, base, &local, j))
            });
        } else {
            let el = self.global_element(&a.tensor, &global, Some(false));
            let dst = if self.race() {
                let slot = self.scop.tensors.len() + k;
                format!("pf_race_w({slot}, {base}{local})")
            } else {
                format!("{base}{local}")
            };
            let _ = writeln!(out, "{inner}if ({cond}) {}[{dst}] = {el};", a.buffer);
        }
        let _ = writeln!(out, "{pad}}}");
        if self.race() {
            let _ = writeln!(out, "{pad}pf_race_thread_linear(0);");
        }
    }

    /// Four consecutive elements of `a`'s tensor from `global` (where
    /// `cond` holds) into `dst(0..4)`: one 16-byte load when the tensor's
    /// pointer is aligned (a caller's pointer need not be: the C ABI takes
    /// any device pointer; the test is uniform), else four loads.
    pub(super) fn load_group(
        &self,
        a: &Promotion,
        cond: &str,
        global: &str,
        pad: &str,
        out: &mut String,
        dst: &dyn Fn(i64) -> String,
    ) {
        self.printer.globals.note(&a.tensor);
        let t = tensor_name(&a.tensor);
        let _ = writeln!(out, "{pad}if ({cond}) {{");
        let _ = writeln!(out, "{pad}  if ((((unsigned long long){t}) & 15) == 0) {{");
        let _ = writeln!(
            out,
            "{pad}    const float4 pf_v = *(const float4 *)&{t}[{global}];"
        );
        for (j, f) in ["x", "y", "z", "w"].iter().enumerate() {
            let _ = writeln!(out, "{pad}    {} = pf_v.{f};", dst(j as i64));
        }
        let _ = writeln!(out, "{pad}  }} else {{");
        for j in 0..4 {
            let _ = writeln!(out, "{pad}    {} = {t}[{global} + {j}];", dst(j));
        }
        let _ = writeln!(out, "{pad}  }}");
        let _ = writeln!(out, "{pad}}}");
    }

    /// `(per_thread, threads)`: the groups of array `a`'s box each of the
    /// block's `threads` moves in a double-buffered copy.
    pub(super) fn groups_per_thread(&self, a: &Promotion) -> (i64, i64) {
        let threads: i64 = self.plan.block.iter().map(|b| i64::from(*b)).product();
        let groups = a.sizes.iter().product::<i64>() / self.copy_width(a);
        ((groups + threads - 1) / threads, threads)
    }

    /// Runs `body` (given its padding) on each group of array `a`'s box
    /// that this thread moves in a double-buffered copy, at `depth`: group
    /// `pf_e = thread + pf_s T` of `T` threads, in a loop unrolled so the
    /// staging registers `pf_next<k>[pf_s]` stay registers.
    pub(super) fn thread_share(
        &self,
        a: &Promotion,
        depth: usize,
        out: &mut String,
        body: &mut dyn FnMut(&str, &mut String),
    ) {
        let pad = "  ".repeat(depth);
        let (per_thread, threads) = self.groups_per_thread(a);
        let groups = a.sizes.iter().product::<i64>() / self.copy_width(a);
        let _ = writeln!(out, "{pad}#pragma unroll");
        let _ = writeln!(
            out,
            "{pad}for (int pf_s = 0; pf_s < {per_thread}; pf_s++) {{"
        );
        let _ = writeln!(
            out,
            "{pad}  const pf_i pf_e = threadIdx.x + (pf_i)blockDim.x * (threadIdx.y + (pf_i)blockDim.y * threadIdx.z) + pf_s * {threads};"
        );
        let _ = writeln!(out, "{pad}  if (pf_e < {groups}) {{");
        body(&format!("{pad}    "), out);
        let _ = writeln!(out, "{pad}  }}");
        let _ = writeln!(out, "{pad}}}");
    }
}
