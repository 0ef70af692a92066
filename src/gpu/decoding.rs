//! Attention decoding on tensor cores: recognising the split-k form of an
//! attention (`repair::splitk`, Neptune's split-k update, Eq. 8) and
//! running it as FlashDecoding does: one kernel computes the local states
//! of every slice of keys, a block per (batch, slice, 16 rows) with the
//! tile loop of `codegen::flash` (its warps splitting each key tile), and
//! a second kernel combines them over the slices and runs the epilogue.
//!
//! The program, with `bt` the batch iterators, `i` the row, `j` the key,
//! `s` the slice and `u` the key within it (`j = B s + u`):
//!
//! * the score `P(bt, i, j) +=! A(.., i, d) * B(.., j, d)` and maps over
//!   `(bt, i, j)`, as in `gpu::attention`;
//! * the local predecessor `M_l(bt, i, s) fr=! body(.., B s + u)` (max or
//!   min) and the global one `M(bt, i) fr=! M_l(bt, i, s)`;
//! * local targets `X_l(bt, i, s) +=! g(.., M_l(bt, i, s))` and
//!   `O_l(bt, i, e, s) +=! p(..) * V(.., B s + u, e)`, each with its
//!   global combination `X(..) +=! H(X_l(.., s); M_l(bt, i, s), M(bt, i))`;
//! * an epilogue over `(bt, i)` or `(bt, i, e)`.
//!
//! Why the kernels compute the program's values. A block runs its slice's
//! keys in tiles, each warp over its share of every tile, as a rolling
//! loop: the predecessor's running value is combined with the tile's, the
//! running targets are moved to the new value by `H` and the tile's terms
//! added with it. `H` is the combination's own repair, which the rewrite
//! proved to move a term computed with one predecessor value to another
//! (Eq. 4) and to distribute over the target's sum (Eq. 5); so each warp
//! holds its keys' sums as computed with its final predecessor value, and
//! the block joins its warps' states the same way (the predecessor's
//! reducer, each target moved to the joined value and summed). The joined
//! predecessor is the slice's `M_l` (a max is exact), so each target is
//! the slice's `X_l`: the local statements' values, regrouped as sums may
//! be. The second kernel evaluates the global statements as written. The
//! isl checks: every dependence stays within a row, the first kernel's
//! within one (row, slice) cell, and none runs from the second kernel's
//! statements to the first's; the local statements share one domain, the
//! rest are boxes (the maps cover the local domain).

use super::attention::{
    boxed_set, dim_extent, domain_on, extents, f32_temps, one_width_a_column, padding_rows, reads,
    step_expressions, tile_conditions, uncast, var_list, within_rows, writes, Attention, Extents,
    Roles, RowContraction, RowKernel, RowShape, RowSum, Score, Split, Surroundings, TargetForm,
    Targets, TileConditions, SPLIT_ROWS,
};
use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, DType, Expr, ExprKind, ExprType, Program, Reducer, Statement,
};
use crate::isl::Isl;
use crate::model::{AccessKey, ModelStmt, Scop};

/// `e` with every subscript `B s + u + c` replaced by `j + c`; `None` where
/// a subscript uses `u` otherwise (values that read `u` keep it: the
/// kernel prints `u` as `j - B s`).
fn normalize(e: &Expr, slice: &str, within: &str, len: i64, key: &str) -> Option<Expr> {
    let go = |x: &Expr| normalize(x, slice, within, len, key).map(Box::new);
    let kind = match &e.kind {
        ExprKind::Access { tensor, subscripts } => {
            let mut subs = Vec::new();
            for a in subscripts {
                if a.coeff(within) == 0 {
                    subs.push(a.clone());
                } else if a.coeff(within) == 1 && a.coeff(slice) == len {
                    subs.push(
                        a.sub(&Affine::var(within))
                            .sub(&Affine::var(slice).scale(len))
                            .add(&Affine::var(key)),
                    );
                } else {
                    return None;
                }
            }
            ExprKind::Access {
                tensor: tensor.clone(),
                subscripts: subs,
            }
        }
        ExprKind::Unary(op, a) => ExprKind::Unary(*op, go(a)?),
        ExprKind::Cast(t, a) => ExprKind::Cast(*t, go(a)?),
        ExprKind::Binary(op, a, b) => ExprKind::Binary(*op, go(a)?, go(b)?),
        ExprKind::Select(c, a, b) => ExprKind::Select(go(c)?, go(a)?, go(b)?),
        ExprKind::Call(f, args) => ExprKind::Call(
            *f,
            args.iter()
                .map(|x| normalize(x, slice, within, len, key))
                .collect::<Option<Vec<_>>>()?,
        ),
        k => k.clone(),
    };
    Some(Expr { kind, ty: e.ty })
}

