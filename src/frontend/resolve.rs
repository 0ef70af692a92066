//! Name resolution and type checking of one parsed statement.
//!
//! Names: a declared tensor followed by `(` is an access, a function or a
//! cast name followed by `(` is a call, `inf` is infinity, a parameter is a
//! parameter, and any other name is an index variable. Subscripts and
//! `where` bounds must be affine in index variables and parameters.
//!
//! Types: tensors compute in `dtype.compute()` (f16/bf16 in f32). Literals,
//! `inf`, index variables and parameters have no type of their own and take
//! the type of what they are combined with (the left side's by default).
//! Mixing two typed operands of different types is an error that asks for a
//! cast. u8 computes in i32 (it mixes with i32 freely), the 8-bit floats in
//! f32, i64 in i64.
//!
//! Booleans: a comparison (or `&&`, `||`, `!`) is a condition; where a
//! number is expected it reads as 1 or 0 in the type it meets. A `bool`
//! tensor read and a `bool(..)` cast read the same way: they have no type
//! of their own, like a literal, so `X(i) * M(i)` with `M` bool is an f32
//! product when `X` is f32. A bool read is also a condition
//! (`M(i) ? X(i) : 0`). A statement into a bool tensor computes its right
//! side in i32 and stores 1 for any nonzero value.

use super::ast::{
    Affine, AssignOp, BinOp, Comparison, DType, Expr, ExprKind, ExprType, Func, LoopBlock, Program,
    Reducer, Statement, UnOp, WhereClause,
};
use super::syntax::{parse_statement, Raw, RawClause};

/// Every dtype name is a cast function.
fn cast_type(name: &str) -> Option<DType> {
    DType::parse(name)
}

/// Whether `r` is a condition: a comparison, `&&`, `||` or `!`.
fn is_condition(r: &Raw) -> bool {
    matches!(r, Raw::Unary(UnOp::Not, _))
        || matches!(r, Raw::Binary(op, ..) if op.is_comparison() || op.is_logical())
}

/// Names a program may not use for its own tensors or parameters.
pub fn is_reserved(name: &str) -> bool {
    Func::parse(name).is_some()
        || cast_type(name).is_some()
        || matches!(name, "inf" | "where" | "in")
}

struct Ctx<'a> {
    program: &'a Program,
    /// Tensor dtypes known so far (declared, or defined by earlier
    /// statements).
    dtypes: &'a dyn Fn(&str) -> Option<DType>,
    index_order: Vec<String>,
}

