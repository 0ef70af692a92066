//! A column kernel's lanes (`gpu::lanes::LaneAxis::Y`) and the memory
//! they combine through, proven.
//!
//! Such a kernel runs `B` consecutive rows of its band on `threadIdx.x`
//! and `W` lanes of each on `threadIdx.y`; a split loop's lanes leave
//! their partial states in shared part arrays of `B W` elements, then every
//! lane combines its row's `W` parts (`codegen::cuda::lanes`,
//! `split_loop_columns`). The statements' own accesses are proven by the
//! walk of the tree with a row's lanes counted as one thread (the module
//! above; `mapping::check_parallel` proves the lanes' loops). What this
//! adds:
//!
//! * Every thread reaches every barrier. The barriers of the lanes' loops
//!   and of the combination lie inside the rows' thread loop, one
//!   iteration per thread; a thread of a row past the band's end would
//!   leave it, and the others would wait at a barrier it never reaches.
//!   So at every value `p` of the schedule above the rows' thread band,
//!   the band takes every value `0 <= v < B`:
//!   `dom(U) x [0, B) ⊆ U` with `U = { p -> v }` over the instances that
//!   reach it (the mapping makes `B` divide the rows, and takes only box
//!   domains, so no guard between the threads of a block encloses them).
//! * The part arrays have no race. With thread `(x, y)`, the printer's
//!   element `e(y, x)` (`lanes::Columns::part_element`, the text both
//!   read), the lanes write in phase 0 and read in phase 1, a barrier
//!   between and one after:
//!   `Wr = { [x, y, 0] -> e(y, x) }`, `Rd = { [x, y, 1] -> e(w, x) : 0 <= w < W }`.
//!   Two accesses of one phase by different threads, one a write, would
//!   race: `(Wr Wr⁻¹ ∪ Wr Rd⁻¹ ∪ Rd Wr⁻¹) ∩ {same phase} \ {same thread}`
//!   must be empty. Every element lies in `[0, B W)`, and a thread's reads
//!   are exactly the parts of its row, one per lane:
//!   `Rd Wr⁻¹ = { [x, y, 1] -> [x, w, 0] : 0 <= w < W }`. Each split loop
//!   declares its own arrays, and the barrier after phase 1 orders its
//!   reads before the writes of the loop's next run.

use crate::isl::{ScheduleNode, ScheduleNodeType, UnionMap, UnionSet};

use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::gpu::lanes::{Columns, COLUMNS_MARK};
use crate::gpu::mapping::prefix_and_member;
use crate::isl::IslPrint;

/// Proves the column kernel `kernel` (mark `mark`, block `columns`).
pub(super) fn prove(
    program: &Program,
    kernel: &ScheduleNode,
    mark: &str,
    columns: Columns,
) -> Result<()> {
    let race = |message: String| Error::Race {
        file: program.source.clone(),
        message: format!("{mark}: the column kernel's lanes {message}"),
    };
    let mut bands = Vec::new();
    rows_bands(kernel.copy()?, false, &mut bands)?;
    if bands.is_empty() {
        return Err(race("have no rows on threadIdx.x".into()));
    }
    for band in &bands {
        if let Some(missing) = missing_rows(band, columns.rows)? {
            return Err(race(format!(
                "may miss a barrier: a block's rows do not fill its {} threads along x: {missing}",
                columns.rows
            )));
        }
    }
    match prove_parts(&kernel.get_ctx(), columns)? {
        Some(message) => Err(race(message)),
        None => Ok(()),
    }
}

/// The bands under the `thread_x_*` mark right below the columns mark.
fn rows_bands(node: ScheduleNode, under: bool, out: &mut Vec<ScheduleNode>) -> Result<()> {
    if node.get_type()? == ScheduleNodeType::Mark {
        let name = node.mark_get_id()?.get_name()?.to_string();
        if name == COLUMNS_MARK {
            return rows_bands(node.get_child(0)?, true, out);
        }
        if under && name.starts_with("thread_x_") {
            out.push(node.get_child(0)?);
            return Ok(());
        }
    }
    for i in 0..node.n_children()? {
        rows_bands(node.get_child(i)?, false, out)?;
    }
    Ok(())
}

/// The pairs `p -> v` of a prefix value that reaches `band` and a row
/// value `0 <= v < rows` it does not take, as text, or `None`.
fn missing_rows(band: &ScheduleNode, rows: u32) -> Result<Option<String>> {
    let (prefix, member) = prefix_and_member(band)?;
    let taken = prefix.reverse()?.apply_range(member)?;
    if taken.is_empty()? {
        return Ok(None);
    }
    let ctx = taken.get_ctx();
    let all = UnionSet::read_from_str(&ctx, &format!("{{ [v] : 0 <= v < {rows} }}"))?;
    let wanted = UnionMap::from_domain_and_range(taken.copy()?.domain()?, all)?;
    let missing = wanted.subtract(taken)?;
    Ok(if missing.is_empty()? {
        None
    } else {
        Some(missing.coalesce()?.text())
    })
}

