//! The polyhedral model of a program (its SCoP): for every statement
//! instance set an iteration domain `D_S ⊆ Z^n` (an isl set over the
//! parameters), a write access relation `W_S : D_S -> T` and read relations
//! `R_S : D_S -> T`, all affine.
//!
//! A TC statement becomes one or two isl statements:
//! * `X(i) = e` and `X(i) op= e` (no `!`): one statement `S<k>`;
//! * `X(i) op=! e`: an init statement `S<k>_init` over the left indices that
//!   writes the reducer's identity, then the update `S<k>` over all indices.
//!
//! A statement inside loop blocks has the blocks' indices as the first
//! dimensions of its domains (its init's too), each in its block's range;
//! the program order nests accordingly ([`program_order`]).
//!
//! Built here too: TC's checks on the model. Every access stays inside its
//! tensor (`(D.A) \ T = ∅`) and every output element is written.

pub mod count;
pub mod order;
mod ranges;

use crate::error::{Error, Result};
use crate::frontend::ast::{
    Affine, AssignOp, Expr, ExprKind, LoopBlock, Program, Statement, TensorRole, WhereClause,
};
use crate::isl::{Isl, IslPrint, Map, Set, UnionMap, UnionSet};

/// Re-exported for the stages after the model, which have always found
/// it here; it belongs to the typed AST.
pub use crate::frontend::ast::collect_reads;

/// What an isl statement does with its source statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StmtKind {
    /// `X(..) = e`
    Assign,
    /// Sets the left side to the reducer's identity (the `!` of `op=!`).
    Init,
    /// `X(..) = X(..) op e`, one reduction step.
    Update,
}

/// One isl statement.
pub struct ModelStmt {
    /// isl tuple name: `S3` or `S3_init`.
    pub name: String,
    /// Index of the source statement in `Program::statements`.
    pub source: usize,
    pub kind: StmtKind,
    /// Names of the domain dimensions, in order.
    pub iterators: Vec<String>,
    pub domain: Set,
    pub write: Map,
    /// Every tensor read (for an update, the left side first).
    pub reads: Vec<Map>,
    /// The source statement's loop blocks, outermost first: their indices
    /// are the first iterators.
    pub blocks: Vec<LoopBlock>,
}

/// One access of a statement: the tensor, its subscripts in the source
/// statement's index variables, and its relation in the model.
pub struct Access<'a> {
    pub tensor: String,
    pub subscripts: Vec<Affine>,
    pub relation: &'a Map,
    pub write: bool,
}

impl Access<'_> {
    /// The key later stages name this access by.
    pub fn key(&self) -> AccessKey {
        AccessKey::new(&self.tensor, &self.subscripts)
    }
}

impl ModelStmt {
    /// Whether this is a reduction step whose instances may run in any
    /// order and be combined: an update whose right side does not read the
    /// tensor it accumulates into (`reads[0]` is the accumulator itself).
    /// The frontend already refuses such reads; this is what the GPU's
    /// legality checks rely on, so they test it themselves.
    pub fn is_reorderable_reduction_step(&self) -> Result<bool> {
        if self.kind != StmtKind::Update {
            return Ok(false);
        }
        let lhs = self.written_tensor()?;
        for r in self.reads.iter().skip(1) {
            if r.get_tuple_name(crate::isl::DimType::Out)? == lhs {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The tensor the statement writes.
    pub fn written_tensor(&self) -> Result<String> {
        Ok(self
            .write
            .get_tuple_name(crate::isl::DimType::Out)?
            .to_string())
    }

    /// Every access with its subscripts, the write first, then the reads in
    /// the order of `reads` (the accumulator first for an update, then the
    /// right side's reads in evaluation order, as `build` made them).
    pub fn accesses<'a>(&'a self, program: &Program) -> Vec<Access<'a>> {
        let st = &program.statements[self.source];
        let lhs: Vec<Affine> = st.lhs_indices.iter().map(|i| Affine::var(i)).collect();
        let mut out = vec![Access {
            tensor: st.lhs_tensor.clone(),
            subscripts: lhs.clone(),
            relation: &self.write,
            write: true,
        }];
        let mut reads: Vec<(String, Vec<Affine>)> = Vec::new();
        if self.kind == StmtKind::Update {
            reads.push((st.lhs_tensor.clone(), lhs));
        }
        collect_reads(&st.rhs, &mut reads);
        for (relation, (tensor, subscripts)) in self.reads.iter().zip(reads) {
            out.push(Access {
                tensor,
                subscripts,
                relation,
                write: false,
            });
        }
        out
    }
}

/// A tensor with its shape resolved (declared, or inferred for temps).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ModelTensor {
    pub name: String,
    pub dtype: crate::frontend::ast::DType,
    pub role: TensorRole,
    /// Extents, affine in the parameters.
    pub shape: Vec<Affine>,
}