impl Ctx<'_> {
    fn is_tensor(&self, n: &str) -> bool {
        (self.dtypes)(n).is_some()
    }
    fn note_index(&mut self, n: &str) {
        if !self.index_order.iter().any(|x| x == n) {
            self.index_order.push(n.to_string());
        }
    }

    fn affine(&mut self, r: &Raw) -> Result<Affine, String> {
        let not_affine = || format!("subscript `{}` is not affine", show_raw(r));
        Ok(match r {
            Raw::Num(v, true) => Affine::constant(*v as i64),
            Raw::Num(..) => return Err(not_affine()),
            Raw::Name(n) => {
                if self.is_tensor(n) {
                    return Err(format!("tensor `{n}` used without subscripts"));
                }
                if n == "inf" || is_reserved(n) {
                    return Err(not_affine());
                }
                if !self.program.is_param(n) {
                    self.note_index(n);
                }
                Affine::var(n)
            }
            Raw::Unary(UnOp::Neg, a) => self.affine(a)?.scale(-1),
            Raw::Binary(BinOp::Add, a, b) => self.affine(a)?.add(&self.affine(b)?),
            Raw::Binary(BinOp::Sub, a, b) => self.affine(a)?.sub(&self.affine(b)?),
            Raw::Binary(BinOp::Mul, a, b) => {
                let (x, y) = (self.affine(a)?, self.affine(b)?);
                match (x.as_constant(), y.as_constant()) {
                    (Some(c), _) => y.scale(c),
                    (_, Some(c)) => x.scale(c),
                    _ => return Err(not_affine()),
                }
            }
            _ => return Err(not_affine()),
        })
    }

    /// The type an expression has of its own, if any.
    fn natural(&self, r: &Raw) -> Option<DType> {
        match r {
            Raw::Num(..) | Raw::Name(_) => None,
            Raw::Call(n, args) => {
                if let Some(t) = (self.dtypes)(n) {
                    // A bool reads as 0 or 1 in any type.
                    (t != DType::Bool).then(|| t.compute())
                } else if let Some(t) = cast_type(n) {
                    (t != DType::Bool).then(|| t.compute())
                } else {
                    args.iter().find_map(|a| self.natural(a))
                }
            }
            Raw::Unary(UnOp::Neg, a) => self.natural(a),
            Raw::Unary(UnOp::Not, _) => None,
            Raw::Binary(op, a, b) if !op.is_comparison() && !op.is_logical() => {
                self.natural(a).or_else(|| self.natural(b))
            }
            Raw::Binary(..) => None,
            Raw::Select(_, a, b) => self.natural(a).or_else(|| self.natural(b)),
        }
    }

    /// The common type of two operands, `want` when neither has one.
    fn unify(&self, a: &Raw, b: &Raw, want: DType) -> Result<DType, String> {
        match (self.natural(a), self.natural(b)) {
            (Some(x), Some(y)) if x != y => Err(format!(
                "type mismatch: `{}` is {x} and `{}` is {y}; add a cast such as {x}(...)",
                show_raw(a),
                show_raw(b)
            )),
            (Some(x), _) | (_, Some(x)) => Ok(x),
            _ => Ok(want),
        }
    }

    fn num(&mut self, r: &Raw, t: DType) -> Result<Expr, String> {
        let e = |kind: ExprKind| Expr {
            kind,
            ty: ExprType::Num(t),
        };
        Ok(match r {
            Raw::Num(v, int) => {
                if t.is_integer() && !int {
                    return Err(format!("the fractional literal `{v}` is used as an {t}"));
                }
                e(ExprKind::Number(*v))
            }
            Raw::Name(n) if n == "inf" => e(ExprKind::Inf { negative: false }),
            Raw::Unary(UnOp::Neg, a) if matches!(&**a, Raw::Name(n) if n == "inf") => {
                e(ExprKind::Inf { negative: true })
            }
            Raw::Name(n) => {
                if self.is_tensor(n) {
                    return Err(format!("tensor `{n}` used without subscripts"));
                }
                if is_reserved(n) {
                    return Err(format!("`{n}` is a function; call it with arguments"));
                }
                if self.program.is_param(n) {
                    e(ExprKind::Param(n.clone()))
                } else {
                    self.note_index(n);
                    e(ExprKind::Index(n.clone()))
                }
            }
            Raw::Call(n, args) => {
                if let Some(dt) = (self.dtypes)(n) {
                    if dt != DType::Bool && dt.compute() != t {
                        return Err(mismatch_read(r, dt, t));
                    }
                    let subscripts = args
                        .iter()
                        .map(|a| self.affine(a))
                        .collect::<Result<Vec<_>, _>>()?;
                    if let Some(rank) = self.rank(n) {
                        if rank != subscripts.len() {
                            return Err(format!(
                                "tensor `{n}` has {rank} dimensions but is accessed with {}",
                                subscripts.len()
                            ));
                        }
                    }
                    e(ExprKind::Access {
                        tensor: n.clone(),
                        subscripts,
                    })
                } else if let Some(to) = cast_type(n) {
                    if args.len() != 1 {
                        return Err(format!("the cast `{n}` takes one argument"));
                    }
                    if to == DType::Bool {
                        // 1 for a true condition or a nonzero number, in
                        // the type the cast meets.
                        let inner = if is_condition(&args[0]) {
                            self.boolean(&args[0])?
                        } else {
                            let inner_t = self.natural(&args[0]).unwrap_or(t);
                            self.num(&args[0], inner_t)?
                        };
                        return Ok(e(ExprKind::Cast(to, Box::new(inner))));
                    }
                    if to.compute() != t {
                        return Err(mismatch(r, to.compute(), t));
                    }
                    let inner_t = self.natural(&args[0]).unwrap_or(to.compute());
                    let inner = self.num(&args[0], inner_t)?;
                    Expr {
                        kind: ExprKind::Cast(to, Box::new(inner)),
                        ty: ExprType::Num(to.compute()),
                    }
                } else if let Some(f) = Func::parse(n) {
                    if args.len() != f.arity() {
                        return Err(format!(
                            "`{n}` takes {} argument(s), not {}",
                            f.arity(),
                            args.len()
                        ));
                    }
                    if t.is_integer() && !matches!(f, Func::Abs | Func::Max | Func::Min) {
                        return Err(format!(
                            "`{n}` needs a float argument, not {t}; cast it, e.g. `{n}(f32(..))`"
                        ));
                    }
                    let ft = if args.len() == 2 {
                        self.unify(&args[0], &args[1], t)?
                    } else {
                        t
                    };
                    let a = args
                        .iter()
                        .map(|a| self.num(a, ft))
                        .collect::<Result<Vec<_>, _>>()?;
                    e(ExprKind::Call(f, a))
                } else {
                    return Err(format!("unknown tensor or function `{n}`"));
                }
            }
            Raw::Unary(UnOp::Neg, a) => e(ExprKind::Unary(UnOp::Neg, Box::new(self.num(a, t)?))),
            Raw::Binary(op, a, b) if !op.is_comparison() && !op.is_logical() => {
                let x = self.num(a, t)?;
                let y = self.num(b, t)?;
                e(ExprKind::Binary(*op, Box::new(x), Box::new(y)))
            }
            Raw::Select(c, a, b) => {
                let c = self.boolean(c)?;
                let x = self.num(a, t)?;
                let y = self.num(b, t)?;
                e(ExprKind::Select(Box::new(c), Box::new(x), Box::new(y)))
            }
            Raw::Unary(UnOp::Not, _) | Raw::Binary(..) => {
                // A condition where a number is expected is a bool: 1 or 0.
                let c = self.boolean(r)?;
                let one = e(ExprKind::Number(1.0));
                let zero = e(ExprKind::Number(0.0));
                e(ExprKind::Select(Box::new(c), Box::new(one), Box::new(zero)))
            }
        })
    }

    fn rank(&self, tensor: &str) -> Option<usize> {
        self.program
            .tensor(tensor)
            .and_then(|t| t.shape.as_ref().map(|s| s.len()))
    }

    fn boolean(&mut self, r: &Raw) -> Result<Expr, String> {
        let b = |kind| Expr {
            kind,
            ty: ExprType::Bool,
        };
        Ok(match r {
            Raw::Binary(op, a, c) if op.is_logical() => b(ExprKind::Binary(
                *op,
                Box::new(self.boolean(a)?),
                Box::new(self.boolean(c)?),
            )),
            Raw::Binary(op, a, c) if op.is_comparison() => {
                let t = self.unify(a, c, DType::I32)?;
                let x = self.num(a, t)?;
                let y = self.num(c, t)?;
                b(ExprKind::Binary(*op, Box::new(x), Box::new(y)))
            }
            Raw::Unary(UnOp::Not, a) => b(ExprKind::Unary(UnOp::Not, Box::new(self.boolean(a)?))),
            // A bool tensor read or a `bool(..)` cast is a condition: `!= 0`.
            Raw::Call(n, _)
                if (self.dtypes)(n) == Some(DType::Bool)
                    || (!self.is_tensor(n) && cast_type(n) == Some(DType::Bool)) =>
            {
                let x = self.num(r, DType::I32)?;
                let zero = Expr {
                    kind: ExprKind::Number(0.0),
                    ty: ExprType::Num(DType::I32),
                };
                b(ExprKind::Binary(BinOp::Ne, Box::new(x), Box::new(zero)))
            }
            _ => {
                return Err(format!(
                    "`{}` is a number, not a condition; compare it, e.g. `{} != 0`",
                    show_raw(r),
                    show_raw(r)
                ))
            }
        })
    }
}

