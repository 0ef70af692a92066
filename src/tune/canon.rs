//! The canonical form of a program, the first part of a cache key.
//!
//! Two programs that differ only in names (program, tensors, parameters,
//! index variables) or in how their statements are written (spacing,
//! redundant parentheses, `where` clause spelling) have the same canonical
//! form: it is printed from the parsed AST, with parameters renamed `p0,
//! p1, ...` in file order, tensors `t0, t1, ...` in declaration order
//! (inputs, outputs, temps: the order of the kernel arguments) and each
//! statement's index variables `i0, i1, ...` in order of first appearance
//! (left side, then reduction indices), every expression fully
//! parenthesised.
//!
//! The generated code still uses the program's own names, so a cached
//! compiled program is reused only for the same spelling
//! ([`spelling`]); tuned options are reused across renamings.

use std::collections::HashMap;
use std::fmt::Write;

use crate::frontend::ast::{
    Affine, AssignOp, Expr, ExprKind, Program, Statement, TensorRole, UnOp, WhereClause,
};

/// The canonical text of `program` (parameter values excluded: see
/// [`param_values`]).
pub fn canonical(program: &Program) -> String {
    let mut names: HashMap<&str, String> = HashMap::new();
    for (i, p) in program.params.iter().enumerate() {
        names.insert(&p.name, format!("p{i}"));
    }
    for (i, t) in program.tensors.iter().enumerate() {
        names.insert(&t.name, format!("t{i}"));
    }
    let mut out = String::from("polyfuse-canonical v1\n");
    let _ = writeln!(out, "params {}", program.params.len());
    for t in &program.tensors {
        let role = match t.role {
            TensorRole::Input => "input",
            TensorRole::Output => "output",
            TensorRole::Temp => "temp",
        };
        let shape = match &t.shape {
            Some(s) => s
                .iter()
                .map(|a| affine(a, &names))
                .collect::<Vec<_>>()
                .join(", "),
            None => "?".into(),
        };
        let _ = writeln!(
            out,
            "{} {role} {} [{shape}]",
            names[t.name.as_str()],
            t.dtype
        );
    }
    for s in &program.statements {
        // A statement's loop blocks (their indices are its first
        // indices, `i0` ..), before it; nothing for one outside blocks.
        for b in &s.blocks {
            let _ = write!(
                out,
                "for b{} in {}:{} ",
                b.id,
                affine(&b.lo, &names),
                affine(&b.hi, &names)
            );
        }
        let _ = writeln!(out, "{}", statement(s, &names));
    }
    if let Some(d) = &program.schedule {
        let _ = writeln!(out, "schedule {d}");
    }
    out
}

