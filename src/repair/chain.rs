//! Reduction chains: a target reduction `L_t` whose right side, once the map
//! statements between them are inlined (Neptune's InlineMapReturnReduce),
//! reads the results of earlier reductions `L_r` over the same reduction
//! loop, and the match of its body to
//!
//! ```text
//!   X_t[φ_t(i)] = X_t[φ_t(i)]  f  g(X_r[φ_r(i)], C[φ_c(i, j)])      (Eq. 2)
//! ```
//!
//! Every maximal subterm of the inlined body that reads no predecessor is a
//! constant input `c<k>`; every predecessor read is `r<k>`. "The same
//! reduction loop" is checked in isl: the predecessor's iteration domain,
//! renamed through the target's access to it, equals the target's domain
//! projected on the predecessor's coordinates and the reduction index.

use std::collections::BTreeMap;

use egg::Symbol;

use super::algebra::{Math, Reducer, Term};
use crate::error::Result;
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, Expr, ExprKind, Func, Program, Reducer as AstReducer, TensorRole, UnOp,
};
use crate::isl::Isl;
use crate::model::Scop;

/// A reduce predecessor of a target.
#[derive(Debug, Clone)]
pub struct Pred {
    /// The statement (index in `Program::statements`).
    pub stmt: usize,
    /// The tensor it reduces into, `X_r`.
    pub tensor: String,
    /// The target's subscripts of `X_r` (plain target index variables).
    pub target_subscripts: Vec<String>,
    /// The symbol `r<k>` of the algebra.
    pub symbol: String,
}

/// A target reduction matched to Eq. 2.
#[derive(Debug, Clone)]
pub struct Chain {
    pub target: usize,
    pub reducer: Reducer,
    /// The target's reduction index `j` (the rolling loop).
    pub rolling: String,
    pub preds: Vec<Pred>,
    /// Map statements inlined into the body.
    pub inlined: Vec<usize>,
    /// The target's right side with the maps inlined.
    pub body: Expr,
    /// `g` over `r<k>` and `c<k>`.
    pub g: Term,
    /// The frontend expression of each constant symbol.
    pub constants: BTreeMap<String, Expr>,
}

/// Why a statement is not a chain target.
pub type Refusal = String;

fn reducer_of(op: AstReducer) -> Reducer {
    match op {
        AstReducer::Sum => Reducer::Sum,
        AstReducer::Prod => Reducer::Prod,
        AstReducer::Max => Reducer::Max,
        AstReducer::Min => Reducer::Min,
    }
}

/// The statements writing `tensor`.
fn writers(program: &Program, tensor: &str) -> Vec<usize> {
    program
        .statements
        .iter()
        .enumerate()
        .filter(|(_, s)| s.lhs_tensor == tensor)
        .map(|(k, _)| k)
        .collect()
}

/// `e` with index variables renamed (`Index` values and subscripts).
pub fn rename_indices(e: &Expr, map: &dyn Fn(&str) -> Option<String>) -> Expr {
    let kind = match &e.kind {
        ExprKind::Index(n) => ExprKind::Index(map(n).unwrap_or_else(|| n.clone())),
        ExprKind::Access { tensor, subscripts } => ExprKind::Access {
            tensor: tensor.clone(),
            subscripts: subscripts.iter().map(|a| rename_affine(a, map)).collect(),
        },
        ExprKind::Unary(op, a) => ExprKind::Unary(*op, Box::new(rename_indices(a, map))),
        ExprKind::Cast(t, a) => ExprKind::Cast(*t, Box::new(rename_indices(a, map))),
        ExprKind::Binary(op, a, b) => ExprKind::Binary(
            *op,
            Box::new(rename_indices(a, map)),
            Box::new(rename_indices(b, map)),
        ),
        ExprKind::Select(c, a, b) => ExprKind::Select(
            Box::new(rename_indices(c, map)),
            Box::new(rename_indices(a, map)),
            Box::new(rename_indices(b, map)),
        ),
        ExprKind::Call(f, args) => {
            ExprKind::Call(*f, args.iter().map(|a| rename_indices(a, map)).collect())
        }
        k => k.clone(),
    };
    Expr { kind, ty: e.ty }
}