impl ModelTensor {
    /// Number of elements at the program's parameter values, when they
    /// are all known.
    pub fn elements(&self, program: &Program) -> Option<i64> {
        self.shape.iter().try_fold(1i64, |n, e| {
            Some(n.saturating_mul(program.evaluate(e)?.max(0)))
        })
    }
}

/// The polyhedral model of one program.
pub struct Scop {
    /// `[P] -> { : ... }`: parameters >= 1, fixed ones pinned to their
    /// value, every tensor extent >= 1.
    pub context: Set,
    /// `"[M, N, K] -> "`, the prefix every isl text of this program uses.
    pub param_prefix: String,
    pub statements: Vec<ModelStmt>,
    pub tensors: Vec<ModelTensor>,
}

impl Scop {
    pub fn tensor(&self, name: &str) -> Option<&ModelTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
    pub fn statement(&self, name: &str) -> Option<&ModelStmt> {
        self.statements.iter().find(|s| s.name == name)
    }
    /// The statements with instances in `domain`.
    pub fn statements_in(&self, domain: &UnionSet) -> Result<Vec<&ModelStmt>> {
        let mut out = Vec::new();
        for s in &self.statements {
            let here = UnionSet::from_set(s.domain.copy()?)?.intersect(domain.copy()?)?;
            if !here.is_empty()? {
                out.push(s);
            }
        }
        Ok(out)
    }
    /// The union of all iteration domains.
    pub fn domain(&self) -> Result<UnionSet> {
        let mut u: Option<UnionSet> = None;
        for s in &self.statements {
            let d = UnionSet::from_set(s.domain.copy()?)?;
            u = Some(match u {
                None => d,
                Some(a) => a.union(d)?,
            });
        }
        u.ok_or_else(|| Error::Internal("program without statements".into()))
    }
    /// All writes as one relation from instances to tensor elements.
    pub fn writes(&self) -> Result<UnionMap> {
        self.union_of(self.statements.iter().map(|s| s.write.copy()))
    }
    /// All reads as one relation from instances to tensor elements.
    pub fn reads(&self) -> Result<UnionMap> {
        self.union_of(
            self.statements
                .iter()
                .flat_map(|s| s.reads.iter().map(|r| r.copy())),
        )
    }
    /// The pairs of instances of one update statement (whose right side
    /// does not read its accumulator) that accumulate into one element:
    /// the pairs a mapping may run in any order, or at once, and combine
    /// (`{ a -> b : W(a) = W(b) }` over those statements).
    pub fn reorderable_pairs(&self) -> Result<UnionMap> {
        let mut pairs = UnionMap::empty(self.context.get_space()?)?;
        for s in &self.statements {
            if s.is_reorderable_reduction_step()? {
                let w = UnionMap::from_map(s.write.copy()?)?;
                pairs = pairs.union(w.copy()?.apply_range(w.reverse()?)?)?;
            }
        }
        Ok(pairs)
    }
    /// The union of `maps`; the empty relation in the program's parameter
    /// space when there are none (a program whose statements read no
    /// tensor, such as `O(i, j) = 3`, has no reads).
    fn union_of(
        &self,
        maps: impl Iterator<Item = std::result::Result<Map, crate::isl::LibISLError>>,
    ) -> Result<UnionMap> {
        let mut u = UnionMap::empty(self.context.get_space()?)?;
        for m in maps {
            u = u.union(UnionMap::from_map(m?)?)?;
        }
        Ok(u)
    }
    /// The plain-text model, for `--emit json` and messages.
    pub fn describe(&self) -> Description {
        Description {
            context: self.context.text(),
            statements: self
                .statements
                .iter()
                .map(|s| StatementText {
                    name: s.name.clone(),
                    source: s.source,
                    kind: s.kind,
                    domain: s.domain.text(),
                    write: s.write.text(),
                    reads: s.reads.iter().map(|r| r.text()).collect(),
                })
                .collect(),
        }
    }
}