/// The slice length `B` of subscripts `B s + u + c` in `e`, all alike.
fn slice_len(e: &Expr, slice: &str, within: &str) -> Option<i64> {
    let mut len = None;
    for (_, subs) in reads(e) {
        for a in subs.iter().filter(|a| a.coeff(within) != 0) {
            let b = a.coeff(slice);
            if a.coeff(within) != 1 || b <= 0 || len.is_some_and(|l| l != b) {
                return None;
            }
            len = Some(b);
        }
    }
    len
}

fn number(v: f64) -> Expr {
    Expr {
        kind: ExprKind::Number(v),
        ty: ExprType::Num(DType::F32),
    }
}

fn is_sum_reduction(op: AssignOp) -> bool {
    op == AssignOp::Reduce {
        op: Reducer::Sum,
        init: true,
    }
}

/// The global predecessor of a split form and the names it fixes.
struct GlobalPred {
    /// Its program position.
    statement: usize,
    reducer: Reducer,
    /// `M`.
    tensor: String,
    /// `M_l`, the local predecessor it combines.
    local: String,
    /// The slice iterator `s`.
    slice: String,
    /// `bt` then `i`, as its statement names them (at least the row).
    row_idx: Vec<String>,
}

/// The global predecessor `M(bt, i) fr=! M_l(bt, i, s)`: the first max or
/// min (with init) over one reduction index `s` whose right side is a
/// read of a tensor at exactly the statement's indices then `s`. It is
/// the combination of the slices' predecessors (Eq. 8 for a max or min is
/// the reducer itself), and it names the batch, the row and the slice.
fn global_pred(program: &Program) -> Option<GlobalPred> {
    let (statement, st) = program.statements.iter().enumerate().find(|(_, st)| {
        let AssignOp::Reduce {
            op: Reducer::Max | Reducer::Min,
            init: true,
        } = st.op
        else {
            return false;
        };
        let [s] = st.reduction_indices.as_slice() else {
            return false;
        };
        let ExprKind::Access { subscripts, .. } = &st.rhs.kind else {
            return false;
        };
        let mut want = st.lhs_indices.clone();
        want.push(s.clone());
        *subscripts == var_list(&want)
    })?;
    let (AssignOp::Reduce { op: reducer, .. }, ExprKind::Access { tensor: local, .. }, [slice]) =
        (st.op, &st.rhs.kind, st.reduction_indices.as_slice())
    else {
        return None;
    };
    if st.lhs_indices.is_empty() {
        return None;
    }
    Some(GlobalPred {
        statement,
        reducer,
        tensor: st.lhs_tensor.clone(),
        local: local.clone(),
        slice: slice.clone(),
        row_idx: st.lhs_indices.clone(),
    })
}

/// The local predecessor `M_l(bt, i, s) fr=! body(.., B s + u)`: the one
/// statement that writes `M_l`, with the global's reducer (with init),
/// over the row and the slice, reducing over one index `u`, the key
/// within the slice. Returns its position and `u`.
fn local_pred(program: &Program, global: &GlobalPred) -> Option<(usize, String)> {
    let [pl] = writes(program, &global.local)[..] else {
        return None;
    };
    let lst = &program.statements[pl];
    let mut local_idx = global.row_idx.clone();
    local_idx.push(global.slice.clone());
    let [within] = lst.reduction_indices.as_slice() else {
        return None;
    };
    let reduces = lst.op
        == (AssignOp::Reduce {
            op: global.reducer,
            init: true,
        });
    (reduces && lst.lhs_indices == local_idx).then(|| (pl, within.clone()))
}

/// The score of a split form: the one sum (with init) over an element
/// `(bt, i, j)` of a row, reducing over one index, whose right side
/// (casts aside) is a product; its operands tiles ([`score_operands`]).
/// Its last index names the key `j`.
fn split_score(program: &Program, row_idx: &[String]) -> Option<(RowShape, Score)> {
    let n = row_idx.len();
    let scores: Vec<usize> = program
        .statements
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            is_sum_reduction(s.op)
                && s.lhs_indices.len() == n + 1
                && s.lhs_indices[..n] == row_idx[..]
                && s.reduction_indices.len() == 1
                && matches!(&uncast(&s.rhs).kind, ExprKind::Binary(BinOp::Mul, ..))
        })
        .map(|(k, _)| k)
        .collect();
    let [sc] = scores[..] else {
        return None;
    };
    let shape = RowShape::new(row_idx, &program.statements[sc].lhs_indices[n])?;
    let score = Score::at(program, sc, &shape)?;
    Some((shape, score))
}