pub fn rename_affine(a: &Affine, map: &dyn Fn(&str) -> Option<String>) -> Affine {
    let mut r = Affine::constant(a.constant);
    for (n, c) in &a.terms {
        let to = map(n).unwrap_or_else(|| n.clone());
        let mut t = Affine::var(&to).scale(*c);
        t.constant = 0;
        r = r.add(&t);
    }
    r
}

/// Plain variable names of subscripts, when every subscript is one.
pub(super) fn plain_vars(subs: &[Affine]) -> Option<Vec<String>> {
    subs.iter()
        .map(|a| {
            (a.constant == 0 && a.terms.len() == 1 && a.terms.values().all(|c| *c == 1))
                .then(|| a.terms.keys().next().cloned())
                .flatten()
        })
        .collect()
}

struct Inliner<'a> {
    program: &'a Program,
    target: usize,
    rolling: &'a str,
    preds: Vec<Pred>,
    inlined: Vec<usize>,
}

impl Inliner<'_> {
    /// Whether the statement writing `tensor` is a reduce predecessor
    /// candidate: one reduction over one index, the only writer.
    fn reduce_writer(&self, tensor: &str) -> Option<usize> {
        let w = writers(self.program, tensor);
        if w.len() != 1 || w[0] == self.target {
            return None;
        }
        let s = &self.program.statements[w[0]];
        (matches!(s.op, AssignOp::Reduce { init: true, .. }) && s.reduction_indices.len() == 1)
            .then_some(w[0])
    }

    /// The only writer of `tensor` when it is a map statement into a temp.
    fn map_writer(&self, tensor: &str) -> Option<usize> {
        let w = writers(self.program, tensor);
        if w.len() != 1 || w[0] >= self.target {
            return None;
        }
        let s = &self.program.statements[w[0]];
        let temp = self
            .program
            .tensor(tensor)
            .is_some_and(|t| t.role == TensorRole::Temp);
        (s.op == AssignOp::Assign && s.reduction_indices.is_empty() && temp).then_some(w[0])
    }

    /// `e` with every map statement that leads to a predecessor inlined.
    fn inline(&mut self, e: &Expr) -> Expr {
        map_accesses(e, &mut |read, tensor, subscripts| {
            self.inline_read(read, tensor, subscripts)
        })
    }

    /// The read `e` of `tensor`: a predecessor's value (recorded), or the
    /// map that writes it inlined where that leads to a predecessor, or
    /// `e` itself.
    fn inline_read(&mut self, e: &Expr, tensor: &str, subscripts: &[Affine]) -> Expr {
        let vars = plain_vars(subscripts);
        if let (Some(w), Some(vars)) = (self.reduce_writer(tensor), vars.as_ref()) {
            if w < self.target && vars.iter().all(|v| v != self.rolling) {
                if self.preds.iter().all(|p| p.stmt != w) {
                    let symbol = format!("r{}", self.preds.len());
                    self.preds.push(Pred {
                        stmt: w,
                        tensor: tensor.to_string(),
                        target_subscripts: vars.clone(),
                        symbol,
                    });
                }
                return e.clone();
            }
        }
        if let (Some(m), Some(vars)) = (self.map_writer(tensor), vars) {
            let def = &self.program.statements[m];
            let rename: BTreeMap<String, String> =
                def.lhs_indices.iter().cloned().zip(vars).collect();
            let body = rename_indices(&def.rhs, &|n| rename.get(n).cloned());
            let before = self.preds.len();
            let inlined = self.inline(&body);
            if self.preds.len() > before || reads_any(&inlined, &self.preds) {
                if !self.inlined.contains(&m) {
                    self.inlined.push(m);
                }
                return declared(self.program, tensor, inlined, e);
            }
        }
        e.clone()
    }
}

/// The inlined value `value` of a read `read` of map tensor `tensor`, kept
/// as the program declares it: converted to the tensor's dtype where that
/// is stored narrower than it is computed (an f16 weights temp: the kernel
/// then rounds each weight once, as the program says, spec "Numerics"; a
/// u8 temp wraps, which the repair's algebra refuses), as it is.
fn declared(program: &Program, tensor: &str, value: Expr, read: &Expr) -> Expr {
    match program.tensor(tensor).map(|t| t.dtype) {
        Some(t) if t.compute() != t => Expr {
            kind: ExprKind::Cast(t, Box::new(value)),
            ty: read.ty,
        },
        _ => value,
    }
}