/// The model as isl text ([`Scop::describe`]): `--emit json` prints it
/// and the cache keeps it, so it reads back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Description {
    /// The parameters' constraints.
    pub context: String,
    pub statements: Vec<StatementText>,
}

/// One isl statement of a [`Description`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatementText {
    pub name: String,
    /// The source statement's position, from 0.
    pub source: usize,
    pub kind: StmtKind,
    pub domain: String,
    pub write: String,
    pub reads: Vec<String>,
}

/// Builds the model of `program`. Parameters with a value are pinned in the
/// context; the others stay symbolic. The steps: (1) the declared tensors,
/// (2) the context, (3) each statement's domains and accesses, in order
/// (a temp without a declared shape gets one from its first writer), (4)
/// the checks on the whole model: footprints inside the tensors, every
/// output written, recurrences well formed.
pub fn build(isl: &Isl, program: &Program) -> Result<Scop> {
    let names: Vec<&str> = program.params.iter().map(|p| p.name.as_str()).collect();
    // isl reads `[] -> { .. }` as a set but not inside a schedule's
    // filters: a program without parameters gets no prefix at all.
    let param_prefix = if names.is_empty() {
        String::new()
    } else {
        format!("[{}] -> ", names.join(", "))
    };
    let mut tensors: Vec<ModelTensor> = program
        .tensors
        .iter()
        .filter_map(|t| {
            Some(ModelTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                role: t.role,
                shape: t.shape.clone()?,
            })
        })
        .collect();
    let context = context_of(isl, program, &tensors, &param_prefix)?;
    let mut statements = Vec::new();
    for (k, st) in program.statements.iter().enumerate() {
        let builder = StatementBuilder {
            isl,
            program,
            param_prefix: &param_prefix,
            context: &context,
            k,
            st,
        };
        statements.extend(builder.build(&mut tensors)?);
    }
    let scop = Scop {
        context,
        param_prefix,
        statements,
        tensors,
    };
    check_footprints(isl, program, &scop)?;
    check_outputs_written(isl, program, &scop)?;
    check_recurrences(isl, program, &scop)?;
    Ok(scop)
}

/// The context: each parameter pinned to its value or at least 1, every
/// symbolic extent at least 1. Refuses parameter values that make an
/// extent smaller than 1.
fn context_of(
    isl: &Isl,
    program: &Program,
    tensors: &[ModelTensor],
    param_prefix: &str,
) -> Result<Set> {
    let mut cons: Vec<String> = Vec::new();
    for p in &program.params {
        match p.value {
            Some(v) => cons.push(format!("{} = {}", p.name, v)),
            None => cons.push(format!("{} >= 1", p.name)),
        }
    }
    for t in tensors {
        for e in &t.shape {
            if e.as_constant().is_none() {
                cons.push(format!("{e} >= 1"));
            }
        }
    }
    let context_text = if cons.is_empty() {
        format!("{param_prefix}{{ : }}")
    } else {
        format!("{param_prefix}{{ : {} }}", cons.join(" and "))
    };
    let context = isl.set(&context_text)?;
    if context.is_empty()? {
        return Err(Error::Input {
            file: program.source.clone(),
            message: "the parameter values make a tensor extent smaller than 1".into(),
        });
    }
    for t in tensors {
        for (d, e) in t.shape.iter().enumerate() {
            if let Some(c) = e.as_constant() {
                if c < 1 {
                    return Err(Error::Input {
                        file: program.source.clone(),
                        message: format!("tensor {}: extent {} of dimension {d} is < 1", t.name, c),
                    });
                }
            }
        }
    }
    Ok(context)
}

/// The model of statement `k` of the program (`S{k}`, and `S{k}_init` for
/// a reduction with an initialisation).
struct StatementBuilder<'a> {
    isl: &'a Isl,
    program: &'a Program,
    param_prefix: &'a str,
    context: &'a Set,
    k: usize,
    st: &'a Statement,
}