/// The local statements' positions, in the orders of the targets' forms.
#[derive(Default)]
struct SplitTargets {
    targets: Targets,
    sum_locals: Vec<usize>,
    sum_globals: Vec<usize>,
    con_locals: Vec<usize>,
    con_globals: Vec<usize>,
}

/// A split form's names as the global and local predecessors fix them:
/// what the local targets are matched against.
struct SplitMatch<'a> {
    program: &'a Program,
    shape: &'a RowShape,
    /// The slice `s`, the key within it `u`, and the slice length `B`
    /// (`j = B s + u`).
    slice: String,
    within: String,
    len: i64,
    /// `M_l` and `M`.
    local: String,
    pred: String,
}

impl SplitMatch<'_> {
    /// `e` over the key `j` instead of `B s + u` ([`normalize`]).
    fn normalize(&self, e: &Expr) -> Option<Expr> {
        normalize(e, &self.slice, &self.within, self.len, &self.shape.key)
    }

    /// `(bt, i, s)`: a cell of the first kernel.
    fn local_idx(&self) -> Vec<String> {
        let mut local_idx = self.shape.row_idx.clone();
        local_idx.push(self.slice.clone());
        local_idx
    }

    /// Whether `st` has the form of a local target: a sum with init over
    /// `u` alone into `X_l(bt, i, .., s)`.
    fn is_local_target(&self, st: &Statement) -> bool {
        let n = self.shape.row_idx.len();
        is_sum_reduction(st.op)
            && st.reduction_indices == [self.within.clone()]
            && st.lhs_indices.last() == Some(&self.slice)
            && st.lhs_indices[..n.min(st.lhs_indices.len())] == self.shape.row_idx[..]
    }

    /// The local target at position `lt` in its form, and its global
    /// combination's position. The combination is the one statement that
    /// reads `X_l`: a sum with init over `s` alone into `X(..)`, `X_l`'s
    /// indices less `s`, reading only `X_l` at its own element, `M_l` at
    /// the cell and `M` at the row (Eq. 8: `X = Σ_s H(X_l; M_l, M)`), and
    /// both `X_l` and `X` written once. The local term, over `j`, is a row
    /// sum's term (`X_l(bt, i, s)`) or a value product (`O_l(bt, i, e,
    /// s)`, [`Roles::value_product`]).
    fn local_target(&self, lt: usize, roles: &Roles) -> Option<(TargetForm, usize)> {
        let program = self.program;
        let sts = &program.statements;
        let st = &sts[lt];
        let local = &st.lhs_tensor;
        let lsubs = var_list(&st.lhs_indices);
        let gl: Vec<usize> = sts
            .iter()
            .enumerate()
            .filter(|(_, g)| reads(&g.rhs).iter().any(|(t, _)| t == local))
            .map(|(k, _)| k)
            .collect();
        let [gt] = gl[..] else {
            return None;
        };
        let g = &sts[gt];
        if !is_sum_reduction(g.op)
            || g.reduction_indices != [self.slice.clone()]
            || g.lhs_indices[..] != st.lhs_indices[..st.lhs_indices.len() - 1]
            || writes(program, local).len() != 1
            || writes(program, &g.lhs_tensor).len() != 1
        {
            return None;
        }
        let local_subs = var_list(&self.local_idx());
        let row_subs = self.shape.row_subs();
        let reads_ok = reads(&g.rhs).iter().all(|(t, subs)| {
            (t == local && *subs == lsubs)
                || (*t == self.local && *subs == local_subs)
                || (*t == self.pred && *subs == row_subs)
        });
        let term = self.normalize(&st.rhs)?;
        if !reads_ok {
            return None;
        }
        let n = self.shape.row_idx.len();
        let form = if st.lhs_indices.len() == n + 1 {
            TargetForm::Sum(RowSum {
                tensor: g.lhs_tensor.clone(),
                init: number(0.0),
                repair: g.rhs.clone(),
                repair_self: AccessKey::new(local, &lsubs),
                term,
            })
        } else if st.lhs_indices.len() == n + 2 {
            let column = st.lhs_indices[n].clone();
            let (weight, value) = roles.value_product(&term, &column)?;
            let width = roles.column_width(&g.lhs_tensor, n)?;
            TargetForm::Contraction(RowContraction {
                tensor: g.lhs_tensor.clone(),
                column,
                width,
                init: number(0.0),
                repair: g.rhs.clone(),
                repair_self: AccessKey::new(local, &lsubs),
                rounded_once: super::attention::declared_in(program, &weight, roles.dtype),
                promoted: false,
                weight,
                value,
            })
        } else {
            return None;
        };
        Some((form, gt))
    }

    /// The local targets in program order, each with its combination
    /// ([`Self::local_target`]); `used` (the roles taken so far) gains
    /// their positions. `None` where a statement of a local target's form
    /// has no such combination, or a column name stands for two widths
    /// ([`one_width_a_column`]).
    fn targets(&self, roles: &Roles, used: &mut Vec<usize>) -> Option<SplitTargets> {
        let mut found = SplitTargets::default();
        for (lt, st) in self.program.statements.iter().enumerate() {
            if used.contains(&lt) || !self.is_local_target(st) {
                continue;
            }
            let (form, gt) = self.local_target(lt, roles)?;
            let (locals, globals) = match form {
                TargetForm::Sum(_) => (&mut found.sum_locals, &mut found.sum_globals),
                TargetForm::Contraction(_) => (&mut found.con_locals, &mut found.con_globals),
            };
            locals.push(lt);
            globals.push(gt);
            found.targets.push(form);
            used.extend([lt, gt]);
        }
        one_width_a_column(&found.targets.contractions).then_some(found)
    }
}

