//! `polyfuse compare`: several variants of one program side by side.
//!
//! Every variant is compiled with the GPU mapping (where the mapping fails
//! on the CPU target, without it), so the static columns describe the CUDA
//! kernels: kernels and launches, blocks and threads, shared memory per
//! block, registers and spills from ptxas (when NVRTC and ptxas are found),
//! global-memory traffic from the access relations and tiles
//! ([`super::traffic`]) and arithmetic intensity (flops of
//! `runtime::work` over that traffic). With a target, each variant is run
//! with `--check` and timed; a time counts only when its check passed.

use std::collections::HashMap;
use std::fmt::Write;

use super::ptxas::{self, KernelResources};
use super::traffic::{self, Traffic};
use super::{measure_with, MeasureTarget, Variant};
use crate::error::{Error, Result};
use crate::frontend::ast::Program;
use crate::pipeline::{compile_within, unfinished, Compiled, Options, Watch};

/// One row of the comparison.
#[derive(Debug, Clone)]
pub struct Row {
    pub variant: Variant,
    /// Why the variant could not be compiled or measured (the other fields
    /// are then empty).
    pub error: Option<String>,
    /// A note that does not make the row fail (no GPU mapping, ...).
    pub note: Option<String>,
    pub tree: String,
    pub gpu_tree: Option<String>,
    pub kernels: Vec<KernelRow>,
    /// Each kernel's launches per execution (more than one for a kernel
    /// inside a host loop, `gpu::HostLoop`), by kernel index.
    pub launches_per_kernel: Vec<usize>,
    pub traffic: Option<Traffic>,
    pub flops: Option<u64>,
    /// From ptxas, per kernel (absent without ptxas).
    pub resources: Option<Vec<KernelResources>>,
    pub time_us: Option<f64>,
    /// The cost model's estimate of the GPU program (`gpu::cost`), in us:
    /// shown beside the measured time so the model can be checked.
    pub model_us: Option<f64>,
    pub check_ok: Option<bool>,
    pub max_rel_error: Option<f64>,
    /// The declared-precision run's error (see `runtime::data::bound`).
    pub declared_rel_error: Option<f64>,
}

/// One kernel of a row.
#[derive(Debug, Clone)]
pub struct KernelRow {
    pub name: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Static plus dynamic shared memory per block, in bytes.
    pub shared_bytes: usize,
}

impl KernelRow {
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|g| u64::from(*g)).product()
    }
    pub fn threads(&self) -> u64 {
        self.block.iter().map(|b| u64::from(*b)).product()
    }
}

impl Row {
    /// Launches of kernels whose grid is not empty, in one execution
    /// (those of a host loop once per iteration).
    pub fn launches(&self) -> usize {
        self.kernels
            .iter()
            .enumerate()
            .filter(|(_, k)| k.blocks() > 0)
            .map(|(i, _)| self.launches_per_kernel.get(i).copied().unwrap_or(1))
            .sum()
    }
    pub fn intensity(&self) -> Option<f64> {
        let bytes = self.traffic.as_ref()?.bytes();
        (bytes > 0).then(|| self.flops.unwrap_or(0) as f64 / bytes as f64)
    }
    fn max_registers(&self) -> Option<u32> {
        self.resources
            .as_ref()
            .map(|r| r.iter().map(|k| k.registers).max().unwrap_or(0))
    }
    fn spills(&self) -> Option<u64> {
        self.resources
            .as_ref()
            .map(|r| r.iter().map(|k| k.spill_stores + k.spill_loads).sum())
    }
}

/// What `compare` was asked.
#[derive(Debug, Clone)]
pub struct Request {
    pub variants: Vec<Variant>,
    /// Measure on this target (None: static columns only).
    pub target: Option<MeasureTarget>,
    /// Architecture for ptxas.
    pub arch: String,
    pub runs: usize,
    pub seed: u64,
}

/// All rows of a comparison.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub program: String,
    pub params: Vec<(String, i64)>,
    pub target: Option<MeasureTarget>,
    pub device: Option<String>,
    pub rows: Vec<Row>,
}