impl StatementBuilder<'_> {
    fn err(&self, message: String) -> Error {
        Error::Statement {
            file: self.program.source.clone(),
            position: self.st.position + 1,
            text: self.st.text.clone(),
            message,
        }
    }

    /// The statement's instances; `tensors` gains its left tensor where
    /// this is a temp's first writer.
    fn build(&self, tensors: &mut Vec<ModelTensor>) -> Result<Vec<ModelStmt>> {
        let (st, k) = (self.st, self.k);
        let all = st.all_indices();
        let name = format!("S{k}");
        let (domain, init_domain) = self.domains(&name, &all, tensors)?;
        let lhs_access = AccessKey::of_vars(&st.lhs_tensor, &st.lhs_indices).to_string();
        let mut rhs_reads = Vec::new();
        collect_reads(&st.rhs, &mut rhs_reads);
        for (t, _) in &rhs_reads {
            if tensors.iter().all(|m| &m.name != t) {
                return Err(self.err(format!(
                    "tensor `{t}` is read before any statement gives it a shape; declare it in `temps` with a shape"
                )));
            }
        }
        let reads_for = |iters: &[String], dom: &Set, with_lhs: bool| -> Result<Vec<Map>> {
            let mut v = Vec::new();
            if with_lhs {
                v.push(self.access_map(&name, iters, &lhs_access, dom)?);
            }
            for (t, subs) in &rhs_reads {
                let access = AccessKey::new(t, subs).to_string();
                v.push(self.access_map(&name, iters, &access, dom)?);
            }
            Ok(v)
        };
        let mut out = Vec::new();
        let (kind, reads) = match st.op {
            AssignOp::Assign => (StmtKind::Assign, reads_for(&all, &domain, false)?),
            AssignOp::Reduce { init, .. } => {
                if init {
                    let init_name = format!("S{k}_init");
                    let iters = st.init_indices();
                    let write = self.access_map(&init_name, &iters, &lhs_access, &init_domain)?;
                    out.push(ModelStmt {
                        name: init_name,
                        source: k,
                        kind: StmtKind::Init,
                        iterators: iters,
                        domain: init_domain,
                        write,
                        reads: Vec::new(),
                        blocks: st.blocks.clone(),
                    });
                }
                (StmtKind::Update, reads_for(&all, &domain, true)?)
            }
        };
        let write = self.access_map(&name, &all, &lhs_access, &domain)?;
        out.push(ModelStmt {
            name,
            source: k,
            kind,
            iterators: all,
            domain,
            write,
            reads,
            blocks: st.blocks.clone(),
        });
        Ok(out)
    }

    /// `{ stmt[iters] -> access }` on `dom`.
    fn access_map(&self, stmt: &str, iters: &[String], access: &str, dom: &Set) -> Result<Map> {
        let m = self.isl.map(&format!(
            "{}{{ {stmt}[{}] -> {access} }}",
            self.param_prefix,
            iters.join(", ")
        ))?;
        Ok(m.intersect_domain(dom.copy()?)?)
    }

    /// The statement's domain and its initialisation's, from the ranges
    /// inferred for its indices. The left tensor: a temp without a
    /// declared shape gets the bounding box of what this first writer
    /// writes.
    fn domains(
        &self,
        name: &str,
        all: &[String],
        tensors: &mut Vec<ModelTensor>,
    ) -> Result<(Set, Set)> {
        let st = self.st;
        let user = |m: ranges::RangeError| match m {
            ranges::RangeError::User(m) => self.err(m),
            ranges::RangeError::Isl(e) => e,
        };
        let ctx = ranges::Ctx {
            isl: self.isl,
            program: self.program,
            tensors,
            param_prefix: self.param_prefix,
            context: self.context,
        };
        let var_ranges = ranges::infer(&ctx, st).map_err(user)?;
        let domain = ranges::domain_of(&ctx, name, all, &var_ranges, &st.wheres)?;
        let init_domain = ranges::domain_of(
            &ctx,
            &format!("{name}_init"),
            &st.init_indices(),
            &var_ranges,
            &lhs_only_wheres(st),
        )?;
        let new_tensor = if tensors.iter().all(|t| t.name != st.lhs_tensor) {
            let decl = self
                .program
                .tensor(&st.lhs_tensor)
                .ok_or_else(|| self.err(format!("unknown tensor `{}`", st.lhs_tensor)))?;
            let shape = ranges::extent_of_lhs(&ctx, st, &var_ranges).map_err(user)?;
            Some(ModelTensor {
                name: decl.name.clone(),
                dtype: decl.dtype,
                role: decl.role,
                shape,
            })
        } else {
            None
        };
        tensors.extend(new_tensor);
        Ok((domain, init_domain))
    }
}