/// What a split attention's statements say, before the isl checks.
struct SplitForm {
    global: GlobalPred,
    shape: RowShape,
    score: Score,
    ext: Extents,
    /// The local predecessor's body, over the key `j`.
    pred_body: Expr,
    targets: Targets,
    around: Surroundings,
    split: Split,
}

/// The split attention of the program's statements, `None` where they
/// are not one: the global and the local predecessor fix the slice's
/// names ([`global_pred`], [`local_pred`]), the score the key's
/// ([`split_score`]); then the extents ([`extents`]), the local targets
/// and their combinations ([`SplitMatch::targets`]), the maps and the
/// epilogue ([`RowKernel::surroundings`]) and what the step reads
/// ([`RowKernel::step_reads_ok`]: the local predecessor at `(bt, i, s)`),
/// and the states' types ([`f32_temps`]).
fn split_form(program: &Program) -> Option<SplitForm> {
    let sts = &program.statements;
    let global = global_pred(program)?;
    let (pl, within) = local_pred(program, &global)?;
    let (shape, score) = split_score(program, &global.row_idx)?;
    let ext = extents(program, &shape, &global.tensor, &score)?;
    let slices = dim_extent(program, &global.local, shape.row_idx.len())?;
    let len = slice_len(&sts[pl].rhs, &global.slice, &within)?;
    let split_match = SplitMatch {
        program,
        shape: &shape,
        slice: global.slice.clone(),
        within,
        len,
        local: global.local.clone(),
        pred: global.tensor.clone(),
    };
    let pred_body = split_match.normalize(&sts[pl].rhs)?;
    let roles = Roles {
        program,
        batch: &shape.batch,
        row_idx: &shape.row_idx,
        key: &shape.key,
        keys: ext.keys,
        dtype: score.query.dtype,
    };
    let mut used = vec![global.statement, pl, score.statement];
    let found = split_match.targets(&roles, &mut used)?;
    let kernel = RowKernel {
        program,
        shape: &shape,
        score: &score.tensor,
        pred: &global.tensor,
        targets: &found.targets,
    };
    let globals: Vec<String> = std::iter::once(global.tensor.clone())
        .chain(found.targets.tensors().cloned())
        .collect();
    let around = kernel.surroundings(&used, Some(pl), &globals)?;
    let local_subs = var_list(&split_match.local_idx());
    let locals: Vec<String> = found
        .sum_locals
        .iter()
        .chain(found.con_locals.iter())
        .map(|&k| sts[k].lhs_tensor.clone())
        .chain(std::iter::once(global.local.clone()))
        .collect();
    let held = around
        .elementwise
        .iter()
        .chain(globals.iter())
        .chain(locals.iter());
    if !kernel.step_reads_ok(
        &around.elementwise,
        (&global.local, &local_subs),
        &pred_body,
    ) || !f32_temps(program, held)
    {
        return None;
    }
    let split = Split {
        slice: split_match.slice,
        within: split_match.within,
        slices,
        len,
        pred_local: pl,
        sum_locals: found.sum_locals,
        con_locals: found.con_locals,
        pred_global: global.statement,
        sum_globals: found.sum_globals,
        con_globals: found.con_globals,
    };
    Some(SplitForm {
        global,
        shape,
        score,
        ext,
        pred_body,
        targets: found.targets,
        around,
        split,
    })
}

impl SplitForm {
    /// The row extent a block's padding rows may be ignored past
    /// ([`padding_rows`]).
    fn padding(&self, program: &Program) -> Option<i64> {
        let evaluated = step_expressions(
            &self.around.maps,
            &self.pred_body,
            &self.targets.sums,
            &self.targets.contractions,
        );
        padding_rows(program, &self.shape.row, self.ext.rows, &evaluated)
    }

