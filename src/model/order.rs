//! The program order as a schedule: what the program means before any
//! transformation. The dependences are computed against it (`deps`), the
//! repair proves its rewrites against it, and the `canonical` strategy
//! runs it as it is.

use super::{ModelStmt, Scop};
use crate::error::Result;
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::isl::{Isl, IslPrint, Schedule};

/// The program-order schedule: a sequence of the statements in body order
/// (a reduction's init before its update), each under one band over its
/// iterators in declaration order. A loop block is one child of the
/// sequence: a band over the block's index (the first iterator of its
/// statements) above the sequence of its own entries, so the order is
/// block position, block index, position within the block, ...
pub fn program_order(isl: &Isl, scop: &Scop) -> Result<Schedule> {
    let stmts: Vec<&ModelStmt> = scop.statements.iter().collect();
    let tree = ScheduleTree {
        domain: scop.domain()?.text(),
        root: canonical_sequence(&scop.param_prefix, &stmts, 0),
    };
    isl.schedule(&tree.to_isl_text())
}

/// The canonical tree of `stmts`, which share their first `depth` blocks.
fn canonical_sequence(p: &str, stmts: &[&ModelStmt], depth: usize) -> Tree {
    let tuple = |s: &ModelStmt| format!("{}[{}]", s.name, s.iterators.join(", "));
    let mut children = Vec::new();
    let mut k = 0;
    while k < stmts.len() {
        let s = stmts[k];
        if let Some(block) = s.blocks.get(depth) {
            let run = stmts[k..]
                .iter()
                .take_while(|t| t.blocks.get(depth).is_some_and(|b| b.id == block.id))
                .count();
            let group = &stmts[k..k + run];
            let member: Vec<String> = group
                .iter()
                .map(|t| format!("{} -> [({})]", tuple(t), t.iterators[depth]))
                .collect();
            let filter: Vec<String> = group.iter().map(|t| tuple(t)).collect();
            let child = Tree::Band(
                Band {
                    schedule: format!("{p}[{{ {} }}]", member.join("; ")),
                    permutable: false,
                    coincident: vec![false],
                },
                Box::new(canonical_sequence(p, group, depth + 1)),
            );
            children.push((format!("{p}{{ {} }}", filter.join("; ")), child));
            k += run;
            continue;
        }
        let tuple = tuple(s);
        let own = &s.iterators[depth..];
        let child = if own.is_empty() {
            Tree::Leaf
        } else {
            let members: Vec<String> = own
                .iter()
                .map(|i| format!("{{ {tuple} -> [({i})] }}"))
                .collect();
            Tree::Band(
                Band {
                    schedule: format!("{p}[{}]", members.join(", ")),
                    permutable: false,
                    coincident: vec![false; own.len()],
                },
                Box::new(Tree::Leaf),
            )
        };
        children.push((format!("{p}{{ {tuple} }}"), child));
        k += 1;
    }
    Tree::Sequence(children)
}