/// `e` with every tensor read replaced by `f(read, tensor, subscripts)`,
/// the rest of the expression as it is.
pub(super) fn map_accesses(e: &Expr, f: &mut dyn FnMut(&Expr, &str, &[Affine]) -> Expr) -> Expr {
    let kind = match &e.kind {
        ExprKind::Access { tensor, subscripts } => return f(e, tensor, subscripts),
        ExprKind::Unary(op, a) => ExprKind::Unary(*op, Box::new(map_accesses(a, f))),
        ExprKind::Cast(t, a) => ExprKind::Cast(*t, Box::new(map_accesses(a, f))),
        ExprKind::Binary(op, a, b) => ExprKind::Binary(
            *op,
            Box::new(map_accesses(a, f)),
            Box::new(map_accesses(b, f)),
        ),
        ExprKind::Select(c, a, b) => ExprKind::Select(
            Box::new(map_accesses(c, f)),
            Box::new(map_accesses(a, f)),
            Box::new(map_accesses(b, f)),
        ),
        ExprKind::Call(fun, args) => {
            ExprKind::Call(*fun, args.iter().map(|a| map_accesses(a, f)).collect())
        }
        k => k.clone(),
    };
    Expr { kind, ty: e.ty }
}

/// Whether `e` reads one of `preds`.
fn reads_any(e: &Expr, preds: &[Pred]) -> bool {
    let mut reads = Vec::new();
    crate::model::collect_reads(e, &mut reads);
    reads
        .iter()
        .any(|(t, _)| preds.iter().any(|p| &p.tensor == t))
}

/// Builds `g` from the inlined body: predecessor reads become `r<k>`,
/// maximal subterms without one become constants `c<k>`.
struct Abstraction<'a> {
    preds: &'a [Pred],
    term: Term,
    constants: BTreeMap<String, Expr>,
}

impl Abstraction<'_> {
    fn symbol(&mut self, s: &str) -> egg::Id {
        self.term.add(Math::Symbol(Symbol::from(s)))
    }

    fn walk(&mut self, e: &Expr) -> std::result::Result<egg::Id, Refusal> {
        if !reads_any(e, self.preds) {
            // The same input read twice is one constant (so that
            // `(x - m) * (x - m)` is seen to use it twice).
            if let Some(name) = self
                .constants
                .iter()
                .find(|(_, c)| *c == e)
                .map(|(n, _)| n.clone())
            {
                return Ok(self.symbol(&name));
            }
            let name = format!("c{}", self.constants.len());
            self.constants.insert(name.clone(), e.clone());
            return Ok(self.symbol(&name));
        }
        let unsupported = |what: &str| {
            Err(format!(
                "g applies {what} to a predecessor value; polyfuse repairs only +, -, *, /, exp, log, max and min"
            ))
        };
        Ok(match &e.kind {
            ExprKind::Access { tensor, .. } => {
                let p = self
                    .preds
                    .iter()
                    .find(|p| &p.tensor == tensor)
                    .ok_or("internal: unknown predecessor")?;
                let s = p.symbol.clone();
                self.symbol(&s)
            }
            ExprKind::Unary(UnOp::Neg, a) => {
                let a = self.walk(a)?;
                self.term.add(Math::Neg(a))
            }
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (self.walk(a)?, self.walk(b)?);
                self.term.add(match op {
                    BinOp::Add => Math::Add([x, y]),
                    BinOp::Sub => Math::Sub([x, y]),
                    BinOp::Mul => Math::Mul([x, y]),
                    BinOp::Div => Math::Div([x, y]),
                    other => return unsupported(&format!("`{}`", other.symbol())),
                })
            }
            ExprKind::Call(f, args) => {
                let ids: Vec<egg::Id> = args
                    .iter()
                    .map(|a| self.walk(a))
                    .collect::<std::result::Result<_, _>>()?;
                self.term.add(match f {
                    Func::Exp => Math::Exp(ids[0]),
                    Func::Log => Math::Log(ids[0]),
                    Func::Max => Math::Max([ids[0], ids[1]]),
                    Func::Min => Math::Min([ids[0], ids[1]]),
                    other => return unsupported(other.name()),
                })
            }
            // A rounding to any float is the identity over the reals, as
            // every f32 rounding is: the repair's identities hold over the
            // reals, and the declared precisions bound what rounding adds
            // (the check admits twice the declared-precision run's error).
            ExprKind::Cast(t, a) if t.is_float() => self.walk(a)?,
            ExprKind::Cast(t, _) => return unsupported(&format!("a cast to {t}")),
            ExprKind::Select(..) => return unsupported("a selection `?:`"),
            ExprKind::Unary(UnOp::Not, _) => return unsupported("`!`"),
            _ => return Err("internal: leaf without a predecessor".into()),
        })
    }
}

