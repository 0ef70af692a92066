//! The C printer. It prints
//! * the optimised kernel `pf_kernel`, from the isl AST of the final
//!   (tiled) schedule, each statement instance in its compute types;
//! * the reference `pf_reference`, straight from the program in body order
//!   with plain loops over each statement's iteration domain, every float in
//!   `double`: the unoptimised program the checks compare with;
//! * next to it `pf_declared`, the same loops with every stored value
//!   rounded to its tensor's dtype (`Mode::Declared`): the declared-precision
//!   run whose error sets how far the checks let a program's own dtypes
//!   carry it from the reference.
//!
//! Both take `(const long *params, void **tensors)`, tensors in the
//! program's order (inputs, outputs, temps), parameters in file order.

use std::collections::HashMap;
use std::fmt::Write;

use super::expr::{accumulator_dtype, param_name, round_to_dtype, tensor_name, Mode, Printer};
use crate::frontend::ast::{DType, Program};
use crate::isl::ast::{c_expr, Node};
use crate::model::{Scop, StmtKind};

/// Helpers every generated C file starts with.
pub const PRELUDE: &str = r#"#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
static inline long pf_floord(long a, long b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
#define pf_min(a, b) ((a) < (b) ? (a) : (b))
#define pf_max(a, b) ((a) > (b) ? (a) : (b))
static inline int pf_iabs(int a) { return a < 0 ? -a : a; }
static inline float pf_h2f(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t pf_f2h(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
static inline float pf_b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t pf_f2b(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
"#;

/// Helpers of the dtypes added after the first five, printed after
/// [`PRELUDE`] for programs that use them ([`prelude`]), and always in the
/// runtime's harness:
///
/// * `pf_f2e4m3`, `pf_f2e5m2`: a `double` (an f32 converts exactly) to the
///   8-bit float's byte as CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE,
///   ..)` converts it (`__nv_fp8_e4m3(float)`, and `cvt.rn.satfinite` on
///   sm_89 and later): round to nearest even; a magnitude that rounds above
///   the largest finite value (448, 57344), infinities included, gives that
///   value with its sign; NaN gives 0x7f. The rounding is done with `rint`
///   on the value scaled by a power of two (exact), under C's default
///   rounding mode (to nearest even).
/// * `pf_e4m3_2f`, `pf_e5m2_2f`: the byte's value as an f32 (e4m3's 0x7f
///   and 0xff are NaN; e5m2 has infinities and NaNs as IEEE formats do).
/// * `pf_f2i`: a float truncated toward zero to an `int`, saturating at
///   the `int` range, NaN to 0: the first step of `u8(x)` of a float, the
///   same on every target (C leaves an out-of-range conversion undefined).
pub const DTYPE_HELPERS: &str = r#"static inline int pf_f2i(double x) { return x != x ? 0 : x >= 2147483647.0 ? INT_MAX : x <= -2147483648.0 ? INT_MIN : (int)x; }
static inline uint8_t pf_f2fp8(double x, int mant, int bias, double maxnorm) {
  if (x != x) return 0x7f;
  uint8_t sign = signbit(x) ? 0x80 : 0;
  double a = fabs(x);
  if (a == 0.0) return sign;
  int e; frexp(a, &e); e -= 1;                    /* a in [2^e, 2^(e+1)) */
  if (e < 1 - bias) e = 1 - bias;                 /* subnormals share the least exponent */
  double r = ldexp(rint(ldexp(a, mant - e)), e - mant); /* nearest even at that spacing */
  if (r > maxnorm) r = maxnorm;                   /* satfinite */
  if (r == 0.0) return sign;
  int re; frexp(r, &re); re -= 1;
  if (re < 1 - bias) return (uint8_t)(sign | (int)ldexp(r, bias - 1 + mant));
  return (uint8_t)(sign | ((re + bias) << mant) | ((int)ldexp(r, mant - re) - (1 << mant)));
}
static inline uint8_t pf_f2e4m3(double x) { return pf_f2fp8(x, 3, 7, 448.0); }
static inline uint8_t pf_f2e5m2(double x) { return pf_f2fp8(x, 2, 15, 57344.0); }
static inline float pf_e4m3_2f(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  float v = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
  return b & 0x80 ? -v : v;
}
static inline float pf_e5m2_2f(uint8_t b) {
  int e = (b >> 2) & 31, m = b & 3;
  float v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -16) : ldexpf((float)(4 + m), e - 17);
  return b & 0x80 ? -v : v;
}
"#;

/// The C prelude of `program`: [`PRELUDE`], with [`DTYPE_HELPERS`] where
/// the program uses one of their dtypes.
pub fn prelude(program: &Program) -> String {
    if program.uses_extra_dtypes() {
        format!("{PRELUDE}{DTYPE_HELPERS}")
    } else {
        PRELUDE.to_string()
    }
}

/// C storage type of a tensor element. bool is a byte holding 0 or 1.
pub fn storage_type(t: DType) -> &'static str {
    match t {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "uint16_t",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => "uint8_t",
    }
}

/// `slots[i]`, where given, is the position in `pf_tensors` of
/// `scop.tensors[i]` (the reference's tensors among the compiled
/// program's); else its own position.
pub(crate) fn header(
    program: &Program,
    scop: &Scop,
    slots: Option<&[usize]>,
    fname: &str,
    mode: Mode,
    out: &mut String,
) {
    let _ = writeln!(
        out,
        "void {fname}(const long *pf_params, void **pf_tensors) {{"
    );
    for (i, p) in program.params.iter().enumerate() {
        match (mode, p.value) {
            (Mode::Native, Some(v)) => {
                let _ = writeln!(
                    out,
                    "  const long {} = {v}; (void)pf_params;",
                    param_name(&p.name)
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "  const long {} = pf_params[{i}];",
                    param_name(&p.name)
                );
            }
        }
    }
    for (i, t) in scop.tensors.iter().enumerate() {
        let i = slots.map_or(i, |s| s[i]);
        let ty = if mode.is_reference() {
            "double"
        } else {
            storage_type(t.dtype)
        };
        let _ = writeln!(
            out,
            "  {ty} *restrict {} = ({ty} *)pf_tensors[{i}];",
            tensor_name(&t.name)
        );
    }
    for p in &program.params {
        let _ = writeln!(out, "  (void){};", param_name(&p.name));
    }
    for t in &scop.tensors {
        let _ = writeln!(out, "  (void){};", tensor_name(&t.name));
    }
}

/// The f16 and bf16 tensors (and 8-bit floats) a reduction accumulates into. On the CPU they
/// are kept in f32 while the kernel runs and rounded once at its end, as a
/// GPU keeps its accumulators in f32 registers (and cuBLAS or PyTorch
/// accumulate a half-precision product): rounding every step of a long
/// reduction to 11 bits of mantissa would lose more than the checks allow.
pub fn wide_accumulators(program: &Program, scop: &Scop) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in &scop.statements {
        if s.kind != crate::model::StmtKind::Update {
            continue;
        }
        let t = &program.statements[s.source].lhs_tensor;
        let narrow = scop.tensor(t).is_some_and(|x| x.dtype.is_narrow_float());
        if narrow && !out.contains(t) {
            out.push(t.clone());
        }
    }
    out
}

/// The optimised kernel: the loops of `ast` with each statement instance
/// expanded in place.
pub fn kernel(program: &Program, scop: &Scop, ast: &Node) -> String {
    let params: Vec<String> = program.params.iter().map(|p| p.name.clone()).collect();
    let wide = wide_accumulators(program, scop);
    let tensors: Vec<crate::model::ModelTensor> = scop
        .tensors
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if wide.contains(&t.name) {
                t.dtype = DType::F32;
            }
            t
        })
        .collect();
    let printer = Printer {
        tensors: &tensors,
        params: &params,
        mode: Mode::Native,
        overrides: Default::default(),
        privates: Default::default(),
        fixed_selects: Default::default(),
        run_reads: Default::default(),
        fast_exp: false,
        scaled_reads: Default::default(),
        race: Default::default(),
        globals: Default::default(),
    };
    let mut out = String::new();
    let _ = writeln!(out, "/* {}: generated by polyfuse */", program.name);
    header(program, scop, None, "pf_kernel", Mode::Native, &mut out);
    // Wide copies of the narrow accumulators, shadowing their pointers.
    let mut restore = String::new();
    for name in &wide {
        let Some(t) = scop.tensor(name) else {
            continue;
        };
        let len = element_count(&printer, t);
        let (to, from) = t.dtype.narrow_conversions().expect("a narrow float");
        let v = tensor_name(name);
        let _ = writeln!(out, "  {} *pf_narrow_{name} = {v};", storage_type(t.dtype));
        let _ = writeln!(out, "  const long pf_len_{name} = {len};");
        let _ = writeln!(
            out,
            "  float *pf_wide_{name} = (float *)malloc((size_t)(pf_len_{name} > 0 ? pf_len_{name} : 1) * sizeof(float));"
        );
        let _ = writeln!(
            out,
            "  for (long pf_e = 0; pf_e < pf_len_{name}; pf_e++) pf_wide_{name}[pf_e] = {to}(pf_narrow_{name}[pf_e]);"
        );
        let _ = writeln!(
            restore,
            "  for (long pf_e = 0; pf_e < pf_len_{name}; pf_e++) pf_narrow_{name}[pf_e] = {from}(pf_wide_{name}[pf_e]);\n  free(pf_wide_{name});"
        );
    }
    out.push_str("  {\n");
    for name in &wide {
        let _ = writeln!(
            out,
            "  float *restrict {} = pf_wide_{name};",
            tensor_name(name)
        );
    }
    print_node(ast, 2, program, scop, &printer, &params, &mut out);
    out.push_str("  }\n");
    out.push_str(&restore);
    out.push_str("}\n");
    out
}

