//! The thread-mapped kernel emulated on the CPU: C, the blocks, the
//! threads and a row's lanes as loops (the blocks and the threads from the
//! last one down, see `cuda::program`), each thread's part between two
//! barriers run whole, with the race detector's hooks where it watches.

use std::fmt::Write;

use crate::codegen::expr::Printer;
use crate::frontend::ast::DType;
use crate::gpu::contraction::Contraction;
use crate::gpu::promote::Promotion;

use super::lanes::Slot;
use super::target::{KernelTarget, MapLoop, WarpReduce};
use super::{other_stage, Ctx, Pending, EMULATED_BLOCKS};

/// C, run by the CPU.
pub(super) struct Emulation;

/// The condition `var >= 0` (`down`) or `var < count` of an emulated loop
/// over the blocks or threads (`thread`) of `axis`, which also tells the
/// race detector the current index (0 once the loop ends).
fn index_test(c: &Ctx<'_>, var: &str, count: u32, down: bool, thread: bool, axis: char) -> String {
    let test = if down {
        format!("{var} >= 0")
    } else {
        format!("{var} < {count}")
    };
    if c.race() {
        let a = super::super::race::axis_code(thread, axis);
        format!("pf_race_in({a}, {var}, {test})")
    } else {
        test
    }
}

/// The head of an emulated loop of `var` over the `count` blocks or
/// threads (`thread`) of `axis`, from the last one down (`down`) or from 0
/// up.
#[allow(clippy::too_many_arguments)]
fn index_loop(
    c: &Ctx<'_>,
    var: &str,
    count: u32,
    down: bool,
    thread: bool,
    axis: char,
    pad: &str,
    out: &mut String,
) {
    let test = index_test(c, var, count, down, thread, axis);
    if down {
        let _ = writeln!(
            out,
            "{pad}for (pf_i {var} = {}; {test}; {var}--)",
            count - 1
        );
    } else {
        let _ = writeln!(out, "{pad}for (pf_i {var} = 0; {test}; {var}++)");
    }
}

impl KernelTarget for Emulation {
    fn watches_races(&self, printer: &Printer<'_>) -> bool {
        printer.race.get()
    }

    fn barrier(&self, c: &Ctx<'_>, pad: &str, out: &mut String) {
        if c.race() {
            let _ = writeln!(out, "{pad}pf_race_barrier();");
        }
    }

    fn row_barrier(&self, _c: &Ctx<'_>, _pad: &str, _out: &mut String) {}

    fn steps_in_order(&self) -> bool {
        true
    }

    fn mapped_index(
        &self,
        c: &Ctx<'_>,
        _above: &[Pending],
        p: &Pending,
        pad: &str,
        out: &mut String,
    ) -> (String, String) {
        let block = c.plan.block;
        let axis = (p.1 as u8).saturating_sub(b'x') as usize;
        let (var, count) = if p.0 {
            (format!("pf_thread_{}", p.1), block[axis.min(2)])
        } else {
            (format!("pf_block_{}", p.1), EMULATED_BLOCKS)
        };
        index_loop(c, &var, count, true, p.0, p.1, pad, out);
        let id = if c.reversed(p) {
            format!("({} - {var})", count - 1)
        } else {
            var
        };
        (id, count.to_string())
    }

    fn index_zero(&self, _thread: bool, _axis: char) -> Option<String> {
        None
    }

    fn thread_loop(
        &self,
        c: &Ctx<'_>,
        axis: char,
        count: u32,
        down: bool,
        pad: &str,
        out: &mut String,
    ) {
        let var = format!("pf_thread_{axis}");
        index_loop(c, &var, count, down, true, axis, pad, out);
    }

    fn thread_index(&self, axis: char) -> String {
        format!("pf_thread_{axis}")
    }

    fn unrolls(&self) -> bool {
        false
    }

    fn unroll(&self, _pad: &str, _out: &mut String) {}

    fn vectors(&self) -> bool {
        false
    }

    fn widens_inputs(&self) -> bool {
        false
    }

    fn loads_ahead(&self) -> bool {
        false
    }

    fn storage_type(&self, t: DType) -> &'static str {
        super::super::c::storage_type(t)
    }