/// Decides the dtype of a statement's left tensor from its name and the
/// right side's own type (or refuses the write).
pub type LhsDtype<'a> = dyn Fn(&str, Option<DType>) -> Result<DType, String> + 'a;

/// Resolves and type-checks statement `position` of `program`, inside the
/// loop blocks `blocks` (outermost first). The steps: (1) parse, (2) the
/// left side's indices, (3) the left tensor's dtype against the right
/// side's, (4) the right side, (5) the `where` clauses, (6) the reduction
/// indices and the operator, (7) the reads of the left tensor.
pub fn statement(
    program: &Program,
    position: usize,
    text: &str,
    blocks: &[LoopBlock],
    dtypes: &dyn Fn(&str) -> Option<DType>,
    lhs_dtype: &LhsDtype,
) -> Result<Statement, String> {
    let is_block_index = |n: &str| blocks.iter().any(|b| b.index == n);
    let raw = parse_statement(text)?;
    if !blocks.is_empty() && dtypes(&raw.lhs).is_none() && calls(&raw.rhs, &raw.lhs) {
        return Err(format!(
            "`{0}` is read by the statement that first writes it (a recurrence): declare `{0}` in `temps` with its dtype and shape",
            raw.lhs
        ));
    }
    let mut cx = Ctx {
        program,
        dtypes,
        index_order: Vec::new(),
    };
    let lhs_indices = cx.lhs_indices(&raw.lhs_args)?;
    for i in &lhs_indices {
        cx.note_index(i);
    }
    let lt = cx.lhs_dtype(&raw, lhs_indices.len(), lhs_dtype)?;
    let t = lt.compute();
    let rhs = cx.num(&raw.rhs, t)?;
    let mut wheres = Vec::new();
    for w in &raw.wheres {
        cx.where_clause(w, &is_block_index, &mut wheres)?;
    }
    let reduction_indices: Vec<String> = cx
        .index_order
        .iter()
        .filter(|i| !lhs_indices.contains(i) && !is_block_index(i))
        .cloned()
        .collect();
    let op = match (raw.op.as_str(), raw.bang) {
        ("=", _) => AssignOp::Assign,
        (o, init) => AssignOp::Reduce {
            op: match o {
                "+=" => Reducer::Sum,
                "*=" => Reducer::Prod,
                "max=" => Reducer::Max,
                _ => Reducer::Min,
            },
            init,
        },
    };
    // A reduction into a u8 or bool tensor converts each term to the
    // dtype before combining (`u8(..)`, `bool(..)`): the values then stay
    // in the dtype's range and the result does not depend on the order of
    // the terms (storing `max(acc, 300)` into a u8 step by step would).
    let rhs = match (op, lt) {
        (AssignOp::Reduce { .. }, DType::U8 | DType::Bool) => Expr {
            kind: ExprKind::Cast(lt, Box::new(rhs)),
            ty: ExprType::Num(t),
        },
        _ => rhs,
    };
    if op == AssignOp::Assign && !reduction_indices.is_empty() {
        return Err(format!(
            "index `{}` appears on the right but not on the left; a reduction over it needs a reduction operator such as `+=!`",
            reduction_indices[0]
        ));
    }
    if blocks.is_empty() {
        check_own_reads(&raw.lhs, &lhs_indices, op, &rhs)?;
    }
    Ok(Statement {
        position,
        text: text.to_string(),
        lhs_tensor: raw.lhs,
        lhs_indices,
        op,
        rhs,
        wheres,
        reduction_indices,
        blocks: blocks.to_vec(),
    })
}

