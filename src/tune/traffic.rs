//! Bytes a compiled program moves to and from global memory: the sum of
//! `gpu::traffic`'s tile points over its GPU tree when it has one, else
//! over its CPU tree (see that module for the model).

use crate::error::Result;
use crate::isl::Isl;
use crate::model;
use crate::pipeline::Compiled;

/// Global-memory traffic of one execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traffic {
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// False where a footprint had no fixed box (see `gpu::traffic`).
    pub exact: bool,
    /// Per tensor: name, bytes read, bytes written.
    pub tensors: Vec<(String, u64, u64)>,
}

impl Traffic {
    pub fn bytes(&self) -> u64 {
        self.read_bytes.saturating_add(self.write_bytes)
    }
}

/// The traffic of `compiled`'s GPU tree when it has one, else of its CPU
/// tree. Every parameter must have a value.
pub fn measure(compiled: &Compiled) -> Result<Traffic> {
    compiled.param_values()?;
    let isl = Isl::new();
    let scop = model::build(&isl, &compiled.program)?;
    let tree = compiled.gpu_tree.as_ref().unwrap_or(&compiled.tree);
    let schedule = isl.schedule(&tree.to_isl_text())?;
    let points =
        crate::gpu::traffic::tile_point_traffic(&scop, &compiled.program, schedule.get_root()?)?;
    let mut traffic = Traffic {
        exact: points.iter().all(|p| p.exact),
        tensors: scop
            .tensors
            .iter()
            .map(|t| (t.name.clone(), 0, 0))
            .collect(),
        ..Default::default()
    };
    for p in &points {
        for (t, (r, w)) in traffic.tensors.iter_mut().zip(&p.tensors) {
            t.1 += r;
            t.2 += w;
        }
    }
    traffic.read_bytes = traffic.tensors.iter().map(|t| t.1).sum();
    traffic.write_bytes = traffic.tensors.iter().map(|t| t.2).sum();
    Ok(traffic)
}
