//! The typed AST of a polyfuse program: what the JSON file and its Tensor
//! Comprehension statements mean, before any polyhedral modelling.
//!
//! Index expressions (subscripts, `where` bounds, tensor shapes) are kept as
//! [`Affine`] forms `c0 + sum_k a_k * v_k` over index variables and
//! parameters, since everything the model builds in isl is affine in them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Element type of a tensor, and the arithmetic type of an expression.
///
/// The spec's dtypes (`spec/program-format.md`, "Keys"). What each is
/// computed in ([`DType::compute`]) and how a value is stored into it:
///
/// * `f16`, `bf16`, `f8e4m3`, `f8e5m2` are storage types, computed in f32
///   and rounded to nearest even when stored. The two 8-bit floats
///   saturate to their largest finite value (448 and 57344) as CUDA's
///   `__nv_fp8_e4m3(float)` / `__nv_fp8_e5m2(float)` do (`satfinite`): an
///   infinity stores as that value too, a NaN as the NaN `0x7f`. e4m3 has
///   no infinity; e5m2 reads its infinities as such.
/// * `i32` and `i64` are exact integers computed in their own width.
/// * `u8` is computed in i32: C's and CUDA's integer promotion, so that
///   `X(i) - Y(i)` of two u8 tensors is the signed difference and a sum of
///   many u8 values does not wrap before it is stored. Storing (or `u8(x)`)
///   converts as C converts an integer to `unsigned char`, modulo 256; a
///   float is first truncated toward zero to an i32, saturating at the i32
///   range and NaN to 0 (`pf_f2i`, the same text in C and CUDA), so every
///   target gives the same byte for every value.
/// * `bool` is one byte holding 0 or 1: storing (or `bool(x)`) gives 1 for
///   any nonzero value (NaN too), 0 for zero. A comparison is a bool, and a
///   bool reads as 0 or 1 in arithmetic of whatever type it meets (it has
///   no type of its own in `frontend::resolve`); its compute type, where it
///   needs one (the left side of a statement), is i32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I32,
    I64,
    U8,
    Bool,
    F8E4M3,
    F8E5M2,
}

impl DType {
    /// Every dtype, in the spec's order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
        DType::F8E4M3,
        DType::F8E5M2,
    ];
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }
    /// The type arithmetic on values of this type is carried out in:
    /// f16, bf16 and the 8-bit floats are stored narrow but computed in
    /// f32; u8 and bool in i32 (see the type's comment).
    pub fn compute(self) -> DType {
        match self {
            DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => DType::F32,
            DType::U8 | DType::Bool => DType::I32,
            t => t,
        }
    }
    pub fn is_float(self) -> bool {
        !self.is_integer()
    }
    /// i32, i64, u8 and bool: exact values.
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8 | DType::Bool)
    }
    /// The floats stored narrower than f32 and computed in f32 (f16, bf16,
    /// f8e4m3, f8e5m2): a reduction into one accumulates in f32 and rounds
    /// once.
    pub fn is_narrow_float(self) -> bool {
        matches!(
            self,
            DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }
    /// The C helpers (in both preludes) that widen a stored element of a
    /// narrow float to f32 and round an f32 to it.
    pub fn narrow_conversions(self) -> Option<(&'static str, &'static str)> {
        Some(match self {
            DType::F16 => ("pf_h2f", "pf_f2h"),
            DType::BF16 => ("pf_b2f", "pf_f2b"),
            DType::F8E4M3 => ("pf_e4m3_2f", "pf_f2e4m3"),
            DType::F8E5M2 => ("pf_e5m2_2f", "pf_f2e5m2"),
            _ => return None,
        })
    }
    /// One of the dtypes added after the first five (i64, u8, bool and the
    /// 8-bit floats): their C and CUDA helpers are printed only for
    /// programs that use them, so other programs' code stays as it was.
    pub fn needs_extra_helpers(self) -> bool {
        matches!(
            self,
            DType::I64 | DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2
        )
    }
    /// Size of one stored element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An affine form `constant + sum(coeff * name)`, where names are index
/// variables or parameters. Terms with a zero coefficient are never stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct Affine {
    pub terms: BTreeMap<String, i64>,
    pub constant: i64,
}

