//! The thread-mapped kernel on the GPU: CUDA, each thread running the
//! block's code as its own, the hardware's indices, barriers and
//! shuffles.

use std::fmt::Write;

use crate::codegen::expr::Printer;
use crate::frontend::ast::{DType, Reducer};
use crate::gpu::contraction::Contraction;
use crate::gpu::lanes::LaneAxis;
use crate::gpu::promote::Promotion;

use super::lanes::{barrier, Slot};
use super::target::{KernelTarget, MapLoop, WarpReduce};
use super::{other_stage, storage_type, tensor_name, Ctx, Pending};

/// CUDA, run by the GPU.
pub(super) struct Gpu;

/// The hardware's index of mapping `p`.
fn id_of(p: &Pending) -> String {
    format!("{}.{}", if p.0 { "threadIdx" } else { "blockIdx" }, p.1)
}

/// The hardware's count of the indices of mapping `p`.
fn count_of(p: &Pending) -> String {
    format!("{}.{}", if p.0 { "blockDim" } else { "gridDim" }, p.1)
}

impl KernelTarget for Gpu {
    fn watches_races(&self, _printer: &Printer<'_>) -> bool {
        false
    }

    fn barrier(&self, _c: &Ctx<'_>, pad: &str, out: &mut String) {
        let _ = writeln!(out, "{pad}__syncthreads();");
    }

    fn row_barrier(&self, c: &Ctx<'_>, pad: &str, out: &mut String) {
        let _ = writeln!(out, "{pad}{};", c.lane_barrier());
    }

    fn steps_in_order(&self) -> bool {
        false
    }

    fn mapped_index(
        &self,
        c: &Ctx<'_>,
        above: &[Pending],
        p: &Pending,
        pad: &str,
        out: &mut String,
    ) -> (String, String) {
        // Mappings above this one lost their loop: index 0.
        let guard = c.guard(above);
        if !guard.is_empty() {
            let _ = writeln!(out, "{pad}if ({guard})");
        }
        let (id, count) = (
            format!("(pf_i){}", id_of(p)),
            format!("(pf_i){}", count_of(p)),
        );
        let id = if c.reversed(p) {
            format!("({count} - 1 - {id})")
        } else {
            id
        };
        (id, count)
    }

    fn index_zero(&self, thread: bool, axis: char) -> Option<String> {
        let index = if thread { "threadIdx" } else { "blockIdx" };
        Some(format!("{index}.{axis} == 0"))
    }

    fn thread_loop(
        &self,
        _c: &Ctx<'_>,
        _axis: char,
        _count: u32,
        _down: bool,
        _pad: &str,
        _out: &mut String,
    ) {
    }

    fn thread_index(&self, axis: char) -> String {
        format!("(pf_i)threadIdx.{axis}")
    }

    fn unrolls(&self) -> bool {
        true
    }

    fn unroll(&self, pad: &str, out: &mut String) {
        let _ = writeln!(out, "{pad}#pragma unroll");
    }

    fn vectors(&self) -> bool {
        true
    }

    fn widens_inputs(&self) -> bool {
        true
    }

    fn loads_ahead(&self) -> bool {
        true
    }