/// The parameter values in canonical form: `p0=1024,p1=?` (`?` for a
/// symbolic one).
pub fn param_values(program: &Program) -> String {
    program
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| match p.value {
            Some(v) => format!("p{i}={v}"),
            None => format!("p{i}=?"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A fingerprint of the names the generated code uses (program, tensors,
/// parameters, index variables) and of the polyfuse build (its sources'
/// hash); with the canonical form and the options it determines the
/// generated code.
pub fn spelling(program: &Program) -> String {
    let mut s = format!(
        "{}|{}|",
        env!("CARGO_PKG_VERSION"),
        env!("POLYFUSE_SOURCE_HASH")
    );
    s.push_str(&program.name);
    for p in &program.params {
        s.push(' ');
        s.push_str(&p.name);
    }
    s.push('|');
    for t in &program.tensors {
        s.push(' ');
        s.push_str(&t.name);
    }
    for st in &program.statements {
        s.push('|');
        s.push_str(&st.all_indices().join(" "));
    }
    hash_hex(&s)
}

/// A 128-bit hash as 32 hex digits (two FNV-1a 64 passes with different
/// offsets): stable across platforms and Rust versions, unlike `std`'s
/// hasher.
pub fn hash_hex(text: &str) -> String {
    let fnv = |offset: u64| {
        text.bytes().fold(offset, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x84222325_cbf29ce4)
    )
}

fn statement(s: &Statement, global: &HashMap<&str, String>) -> String {
    let mut names = global.clone();
    let indices = s.all_indices();
    for (k, idx) in indices.iter().enumerate() {
        names.insert(idx.as_str(), format!("i{k}"));
    }
    let lhs = s
        .lhs_indices
        .iter()
        .map(|i| rename(i, &names))
        .collect::<Vec<_>>()
        .join(", ");
    let op = match s.op {
        AssignOp::Assign => "=".to_string(),
        AssignOp::Reduce { op, init } => format!("{}={}", op.symbol(), if init { "!" } else { "" }),
    };
    let mut out = format!(
        "{}({lhs}) {op} {}",
        rename(&s.lhs_tensor, &names),
        expr(&s.rhs, &names)
    );
    for (k, w) in s.wheres.iter().enumerate() {
        out.push_str(if k == 0 { " where " } else { ", " });
        match w {
            WhereClause::Range { index, lo, hi } => {
                let _ = write!(
                    out,
                    "{} in {}:{}",
                    rename(index, &names),
                    affine(lo, &names),
                    affine(hi, &names)
                );
            }
            // As before unions existed (`=` for equality), so that the
            // keys of entries already in users' caches stay the same.
            WhereClause::Constraint { lhs, rel, rhs } => {
                let _ = write!(
                    out,
                    "{} {} {}",
                    affine(lhs, &names),
                    rel.symbol(),
                    affine(rhs, &names)
                );
            }
            union @ WhereClause::Union(_) => {
                let text = union.condition_text(false, &|a| affine(a, &names));
                out.push_str(&text.unwrap_or_default());
            }
        }
    }
    out
}

fn rename(name: &str, names: &HashMap<&str, String>) -> String {
    names.get(name).cloned().unwrap_or_else(|| name.to_string())
}

/// `c + a*x + ...` with the renamed names in sorted order.
fn affine(a: &Affine, names: &HashMap<&str, String>) -> String {
    let mut terms: Vec<(String, i64)> = a
        .terms
        .iter()
        .map(|(n, k)| (rename(n, names), *k))
        .collect();
    terms.sort();
    let mut s = String::new();
    for (n, k) in terms {
        let _ = write!(s, "{k}*{n} + ");
    }
    let _ = write!(s, "{}", a.constant);
    s
}

fn expr(e: &Expr, names: &HashMap<&str, String>) -> String {
    match &e.kind {
        ExprKind::Number(v) => format!("{v:?}"),
        ExprKind::Inf { negative } => if *negative { "-inf" } else { "inf" }.into(),
        ExprKind::Index(n) | ExprKind::Param(n) => rename(n, names),
        ExprKind::Access { tensor, subscripts } => format!(
            "{}({})",
            rename(tensor, names),
            subscripts
                .iter()
                .map(|a| affine(a, names))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ExprKind::Unary(op, a) => format!(
            "({}{})",
            match op {
                UnOp::Neg => "-",
                UnOp::Not => "!",
            },
            expr(a, names)
        ),
        ExprKind::Binary(op, a, b) => {
            format!("({} {} {})", expr(a, names), op.symbol(), expr(b, names))
        }
        ExprKind::Select(c, a, b) => format!(
            "({} ? {} : {})",
            expr(c, names),
            expr(a, names),
            expr(b, names)
        ),
        ExprKind::Call(f, args) => format!(
            "{}({})",
            f.name(),
            args.iter()
                .map(|a| expr(a, names))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ExprKind::Cast(t, a) => format!("{}({})", t.name(), expr(a, names)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend;

    fn load(json: &str) -> Program {
        frontend::load_str(json, "<test>").unwrap()
    }

    const GEMM: &str = r#"{"name": "gemm", "params": {"M": 64, "N": 32, "K": 16},
        "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
        "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
        "body": ["C(i, j) +=! A(i, k) * B(k, j)"]}"#;

    #[test]
    fn renaming_and_spacing_keep_the_form() {
        let renamed = r#"{"name": "mm", "params": {"R": 64, "S": 32, "T": 16},
        "inputs": {"X": {"dtype": "f32", "shape": ["R", "T"]}, "Y": {"dtype": "f32", "shape": ["T", "S"]}},
        "outputs": {"Z": {"dtype": "f32", "shape": ["R", "S"]}},
        "body": ["Z(a,b)+=!((X(a, c))*Y(c,b))"]}"#;
        let a = load(GEMM);
        let b = load(renamed);
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(param_values(&a), param_values(&b));
        assert_ne!(spelling(&a), spelling(&b));
    }

    #[test]
    fn a_union_is_part_of_the_form_and_a_comparison_keeps_its_text() {
        let with = |cond: &str| {
            canonical(&load(&GEMM.replace(
                r#""C(i, j) +=! A(i, k) * B(k, j)""#,
                &format!(r#""C(i, j) +=! A(i, k) * B(k, j) where {cond}""#),
            )))
        };
        let union = with("k <= i || k >= j");
        assert!(union.contains(") || ("), "{union}");
        assert_ne!(union, with("k <= i"));
        assert_ne!(union, with("k <= i || k > j"));
        // A single comparison is printed as before unions (`=` for
        // equality), so cache entries made before keep their keys.
        assert!(with("k == i").contains(" = "), "{}", with("k == i"));
    }

    #[test]
    fn loop_blocks_are_part_of_the_form() {
        // The same statement repeated by a loop block, or not, or over
        // another range, means something else: the cache must tell them
        // apart.
        let flat = GEMM.replace(
            r#""body": ["C(i, j) +=! A(i, k) * B(k, j)"]"#,
            r#""body": ["C(i, j) = 0", "C(i, j) += A(i, k) * B(k, j)"]"#,
        );
        let block = |range: &str| {
            GEMM.replace(
                r#""body": ["C(i, j) +=! A(i, k) * B(k, j)"]"#,
                &format!(
                    r#""body": ["C(i, j) = 0", {{"for": "{range}", "body": ["C(i, j) += A(i, k) * B(k, j)"]}}]"#
                ),
            )
        };
        let a = canonical(&load(&flat));
        let b = canonical(&load(&block("z in 0:2")));
        let c = canonical(&load(&block("z in 0:M")));
        assert!(b.contains("for b0 in 0:2 "), "{b}");
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert_eq!(b, canonical(&load(&block("w in 0:2"))));
    }

    #[test]
    fn meaning_changes_the_form() {
        let a = load(GEMM);
        let transposed = load(&GEMM.replace("B(k, j)", "B(k, i)").replace(
            r#""B": {"dtype": "f32", "shape": ["K", "N"]}"#,
            r#""B": {"dtype": "f32", "shape": ["K", "M"]}"#,
        ));
        assert_ne!(canonical(&a), canonical(&transposed));
        let f16 = load(&GEMM.replace(r#""A": {"dtype": "f32""#, r#""A": {"dtype": "f16""#));
        assert_ne!(canonical(&a), canonical(&f16));
        let sizes = load(&GEMM.replace("\"M\": 64", "\"M\": 128"));
        assert_eq!(canonical(&a), canonical(&sizes));
        assert_ne!(param_values(&a), param_values(&sizes));
    }

    #[test]
    fn hashes_are_stable() {
        // FNV-1a 64 of "" is its offset basis; of "a" the published value
        assert_eq!(hash_hex(""), "cbf29ce48422232584222325cbf29ce4");
        assert_eq!(&hash_hex("a")[..16], "af63dc4c8601ec8c");
        assert_ne!(hash_hex("a"), hash_hex("b"));
        assert_eq!(hash_hex("gemm").len(), 32);
    }
}