impl Affine {
    pub fn constant(c: i64) -> Affine {
        Affine {
            terms: BTreeMap::new(),
            constant: c,
        }
    }
    pub fn var(name: &str) -> Affine {
        let mut terms = BTreeMap::new();
        terms.insert(name.to_string(), 1);
        Affine { terms, constant: 0 }
    }
    pub fn add(&self, other: &Affine) -> Affine {
        let mut r = self.clone();
        for (k, v) in &other.terms {
            *r.terms.entry(k.clone()).or_insert(0) += v;
        }
        r.terms.retain(|_, v| *v != 0);
        r.constant += other.constant;
        r
    }
    pub fn scale(&self, s: i64) -> Affine {
        let mut r = self.clone();
        for v in r.terms.values_mut() {
            *v *= s;
        }
        r.terms.retain(|_, v| *v != 0);
        r.constant *= s;
        r
    }
    pub fn sub(&self, other: &Affine) -> Affine {
        self.add(&other.scale(-1))
    }
    pub fn coeff(&self, name: &str) -> i64 {
        self.terms.get(name).copied().unwrap_or(0)
    }
    /// Names with a non-zero coefficient.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.terms.keys().map(|s| s.as_str())
    }
    /// `Some(c)` when the form has no variable terms.
    pub fn as_constant(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }
    /// Replaces names by values where `value` knows them.
    pub fn substitute(&self, value: &dyn Fn(&str) -> Option<i64>) -> Affine {
        let mut r = Affine::constant(self.constant);
        for (k, c) in &self.terms {
            match value(k) {
                Some(v) => r.constant += c * v,
                None => {
                    r.terms.insert(k.clone(), *c);
                }
            }
        }
        r
    }
}

/// Prints in a syntax both isl and C accept: `2*i + N - 1`.
impl fmt::Display for Affine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, c) in &self.terms {
            let (sign, mag) = if *c < 0 { ("-", -c) } else { ("+", *c) };
            if first {
                if *c < 0 {
                    f.write_str("-")?;
                }
            } else {
                write!(f, " {sign} ")?;
            }
            if mag == 1 {
                write!(f, "{name}")?;
            } else {
                write!(f, "{mag}*{name}")?;
            }
            first = false;
        }
        if first {
            write!(f, "{}", self.constant)
        } else if self.constant > 0 {
            write!(f, " + {}", self.constant)
        } else if self.constant < 0 {
            write!(f, " - {}", -self.constant)
        } else {
            Ok(())
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorRole {
    Input,
    Output,
    Temp,
}

/// A declared (or, for temps, inferred) tensor. Row-major, dense.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    /// Affine in parameters only. `None` for a temp whose shape the file
    /// leaves to inference (filled in by range inference).
    pub shape: Option<Vec<Affine>>,
    pub role: TensorRole,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    /// `None`: symbolic, must be given at run time.
    pub value: Option<i64>,
}

/// Assignment operator of a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignOp {
    /// `=`
    Assign,
    /// `+=`, `*=`, `max=`, `min=` with `init` = whether the `!` form was used
    /// (the left side is first set to the reducer's identity).
    Reduce { op: Reducer, init: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reducer {
    Sum,
    Prod,
    Max,
    Min,
}

impl Reducer {
    pub fn symbol(self) -> &'static str {
        match self {
            Reducer::Sum => "+",
            Reducer::Prod => "*",
            Reducer::Max => "max",
            Reducer::Min => "min",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne
        )
    }
    pub fn is_logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }
}

/// Built-in functions. Casts are [`Expr::Cast`], not functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Abs,
    Max,
    Min,
    Pow,
}