    fn thread_rows(&self, block: [u32; 3], axes: &[char]) -> (&'static str, String) {
        let mut dims = String::new();
        for a in axes {
            let b = block[(*a as u8 - b'x') as usize];
            let _ = write!(dims, "[{b}]");
        }
        ("static ", dims)
    }

    fn thread_row(&self, axes: &[char]) -> String {
        let mut idx = String::new();
        for a in axes {
            let _ = write!(idx, "[pf_thread_{a}]");
        }
        idx
    }

    fn thread_zero(&self, axis: char, pad: &str, out: &mut String) {
        let _ = writeln!(
            out,
            "{pad}const pf_i pf_thread_{axis} = 0; (void)pf_thread_{axis};"
        );
    }

    fn lane_rows(&self, width: u32) -> String {
        format!("[{width}]")
    }

    fn lane_row(&self) -> &'static str {
        "[pf_lane]"
    }

    fn each_lane(
        &self,
        c: &Ctx<'_>,
        pad: &str,
        out: &mut String,
        body: &mut dyn FnMut(&str, &str, &mut String),
    ) {
        let _ = writeln!(
            out,
            "{pad}for (pf_i pf_lane = 0; pf_lane < {}; pf_lane++) {{",
            c.lane_width()
        );
        body("pf_lane", &format!("{pad}  "), out);
        let _ = writeln!(out, "{pad}}}");
    }

    fn mma_threads(&self, threads: u32) -> Option<u32> {
        Some(threads)
    }

    fn shared_arrays(
        &self,
        mark: &str,
        arrays: &[Promotion],
        contraction: Option<&Contraction>,
    ) -> String {
        let mut s = String::new();
        for a in arrays {
            let _ = writeln!(
                s,
                "    static {} {}[{}];",
                super::super::c::storage_type(a.dtype),
                a.buffer,
                a.layout.elements()
            );
        }
        if let Some(c) = contraction {
            s.push_str(&super::super::mma::declare(c, mark, true, "    "));
        }
        s
    }

    fn copy_loop(
        &self,
        c: &Ctx<'_>,
        a: &Promotion,
        box_len: i64,
        _width: i64,
        pad: &str,
        out: &mut String,
    ) {
        let _ = writeln!(out, "{pad}for (pf_i pf_e = 0; pf_e < {box_len}; pf_e++) {{");
        if c.race() {
            // The thread that copies this element on the GPU (groups
            // of four where the GPU moves four at once).
            let group = if a.vector4 { 4 } else { 1 };
            let threads: u32 = c.plan.block.iter().product();
            let _ = writeln!(
                out,
                "{pad}  pf_race_thread_linear((pf_e / {group}) % {threads});"
            );
        }
    }

    fn fetch_next_stage(&self, c: &Ctx<'_>, depth: usize, out: &mut String) {
        let Some(scope) = c.scope() else {
            return;
        };
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}if (pf_has_next) {{");
        for (k, a) in scope.arrays.iter().enumerate() {
            c.copy_array("pf_n", k, &other_stage(a), depth + 1, out);
        }
        let _ = writeln!(out, "{pad}}}");
    }

    fn store_next_stage(&self, _c: &Ctx<'_>, _depth: usize, _out: &mut String) {}

    fn warp_reduce(&self, c: &Ctx<'_>, r: &WarpReduce<'_>, out: &mut String) {
        let (pad, ty) = (r.pad, r.ty);
        let all = c.printer.combine(r.op, r.t, "pf_red_all", "pf_red");
        let _ = writeln!(out, "{pad}  {ty} pf_red_all = {};", r.ident);
        // Lane `l` is thread `l` along x for the race detector (a
        // warp along x, as the GPU code assumes).
        let test = if c.plan.block[0] == 32 {
            index_test(c, "pf_lane", 32, true, true, 'x')
        } else {
            "pf_lane >= 0".to_string()
        };
        let _ = writeln!(out, "{pad}  for (pf_i pf_lane = 31; {test}; pf_lane--) {{");
        (r.per_lane)(out, &format!("{pad}    "), "pf_lane");
        let _ = writeln!(out, "{pad}    pf_red_all = {all};");
        let _ = writeln!(out, "{pad}  }}");
        let _ = writeln!(out, "{pad}  {ty} pf_red = pf_red_all;");
        let _ = writeln!(out, "{pad}  {}", r.fold);
    }

    fn map_loop(&self, c: &Ctx<'_>, m: &MapLoop<'_, '_>, out: &mut String) {
        // The whole loop, or lane after lane where it reads a cached row.
        if m.slots.is_none() {
            m.inner.node(m.whole, m.depth, m.pending, m.in_thread, out);
            return;
        }
        let pad = "  ".repeat(m.depth);
        self.each_lane(c, &pad, out, &mut |lane, p, out| {
            (m.share)(out, p, lane, m.depth + 1)
        });
    }

    fn split_loop(
        &self,
        c: &Ctx<'_>,
        slots: &[Slot],
        carried: &[&Slot],
        share: &dyn Fn(&mut String, &str, &str, usize),
        depth: usize,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        let width = c.lane_width();
        let identity = |s: &Slot| c.slot_identity(s);
        let p = format!("{pad}  ");
        for s in carried {
            let _ = writeln!(
                out,
                "{p}{} pf_pre_{b} = {b}, pf_lane_{b}[{width}];",
                s.ty,
                b = s.buffer
            );
        }
        let _ = writeln!(
            out,
            "{p}for (pf_i pf_lane = 0; pf_lane < {width}; pf_lane++) {{"
        );
        for s in carried {
            let _ = writeln!(
                out,
                "{p}  {b} = pf_lane == 0 ? pf_pre_{b} : {};",
                identity(s),
                b = s.buffer
            );
        }
        share(out, &format!("{p}  "), "pf_lane", depth + 2);
        for s in carried {
            let _ = writeln!(out, "{p}  pf_lane_{b}[pf_lane] = {b};", b = s.buffer);
        }
        let _ = writeln!(out, "{p}}}");
        let _ = writeln!(
            out,
            "{p}for (int pf_o = {}; pf_o > 0; pf_o >>= 1) {{",
            width / 2
        );
        for s in carried {
            let _ = writeln!(out, "{p}  {} pf_next_{}[{width}];", s.ty, s.buffer);
        }
        let _ = writeln!(out, "{p}  for (int pf_l = 0; pf_l < {width}; pf_l++) {{");
        for s in carried {
            let _ = writeln!(
                out,
                "{p}    {t} {b} = pf_lane_{b}[pf_l];",
                t = s.ty,
                b = s.buffer
            );
        }
        c.combine_with(
            carried,
            slots,
            &format!("{p}    "),
            &|b| format!("pf_lane_{b}[pf_l ^ pf_o]"),
            out,
        );
        for s in carried {
            let _ = writeln!(out, "{p}    pf_next_{b}[pf_l] = {b};", b = s.buffer);
        }
        let _ = writeln!(out, "{p}  }}");
        for s in carried {
            let _ = writeln!(
                    out,
                    "{p}  for (int pf_l = 0; pf_l < {width}; pf_l++) pf_lane_{b}[pf_l] = pf_next_{b}[pf_l];",
                    b = s.buffer
                );
        }
        let _ = writeln!(out, "{p}}}");
        for s in carried {
            let _ = writeln!(out, "{p}{b} = pf_lane_{b}[0];", b = s.buffer);
        }
    }
}
