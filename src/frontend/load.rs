//! The JSON file: keys, parameters, tensor declarations, and the body,
//! statement by statement.

use serde_json::Value;

use super::ast::{DType, LoopBlock, Param, Program, Tensor, TensorRole};
use super::resolve::{self, is_reserved};
use crate::error::{Error, Result};

const KEYS: [&str; 7] = [
    "name", "params", "inputs", "outputs", "temps", "body", "schedule",
];

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

pub fn program(json: &str, source: &str) -> Result<Program> {
    let input = |message: String| Error::Input {
        file: source.to_string(),
        message,
    };
    let v: Value = serde_json::from_str(json).map_err(|e| input(format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| input("the program must be a JSON object".into()))?;
    for k in obj.keys() {
        if !KEYS.contains(&k.as_str()) {
            return Err(input(format!(
                "unknown key `{k}` (expected one of {})",
                KEYS.join(", ")
            )));
        }
    }
    for k in ["name", "params", "inputs", "outputs", "body"] {
        if !obj.contains_key(k) {
            return Err(input(format!("missing required key `{k}`")));
        }
    }
    let name = obj["name"]
        .as_str()
        .filter(|s| is_identifier(s))
        .ok_or_else(|| input("`name` must be an identifier string".into()))?
        .to_string();
    let mut program = Program {
        name,
        source: source.to_string(),
        params: Vec::new(),
        tensors: Vec::new(),
        statements: Vec::new(),
        schedule: obj.get("schedule").cloned(),
        rolling: None,
    };
    let mut seen: Vec<String> = Vec::new();
    let mut claim = |n: &str, what: &str| -> Result<()> {
        if !is_identifier(n) {
            return Err(input(format!("{what} name `{n}` is not an identifier")));
        }
        if is_reserved(n) {
            return Err(input(format!(
                "{what} name `{n}` is reserved (a function, cast or keyword)"
            )));
        }
        if seen.iter().any(|s| s == n) {
            return Err(input(format!("the name `{n}` is declared twice")));
        }
        seen.push(n.to_string());
        Ok(())
    };
    let params = obj["params"]
        .as_object()
        .ok_or_else(|| input("`params` must be an object".into()))?;
    for (n, val) in params {
        claim(n, "parameter")?;
        let value = match val {
            Value::Null => None,
            Value::Number(x) => match x.as_i64() {
                Some(i) if i >= 1 => Some(i),
                _ => {
                    return Err(input(format!(
                        "parameter `{n}` must be a positive integer or null, not {x}"
                    )))
                }
            },
            other => {
                return Err(input(format!(
                    "parameter `{n}` must be a positive integer or null, not {other}"
                )))
            }
        };
        program.params.push(Param {
            name: n.clone(),
            value,
        });
    }
    for (key, role) in [
        ("inputs", TensorRole::Input),
        ("outputs", TensorRole::Output),
        ("temps", TensorRole::Temp),
    ] {
        let Some(section) = obj.get(key) else {
            continue;
        };
        let section = section
            .as_object()
            .ok_or_else(|| input(format!("`{key}` must be an object")))?;
        for (n, decl) in section {
            claim(n, "tensor")?;
            let d = decl.as_object().ok_or_else(|| {
                input(format!(
                    "tensor `{n}` must be an object with dtype and shape"
                ))
            })?;
            if let Some(k) = d.keys().find(|k| *k != "dtype" && *k != "shape") {
                return Err(input(format!("tensor `{n}`: unknown key `{k}`")));
            }
            let dt = d
                .get("dtype")
                .and_then(|x| x.as_str())
                .ok_or_else(|| input(format!("tensor `{n}` needs a dtype")))?;
            let dtype = DType::parse(dt).ok_or_else(|| {
                input(format!(
                    "tensor `{n}`: unknown dtype `{dt}` ({})",
                    DType::ALL.map(DType::name).join(", ")
                ))
            })?;
            let shape = match d.get("shape") {
                None if role == TensorRole::Temp => None,
                None => return Err(input(format!("tensor `{n}` needs a shape"))),
                Some(s) => {
                    let arr = s
                        .as_array()
                        .ok_or_else(|| input(format!("tensor `{n}`: shape must be an array")))?;
                    let mut dims = Vec::new();
                    for e in arr {
                        let a = match e {
                            Value::Number(x) => match x.as_i64() {
                                Some(i) if i >= 1 => super::ast::Affine::constant(i),
                                _ => {
                                    return Err(input(format!(
                                        "tensor `{n}`: extent {x} must be a positive integer"
                                    )))
                                }
                            },
                            Value::String(s) => resolve::shape_entry(&program, s)
                                .map_err(|m| input(format!("tensor `{n}`: {m}")))?,
                            other => {
                                return Err(input(format!("tensor `{n}`: bad extent {other}")))
                            }
                        };
                        dims.push(a);
                    }
                    Some(dims)
                }
            };
            program.tensors.push(Tensor {
                name: n.clone(),
                dtype,
                shape,
                role,
            });
        }
    }
    let body = obj["body"]
        .as_array()
        .ok_or_else(|| input("`body` must be an array of statements".into()))?;
    if body.is_empty() {
        return Err(input("`body` has no statements".into()));
    }
    let mut walk = Walk {
        source,
        blocks: 0,
        statements: 0,
    };
    walk.entries(&mut program, body, &[], "")?;
    Ok(program)
}

/// The walk over `body` and its loop blocks, numbering statements (in file
/// order, from 1 in messages) and blocks (from 0).
struct Walk<'a> {
    source: &'a str,
    blocks: usize,
    statements: usize,
}

