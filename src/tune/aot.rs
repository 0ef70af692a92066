//! Ahead of time: a compiled program as one self-contained JSON document
//! (issue 33 item 5), written by `polyfuse schedule --emit artifact` and
//! the C ABI's `pf_result_save`, read by `pf_result_load`.
//!
//! The document holds the program's text with the parameter values and
//! directives it was compiled with (so the same `Program` is parsed back:
//! parsing needs no isl), the compiled program as the cache stores it
//! (`tune::artifact`: trees, C, CUDA source, launch records, tensors), and
//! PTX per GPU architecture. Loading rebuilds the result from these without
//! isl; a launch on a device whose architecture has PTX here loads it
//! without NVRTC (the driver finishes PTX for the device), and only an
//! architecture without PTX needs NVRTC.
//!
//! PTX is keyed by the architecture a launch on that device compiles for
//! (`runtime::cuda::target_arch`: `sm_90a` on an sm_90 device for kernels
//! with a `wgmma` path), so a request for `sm_90` is stored under the name
//! the launch will look up.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::frontend::{self, ast::Program};
use crate::pipeline::Compiled;

/// Version of the document; another version is refused. 2: the compiled
/// program in the cache artifact's format 3 (`tune::artifact::VERSION`),
/// so a document of version 1 is refused by its version, not misread.
pub const VERSION: i64 = 2;

/// What a program was compiled from: enough to parse the same `Program`
/// again. Stored in the document as it is (`params` as `[name, value]`
/// pairs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// The program's JSON text, as loaded.
    pub text: String,
    /// The name messages use for it (its file, or `<json>`).
    pub name: String,
    /// Parameter values given over the text's (`--param`).
    pub params: Vec<(String, i64)>,
    /// Directives that replaced the text's `schedule` key, if any.
    pub directives: Option<Value>,
}

impl Source {
    /// The program, parsed as it was compiled.
    pub fn program(&self) -> Result<Program> {
        let mut program = frontend::load_str(&self.text, &self.name)?;
        frontend::apply_param_overrides(&mut program, &self.params)?;
        if let Some(d) = &self.directives {
            program.schedule = Some(d.clone());
        }
        Ok(program)
    }
}

/// An artifact read back: the program, its compiled form, the target it
/// was compiled for (`cpu` or `cuda`), the architecture its launches were
/// asked to compile for (if one was), and PTX per architecture.
pub struct Loaded {
    pub source: Source,
    pub program: Program,
    pub compiled: Compiled,
    pub target: String,
    pub arch: Option<String>,
    pub ptx: BTreeMap<String, String>,
}

/// The architecture a launch on a device of architecture `device`
/// (`sm_90`; an `a` suffix names the same device) compiles `source` for,
/// with `requested` the result's own choice (`pf_context_set_arch`): the
/// key its PTX is stored under.
pub fn launch_arch(source: &str, device: &str, requested: Option<&str>) -> Result<String> {
    let bad = || Error::Input {
        file: "artifact".into(),
        message: format!("`{device}` is not a GPU architecture (write it as sm_90)"),
    };
    let digits = device.strip_prefix("sm_").ok_or_else(bad)?;
    let cc: i32 = digits.trim_end_matches('a').parse().map_err(|_| bad())?;
    crate::runtime::cuda::target_arch(source, cc, requested)
}

/// The document for `compiled` (target `cpu` or `cuda`), with PTX for each
/// of `archs` (NVRTC needed when there are any; none without a CUDA
/// program).
pub fn save(
    source: &Source,
    compiled: &Compiled,
    target: &str,
    arch: Option<&str>,
    archs: &[String],
) -> Result<Value> {
    let mut ptx = BTreeMap::new();
    if let Some(cuda) = &compiled.cuda {
        for a in archs {
            let key = launch_arch(&cuda.source, a, arch)?;
            if let std::collections::btree_map::Entry::Vacant(slot) = ptx.entry(key) {
                let text = crate::runtime::cuda::compile_ptx(&cuda.source, slot.key())?;
                slot.insert(text);
            }
        }
    }
    let doc = Document {
        polyfuse_artifact: VERSION,
        polyfuse_version: env!("CARGO_PKG_VERSION").to_string(),
        program: source.clone(),
        target: target.to_string(),
        arch: arch.map(str::to_string),
        compiled: super::artifact::to_json(compiled)?,
        ptx,
    };
    serde_json::to_value(doc).map_err(|e| Error::Internal(format!("artifact: {e}")))
}