impl Func {
    pub fn parse(s: &str) -> Option<Func> {
        Some(match s {
            "exp" => Func::Exp,
            "log" => Func::Log,
            "sqrt" => Func::Sqrt,
            "rsqrt" => Func::Rsqrt,
            "tanh" => Func::Tanh,
            "sigmoid" => Func::Sigmoid,
            "abs" => Func::Abs,
            "max" => Func::Max,
            "min" => Func::Min,
            "pow" => Func::Pow,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Func::Exp => "exp",
            Func::Log => "log",
            Func::Sqrt => "sqrt",
            Func::Rsqrt => "rsqrt",
            Func::Tanh => "tanh",
            Func::Sigmoid => "sigmoid",
            Func::Abs => "abs",
            Func::Max => "max",
            Func::Min => "min",
            Func::Pow => "pow",
        }
    }
    pub fn arity(self) -> usize {
        match self {
            Func::Max | Func::Min | Func::Pow => 2,
            _ => 1,
        }
    }
}

/// A right-hand-side expression. Every node carries the arithmetic type it
/// evaluates in after type checking (`ty`); comparisons and logic give
/// [`ExprType::Bool`].
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub ty: ExprType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExprType {
    /// A numeric value computed in this type (always a compute type:
    /// f32, f64 or i32).
    Num(DType),
    Bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// A numeric literal as written (`2`, `0.5`, `1e-5`).
    Number(f64),
    /// `inf` (false) or `-inf` (true).
    Inf {
        negative: bool,
    },
    /// An index variable used as a value.
    Index(String),
    /// A parameter used as a value.
    Param(String),
    /// A tensor read with affine subscripts.
    Access {
        tensor: String,
        subscripts: Vec<Affine>,
    },
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
    Cast(DType, Box<Expr>),
}

/// One `where` clause.
#[derive(Debug, Clone, PartialEq)]
pub enum WhereClause {
    /// `IDX in lo:hi`, the half-open range [lo, hi).
    Range {
        index: String,
        lo: Affine,
        hi: Affine,
    },
    /// `lhs REL rhs`, an affine constraint on the iteration domain.
    Constraint { lhs: Affine, rel: Rel, rhs: Affine },
    /// `(c1 && c2) || c3 || ...`: the domain is restricted to the union of
    /// the conjunctions (at least two; a single conjunction is written as
    /// separate [`WhereClause::Constraint`]s). A reduction over such a
    /// domain is still one reduction: every instance of the union adds
    /// into its element once, whichever conjunctions it satisfies.
    Union(Vec<Vec<Comparison>>),
}

/// One affine comparison `lhs REL rhs` of a [`WhereClause::Union`].
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub lhs: Affine,
    pub rel: Rel,
    pub rhs: Affine,
}

