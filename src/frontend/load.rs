//! The JSON file: keys, parameters, tensor declarations, and the body,
//! statement by statement. Serde reads the file's structure (the keys,
//! unknown ones refused, and their JSON types) into [`File`]; this module
//! checks what the types cannot say (identifiers, positive sizes, dtypes,
//! shapes, statements). Every error names the file, the key and the
//! reason, with the line and column where serde has them.

use std::fmt;
use std::marker::PhantomData;

use indexmap::IndexMap;
use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ast::{DType, LoopBlock, Param, Program, Tensor, TensorRole};
use super::resolve::{self, is_reserved};
use crate::error::{Error, Result};

/// The program file as written (spec, "Keys"). Maps keep file order,
/// which is the order of the parameters and tensors.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    params: IndexMap<String, Option<i64>>,
    inputs: IndexMap<String, Object<TensorDecl>>,
    outputs: IndexMap<String, Object<TensorDecl>>,
    #[serde(default)]
    temps: IndexMap<String, Object<TensorDecl>>,
    /// Entries stay JSON: a statement string or a loop block, told apart
    /// and numbered for messages by [`Walk`].
    body: Vec<Value>,
    /// Kept as written, `null` included (`repair::directive` judges it).
    #[serde(default, deserialize_with = "present")]
    schedule: Option<Value>,
}

/// A tensor's declaration; the shape's entries are integers or affine
/// text, checked by [`extent`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorDecl {
    dtype: String,
    shape: Option<Vec<Value>>,
}

/// A loop block, `{"for": "IDX in lo:hi", "body": [...]}`; both keys are
/// checked by [`Walk`], whose messages say what each should be.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockDecl {
    #[serde(rename = "for")]
    range: Option<String>,
    body: Option<Vec<Value>>,
}

/// `T` read from a JSON object only: a derived struct also accepts an
/// array of its fields in order, which the format does not allow.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(PhantomData)).map(Object)
    }
}

fn present<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Serde's reason in the spec's words: a key, not a field.
fn reason(e: &serde_json::Error) -> String {
    let m = e.to_string();
    if let Some(rest) = m.strip_prefix("unknown field") {
        format!("unknown key{rest}")
    } else if let Some(rest) = m.strip_prefix("missing field") {
        format!("missing required key{rest}")
    } else {
        m
    }
}

/// The message for a structural error at `path`: what the key there is
/// (a parameter, a tensor, or the key itself), then serde's reason.
fn structural(path: &serde_path_to_error::Path, e: &serde_json::Error) -> String {
    use serde_path_to_error::Segment;
    let mut keys: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Segment::Map { key } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    // An unknown key's path ends at that key, which the reason names.
    if e.to_string().starts_with("unknown field") {
        keys.pop();
    }
    let what = match keys[..] {
        [] => return reason(e),
        ["params", n, ..] => format!("parameter `{n}`"),
        ["inputs" | "outputs" | "temps", n, ..] => format!("tensor `{n}`"),
        [k, ..] => format!("`{k}`"),
    };
    format!("{what}: {}", reason(e))
}

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
    let mut de = serde_json::Deserializer::from_str(json);
    let Object::<File>(file) = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = e.inner();
        input(if inner.is_syntax() || inner.is_eof() {
            format!("not valid JSON: {inner}")
        } else {
            structural(e.path(), inner)
        })
    })?;
    de.end()
        .map_err(|e| input(format!("not valid JSON: {e}")))?;
    if !is_identifier(&file.name) {
        return Err(input("`name` must be an identifier string".into()));
    }
    let mut program = Program {
        name: file.name,
        source: source.to_string(),
        params: Vec::new(),
        tensors: Vec::new(),
        statements: Vec::new(),
        schedule: file.schedule,
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
    for (n, value) in file.params {
        claim(&n, "parameter")?;
        if let Some(v) = value.filter(|v| *v < 1) {
            return Err(input(format!(
                "parameter `{n}` must be a positive integer or null, not {v}"
            )));
        }
        program.params.push(Param { name: n, value });
    }
    for (section, role) in [
        (file.inputs, TensorRole::Input),
        (file.outputs, TensorRole::Output),
        (file.temps, TensorRole::Temp),
    ] {
        for (n, Object(decl)) in section {
            claim(&n, "tensor")?;
            let dtype = DType::parse(&decl.dtype).ok_or_else(|| {
                input(format!(
                    "tensor `{n}`: unknown dtype `{}` ({})",
                    decl.dtype,
                    DType::ALL.map(DType::name).join(", ")
                ))
            })?;
            let shape = match decl.shape {
                None if role == TensorRole::Temp => None,
                None => return Err(input(format!("tensor `{n}` needs a shape"))),
                Some(dims) => Some(
                    dims.iter()
                        .map(|e| {
                            extent(&program, e).map_err(|m| input(format!("tensor `{n}`: {m}")))
                        })
                        .collect::<Result<_>>()?,
                ),
            };
            program.tensors.push(Tensor {
                name: n,
                dtype,
                shape,
                role,
            });
        }
    }
    if file.body.is_empty() {
        return Err(input("`body` has no statements".into()));
    }
    let mut walk = Walk {
        source,
        blocks: 0,
        statements: 0,
    };
    walk.entries(&mut program, &file.body, &[], "")?;
    Ok(program)
}

/// One entry of a tensor's shape: a positive integer, or affine text in
/// the parameters declared so far.
fn extent(program: &Program, e: &Value) -> std::result::Result<super::ast::Affine, String> {
    match e {
        Value::Number(x) => match x.as_i64() {
            Some(i) if i >= 1 => Ok(super::ast::Affine::constant(i)),
            _ => Err(format!("extent {x} must be a positive integer")),
        },
        Value::String(s) => resolve::shape_entry(program, s),
        other => Err(format!("bad extent {other}")),
    }
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
                Value::Object(_) => {
                    let block_err = |what: &str, m: String| {
                        input(format!("body entry {here}, the loop block{what}: {m}"))
                    };
                    let decl = BlockDecl::deserialize(entry)
                        .map_err(|e| block_err("", reason(&e)))?;
                    let text = decl.range.ok_or_else(|| {
                        block_err("", "needs `for`, a string `IDX in lo:hi`".into())
                    })?;
                    let what = format!(" `for {text}`");
                    let inner = decl.body.ok_or_else(|| {
                        block_err(&what, "needs `body`, an array of entries".into())
                    })?;
                    if inner.is_empty() {
                        return Err(block_err(&what, "its `body` is empty".into()));
                    }
                    let block = resolve::loop_block(program, &text, self.blocks, blocks)
                        .map_err(|m| block_err(&what, m))?;
                    self.blocks += 1;
                    let mut nested = blocks.to_vec();
                    nested.push(block);
                    self.entries(program, &inner, &nested, &format!("{here}."))?;
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