    fn storage_type(&self, t: DType) -> &'static str {
        storage_type(t)
    }

    fn thread_rows(&self, _block: [u32; 3], _axes: &[char]) -> (&'static str, String) {
        ("", String::new())
    }

    fn thread_row(&self, _axes: &[char]) -> String {
        String::new()
    }

    fn thread_zero(&self, _axis: char, _pad: &str, _out: &mut String) {}

    fn lane_rows(&self, _width: u32) -> String {
        String::new()
    }

    fn lane_row(&self) -> &'static str {
        ""
    }

    fn each_lane(
        &self,
        c: &Ctx<'_>,
        pad: &str,
        out: &mut String,
        body: &mut dyn FnMut(&str, &str, &mut String),
    ) {
        body(c.lane_index(), pad, out);
    }

    fn mma_threads(&self, _threads: u32) -> Option<u32> {
        None
    }

    fn shared_arrays(
        &self,
        mark: &str,
        arrays: &[Promotion],
        contraction: Option<&Contraction>,
    ) -> String {
        let mut s = String::new();
        for a in arrays {
            // 16-byte aligned where the copy moves four elements at once,
            // so that vector accesses to the array can be proven aligned.
            let align = if a.vector4 { "__align__(16) " } else { "" };
            let _ = writeln!(
                s,
                "  __shared__ {align}{} {}[{}];",
                storage_type(a.dtype),
                a.buffer,
                a.layout.elements()
            );
        }
        if let Some(c) = contraction {
            s.push_str(&super::super::mma::declare(c, mark, false, "  "));
        }
        s
    }

    fn copy_loop(
        &self,
        _c: &Ctx<'_>,
        _a: &Promotion,
        box_len: i64,
        width: i64,
        pad: &str,
        out: &mut String,
    ) {
        let _ = writeln!(
            out,
            "{pad}for (pf_i pf_e = threadIdx.x + (pf_i)blockDim.x * (threadIdx.y + (pf_i)blockDim.y * threadIdx.z); pf_e < {}; pf_e += (pf_i)blockDim.x * blockDim.y * blockDim.z) {{",
            box_len / width
        );
    }

    fn fetch_next_stage(&self, c: &Ctx<'_>, depth: usize, out: &mut String) {
        let Some(scope) = c.scope() else {
            return;
        };
        let pad = "  ".repeat(depth);
        for (k, a) in scope.arrays.iter().enumerate() {
            let width = c.copy_width(a);
            let ty = storage_type(a.dtype);
            let (per_thread, _) = c.groups_per_thread(a);
            let _ = writeln!(out, "{pad}{ty} pf_next{k}[{per_thread}][{width}];");
            let _ = writeln!(out, "{pad}if (pf_has_next) {{");
            c.thread_share(a, depth + 1, out, &mut |inner, out| {
                let (cond, global, _) = c.box_element(k, a, "pf_n", inner, out);
                if width == 4 {
                    c.load_group(a, &cond, &global, inner, out, &|j| {
                        format!("pf_next{k}[pf_s][{j}]")
                    });
                } else {
                    c.printer.globals.note(&a.tensor);
                    let t = tensor_name(&a.tensor);
                    let _ = writeln!(
                        out,
                        "{inner}if ({cond}) pf_next{k}[pf_s][0] = {t}[{global}];"
                    );
                }
            });
            let _ = writeln!(out, "{pad}}}");
        }
    }

    fn store_next_stage(&self, c: &Ctx<'_>, depth: usize, out: &mut String) {
        let Some(scope) = c.scope() else {
            return;
        };
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}if (pf_has_next) {{");
        for (k, a) in scope.arrays.iter().enumerate() {
            let width = c.copy_width(a);
            c.thread_share(a, depth + 1, out, &mut |inner, out| {
                let (cond, _, local) = c.box_element(k, a, "pf_n", inner, out);
                let base = other_stage(a);
                let _ = writeln!(out, "{inner}if ({cond}) {{");
                for j in 0..width {
                    let dst = if width == 1 {
                        format!("{base}{local}")
                    } else {
                        Ctx::group_index(a, &base, &local, j)
                    };
                    let _ = writeln!(out, "{inner}  {}[{dst}] = pf_next{k}[pf_s][{j}];", a.buffer);
                }
                let _ = writeln!(out, "{inner}}}");
            });
        }
        let _ = writeln!(out, "{pad}}}");
    }

    fn warp_reduce(&self, c: &Ctx<'_>, r: &WarpReduce<'_>, out: &mut String) {
        let pad = r.pad;
        let name = match r.op {
            Reducer::Sum => "sum",
            Reducer::Prod => "prod",
            Reducer::Max => "max",
            Reducer::Min => "min",
        };
        let mut guard = c.guard(r.pending);
        guard = if guard.is_empty() {
            "threadIdx.x == 0".to_string()
        } else {
            format!("{guard} && threadIdx.x == 0")
        };
        let _ = writeln!(out, "{pad}  {{");
        (r.per_lane)(out, &format!("{pad}    "), "(pf_i)threadIdx.x");
        let _ = writeln!(out, "{pad}    pf_red = pf_warp_{name}(pf_red);");
        let _ = writeln!(out, "{pad}    if ({guard}) {}", r.fold);
        let _ = writeln!(out, "{pad}  }}");
    }

    fn map_loop(&self, c: &Ctx<'_>, m: &MapLoop<'_, '_>, out: &mut String) {
        let pad = "  ".repeat(m.depth);
        match (m.slots, c.stored_in_fours(m.body, m.head.0)) {
            (Some(slots), Some(store)) => m
                .inner
                .map_loop_in_fours(m.head, slots, m.body, &store, m.depth, m.pending, out),
            _ => (m.share)(out, &pad, c.lane_index(), m.depth),
        }
        // Later statements of the row may read what other lanes wrote.
        let _ = writeln!(out, "{pad}{};", c.lane_barrier());
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
        match c.threads.lane_axis {
            LaneAxis::Y(columns) => {
                split_loop_columns(c, columns, carried, slots, share, depth, out)
            }
            LaneAxis::X => split_loop_warps(c, slots, carried, share, depth, out),
        }
    }
}