/// Reading the left tensor: only the element being written, and only with
/// `=` (TC's rule). Inside loop blocks a statement may read what earlier
/// iterations wrote, its own left side included (a recurrence); that those
/// reads touch no element the statement writes in the same iteration is
/// checked on the model (`model::check_recurrences`), so this is not
/// called there.
fn check_own_reads(
    lhs: &str,
    lhs_indices: &[String],
    op: AssignOp,
    rhs: &Expr,
) -> Result<(), String> {
    let mut reads = Vec::new();
    super::ast::collect_reads(rhs, &mut reads);
    let own: Vec<Affine> = lhs_indices.iter().map(|i| Affine::var(i)).collect();
    for (t, subs) in reads.iter().filter(|(t, _)| *t == lhs) {
        if op != AssignOp::Assign {
            return Err(format!(
                "a reduction into `{t}` may not read `{t}` on its right side"
            ));
        }
        if *subs != own {
            return Err(format!(
                "`{t}` is read at other elements than the one written; TC forbids this (use a temp)"
            ));
        }
    }
    Ok(())
}

impl Ctx<'_> {
    /// The left side's subscripts: distinct plain index variables.
    fn lhs_indices(&self, args: &[Raw]) -> Result<Vec<String>, String> {
        let mut lhs_indices = Vec::new();
        for a in args {
            match a {
                Raw::Name(n)
                    if !self.program.is_param(n)
                        && !self.is_tensor(n)
                        && !is_reserved(n)
                        && n != "inf" =>
                {
                    if lhs_indices.contains(n) {
                        return Err(format!("index `{n}` appears twice on the left side"));
                    }
                    lhs_indices.push(n.clone());
                }
                _ => {
                    return Err(format!(
                        "the left side's subscripts must be plain index variables; `{}` is not",
                        show_raw(a)
                    ))
                }
            }
        }
        Ok(lhs_indices)
    }

    /// The left tensor's dtype, given the right side's own type: its rank
    /// must be the number of subscripts, and the right side's type its
    /// compute type (or a cast is asked for).
    fn lhs_dtype(
        &mut self,
        raw: &super::syntax::RawStatement,
        rank_written: usize,
        lhs_dtype: &LhsDtype,
    ) -> Result<DType, String> {
        let natural = self.natural(&raw.rhs);
        let lt = lhs_dtype(&raw.lhs, natural)?;
        if let Some(rank) = self.rank(&raw.lhs) {
            if rank != rank_written {
                return Err(format!(
                    "tensor `{}` has {rank} dimensions but is written with {rank_written}",
                    raw.lhs,
                ));
            }
        }
        let t = lt.compute();
        let Some(n) = natural.filter(|n| *n != t) else {
            return Ok(lt);
        };
        if lt == t {
            // The operand that has the wrong type, named with its dtype
            // (where the left side's dtype is its compute type; otherwise
            // the message below names both).
            self.num(&raw.rhs, t)?;
        }
        let computed = if lt.compute() != lt {
            format!(" (computed in {})", lt.compute())
        } else {
            String::new()
        };
        let hint = if lt == DType::Bool {
            " or a comparison such as `x != 0`".to_string()
        } else {
            String::new()
        };
        Err(format!(
            "type mismatch: the right side is {n} but `{}` is {lt}{computed}; add a cast such as {}(...){hint}",
            raw.lhs,
            if lt.needs_extra_helpers() { lt } else { lt.compute() }
        ))
    }

    /// Resolves one `where` clause into `wheres`: a range, constraints
    /// (a conjunction), or a union of conjunctions.
    fn where_clause(
        &mut self,
        w: &RawClause,
        is_block_index: &dyn Fn(&str) -> bool,
        wheres: &mut Vec<WhereClause>,
    ) -> Result<(), String> {
        match w {
            RawClause::Range(n, lo, hi) => {
                if self.program.is_param(n) || self.is_tensor(n) {
                    return Err(format!("`{n}` in a where range is not an index variable"));
                }
                if is_block_index(n) {
                    return Err(format!(
                        "`{n}` is the index of an enclosing loop block: its range is the block's, fixed, and a `where {n} in ..` cannot give it another (a constraint such as `{n} >= 1` may restrict the statement)"
                    ));
                }
                self.note_index(n);
                wheres.push(WhereClause::Range {
                    index: n.clone(),
                    lo: self.affine(lo)?,
                    hi: self.affine(hi)?,
                });
            }
            RawClause::Condition(union) if union.len() == 1 => {
                for (a, rel, b) in &union[0] {
                    wheres.push(WhereClause::Constraint {
                        lhs: self.affine(a)?,
                        rel: *rel,
                        rhs: self.affine(b)?,
                    });
                }
            }
            RawClause::Condition(union) => {
                let mut conj = Vec::new();
                for c in union {
                    let mut cmps = Vec::new();
                    for (a, rel, b) in c {
                        cmps.push(Comparison {
                            lhs: self.affine(a)?,
                            rel: *rel,
                            rhs: self.affine(b)?,
                        });
                    }
                    conj.push(cmps);
                }
                wheres.push(WhereClause::Union(conj));
            }
        }
        Ok(())
    }
}

