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
    for (n, v) in overrides {
        let source = program.source.clone();
        let p = program
            .params
            .iter_mut()
            .find(|p| &p.name == n)
            .ok_or_else(|| Error::Input {
                file: source,
                message: format!("--param {n}: the program has no parameter `{n}`"),
            })?;
        p.value = Some(*v);
    }
    Ok(())
}