/// C text of the number of elements of `t`.
fn element_count(printer: &Printer, t: &crate::model::ModelTensor) -> String {
    let len: Vec<String> = t
        .shape
        .iter()
        .map(|e| printer.affine(e, &HashMap::new()))
        .collect();
    if len.is_empty() {
        "1".to_string()
    } else {
        len.join(" * ")
    }
}

fn rename_isl(params: &[String]) -> impl Fn(&str) -> String + '_ {
    move |s: &str| {
        if params.iter().any(|p| p == s) {
            param_name(s)
        } else {
            s.to_string()
        }
    }
}

fn print_node(
    n: &Node,
    depth: usize,
    program: &Program,
    scop: &Scop,
    printer: &Printer,
    params: &[String],
    out: &mut String,
) {
    let pad = "  ".repeat(depth);
    let rename = rename_isl(params);
    match n {
        Node::For {
            iterator,
            init,
            cond,
            inc,
            body,
        } => {
            let _ = writeln!(
                out,
                "{pad}for (long {iterator} = {}; {}; {iterator} += {}) {{",
                c_expr(init, &rename),
                c_expr(cond, &rename),
                c_expr(inc, &rename)
            );
            print_node(body, depth + 1, program, scop, printer, params, out);
            let _ = writeln!(out, "{pad}}}");
        }
        Node::If {
            cond,
            then,
            otherwise,
        } => {
            let _ = writeln!(out, "{pad}if ({}) {{", c_expr(cond, &rename));
            print_node(then, depth + 1, program, scop, printer, params, out);
            if let Some(e) = otherwise {
                let _ = writeln!(out, "{pad}}} else {{");
                print_node(e, depth + 1, program, scop, printer, params, out);
            }
            let _ = writeln!(out, "{pad}}}");
        }
        Node::Block(v) => {
            for c in v {
                print_node(c, depth, program, scop, printer, params, out);
            }
        }
        Node::Mark { name, body } => {
            let _ = writeln!(out, "{pad}/* {name} */");
            print_node(body, depth, program, scop, printer, params, out);
        }
        Node::User { statement, args } => {
            let s = scop
                .statement(statement)
                .expect("AST statements come from the model");
            let env: HashMap<String, String> = s
                .iterators
                .iter()
                .zip(args)
                .map(|(i, a)| (i.clone(), c_expr(a, &rename)))
                .collect();
            let st = &program.statements[s.source];
            let _ = writeln!(out, "{pad}{}", printer.statement(st, s.kind, &env));
        }
    }
}

