//! C text of a statement's computation: tensor loads and stores through
//! row-major linearised subscripts, the right-hand side in its compute type,
//! and the reducer's combine or identity.
//!
//! Three arithmetic modes share this printer: [`Mode::Native`] computes in
//! each expression's compute type (f16 and bf16 stored narrow, computed in
//! f32), [`Mode::Reference`] computes every float in `double` from `double`
//! tensors: the unoptimised f64 program the checks compare against, and
//! [`Mode::Declared`] is the same with every stored value (and every cast)
//! rounded to its dtype: the declared-precision run of the check.

use std::collections::HashMap;

use crate::frontend::ast::{
    Affine, AssignOp, BinOp, DType, Expr, ExprKind, ExprType, Func, Reducer, Statement, UnOp,
};
use crate::model::{AccessKey, ModelTensor, StmtKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Native,
    Reference,
    /// The reference with the program's declared numerics: arithmetic
    /// inside a statement in `double`, every value stored into a tensor
    /// rounded to the tensor's dtype ([`round_to_dtype`]), a reduction's
    /// running value into an f16 or bf16 tensor kept in f32 until the
    /// statement ends (the spec's "at least f32" inside a statement; the
    /// reference printer rounds those tensors once after the statement's
    /// loops). Its error against [`Mode::Reference`] is what the program's
    /// own choice of dtypes costs, which the check allows twice over.
    Declared,
}

impl Mode {
    /// Whether tensors are `double` arrays (the two reference modes).
    pub fn is_reference(self) -> bool {
        matches!(self, Mode::Reference | Mode::Declared)
    }
}

/// C text of the `double` value `v` rounded to dtype `t`, as a `double`:
/// how the declared-precision run stores into a tensor of dtype `t` (and
/// casts to it). f16 rounds from `double` directly (`_Float16`); bf16 goes
/// through f32 like the kernels' own `pf_f2b`, whose double rounding may
/// differ from a direct one by one unit in the last place on rare ties,
/// nothing an error estimate notices; integers are exact. The 8-bit floats
/// round from `double` directly (`pf_f2e4m3`, `pf_f2e5m2` take a double);
/// u8 and bool convert as every target stores them (modulo 256; nonzero to
/// 1), which the reference does too: that is their meaning, not a rounding.
pub fn round_to_dtype(t: DType, v: &str) -> String {
    match t {
        DType::F64 | DType::I32 | DType::I64 => format!("((double)({v}))"),
        DType::F32 => format!("((double)(float)({v}))"),
        DType::F16 => format!("((double)(_Float16)({v}))"),
        DType::BF16 => format!("((double)pf_b2f(pf_f2b((float)({v}))))"),
        DType::F8E4M3 => format!("((double)pf_e4m3_2f(pf_f2e4m3({v})))"),
        DType::F8E5M2 => format!("((double)pf_e5m2_2f(pf_f2e5m2({v})))"),
        DType::U8 => format!("((double)(unsigned char)(long long)({v}))"),
        DType::Bool => format!("((double)(({v}) != 0))"),
    }
}

/// The dtype a reduction's running value is held in while its statement
/// runs in the declared-precision run: f16 and bf16 accumulate in f32 (as
/// every kernel does, see `codegen::c::wide_accumulators`), the rest in
/// their own dtype.
pub fn accumulator_dtype(t: DType) -> DType {
    if t.is_narrow_float() {
        DType::F32
    } else {
        t
    }
}

/// C name of a tensor pointer.
pub fn tensor_name(t: &str) -> String {
    format!("t_{t}")
}
/// C name of a parameter.
pub fn param_name(p: &str) -> String {
    format!("p_{p}")
}

pub use crate::gpu::registers::WIDE_REGISTER_PREFIX;

