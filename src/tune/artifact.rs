//! A compiled program as JSON, for the cache: everything of
//! [`Compiled`] but the program itself (the caller has it), so that a cache
//! hit rebuilds a `Compiled` without isl. Written and read here, from the
//! public fields, so the compiler's types need no serde.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::frontend::ast::{Affine, DType, Program, TensorRole};
use crate::gpu::{CudaProgram, HostLoop, Kernel, KernelArg};
use crate::isl::ast::{Expr, Op};
use crate::isl::tree::{Band, ScheduleTree, Tree};
use crate::model::ModelTensor;
use crate::pipeline::Compiled;
use crate::schedule::host::HostStep;

/// Version of the artifact format; an artifact of another version is a
/// miss. 2: `reference_c` also defines the declared-precision run
/// `pf_declared`, which the harness calls.
pub const VERSION: i64 = 2;

pub fn to_json(c: &Compiled) -> Value {
    json!({
        "version": VERSION,
        "tensors": c.tensors.iter().map(tensor_json).collect::<Vec<_>>(),
        "tree": tree_json(&c.tree),
        "untiled_tree": tree_json(&c.untiled_tree),
        "deps_text": c.deps_text,
        "deps_json": c.deps_json,
        "model_json": c.model_json,
        "kernel_c": c.kernel_c,
        "reference_c": c.reference_c,
        "gpu_tree": c.gpu_tree.as_ref().map(tree_json),
        "cuda": c.cuda.as_ref().map(cuda_json),
        "emulation_c": c.emulation_c,
    })
}

/// The compiled program of `program` from its artifact.
pub fn from_json(program: &Program, v: &Value) -> Result<Compiled> {
    if v["version"].as_i64() != Some(VERSION) {
        return Err(bad("an artifact of another version"));
    }
    Ok(Compiled {
        program: program.clone(),
        tensors: arr(&v["tensors"])?
            .iter()
            .map(tensor_from)
            .collect::<Result<_>>()?,
        tree: tree_from(&v["tree"])?,
        untiled_tree: tree_from(&v["untiled_tree"])?,
        deps_text: string(&v["deps_text"])?,
        deps_json: v["deps_json"].clone(),
        model_json: v["model_json"].clone(),
        kernel_c: string(&v["kernel_c"])?,
        reference_c: opt_string(&v["reference_c"])?,
        gpu_estimate: None,
        gpu_notes: Vec::new(),
        timings: Vec::new(),
        gpu_tree: match &v["gpu_tree"] {
            Value::Null => None,
            t => Some(tree_from(t)?),
        },
        cuda: match &v["cuda"] {
            Value::Null => None,
            c => Some(cuda_from(c)?),
        },
        emulation_c: opt_string(&v["emulation_c"])?,
    })
}

fn bad(what: &str) -> Error {
    Error::Internal(format!("cache artifact: {what}"))
}

fn arr(v: &Value) -> Result<&Vec<Value>> {
    v.as_array().ok_or_else(|| bad("an array expected"))
}

fn string(v: &Value) -> Result<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| bad("a string expected"))
}

fn opt_string(v: &Value) -> Result<Option<String>> {
    match v {
        Value::Null => Ok(None),
        _ => string(v).map(Some),
    }
}

fn int(v: &Value) -> Result<i64> {
    v.as_i64().ok_or_else(|| bad("an integer expected"))
}

fn role_name(r: TensorRole) -> &'static str {
    match r {
        TensorRole::Input => "input",
        TensorRole::Output => "output",
        TensorRole::Temp => "temp",
    }
}

fn role_from(s: &str) -> Result<TensorRole> {
    Ok(match s {
        "input" => TensorRole::Input,
        "output" => TensorRole::Output,
        "temp" => TensorRole::Temp,
        _ => return Err(bad("a tensor role")),
    })
}

fn affine_json(a: &Affine) -> Value {
    json!({ "terms": a.terms, "constant": a.constant })
}

fn affine_from(v: &Value) -> Result<Affine> {
    let mut terms = BTreeMap::new();
    for (k, c) in v["terms"].as_object().ok_or_else(|| bad("affine terms"))? {
        terms.insert(k.clone(), int(c)?);
    }
    Ok(Affine {
        terms,
        constant: int(&v["constant"])?,
    })
}

fn dtype_from(v: &Value) -> Result<DType> {
    v.as_str()
        .and_then(DType::parse)
        .ok_or_else(|| bad("a dtype"))
}

fn tensor_json(t: &ModelTensor) -> Value {
    json!({
        "name": t.name,
        "dtype": t.dtype.name(),
        "role": role_name(t.role),
        "shape": t.shape.iter().map(affine_json).collect::<Vec<_>>(),
    })
}

fn tensor_from(v: &Value) -> Result<ModelTensor> {
    Ok(ModelTensor {
        name: string(&v["name"])?,
        dtype: dtype_from(&v["dtype"])?,
        role: role_from(v["role"].as_str().unwrap_or(""))?,
        shape: arr(&v["shape"])?
            .iter()
            .map(affine_from)
            .collect::<Result<_>>()?,
    })
}