/// Compiles (and measures) every variant. A variant that fails becomes a
/// row with its error; bad input common to all (a symbolic parameter) is
/// an error.
pub fn run(program: &Program, request: &Request) -> Result<Comparison> {
    let params = program
        .params
        .iter()
        .map(|p| {
            p.value
                .map(|v| (p.name.clone(), v))
                .ok_or_else(|| Error::Input {
                    file: program.source.clone(),
                    message: format!(
                        "parameter {} has no value; give one with --param {}=VALUE",
                        p.name, p.name
                    ),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let values: HashMap<String, i64> = params.iter().cloned().collect();
    // A variant isl's scheduler does not finish in the schedule timeout
    // (POLYFUSE_SCHEDULE_TIMEOUT, else 60 s) is a row with that error.
    let limit = Watch::from_env()?.fallback;
    let mut rows = Vec::new();
    let mut device = None;
    // On a GPU the f64 reference is computed once for all variants.
    let mut reference = None;
    for v in &request.variants {
        let mut row = Row {
            variant: v.clone(),
            error: None,
            note: None,
            tree: String::new(),
            gpu_tree: None,
            kernels: Vec::new(),
            launches_per_kernel: Vec::new(),
            traffic: None,
            flops: None,
            resources: None,
            time_us: None,
            model_us: None,
            check_ok: None,
            max_rel_error: None,
            declared_rel_error: None,
        };
        match fill(
            program,
            request,
            limit,
            &values,
            &mut row,
            &mut device,
            &mut reference,
        ) {
            Ok(()) => {}
            // Bad input and illegal options are the variant's; an
            // environment fault (no driver) is everyone's.
            Err(e @ Error::Environment(_)) => return Err(e),
            Err(e) => row.error = Some(e.to_string()),
        }
        rows.push(row);
    }
    Ok(Comparison {
        program: program.name.clone(),
        params,
        target: request.target,
        device,
        rows,
    })
}

fn fill(
    program: &Program,
    request: &Request,
    limit: std::time::Duration,
    values: &HashMap<String, i64>,
    row: &mut Row,
    device: &mut Option<String>,
    reference: &mut Option<Vec<crate::runtime::data::ReferenceOutput>>,
) -> Result<()> {
    let compile = |options: &Options| {
        compile_within(program, options, limit)?.ok_or_else(|| Error::Input {
            file: program.source.clone(),
            message: unfinished(limit),
        })
    };
    let mut gpu_options = row.variant.options(true);
    if let Some(g) = gpu_options.gpu.as_mut() {
        g.estimate = true;
    }
    let compiled = match compile(&gpu_options) {
        Ok(c) => c,
        Err(e) if request.target == Some(MeasureTarget::Cpu) => {
            row.note = Some(format!("no GPU mapping: {e}"));
            compile(&row.variant.options(false))?
        }
        Err(e) => return Err(e),
    };
    describe(&compiled, values, request, row)?;
    if let Some(target) = request.target {
        if matches!(target, MeasureTarget::Cuda(_)) && reference.is_none() {
            *reference = Some(crate::runtime::cpu::reference_outputs(
                &compiled,
                request.seed,
            )?);
        }
        let report = measure_with(
            &compiled,
            target,
            request.runs,
            request.seed,
            true,
            reference.as_deref(),
            None,
        )?;
        *device = Some(report.device.clone());
        if let Some(c) = &report.check {
            row.check_ok = Some(c.ok);
            row.max_rel_error = c.max_rel_err.is_finite().then_some(c.max_rel_err);
            row.declared_rel_error = c.declared_rel_err.is_finite().then_some(c.declared_rel_err);
            if c.ok {
                row.time_us = report.median_us;
            }
        }
    }
    Ok(())
}

/// The static columns of one compiled variant.
fn describe(
    compiled: &Compiled,
    values: &HashMap<String, i64>,
    request: &Request,
    row: &mut Row,
) -> Result<()> {
    row.tree = compiled.tree.to_string();
    row.gpu_tree = compiled.gpu_tree.as_ref().map(|t| t.to_string());
    if let Some(cuda) = &compiled.cuda {
        row.launches_per_kernel = vec![0; cuda.kernels.len()];
        for l in cuda.launches(values)? {
            if let Some(n) = row.launches_per_kernel.get_mut(l.kernel) {
                *n += 1;
            }
        }
        for k in &cuda.kernels {
            row.kernels.push(KernelRow {
                name: k.name.clone(),
                grid: k.grid_dims(values)?,
                block: k.block,
                shared_bytes: k.dynamic_shared + k.static_shared,
            });
        }
        match ptxas::resources(&cuda.source, &request.arch) {
            Ok(r) => row.resources = Some(r),
            Err(why) => {
                if row.note.is_none() {
                    row.note = Some(format!("no registers: {why}"));
                }
            }
        }
    }
    row.model_us = compiled.gpu_estimate.as_ref().map(|e| e.seconds() * 1e6);
    row.traffic = Some(traffic::measure(compiled)?);
    row.flops = Some(crate::runtime::work::measure(compiled)?.flops);
    Ok(())
}

impl Comparison {
    fn measured(&self) -> bool {
        self.target.is_some()
    }

    /// The text table (and, with `trees`, each variant's schedule tree).
    pub fn table(&self, trees: bool) -> String {
        let mut head = vec![
            "#",
            "variant",
            "kernels",
            "launches",
            "blocks",
            "threads/blk",
            "smem/blk",
            "regs",
            "spills",
            "read MB",
            "write MB",
            "flop/B",
            "model us",
        ];
        if self.measured() {
            head.extend(["check", "time us"]);
        }
        let mut rows: Vec<Vec<String>> = Vec::new();
        for (i, r) in self.rows.iter().enumerate() {
            let mut cells = vec![(i + 1).to_string(), r.variant.label()];
            if let Some(e) = &r.error {
                cells.push(format!("error: {}", first_line(e)));
                rows.push(cells);
                continue;
            }
            let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            let mb = |b: u64| format!("{:.3}", b as f64 / 1e6);
            let gpu = !r.kernels.is_empty();
            cells.extend([
                if gpu {
                    r.kernels.len().to_string()
                } else {
                    "-".into()
                },
                if gpu {
                    r.launches().to_string()
                } else {
                    "-".into()
                },
                opt(gpu.then(|| {
                    r.kernels
                        .iter()
                        .map(|k| k.blocks())
                        .sum::<u64>()
                        .to_string()
                })),
                opt(gpu.then(|| {
                    r.kernels
                        .iter()
                        .map(|k| k.threads())
                        .max()
                        .unwrap_or(0)
                        .to_string()
                })),
                opt(gpu.then(|| {
                    r.kernels
                        .iter()
                        .map(|k| k.shared_bytes)
                        .max()
                        .unwrap_or(0)
                        .to_string()
                })),
                opt(r.max_registers().map(|x| x.to_string())),
                opt(r.spills().map(|x| x.to_string())),
                opt(r.traffic.as_ref().map(|t| mb(t.read_bytes))),
                opt(r
                    .traffic
                    .as_ref()
                    .map(|t| format!("{}{}", mb(t.write_bytes), if t.exact { "" } else { "*" }))),
                opt(r.intensity().map(|x| format!("{x:.2}"))),
                opt(r.model_us.map(|t| format!("{t:.1}"))),
            ]);
            if self.measured() {
                cells.push(opt(r
                    .check_ok
                    .map(|ok| if ok { "ok" } else { "FAILED" }.into())));
                cells.push(opt(r.time_us.map(|t| format!("{t:.1}"))));
            }
            rows.push(cells);
        }
        let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (i, c) in r.iter().enumerate().take(width.len()) {
                width[i] = width[i].max(c.len());
            }
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: {} variant{} ({}){}",
            self.program,
            self.rows.len(),
            if self.rows.len() == 1 { "" } else { "s" },
            self.params
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            match &self.device {
                Some(d) => format!(", measured on {d}"),
                None => String::new(),
            }
        );
        let line = |cells: &[String], out: &mut String| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let w = width.get(i).copied().unwrap_or(0);
                if i == 1 || i + 1 == cells.len() && c.starts_with("error") {
                    let _ = write!(s, "{c:<w$}  ");
                } else {
                    let _ = write!(s, "{c:>w$}  ");
                }
            }
            let _ = writeln!(out, "{}", s.trim_end());
        };
        line(
            &head.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
            &mut out,
        );
        for r in &rows {
            line(r, &mut out);
        }
        out.push_str(
            "bytes: per tile, the footprint of every access (fixed box hull in isl) times the tiles; * marks a lower bound\n",
        );
        let notes: Vec<(usize, &str)> = self
            .rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.note.as_deref().map(|n| (i + 1, first_line(n))))
            .collect();
        if notes.len() == self.rows.len()
            && notes.len() > 1
            && notes.iter().all(|n| n.1 == notes[0].1)
        {
            let _ = writeln!(out, "note (every variant): {}", notes[0].1);
        } else {
            for (i, n) in notes {
                let _ = writeln!(out, "note {i}: {n}");
            }
        }
        if trees {
            for (i, r) in self.rows.iter().enumerate() {
                if r.error.is_some() {
                    continue;
                }
                let _ = writeln!(out, "\n# {} {}", i + 1, r.variant.label());
                out.push_str(r.gpu_tree.as_ref().unwrap_or(&r.tree));
            }
        }
        out
    }

    /// The JSON document of `compare --json`. Measured fields (`time_us`,
    /// `check`) are present only when a target was given.
    pub fn to_json(&self) -> impl serde::Serialize + '_ {
        CompareJson {
            program: &self.program,
            params: self.params.iter().map(|(n, v)| (n.as_str(), *v)).collect(),
            bytes_model: "per tile point (GPU: shared mark or thread marks; CPU: point mark), fixed box hull of each access footprint times the number of tiles",
            variants: self.rows.iter().map(|r| self.row_json(r)).collect(),
            measured_on: self.target.map(|t| MeasuredOn {
                target: t.name(),
                device: self.device.as_deref(),
            }),
        }
    }

    fn row_json<'a>(&self, r: &'a Row) -> RowJson<'a> {
        let compiled = r.error.is_none().then(|| CompiledJson {
            note: r.note.as_deref(),
            schedule_tree: &r.tree,
            gpu_tree: r.gpu_tree.as_deref(),
            kernels: r
                .kernels
                .iter()
                .map(|k| {
                    let res = r
                        .resources
                        .as_ref()
                        .and_then(|rs| rs.iter().find(|x| x.kernel == k.name));
                    KernelJson {
                        name: &k.name,
                        grid: k.grid,
                        block: k.block,
                        blocks: k.blocks(),
                        threads_per_block: k.threads(),
                        shared_bytes_per_block: k.shared_bytes,
                        registers: res.map(|x| x.registers),
                        spill_stores: res.map(|x| x.spill_stores),
                        spill_loads: res.map(|x| x.spill_loads),
                    }
                })
                .collect(),
            launches: r.launches(),
            traffic: r.traffic.as_ref().map(|t| TrafficJson {
                read_bytes: t.read_bytes,
                write_bytes: t.write_bytes,
                bytes_exact: t.exact,
                tensors: t
                    .tensors
                    .iter()
                    .map(|(tensor, read_bytes, write_bytes)| TensorTraffic {
                        tensor,
                        read_bytes: *read_bytes,
                        write_bytes: *write_bytes,
                    })
                    .collect(),
            }),
            flops: r.flops,
            arithmetic_intensity: r.intensity(),
            model_us: r.model_us,
            measured: self.measured().then(|| MeasuredJson {
                check: r.check_ok.map(|ok| CheckJson {
                    ok,
                    max_rel_error: r.max_rel_error,
                    declared_rel_error: r.declared_rel_error,
                }),
                time_us: r.time_us,
            }),
        });
        RowJson {
            variant: r.variant.canonical(),
            label: r.variant.label(),
            error: r.error.as_deref(),
            compiled,
        }
    }
}

