//! A plain copy of isl's AST (the loops isl's AST builder generated from the
//! final schedule tree, and expressions isl built from quasi-affine
//! functions). The gpu stage keeps its bounds and guards in this form, and
//! the printers for C and CUDA work on it and never call isl.

use super::{ast_node_type, val_to_i64, ASTExpr, ASTExprOpType, ASTExprType, ASTNode, ASTNodeType};
use crate::error::{Error, Result};

/// Stored (in the cache) untagged: an integer, an identifier's string,
/// or `[op, [args...]]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Expr {
    Int(i64),
    Id(String),
    Op(Op, Vec<Expr>),
}

impl Expr {
    /// The identifiers the expression names, in order, with repeats.
    pub fn ids(&self) -> Vec<String> {
        match self {
            Expr::Id(s) => vec![s.clone()],
            Expr::Op(_, args) => args.iter().flat_map(|a| a.ids()).collect(),
            Expr::Int(_) => Vec::new(),
        }
    }

    /// Whether the expression names identifier `name` anywhere.
    pub fn mentions(&self, name: &str) -> bool {
        match self {
            Expr::Id(s) => s == name,
            Expr::Op(_, args) => args.iter().any(|a| a.mentions(name)),
            Expr::Int(_) => false,
        }
    }

    /// The expression with each identifier for which `by` gives an
    /// expression replaced by it (the others kept).
    pub fn replace_ids(&self, by: &dyn Fn(&str) -> Option<Expr>) -> Expr {
        match self {
            Expr::Id(s) => by(s).unwrap_or_else(|| self.clone()),
            Expr::Op(op, args) => Expr::Op(*op, args.iter().map(|a| a.replace_ids(by)).collect()),
            Expr::Int(_) => self.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    And,
    Or,
    Max,
    Min,
    Neg,
    Add,
    Sub,
    Mul,
    /// Exact division.
    Div,
    /// Floor division (the divisor is positive).
    FloorDiv,
    /// Division of a non-negative dividend.
    PosDiv,
    /// Remainder of a non-negative dividend.
    PosRem,
    /// Remainder that is only compared with zero.
    ZeroRem,
    Select,
    Eq,
    Le,
    Lt,
    Ge,
    Gt,
    Call,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    For {
        iterator: String,
        init: Expr,
        cond: Expr,
        inc: Expr,
        body: Box<Node>,
    },
    If {
        cond: Expr,
        then: Box<Node>,
        otherwise: Option<Box<Node>>,
    },
    Block(Vec<Node>),
    /// One statement instance: `S3(args...)`, where `args` give the
    /// statement's iterators as expressions of the loop iterators.
    User {
        statement: String,
        args: Vec<Expr>,
    },
    Mark {
        name: String,
        body: Box<Node>,
    },
}

impl Node {
    /// The nodes directly inside this one, in order.
    pub fn children(&self) -> Vec<&Node> {
        match self {
            Node::For { body, .. } | Node::Mark { body, .. } => vec![body],
            Node::If {
                then, otherwise, ..
            } => std::iter::once(then.as_ref())
                .chain(otherwise.as_deref())
                .collect(),
            Node::Block(v) => v.iter().collect(),
            Node::User { .. } => Vec::new(),
        }
    }
}

pub fn from_isl(node: &ASTNode) -> Result<Node> {
    Ok(match ast_node_type(node) {
        ASTNodeType::For => Node::For {
            iterator: match expr_from_isl(&node.for_get_iterator()?)? {
                Expr::Id(s) => s,
                _ => return Err(Error::Internal("for iterator is not an id".into())),
            },
            init: expr_from_isl(&node.for_get_init()?)?,
            cond: expr_from_isl(&node.for_get_cond()?)?,
            inc: expr_from_isl(&node.for_get_inc()?)?,
            body: Box::new(from_isl(&node.for_get_body()?)?),
        },
        ASTNodeType::If => Node::If {
            cond: expr_from_isl(&node.if_get_cond()?)?,
            then: Box::new(from_isl(&node.if_get_then_node()?)?),
            otherwise: if node.if_has_else_node()? {
                Some(Box::new(from_isl(&node.if_get_else_node()?)?))
            } else {
                None
            },
        },
        ASTNodeType::Block => {
            let list = node.block_get_children()?;
            let n = list.size()?;
            let mut v = Vec::new();
            for i in 0..n {
                v.push(from_isl(&list.get_at(i)?)?);
            }
            Node::Block(v)
        }
        ASTNodeType::User => {
            let call = expr_from_isl(&node.user_get_expr()?)?;
            match call {
                Expr::Op(Op::Call, mut args) if !args.is_empty() => {
                    let name = match args.remove(0) {
                        Expr::Id(s) => s,
                        _ => return Err(Error::Internal("user node without a name".into())),
                    };
                    Node::User {
                        statement: name,
                        args,
                    }
                }
                _ => return Err(Error::Internal("user node is not a call".into())),
            }
        }
        ASTNodeType::Mark => Node::Mark {
            name: node.mark_get_id()?.get_name()?.to_string(),
            body: Box::new(from_isl(&node.mark_get_node()?)?),
        },
        ASTNodeType::Error => return Err(Error::Internal("isl AST error node".into())),
    })
}

pub fn expr_from_isl(e: &ASTExpr) -> Result<Expr> {
    Ok(match e.get_type()? {
        ASTExprType::Int => Expr::Int(val_to_i64(&e.int_get_val()?)?),
        ASTExprType::Id => Expr::Id(e.id_get_id()?.get_name()?.to_string()),
        ASTExprType::Op => {
            let n = e.get_op_n_arg()?;
            let mut args = Vec::new();
            for i in 0..n {
                args.push(expr_from_isl(&e.get_op_arg(i)?)?);
            }
            let op = match e.get_op_type()? {
                ASTExprOpType::And | ASTExprOpType::AndThen => Op::And,
                ASTExprOpType::Or | ASTExprOpType::OrElse => Op::Or,
                ASTExprOpType::Max => Op::Max,
                ASTExprOpType::Min => Op::Min,
                ASTExprOpType::Minus => Op::Neg,
                ASTExprOpType::Add => Op::Add,
                ASTExprOpType::Sub => Op::Sub,
                ASTExprOpType::Mul => Op::Mul,
                ASTExprOpType::Div => Op::Div,
                ASTExprOpType::FdivQ => Op::FloorDiv,
                ASTExprOpType::PdivQ => Op::PosDiv,
                ASTExprOpType::PdivR => Op::PosRem,
                ASTExprOpType::ZdivR => Op::ZeroRem,
                ASTExprOpType::Cond | ASTExprOpType::Select => Op::Select,
                ASTExprOpType::Eq => Op::Eq,
                ASTExprOpType::Le => Op::Le,
                ASTExprOpType::Lt => Op::Lt,
                ASTExprOpType::Ge => Op::Ge,
                ASTExprOpType::Gt => Op::Gt,
                ASTExprOpType::Call => Op::Call,
                other => {
                    return Err(Error::Internal(format!(
                        "unsupported isl AST operator {other:?}"
                    )))
                }
            };
            Expr::Op(op, args)
        }
        ASTExprType::Error => return Err(Error::Internal("isl AST expression error".into())),
    })
}

/// C text of an index expression; `rename` maps isl identifiers (loop
/// iterators, parameters) to C names.
pub fn c_expr(e: &Expr, rename: &dyn Fn(&str) -> String) -> String {
    let bin = |op: &str, a: &[Expr]| -> String {
        let parts: Vec<String> = a.iter().map(|x| c_expr(x, rename)).collect();
        format!("({})", parts.join(&format!(" {op} ")))
    };
    let nest = |f: &str, a: &[Expr]| -> String {
        let mut it = a.iter().map(|x| c_expr(x, rename));
        let first = it.next().unwrap_or_default();
        it.fold(first, |acc, x| format!("{f}({acc}, {x})"))
    };
    match e {
        Expr::Int(v) => v.to_string(),
        Expr::Id(s) => rename(s),
        Expr::Op(op, a) => match op {
            Op::And => bin("&&", a),
            Op::Or => bin("||", a),
            Op::Max => nest("pf_max", a),
            Op::Min => nest("pf_min", a),
            Op::Neg => format!("(-{})", c_expr(&a[0], rename)),
            Op::Add => bin("+", a),
            Op::Sub => bin("-", a),
            Op::Mul => bin("*", a),
            Op::Div | Op::PosDiv => bin("/", a),
            Op::FloorDiv => nest("pf_floord", a),
            Op::PosRem | Op::ZeroRem => bin("%", a),
            Op::Select => format!(
                "({} ? {} : {})",
                c_expr(&a[0], rename),
                c_expr(&a[1], rename),
                c_expr(&a[2], rename)
            ),
            Op::Eq => bin("==", a),
            Op::Le => bin("<=", a),
            Op::Lt => bin("<", a),
            Op::Ge => bin(">=", a),
            Op::Gt => bin(">", a),
            Op::Call => {
                let f = c_expr(&a[0], rename);
                let args: Vec<String> = a[1..].iter().map(|x| c_expr(x, rename)).collect();
                format!("{f}({})", args.join(", "))
            }
        },
    }
}