/// The part arrays' accesses of one split loop (see the module doc):
/// `Some` says what fails.
fn prove_parts(ctx: &crate::isl::Context, columns: Columns) -> Result<Option<String>> {
    parts_with(ctx, columns.rows, columns.lanes, &|lane, row| {
        columns.part_element(lane, row)
    })
}

/// [`prove_parts`] for `b` rows, `w` lanes and the element `element(lane,
/// row)`.
fn parts_with(
    ctx: &crate::isl::Context,
    b: u32,
    w: u32,
    element: &dyn Fn(&str, &str) -> String,
) -> Result<Option<String>> {
    let threads = format!("0 <= x < {b} and 0 <= y < {w}");
    let map = |text: String| UnionMap::read_from_str(ctx, &text);
    let writes = map(format!(
        "{{ [x, y, p] -> [e] : p = 0 and {threads} and e = {} }}",
        element("y", "x")
    ))?;
    let reads = map(format!(
        "{{ [x, y, p] -> [e] : p = 1 and {threads} and exists (w : 0 <= w < {w} and e = {}) }}",
        element("w", "x")
    ))?;
    let touch = |a: &UnionMap, c: &UnionMap| -> Result<UnionMap> {
        Ok(a.copy()?.apply_range(c.copy()?.reverse()?)?)
    };
    let read_write = touch(&reads, &writes)?;
    let conflicts = touch(&writes, &writes)?
        .union(touch(&writes, &reads)?)?
        .union(read_write.copy()?)?;
    let unordered = map("{ [x, y, p] -> [x2, y2, p2] : p2 = p and (x2 != x or y2 != y) }".into())?;
    let racing = conflicts.intersect(unordered)?;
    if !racing.is_empty()? {
        return Ok(Some(format!(
            "race on their part arrays: {}",
            racing.coalesce()?.text()
        )));
    }
    let inside = UnionSet::read_from_str(ctx, &format!("{{ [e] : 0 <= e < {} }}", b * w))?;
    let touched = writes.range()?.union(reads.range()?)?;
    if !touched.is_subset(&inside)? {
        return Ok(Some(format!(
            "touch their part arrays outside [0, {})",
            b * w
        )));
    }
    let own_row = map(format!(
        "{{ [x, y, p] -> [x2, w, p2] : p = 1 and p2 = 0 and x2 = x and {threads} and 0 <= w < {w} }}"
    ))?;
    if !read_write.is_equal(&own_row)? {
        return Ok(Some(
            "combine parts other than their row's, one per lane".into(),
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_of_any_column_block_are_proven() {
        let ctx = crate::isl::Context::alloc();
        for (rows, lanes) in [(16, 32), (9, 32), (5, 2), (1, 512), (32, 16)] {
            assert_eq!(prove_parts(&ctx, Columns { rows, lanes }).unwrap(), None);
        }
        // One element per row: the lanes of a row write it together.
        let shared = parts_with(&ctx, 16, 32, &|_, row| row.to_string()).unwrap();
        assert!(shared.is_some_and(|m| m.contains("race")));
        // Shifted by one: the last lane of the last row writes past the end.
        let shifted = parts_with(&ctx, 16, 32, &|l, r| format!("({l}) * 16 + ({r}) + 1")).unwrap();
        assert!(shifted.is_some_and(|m| m.contains("outside")));
        // Rows overlapping (a stride of 8 for 16 rows): lanes of two rows
        // write one element.
        let overlapping = parts_with(&ctx, 16, 32, &|l, r| format!("({l}) * 8 + ({r})")).unwrap();
        assert!(overlapping.is_some());
    }

    #[test]
    fn a_partial_tile_of_rows_is_refused() {
        // Ten rows in tiles of four: the last tile has two, so two of a
        // block's four threads would leave the loop with the barriers.
        let ctx = crate::isl::Context::alloc();
        let tree = |rows: u32| -> Option<String> {
            let s = crate::isl::Schedule::read_from_str(
                &ctx,
                &format!(
                    "{{ domain: \"{{ S[c] : 0 <= c < {rows} }}\", child: {{ schedule: \"[{{ S[c] -> [(c - (c) mod 4)] }}]\", child: {{ schedule: \"[{{ S[c] -> [((c) mod 4)] }}]\" }} }} }}"
                ),
            )
            .unwrap();
            let band = s.get_root().unwrap().child(0).unwrap().child(0).unwrap();
            missing_rows(&band, 4).unwrap()
        };
        assert_eq!(tree(12), None);
        // The tile at 8 lacks rows 2 and 3.
        assert!(tree(10).is_some());
    }
}