/// `where` constraints that mention only the left side's indices (and
/// parameters): those restrict which elements a reduction initialises.
pub fn lhs_only_wheres(st: &Statement) -> Vec<WhereClause> {
    st.wheres
        .iter()
        .filter(|w| match w {
            WhereClause::Range { index, .. } => st.lhs_indices.contains(index),
            cond => cond
                .names()
                .iter()
                .all(|n| !st.reduction_indices.iter().any(|r| r == n)),
        })
        .cloned()
        .collect()
}

/// One access as the model names it: the tensor and its subscripts in
/// the statement's index variables. Later stages key what they decide about
/// an access by this value (a register that replaces a read, a tile that
/// holds it), compared as data; its `Display` is the access in isl's syntax,
/// `T[e0, e1]`, which is how the model's relations are written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessKey {
    pub tensor: String,
    pub subscripts: Vec<Affine>,
}

impl AccessKey {
    pub fn new(tensor: &str, subscripts: &[Affine]) -> Self {
        AccessKey {
            tensor: tensor.to_string(),
            subscripts: subscripts.to_vec(),
        }
    }

    /// The key of `e` where it is a tensor read.
    pub fn of_read(e: &Expr) -> Option<Self> {
        match &e.kind {
            ExprKind::Access { tensor, subscripts } => Some(AccessKey::new(tensor, subscripts)),
            _ => None,
        }
    }

    /// The key of an element addressed by index variables, `T[i, j]`.
    pub fn of_vars<S: AsRef<str>>(tensor: &str, vars: &[S]) -> Self {
        AccessKey {
            tensor: tensor.to_string(),
            subscripts: vars.iter().map(|v| Affine::var(v.as_ref())).collect(),
        }
    }
}

impl std::fmt::Display for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: Vec<String> = self.subscripts.iter().map(|a| a.to_string()).collect();
        write!(f, "{}[{}]", self.tensor, s.join(", "))
    }
}

/// `{ T[a0, ..] : 0 <= a_d < extent_d }`.
fn tensor_set(isl: &Isl, prefix: &str, t: &ModelTensor) -> Result<Set> {
    let vars: Vec<String> = (0..t.shape.len()).map(|d| format!("a{d}")).collect();
    let cons: Vec<String> = t
        .shape
        .iter()
        .enumerate()
        .map(|(d, e)| format!("0 <= a{d} < {e}"))
        .collect();
    let text = if cons.is_empty() {
        format!("{prefix}{{ {}[] }}", t.name)
    } else {
        format!(
            "{prefix}{{ {}[{}] : {} }}",
            t.name,
            vars.join(", "),
            cons.join(" and ")
        )
    };
    isl.set(&text)
}

