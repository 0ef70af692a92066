//! The typed AST of a polyfuse program: what the JSON file and its Tensor
//! Comprehension statements mean, before any polyhedral modelling.
//!
//! Index expressions (subscripts, `where` bounds, tensor shapes) are kept as
//! [`Affine`] forms `c0 + sum_k a_k * v_k` over index variables and
//! parameters, since everything the model builds in isl is affine in them.

use std::collections::BTreeMap;
use std::fmt;

/// Element type of a tensor, and the arithmetic type of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I32,
}

impl DType {
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "f64" => DType::F64,
            "i32" => DType::I32,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
        }
    }
    /// The type arithmetic on values of this type is carried out in:
    /// f16 and bf16 are stored narrow but computed in f32.
    pub fn compute(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            t => t,
        }
    }
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32)
    }
    /// Size of one stored element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 => 8,
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// A parsed and type-checked program.
#[derive(Debug, Clone)]
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
    /// `a` with every parameter replaced by its value, when all have one.
    pub fn evaluate(&self, a: &Affine) -> Option<i64> {
        a.substitute(&|n: &str| self.param_value(n)).as_constant()
    }
}
