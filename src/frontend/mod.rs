//! The frontend: the JSON program file and its Tensor Comprehension
//! statements, parsed, resolved and type-checked into a [`ast::Program`].
//! Range inference needs isl and lives in the model.

pub mod ast;
mod load;
mod resolve;
mod syntax;

use std::path::Path;

use crate::error::{Error, Result};
use ast::Program;

/// Loads a program file.
pub fn load_file(path: &Path) -> Result<Program> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Input {
        file: source.clone(),
        message: format!("cannot read the file: {e}"),
    })?;
    load_str(&text, &source)
}

/// Loads a program from JSON text; `source` names it in messages.
pub fn load_str(json: &str, source: &str) -> Result<Program> {
    load::program(json, source)
}

/// Parses `NAME=VALUE`.
pub fn parse_param_override(s: &str) -> Result<(String, i64)> {
    let bad = || Error::Input {
        file: "--param".into(),
        message: format!("`{s}` is not NAME=VALUE with a positive integer VALUE"),
    };
    let (n, v) = s.split_once('=').ok_or_else(bad)?;
    let v: i64 = v.trim().parse().map_err(|_| bad())?;
    if v < 1 {
        return Err(bad());
    }
    Ok((n.trim().to_string(), v))
}

/// Gives parameters values, overriding the file.
pub fn apply_param_overrides(program: &mut Program, overrides: &[(String, i64)]) -> Result<()> {
    let names: Vec<String> = program.params.iter().map(|p| p.name.clone()).collect();
    for (n, v) in overrides {
        let source = program.source.clone();
        let p = program
            .params
            .iter_mut()
            .find(|p| &p.name == n)
            .ok_or_else(|| Error::Input {
                file: source,
                message: format!(
                    "the program has no parameter `{n}` (its parameters: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            })?;
        p.value = Some(*v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ast::*;
    use super::*;

    fn prog(body: &[&str]) -> String {
        let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
        format!(
            r#"{{ "name": "t", "params": {{ "N": 8, "M": 4 }},
                 "inputs": {{ "X": {{ "dtype": "f32", "shape": ["N", "M"] }},
                              "H": {{ "dtype": "f16", "shape": ["N"] }},
                              "D": {{ "dtype": "f64", "shape": ["N"] }},
                              "I": {{ "dtype": "i32", "shape": ["N"] }} }},
                 "outputs": {{ "Y": {{ "dtype": "f32", "shape": ["N"] }},
                               "Z": {{ "dtype": "i32", "shape": ["N"] }} }},
                 "body": [ {} ] }}"#,
            body.join(", ")
        )
    }

    fn err(body: &[&str]) -> String {
        let e = load_str(&prog(body), "t.json").unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        e.to_string()
    }

    fn ok(body: &[&str]) -> Program {
        load_str(&prog(body), "t.json").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn statement_forms_and_reduction_indices() {
        let p = ok(&[
            "Y(i) +=! X(i, k) * 2",
            "Y(i) max= X(i, k)",
            "Z(i) = I(i) + 1",
        ]);
        let s = &p.statements[0];
        assert_eq!(s.lhs_indices, vec!["i"]);
        assert_eq!(s.reduction_indices, vec!["k"]);
        assert_eq!(
            s.op,
            AssignOp::Reduce {
                op: Reducer::Sum,
                init: true
            }
        );
        assert_eq!(
            p.statements[1].op,
            AssignOp::Reduce {
                op: Reducer::Max,
                init: false
            }
        );
        assert_eq!(p.statements[2].rhs.ty, ExprType::Num(DType::I32));
    }

    #[test]
    fn functions_casts_inf_and_select_typecheck() {
        let p = ok(&[
            "Y(i) = exp(X(i, 0)) + log(1.5) + sqrt(2) + rsqrt(3) + tanh(0) + sigmoid(0) + abs(-1) + max(X(i, 1), 0) + min(1, 2) + pow(2, 3)",
            "Y(i) = H(i) * f32(D(i)) + f32(N)",
            "Y(i) max= i < 3 && !(i == 2) ? -inf : inf",
            "Z(i) = max(I(i), 0) + abs(I(i))",
        ]);
        assert_eq!(p.statements[1].rhs.ty, ExprType::Num(DType::F32));
        match &p.statements[2].rhs.kind {
            ExprKind::Select(c, a, _) => {
                assert_eq!(c.ty, ExprType::Bool);
                assert_eq!(a.kind, ExprKind::Inf { negative: true });
            }
            k => panic!("{k:?}"),
        }
    }

    #[test]
    fn affine_subscripts_and_where_clauses() {
        assert!(err(&["Y(i) +=! X(i, j) where j in 0:M/2"]).contains("not affine"));
        let p = ok(&["Y(i) +=! X(i, 2*j + u) where u in 0:2, j < 1"]);
        let s = &p.statements[0];
        match &s.rhs.kind {
            ExprKind::Access { subscripts, .. } => {
                assert_eq!(subscripts[1].coeff("j"), 2);
                assert_eq!(subscripts[1].coeff("u"), 1);
            }
            k => panic!("{k:?}"),
        }
        assert_eq!(s.wheres.len(), 2);
        assert_eq!(s.reduction_indices, vec!["j", "u"]);
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(err(&["Y(i) = X(i, k)"]).contains("index `k` appears on the right"));
        assert!(err(&["Y(i) = X(i, j * k)"]).contains("not affine"));
        assert!(err(&["Y(i) = X(i, Y(0))"]).contains("not affine"));
        assert!(err(&["Y(i) = Q(i)"]).contains("unknown tensor or function `Q`"));
        assert!(err(&["X(i, j) = 1"]).contains("input"));
        assert!(err(&["Y(i) = D(i)"]).contains("type mismatch"));
        assert!(err(&["Y(i) = H(i) + D(i)"]).contains("type mismatch"));
        assert!(err(&["Z(i) = 0.5"]).contains("fractional"));
        assert!(err(&["Z(i) = exp(I(i))"]).contains("float"));
        assert!(err(&["Y(i) = X(i)"]).contains("2 dimensions"));
        assert!(err(&["Y(i, i) = 1"]).contains("twice"));
        assert!(err(&["Y(i + 1) = 1"]).contains("plain index"));
        assert!(err(&["Y(i) +=! Y(i) * 2"]).contains("may not read"));
        assert!(err(&["Y(i) = Y(0)"]).contains("other elements"));
        assert!(err(&["Y(i) = X"]).contains("without subscripts"));
        assert!(err(&["Y(i) = exp(1, 2)"]).contains("argument"));
        // A comparison is a bool, which reads as 0 or 1 (spec, "Keys");
        // a number is no condition.
        assert!(err(&["Y(i) = X(i, 0) ? 1 : 0"]).contains("not a condition"));
        let e = err(&["Y(i) = X(i, 0) +"]);
        assert!(e.contains("statement 1") && e.contains("t.json"), "{e}");
    }

    #[test]
    fn file_level_errors() {
        let bad = |json: &str, needle: &str| {
            let e = load_str(json, "f.json").unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains(needle), "{e}");
        };
        bad("{", "not valid JSON");
        bad(
            r#"{"name": "a", "params": {}, "inputs": {}, "outputs": {}, "body": [], "oops": 1}"#,
            "unknown key `oops`",
        );
        bad(
            r#"{"name": "a", "params": {}, "inputs": {}, "outputs": {}}"#,
            "missing required key `body`",
        );
        bad(
            r#"{"name": "a", "params": {"N": 0}, "inputs": {}, "outputs": {}, "body": ["Y() = 1"]}"#,
            "positive integer",
        );
        bad(
            r#"{"name": "a", "params": {"N": 2}, "inputs": {"N": {"dtype": "f32", "shape": [2]}}, "outputs": {}, "body": ["Y() = 1"]}"#,
            "declared twice",
        );
        bad(
            r#"{"name": "a", "params": {}, "inputs": {"A": {"dtype": "f8", "shape": [2]}}, "outputs": {}, "body": ["Y() = 1"]}"#,
            "unknown dtype",
        );
        bad(
            r#"{"name": "a", "params": {"N": 2}, "inputs": {"A": {"dtype": "f32", "shape": ["N*N"]}}, "outputs": {}, "body": ["Y() = 1"]}"#,
            "affine",
        );
        bad(
            r#"{"name": "a", "params": {}, "inputs": {"exp": {"dtype": "f32", "shape": [2]}}, "outputs": {}, "body": ["Y() = 1"]}"#,
            "reserved",
        );
    }

    /// Serde reads the file's structure; its errors still name the file,
    /// the key (a parameter or tensor by its name) and the reason, with
    /// the line and column.
    #[test]
    fn structural_errors_name_the_key_and_the_place() {
        let bad = |json: &str, needles: &[&str]| {
            let e = load_str(json, "f.json").unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            let e = e.to_string();
            assert!(e.starts_with("f.json: "), "{e}");
            for n in needles {
                assert!(e.contains(n), "{n}: {e}");
            }
        };
        let head = r#"{"name": "a", "outputs": {}, "body": ["Y() = 1"],"#;
        bad(
            &format!("{head}\n \"params\": {{}}, \"inputs\": {{}}, \"colour\": 1}}"),
            &["unknown key `colour`", "`schedule`", "line 2 column"],
        );
        let e = load_str(
            &format!(r#"{head} "params": {{}}, "inputs": {{}}, "colour": 1}}"#),
            "f.json",
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .starts_with("f.json: unknown key `colour`"));
        bad(
            &format!(r#"{head} "params": {{"N": "big"}}, "inputs": {{}}}}"#),
            &["parameter `N`", "invalid type", "line 1 column"],
        );
        bad(
            &format!(
                r#"{head} "params": {{}}, "inputs": {{"A": {{"dtype": "f32", "shape": [2], "layout": "nchw"}}}}}}"#
            ),
            &["tensor `A`", "unknown key `layout`", "line 1 column"],
        );
        bad(
            &format!(r#"{head} "params": {{}}, "inputs": {{"A": {{"shape": [2]}}}}}}"#),
            &["tensor `A`", "missing required key `dtype`"],
        );
        bad(
            &format!(r#"{head} "params": 3, "inputs": {{}}}}"#),
            &["`params`", "invalid type", "line 1 column"],
        );
        // A derived struct would take an array of its fields in order.
        bad(
            r#"["a", {}, {}, {}, ["Y() = 1"]]"#,
            &["expected a JSON object"],
        );
        bad(
            &format!(r#"{head} "params": {{}}, "inputs": {{"A": ["f32", [2]]}}}}"#),
            &["tensor `A`", "expected a JSON object"],
        );
        bad(
            r#"{"name": "a", "params": {}, "inputs": {}, "outputs": {}, "body": ["Y() = 1"]} x"#,
            &["not valid JSON", "trailing characters"],
        );
        bad(
            r#"{"name": 3, "params": {}, "inputs": {}, "outputs": {}, "body": ["Y() = 1"]}"#,
            &["`name`", "invalid type"],
        );
        bad(
            r#"{"name": "3a", "params": {}, "inputs": {}, "outputs": {}, "body": ["Y() = 1"]}"#,
            &["`name` must be an identifier string"],
        );
    }

    #[test]
    fn undeclared_left_side_becomes_a_temp() {
        let p = ok(&["T(i) = D(i) * 2", "Y(i) = f32(T(i))"]);
        let t = p.tensor("T").unwrap();
        assert_eq!(t.role, TensorRole::Temp);
        assert_eq!(t.dtype, DType::F64);
        assert!(t.shape.is_none());
    }

    /// A program with `T` and `N`, an input `X` (T x N) and an output `H`
    /// (T x N), whose body is `body` (JSON text of the array's entries).
    fn blocks_prog(body: &str) -> String {
        format!(
            r#"{{ "name": "b", "params": {{ "T": 6, "N": 5 }},
                 "inputs": {{ "X": {{ "dtype": "f32", "shape": ["T", "N"] }} }},
                 "outputs": {{ "H": {{ "dtype": "f32", "shape": ["T", "N"] }} }},
                 "body": [ {body} ] }}"#
        )
    }

    fn blocks_err(body: &str) -> String {
        let e = load_str(&blocks_prog(body), "b.json").unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        let e = e.to_string();
        assert!(e.starts_with("b.json: "), "{e}");
        e
    }

    #[test]
    fn loop_blocks_nest_and_carry_their_indices() {
        let p = load_str(
            &blocks_prog(
                r#""H(t, i) = X(t, i) where t in 0:1",
                   {"for": "t in 1:T", "body": [
                       "G(t, i) +=! X(t, k) * H(t - 1, k)",
                       {"for": "s in 0:N-1", "body": ["Y(s, t) = H(t - 1, s) where s >= t - 1"]},
                       "H(t, i) = tanh(G(t, i))"]},
                   "Z(i) = H(0, i)""#,
            ),
            "b.json",
        )
        .unwrap();
        let st = &p.statements;
        assert_eq!(st.len(), 5);
        assert!(st[0].blocks.is_empty() && st[4].blocks.is_empty());
        let t = &st[1].blocks;
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].id, t[0].index.as_str()), (0, "t"));
        assert_eq!(t[0].lo, Affine::constant(1));
        assert_eq!(t[0].hi, Affine::var("T"));
        // The block index is fixed: never a reduction index, first in the
        // domain, and the statement may read its own left side elsewhere.
        assert_eq!(st[1].reduction_indices, vec!["k"]);
        assert_eq!(st[1].all_indices(), vec!["t", "i", "k"]);
        assert_eq!(st[1].init_indices(), vec!["t", "i"]);
        let inner = &st[2].blocks;
        assert_eq!(inner.len(), 2);
        assert_eq!((inner[1].id, inner[1].index.as_str()), (1, "s"));
        assert_eq!(inner[1].hi, Affine::var("N").add(&Affine::constant(-1)));
        // Y(s, t): the left side's indices as written, the domain's order
        // blocks first.
        assert_eq!(st[2].lhs_indices, vec!["s", "t"]);
        assert_eq!(st[2].all_indices(), vec!["t", "s"]);
        assert_eq!(st[3].blocks, st[1].blocks);
        assert_eq!(st[2].position, 2);
    }

    #[test]
    fn loop_block_errors_name_the_problem() {
        let stmt = r#""H(t, i) = X(t, i)""#;
        let e = blocks_err(r#"{"for": "t in 0:T", "body": []}"#);
        assert!(
            e.contains("body entry 1, the loop block `for t in 0:T`: its `body` is empty"),
            "{e}"
        );
        let e = blocks_err(r#"{"for": "t in 0:T"}"#);
        assert!(e.contains("needs `body`"), "{e}");
        let e = blocks_err(&format!(r#"{{"body": [{stmt}]}}"#));
        assert!(e.contains("needs `for`"), "{e}");
        let e = blocks_err(&format!(
            r#"{{"for": "t in 0:T", "body": [{stmt}], "step": 2}}"#
        ));
        assert!(e.contains("unknown key `step`"), "{e}");
        let e = blocks_err(&format!(r#"{{"for": "t from 0:T", "body": [{stmt}]}}"#));
        assert!(e.contains("`IDX in lo:hi`"), "{e}");
        let e = blocks_err(&format!(r#"{{"for": "t in 0:T*T", "body": [{stmt}]}}"#));
        assert!(e.contains("affine"), "{e}");
        let e = blocks_err(&format!(r#"{{"for": "t in 0:i", "body": [{stmt}]}}"#));
        assert!(e.contains("parameters only, not `i`"), "{e}");
        let e = blocks_err(&format!(r#"{{"for": "N in 0:T", "body": [{stmt}]}}"#));
        assert!(e.contains("shadows the parameter `N`"), "{e}");
        let e = blocks_err(&format!(r#"{{"for": "X in 0:T", "body": [{stmt}]}}"#));
        assert!(e.contains("tensor, function or keyword"), "{e}");
        let e = blocks_err(&format!(
            r#"{{"for": "t in 0:T", "body": [{{"for": "t in 0:2", "body": [{stmt}]}}]}}"#
        ));
        assert!(
            e.contains("body entry 1.1, the loop block `for t in 0:2`: the block index `t` shadows the index of an enclosing block"),
            "{e}"
        );
        let e = blocks_err(&format!(r#"{stmt}, 7"#));
        assert!(
            e.contains("body entry 2 is neither a statement string nor a loop block"),
            "{e}"
        );
        // The block index is fixed: a `where` range may not give it another.
        let e = blocks_err(r#"{"for": "t in 0:T", "body": ["H(t, i) = X(t, i) where t in 0:2"]}"#);
        assert!(
            e.contains("statement 1 `H(t, i) = X(t, i) where t in 0:2`: `t` is the index of an enclosing loop block"),
            "{e}"
        );
        // Outside blocks, TC's rule stands.
        let e = blocks_err(r#""H(t, i) = X(t, i)", "H(t, i) = H(t - 1, i)""#);
        assert!(
            e.contains("statement 2") && e.contains("other elements"),
            "{e}"
        );
        // Statements keep their numbers across blocks.
        let e = blocks_err(&format!(
            r#"{stmt}, {{"for": "s in 0:T", "body": ["H(s, i) = Q(s, i)"]}}"#
        ));
        assert!(e.contains("statement 2 `H(s, i) = Q(s, i)`"), "{e}");
    }

    #[test]
    fn param_overrides() {
        let mut p = ok(&["Y(i) = 1"]);
        let o = parse_param_override("N=37").unwrap();
        apply_param_overrides(&mut p, &[o]).unwrap();
        assert_eq!(p.param("N").unwrap().value, Some(37));
        assert!(parse_param_override("N").is_err());
        assert!(parse_param_override("N=-1").is_err());
        let e = apply_param_overrides(&mut p, &[("Q".into(), 3)]).unwrap_err();
        assert!(e.to_string().contains("no parameter `Q`"));
    }
}