/// The tensors whose global memory printed code reads or writes, noted by
/// the printer as it emits each access (`t_X[..]`). The CUDA printer keeps
/// one per kernel as its launch record's [`crate::gpu::Kernel::globals`]:
/// a temp that no kernel's code touches (a rolling update's `M_prev`, an
/// accumulator kept in registers) then needs no memory, which the C ABI's
/// workspace relies on. Shared by the printers of one kernel (the
/// attention template makes several), hence the `Rc`.
#[derive(Debug, Clone, Default)]
pub struct GlobalAccesses(std::rc::Rc<std::cell::RefCell<std::collections::BTreeSet<String>>>);

impl GlobalAccesses {
    /// Notes an access to `tensor`'s global memory.
    pub fn note(&self, tensor: &str) {
        self.0.borrow_mut().insert(tensor.to_string());
    }
    /// The tensors noted since the last call, and forgets them.
    pub fn take(&self) -> std::collections::BTreeSet<String> {
        std::mem::take(&mut *self.0.borrow_mut())
    }
}

/// An element as the printer addresses it: its C text, and whether it is
/// read and written as it is, with no conversion from or to its tensor's
/// storage type: a register tile's register, or a private copy of an f16
/// or bf16 tensor widened once when loaded, both holding f16 and bf16
/// values in f32 (`gpu::registers::WIDE_REGISTER_PREFIX`). Decided where
/// the element is made (the register tile, the private region), carried
/// here rather than read back from its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub text: String,
    pub unconverted: bool,
}

impl Element {
    /// An element read and written without conversion.
    pub fn unconverted(text: impl Into<String>) -> Self {
        Element {
            text: text.into(),
            unconverted: true,
        }
    }
}

/// An element held in its tensor's storage type.
impl From<String> for Element {
    fn from(text: String) -> Self {
        Element {
            text,
            unconverted: false,
        }
    }
}

impl From<&str> for Element {
    fn from(text: &str) -> Self {
        text.to_string().into()
    }
}

/// Everything needed to print statement bodies of one program.
pub struct Printer<'a> {
    pub tensors: &'a [ModelTensor],
    pub params: &'a [String],
    pub mode: Mode,
    /// Element references that replace `t_X[...]` for some accesses (keyed
    /// by `model::AccessKey`): reads of tiles promoted to shared memory.
    pub overrides: std::cell::RefCell<HashMap<AccessKey, Element>>,
    /// Tensors held in thread-private arrays where the printer is (see
    /// `gpu::private`): every access to them names the array instead.
    pub privates: std::cell::RefCell<HashMap<String, PrivateView>>,
    /// Conditions of selects whose arm is known where the printer is (the
    /// program's expressions, compared as such): a loop unswitched on them
    /// (`codegen::unswitch`) prints `c ? a : b` as `a` in its `c` copy and
    /// as `b` in the other.
    pub fixed_selects: std::cell::RefCell<Vec<(Expr, bool)>>,
    /// Reads replaced by registers loaded ahead of the loop the printer is
    /// in (`codegen::rowcopy`): statement, access, register element.
    pub run_reads: std::cell::RefCell<Vec<(String, AccessKey, String)>>,
    /// Print f32 `exp` as `ex2.approx.ftz` of a product (`pf_exp2_ftz`), for
    /// code whose exponentials only feed values rounded to 16 bits
    /// afterwards (`codegen::flash`'s weights).
    pub fast_exp: bool,
    /// Reads that are a positive constant times another value the printer
    /// has (access -> (C text of the value, the constant)): under
    /// `fast_exp`, `exp(x - b)` of such a read `x = c * y` prints as one
    /// FFMA of `y` with the folded constant `c log2 e`, so `x` itself need
    /// not be computed (`codegen::flash`'s scaled scores).
    pub scaled_reads: std::cell::RefCell<HashMap<AccessKey, (String, f64)>>,
    /// Route the global accesses of statements through the race detector
    /// of the CPU emulation (`codegen::race`): `t_X[pf_race_r(k, i)]` for
    /// a read of tensor `k`, `pf_race_w` for a write.
    pub race: std::cell::Cell<bool>,
    /// Where each global access printed is noted (see [`GlobalAccesses`]).
    pub globals: GlobalAccesses,
}

