//! Counting, at fixed parameter values: the integer points of an
//! iteration domain ([`count_points`]) and the arithmetic of one statement
//! instance ([`flops_per_instance`]). Every stage that weighs work (the
//! repair's split, the gpu stage's cost model, the runtime's figures)
//! counts here, so none of them reaches into a later stage for it.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::frontend::ast::{BinOp, Expr, ExprKind, Statement};
use crate::isl::{DimType, IslPrint, Set, Val};
use crate::model::StmtKind;

/// Operations of one instance of an isl statement of `stmt`:
///
/// * an init instance (`S_init`, the `!` of `op=!`) stores a constant: 0;
/// * an update instance is its right side plus 1 for the combine with the
///   left side, so `C(i, j) +=! A(i, k) * B(k, j)` is 2 (a multiply-add);
/// * an assignment is its right side.
pub fn flops_per_instance(stmt: &Statement, kind: StmtKind) -> u64 {
    match kind {
        StmtKind::Init => 0,
        StmtKind::Update => expr_flops(&stmt.rhs) + 1,
        StmtKind::Assign => expr_flops(&stmt.rhs),
    }
}

/// Operations of an expression: every arithmetic binary operator and every
/// comparison counts 1 (a comparison is the flop of a ReLU or a max), every
/// function call (`exp`, `max`, `rsqrt`, ...) counts 1. Reads, constants,
/// negation, `!`, `&&`, `||`, selects and casts count 0: they are data
/// movement or control, not arithmetic a roofline charges for.
pub fn expr_flops(e: &Expr) -> u64 {
    match &e.kind {
        ExprKind::Number(_)
        | ExprKind::Inf { .. }
        | ExprKind::Index(_)
        | ExprKind::Param(_)
        | ExprKind::Access { .. } => 0,
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => expr_flops(a),
        ExprKind::Binary(op, a, b) => {
            let own = match op {
                BinOp::And | BinOp::Or => 0,
                _ => 1,
            };
            own + expr_flops(a) + expr_flops(b)
        }
        ExprKind::Select(c, a, b) => expr_flops(c) + expr_flops(a) + expr_flops(b),
        ExprKind::Call(_, args) => 1 + args.iter().map(expr_flops).sum::<u64>(),
    }
}

/// Largest number of slices [`count_points`] cuts a set into before it
/// gives up: each costs a few isl operations, so this bounds the time to a
/// few seconds even for a set with three mutually constrained dimensions.
const SLICE_BUDGET: u64 = 1 << 20;

/// The exact number of integer points of `set`, a bounded set without
/// parameters (fix them first).
///
/// isl counts (`isl_set_count_val`) by scanning every value of a set's
/// outer dimensions, which is far too slow for a 1024³ gemm, and plain isl
/// has no parametric counting (that is barvinok's). So the count is split:
/// * a set equal to its bounding box has the product of the extents;
/// * a strided dimension is compressed to its quotient;
/// * a dimension whose constraints do not involve the others (the set is
///   its projection times the dimension's range) contributes a factor;
/// * a set whose outer dimensions have few values is counted by isl;
/// * otherwise the set is cut into slices along its shortest dimension and
///   each slice is counted the same way. A causal mask `j <= i` over
///   `b, i, j` factors `b` out and then cuts `i` into rows, each a box.
pub fn count_points(set: &Set) -> Result<u64> {
    let mut budget = SLICE_BUDGET;
    count(set.copy()?, &mut budget)
}

/// Slices [`estimated_points`] may cut: about 40 ms of isl operations.
const ESTIMATE_BUDGET: u64 = 1 << 14;

/// The number of integer points of `set` as [`count_points`] counts it,
/// with a budget about sixty times smaller: exact for boxes, strided boxes,
/// triangles and every set cut into few slices, a trapezoid estimate beyond
/// (see [`estimate`]). For the gpu stage's cost model, which weighs every
/// candidate grouping of a compilation: a skewed candidate (an epilogue at
/// `257 + 3743 i` in a product's steps) took 2.5 s a set exactly, and the
/// model only compares candidates whose times differ by far more than the
/// estimate's error.
pub fn estimated_points(set: &Set) -> Result<u64> {
    let mut budget = ESTIMATE_BUDGET;
    count(set.copy()?, &mut budget)
}

/// [`estimated_points`] of the sets one compilation's cost model counts,
/// remembered by each set's text. The model weighs the default mapping
/// and every candidate grouping, which count the same statement domains
/// again, and at each tile point every tensor's footprint counts the same
/// tiles again: correlation counted 25 sets 146 times, 0.23 s of its
/// 0.32 s of counting in repeats. isl's text of a set is the whole set
/// (every constraint, every local variable), so an equal text is an equal
/// set, with the same count. Failed counts are not kept (each caller
/// decides what a failure means).
#[derive(Default)]
pub struct Counts {
    known: RefCell<HashMap<String, u64>>,
}