impl WhereClause {
    /// True for the clauses that constrain the domain (comparisons and
    /// unions of them), false for ranges.
    pub fn is_condition(&self) -> bool {
        !matches!(self, WhereClause::Range { .. })
    }
    /// The names (index variables and parameters) a condition mentions;
    /// a range's index and bounds.
    pub fn names(&self) -> Vec<&str> {
        match self {
            WhereClause::Range { index, lo, hi } => std::iter::once(index.as_str())
                .chain(lo.names())
                .chain(hi.names())
                .collect(),
            WhereClause::Constraint { lhs, rhs, .. } => lhs.names().chain(rhs.names()).collect(),
            WhereClause::Union(conj) => conj
                .iter()
                .flatten()
                .flat_map(|c| c.lhs.names().chain(c.rhs.names()))
                .collect(),
        }
    }
    /// The clause with every affine form replaced by `f` of it.
    pub fn map_affines(&self, f: &dyn Fn(&Affine) -> Affine) -> WhereClause {
        match self {
            WhereClause::Range { index, lo, hi } => WhereClause::Range {
                index: index.clone(),
                lo: f(lo),
                hi: f(hi),
            },
            WhereClause::Constraint { lhs, rel, rhs } => WhereClause::Constraint {
                lhs: f(lhs),
                rel: *rel,
                rhs: f(rhs),
            },
            WhereClause::Union(conj) => WhereClause::Union(
                conj.iter()
                    .map(|c| {
                        c.iter()
                            .map(|x| Comparison {
                                lhs: f(&x.lhs),
                                rel: x.rel,
                                rhs: f(&x.rhs),
                            })
                            .collect()
                    })
                    .collect(),
            ),
        }
    }
    /// A condition as text, each side printed by `affine`, with `and`/`or`
    /// and `=` for isl (`isl` true) or `&&`/`||` and `==` for C and TC;
    /// `None` for a range. A union is parenthesised as a whole, so that it
    /// can be joined with other conditions by `&&` (which binds tighter
    /// than `||`).
    pub fn condition_text(&self, isl: bool, affine: &dyn Fn(&Affine) -> String) -> Option<String> {
        let cmp = |lhs: &Affine, rel: Rel, rhs: &Affine| {
            let op = match (rel, isl) {
                (Rel::Eq, false) => "==",
                (r, _) => r.symbol(),
            };
            format!("{} {op} {}", affine(lhs), affine(rhs))
        };
        let (and, or) = if isl {
            (" and ", " or ")
        } else {
            (" && ", " || ")
        };
        match self {
            WhereClause::Range { .. } => None,
            WhereClause::Constraint { lhs, rel, rhs } => Some(cmp(lhs, *rel, rhs)),
            WhereClause::Union(conj) => {
                let alternatives: Vec<String> = conj
                    .iter()
                    .map(|c| {
                        let parts: Vec<String> =
                            c.iter().map(|x| cmp(&x.lhs, x.rel, &x.rhs)).collect();
                        format!("({})", parts.join(and))
                    })
                    .collect();
                Some(format!("({})", alternatives.join(or)))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rel {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
}

impl Rel {
    pub fn symbol(self) -> &'static str {
        match self {
            Rel::Lt => "<",
            Rel::Le => "<=",
            Rel::Gt => ">",
            Rel::Ge => ">=",
            Rel::Eq => "=",
        }
    }
}

/// One statement of `body`.
#[derive(Debug, Clone)]
pub struct Statement {
    /// Position in `body`, from 0.
    pub position: usize,
    /// The statement as written.
    pub text: String,
    pub lhs_tensor: String,
    /// The left side's index variables, in order.
    pub lhs_indices: Vec<String>,
    pub op: AssignOp,
    pub rhs: Expr,
    pub wheres: Vec<WhereClause>,
    /// Index variables that appear on the right or in `where` but not on
    /// the left, in order of first appearance (never a block index).
    pub reduction_indices: Vec<String>,
    /// The loop blocks around the statement, outermost first (empty at the
    /// top level of `body`).
    pub blocks: Vec<LoopBlock>,
}

/// A loop block of `body`, `{"for": "t in lo:hi", "body": [...]}`: its
/// entries run once for each `t` in `[lo, hi)`, in increasing order.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopBlock {
    /// Which block of the program: blocks are numbered from 0 in the order
    /// their `for` appears in the file, so two statements are in the same
    /// block when they carry the same `id`.
    pub id: usize,
    pub index: String,
    /// Affine in parameters only.
    pub lo: Affine,
    pub hi: Affine,
}

impl Statement {
    /// All index variables, the order of the statement's domain: the
    /// enclosing blocks' indices (outermost first), then the left side's
    /// other indices, then the reduction indices. Without blocks: the left
    /// side, then the reduction indices.
    pub fn all_indices(&self) -> Vec<String> {
        let mut v = self.init_indices();
        v.extend(self.reduction_indices.iter().cloned());
        v
    }

    /// The indices of a reduction's initialisation: the blocks' indices,
    /// then the left side's other indices (the left side's indices where
    /// there are no blocks).
    pub fn init_indices(&self) -> Vec<String> {
        let mut v: Vec<String> = self.blocks.iter().map(|b| b.index.clone()).collect();
        v.extend(
            self.lhs_indices
                .iter()
                .filter(|i| !self.is_block_index(i))
                .cloned(),
        );
        v
    }

    /// Whether `name` is the index of one of the statement's blocks.
    pub fn is_block_index(&self, name: &str) -> bool {
        self.blocks.iter().any(|b| b.index == name)
    }
}

/// A parsed and type-checked program. `Default` (no name, nothing
/// declared) only stands in while a cached compilation (`Compiled`),
/// which stores no program, is read back.
#[derive(Debug, Clone, Default)]
pub struct Program {
    pub name: String,
    /// File the program came from (for messages), or `<string>`.
    pub source: String,
    pub params: Vec<Param>,
    /// Inputs, outputs and temps in file order (inputs, then outputs, then
    /// temps).
    pub tensors: Vec<Tensor>,
    pub statements: Vec<Statement>,
    /// The optional `schedule` key, kept as written.
    pub schedule: Option<serde_json::Value>,
    /// The states of a rolling update's loop, where a rolling update made
    /// this program (see `repair::rolling`).
    pub rolling: Option<RollingStates>,
}

/// The running states of a rolling update's loop, as the rewrite made and
/// proved them: enough to combine two partial states of the loop (each
/// the loop run over a share of its iterations from the reducers'
/// identities), which is what splitting the loop across the lanes of a
/// warp needs. Two states `a` and `b` combine as Neptune's split-k update
/// does its slices (Eq. 8): each predecessor `X = X_a fr X_b`, then each
/// target `T = H(T_a; X_a, X) f H(T_b; X_b, X)`, where `H(T; Xp, X)` is
/// the target's repair term `h(T, Xp, X)` (guarded by `Xp == X`), proven
/// to commute with `f` (Eq. 5) and to satisfy `h(g(r, c), r, r') =
/// g(r', c)` (Eq. 4): it moves a partial result from the predecessors'
/// values it was computed with to the combined ones.
#[derive(Debug, Clone, Default)]
pub struct RollingStates {
    pub preds: Vec<RollingPred>,
    pub targets: Vec<RollingTarget>,
}

/// A predecessor of a rolling update: `X = X fr body` in the rolling
/// loop, its previous value cached in `cache` (`Xp = X` before it).
#[derive(Debug, Clone)]
pub struct RollingPred {
    pub tensor: String,
    pub reducer: Reducer,
    pub cache: String,
}

/// A target of a rolling update: `T = H(T; Xp, X) f g(X, C)` in the
/// rolling loop, `repair` being `H` as it reads `T`, the caches and the
/// predecessors (at the target's subscripts).
#[derive(Debug, Clone)]
pub struct RollingTarget {
    pub tensor: String,
    pub reducer: Reducer,
    pub repair: Expr,
}

impl Program {
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
    pub fn is_param(&self, name: &str) -> bool {
        self.param(name).is_some()
    }
    /// The value of a parameter, when the program (or `--param`) gives one.
    pub fn param_value(&self, name: &str) -> Option<i64> {
        self.param(name).and_then(|p| p.value)
    }
    /// The parameters that have a value, by name.
    pub fn known_params(&self) -> std::collections::HashMap<String, i64> {
        self.params
            .iter()
            .filter_map(|p| p.value.map(|v| (p.name.clone(), v)))
            .collect()
    }
    /// Whether a tensor or a cast of the program has one of the dtypes
    /// whose helpers are printed on demand ([`DType::needs_extra_helpers`]).
    pub fn uses_extra_dtypes(&self) -> bool {
        self.uses_dtype(&|t| t.needs_extra_helpers())
    }
    /// Whether a tensor or a cast of the program has a dtype `which` holds.
    pub fn uses_dtype(&self, which: &dyn Fn(DType) -> bool) -> bool {
        fn casts(e: &Expr, which: &dyn Fn(DType) -> bool) -> bool {
            match &e.kind {
                ExprKind::Cast(t, a) => which(*t) || casts(a, which),
                ExprKind::Unary(_, a) => casts(a, which),
                ExprKind::Binary(_, a, b) => casts(a, which) || casts(b, which),
                ExprKind::Select(c, a, b) => casts(c, which) || casts(a, which) || casts(b, which),
                ExprKind::Call(_, args) => args.iter().any(|a| casts(a, which)),
                _ => false,
            }
        }
        self.tensors.iter().any(|t| which(t.dtype))
            || self.statements.iter().any(|s| casts(&s.rhs, which))
    }
    /// `a` with every parameter replaced by its value, when all have one.
    pub fn evaluate(&self, a: &Affine) -> Option<i64> {
        a.substitute(&|n: &str| self.param_value(n)).as_constant()
    }
}

/// Every tensor read of an expression, in evaluation order.
pub fn collect_reads(e: &Expr, out: &mut Vec<(String, Vec<Affine>)>) {
    match &e.kind {
        ExprKind::Access { tensor, subscripts } => out.push((tensor.clone(), subscripts.clone())),
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => collect_reads(a, out),
        ExprKind::Binary(_, a, b) => {
            collect_reads(a, out);
            collect_reads(b, out);
        }
        ExprKind::Select(c, a, b) => {
            collect_reads(c, out);
            collect_reads(a, out);
            collect_reads(b, out);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| collect_reads(a, out)),
        ExprKind::Number(_) | ExprKind::Inf { .. } | ExprKind::Index(_) | ExprKind::Param(_) => {}
    }
}