/// A read of a tensor of dtype `dt` where `want` is expected.
fn mismatch_read(r: &Raw, dt: DType, want: DType) -> String {
    if dt == dt.compute() {
        return mismatch(r, dt, want);
    }
    format!(
        "type mismatch: `{}` is {dt} (computed in {}) where {want} is expected; add a cast such as {want}(...)",
        show_raw(r),
        dt.compute()
    )
}

/// The loop block `{"for": text, ...}` numbered `id`, inside `enclosing`:
/// `IDX in lo:hi` with `lo` and `hi` affine in parameters, and an index
/// that names no parameter, tensor, function or enclosing block's index.
pub fn loop_block(
    program: &Program,
    text: &str,
    id: usize,
    enclosing: &[LoopBlock],
) -> Result<LoopBlock, String> {
    let (index, lo, hi) = super::syntax::parse_for(text)
        .map_err(|m| format!("a loop block's `for` must be `IDX in lo:hi`: {m}"))?;
    if program.is_param(&index) {
        return Err(format!(
            "the block index `{index}` shadows the parameter `{index}`"
        ));
    }
    if program.tensor(&index).is_some() || is_reserved(&index) {
        return Err(format!(
            "the block index `{index}` is a tensor, function or keyword name"
        ));
    }
    if enclosing.iter().any(|b| b.index == index) {
        return Err(format!(
            "the block index `{index}` shadows the index of an enclosing block"
        ));
    }
    let none = |_: &str| None;
    let mut cx = Ctx {
        program,
        dtypes: &none,
        index_order: Vec::new(),
    };
    let mut bound = |r: &Raw| -> Result<Affine, String> {
        let a = cx.affine(r).map_err(|_| {
            format!(
                "the bounds of `{text}` must be affine expressions of parameters; `{}` is not",
                show_raw(r)
            )
        })?;
        if let Some(n) = a.names().find(|n| !program.is_param(n)) {
            return Err(format!(
                "the bounds of `{text}` may use parameters only, not `{n}`"
            ));
        }
        Ok(a)
    };
    let lo = bound(&lo)?;
    let hi = bound(&hi)?;
    Ok(LoopBlock { id, index, lo, hi })
}

