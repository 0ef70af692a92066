//! Loading a thread's contiguous run of an input in 16-byte pieces before
//! the unrolled loop that reads it.
//!
//! One query row of attention per thread reads `K(j, 0..D)` and
//! `V(j, 0..D)` at every key `j`, element after element in a loop over the
//! head dimension that is unrolled (it indexes a private array). Printed
//! as it is, that is `D` two-byte loads each, and the load units, not the
//! arithmetic, bound the kernel. When the loop reads an input at
//! consecutive elements,
//!
//! ```text
//!   for l in 0..T:  .. X[base + l] ..      (l the loop's iterator - start)
//! ```
//!
//! with `T` a multiple of `V = 16 / sizeof(element)` and `base` a multiple
//! of `V` (the innermost extent and the start are), the run `X[base ..
//! base + T)` is first loaded into registers, `T / V` 16-byte loads where
//! the address is 16-byte aligned at run time (one element at a time
//! otherwise), and the loop reads the registers. The tensor is an input,
//! so nothing writes it in between, and every iteration of the loop runs
//! (its trip count is constant and no guard is inside), so the run holds
//! exactly the elements the loop would have read.

use std::collections::HashMap;
use std::fmt::Write;

use super::{storage_type, CountedLoop, Ctx};
use crate::frontend::ast::{DType, TensorRole};
use crate::isl::ast::{Expr as AstExpr, Node};
use crate::model::AccessKey;

/// At most this many elements in one run (registers per thread).
const MAX_RUN: i64 = 128;

/// A run loaded ahead of a loop: the statement and access (printer key)
/// it replaces, and the register element that replaces it.
pub(super) struct RowCopy {
    pub statement: String,
    pub key: AccessKey,
    pub element: String,
}

impl Ctx<'_> {
    /// Prints the runs loop `l` over `body` reads (module documentation)
    /// and returns what replaces the reads.
    pub(super) fn row_copies(
        &self,
        body: &Node,
        l: &CountedLoop,
        depth: usize,
        out: &mut String,
    ) -> Vec<RowCopy> {
        let mut copies = Vec::new();
        let (iterator, start, trips) = (l.iterator, l.start, l.trips);
        if l.step != 1 {
            return copies;
        }
        let mut users = Vec::new();
        if !super::unswitch::innermost_statements(body, false, &mut users) {
            return copies;
        }
        let pad = "  ".repeat(depth);
        // Runs already printed, by their first element's text.
        let mut printed: HashMap<String, String> = HashMap::new();
        for (statement, args) in users {
            let Some(s) = self.scop.statement(statement) else {
                continue;
            };
            // The statement iterator the loop runs: the one argument that
            // is the loop's iterator itself; no other argument names it.
            let named: Vec<usize> = (0..args.len())
                .filter(|&p| args[p].mentions(iterator))
                .collect();
            let [p] = named[..] else {
                continue;
            };
            if !matches!(&args[p], AstExpr::Id(i) if i == iterator) {
                continue;
            }
            let var = &s.iterators[p];
            let env = self.statement_env(&s.iterators, args);
            for a in s.accesses(self.program).into_iter().skip(1) {
                let Some(t) = self.program.tensor(&a.tensor) else {
                    continue;
                };
                let key = a.key();
                if t.role != TensorRole::Input
                    || self.printer.privates.borrow().contains_key(&a.tensor)
                    || self.promoted(statement, &key)
                {
                    continue;
                }
                let bytes: i64 = match t.dtype {
                    DType::F16 | DType::BF16 => 2,
                    DType::F32 | DType::I32 => 4,
                    // f64 and the dtypes after the first five: no runs.
                    _ => continue,
                };
                let v = 16 / bytes;
                let Some((last, outer)) = a.subscripts.split_last() else {
                    continue;
                };
                // Unit stride along the loop, in the innermost dimension
                // only, from an element a multiple of `v`.
                let unit = last.terms.len() == 1 && last.terms.get(var) == Some(&1);
                let extent = self
                    .scop
                    .tensor(&a.tensor)
                    .and_then(|m| m.shape.last().cloned())
                    .and_then(|e| self.program.evaluate(&e));
                if !unit
                    || outer.iter().any(|o| o.terms.contains_key(var))
                    || extent.is_none_or(|e| e % v != 0)
                    || (last.constant + start) % v != 0
                    || trips % v != 0
                    || trips > MAX_RUN
                {
                    continue;
                }
                let mut first_env = env.clone();
                first_env.insert(var.clone(), start.to_string());
                let first = self.printer.element(&a.tensor, &a.subscripts, &first_env);
                let buffer = match printed.get(&first) {
                    Some(b) => b.clone(),
                    None => {
                        let b = format!("pf_run{}_{}", printed.len(), a.tensor);
                        let ty = storage_type(t.dtype);
                        let _ = writeln!(
                            out,
                            "{pad}union {{ uint4 v[{}]; {ty} e[{trips}]; }} {b};",
                            trips / v
                        );
                        let _ = writeln!(out, "{pad}{{");
                        let _ = writeln!(out, "{pad}  const {ty} *pf_at = &{first};");
                        let _ = writeln!(
                            out,
                            "{pad}  if ((((unsigned long long)pf_at) & 15) == 0) {{"
                        );
                        let _ = writeln!(out, "{pad}    #pragma unroll");
                        let _ = writeln!(
                            out,
                            "{pad}    for (int pf_g = 0; pf_g < {}; pf_g++) {b}.v[pf_g] = ((const uint4 *)pf_at)[pf_g];",
                            trips / v
                        );
                        let _ = writeln!(out, "{pad}  }} else {{");
                        let _ = writeln!(out, "{pad}    #pragma unroll");
                        let _ = writeln!(
                            out,
                            "{pad}    for (int pf_l = 0; pf_l < {trips}; pf_l++) {b}.e[pf_l] = pf_at[pf_l];"
                        );
                        let _ = writeln!(out, "{pad}  }}");
                        let _ = writeln!(out, "{pad}}}");
                        printed.insert(first, b.clone());
                        b
                    }
                };
                copies.push(RowCopy {
                    statement: statement.clone(),
                    key,
                    element: format!("{buffer}.e[({iterator}) - {start}]"),
                });
            }
        }
        copies
    }

    /// Whether access `key` of `statement` reads a shared or register
    /// copy here.
    fn promoted(&self, statement: &str, key: &AccessKey) -> bool {
        let pair = (statement.to_string(), key.clone());
        (self.in_scope && self.scope().is_some_and(|s| s.accesses.contains_key(&pair)))
            || (self.in_regs && self.regs.is_some_and(|r| r.accesses.contains(&pair)))
    }
}
