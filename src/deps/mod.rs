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
use std::fmt::Write;

use crate::isl::{Isl, IslPrint, Schedule, UnionAccessInfo, UnionMap, UnionSet};
use crate::model::{ModelStmt, Scop};

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

    /// The dependences between statement instances inside common loop
    /// blocks, as distance vectors over those blocks' indices, one line
    /// per kind and pair of statements: `flow   S2 -> S1 over (t):
    /// { [1] }`. A non-zero distance is carried by the block's loop. Empty
    /// for a program without loop blocks.
    ///
    /// With every parameter known (`fixed`), a set of at most 8 distances
    /// is listed point by point (`{ [0, 1]; [1, 0] }`), otherwise it is
    /// printed as isl writes it.
    pub fn describe_carried(&self, isl: &Isl, scop: &Scop, fixed: bool) -> Result<String> {
        let mut out = String::new();
        let p = &scop.param_prefix;
        let tuple = |s: &ModelStmt| format!("{}[{}]", s.name, s.iterators.join(", "));
        for (kind, rel) in [
            ("flow", &self.flow),
            ("anti", &self.anti),
            ("output", &self.output),
        ] {
            for a in &scop.statements {
                for b in &scop.statements {
                    let d = a
                        .blocks
                        .iter()
                        .zip(&b.blocks)
                        .take_while(|(x, y)| x.id == y.id)
                        .count();
                    if d == 0 {
                        continue;
                    }
                    let pairs = rel
                        .copy()?
                        .intersect_domain(UnionSet::from_set(a.domain.copy()?)?)?
                        .intersect_range(UnionSet::from_set(b.domain.copy()?)?)?;
                    if pairs.is_empty()? {
                        continue;
                    }
                    let lead = |s: &ModelStmt| -> Result<UnionMap> {
                        isl.union_map(&format!(
                            "{p}{{ {} -> [{}] }}",
                            tuple(s),
                            s.iterators[..d].join(", ")
                        ))
                    };
                    let dist = pairs
                        .apply_domain(lead(a)?)?
                        .apply_range(lead(b)?)?
                        .deltas()?
                        .intersect_params(scop.context.copy()?)?;
                    let listed = if fixed {
                        list_points(dist.copy()?, d, 8)?
                    } else {
                        None
                    };
                    let dist = match listed {
                        Some(points) => format!("{{ {} }}", points.join("; ")),
                        None => dist.gist_params(scop.context.copy()?)?.text(),
                    };
                    let _ = writeln!(
                        out,
                        "{:<7} {} -> {} over ({}): {}",
                        format!("{kind}:"),
                        a.name,
                        b.name,
                        a.iterators[..d].join(", "),
                        dist
                    );
                }
            }
        }
        if !out.is_empty() {
            out.insert_str(0, "distances over the loop blocks' indices (non-zero: carried by the block's loop):\n");
        }
        Ok(out)
    }

    /// The three relations as isl text.
    pub fn text(&self) -> Text {
        Text {
            flow: self.flow.text(),
            anti: self.anti.text(),
            output: self.output.text(),
        }
    }
}

/// The dependences as isl text ([`Dependences::text`]): `--emit json`
/// prints them and the cache keeps them, so they read back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Text {
    pub flow: String,
    pub anti: String,
    pub output: String,
}

/// The points of `set` (of `dims` dimensions, no free parameters) as
/// `[a, b]` texts in lexicographic order, when there are at most `max`.
fn list_points(mut set: UnionSet, dims: usize, max: usize) -> Result<Option<Vec<String>>> {
    let mut out = Vec::new();
    while !set.is_empty()? {
        if out.len() == max {
            return Ok(None);
        }
        let p = set.copy()?.lexmin()?.sample_point()?;
        let coords: Vec<String> = crate::isl::coordinates(&p, dims as u32)?
            .iter()
            .map(|v| v.to_string())
            .collect();
        out.push(format!("[{}]", coords.join(", ")));
        set = set.subtract(UnionSet::from_point(p)?)?;
    }
    Ok(Some(out))
}

/// Computes the dependences of `scop` under its program order `order`.
pub fn compute(scop: &Scop, order: &Schedule) -> Result<Dependences> {
    compute_with(scop, order, Flow::Tree)
}

/// The same dependences as [`compute`], with the flow computed from
/// `order`'s flattened schedule map instead of its tree: for the
/// scheduler's input at symbolic sizes and for the repair's checks, not
/// for the dependences a compilation prints and maps with.
///
/// Why: isl's dataflow analysis on a tree compares instances node by node
/// and takes the lexicographic maximum over each disjunct of a union
/// domain at each level; on the map it takes one per schedule dimension.
/// On `attention_bigbird` (its `where` a union of three pieces) the map
/// took 2 to 3 s of CPU where the tree took 7 to 11 s. Both are exact, so
/// the relations are equal, but isl splits them into other disjuncts, and
/// their text (`--emit deps`) would change: [`compute`] keeps the tree for
/// the dependences that are printed. (The naive fusion's violated pairs,
/// which the repair's report prints, came out the same text on every
/// example.)
pub fn compute_flat(scop: &Scop, order: &Schedule) -> Result<Dependences> {
    compute_with(scop, order, Flow::Map)
}

/// Which form of the program order isl's dataflow analysis is given.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    Tree,
    Map,
}

fn compute_with(scop: &Scop, order: &Schedule, flow: Flow) -> Result<Dependences> {
    let reads = scop.reads()?;
    let writes = scop.writes()?;
    let info = UnionAccessInfo::from_sink(reads.copy()?)?.set_must_source(writes.copy()?)?;
    let info = match flow {
        Flow::Tree => info.set_schedule(order.copy()?)?,
        Flow::Map => info.set_schedule_map(order.get_map()?)?,
    };
    let flow = info.compute_flow()?.get_must_dependence()?;
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