/// Whether `r` calls or accesses `name`.
fn calls(r: &Raw, name: &str) -> bool {
    match r {
        Raw::Num(..) | Raw::Name(_) => false,
        Raw::Call(n, args) => n == name || args.iter().any(|a| calls(a, name)),
        Raw::Unary(_, a) => calls(a, name),
        Raw::Binary(_, a, b) => calls(a, name) || calls(b, name),
        Raw::Select(c, a, b) => calls(c, name) || calls(a, name) || calls(b, name),
    }
}

fn mismatch(r: &Raw, is: DType, want: DType) -> String {
    format!(
        "type mismatch: `{}` is {is} where {want} is expected; add a cast such as {want}(...)",
        show_raw(r)
    )
}

fn show_raw(r: &Raw) -> String {
    match r {
        Raw::Num(v, _) => format!("{v}"),
        Raw::Name(n) => n.clone(),
        Raw::Call(n, a) => format!(
            "{n}({})",
            a.iter().map(show_raw).collect::<Vec<_>>().join(", ")
        ),
        Raw::Unary(UnOp::Neg, a) => format!("-{}", show_raw(a)),
        Raw::Unary(UnOp::Not, a) => format!("!{}", show_raw(a)),
        Raw::Binary(op, a, b) => format!("{} {} {}", show_raw(a), op.symbol(), show_raw(b)),
        Raw::Select(c, a, b) => format!("{} ? {} : {}", show_raw(c), show_raw(a), show_raw(b)),
    }
}

/// An affine expression of parameters (a tensor extent).
pub fn shape_entry(program: &Program, text: &str) -> Result<Affine, String> {
    let raw = super::syntax::parse_additive(text)?;
    let none = |_: &str| None;
    let mut cx = Ctx {
        program,
        dtypes: &none,
        index_order: Vec::new(),
    };
    let a = cx
        .affine(&raw)
        .map_err(|_| format!("extent `{text}` is not an affine expression of parameters"))?;
    if let Some(n) = a.names().find(|n| !program.is_param(n)) {
        return Err(format!(
            "extent `{text}` uses `{n}`, which is not a parameter"
        ));
    }
    Ok(a)
}