fn tree_json(t: &ScheduleTree) -> Value {
    json!({ "domain": t.domain, "root": node_json(&t.root) })
}

fn tree_from(v: &Value) -> Result<ScheduleTree> {
    Ok(ScheduleTree {
        domain: string(&v["domain"])?,
        root: node_from(&v["root"])?,
    })
}

fn node_json(t: &Tree) -> Value {
    let children = |c: &Vec<(String, Tree)>| {
        c.iter()
            .map(|(f, t)| json!([f, node_json(t)]))
            .collect::<Vec<_>>()
    };
    match t {
        Tree::Leaf => json!("leaf"),
        Tree::Band(b, child) => json!({
            "band": { "schedule": b.schedule, "permutable": b.permutable, "coincident": b.coincident },
            "child": node_json(child),
        }),
        Tree::Sequence(c) => json!({ "sequence": children(c) }),
        Tree::Set(c) => json!({ "set": children(c) }),
        Tree::Mark(name, child) => json!({ "mark": name, "child": node_json(child) }),
    }
}

fn node_from(v: &Value) -> Result<Tree> {
    if v.as_str() == Some("leaf") {
        return Ok(Tree::Leaf);
    }
    let children = |c: &Value| -> Result<Vec<(String, Tree)>> {
        arr(c)?
            .iter()
            .map(|p| Ok((string(&p[0])?, node_from(&p[1])?)))
            .collect()
    };
    if let Some(b) = v.get("band") {
        let coincident = arr(&b["coincident"])?
            .iter()
            .map(|x| x.as_bool().ok_or_else(|| bad("a coincident flag")))
            .collect::<Result<_>>()?;
        return Ok(Tree::Band(
            Band {
                schedule: string(&b["schedule"])?,
                permutable: b["permutable"].as_bool().ok_or_else(|| bad("permutable"))?,
                coincident,
            },
            Box::new(node_from(&v["child"])?),
        ));
    }
    if let Some(c) = v.get("sequence") {
        return Ok(Tree::Sequence(children(c)?));
    }
    if let Some(c) = v.get("set") {
        return Ok(Tree::Set(children(c)?));
    }
    if let Some(m) = v.get("mark") {
        return Ok(Tree::Mark(string(m)?, Box::new(node_from(&v["child"])?)));
    }
    Err(bad("a schedule tree node"))
}

const OPS: &[Op] = &[
    Op::And,
    Op::Or,
    Op::Max,
    Op::Min,
    Op::Neg,
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Div,
    Op::FloorDiv,
    Op::PosDiv,
    Op::PosRem,
    Op::ZeroRem,
    Op::Select,
    Op::Eq,
    Op::Le,
    Op::Lt,
    Op::Ge,
    Op::Gt,
    Op::Call,
];

fn expr_json(e: &Expr) -> Value {
    match e {
        Expr::Int(v) => json!(v),
        Expr::Id(s) => json!(s),
        Expr::Op(op, args) => json!({
            "op": format!("{op:?}"),
            "args": args.iter().map(expr_json).collect::<Vec<_>>(),
        }),
    }
}

fn expr_from(v: &Value) -> Result<Expr> {
    match v {
        Value::Number(_) => Ok(Expr::Int(int(v)?)),
        Value::String(s) => Ok(Expr::Id(s.clone())),
        _ => {
            let name = v["op"].as_str().unwrap_or("");
            let op = OPS
                .iter()
                .copied()
                .find(|o| format!("{o:?}") == name)
                .ok_or_else(|| bad("an operator"))?;
            let args = arr(&v["args"])?
                .iter()
                .map(expr_from)
                .collect::<Result<_>>()?;
            Ok(Expr::Op(op, args))
        }
    }
}

fn cuda_json(c: &CudaProgram) -> Value {
    json!({
        "source": c.source,
        "kernels": c.kernels.iter().map(|k| json!({
            "name": k.name,
            "grid": k.grid.iter().map(expr_json).collect::<Vec<_>>(),
            "block": k.block,
            "dynamic_shared": k.dynamic_shared,
            "dependent": k.dependent,
            "static_shared": k.static_shared,
            "globals": k.globals,
        })).collect::<Vec<_>>(),
        "args": c.args.iter().map(|a| match a {
            KernelArg::Tensor { name, dtype, shape } =>
                json!({ "tensor": name, "dtype": dtype.name(), "shape": shape }),
            KernelArg::Param { name } => json!({ "param": name }),
            KernelArg::Step { name } => json!({ "step": name }),
        }).collect::<Vec<_>>(),
        "host_loops": c.host_loops.iter().map(|l| json!({
            "step": l.step.mark(),
            "iterator": l.iterator,
            "init": expr_json(&l.init),
            "cond": expr_json(&l.cond),
            "inc": expr_json(&l.inc),
            "first": l.first,
            "end": l.end,
        })).collect::<Vec<_>>(),
    })
}