    /// The kernel, with the first kernel's tiled loop's `conditions`
    /// ([`tile_conditions`]).
    fn plan(self, conditions: TileConditions) -> Attention {
        let TileConditions {
            key_tiles,
            full_tile,
            element,
        } = conditions;
        let mut local_idx = self.shape.row_idx.clone();
        local_idx.push(self.split.slice.clone());
        let pred_local_read = AccessKey::new(&self.global.local, &var_list(&local_idx));
        let global = self.global;
        Attention {
            batch: self.ext.batch,
            row: self.shape.row,
            key: self.shape.key,
            rows: self.ext.rows,
            keys: self.ext.keys,
            depth: self.ext.depth,
            dtype: self.score.query.dtype,
            score: self.score.tensor,
            query: self.score.query,
            key_operand: self.score.key_operand,
            maps: self.around.maps,
            repair_new: AccessKey::new(&global.tensor, &var_list(&self.shape.row_idx)),
            pred: global.tensor,
            cache: global.local,
            reducer: global.reducer,
            pred_init: Expr {
                kind: ExprKind::Inf {
                    negative: global.reducer == Reducer::Max,
                },
                ty: ExprType::Num(DType::F32),
            },
            pred_body: self.pred_body,
            pred_term: pred_local_read.clone(),
            repair_old: pred_local_read,
            sums: self.targets.sums,
            contractions: self.targets.contractions,
            epilogue: self.around.epilogue,
            key_tiles,
            full_tile,
            element,
            split: Some(self.split),
        }
    }
}

/// Recognises the program as a split attention; `None` leaves it to the
/// ordinary mapping. The statements' form ([`split_form`]), then in isl
/// the domains ([`domains`]), the rows' independence ([`within_rows`])
/// and the two kernels' ([`kernels_apart`]), the first kernel's tiled
/// loop's conditions with the slice as one more batch iterator
/// ([`tile_conditions`]), and the launch's limits.
pub fn recognise(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
) -> Result<Option<Attention>> {
    let Some(form) = split_form(program) else {
        return Ok(None);
    };
    let (shape, ext, split) = (&form.shape, &form.ext, &form.split);
    let (row, key) = (&shape.row, &shape.key);
    let Some(v) = domains(
        isl,
        program,
        scop,
        split,
        (&ext.batch, row, key),
        [ext.rows, ext.keys, ext.depth],
        form.score.statement,
        &form.targets.contractions,
        &form.around.epilogue,
    )?
    else {
        return Ok(None);
    };
    if !within_rows(isl, scop, deps, &shape.row_idx)?
        || !kernels_apart(
            isl,
            program,
            scop,
            deps,
            split,
            &shape.row_idx,
            key,
            form.score.statement,
        )?
    {
        return Ok(None);
    }
    let mut cond_batch = shape.batch.clone();
    cond_batch.push(split.slice.clone());
    let padding = form.padding(program);
    let conditions = tile_conditions(isl, scop, v, &cond_batch, row, key, SPLIT_ROWS, padding)?;
    let attention = form.plan(conditions).with_promotion(program);
    if attention.batches() > 65535
        || attention.grid_x() > i64::from(i32::MAX)
        || attention.shared_bytes() > super::attention::MAX_SHARED_BYTES
    {
        return Ok(None);
    }
    Ok(Some(attention))
}

