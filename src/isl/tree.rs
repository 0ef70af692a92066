//! A plain-Rust copy of an isl schedule tree.
//!
//! isl's tree is convenient to compute (scheduling, tiling) but awkward to
//! restructure; this copy is what polyfuse restructures (sinking point
//! loops), prints, and serialises to JSON. Partial schedules and filters are
//! kept as isl text, so the tree can be read back into isl exactly
//! ([`ScheduleTree::to_isl_text`]).

use std::fmt::{self, Write};

use super::{IslPrint, ScheduleNode, ScheduleNodeType};
use crate::error::{Error, Result};

/// A band: a partial schedule `[{ S[i] -> [(f(i))] }, ...]` (isl text of a
/// multi-union-pw-aff) with its member properties.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub schedule: String,
    pub permutable: bool,
    pub coincident: Vec<bool>,
}

/// Serialised as [`Node`] (`--emit json` and the cache).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "Node", from = "Node")]
pub enum Tree {
    Leaf,
    Band(Band, Box<Tree>),
    /// Children run one after the other, each on the instances of its filter.
    Sequence(Vec<(String, Tree)>),
    /// Children in any order.
    Set(Vec<(String, Tree)>),
    /// A named annotation: `tile` above a tile band, `point` above a point
    /// band.
    Mark(String, Box<Tree>),
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScheduleTree {
    /// The domain (isl union-set text).
    pub domain: String,
    pub root: Tree,
}

impl ScheduleTree {
    /// Copies an isl tree, starting at its root (a domain node).
    pub fn from_isl(root: &ScheduleNode) -> Result<ScheduleTree> {
        if root.get_type()? != ScheduleNodeType::Domain {
            return Err(Error::Internal("schedule tree root is not a domain".into()));
        }
        let domain = root.domain_get_domain()?.text();
        let root = if root.n_children()? > 0 {
            copy_node(root.copy()?.child(0)?)?
        } else {
            Tree::Leaf
        };
        Ok(ScheduleTree { domain, root })
    }

    /// isl's YAML-like text of the tree, which `isl_schedule_read_from_str`
    /// reads back.
    pub fn to_isl_text(&self) -> String {
        let mut s = format!("{{ domain: \"{}\"", self.domain);
        if self.root != Tree::Leaf {
            s.push_str(", child: ");
            write_isl(&self.root, &mut s);
        }
        s.push_str(" }");
        s
    }
}

fn copy_node(node: ScheduleNode) -> Result<Tree> {
    let ty = node.get_type()?;
    let n = node.n_children()?;
    let first_child = |node: &ScheduleNode| -> Result<Tree> {
        if n == 0 {
            Ok(Tree::Leaf)
        } else {
            copy_node(node.copy()?.child(0)?)
        }
    };
    Ok(match ty {
        ScheduleNodeType::Leaf => Tree::Leaf,
        ScheduleNodeType::Band => {
            let members = node.band_n_member()?;
            let band = Band {
                schedule: node.band_get_partial_schedule()?.text(),
                permutable: node.band_get_permutable()?,
                coincident: (0..members)
                    .map(|i| node.band_member_get_coincident(i))
                    .collect::<std::result::Result<_, _>>()?,
            };
            Tree::Band(band, Box::new(first_child(&node)?))
        }
        ScheduleNodeType::Sequence | ScheduleNodeType::Set => {
            let mut children = Vec::new();
            for i in 0..n {
                let f = node.copy()?.child(i)?;
                if f.get_type()? != ScheduleNodeType::Filter {
                    return Err(Error::Internal("sequence child is not a filter".into()));
                }
                let filter = f.filter_get_filter()?.text();
                let sub = if f.n_children()? > 0 {
                    copy_node(f.child(0)?)?
                } else {
                    Tree::Leaf
                };
                children.push((filter, sub));
            }
            if ty == ScheduleNodeType::Sequence {
                Tree::Sequence(children)
            } else {
                Tree::Set(children)
            }
        }
        ScheduleNodeType::Mark => {
            let id = node.mark_get_id()?;
            let name = id.get_name()?.to_string();
            Tree::Mark(name, Box::new(first_child(&node)?))
        }
        ScheduleNodeType::Filter => first_child(&node)?,
        other => {
            return Err(Error::Internal(format!(
                "unsupported schedule node {other:?}"
            )))
        }
    })
}

fn write_isl(t: &Tree, s: &mut String) {
    match t {
        Tree::Leaf => s.push_str("{ leaf }"),
        Tree::Band(b, child) => {
            let flags: Vec<&str> = b
                .coincident
                .iter()
                .map(|c| if *c { "1" } else { "0" })
                .collect();
            let _ = write!(
                s,
                "{{ schedule: \"{}\", permutable: {}, coincident: [ {} ]",
                b.schedule,
                b.permutable as i32,
                flags.join(", ")
            );
            if **child != Tree::Leaf {
                s.push_str(", child: ");
                write_isl(child, s);
            }
            s.push_str(" }");
        }
        Tree::Sequence(ch) | Tree::Set(ch) => {
            let key = if matches!(t, Tree::Sequence(_)) {
                "sequence"
            } else {
                "set"
            };
            let _ = write!(s, "{{ {key}: [ ");
            for (i, (f, c)) in ch.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                let _ = write!(s, "{{ filter: \"{f}\"");
                if *c != Tree::Leaf {
                    s.push_str(", child: ");
                    write_isl(c, s);
                }
                s.push_str(" }");
            }
            s.push_str(" ] }");
        }
        Tree::Mark(name, child) => {
            let _ = write!(s, "{{ mark: \"{name}\"");
            if **child != Tree::Leaf {
                s.push_str(", child: ");
                write_isl(child, s);
            }
            s.push_str(" }");
        }
    }
}