/// The host loops of a stored program (none in artifacts older than them).
fn host_loops_from(v: &Value) -> Result<Vec<HostLoop>> {
    let Some(loops) = v.get("host_loops") else {
        return Ok(Vec::new());
    };
    arr(loops)?
        .iter()
        .map(|l| {
            let index = |x: &Value| -> Result<usize> {
                usize::try_from(int(x)?).map_err(|_| bad("a host loop's kernels"))
            };
            Ok(HostLoop {
                step: HostStep::from_mark(&string(&l["step"])?)
                    .ok_or_else(|| bad("a host loop's step"))?,
                iterator: string(&l["iterator"])?,
                init: expr_from(&l["init"])?,
                cond: expr_from(&l["cond"])?,
                inc: expr_from(&l["inc"])?,
                first: index(&l["first"])?,
                end: index(&l["end"])?,
            })
        })
        .collect()
}

fn cuda_from(v: &Value) -> Result<CudaProgram> {
    // Entries written before kernels listed the tensors they touch count
    // every tensor (see `Kernel::globals`).
    let every_tensor: Vec<String> = arr(&v["args"])?
        .iter()
        .filter_map(|a| a.get("tensor").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    let kernels = arr(&v["kernels"])?
        .iter()
        .map(|k| {
            let g = arr(&k["grid"])?;
            let b = arr(&k["block"])?;
            if g.len() != 3 || b.len() != 3 {
                return Err(bad("a kernel's grid or block"));
            }
            let dim = |x: &Value| -> Result<u32> {
                u32::try_from(int(x)?).map_err(|_| bad("a block size"))
            };
            Ok(Kernel {
                name: string(&k["name"])?,
                grid: [expr_from(&g[0])?, expr_from(&g[1])?, expr_from(&g[2])?],
                block: [dim(&b[0])?, dim(&b[1])?, dim(&b[2])?],
                dynamic_shared: int(&k["dynamic_shared"])? as usize,
                static_shared: int(&k["static_shared"])? as usize,
                dependent: k["dependent"].as_bool().unwrap_or(false),
                globals: match k.get("globals") {
                    Some(g) => arr(g)?.iter().map(string).collect::<Result<_>>()?,
                    None => every_tensor.clone(),
                },
            })
        })
        .collect::<Result<_>>()?;
    let args = arr(&v["args"])?
        .iter()
        .map(|a| {
            if let Some(p) = a.get("param") {
                return Ok(KernelArg::Param { name: string(p)? });
            }
            if let Some(p) = a.get("step") {
                return Ok(KernelArg::Step { name: string(p)? });
            }
            Ok(KernelArg::Tensor {
                name: string(&a["tensor"])?,
                dtype: dtype_from(&a["dtype"])?,
                shape: arr(&a["shape"])?
                    .iter()
                    .map(string)
                    .collect::<Result<_>>()?,
            })
        })
        .collect::<Result<_>>()?;
    Ok(CudaProgram {
        source: string(&v["source"])?,
        kernels,
        args,
        host_loops: host_loops_from(v)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::Variant;

    #[test]
    fn a_compiled_program_round_trips() {
        let program = crate::frontend::load_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/softmax.json"
        )))
        .unwrap();
        for gpu in [false, true] {
            let c = crate::compile(&program, &Variant::default().options(gpu)).unwrap();
            let back = from_json(&program, &to_json(&c)).unwrap();
            assert_eq!(back.tree, c.tree);
            assert_eq!(back.untiled_tree, c.untiled_tree);
            assert_eq!(back.gpu_tree, c.gpu_tree);
            assert_eq!(back.cuda, c.cuda);
            assert_eq!(back.kernel_c, c.kernel_c);
            assert_eq!(back.reference_c, c.reference_c);
            assert_eq!(back.emulation_c, c.emulation_c);
            assert_eq!(back.tensors.len(), c.tensors.len());
            for (a, b) in back.tensors.iter().zip(&c.tensors) {
                assert_eq!(
                    (&a.name, a.dtype, a.role, &a.shape),
                    (&b.name, b.dtype, b.role, &b.shape)
                );
            }
        }
    }

    #[test]
    fn kernels_of_older_artifacts_count_every_tensor() {
        // Artifacts cached before kernels listed the tensors they touch:
        // every tensor is counted (the C ABI then keeps every temp in the
        // workspace), never none.
        let program = crate::frontend::load_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/attention_causal.json"
        )))
        .unwrap();
        let c = crate::compile(&program, &Variant::default().options(true)).unwrap();
        let touched = &c.cuda.as_ref().unwrap().kernels[0].globals;
        assert_eq!(touched, &["Q", "K", "V", "Y"]);
        let mut v = to_json(&c);
        for k in v["cuda"]["kernels"].as_array_mut().unwrap() {
            k.as_object_mut().unwrap().remove("globals");
        }
        let back = from_json(&program, &v).unwrap();
        let every: Vec<&str> = c.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(back.cuda.unwrap().kernels[0].globals, every);
    }
}
