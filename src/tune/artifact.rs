//! A compiled program as JSON, for the cache and `aot` documents: the
//! serde form of [`Compiled`] (everything but the program, which the
//! caller has, and what describes one run of the compiler) with the
//! format's version beside it, so that a cache hit rebuilds a `Compiled`
//! without isl and an entry of another format is a miss, never misread.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::pipeline::Compiled;

/// Version of the artifact format; an artifact of another version is a
/// miss. 2: `reference_c` also defines the declared-precision run
/// `pf_declared`, which the harness calls. 3: the format is serde's
/// derived one (trees as `--emit json` writes them, expressions untagged,
/// every kernel with its `globals`), no longer the hand-written one.
pub const VERSION: i64 = 3;

/// What is stored: the version, then the compiled program's fields.
#[derive(Serialize)]
struct Stored<'a> {
    version: i64,
    #[serde(flatten)]
    compiled: &'a Compiled,
}

/// The version alone, read before the rest so that another format's
/// fields are never interpreted.
#[derive(Deserialize)]
struct Header {
    version: i64,
}

/// The artifact of `c`. Serialising fails only on a map with non-string
/// keys, which `Compiled` has none of; still an error, never a panic,
/// since the C ABI saves artifacts.
pub fn to_json(c: &Compiled) -> Result<Value> {
    serde_json::to_value(stored(c)).map_err(bad)
}

/// [`to_json`] as text, as the cache stores it.
pub fn to_text(c: &Compiled) -> Result<String> {
    serde_json::to_string(&stored(c)).map_err(bad)
}

fn stored(c: &Compiled) -> Stored<'_> {
    Stored {
        version: VERSION,
        compiled: c,
    }
}

/// The compiled program of `program` from its artifact.
pub fn from_json(program: &Program, v: &Value) -> Result<Compiled> {
    let header = Header::deserialize(v).map_err(bad)?;
    if header.version != VERSION {
        return Err(another_version(header.version));
    }
    let compiled = Compiled::deserialize(v).map_err(bad)?;
    Ok(with_program(compiled, program))
}

/// [`from_json`] from the artifact's text, as the cache stores it.
pub fn from_text(program: &Program, text: &str) -> Result<Compiled> {
    let header: Header = serde_json::from_str(text).map_err(bad)?;
    if header.version != VERSION {
        return Err(another_version(header.version));
    }
    let compiled: Compiled = serde_json::from_str(text).map_err(bad)?;
    Ok(with_program(compiled, program))
}

fn with_program(compiled: Compiled, program: &Program) -> Compiled {
    Compiled {
        program: program.clone(),
        ..compiled
    }
}

fn bad(e: serde_json::Error) -> Error {
    Error::Internal(format!("cache artifact: {e}"))
}

fn another_version(v: i64) -> Error {
    Error::Internal(format!(
        "cache artifact: version {v}, this polyfuse reads {VERSION}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::ast::DType;
    use crate::tune::Variant;

    fn compiled(example: &str, gpu: bool) -> (Program, Compiled) {
        let program = crate::frontend::load_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples")
                .join(example),
        )
        .unwrap();
        let c = crate::compile(&program, &Variant::default().options(gpu)).unwrap();
        (program, c)
    }

    /// Every stored field comes back equal, through the value and the
    /// text, and the text of the read-back program is the same text.
    #[test]
    fn a_compiled_program_round_trips_exactly() {
        for (example, gpu) in [
            ("softmax.json", false),
            ("softmax.json", true),
            ("attention_causal.json", true),
        ] {
            let (program, c) = compiled(example, gpu);
            let text = to_text(&c).unwrap();
            for back in [
                from_json(&program, &to_json(&c).unwrap()).unwrap(),
                from_text(&program, &text).unwrap(),
            ] {
                assert_eq!(back.tree, c.tree);
                assert_eq!(back.untiled_tree, c.untiled_tree);
                assert_eq!(back.gpu_tree, c.gpu_tree);
                assert_eq!(back.cuda, c.cuda);
                assert_eq!(back.deps_text, c.deps_text);
                assert_eq!(back.deps_json, c.deps_json);
                assert_eq!(back.model_json, c.model_json);
                assert_eq!(back.kernel_c, c.kernel_c);
                assert_eq!(back.reference_c, c.reference_c);
                assert_eq!(back.emulation_c, c.emulation_c);
                assert_eq!(back.program.name, program.name);
                assert_eq!(back.tensors.len(), c.tensors.len());
                for (a, b) in back.tensors.iter().zip(&c.tensors) {
                    assert_eq!(
                        (&a.name, a.dtype, a.role, &a.shape),
                        (&b.name, b.dtype, b.role, &b.shape)
                    );
                }
                assert_eq!(to_text(&back).unwrap(), text);
            }
            assert_eq!(c.cuda.is_some(), gpu);
        }
    }

    /// An entry the hand-written format 2 stored (its trees' leaves
    /// `"leaf"`, its bands `{"band": {...}, "child"}`), or one of a later
    /// format, or no artifact at all, is refused, which the cache reads as
    /// a miss; the same fields under the current version are read.
    #[test]
    fn an_artifact_of_another_format_is_a_miss() {
        let (program, c) = compiled("softmax.json", false);
        let mut v = to_json(&c).unwrap();
        assert!(from_json(&program, &v).is_ok());
        let old = serde_json::json!({
            "version": 2,
            "tensors": [],
            "tree": {"domain": "{ S[i] : 0 <= i < 4 }", "root": "leaf"},
            "untiled_tree": {"domain": "{ S[i] : 0 <= i < 4 }", "root": "leaf"},
            "deps_text": "",
            "deps_json": null,
            "model_json": null,
            "kernel_c": "",
            "reference_c": null,
            "gpu_tree": null,
            "cuda": null,
            "emulation_c": null,
        });
        let e = from_json(&program, &old).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        assert!(from_text(&program, &old.to_string()).is_err());
        v["version"] = serde_json::json!(VERSION + 1);
        assert!(from_json(&program, &v).is_err());
        assert!(from_text(&program, &v.to_string()).is_err());
        let bare = serde_json::json!({ "version": VERSION }).to_string();
        for foreign in ["{}", "[]", bare.as_str(), "not json"] {
            assert!(from_text(&program, foreign).is_err(), "{foreign}");
        }
    }

    /// A dtype is stored by the name programs spell it with.
    #[test]
    fn dtypes_are_stored_by_their_names() {
        for t in DType::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), t.name());
            assert_eq!(serde_json::from_value::<DType>(t.name().into()).unwrap(), t);
        }
    }
}