/// The domain checks; returns the local domain as a set of
/// `[bt, s, i, j]` (`j = B s + u`), on which the tile conditions are
/// computed with `s` as one more batch iterator.
#[allow(clippy::too_many_arguments)]
fn domains(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    sp: &Split,
    (batch_ext, row, key): (&[(String, i64)], &str, &str),
    [rows, keys, depth]: [i64; 3],
    score: usize,
    contractions: &[RowContraction],
    epilogue: &[usize],
) -> Result<Option<crate::isl::Set>> {
    let pre = &scop.param_prefix;
    let batch: Vec<String> = batch_ext.iter().map(|(b, _)| b.clone()).collect();
    let anon = |s: &ModelStmt, its: &[String]| domain_on(isl, scop, s, its);
    let boxed = |extents: &[(String, i64)]| boxed_set(isl, scop, batch_ext, extents);
    let is = |s: &ModelStmt, its: &[String], want: crate::isl::Set| -> Result<bool> {
        Ok(match anon(s, its)? {
            Some(d) => d.is_equal(&want)?,
            None => false,
        })
    };
    let width_of = |c: &str| contractions.iter().find(|x| x.column == c).map(|x| x.width);
    let sts = &program.statements;
    let Some(pl) = scop
        .statements
        .iter()
        .find(|s| s.source == sp.pred_local && s.kind == crate::model::StmtKind::Update)
    else {
        return Ok(None);
    };
    let mut lits = sts[sp.pred_local].lhs_indices.clone();
    lits.push(sp.within.clone());
    let Some(vl) = anon(pl, &lits)? else {
        return Ok(None);
    };
    let slice_ext = (sp.slice.clone(), sp.slices);
    let row_ext = (row.to_string(), rows);
    let locals = sp.locals();
    let globals = sp.globals();
    // The local domain from [bt, i, s, u] onto `names`, with the key
    // `j = B s + u` among them.
    let with_key = |names: &[String]| -> Result<crate::isl::Set> {
        let to = isl.map(&format!(
            "{pre}{{ [{}] -> [{}] : {key} = {} * {} + {} }}",
            lits.join(", "),
            names.join(", "),
            sp.len,
            sp.slice,
            sp.within
        ))?;
        Ok(vl.copy()?.apply(to)?)
    };
    // The local domain on [bt, i, j].
    let mut elem = batch.clone();
    elem.push(row.to_string());
    elem.push(key.to_string());
    let v = with_key(&elem)?;
    for s in &scop.statements {
        let st = &sts[s.source];
        let update = s.kind == crate::model::StmtKind::Update;
        let lhs = st.lhs_indices.clone();
        // The column extent of a statement over (.., e [, s]).
        let column = |at: usize| -> Option<(String, i64)> {
            let c = lhs.get(at)?;
            Some((c.clone(), width_of(c)?))
        };
        let ok = if s.source == score {
            let mut its = elem.clone();
            let mut ext = vec![row_ext.clone(), (key.to_string(), keys)];
            if update {
                its.push(st.reduction_indices[0].clone());
                ext.push((st.reduction_indices[0].clone(), depth));
            }
            is(s, &its, boxed(&ext)?)?
        } else if locals.contains(&s.source) {
            let n = batch.len() + 1;
            let mut ext = vec![row_ext.clone()];
            let col = if lhs.len() == n + 2 {
                match column(n) {
                    Some(c) => Some(c),
                    None => return Ok(None),
                }
            } else {
                None
            };
            if update {
                // Every local statement on the local predecessor's domain
                // (times the columns).
                let mut its = lhs.clone();
                its.push(sp.within.clone());
                let want = match &col {
                    Some((c, w)) => {
                        let mut with_col = batch.clone();
                        with_col.push(row.to_string());
                        with_col.push(c.clone());
                        with_col.push(sp.slice.clone());
                        with_col.push(sp.within.clone());
                        vl.copy()?.apply(isl.map(&format!(
                            "{pre}{{ [{}] -> [{}] : 0 <= {c} < {w} }}",
                            lits.join(", "),
                            with_col.join(", ")
                        ))?)?
                    }
                    None => vl.copy()?,
                };
                is(s, &its, want)?
            } else {
                ext.extend(col);
                ext.push(slice_ext.clone());
                is(s, &lhs, boxed(&ext)?)?
            }
        } else if globals.contains(&s.source) || epilogue.contains(&s.source) {
            let n = batch.len() + 1;
            let mut ext = vec![row_ext.clone()];
            if lhs.len() == n + 1 {
                match column(n) {
                    Some(c) => ext.push(c),
                    None => return Ok(None),
                }
            }
            let mut its = lhs.clone();
            if update {
                its.push(sp.slice.clone());
                ext.push(slice_ext.clone());
            }
            is(s, &its, boxed(&ext)?)?
        } else if lhs == elem {
            // A map: defined wherever the local statements read it.
            match anon(s, &elem)? {
                Some(d) => v.is_subset(&d)?,
                None => false,
            }
        } else {
            false
        };
        if !ok {
            return Ok(None);
        }
    }
    // On [bt, s, i, j]: the slice as one more batch iterator.
    let mut cond = batch.clone();
    cond.push(sp.slice.clone());
    cond.push(row.to_string());
    cond.push(key.to_string());
    Ok(Some(with_key(&cond)?))
}

