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
    boxed_set, domain_on, one_width_a_column, padding_rows, reads, score_operands,
    step_expressions, tile_conditions, uncast, var_list, within_rows, writes, Attention, Roles,
    RowContraction, RowSum, Split, SPLIT_ROWS,
};
use crate::deps::Dependences;
use crate::error::Result;
use crate::frontend::ast::{
    Affine, AssignOp, BinOp, DType, Expr, ExprKind, ExprType, Program, Reducer, TensorRole,
};
use crate::isl::Isl;
use crate::model::{access_text, ModelStmt, Scop};

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

/// Recognises the program as a split attention; `None` leaves it to the
/// ordinary mapping.
pub fn recognise(
    isl: &Isl,
    program: &Program,
    scop: &Scop,
    deps: &Dependences,
) -> Result<Option<Attention>> {
    let sts = &program.statements;
    // The global predecessor `M(bt, i) fr=! M_l(bt, i, s)`.
    let global = sts.iter().enumerate().find_map(|(k, st)| {
        let AssignOp::Reduce {
            op: op @ (Reducer::Max | Reducer::Min),
            init: true,
        } = st.op
        else {
            return None;
        };
        let [s] = st.reduction_indices.as_slice() else {
            return None;
        };
        let ExprKind::Access { tensor, subscripts } = &st.rhs.kind else {
            return None;
        };
        let mut want = st.lhs_indices.clone();
        want.push(s.clone());
        (*subscripts == var_list(&want)).then(|| (k, op, tensor.clone(), s.clone()))
    });
    let Some((pg, reducer, ml, slice)) = global else {
        return Ok(None);
    };
    let row_idx = sts[pg].lhs_indices.clone();
    let Some((row, batch)) = row_idx.split_last() else {
        return Ok(None);
    };
    let (row, batch) = (row.clone(), batch.to_vec());
    let n = row_idx.len();
    let mut local_idx = row_idx.clone();
    local_idx.push(slice.clone());
    // The local predecessor.
    let [pl] = writes(program, &ml)[..] else {
        return Ok(None);
    };
    let lst = &sts[pl];
    if lst.op
        != (AssignOp::Reduce {
            op: reducer,
            init: true,
        })
        || lst.lhs_indices != local_idx
        || lst.reduction_indices.len() != 1
    {
        return Ok(None);
    }
    let within = lst.reduction_indices[0].clone();
    // The score: the one sum over (bt, i, j) of a product of two reads.
    let scores: Vec<usize> = sts
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
        return Ok(None);
    };
    let sst = &sts[sc];
    let key = sst.lhs_indices[n].clone();
    let elem_idx = sst.lhs_indices.clone();
    let Some((query, key_operand)) = score_operands(program, sst, &row, &key, &batch) else {
        return Ok(None);
    };
    let dtype = query.dtype;
    let score = sst.lhs_tensor.clone();
    let shape_of = |t: &str, k: usize| -> Option<i64> {
        program.evaluate(program.tensor(t)?.shape.as_ref()?.get(k)?)
    };
    let mut batch_ext = Vec::new();
    for (k, b) in batch.iter().enumerate() {
        let Some(e) = shape_of(&sts[pg].lhs_tensor, k) else {
            return Ok(None);
        };
        batch_ext.push((b.clone(), e));
    }
    let (Some(rows), Some(keys), Some(depth), Some(slices)) = (
        shape_of(&sts[pg].lhs_tensor, batch.len()),
        shape_of(&score, n),
        program
            .tensor(&query.tensor)
            .and_then(|t| program.evaluate(t.shape.as_ref()?.last()?)),
        shape_of(&ml, n),
    ) else {
        return Ok(None);
    };
    if depth % 16 != 0 || depth > 256 || query.rows != rows || key_operand.rows != keys {
        return Ok(None);
    }
    let Some(len) = slice_len(&lst.rhs, &slice, &within) else {
        return Ok(None);
    };
    let norm = |e: &Expr| normalize(e, &slice, &within, len, &key);
    let Some(pred_body) = norm(&lst.rhs) else {
        return Ok(None);
    };
    let pred = sts[pg].lhs_tensor.clone();
    let row_subs = var_list(&row_idx);
    let elem_subs = var_list(&elem_idx);
    let local_subs = var_list(&local_idx);
    let pred_local_read = access_text(&ml, &local_subs);
    // Local targets and their global combinations.
    let roles = Roles {
        program,
        batch: &batch,
        row_idx: &row_idx,
        key: &key,
        keys,
        dtype,
    };
    let mut used = vec![pg, pl, sc];
    let mut sums = Vec::new();
    let mut contractions = Vec::new();
    let (mut sum_locals, mut sum_globals) = (Vec::new(), Vec::new());
    let (mut con_locals, mut con_globals) = (Vec::new(), Vec::new());
    for (lt, st) in sts.iter().enumerate() {
        if used.contains(&lt)
            || !is_sum_reduction(st.op)
            || st.reduction_indices != [within.clone()]
            || st.lhs_indices.last() != Some(&slice)
            || st.lhs_indices[..n.min(st.lhs_indices.len())] != row_idx[..]
        {
            continue;
        }
        let local = &st.lhs_tensor;
        let lsubs = var_list(&st.lhs_indices);
        // Its global combination: a sum over `s` of an expression of
        // `X_l(.., s)`, `M_l(bt, i, s)` and `M(bt, i)`.
        let gl: Vec<usize> = sts
            .iter()
            .enumerate()
            .filter(|(_, g)| reads(&g.rhs).iter().any(|(t, _)| t == local))
            .map(|(k, _)| k)
            .collect();
        let [gt] = gl[..] else {
            return Ok(None);
        };
        let g = &sts[gt];
        if !is_sum_reduction(g.op)
            || g.reduction_indices != [slice.clone()]
            || g.lhs_indices[..] != st.lhs_indices[..st.lhs_indices.len() - 1]
            || writes(program, local).len() != 1
            || writes(program, &g.lhs_tensor).len() != 1
        {
            return Ok(None);
        }
        let reads_ok = reads(&g.rhs).iter().all(|(t, subs)| {
            (t == local && *subs == lsubs)
                || (*t == ml && *subs == local_subs)
                || (*t == pred && *subs == row_subs)
        });
        let Some(term) = norm(&st.rhs) else {
            return Ok(None);
        };
        if !reads_ok {
            return Ok(None);
        }
        if st.lhs_indices.len() == n + 1 {
            sums.push(RowSum {
                tensor: g.lhs_tensor.clone(),
                init: number(0.0),
                repair: g.rhs.clone(),
                repair_self: access_text(local, &lsubs),
                term,
            });
            sum_locals.push(lt);
            sum_globals.push(gt);
        } else if st.lhs_indices.len() == n + 2 {
            let column = st.lhs_indices[n].clone();
            let (Some((weight, value)), Some(width)) = (
                roles.value_product(&term, &column),
                roles.column_width(&g.lhs_tensor, n),
            ) else {
                return Ok(None);
            };
            contractions.push(RowContraction {
                tensor: g.lhs_tensor.clone(),
                column,
                width,
                init: number(0.0),
                repair: g.rhs.clone(),
                repair_self: access_text(local, &lsubs),
                rounded_once: super::attention::declared_in(program, &weight, roles.dtype),
                weight,
                value,
            });
            con_locals.push(lt);
            con_globals.push(gt);
        } else {
            return Ok(None);
        }
        used.extend([lt, gt]);
    }
    if !one_width_a_column(&contractions) {
        return Ok(None);
    }
    // Maps over (bt, i, j) and the epilogue.
    let mut elementwise: Vec<String> = vec![score.clone()];
    let mut maps = Vec::new();
    let mut epilogue = Vec::new();
    let globals: Vec<String> = std::iter::once(pred.clone())
        .chain(sums.iter().map(|s| s.tensor.clone()))
        .chain(contractions.iter().map(|c| c.tensor.clone()))
        .collect();
    let last_used = used.iter().copied().max().unwrap_or(0);
    let written_here = |t: &str| sts.iter().any(|o| o.lhs_tensor == t);
    for (position, s) in sts.iter().enumerate() {
        if used.contains(&position) {
            continue;
        }
        if s.op != AssignOp::Assign || !s.reduction_indices.is_empty() {
            return Ok(None);
        }
        if s.lhs_indices == elem_idx && position < pl {
            for (t, subs) in reads(&s.rhs) {
                if elementwise.contains(&t) {
                    if subs != elem_subs {
                        return Ok(None);
                    }
                } else if written_here(&t) {
                    return Ok(None);
                }
            }
            if writes(program, &s.lhs_tensor).len() != 1 {
                return Ok(None);
            }
            elementwise.push(s.lhs_tensor.clone());
            maps.push((s.lhs_tensor.clone(), s.rhs.clone()));
        } else if position > last_used
            && (s.lhs_indices == row_idx
                || contractions.iter().any(|c| {
                    s.lhs_indices.len() == n + 1
                        && s.lhs_indices[..n] == row_idx[..]
                        && s.lhs_indices[n] == c.column
                }))
        {
            for (t, subs) in reads(&s.rhs) {
                if globals.contains(&t) {
                    let ok = if sums.iter().any(|x| x.tensor == t) || t == pred {
                        subs == row_subs
                    } else {
                        subs == var_list(&s.lhs_indices)
                            && contractions
                                .iter()
                                .any(|c| c.tensor == t && s.lhs_indices.last() == Some(&c.column))
                    };
                    if !ok {
                        return Ok(None);
                    }
                } else if written_here(&t) {
                    return Ok(None);
                }
            }
            if writes(program, &s.lhs_tensor).len() != 1 || globals.contains(&s.lhs_tensor) {
                return Ok(None);
            }
            epilogue.push(position);
        } else {
            return Ok(None);
        }
    }
    // Element reads of the body, terms and weights: elementwise tensors at
    // (bt, i, j), the local predecessor at (bt, i, s), nothing else written.
    let element_reads_ok = |e: &Expr| -> bool {
        reads(e).iter().all(|(t, subs)| {
            if elementwise.contains(t) {
                *subs == elem_subs
            } else if *t == ml {
                *subs == local_subs
            } else {
                !written_here(t)
            }
        })
    };
    if !element_reads_ok(&pred_body)
        || sums.iter().any(|s| !element_reads_ok(&s.term))
        || contractions.iter().any(|c| !element_reads_ok(&c.weight))
    {
        return Ok(None);
    }
    // Every state the kernels keep in registers or memory of their own
    // making: f32 temps.
    let locals: Vec<String> = sum_locals
        .iter()
        .chain(con_locals.iter())
        .map(|&k| sts[k].lhs_tensor.clone())
        .chain(std::iter::once(ml.clone()))
        .collect();
    for t in elementwise
        .iter()
        .chain(globals.iter())
        .chain(locals.iter())
    {
        match program.tensor(t) {
            Some(x) if x.role == TensorRole::Temp && x.dtype == DType::F32 => {}
            _ => return Ok(None),
        }
    }
    let split = Split {
        slice: slice.clone(),
        within: within.clone(),
        slices,
        len,
        pred_local: pl,
        sum_locals,
        con_locals,
        pred_global: pg,
        sum_globals,
        con_globals,
    };
    let Some(v) = domains(
        isl,
        program,
        scop,
        &split,
        (&batch_ext, &row, &key),
        [rows, keys, depth],
        sc,
        &contractions,
        &epilogue,
    )?
    else {
        return Ok(None);
    };
    if !within_rows(isl, scop, deps, &row_idx)?
        || !kernels_apart(isl, program, scop, deps, &split, &row_idx, &key, sc)?
    {
        return Ok(None);
    }
    let evaluated = step_expressions(&maps, &pred_body, &sums, &contractions);
    let padding = padding_rows(program, &row, rows, &evaluated);
    let mut cond_batch = batch.clone();
    cond_batch.push(slice.clone());
    let [key_lo, key_hi, any_key, full_tile, element] =
        tile_conditions(isl, scop, v, &cond_batch, &row, &key, SPLIT_ROWS, padding)?;
    let attention = Attention {
        batch: batch_ext,
        row,
        key,
        rows,
        keys,
        depth,
        dtype,
        score,
        query,
        key_operand,
        maps,
        pred: pred.clone(),
        cache: ml,
        reducer,
        pred_init: Expr {
            kind: ExprKind::Inf {
                negative: reducer == Reducer::Max,
            },
            ty: ExprType::Num(DType::F32),
        },
        pred_body,
        pred_term: pred_local_read.clone(),
        repair_old: pred_local_read,
        repair_new: access_text(&pred, &row_subs),
        sums,
        contractions,
        epilogue,
        key_lo,
        key_hi,
        any_key,
        full_tile,
        element,
        split: Some(split),
    };
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
) -> Result<Option<isl_rs::Set>> {
    let pre = &scop.param_prefix;
    let batch: Vec<String> = batch_ext.iter().map(|(b, _)| b.clone()).collect();
    let anon = |s: &ModelStmt, its: &[String]| domain_on(isl, scop, s, its);
    let boxed = |extents: &[(String, i64)]| boxed_set(isl, scop, batch_ext, extents);
    let is = |s: &ModelStmt, its: &[String], want: isl_rs::Set| -> Result<bool> {
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
    let with_key = |names: &[String]| -> Result<isl_rs::Set> {
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