/// Matches statement `target` of `program` to Eq. 2, or says why not.
pub fn find(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    target: usize,
) -> Result<std::result::Result<Chain, Refusal>> {
    let st = &program.statements[target];
    let AssignOp::Reduce { op, init } = st.op else {
        return Ok(Err("it is not a reduction".into()));
    };
    if !init {
        return Ok(Err(
            "it reduces into a value it does not initialise (`op=` without `!`)".into(),
        ));
    }
    if st.reduction_indices.len() != 1 {
        return Ok(Err(format!(
            "it reduces over {} indices; a rolling loop is one reduction index",
            st.reduction_indices.len()
        )));
    }
    let rolling = st.reduction_indices[0].clone();
    let mut inliner = Inliner {
        program,
        target,
        rolling: &rolling,
        preds: Vec::new(),
        inlined: Vec::new(),
    };
    let body = inliner.inline(&st.rhs);
    let (preds, inlined) = (inliner.preds, inliner.inlined);
    if preds.is_empty() {
        return Ok(Err(format!(
            "its right side reads no earlier reduction over `{rolling}`; nothing to repair"
        )));
    }
    for p in &preds {
        if let Err(why) = same_loop(isl, program, scop, target, &rolling, p)? {
            return Ok(Err(why));
        }
    }
    let mut abs = Abstraction {
        preds: &preds,
        term: Term::default(),
        constants: BTreeMap::new(),
    };
    if let Err(why) = abs.walk(&body) {
        return Ok(Err(why));
    }
    let g = abs.term;
    let constants = abs.constants;
    Ok(Ok(Chain {
        target,
        reducer: reducer_of(op),
        rolling,
        preds,
        inlined,
        body,
        g,
        constants,
    }))
}

/// Checks that predecessor `p` reduces over the target's rolling loop:
/// `rename(D_p) = π(D_t)` with `π` the projection on the target's
/// subscripts of `X_r` and the rolling index.
fn same_loop(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    target: usize,
    rolling: &str,
    p: &Pred,
) -> Result<std::result::Result<(), Refusal>> {
    let ps = &program.statements[p.stmt];
    if ps.lhs_indices.len() != p.target_subscripts.len() {
        return Ok(Err(format!(
            "it reads {} with too few subscripts",
            p.tensor
        )));
    }
    let (Some(dp), Some(dt)) = (
        scop.statement(&format!("S{}", p.stmt)),
        scop.statement(&format!("S{target}")),
    ) else {
        return Ok(Err("internal: no model statement".into()));
    };
    let coords: Vec<String> = p
        .target_subscripts
        .iter()
        .cloned()
        .chain(std::iter::once(rolling.to_string()))
        .collect();
    let pre = &scop.param_prefix;
    let tmap = isl.map(&format!(
        "{pre}{{ S{target}[{}] -> [{}] }}",
        dt.iterators.join(", "),
        coords.join(", ")
    ))?;
    let mut pcoords = ps.lhs_indices.clone();
    pcoords.extend(ps.reduction_indices.iter().cloned());
    let pmap = isl.map(&format!(
        "{pre}{{ S{}[{}] -> [{}] }}",
        p.stmt,
        dp.iterators.join(", "),
        pcoords.join(", ")
    ))?;
    let t_proj = dt.domain.copy()?.apply(tmap)?;
    let p_proj = dp.domain.copy()?.apply(pmap)?;
    if !t_proj.is_equal(&p_proj)? {
        return Ok(Err(format!(
            "the reduction of {} (statement {}) and this one do not run over the same `{rolling}` loop",
            p.tensor,
            ps.position + 1
        )));
    }
    Ok(Ok(()))
}