/// The document of `compare --json`, in this order.
#[derive(serde::Serialize)]
struct CompareJson<'a> {
    program: &'a str,
    /// In the program's order.
    params: indexmap::IndexMap<&'a str, i64>,
    bytes_model: &'static str,
    variants: Vec<RowJson<'a>>,
    #[serde(flatten)]
    measured_on: Option<MeasuredOn<'a>>,
}

#[derive(serde::Serialize)]
struct MeasuredOn<'a> {
    target: &'static str,
    device: Option<&'a str>,
}

/// A variant: its error, or what its compilation gave.
#[derive(serde::Serialize)]
struct RowJson<'a> {
    variant: String,
    label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(flatten)]
    compiled: Option<CompiledJson<'a>>,
}

#[derive(serde::Serialize)]
struct CompiledJson<'a> {
    note: Option<&'a str>,
    schedule_tree: &'a str,
    gpu_tree: Option<&'a str>,
    kernels: Vec<KernelJson<'a>>,
    launches: usize,
    #[serde(flatten)]
    traffic: Option<TrafficJson<'a>>,
    flops: Option<u64>,
    arithmetic_intensity: Option<f64>,
    model_us: Option<f64>,
    #[serde(flatten)]
    measured: Option<MeasuredJson>,
}

#[derive(serde::Serialize)]
struct KernelJson<'a> {
    name: &'a str,
    grid: [u32; 3],
    block: [u32; 3],
    blocks: u64,
    threads_per_block: u64,
    shared_bytes_per_block: usize,
    registers: Option<u32>,
    spill_stores: Option<u64>,
    spill_loads: Option<u64>,
}

#[derive(serde::Serialize)]
struct TrafficJson<'a> {
    read_bytes: u64,
    write_bytes: u64,
    bytes_exact: bool,
    tensors: Vec<TensorTraffic<'a>>,
}

#[derive(serde::Serialize)]
struct TensorTraffic<'a> {
    tensor: &'a str,
    read_bytes: u64,
    write_bytes: u64,
}

#[derive(serde::Serialize)]
struct MeasuredJson {
    check: Option<CheckJson>,
    time_us: Option<f64>,
}

#[derive(serde::Serialize)]
struct CheckJson {
    ok: bool,
    max_rel_error: Option<f64>,
    declared_rel_error: Option<f64>,
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}