/// The two kernels' legality: every dependence among the first kernel's
/// statements (score, maps, local statements) stays within one cell
/// `(bt, i, s)` (the score's and the maps' instances in the slice of their
/// key), and every other one runs from the first kernel to the second
/// within a row.
#[allow(clippy::too_many_arguments)]
fn kernels_apart(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
    sp: &Split,
    row_idx: &[String],
    key: &str,
    score: usize,
) -> Result<bool> {
    let first = sp.locals();
    let sts = &program.statements;
    let (mut cells, mut rows1, mut rows2) = (Vec::new(), Vec::new(), Vec::new());
    let row = row_idx.join(", ");
    for s in &scop.statements {
        let st = &sts[s.source];
        let its = s.iterators.join(", ");
        let cell = if first.contains(&s.source) {
            Some(format!("{}[{its}] -> [{row}, {}]", s.name, sp.slice))
        } else if s.source == score
            || (st.lhs_indices.last().map(String::as_str) == Some(key) && st.op == AssignOp::Assign)
        {
            Some(format!(
                "{}[{its}] -> [{row}, pf_sl] : {len} * pf_sl <= {key} < {len} * pf_sl + {len}",
                s.name,
                len = sp.len
            ))
        } else {
            None
        };
        let to_row = format!("{}[{its}] -> [{row}]", s.name);
        match cell {
            Some(c) => {
                cells.push(c);
                rows1.push(to_row);
            }
            None => rows2.push(to_row),
        }
    }
    let pre = &scop.param_prefix;
    let um = |v: &[String]| isl.union_map(&format!("{pre}{{ {} }}", v.join("; ")));
    let cells = um(&cells)?;
    let same_cell = cells.copy()?.apply_range(cells.reverse()?)?;
    let across = um(&rows1)?.apply_range(um(&rows2)?.reverse()?)?;
    let rows2 = um(&rows2)?;
    let same_row2 = rows2.copy()?.apply_range(rows2.reverse()?)?;
    Ok(deps
        .all()?
        .subtract(same_cell)?
        .subtract(across)?
        .subtract(same_row2)?
        .is_empty()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::Analysed;

    /// The body of `examples/attention_decode_gqa.json`: `R` query rows
    /// of each group `g` against `KV` keys.
    const BODY: [&str; 7] = [
        "P(b, g, q, j) +=! Q(b, g, q, d) * K(b, g, j, d)",
        "T(b, g, q, j) = P(b, g, q, j) * 0.25",
        "M(b, g, q) max=! T(b, g, q, j)",
        "E(b, g, q, j) = exp(T(b, g, q, j) - M(b, g, q))",
        "L(b, g, q) +=! E(b, g, q, j)",
        "O(b, g, q, d) +=! E(b, g, q, j) * V(b, g, j, d)",
        "Y(b, g, q, d) = O(b, g, q, d) / L(b, g, q)",
    ];

    /// A decoding program over `kv` keys of depth `d`, operands of
    /// `dtype`, the temp named `narrow` (if any of `T` and `E`) in f16, and
    /// `body`, repaired into the split-k update of `L` and `O` in `factor`
    /// slices.
    fn program(kv: i64, d: i64, dtype: &str, narrow: &str, factor: i64, body: &[&str]) -> String {
        let temp_dtype = |t: &str| if t == narrow { "f16" } else { "f32" };
        let (t_dtype, e_dtype) = (temp_dtype("T"), temp_dtype("E"));
        let body: Vec<String> = body.iter().map(|l| format!("\"{l}\"")).collect();
        format!(
            r#"{{"name": "dec", "params": {{"B": 1, "G": 2, "R": 4, "KV": {kv}, "D": {d}}},
                "inputs": {{"Q": {{"dtype": "{dtype}", "shape": ["B", "G", "R", "D"]}},
                           "K": {{"dtype": "{dtype}", "shape": ["B", "G", "KV", "D"]}},
                           "V": {{"dtype": "{dtype}", "shape": ["B", "G", "KV", "D"]}}}},
                "outputs": {{"Y": {{"dtype": "f16", "shape": ["B", "G", "R", "D"]}}}},
                "temps": {{"P": {{"dtype": "f32", "shape": ["B", "G", "R", "KV"]}},
                          "T": {{"dtype": "{t_dtype}", "shape": ["B", "G", "R", "KV"]}},
                          "M": {{"dtype": "f32", "shape": ["B", "G", "R"]}},
                          "E": {{"dtype": "{e_dtype}", "shape": ["B", "G", "R", "KV"]}},
                          "L": {{"dtype": "f32", "shape": ["B", "G", "R"]}},
                          "O": {{"dtype": "f32", "shape": ["B", "G", "R", "D"]}}}},
                "body": [{}],
                "schedule": [{{"split-k": ["L", "O"], "factor": {factor}}}]}}"#,
            body.join(", ")
        )
    }

    fn recognised(json: &str) -> (Analysed, Option<Attention>) {
        let a = Analysed::new(json);
        let found = recognise(&a.isl, &a.program, &a.scop, &a.deps).unwrap();
        (a, found)
    }

    #[test]
    fn split_decoding_is_recognised_with_its_slices_and_statements() {
        let (a, found) = recognised(&program(256, 16, "f16", "", 4, &BODY));
        let att = found.expect("recognised");
        let split = att.split.as_ref().expect("a split form");
        // 256 keys in 4 slices of 64: j = 64 s + u.
        assert_eq!((split.slices, split.len), (4, 64));
        assert_ne!(split.slice, split.within);
        assert_eq!(att.batch, vec![("b".to_string(), 1), ("g".to_string(), 2)]);
        assert_eq!((att.row.as_str(), att.key.as_str()), ("q", "j"));
        assert_eq!((att.rows, att.keys, att.depth), (4, 256, 16));
        assert_eq!((att.score.as_str(), att.query.tensor.as_str()), ("P", "Q"));
        let maps: Vec<&str> = att.maps.iter().map(|m| m.0.as_str()).collect();
        assert_eq!(maps, ["T"]);
        // The global predecessor, and the local one as the kernel's cache.
        assert_eq!(att.pred, "M");
        assert_eq!(att.reducer, Reducer::Max);
        assert_eq!(split.pred_global, a.writer("M"));
        assert_eq!(att.cache, a.program.statements[split.pred_local].lhs_tensor);
        assert!(matches!(
            att.pred_init.kind,
            ExprKind::Inf { negative: true }
        ));
        // One row sum and one contraction, each a local and a global.
        assert_eq!(att.sums.len(), 1);
        assert_eq!(att.sums[0].tensor, "L");
        assert_eq!(split.sum_globals, vec![a.writer("L")]);
        let [o] = att.contractions.as_slice() else {
            panic!("one contraction: {:?}", att.contractions);
        };
        assert_eq!(
            (o.tensor.as_str(), o.column.as_str(), o.width),
            ("O", "d", 16)
        );
        assert_eq!(split.con_globals, vec![a.writer("O")]);
        assert_eq!((split.sum_locals.len(), split.con_locals.len()), (1, 1));
        assert_eq!(att.epilogue, vec![a.writer("Y")]);
        // One 16-row block per (batch, slice): 4 query rows, 12 padding.
        assert_eq!(att.block_rows(), SPLIT_ROWS);
        assert_eq!(att.grid_x(), 4);
        assert_eq!(att.batches(), 2);
    }

    #[test]
    fn renamed_iterators_take_the_roles_they_play() {
        let body: Vec<String> = BODY
            .iter()
            .map(|l| l.replace("q", "x").replace("j", "y"))
            .collect();
        let body: Vec<&str> = body.iter().map(String::as_str).collect();
        let (_, found) = recognised(&program(256, 16, "f16", "", 4, &body));
        let att = found.expect("recognised");
        assert_eq!((att.row.as_str(), att.key.as_str()), ("x", "y"));
    }

    #[test]
    fn f32_operands_are_refused() {
        let (a, found) = recognised(&program(256, 16, "f32", "", 4, &BODY));
        assert!(found.is_none());
        // The predecessors are found; the score is what is refused.
        let global = global_pred(&a.program).expect("the global predecessor");
        assert!(local_pred(&a.program, &global).is_some());
        assert!(split_score(&a.program, &global.row_idx).is_none());
    }

    #[test]
    fn weights_in_a_16_bit_temp_are_rounded_once() {
        let (_, found) = recognised(&program(256, 16, "f16", "E", 4, &BODY));
        let att = found.expect("recognised");
        assert!(att.contractions[0].rounded_once);
    }

    #[test]
    fn a_map_in_a_16_bit_temp_is_refused() {
        let (_, found) = recognised(&program(256, 16, "f16", "T", 4, &BODY));
        assert!(found.is_none());
    }

    #[test]
    fn a_program_without_a_split_has_no_global_predecessor() {
        let json = program(256, 16, "f16", "", 4, &BODY).replace(
            r#""schedule": [{"split-k": ["L", "O"], "factor": 4}]"#,
            r#""schedule": [{"rolling-update": ["L", "O"]}]"#,
        );
        let (a, found) = recognised(&json);
        assert!(found.is_none());
        assert!(global_pred(&a.program).is_none());
    }

    #[test]
    fn subscripts_over_a_slice_are_normalised_to_the_key() {
        // E(b, q, 8 s + u + 1) -> E(b, q, j + 1); a subscript with u
        // scaled otherwise has no key form.
        let read = |sub: Affine| Expr {
            kind: ExprKind::Access {
                tensor: "E".into(),
                subscripts: vec![Affine::var("q"), sub],
            },
            ty: ExprType::Num(DType::F32),
        };
        let sliced = Affine::var("s")
            .scale(8)
            .add(&Affine::var("u"))
            .add(&Affine::constant(1));
        assert_eq!(slice_len(&read(sliced.clone()), "s", "u"), Some(8));
        let keyed = normalize(&read(sliced), "s", "u", 8, "j").unwrap();
        assert_eq!(keyed, read(Affine::var("j").add(&Affine::constant(1))));
        let doubled = Affine::var("u").scale(2);
        assert!(normalize(&read(doubled), "s", "u", 8, "j").is_none());
    }
}