impl Counts {
    /// [`estimated_points`] of `set`, counted once per distinct set.
    pub fn estimated_points(&self, set: &Set) -> Result<u64> {
        let key = set.text();
        if let Some(&n) = self.known.borrow().get(&key) {
            return Ok(n);
        }
        let n = estimated_points(set)?;
        self.known.borrow_mut().insert(key, n);
        Ok(n)
    }

    /// How many distinct sets have been counted.
    pub fn remembered(&self) -> usize {
        self.known.borrow().len()
    }
}

fn count(set: Set, budget: &mut u64) -> Result<u64> {
    if set.is_empty()? {
        return Ok(0);
    }
    let n = set.dim(DimType::Set)?;
    if n == 0 {
        return Ok(1);
    }
    let mut bounds = Vec::new();
    for pos in 0..n {
        let lo = bound(set.copy()?.dim_min_val(pos)?, "lower")?;
        let hi = bound(set.copy()?.dim_max_val(pos)?, "upper")?;
        bounds.push((lo, hi));
    }
    let extent = |(lo, hi): (i64, i64)| (hi - lo + 1).max(0) as u64;
    // The bounding box of the set; the set is a box when it equals it.
    let mut boxed = Set::universe(set.get_space()?)?;
    for (pos, (lo, hi)) in bounds.iter().enumerate() {
        boxed = bound_dim(boxed, pos as u32, *lo, *hi)?;
    }
    if boxed.is_equal(&set)? {
        return Ok(bounds
            .iter()
            .fold(1u64, |a, b| a.saturating_mul(extent(*b))));
    }
    // A strided dimension (tile origins, every 16th k) counts as its
    // quotient: without this, a set of tile origins is cut into one slice
    // per value of its range, most of them empty.
    if *budget > 0 {
        if let Some(dense) = compress_strides(&set)? {
            *budget -= 1;
            return count(dense, budget);
        }
    }
    // A dimension independent of the others factors out.
    for (pos, (lo, hi)) in bounds.iter().enumerate() {
        let rest = set.copy()?.project_out(DimType::Set, pos as u32, 1)?;
        let back = bound_dim(
            rest.copy()?.insert_dims(DimType::Set, pos as u32, 1)?,
            pos as u32,
            *lo,
            *hi,
        )?;
        if back.is_equal(&set)? {
            return Ok(extent((*lo, *hi)).saturating_mul(count(rest, budget)?));
        }
    }
    // isl counts a set by scanning every value of its outer dimensions and
    // adding the innermost one's intervals: fast where the outer ones have
    // few values, whatever the innermost's range and local variables
    // (`3743 floor((16 v - 257) / 3743) <= 16 v - 3984` over 467,000
    // values of `v`: 50 us, where slicing took a second). Each scanned
    // value is charged to the budget as a slice is: without that, the
    // 4096 rows of a 4096-point tetrahedron `k <= j <= i`, each scanned
    // by isl, took 9.5 s. A set of one dimension (one scan) is always
    // isl's: sampled instead, its local variables (`(i + j + k) mod 3`)
    // would make the samples meaningless.
    let outer = bounds[..bounds.len() - 1]
        .iter()
        .fold(1u64, |a, b| a.saturating_mul(extent(*b)));
    if outer <= ISL_SCAN_LIMIT && (outer <= *budget || bounds.len() == 1) {
        *budget = budget.saturating_sub(outer);
        let n = set.count_val()?;
        if n.is_int()? {
            return Ok(crate::isl::val_to_i64(&n)?.max(0) as u64);
        }
    }
    // Cut into slices along the shortest dimension.
    let (pos, (lo, hi)) = bounds
        .iter()
        .copied()
        .enumerate()
        .min_by_key(|(_, b)| extent(*b))
        .ok_or_else(|| Error::Internal("a set without dimensions".into()))?;
    let slices = extent((lo, hi));
    let slice_at = |v: i64| -> Result<Set> {
        Ok(set
            .copy()?
            .fix_val(
                DimType::Set,
                pos as u32,
                Val::int_from_si(&set.get_ctx(), v)?,
            )?
            .project_out(DimType::Set, pos as u32, 1)?)
    };
    if slices > *budget {
        return estimate(lo, hi, slice_at, budget);
    }
    *budget -= slices;
    let mut total: u64 = 0;
    for v in lo..=hi {
        total = total.saturating_add(count(slice_at(v)?, budget)?);
    }
    Ok(total)
}