/// Integer bounds `[lo, hi]` of every iterator of every statement, for the
/// reference loops (all parameters known).
pub type Boxes = HashMap<String, Vec<(i64, i64)>>;

/// The reference `pf_reference` and the declared-precision run
/// `pf_declared` (both on `double` tensors, see the module comment), of
/// the original program (`scop`), run on the compiled program's tensors:
/// `slots[i]` is the position there of `scop.tensors[i]` (a repair adds
/// temps, wherever its model lists them).
pub fn reference(program: &Program, scop: &Scop, slots: &[usize], boxes: &Boxes) -> String {
    let mut out = String::new();
    for (mode, fname) in [
        (Mode::Reference, "pf_reference"),
        (Mode::Declared, "pf_declared"),
    ] {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&reference_function(
            program, scop, slots, boxes, mode, fname,
        ));
    }
    out
}

/// For each statement in body order, plain loops over the bounding box of
/// its domain with its `where` constraints as a guard, printed in `mode`.
/// A loop block is a loop over its range around its statements, which
/// loop over their other iterators.
fn reference_function(
    program: &Program,
    scop: &Scop,
    slots: &[usize],
    boxes: &Boxes,
    mode: Mode,
    fname: &str,
) -> String {
    let params: Vec<String> = program.params.iter().map(|p| p.name.clone()).collect();
    let printer = Printer {
        tensors: &scop.tensors,
        params: &params,
        mode,
        overrides: Default::default(),
        privates: Default::default(),
        fixed_selects: Default::default(),
        run_reads: Default::default(),
        fast_exp: false,
        scaled_reads: Default::default(),
        race: Default::default(),
        globals: Default::default(),
    };
    let mut out = String::new();
    header(program, scop, Some(slots), fname, mode, &mut out);
    // The loop blocks open around the statement being printed.
    let mut open: Vec<usize> = Vec::new();
    for s in &scop.statements {
        let keep = open
            .iter()
            .zip(&s.blocks)
            .take_while(|(a, b)| **a == b.id)
            .count();
        while open.len() > keep {
            open.pop();
            let _ = writeln!(out, "{}}}", "  ".repeat(open.len() + 1));
        }
        for b in &s.blocks[keep..] {
            let no_env = HashMap::new();
            let i = &b.index;
            let _ = writeln!(
                out,
                "{}for (long i_{i} = {}; i_{i} < {}; i_{i}++) {{",
                "  ".repeat(open.len() + 1),
                printer.affine(&b.lo, &no_env),
                printer.affine(&b.hi, &no_env)
            );
            open.push(b.id);
        }
        let Some(bx) = boxes.get(&s.name) else {
            continue; // empty domain
        };
        let st = &program.statements[s.source];
        let env: HashMap<String, String> = s
            .iterators
            .iter()
            .map(|i| (i.clone(), format!("i_{i}")))
            .collect();
        let nb = s.blocks.len();
        let mut depth = 1 + nb;
        for (i, (lo, hi)) in s.iterators.iter().zip(bx).skip(nb) {
            let pad = "  ".repeat(depth);
            let _ = writeln!(
                out,
                "{pad}for (long i_{i} = {lo}; i_{i} <= {hi}; i_{i}++) {{"
            );
            depth += 1;
        }
        let guards: Vec<String> = st
            .wheres
            .iter()
            .filter(|w| {
                w.names()
                    .iter()
                    .all(|n| program.is_param(n) || s.iterators.iter().any(|i| i == n))
            })
            .filter_map(|w| w.condition_text(false, &|a| printer.affine(a, &env)))
            .collect();
        let pad = "  ".repeat(depth);
        let body = printer.statement(st, s.kind, &env);
        if guards.is_empty() {
            let _ = writeln!(out, "{pad}{body}");
        } else {
            let _ = writeln!(out, "{pad}if ({}) {body}", guards.join(" && "));
        }
        for d in (1 + nb..depth).rev() {
            let _ = writeln!(out, "{}}}", "  ".repeat(d));
        }
        // A reduction into an f16 or bf16 tensor has held its running values
        // in f32 (`expr::accumulator_dtype`); the statement done, they are
        // stored values and round to the dtype. Rounding the whole tensor
        // is the same: every other element already holds a rounded value.
        let lhs = scop.tensor(&st.lhs_tensor);
        if let (Mode::Declared, StmtKind::Update, Some(t)) = (mode, s.kind, lhs) {
            if accumulator_dtype(t.dtype) != t.dtype {
                let len = element_count(&printer, t);
                let el = format!("{}[pf_e]", tensor_name(&t.name));
                let _ = writeln!(
                    out,
                    "{}for (long pf_e = 0; pf_e < {len}; pf_e++) {el} = {};",
                    "  ".repeat(1 + nb),
                    round_to_dtype(t.dtype, &el)
                );
            }
        }
    }
    while !open.is_empty() {
        open.pop();
        let _ = writeln!(out, "{}}}", "  ".repeat(open.len() + 1));
    }
    out.push_str("}\n");
    out
}
