//! The `"schedule"` key: a concise transformation template in the manner of
//! Neptune's, a list of steps applied in order.
//!
//! ```json
//! "schedule": [
//!   { "rolling-update": ["Z", "O"] },
//!   { "split-k": ["Z", "O"], "factor": 8 },
//!   { "privatize": "M", "factor": 8 },
//!   { "tile": [32, 32] }
//! ]
//! ```
//!
//! * `rolling-update`: the named target reductions (by the tensor they
//!   reduce into) are fused with their reduce predecessors under the
//!   rolling loop and repaired (Eq. 7). Targets named together share their
//!   predecessors' loop and cache.
//! * `split-k`: the targets and their predecessors are split into `factor`
//!   slices of the reduction loop, reduced locally per slice (in parallel)
//!   and combined globally with the repair (Eq. 8).
//! * `privatize`: one reduction split into `factor` local partial results
//!   and their global combination.
//! * `tile`: tile sizes, as `--tile` gives them.

use crate::error::{Error, Result};

/// One step of the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    RollingUpdate(Vec<String>),
    SplitK { targets: Vec<String>, factor: i64 },
    Privatize { tensor: String, factor: i64 },
    Tile(Vec<i64>),
}

fn names(v: &serde_json::Value) -> Option<Vec<String>> {
    match v {
        serde_json::Value::String(s) => Some(vec![s.clone()]),
        serde_json::Value::Array(a) => a.iter().map(|x| x.as_str().map(String::from)).collect(),
        _ => None,
    }
}

/// Parses the `schedule` key of `file`.
pub fn parse(file: &str, value: &serde_json::Value) -> Result<Vec<Step>> {
    let bad = |message: String| Error::Input {
        file: file.to_string(),
        message: format!("`schedule`: {message}"),
    };
    let steps = value.as_array().ok_or_else(|| {
        bad("expected a list of steps such as [{\"rolling-update\": [\"S\"]}]".into())
    })?;
    let mut out = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let obj = step
            .as_object()
            .ok_or_else(|| bad(format!("step {} is not an object", n + 1)))?;
        let factor = || -> Result<i64> {
            let f = obj
                .get("factor")
                .ok_or_else(|| bad(format!("step {} needs a \"factor\"", n + 1)))?;
            match f.as_i64() {
                Some(v) if v >= 2 => Ok(v),
                _ => Err(bad(format!(
                    "step {}: \"factor\" must be an integer >= 2, not {f}",
                    n + 1
                ))),
            }
        };
        let key = obj
            .keys()
            .find(|k| k.as_str() != "factor")
            .ok_or_else(|| bad(format!("step {} names no transformation", n + 1)))?;
        let allowed: &[&str] = match key.as_str() {
            "split-k" | "privatize" => &["factor"],
            _ => &[],
        };
        if let Some(extra) = obj
            .keys()
            .find(|k| *k != key && !allowed.contains(&k.as_str()))
        {
            return Err(bad(format!("step {}: unexpected key \"{extra}\"", n + 1)));
        }
        let v = &obj[key];
        let targets = || {
            names(v)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| bad(format!("step {}: \"{key}\" takes tensor names", n + 1)))
        };
        out.push(match key.as_str() {
            "rolling-update" => Step::RollingUpdate(targets()?),
            "split-k" => Step::SplitK {
                targets: targets()?,
                factor: factor()?,
            },
            "privatize" => {
                let t = targets()?;
                if t.len() != 1 {
                    return Err(bad(format!("step {}: privatize takes one tensor", n + 1)));
                }
                Step::Privatize {
                    tensor: t[0].clone(),
                    factor: factor()?,
                }
            }
            "tile" => {
                let sizes: Option<Vec<i64>> = v
                    .as_array()
                    .and_then(|a| a.iter().map(|x| x.as_i64().filter(|s| *s >= 1)).collect());
                Step::Tile(sizes.ok_or_else(|| {
                    bad(format!("step {}: \"tile\" takes a list of sizes >= 1", n + 1))
                })?)
            }
            other => {
                return Err(bad(format!(
                    "step {}: unknown transformation \"{other}\" (known: rolling-update, split-k, privatize, tile)",
                    n + 1
                )))
            }
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_step() {
        let v = serde_json::json!([
            {"rolling-update": ["Z", "O"]},
            {"split-k": "Z", "factor": 4},
            {"privatize": "M", "factor": 2},
            {"tile": [32, 16]}
        ]);
        let s = parse("f", &v).unwrap();
        assert_eq!(
            s,
            vec![
                Step::RollingUpdate(vec!["Z".into(), "O".into()]),
                Step::SplitK {
                    targets: vec!["Z".into()],
                    factor: 4
                },
                Step::Privatize {
                    tensor: "M".into(),
                    factor: 2
                },
                Step::Tile(vec![32, 16]),
            ]
        );
    }

    #[test]
    fn refuses_bad_steps() {
        for (v, want) in [
            (serde_json::json!({"tile": 3}), "list of steps"),
            (
                serde_json::json!([{"fuse": ["Z"]}]),
                "unknown transformation",
            ),
            (
                serde_json::json!([{"split-k": ["Z"]}]),
                "needs a \"factor\"",
            ),
            (serde_json::json!([{"split-k": ["Z"], "factor": 1}]), ">= 2"),
            (
                serde_json::json!([{"rolling-update": ["Z"], "factor": 2}]),
                "unexpected key",
            ),
        ] {
            let e = parse("f", &v).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