/// A tree node as JSON, each kind named by its key: `{"leaf": true}`,
/// `{"band": schedule, "permutable", "coincident", "child"}`,
/// `{"sequence" | "set": [{"filter", "child"}...]}`, `{"mark", "child"}`.
/// The keys tell the kinds apart, hence untagged.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Node {
    Leaf {
        leaf: bool,
    },
    Band {
        band: String,
        permutable: bool,
        coincident: Vec<bool>,
        child: Box<Tree>,
    },
    Sequence {
        sequence: Vec<Filtered>,
    },
    Set {
        set: Vec<Filtered>,
    },
    Mark {
        mark: String,
        child: Box<Tree>,
    },
}

/// A child of a sequence or set node, under its filter.
#[derive(serde::Serialize, serde::Deserialize)]
struct Filtered {
    filter: String,
    child: Tree,
}

impl From<Tree> for Node {
    fn from(t: Tree) -> Node {
        let filtered = |c: Vec<(String, Tree)>| {
            c.into_iter()
                .map(|(filter, child)| Filtered { filter, child })
                .collect()
        };
        match t {
            Tree::Leaf => Node::Leaf { leaf: true },
            Tree::Band(b, child) => Node::Band {
                band: b.schedule,
                permutable: b.permutable,
                coincident: b.coincident,
                child,
            },
            Tree::Sequence(c) => Node::Sequence {
                sequence: filtered(c),
            },
            Tree::Set(c) => Node::Set { set: filtered(c) },
            Tree::Mark(mark, child) => Node::Mark { mark, child },
        }
    }
}

impl From<Node> for Tree {
    fn from(n: Node) -> Tree {
        let pairs = |c: Vec<Filtered>| c.into_iter().map(|f| (f.filter, f.child)).collect();
        match n {
            Node::Leaf { .. } => Tree::Leaf,
            Node::Band {
                band,
                permutable,
                coincident,
                child,
            } => Tree::Band(
                Band {
                    schedule: band,
                    permutable,
                    coincident,
                },
                child,
            ),
            Node::Sequence { sequence } => Tree::Sequence(pairs(sequence)),
            Node::Set { set } => Tree::Set(pairs(set)),
            Node::Mark { mark, child } => Tree::Mark(mark, child),
        }
    }
}

/// An indented, human-readable rendering (`polyfuse schedule FILE`).
impl fmt::Display for ScheduleTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "domain: {}", self.domain)?;
        display(&self.root, 1, f)
    }
}

fn display(t: &Tree, depth: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let pad = "  ".repeat(depth);
    match t {
        Tree::Leaf => Ok(()),
        Tree::Band(b, c) => {
            let flags: Vec<&str> = b
                .coincident
                .iter()
                .map(|c| if *c { "1" } else { "0" })
                .collect();
            writeln!(
                f,
                "{pad}band{} coincident [{}]: {}",
                if b.permutable { " permutable" } else { "" },
                flags.join(", "),
                b.schedule
            )?;
            display(c, depth + 1, f)
        }
        Tree::Sequence(ch) | Tree::Set(ch) => {
            writeln!(
                f,
                "{pad}{}",
                if matches!(t, Tree::Sequence(_)) {
                    "sequence"
                } else {
                    "set"
                }
            )?;
            for (flt, c) in ch {
                writeln!(f, "{pad}  filter: {flt}")?;
                display(c, depth + 2, f)?;
            }
            Ok(())
        }
        Tree::Mark(n, c) => {
            writeln!(f, "{pad}mark: {n}")?;
            display(c, depth + 1, f)
        }
    }
}