impl Walk<'_> {
    /// The entries of one body, inside `blocks`; `path` is the enclosing
    /// blocks' entry numbers for messages (`2.1.`).
    fn entries(
        &mut self,
        program: &mut Program,
        body: &[Value],
        blocks: &[LoopBlock],
        path: &str,
    ) -> Result<()> {
        let source = self.source;
        let input = |message: String| Error::Input {
            file: source.to_string(),
            message,
        };
        for (n, entry) in body.iter().enumerate() {
            let here = format!("{path}{}", n + 1);
            match entry {
                Value::String(text) => {
                    let pos = self.statements;
                    self.statements += 1;
                    statement(program, source, pos, text, blocks)?;
                }
                Value::Object(o) => {
                    let block_err = |what: &str, m: String| {
                        input(format!("body entry {here}, the loop block{what}: {m}"))
                    };
                    if let Some(k) = o.keys().find(|k| *k != "for" && *k != "body") {
                        return Err(block_err(
                            "",
                            format!("unknown key `{k}` (a loop block has `for` and `body`)"),
                        ));
                    }
                    let text = o.get("for").and_then(|v| v.as_str()).ok_or_else(|| {
                        block_err("", "needs `for`, a string `IDX in lo:hi`".into())
                    })?;
                    let what = format!(" `for {text}`");
                    let inner = o.get("body").and_then(|v| v.as_array()).ok_or_else(|| {
                        block_err(&what, "needs `body`, an array of entries".into())
                    })?;
                    if inner.is_empty() {
                        return Err(block_err(&what, "its `body` is empty".into()));
                    }
                    let block = resolve::loop_block(program, text, self.blocks, blocks)
                        .map_err(|m| block_err(&what, m))?;
                    self.blocks += 1;
                    let mut nested = blocks.to_vec();
                    nested.push(block);
                    self.entries(program, inner, &nested, &format!("{here}."))?;
                }
                _ => {
                    return Err(input(format!(
                        "body entry {here} is neither a statement string nor a loop block {{\"for\": \"IDX in lo:hi\", \"body\": [...]}}"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Resolves statement `pos` (from 0), `text`, inside `blocks`, and adds it
/// (and the temp it defines, if any) to `program`.
fn statement(
    program: &mut Program,
    source: &str,
    pos: usize,
    text: &str,
    blocks: &[LoopBlock],
) -> Result<()> {
    let stmt_err = |message: String| Error::Statement {
        file: source.to_string(),
        position: pos + 1,
        text: text.to_string(),
        message,
    };
    let snapshot = program.clone();
    let dtypes = |n: &str| snapshot.tensor(n).map(|t| t.dtype);
    let mut new_temp: Option<Tensor> = None;
    let lhs_dtype = |n: &str, natural: Option<DType>| -> std::result::Result<DType, String> {
        match snapshot.tensor(n) {
            Some(t) if t.role == TensorRole::Input => {
                Err(format!("`{n}` is an input; inputs are read-only"))
            }
            Some(t) => Ok(t.dtype),
            None if snapshot.is_param(n) || is_reserved(n) => {
                Err(format!("`{n}` cannot be written: it is not a tensor"))
            }
            None => Ok(natural.unwrap_or(DType::F32)),
        }
    };
    let st =
        resolve::statement(&snapshot, pos, text, blocks, &dtypes, &lhs_dtype).map_err(stmt_err)?;
    if program.tensor(&st.lhs_tensor).is_none() {
        if !is_identifier(&st.lhs_tensor) {
            return Err(stmt_err(format!(
                "`{}` is not a valid tensor name",
                st.lhs_tensor
            )));
        }
        let natural = match st.rhs.ty {
            super::ast::ExprType::Num(t) => t,
            super::ast::ExprType::Bool => DType::F32,
        };
        new_temp = Some(Tensor {
            name: st.lhs_tensor.clone(),
            dtype: natural,
            shape: None,
            role: TensorRole::Temp,
        });
    }
    program.tensors.extend(new_temp);
    check_inferred_ranks(program, &st).map_err(stmt_err)?;
    program.statements.push(st);
    Ok(())
}

/// Every access of a tensor whose shape is inferred (a temp without
/// `shape`) has as many subscripts as the left side of the first statement
/// that writes it (declared shapes are checked as the statement is
/// resolved). `st` is the statement being added; the earlier ones are in
/// `program`.
fn check_inferred_ranks(
    program: &Program,
    st: &super::ast::Statement,
) -> std::result::Result<(), String> {
    let rank_of = |tensor: &str| -> Option<usize> {
        if program.tensor(tensor)?.shape.is_some() {
            return None;
        }
        program
            .statements
            .iter()
            .chain(std::iter::once(st))
            .find(|s| s.lhs_tensor == tensor)
            .map(|s| s.lhs_indices.len())
    };
    let mut accesses = vec![(st.lhs_tensor.clone(), st.lhs_indices.len(), "written")];
    let mut reads = Vec::new();
    super::ast::collect_reads(&st.rhs, &mut reads);
    accesses.extend(reads.into_iter().map(|(t, subs)| (t, subs.len(), "read")));
    for (tensor, n, how) in accesses {
        if let Some(rank) = rank_of(&tensor) {
            if rank != n {
                return Err(format!(
                    "tensor `{tensor}` has {rank} dimensions (as its first statement writes it) but is {how} with {n}"
                ));
            }
        }
    }
    Ok(())
}
