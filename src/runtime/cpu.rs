//! The CPU target: the emitted C (kernel and f64 reference) with a small
//! `main` is compiled by the system C compiler (`$CC`, else `cc`) and run in
//! a scratch directory. Inputs go in, outputs and, for a check, the outputs
//! of the reference and of the declared-precision run come back as files; timing uses `CLOCK_MONOTONIC`, median of the runs after
//! one warm-up.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::data::{self, CheckResult, ReferenceOutput};
use super::RunReport;
use crate::codegen::c::{DTYPE_HELPERS, PRELUDE};
use crate::error::{Error, Result};
use crate::frontend::ast::{DType, TensorRole};
use crate::pipeline::Compiled;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub check: bool,
    /// Timed runs (0: no timing).
    pub bench_runs: usize,
    pub seed: u64,
}

/// A scratch directory, removed on drop unless it was made in the folder
/// `POLYFUSE_KEEP_SCRATCH` names (to read the C that ran: `program.c` and
/// its inputs and outputs). The library prints nothing (issue 31), so the
/// user names the folder rather than being told where it went.
struct Scratch {
    dir: PathBuf,
    keep: bool,
}

impl Scratch {
    fn new() -> Result<Scratch> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let kept = std::env::var_os("POLYFUSE_KEEP_SCRATCH").filter(|v| !v.is_empty());
        let base = kept.clone().map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!(
            "polyfuse-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Environment(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Scratch {
            dir,
            keep: kept.is_some(),
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Element counts of every tensor, at the program's parameter values.
pub fn tensor_counts(compiled: &Compiled) -> Result<Vec<usize>> {
    // A parameter without a value is an input error with its own message.
    compiled.param_values()?;
    compiled
        .tensors
        .iter()
        .map(|t| {
            let count = t.elements(&compiled.program).ok_or_else(|| {
                Error::Internal(format!("the extents of {} are not known", t.name))
            })?;
            usize::try_from(count).map_err(|_| Error::Internal("tensor too large".into()))
        })
        .collect()
}

/// The C program that runs `kernel_c` (which defines `pf_kernel`) and, for
/// a check, the reference and the declared-precision run (`pf_reference`,
/// `pf_declared`) on one set of inputs.
/// The kernel and the references as calls the compiler may not analyse
/// across. GCC 12.2 (Debian's) at -O1 and above dropped the call to a
/// correct `pf_kernel` from `main` altogether (its interprocedural
/// mod/ref and pure-const analyses together; either one off, or
/// `noipa`, keeps it), so `run --check` compared zeros with the reference
/// (`tests/fuzz/found/update_after_assign_wrong_result.json`). The
/// functions run once or a few times; nothing inside them is lost.
const OPAQUE_ENTRY_POINTS: &str = "#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noipa)) void pf_kernel(const long *pf_params, void **pf_tensors);
__attribute__((noipa)) void pf_reference(const long *pf_params, void **pf_tensors);
__attribute__((noipa)) void pf_declared(const long *pf_params, void **pf_tensors);
#endif
";

fn harness(compiled: &Compiled, counts: &[usize], kernel_c: &str) -> Result<String> {
    let values = compiled.param_values()?;
    let reference = compiled.reference_c.as_ref().ok_or_else(|| {
        Error::Internal("no reference for a program with symbolic parameters".into())
    })?;
    let mut s = String::new();
    s.push_str("#define _POSIX_C_SOURCE 199309L\n");
    s.push_str(PRELUDE);
    s.push_str(DTYPE_HELPERS);
    s.push_str("#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\n\n");
    s.push_str(OPAQUE_ENTRY_POINTS);
    s.push_str(kernel_c);
    s.push('\n');
    s.push_str(reference);
    let nt = compiled.tensors.len();
    let list = |v: Vec<String>| v.join(", ");
    let _ = write!(
        s,
        r#"
static double pf_now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }}
static int pf_cmp(const void *a, const void *b) {{ double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }}
static double pf_get(int dtype, const void *p, long i) {{
  switch (dtype) {{
  case 0: return ((const float *)p)[i];
  case 1: return pf_h2f(((const uint16_t *)p)[i]);
  case 2: return pf_b2f(((const uint16_t *)p)[i]);
  case 3: return ((const double *)p)[i];
  case 5: return (double)((const long long *)p)[i];
  case 6: return ((const uint8_t *)p)[i];
  case 7: return ((const uint8_t *)p)[i] != 0;
  case 8: return pf_e4m3_2f(((const uint8_t *)p)[i]);
  case 9: return pf_e5m2_2f(((const uint8_t *)p)[i]);
  default: return ((const int *)p)[i];
  }}
}}
int main(int argc, char **argv) {{
  if (argc != 7) return 64;
  long params[] = {{ {params} }};
  long counts[{nt}] = {{ {counts} }};
  int sizes[{nt}] = {{ {sizes} }};
  int dtypes[{nt}] = {{ {dtypes} }};
  int roles[{nt}] = {{ {roles} }};
  void *t[{nt}];
  double *r[{nt}];
  FILE *in = fopen(argv[1], "rb");
  if (!in) return 65;
  for (int i = 0; i < {nt}; i++) {{
    t[i] = calloc(counts[i] ? counts[i] : 1, sizes[i]);
    if (!t[i]) return 66;
    if (roles[i] == 0 && fread(t[i], sizes[i], counts[i], in) != (size_t)counts[i]) return 67;
  }}
  fclose(in);
  pf_kernel(params, t);
  FILE *out = fopen(argv[2], "wb");
  for (int i = 0; i < {nt}; i++) if (roles[i] == 1) fwrite(t[i], sizes[i], counts[i], out);
  fclose(out);
  int runs = atoi(argv[4]);
  if (runs > 0) {{
    double *times = malloc(sizeof(double) * runs);
    pf_kernel(params, t);
    for (int k = 0; k < runs; k++) {{ double t0 = pf_now(); pf_kernel(params, t); times[k] = pf_now() - t0; }}
    qsort(times, runs, sizeof(double), pf_cmp);
    printf("median_us %.3f\n", times[runs / 2]);
  }}
  if (atoi(argv[5])) {{
    for (int run = 0; run < 2; run++) {{
      for (int i = 0; i < {nt}; i++) {{
        if (run) free(r[i]);
        r[i] = calloc(counts[i] ? counts[i] : 1, sizeof(double));
        if (!r[i]) return 66;
        if (roles[i] == 0) for (long k = 0; k < counts[i]; k++) r[i][k] = pf_get(dtypes[i], t[i], k);
      }}
      if (run) pf_declared(params, (void **)r); else pf_reference(params, (void **)r);
      FILE *ref = fopen(argv[run ? 6 : 3], "wb");
      if (!ref) return 68;
      for (int i = 0; i < {nt}; i++) if (roles[i] == 1) fwrite(r[i], sizeof(double), counts[i], ref);
      fclose(ref);
    }}
  }}
  return 0;
}}
"#,
        params = if values.is_empty() {
            "0".into()
        } else {
            list(values.iter().map(|v| v.to_string()).collect())
        },
        counts = list(counts.iter().map(|c| c.to_string()).collect()),
        sizes = list(
            compiled
                .tensors
                .iter()
                .map(|t| t.dtype.size().to_string())
                .collect()
        ),
        dtypes = list(
            compiled
                .tensors
                .iter()
                .map(|t| dtype_code(t.dtype).to_string())
                .collect()
        ),
        roles = list(
            compiled
                .tensors
                .iter()
                .map(|t| match t.role {
                    TensorRole::Input => "0",
                    TensorRole::Output => "1",
                    TensorRole::Temp => "2",
                }
                .to_string())
                .collect()
        ),
    );
    Ok(s)
}