/// TC's footprint check: `(D_S . A) \ T = ∅` for every access `A` of every
/// statement `S`, under the context.
fn check_footprints(isl: &Isl, program: &Program, scop: &Scop) -> Result<()> {
    for s in &scop.statements {
        let st = &program.statements[s.source];
        for (what, acc) in
            std::iter::once(("writes", &s.write)).chain(s.reads.iter().map(|r| ("reads", r)))
        {
            let tname = acc.get_tuple_name(crate::isl::DimType::Out)?.to_string();
            let t = scop
                .tensor(&tname)
                .ok_or_else(|| Error::Internal(format!("no tensor {tname}")))?;
            let fp = s
                .domain
                .copy()?
                .apply(acc.copy()?)?
                .intersect_params(scop.context.copy()?)?;
            let outside = fp.subtract(tensor_set(isl, &scop.param_prefix, t)?)?;
            if !outside.is_empty()? {
                let point = outside.sample_point()?;
                let p = crate::isl::Set::from_point(point)?;
                return Err(Error::Statement {
                    file: program.source.clone(),
                    position: st.position + 1,
                    text: st.text.clone(),
                    message: format!(
                        "{what} tensor {tname} out of bounds (shape [{}]), e.g. at {}",
                        t.shape
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        p.text()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The spec's read-before-write rule: every element of a temp or output
/// that a statement reads was written by an earlier statement (program
/// order; a reduction's initialisation comes before its update). For
/// statement `S` with domain `D_S` and read `R`, and the writes `W_T` of
/// the statements before it,
///
/// `(D_S . R) \ ⋃_{T < S} (D_T . W_T) = ∅`.
///
/// An update's read of its own accumulator is included, so `X(i) += e`
/// with nothing written into `X(i)` before is refused too. Without this a
/// read of an element only a later statement writes would silently see
/// zeros (and the f64 reference would agree).
///
/// It applies to the user's program, whose statement list is its program
/// order (with loop blocks, the nested order of [`order::program_order`], instance
/// by instance); a repaired program's order is its own schedule tree, and the
/// repair is proven against the dependences instead.
pub fn check_reads_written(isl: &Isl, program: &Program, scop: &Scop) -> Result<()> {
    if scop.statements.iter().any(|s| !s.blocks.is_empty()) {
        return check_reads_written_in_order(isl, program, scop);
    }
    let mut written: Option<UnionSet> = None;
    for s in &scop.statements {
        let st = &program.statements[s.source];
        for r in &s.reads {
            let tname = r.get_tuple_name(crate::isl::DimType::Out)?.to_string();
            if scop
                .tensor(&tname)
                .is_none_or(|t| t.role == TensorRole::Input)
            {
                continue;
            }
            let read = UnionSet::from_set(s.domain.copy()?.apply(r.copy()?)?)?;
            let unwritten = match &written {
                Some(w) => read.subtract(w.copy()?)?,
                None => read,
            }
            .intersect_params(scop.context.copy()?)?;
            if !unwritten.is_empty()? {
                let p = unwritten.sample_point()?;
                let element = crate::isl::coordinates(&p, r.dim(crate::isl::DimType::Out)? as u32)?
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>();
                return Err(Error::Statement {
                    file: program.source.clone(),
                    position: st.position + 1,
                    text: st.text.clone(),
                    message: format!(
                        "reads {tname}({}) before any statement writes it (a read of a temp or output must follow a write of the same element in program order)",
                        element.join(", ")
                    ),
                });
            }
        }
        let w = UnionSet::from_set(s.domain.copy()?.apply(s.write.copy()?)?)?;
        written = Some(match written {
            Some(a) => a.union(w)?,
            None => w,
        });
    }
    Ok(())
}

/// [`check_reads_written`] for a program with loop blocks, instance by
/// instance: every element a statement instance `r` reads was written by
/// an instance `w` before it in program order (`θ(w) ≺ θ(r)`): within a
/// block, by earlier iterations or earlier statements of the same one.
fn check_reads_written_in_order(isl: &Isl, program: &Program, scop: &Scop) -> Result<()> {
    // θ: the program order's schedule as one relation into a common
    // (padded) space, each statement restricted to its domain.
    let theta = order::program_order(isl, scop)?
        .get_map()?
        .intersect_domain(scop.domain()?)?;
    let writes = scop.writes()?;
    for s in &scop.statements {
        let st = &program.statements[s.source];
        let mine = theta
            .copy()?
            .intersect_domain(UnionSet::from_set(s.domain.copy()?)?)?;
        // { r -> e : some w before r writes e }
        let written_before = theta
            .copy()?
            .lex_lt_union_map(mine)?
            .reverse()?
            .apply_range(writes.copy()?)?;
        for r in &s.reads {
            let tname = r.get_tuple_name(crate::isl::DimType::Out)?.to_string();
            if scop
                .tensor(&tname)
                .is_none_or(|t| t.role == TensorRole::Input)
            {
                continue;
            }
            let read = UnionMap::from_map(r.copy()?.intersect_domain(s.domain.copy()?)?)?;
            let unwritten = read
                .subtract(written_before.copy()?)?
                .intersect_params(scop.context.copy()?)?;
            if unwritten.is_empty()? {
                continue;
            }
            let elements = unwritten.range()?;
            let p = elements.sample_point()?;
            let element = crate::isl::coordinates(&p, r.dim(crate::isl::DimType::Out)? as u32)?
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>();
            return Err(Error::Statement {
                file: program.source.clone(),
                position: st.position + 1,
                text: st.text.clone(),
                message: format!(
                    "reads {tname}({}) before any statement writes it (a read of a temp or output must follow a write of the same element in program order; loop blocks run in order)",
                    element.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// A statement inside loop blocks may read its own left side at elements
/// that earlier iterations wrote (a recurrence), never at elements it
/// writes itself in the same iteration of its blocks (that would make the
/// result depend on the order of its own, parallel, indices; TC forbids it
/// outside blocks). A `=` statement's read of the very element it writes
/// is allowed, as outside blocks.
fn check_recurrences(isl: &Isl, program: &Program, scop: &Scop) -> Result<()> {
    for s in scop.statements.iter().filter(|s| !s.blocks.is_empty()) {
        if s.kind == StmtKind::Init {
            continue;
        }
        let st = &program.statements[s.source];
        let own: Vec<Affine> = st.lhs_indices.iter().map(|i| Affine::var(i)).collect();
        let writers: Vec<&ModelStmt> = scop
            .statements
            .iter()
            .filter(|w| w.source == s.source)
            .collect();
        let accesses = s.accesses(program);
        // The accumulator read of an update is its own reduction.
        let skip = if s.kind == StmtKind::Update { 2 } else { 1 };
        for a in accesses.iter().skip(skip) {
            if a.tensor != st.lhs_tensor || (s.kind == StmtKind::Assign && a.subscripts == own) {
                continue;
            }
            let d = s.blocks.len();
            for w in &writers {
                let same = (0..d)
                    .map(|k| format!("{} = pf_w{k}", s.iterators[k]))
                    .collect::<Vec<_>>();
                let wvars: Vec<String> =
                    (0..w.iterators.len()).map(|k| format!("pf_w{k}")).collect();
                let same_iteration = isl.map(&format!(
                    "{}{{ {}[{}] -> {}[{}] : {} }}",
                    scop.param_prefix,
                    s.name,
                    s.iterators.join(", "),
                    w.name,
                    wvars.join(", "),
                    same.join(" and ")
                ))?;
                let clash = a
                    .relation
                    .copy()?
                    .apply_range(w.write.copy()?.reverse()?)?
                    .intersect(same_iteration)?
                    .intersect_params(scop.context.copy()?)?;
                if !clash.is_empty()? {
                    return Err(Error::Statement {
                        file: program.source.clone(),
                        position: st.position + 1,
                        text: st.text.clone(),
                        message: format!(
                            "reads `{}` at `{}`, an element it writes itself in the same iteration of its loop blocks; a statement in a block may read its own left side only at elements earlier iterations wrote (such as `{}` with a block index minus 1)",
                            st.lhs_tensor,
                            a.key(),
                            st.lhs_tensor
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Every element of every output is written by some statement.
fn check_outputs_written(isl: &Isl, program: &Program, scop: &Scop) -> Result<()> {
    let writes = scop.writes()?.intersect_domain(scop.domain()?)?;
    let written = writes.range()?;
    for t in scop.tensors.iter().filter(|t| t.role == TensorRole::Output) {
        let all = tensor_set(isl, &scop.param_prefix, t)?.intersect_params(scop.context.copy()?)?;
        let missing = all.subtract(written.copy()?.extract_set(all_space(
            isl,
            &scop.param_prefix,
            t,
        )?)?)?;
        if !missing.is_empty()? {
            let p = crate::isl::Set::from_point(missing.sample_point()?)?;
            return Err(Error::Input {
                file: program.source.clone(),
                message: format!(
                    "output {}: no statement writes element {}",
                    t.name,
                    p.text()
                ),
            });
        }
    }
    Ok(())
}

fn all_space(isl: &Isl, prefix: &str, t: &ModelTensor) -> Result<crate::isl::Space> {
    let vars: Vec<String> = (0..t.shape.len()).map(|d| format!("a{d}")).collect();
    Ok(isl
        .set(&format!("{prefix}{{ {}[{}] }}", t.name, vars.join(", ")))?
        .get_space()?)
}