/// A thread-private array as the printer addresses it: element `a` of the
/// tensor is `buffer[a - offset]`, linearised over the box `sizes`
/// (dimensions of size 1 drop out; all of them: a scalar).
#[derive(Debug, Clone)]
pub struct PrivateView {
    pub buffer: String,
    /// Read and written without conversion (see [`Element::unconverted`]).
    pub unconverted: bool,
    pub sizes: Vec<i64>,
    /// C text of the box offset along each dimension.
    pub offset: Vec<String>,
}

impl Printer<'_> {
    fn tensor(&self, name: &str) -> &ModelTensor {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .expect("tensor checked by the model")
    }

    /// An affine form with index variables replaced by `env` (C text).
    pub fn affine(&self, a: &Affine, env: &HashMap<String, String>) -> String {
        let mut parts = Vec::new();
        for (name, c) in &a.terms {
            let v = match env.get(name) {
                Some(v) => format!("({v})"),
                None => param_name(name),
            };
            parts.push(if *c == 1 { v } else { format!("{c} * {v}") });
        }
        if a.constant != 0 || parts.is_empty() {
            parts.push(a.constant.to_string());
        }
        format!("({})", parts.join(" + "))
    }

    /// `t_X[((s0) * E1 + s1) * E2 + s2]`.
    pub fn element(&self, tensor: &str, subs: &[Affine], env: &HashMap<String, String>) -> String {
        self.element_access(tensor, subs, env, None)
    }

    /// [`Self::element`] for a read (`Some(false)`) or a write
    /// (`Some(true)`): with [`Self::race`] on, a global element's index goes
    /// through the race detector.
    pub fn element_access(
        &self,
        tensor: &str,
        subs: &[Affine],
        env: &HashMap<String, String>,
        write: Option<bool>,
    ) -> String {
        self.element_ref(tensor, subs, env, write).text
    }

    /// [`Self::element_access`] with whether the element is converted.
    fn element_ref(
        &self,
        tensor: &str,
        subs: &[Affine],
        env: &HashMap<String, String>,
        write: Option<bool>,
    ) -> Element {
        if let Some(e) = self.overrides.borrow().get(&AccessKey::new(tensor, subs)) {
            return e.clone();
        }
        if let Some(v) = self.privates.borrow().get(tensor) {
            let mut idx = String::new();
            for (d, s) in subs.iter().enumerate() {
                if v.sizes[d] == 1 {
                    continue;
                }
                let local = format!("({} - {})", self.affine(s, env), v.offset[d]);
                idx = if idx.is_empty() {
                    local
                } else {
                    format!("({idx} * {} + {local})", v.sizes[d])
                };
            }
            let text = if idx.is_empty() {
                v.buffer.clone()
            } else {
                format!("{}[{idx}]", v.buffer)
            };
            return Element {
                text,
                unconverted: v.unconverted,
            };
        }
        let t = self.tensor(tensor);
        let mut idx = String::new();
        for (d, s) in subs.iter().enumerate() {
            let s = self.affine(s, env);
            idx = if d == 0 {
                s
            } else {
                let e = self.affine(&t.shape[d], &HashMap::new());
                format!("({idx} * {e} + {s})")
            };
        }
        if idx.is_empty() {
            idx = "0".into();
        }
        if let (Some(write), true) = (write, self.race.get()) {
            let k = self
                .tensors
                .iter()
                .position(|t| t.name == tensor)
                .unwrap_or(0);
            let f = if write { "pf_race_w" } else { "pf_race_r" };
            idx = format!("{f}({k}, {idx})");
        }
        self.globals.note(tensor);
        format!("{}[{idx}]", tensor_name(tensor)).into()
    }

    fn load(&self, tensor: &str, subs: &[Affine], env: &HashMap<String, String>) -> String {
        let Element {
            text: el,
            unconverted,
        } = self.element_ref(tensor, subs, env, Some(false));
        if unconverted {
            return el;
        }
        match (self.mode, self.tensor(tensor).dtype) {
            (Mode::Native, DType::F16) => format!("pf_h2f({el})"),
            (Mode::Native, DType::BF16) => format!("pf_b2f({el})"),
            (Mode::Native, t) if t.is_narrow_float() => {
                let (widen, _) = t.narrow_conversions().expect("a narrow float");
                format!("{widen}({el})")
            }
            (m, DType::I32 | DType::I64 | DType::U8) if m.is_reference() => {
                format!("((long long){el})")
            }
            _ => el,
        }
    }

    /// The C type arithmetic of compute type `t` is carried out in.
    pub fn ctype(&self, t: DType) -> &'static str {
        match (self.mode, t) {
            (_, DType::I64) => "long long",
            (m, DType::I32) if m.is_reference() => "long long",
            (m, _) if m.is_reference() => "double",
            (_, DType::F64) => "double",
            (_, DType::I32) => "int",
            _ => "float",
        }
    }

    /// The raw value and the constant of a read in `scaled_reads`.
    fn scaled(&self, e: &Expr) -> Option<(String, f64)> {
        let read = AccessKey::of_read(e)?;
        self.scaled_reads.borrow().get(&read).cloned()
    }

    fn is_single(&self, t: DType) -> bool {
        self.mode == Mode::Native && t == DType::F32
    }

    fn literal(&self, v: f64, t: DType) -> String {
        if t == DType::I32 {
            return format!("{}", v as i64);
        }
        if t == DType::I64 {
            return format!("{}LL", v as i64);
        }
        let s = format!("{v:?}");
        if self.is_single(t) {
            format!("{s}f")
        } else {
            s
        }
    }

    pub fn expr(&self, e: &Expr, env: &HashMap<String, String>) -> String {
        let num = match e.ty {
            ExprType::Num(t) => t,
            ExprType::Bool => DType::I32,
        };
        match &e.kind {
            ExprKind::Number(v) => self.literal(*v, num),
            ExprKind::Inf { negative } => {
                let s = if *negative { "-" } else { "" };
                match num {
                    DType::I32 => {
                        if *negative {
                            "INT_MIN".into()
                        } else {
                            "INT_MAX".into()
                        }
                    }
                    DType::I64 => if *negative { "LLONG_MIN" } else { "LLONG_MAX" }.into(),
                    t if self.is_single(t) => format!("({s}INFINITY)"),
                    _ => format!("({s}(double)INFINITY)"),
                }
            }
            ExprKind::Index(name) => format!("(({})({}))", self.ctype(num), env[name]),
            ExprKind::Param(name) => format!("(({})({}))", self.ctype(num), param_name(name)),
            // A bool reads as 0 or 1 in the type it meets.
            ExprKind::Access { tensor, subscripts } if self.tensor(tensor).dtype == DType::Bool => {
                let el = self.element_access(tensor, subscripts, env, Some(false));
                format!("(({})({el} != 0))", self.ctype(num))
            }
            ExprKind::Access { tensor, subscripts } => self.load(tensor, subscripts, env),
            ExprKind::Unary(op, a) => {
                let a = self.expr(a, env);
                match op {
                    UnOp::Neg => format!("(-{a})"),
                    UnOp::Not => format!("(!{a})"),
                }
            }
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (self.expr(a, env), self.expr(b, env));
                // `1 * y` and `x * 1` are exactly the other factor (also
                // for infinities, NaN and signed zeros): a repair factor
                // printed with its target replaced by one (`codegen::flash`)
                // then reads the same whichever side the target was on, so
                // equal factors print alike and are computed once.
                let unit = |t: &str| t == "1.0f" || t == "1.0";
                match op {
                    BinOp::Mul if unit(&x) => y,
                    BinOp::Mul if unit(&y) => x,
                    _ => format!("({x} {} {y})", op.symbol()),
                }
            }
            ExprKind::Select(c, a, b) => {
                // Printed even where its arm is known: printing notes the
                // global tensors it reads (`globals`).
                let cond = self.expr(c, env);
                let fixed = self
                    .fixed_selects
                    .borrow()
                    .iter()
                    .find(|(e, _)| e == &**c)
                    .map(|(_, v)| *v);
                match fixed {
                    Some(true) => self.expr(a, env),
                    Some(false) => self.expr(b, env),
                    None => format!("({cond} ? {} : {})", self.expr(a, env), self.expr(b, env)),
                }
            }
            ExprKind::Call(Func::Exp, args) if self.fast_exp && self.is_single(num) => {
                // e^x = 2^(x log2 e) on `ex2.approx.ftz` (no care for
                // results below 2^-126, which only feed 16-bit weights);
                // e^(a - b) as 2^(a log2 e - b log2 e), one FFMA with the
                // second product (a row's maximum in the weights) computed
                // once where `b` is the same for many elements.
                const LOG2E: &str = "1.4426950408889634f";
                match &args[0].kind {
                    ExprKind::Binary(BinOp::Sub, a, b) => {
                        // A read `a = c y` (`scaled_reads`): `c log2 e`
                        // folded into the product's constant.
                        let (x, scale) = match self.scaled(a) {
                            Some((y, c)) => {
                                (y, format!("{:?}f", (c * std::f64::consts::LOG2_E) as f32))
                            }
                            None => (self.expr(a, env), LOG2E.to_string()),
                        };
                        format!(
                            "pf_exp2_ftz(fmaf({x}, {scale}, -({} * {LOG2E})))",
                            self.expr(b, env)
                        )
                    }
                    _ => format!("pf_exp2_ftz({} * {LOG2E})", self.expr(&args[0], env)),
                }
            }
            ExprKind::Call(f, args) => {
                let a: Vec<String> = args.iter().map(|x| self.expr(x, env)).collect();
                self.call(*f, &a, num)
            }
            ExprKind::Cast(to, a) if to.needs_extra_helpers() => self.cast(*to, a, num, env),
            ExprKind::Cast(to, a) => {
                let inner = self.expr(a, env);
                match (self.mode, to) {
                    (m, DType::I32) if m.is_reference() => format!("((long long)({inner}))"),
                    (Mode::Reference, _) => format!("((double)({inner}))"),
                    (Mode::Declared, t) => round_to_dtype(*t, &inner),
                    (_, DType::F16) => format!("pf_h2f(pf_f2h((float)({inner})))"),
                    (_, DType::BF16) => format!("pf_b2f(pf_f2b((float)({inner})))"),
                    (_, t) => format!("(({})({inner}))", self.ctype(*t)),
                }
            }
        }
    }

    /// A cast to one of [`DType::needs_extra_helpers`]'s dtypes, read in
    /// compute type `num` (the context's type for `bool(..)`).
    fn cast(&self, to: DType, a: &Expr, num: DType, env: &HashMap<String, String>) -> String {
        let inner = self.expr(a, env);
        let float_inner = matches!(a.ty, ExprType::Num(t) if t.is_float());
        match to {
            DType::Bool => format!("(({})(({inner}) != 0))", self.ctype(num)),
            DType::U8 if float_inner => {
                format!("(({})(unsigned char)pf_f2i({inner}))", self.ctype(num))
            }
            DType::U8 => format!("(({})(unsigned char)({inner}))", self.ctype(num)),
            DType::I64 => format!("((long long)({inner}))"),
            _ => match self.mode {
                Mode::Reference => format!("((double)({inner}))"),
                Mode::Declared => round_to_dtype(to, &inner),
                Mode::Native => {
                    let (widen, narrow) = to.narrow_conversions().expect("an 8-bit float");
                    format!("{widen}({narrow}((float)({inner})))")
                }
            },
        }
    }

    fn call(&self, f: Func, a: &[String], t: DType) -> String {
        if t == DType::I64 {
            if f == Func::Abs {
                return format!("llabs({})", a[0]);
            }
            return self.call(f, a, DType::I32);
        }
        if t == DType::I32 {
            return match f {
                Func::Abs => format!("pf_iabs({})", a[0]),
                Func::Max => format!("pf_max({}, {})", a[0], a[1]),
                Func::Min => format!("pf_min({}, {})", a[0], a[1]),
                _ => format!("{}({})", f.name(), a.join(", ")),
            };
        }
        let sfx = if self.is_single(t) { "f" } else { "" };
        let one = if self.is_single(t) { "1.0f" } else { "1.0" };
        match f {
            Func::Exp => format!("exp{sfx}({})", a[0]),
            Func::Log => format!("log{sfx}({})", a[0]),
            Func::Sqrt => format!("sqrt{sfx}({})", a[0]),
            Func::Rsqrt => format!("({one} / sqrt{sfx}({}))", a[0]),
            Func::Tanh => format!("tanh{sfx}({})", a[0]),
            Func::Sigmoid => format!("({one} / ({one} + exp{sfx}(-({}))))", a[0]),
            Func::Abs => format!("fabs{sfx}({})", a[0]),
            Func::Max => format!("fmax{sfx}({}, {})", a[0], a[1]),
            Func::Min => format!("fmin{sfx}({}, {})", a[0], a[1]),
            Func::Pow => format!("pow{sfx}({}, {})", a[0], a[1]),
        }
    }

    /// The identity of a reducer in the left side's compute type.
    pub fn identity(&self, r: Reducer, t: DType) -> String {
        let inf = |neg: bool| match t {
            DType::I32 => if neg { "INT_MIN" } else { "INT_MAX" }.to_string(),
            DType::I64 => if neg { "LLONG_MIN" } else { "LLONG_MAX" }.to_string(),
            t if self.is_single(t) => format!("({}INFINITY)", if neg { "-" } else { "" }),
            _ => format!("({}(double)INFINITY)", if neg { "-" } else { "" }),
        };
        match r {
            Reducer::Sum => self.literal(0.0, t),
            Reducer::Prod => self.literal(1.0, t),
            Reducer::Max => inf(true),
            Reducer::Min => inf(false),
        }
    }

    /// The identity of a reducer as stored into a tensor of dtype `d`: for
    /// u8 and bool the range's end (`max=!` starts at 0, not at `INT_MIN`,
    /// which bool would store as 1), else [`Self::identity`] in the compute
    /// type.
    pub fn stored_identity(&self, r: Reducer, d: DType) -> String {
        let t = d.compute();
        match (r, d) {
            (Reducer::Max, DType::U8 | DType::Bool) => self.literal(0.0, t),
            (Reducer::Min, DType::U8) => self.literal(255.0, t),
            (Reducer::Min, DType::Bool) => self.literal(1.0, t),
            _ => self.identity(r, t),
        }
    }

    pub fn combine(&self, r: Reducer, t: DType, acc: &str, v: &str) -> String {
        let sfx = if self.is_single(t) { "f" } else { "" };
        match (r, t) {
            (Reducer::Sum, _) => format!("{acc} + {v}"),
            (Reducer::Prod, _) => format!("{acc} * {v}"),
            (Reducer::Max, DType::I32 | DType::I64) => format!("pf_max({acc}, {v})"),
            (Reducer::Min, DType::I32 | DType::I64) => format!("pf_min({acc}, {v})"),
            (Reducer::Max, _) => format!("fmax{sfx}({acc}, {v})"),
            (Reducer::Min, _) => format!("fmin{sfx}({acc}, {v})"),
        }
    }

    /// The pieces of a reduction step `X(..) op= rhs` for code that
    /// accumulates partial results itself: the reducer, the compute type of
    /// the accumulator and the right side's value at `env`.
    pub fn reduction(
        &self,
        st: &Statement,
        env: &HashMap<String, String>,
    ) -> Option<(Reducer, DType, String)> {
        match st.op {
            AssignOp::Reduce { op, .. } => {
                let t = self.tensor(&st.lhs_tensor).dtype.compute();
                Some((op, t, self.expr(&st.rhs, env)))
            }
            AssignOp::Assign => None,
        }
    }

    /// `X(..) = X(..) op v;` with `X(..)` at `env`: folds a combined
    /// partial result into the accumulator.
    pub fn fold_into_lhs(&self, st: &Statement, env: &HashMap<String, String>, v: &str) -> String {
        let AssignOp::Reduce { op, .. } = st.op else {
            return String::new();
        };
        let lhs = self.tensor(&st.lhs_tensor);
        let subs: Vec<Affine> = st.lhs_indices.iter().map(|i| Affine::var(i)).collect();
        let el = self.element_ref(&st.lhs_tensor, &subs, env, Some(true));
        let t = lhs.dtype.compute();
        let acc = self.load(&st.lhs_tensor, &subs, env);
        let value = self.combine(op, t, &acc, v);
        self.store(&el, lhs.dtype, true, &value)
    }

    /// `el = value;` into an element of dtype `t`, `value` in the compute
    /// type; `running` for a reduction's update, whose value the
    /// declared-precision run holds in [`accumulator_dtype`].
    fn store(&self, el: &Element, t: DType, running: bool, value: &str) -> String {
        let Element {
            text: el,
            unconverted,
        } = el;
        match (self.mode, t) {
            _ if *unconverted => format!("{el} = {value};"),
            (Mode::Native, DType::F16) => format!("{el} = pf_f2h({value});"),
            (Mode::Native, DType::BF16) => format!("{el} = pf_f2b({value});"),
            (Mode::Native, t) if t.is_narrow_float() => {
                let (_, narrow) = t.narrow_conversions().expect("a narrow float");
                format!("{el} = {narrow}({value});")
            }
            (Mode::Native, DType::U8) => format!("{el} = (unsigned char)({value});"),
            (Mode::Native, DType::Bool) => format!("{el} = (({value}) != 0);"),
            (Mode::Native, _) => format!("{el} = {value};"),
            (Mode::Reference, t @ (DType::U8 | DType::Bool)) => {
                format!("{el} = {};", round_to_dtype(t, value))
            }
            (Mode::Reference, _) => format!("{el} = (double)({value});"),
            (Mode::Declared, t) => {
                let t = if running { accumulator_dtype(t) } else { t };
                format!("{el} = {};", round_to_dtype(t, value))
            }
        }
    }

    /// One C statement (with its `;`) executing `kind` of `st` at the point
    /// where index variable `v` has value `env[v]`.
    pub fn statement(
        &self,
        st: &Statement,
        kind: StmtKind,
        env: &HashMap<String, String>,
    ) -> String {
        let lhs = self.tensor(&st.lhs_tensor);
        let subs: Vec<Affine> = st.lhs_indices.iter().map(|i| Affine::var(i)).collect();
        let el = self.element_ref(&st.lhs_tensor, &subs, env, Some(true));
        let t = lhs.dtype.compute();
        let value = match (kind, st.op) {
            (StmtKind::Init, AssignOp::Reduce { op, .. }) => self.stored_identity(op, lhs.dtype),
            (StmtKind::Update, AssignOp::Reduce { op, .. }) => {
                let acc = self.load(&st.lhs_tensor, &subs, env);
                self.combine(op, t, &acc, &self.expr(&st.rhs, env))
            }
            _ => self.expr(&st.rhs, env),
        };
        self.store(&el, lhs.dtype, kind == StmtKind::Update, &value)
    }
}