fn dtype_code(t: DType) -> i32 {
    match t {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F64 => 3,
        DType::I32 => 4,
        DType::I64 => 5,
        DType::U8 => 6,
        DType::Bool => 7,
        DType::F8E4M3 => 8,
        DType::F8E5M2 => 9,
    }
}

fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// The C compiler's optimisation flags: `$POLYFUSE_CFLAGS` (split at
/// whitespace) where set, else `-O2 -march=native`. A test that compiles
/// hundreds of small checks can ask for `-O0`, which compiles the
/// emulation's C about four times as fast.
fn c_flags() -> Vec<String> {
    match std::env::var("POLYFUSE_CFLAGS") {
        Ok(flags) => flags.split_whitespace().map(str::to_string).collect(),
        Err(_) => vec!["-O2".into(), "-march=native".into()],
    }
}

fn compile_c(source: &Path, binary: &Path) -> Result<()> {
    let cc = c_compiler();
    let out = Command::new(&cc)
        .args(c_flags())
        .args(["-std=gnu11", "-o"])
        .arg(binary)
        .arg(source)
        .arg("-lm")
        .output()
        .map_err(|e| {
            Error::Environment(format!(
                "cannot run the C compiler `{cc}`: {e}; install gcc or set CC"
            ))
        })?;
    if !out.status.success() {
        return Err(Error::Internal(format!(
            "the C compiler rejected the generated code ({}):\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Compiles and runs `compiled` on the CPU.
pub fn run(compiled: &Compiled, opts: &RunOptions) -> Result<RunReport> {
    run_code(compiled, &compiled.kernel_c, opts)
}

/// Runs the GPU mapping of `compiled` on the CPU (blocks and threads as
/// loops: `emulation_c`), or its CPU schedule where it has no mapping.
/// The compiled program is left as it is: which code runs is the
/// runtime's choice, not a rewrite of the result.
pub fn run_emulated(compiled: &Compiled, opts: &RunOptions) -> Result<RunReport> {
    let code = compiled
        .emulation_c
        .as_deref()
        .unwrap_or(&compiled.kernel_c);
    run_code(compiled, code, opts)
}

/// Compiles and runs `kernel_c` (a `pf_kernel` for `compiled`) on the CPU.
fn run_code(compiled: &Compiled, kernel_c: &str, opts: &RunOptions) -> Result<RunReport> {
    let counts = tensor_counts(compiled)?;
    let work = super::work::measure(compiled)?;
    let (dir, stdout) = execute(compiled, kernel_c, &counts, opts)?;
    let median_us = stdout
        .lines()
        .find_map(|l| l.strip_prefix("median_us "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    let check = if opts.check {
        Some(check_outputs(compiled, &counts, &dir)?)
    } else {
        None
    };
    Ok(RunReport {
        check,
        median_us,
        runs: opts.bench_runs,
        device: "cpu".to_string(),
        launches: 1,
        work,
        kernel_us: Vec::new(),
    })
}

/// A `pf_kernel` that does nothing: the harness then runs the reference
/// alone (for targets that run the kernel elsewhere).
const NO_KERNEL: &str =
    "void pf_kernel(const long *pf_params, void **pf_tensors) { (void)pf_params; (void)pf_tensors; }\n";

/// Runs only the f64 reference and the declared-precision run on the CPU,
/// on the inputs every target makes from `seed` (input `i` from
/// `seed + i`, as in [`run`]), and returns each output's values in tensor
/// order: what another target (CUDA) compares its outputs with.
pub fn reference_outputs(compiled: &Compiled, seed: u64) -> Result<Vec<ReferenceOutput>> {
    let counts = tensor_counts(compiled)?;
    let opts = RunOptions {
        check: true,
        bench_runs: 0,
        seed,
    };
    let (dir, _) = execute(compiled, NO_KERNEL, &counts, &opts)?;
    read_references(compiled, &counts, &dir)
}

/// The outputs of the reference (`ref.bin`) and of the declared-precision
/// run (`decl.bin`) an execution with a check left in `dir`.
fn read_references(
    compiled: &Compiled,
    counts: &[usize],
    dir: &Scratch,
) -> Result<Vec<ReferenceOutput>> {
    let read = |name: &str| {
        let p = dir.dir.join(name);
        std::fs::read(&p).map_err(|e| Error::Internal(format!("{}: {e}", p.display())))
    };
    let (want, declared) = (read("ref.bin")?, read("decl.bin")?);
    let mut at = 0usize;
    let mut outputs = Vec::new();
    for (i, t) in compiled.tensors.iter().enumerate() {
        if t.role != TensorRole::Output {
            continue;
        }
        let end = at + counts[i] * 8;
        let (Some(r), Some(d)) = (want.get(at..end), declared.get(at..end)) else {
            return Err(Error::Internal(format!(
                "{}: short reference output",
                t.name
            )));
        };
        outputs.push(ReferenceOutput {
            name: t.name.clone(),
            dtype: t.dtype,
            reference: data::to_f64(DType::F64, r),
            declared: data::to_f64(DType::F64, d),
        });
        at = end;
    }
    Ok(outputs)
}

/// Compiles the harness around `kernel_c`, runs it once on the inputs of
/// `opts.seed`, and returns the scratch directory (with `out.bin` and, for
/// a check, `ref.bin` and `decl.bin`) and what the program printed.
fn execute(
    compiled: &Compiled,
    kernel_c: &str,
    counts: &[usize],
    opts: &RunOptions,
) -> Result<(Scratch, String)> {
    let dir = Scratch::new()?;
    let src = dir.dir.join("program.c");
    let bin = dir.dir.join("program");
    std::fs::write(&src, harness(compiled, counts, kernel_c)?)
        .map_err(|e| Error::Environment(format!("cannot write {}: {e}", src.display())))?;
    compile_c(&src, &bin)?;
    let mut input = Vec::new();
    for (i, t) in compiled.tensors.iter().enumerate() {
        if t.role == TensorRole::Input {
            input.extend(data::random_bytes(
                t.dtype,
                counts[i],
                opts.seed.wrapping_add(i as u64),
            ));
        }
    }
    let (fin, fout, fref, fdecl) = (
        dir.dir.join("in.bin"),
        dir.dir.join("out.bin"),
        dir.dir.join("ref.bin"),
        dir.dir.join("decl.bin"),
    );
    std::fs::write(&fin, &input).map_err(|e| Error::Environment(e.to_string()))?;
    let out = Command::new(&bin)
        .arg(&fin)
        .arg(&fout)
        .arg(&fref)
        .arg(opts.bench_runs.to_string())
        .arg(if opts.check { "1" } else { "0" })
        .arg(&fdecl)
        .output()
        .map_err(|e| Error::Environment(format!("cannot run the compiled program: {e}")))?;
    // The emulation's race detector (`codegen::race`) found two threads
    // or blocks touching one element: the mapping is wrong, not polyfuse's
    // runtime.
    if out.status.code() == Some(crate::codegen::race::EXIT_STATUS) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = stderr.lines().find(|l| l.starts_with("race in ")) {
            return Err(Error::Illegal {
                file: compiled.program.source.clone(),
                message: format!("the emulation of the GPU mapping found a {line}"),
            });
        }
    }
    if !out.status.success() {
        return Err(Error::Internal(format!(
            "the compiled program failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok((dir, stdout))
}

/// Compares the kernel's outputs in `dir` with the reference outputs.
fn check_outputs(compiled: &Compiled, counts: &[usize], dir: &Scratch) -> Result<CheckResult> {
    let fout = dir.dir.join("out.bin");
    let got =
        std::fs::read(&fout).map_err(|e| Error::Internal(format!("{}: {e}", fout.display())))?;
    let references = read_references(compiled, counts, dir)?;
    let mut at = 0usize;
    let mut values = Vec::new();
    for (i, t) in compiled.tensors.iter().enumerate() {
        if t.role != TensorRole::Output {
            continue;
        }
        let end = at + counts[i] * t.dtype.size();
        let bytes = got
            .get(at..end)
            .ok_or_else(|| Error::Internal(format!("{}: short output", fout.display())))?;
        values.push(data::to_f64(t.dtype, bytes));
        at = end;
    }
    let outputs: Vec<(&ReferenceOutput, &[f64])> = references
        .iter()
        .zip(&values)
        .map(|(r, y)| (r, &y[..]))
        .collect();
    Ok(data::compare(&outputs))
}
