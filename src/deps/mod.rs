//! Dependences between statement instances, relative to the program order
//! `θ` (the canonical schedule).
//!
//! * flow (read after write), value-based and exact: isl's dataflow analysis
//!   gives, for every read, the last write of the same element before it,
//!   `F = { w -> r }`;
//! * anti (write after read), memory-based:
//!   `A = { r -> w : R(r) = W(w) ∧ θ(r) ≺ θ(w) }`;
//! * output (write after write), memory-based:
//!   `O = { w -> w' : W(w) = W(w') ∧ θ(w) ≺ θ(w') }`.
//!
//! `F ∪ A ∪ O` is a complete set of validity constraints: a memory-based
//! flow pair `w -> r` with an intervening write `w'` is implied by
//! `w -> w'` (output) and `w' -> r` (flow) through transitivity.

use crate::error::Result;
use crate::isl::{IslPrint, Schedule, UnionAccessInfo, UnionMap};
use crate::model::Scop;

pub struct Dependences {
    pub flow: UnionMap,
    pub anti: UnionMap,
    pub output: UnionMap,
}

impl Dependences {
    /// `F ∪ A ∪ O`.
    pub fn all(&self) -> Result<UnionMap> {
        Ok(self
            .flow
            .copy()?
            .union(self.anti.copy()?)?
            .union(self.output.copy()?)?)
    }

    /// The three relations as isl text, one per line, for `--emit deps`.
    pub fn describe(&self) -> String {
        format!(
            "flow:   {}\nanti:   {}\noutput: {}\n",
            self.flow.text(),
            self.anti.text(),
            self.output.text()
        )
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "flow": self.flow.text(),
            "anti": self.anti.text(),
            "output": self.output.text(),
        })
    }
}

/// Computes the dependences of `scop` under its program order `order`.
pub fn compute(scop: &Scop, order: &Schedule) -> Result<Dependences> {
    let reads = scop.reads()?;
    let writes = scop.writes()?;
    let flow = UnionAccessInfo::from_sink(reads.copy()?)?
        .set_must_source(writes.copy()?)?
        .set_schedule(order.copy()?)?
        .compute_flow()?
        .get_must_dependence()?;
    let theta = order.get_map()?.intersect_domain(scop.domain()?)?;
    let before = theta.copy()?.lex_lt_union_map(theta)?;
    let same_element = |a: &UnionMap, b: &UnionMap| -> Result<UnionMap> {
        Ok(a.copy()?.apply_range(b.copy()?.reverse()?)?)
    };
    let anti = same_element(&reads, &writes)?
        .intersect(before.copy()?)?
        .coalesce()?;
    let output = same_element(&writes, &writes)?
        .intersect(before)?
        .coalesce()?;
    Ok(Dependences {
        flow: flow.coalesce()?,
        anti,
        output,
    })
}