/// `set` with its strided dimensions compressed, or `None` where none has
/// a stride. isl's stride info says `x_p = o(x) + s·y` for an integer `y`,
/// with `s > 1` and `o` an affine function of the parameters and the other
/// dimensions (not `x_p`). The preimage under `x_p ↦ o(x) + s·x_p` (the
/// other dimensions unchanged) is the set of those `y`: the map is a
/// bijection from it onto `set`, so both have the same number of points,
/// and the compressed dimension is dense, so the preimage is a box where
/// `set` is a strided box.
fn compress_strides(set: &Set) -> Result<Option<Set>> {
    let n = set.dim(DimType::Set)?;
    let mut out = set.copy()?;
    let mut changed = false;
    for pos in 0..n {
        let info = out.get_stride_info(pos)?;
        let stride = info.get_stride()?;
        if !stride.is_int()? || crate::isl::val_to_i64(&stride)? <= 1 {
            continue;
        }
        let offset = info.get_offset()?;
        if offset.involves_dims(DimType::In, pos as u32, 1)? {
            continue;
        }
        let space = out.get_space()?;
        let var = crate::isl::Aff::var_on_domain(
            crate::isl::LocalSpace::from_space(space.copy()?)?,
            DimType::Set,
            pos as u32,
        )?;
        let image = var.scale_val(stride)?.add(offset)?;
        let ma = crate::isl::MultiAff::identity_on_domain_space(space)?.set_aff(pos, image)?;
        out = out.preimage_multi_aff(ma)?.detect_equalities()?;
        changed = true;
    }
    Ok(changed.then_some(out))
}

/// Values of a set's outer dimensions up to which isl's own count (a
/// scan of them) is used: about 60 ms at 1 us a value.
const ISL_SCAN_LIMIT: u64 = 1 << 16;

/// Slices counted where the budget cannot count every one: beyond it
/// (three or more mutually constrained dimensions of thousands of values,
/// such as `k <= j <= i`), a count that stopped the compilation helped no
/// one. The slices `lo..=hi` are counted at [`SAMPLED_SLICES`] evenly
/// spaced values, each with an equal share of what is left of the budget,
/// and the total is the trapezoid rule over them: exact where the slice
/// counts are affine in the slice's value (a triangle's rows), within a
/// fraction of a percent of a tetrahedron's `N (N + 1) (N + 2) / 6` at
/// `N = 4096` (see the tests). The count is only used for reports (flops,
/// bytes), never for code.
fn estimate(
    lo: i64,
    hi: i64,
    slice_at: impl Fn(i64) -> Result<Set>,
    budget: &mut u64,
) -> Result<u64> {
    // No more samples than the budget has slices: each sample's own count
    // may estimate again, and samples beyond the budget would multiply
    // through the levels (257 at each of three levels is 17 million).
    let n = SAMPLED_SLICES
        .min(hi - lo + 1)
        .min(i64::try_from(*budget).unwrap_or(i64::MAX))
        .max(2);
    let share = (*budget / n as u64).max(1);
    let at: Vec<i64> = (0..n)
        .map(|k| lo + ((hi - lo) as i128 * k as i128 / (n - 1) as i128) as i64)
        .collect();
    let mut counts = Vec::with_capacity(at.len());
    for v in &at {
        let mut b = share;
        counts.push(count(slice_at(*v)?, &mut b)? as f64);
    }
    *budget = 0;
    // Each sample stands for the values up to half way to its neighbours.
    let mut total = 0.0f64;
    for k in 0..at.len() {
        let left = if k == 0 {
            at[0] as f64 - 0.5
        } else {
            (at[k - 1] + at[k]) as f64 / 2.0
        };
        let right = if k + 1 == at.len() {
            at[k] as f64 + 0.5
        } else {
            (at[k] + at[k + 1]) as f64 / 2.0
        };
        total += counts[k] * (right - left);
    }
    Ok(total.round() as u64)
}

/// Slices an estimate counts (see [`estimate`]).
const SAMPLED_SLICES: i64 = 257;

/// `set` with dimension `pos` restricted to `lo..=hi`.
fn bound_dim(set: Set, pos: u32, lo: i64, hi: i64) -> Result<Set> {
    let ctx = set.get_ctx();
    Ok(set
        .lower_bound_val(DimType::Set, pos, Val::int_from_si(&ctx, lo)?)?
        .upper_bound_val(DimType::Set, pos, Val::int_from_si(&ctx, hi)?)?)
}