/// The document: what the program was compiled from, for which target
/// and architecture, the compiled program as the cache stores it, and PTX
/// per architecture.
#[derive(Serialize, Deserialize)]
struct Document {
    /// [`VERSION`], checked before the rest is read.
    polyfuse_artifact: i64,
    /// The polyfuse that wrote it, for people; not read.
    #[serde(default)]
    polyfuse_version: String,
    program: Source,
    /// `cpu` or `cuda`.
    target: String,
    arch: Option<String>,
    /// `tune::artifact`'s form, read once the program is parsed.
    compiled: Value,
    #[serde(default)]
    ptx: BTreeMap<String, String>,
}

fn bad(what: &str) -> Error {
    Error::Input {
        file: "artifact".into(),
        message: format!("not a polyfuse artifact: {what}"),
    }
}

/// Reads a document [`save`] wrote.
pub fn load(text: &str) -> Result<Loaded> {
    let v: Value = serde_json::from_str(text).map_err(|e| bad(&format!("not valid JSON ({e})")))?;
    match v["polyfuse_artifact"].as_i64() {
        Some(VERSION) => {}
        Some(n) => {
            return Err(bad(&format!(
                "version {n}; this polyfuse reads version {VERSION}"
            )))
        }
        None => return Err(bad("no polyfuse_artifact version")),
    }
    let doc: Document = serde_path_to_error::deserialize(&v).map_err(|e| {
        bad(&if e.path().iter().next().is_some() {
            format!("{}: {}", e.path(), e.inner())
        } else {
            e.inner().to_string()
        })
    })?;
    let source = doc.program;
    let program = source.program()?;
    let compiled = super::artifact::from_json(&program, &doc.compiled)?;
    let target = doc.target;
    if target != "cpu" && target != "cuda" {
        return Err(bad(&format!("target `{target}`")));
    }
    let (arch, ptx) = (doc.arch, doc.ptx);
    Ok(Loaded {
        source,
        program,
        compiled,
        target,
        arch,
        ptx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(file: &str) -> Source {
        let path = format!("{}/examples/{file}", env!("CARGO_MANIFEST_DIR"));
        Source {
            text: std::fs::read_to_string(&path).unwrap(),
            name: path,
            params: vec![("M".into(), 77)],
            directives: None,
        }
    }

    #[test]
    fn a_document_round_trips_without_recompiling() {
        let s = source("gemm_f16.json");
        let program = s.program().unwrap();
        assert_eq!(program.known_params()["M"], 77);
        let options = crate::tune::Variant::default().options(true);
        let compiled = crate::compile(&program, &options).unwrap();
        let doc = save(&s, &compiled, "cuda", None, &[]).unwrap();
        let back = load(&doc.to_string()).unwrap();
        assert_eq!(back.source, s);
        assert_eq!(back.target, "cuda");
        assert_eq!(back.compiled.cuda, compiled.cuda);
        assert_eq!(back.compiled.kernel_c, compiled.kernel_c);
        assert!(back.ptx.is_empty());
    }

    #[test]
    fn other_documents_are_refused_with_a_reason() {
        for (text, why) in [
            ("{", "not valid JSON"),
            ("{}", "no polyfuse_artifact version"),
            (r#"{"polyfuse_artifact": 99}"#, "version 99"),
            (
                r#"{"polyfuse_artifact": 2, "program": {"text": "{}", "name": "p"}}"#,
                "program: missing field `params`",
            ),
            // Version 1 held the cache artifact's format 2.
            (r#"{"polyfuse_artifact": 1, "program": {}}"#, "version 1"),
        ] {
            let e = load(text).err().unwrap().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn ptx_is_keyed_by_the_architecture_a_launch_looks_up() {
        let hopper = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#endif";
        assert_eq!(launch_arch(hopper, "sm_90", None).unwrap(), "sm_90a");
        assert_eq!(launch_arch(hopper, "sm_90a", None).unwrap(), "sm_90a");
        assert_eq!(launch_arch("plain", "sm_90", None).unwrap(), "sm_90");
        assert_eq!(launch_arch(hopper, "sm_80", None).unwrap(), "sm_80");
        // The result's own choice, as a launch makes it.
        assert_eq!(
            launch_arch(hopper, "sm_90", Some("sm_90")).unwrap(),
            "sm_90"
        );
        assert_eq!(
            launch_arch(hopper, "sm_100", Some("sm_90")).unwrap(),
            "compute_90"
        );
        assert!(launch_arch("plain", "compute_90", None).is_err());
    }
}