/// [`Ctx::split_loop`]'s GPU form for lanes on x: lanes other than 0
/// start from the identities, each runs its share, a butterfly of
/// shuffles combines each warp's states, and with several warps on a
/// row, the warps' states through shared memory.
fn split_loop_warps(
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
    let _ = writeln!(out, "{p}if (threadIdx.x != 0) {{");
    for s in carried {
        let _ = writeln!(out, "{p}  {} = {};", s.buffer, identity(s));
    }
    let _ = writeln!(out, "{p}}}");
    share(out, &p, "(pf_i)threadIdx.x", depth + 1);
    let _ = writeln!(out, "{p}for (int pf_o = 16; pf_o > 0; pf_o >>= 1) {{");
    c.combine_with(
        carried,
        slots,
        &format!("{p}  "),
        &|b| format!("__shfl_xor_sync(0xffffffffu, {b}, pf_o)"),
        out,
    );
    let _ = writeln!(out, "{p}}}");
    if width > 32 {
        // Then the warps' states, through shared memory, combined
        // by every thread in warp order (so all hold the same).
        // One set of parts per group of rows along y.
        let warps = width / 32;
        let groups = c.plan.block[1];
        let sync = barrier(c.plan.block);
        for s in carried {
            let _ = writeln!(
                out,
                "{p}__shared__ {} pf_part_{}[{}];",
                s.ty,
                s.buffer,
                warps * groups
            );
        }
        let part = |b: &str, w: &str| {
            if groups > 1 {
                format!("pf_part_{b}[threadIdx.y * {warps} + ({w})]")
            } else {
                format!("pf_part_{b}[{w}]")
            }
        };
        let _ = writeln!(out, "{p}if ((threadIdx.x & 31) == 0) {{");
        for s in carried {
            let _ = writeln!(
                out,
                "{p}  {} = {b};",
                part(&s.buffer, "threadIdx.x >> 5"),
                b = s.buffer
            );
        }
        let _ = writeln!(out, "{p}}}");
        let _ = writeln!(out, "{p}{sync};");
        for s in carried {
            let _ = writeln!(out, "{p}{b} = {};", part(&s.buffer, "0"), b = s.buffer);
        }
        let _ = writeln!(out, "{p}for (int pf_w = 1; pf_w < {warps}; pf_w++) {{");
        c.combine_with(carried, slots, &format!("{p}  "), &|b| part(b, "pf_w"), out);
        let _ = writeln!(out, "{p}}}");
        // The parts are read before a later loop writes them.
        let _ = writeln!(out, "{p}{sync};");
    }
}

/// [`Ctx::split_loop`]'s GPU form for lanes on y (columns,
/// `gpu::lanes::LaneAxis::Y`): each lane runs its share, stores its
/// partial states in shared memory at `[lane][row]` (`lane * rows +
/// threadIdx.x`), and after a barrier every lane of a row combines the
/// row's `W` parts in lane order (so all hold the same states, lane
/// 0's from the state before the loop first); a second barrier keeps
/// the parts until all have read them. Each thread writes one element
/// of each part array and reads only its own row's: the barriers order
/// every write before every read of another thread, and the reads
/// before the next loop's writes.
fn split_loop_columns(
    c: &Ctx<'_>,
    columns: crate::gpu::lanes::Columns,
    carried: &[&Slot],
    slots: &[Slot],
    share: &dyn Fn(&mut String, &str, &str, usize),
    depth: usize,
    out: &mut String,
) {
    let p = "  ".repeat(depth + 1);
    let (rows, width) = (columns.rows, columns.lanes);
    let identity = |s: &Slot| c.slot_identity(s);
    let _ = writeln!(out, "{p}if (threadIdx.y != 0) {{");
    for s in carried {
        let _ = writeln!(out, "{p}  {} = {};", s.buffer, identity(s));
    }
    let _ = writeln!(out, "{p}}}");
    share(out, &p, c.lane_index(), depth + 1);
    for s in carried {
        let _ = writeln!(
            out,
            "{p}__shared__ {} pf_part_{}[{}];",
            s.ty,
            s.buffer,
            rows * width
        );
    }
    let part =
        |b: &str, lane: &str| format!("pf_part_{b}[{}]", columns.part_element(lane, "threadIdx.x"));
    for s in carried {
        let _ = writeln!(
            out,
            "{p}{} = {b};",
            part(&s.buffer, "threadIdx.y"),
            b = s.buffer
        );
    }
    let _ = writeln!(out, "{p}__syncthreads();");
    for s in carried {
        let _ = writeln!(out, "{p}{b} = {};", part(&s.buffer, "0"), b = s.buffer);
    }
    let _ = writeln!(out, "{p}for (int pf_w = 1; pf_w < {width}; pf_w++) {{");
    c.combine_with(carried, slots, &format!("{p}  "), &|b| part(b, "pf_w"), out);
    let _ = writeln!(out, "{p}}}");
    let _ = writeln!(out, "{p}__syncthreads();");
}