/// An integer bound from isl; infinite means the set is unbounded, which a
/// statement domain with all parameters fixed never is.
fn bound(v: Val, which: &str) -> Result<i64> {
    if !v.is_int()? {
        return Err(Error::Internal(format!(
            "the domain has no finite {which} bound"
        )));
    }
    crate::isl::val_to_i64(&v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isl::Isl;

    fn points(text: &str) -> u64 {
        let isl = Isl::new();
        count_points(&isl.set(text).unwrap()).unwrap()
    }

    /// A set counted again (the same set built anew, so another isl
    /// object with the same text) comes from the memo with the same count;
    /// another set is counted on its own.
    #[test]
    fn counts_are_remembered_by_the_sets_text() {
        let isl = Isl::new();
        let counts = Counts::default();
        let triangle = "{ [i, j] : 0 <= i < 300 and 0 <= j <= i }";
        let first = counts
            .estimated_points(&isl.set(triangle).unwrap())
            .unwrap();
        assert_eq!(first, 300 * 301 / 2);
        assert_eq!(counts.remembered(), 1);
        let again = counts
            .estimated_points(&isl.set(triangle).unwrap())
            .unwrap();
        assert_eq!((again, counts.remembered()), (first, 1));
        let square = isl
            .set("{ [i, j] : 0 <= i < 300 and 0 <= j < 300 }")
            .unwrap();
        assert_eq!(counts.estimated_points(&square).unwrap(), 300 * 300);
        assert_eq!(counts.remembered(), 2);
        // An empty set counts 0, and is remembered as such.
        let none = isl.set("{ [i] : 0 <= i < 0 }").unwrap();
        assert_eq!(counts.estimated_points(&none).unwrap(), 0);
        assert_eq!(counts.remembered(), 3);
    }

    /// Tile origins and k steps of a 4096³ gemm: every dimension strided.
    /// Sliced, this took over ten seconds (one slice per value of the
    /// range, most of them empty); compressed it is a box, counted exactly
    /// within a budget of a few slices.
    #[test]
    fn strided_dimensions_count_as_their_quotients() {
        let isl = Isl::new();
        let tiles = isl
            .set(
                "{ [b0, b1, k] : 0 <= b0 < 4096 and 0 <= b1 < 4096 and 0 <= k < 4096 \
                 and b0 mod 128 = 0 and b1 mod 128 = 0 and k mod 16 = 0 }",
            )
            .unwrap();
        assert_eq!(count(tiles, &mut 4).unwrap(), 32 * 32 * 256);
        // An offset that moves with another dimension: i + j even.
        let brute = (0..37i64)
            .flat_map(|i| (0..53i64).map(move |j| (i, j)))
            .filter(|(i, j)| (i + j) % 2 == 0 && j >= i)
            .count() as u64;
        assert_eq!(
            points("{ [i, j] : 0 <= i < 37 and i <= j < 53 and (i + j) mod 2 = 0 }"),
            brute
        );
        // A stride with a non-zero start.
        assert_eq!(
            points("{ [i] : 5 <= i <= 1000 and i mod 7 = 3 }"),
            (5..=1000).filter(|i| i % 7 == 3).count() as u64
        );
    }

    #[test]
    fn boxes_are_products() {
        assert_eq!(
            points("{ S[i, j, k] : 0 <= i < 37 and 0 <= j < 53 and 0 <= k < 29 }"),
            37 * 53 * 29
        );
        assert_eq!(points("{ S[] }"), 1);
        assert_eq!(points("{ S[i] : 0 <= i < 0 }"), 0);
    }

    #[test]
    fn triangles_and_strides_are_exact() {
        // causal mask over a batch: b factors out, each row i has i + 1 points
        assert_eq!(
            points("{ S[b, i, j] : 0 <= b < 3 and 0 <= i < 10 and 0 <= j <= i }"),
            3 * 55
        );
        // even points only
        assert_eq!(points("{ S[i] : 0 <= i < 10 and exists e : i = 2e }"), 5);
        // a union of two overlapping boxes
        assert_eq!(
            points("{ S[i, j] : 0 <= i < 4 and 0 <= j < 2; S[i, j] : 0 <= i < 2 and 0 <= j < 4 }"),
            12
        );
    }

    #[test]
    fn three_coupled_dimensions_are_estimated_closely_past_the_budget() {
        // Syrk-like `k <= j <= i`: at 4096, 8.4 million slices of slices
        // are past the budget (it once stopped the compilation); here
        // at 1024 with the budget cut to match, to keep the test short.
        let n: u64 = 1024;
        let isl = Isl::new();
        let set = isl.set("{ S[i, j, k] : 0 <= k <= j <= i < 1024 }").unwrap();
        let got = count(set, &mut (SLICE_BUDGET / 16)).unwrap();
        let exact = n * (n + 1) * (n + 2) / 6;
        let error = (got as f64 - exact as f64).abs() / exact as f64;
        assert!(error < 1e-3, "{got} against {exact}: {error}");
    }

    #[test]
    fn large_boxes_count_without_enumerating() {
        assert_eq!(
            points("{ S[i, j, k] : 0 <= i < 4096 and 0 <= j < 4096 and 0 <= k < 4096 }"),
            1 << 36
        );
        assert_eq!(
            points("{ S[i, j] : 0 <= i < 4096 and 0 <= j <= i }"),
            4096 * 4097 / 2
        );
    }
}
