//! The CUDA runtime and the work counts every target reports. Most of this
//! runs without a GPU: the exit status and message where no driver exists,
//! the exact bytes and flops, launch grids, NVRTC compilation (when the
//! NVRTC library is present; otherwise skipped with a note). The tests
//! that launch kernels run only where a CUDA device is usable.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use polyfuse::frontend::load_str;
use polyfuse::gpu::{CudaProgram, Kernel, KernelArg};
use polyfuse::isl::ast::{Expr, Op};
use polyfuse::runtime::cpu::{self, RunOptions};
use polyfuse::runtime::{cuda, work};
use polyfuse::{compile, Error, Options};

fn polyfuse() -> Command {
    Command::new(env!("CARGO_BIN_EXE_polyfuse"))
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
        .display()
        .to_string()
}

fn gemm(m: i64, n: i64, k: i64, dtype: &str) -> String {
    format!(
        r#"{{ "name": "gemm", "params": {{ "M": {m}, "N": {n}, "K": {k} }},
             "inputs": {{ "A": {{"dtype": "{dtype}", "shape": ["M", "K"]}}, "B": {{"dtype": "{dtype}", "shape": ["K", "N"]}} }},
             "outputs": {{ "C": {{"dtype": "{dtype}", "shape": ["M", "N"]}} }},
             "body": [ "C(i, j) +=! A(i, k) * B(k, j)" ] }}"#
    )
}

/// Whether the CUDA driver library can be found the way the loader finds
/// it: in the ld.so cache or a folder of `LD_LIBRARY_PATH`.
fn driver_present() -> bool {
    let in_cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
        .unwrap_or(false);
    let in_path = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|d| Path::new(d).join("libcuda.so.1").exists());
    in_cache || in_path
}

#[test]
fn cuda_target_without_a_driver_is_an_environment_fault() {
    if driver_present() {
        eprintln!("note: a CUDA driver is installed here; the no-driver exit status is not tested");
        return;
    }
    let out = polyfuse()
        .args(["run", &example("gemm.json"), "--target", "cuda", "--check"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert!(stderr.contains("no CUDA driver found"), "{stderr}");
    assert!(stderr.contains("--target cpu"), "{stderr}");
    assert!(out.stdout.is_empty());
    // The library API says the same, with the same variant.
    assert!(matches!(cuda::probe_driver(), Err(Error::Environment(_))));
}

#[test]
fn gemm_work_is_two_mnk_flops_and_its_operands_once() {
    let (m, n, k) = (37i64, 53i64, 29i64);
    let c = compile(
        &load_str(&gemm(m, n, k, "f32"), "gemm.json").unwrap(),
        &Options::default(),
    )
    .unwrap();
    let w = work::measure(&c).unwrap();
    assert_eq!(w.flops, (2 * m * n * k) as u64);
    assert_eq!(w.bytes, (4 * (m * k + k * n + m * n)) as u64);
    let names: Vec<_> = w
        .statements
        .iter()
        .map(|s| (s.name.as_str(), s.instances, s.flops_per_instance))
        .collect();
    assert_eq!(
        names,
        vec![
            ("S0_init", (m * n) as u64, 0),
            ("S0", (m * n * k) as u64, 2)
        ]
    );
    // f16 halves the bytes, not the flops.
    let h = compile(
        &load_str(&gemm(m, n, k, "f16"), "gemm.json").unwrap(),
        &Options::default(),
    )
    .unwrap();
    let wh = work::measure(&h).unwrap();
    assert_eq!(wh.bytes * 2, w.bytes);
    assert_eq!(wh.flops, w.flops);
}

#[test]
fn large_gemm_counts_without_enumerating() {
    // 2^33 instances: counted from the box, in well under a second.
    let c = compile(
        &load_str(&gemm(2048, 2048, 2048, "f32"), "gemm.json").unwrap(),
        &Options::default(),
    )
    .unwrap();
    let start = std::time::Instant::now();
    let w = work::measure(&c).unwrap();
    assert_eq!(w.flops, 2 * 2048u64.pow(3));
    assert!(start.elapsed().as_secs() < 10);
}

#[test]
fn causal_mask_counts_exactly() {
    // Row max of a causally masked score matrix, then a masked exp-sum:
    // every (b, i) row has i + 1 instances.
    let (b, n) = (3i64, 50i64);
    let json = format!(
        r#"{{ "name": "causal", "params": {{ "B": {b}, "N": {n} }},
             "inputs": {{ "S": {{"dtype": "f32", "shape": ["B", "N", "N"]}} }},
             "outputs": {{ "Z": {{"dtype": "f32", "shape": ["B", "N"]}} }},
             "temps": {{ "M": {{"dtype": "f32", "shape": ["B", "N"]}} }},
             "body": [ "M(b, i) max=! S(b, i, j) where j <= i",
                       "Z(b, i) +=! exp(S(b, i, j) - M(b, i)) where j <= i" ] }}"#
    );
    let c = compile(
        &load_str(&json, "causal.json").unwrap(),
        &Options::default(),
    )
    .unwrap();
    let w = work::measure(&c).unwrap();
    let tri = (b * n * (n + 1) / 2) as u64;
    let got: Vec<_> = w
        .statements
        .iter()
        .map(|s| (s.name.as_str(), s.instances, s.flops_per_instance))
        .collect();
    assert_eq!(
        got,
        vec![
            ("S0_init", (b * n) as u64, 0),
            ("S0", tri, 1),
            ("S1_init", (b * n) as u64, 0),
            // exp, the subtraction, the combine
            ("S1", tri, 3),
        ]
    );
    assert_eq!(w.flops, tri * 4);
    // inputs and outputs once; the temp M is not counted
    assert_eq!(w.bytes, (4 * (b * n * n + b * n)) as u64);
}

#[test]
fn strided_window_counts_exactly() {
    // maxpool2x2: the window `where u in 0:2, v in 0:2` is a box.
    let c = compile(
        &polyfuse::frontend::load_file(Path::new(&example("maxpool2x2.json"))).unwrap(),
        &Options::default(),
    )
    .unwrap();
    let w = work::measure(&c).unwrap();
    let outputs: u64 = cpu::tensor_counts(&c).unwrap()[1] as u64;
    let update = w.statements.iter().find(|s| s.name == "S0").unwrap();
    assert_eq!(update.instances, 4 * outputs);
    assert_eq!(update.flops_per_instance, 1);
}

#[test]
fn run_json_reports_work_and_check() {
    let out = polyfuse()
        .args([
            "run",
            &example("gemm.json"),
            "--check",
            "--bench",
            "--runs",
            "2",
            "--json",
            "--param",
            "M=20",
            "--param",
            "N=30",
            "--param",
            "K=10",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["program"], "gemm");
    assert_eq!(v["target"], "cpu");
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["check"]["ok"], true);
    assert_eq!(v["check"]["tensor"], "C");
    assert!(v["check"]["max_rel_error"].as_f64().unwrap() <= 1e-4);
    assert_eq!(v["runs"], 2);
    assert_eq!(v["flops"], 2 * 20 * 30 * 10);
    assert_eq!(v["bytes"], 4 * (20 * 10 + 10 * 30 + 20 * 30));
    let us = v["median_us"].as_f64().unwrap();
    let gbs = v["gb_per_s"].as_f64().unwrap();
    assert!((gbs - 4.0 * 1100.0 / (us * 1e3)).abs() < 1e-9 * gbs.max(1.0));
    assert!(v["tflop_per_s"].as_f64().unwrap() > 0.0);
    // Per-kernel times are the GPU's; the CPU runs one function.
    assert_eq!(v["kernels"], serde_json::json!([]));
}

#[test]
fn run_lines_carry_rates() {
    let out = polyfuse()
        .args(["run", &example("matvec.json"), "--bench", "--runs", "2"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let time = stdout.lines().find(|l| l.starts_with("time: ")).unwrap();
    assert!(time.contains(" us over 2 runs ("), "{time}");
    assert!(
        time.ends_with(" TFLOP/s)") && time.contains(" GB/s, "),
        "{time}"
    );
}

fn div(a: Expr, b: i64) -> Expr {
    Expr::Op(Op::FloorDiv, vec![a, Expr::Int(b)])
}

fn add(a: Expr, b: i64) -> Expr {
    Expr::Op(Op::Add, vec![a, Expr::Int(b)])
}

#[test]
fn grids_evaluate_in_the_parameters() {
    let k = Kernel {
        name: "k0".into(),
        grid: [
            div(add(Expr::Id("N".into()), 31), 32),
            Expr::Op(Op::Min, vec![Expr::Id("M".into()), Expr::Int(4)]),
            Expr::Int(1),
        ],
        block: [32, 8, 1],
        dynamic_shared: 0,
        static_shared: 0,
        dependent: false,
        globals: Vec::new(),
        tensor_maps: Vec::new(),
    };
    let p = |n: i64, m: i64| HashMap::from([("N".to_string(), n), ("M".to_string(), m)]);
    assert_eq!(k.grid_dims(&p(100, 9)).unwrap(), [4, 4, 1]);
    assert_eq!(k.grid_dims(&p(64, 2)).unwrap(), [2, 2, 1]);
    // an empty grid: the runtime skips the kernel
    assert_eq!(k.grid_dims(&p(0, 3)).unwrap(), [0, 3, 1]);
    assert_eq!(k.grid_dims(&p(100, -5)).unwrap(), [4, 0, 1]);
    // a parameter without a value is an internal error, not a panic
    let missing = HashMap::from([("N".to_string(), 10)]);
    assert!(matches!(k.grid_dims(&missing), Err(Error::Internal(_))));
}

const SCALE: &str = r#"#include <cuda_fp16.h>
extern "C" __global__ void scale(const float *X, float *Y, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) Y[i] = __half2float(__float2half(2.0f)) * X[i];
}
"#;

/// NVRTC's PTX for a small kernel, or `None` (with a note) where NVRTC is
/// not installed.
fn ptx_or_skip(source: &str, arch: &str) -> Option<String> {
    match cuda::compile_ptx(source, arch) {
        Ok(ptx) => Some(ptx),
        Err(Error::Environment(m)) => {
            eprintln!("note: NVRTC is not available, skipping: {m}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn nvrtc_compiles_to_ptx_without_a_gpu() {
    let Some(ptx) = ptx_or_skip(SCALE, "sm_80") else {
        return;
    };
    assert!(ptx.contains(".entry scale"), "{ptx}");
    assert!(ptx.contains(".target sm_80"), "{ptx}");
    // A compile error is an internal error with NVRTC's log and the saved
    // source.
    let err = cuda::compile_ptx(
        "extern \"C\" __global__ void bad() { undefined_name; }",
        "sm_90",
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Internal(_)), "{msg}");
    assert!(msg.contains("undefined_name"), "{msg}");
    assert!(msg.contains(".cu"), "{msg}");
    // A bad architecture is the user's error.
    assert!(matches!(
        cuda::compile_ptx(SCALE, "sm90"),
        Err(Error::Input { .. })
    ));
}

/// A program `Y(i) = 2 * X(i)` compiled for the GPU, with a hand-written
/// CUDA kernel in place of the printer's.
fn scale_program(n: i64, body: &str) -> polyfuse::Compiled {
    let json = r#"{ "name": "scale", "params": { "N": null },
             "inputs": { "X": {"dtype": "f32", "shape": ["N"]} },
             "outputs": { "Y": {"dtype": "f32", "shape": ["N"]} },
             "body": [ "Y(i) = 2 * X(i)" ] }"#;
    let mut p = load_str(json, "scale.json").unwrap();
    polyfuse::frontend::apply_param_overrides(&mut p, &[("N".into(), n)]).unwrap();
    let mut c = compile(&p, &Options::default()).unwrap();
    c.cuda = Some(CudaProgram {
        source: body.to_string(),
        kernels: vec![Kernel {
            name: "scale".into(),
            grid: [
                div(add(Expr::Id("N".into()), 127), 128),
                Expr::Int(1),
                Expr::Int(1),
            ],
            block: [128, 1, 1],
            dynamic_shared: 0,
            static_shared: 0,
            dependent: false,
            globals: vec!["X".into(), "Y".into()],
            tensor_maps: Vec::new(),
        }],
        args: vec![
            KernelArg::Tensor {
                name: "X".into(),
                dtype: polyfuse::frontend::ast::DType::F32,
                shape: vec!["N".into()],
            },
            KernelArg::Tensor {
                name: "Y".into(),
                dtype: polyfuse::frontend::ast::DType::F32,
                shape: vec!["N".into()],
            },
            KernelArg::Param { name: "N".into() },
        ],
        host_loops: Vec::new(),
    });
    c
}

#[test]
fn reference_outputs_match_the_cpu_run_inputs() {
    let c = scale_program(300, SCALE);
    let r = cpu::reference_outputs(&c, 7).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].name, "Y");
    let x = polyfuse::runtime::data::to_f64(
        polyfuse::frontend::ast::DType::F32,
        &polyfuse::runtime::data::random_bytes(polyfuse::frontend::ast::DType::F32, 300, 7),
    );
    let want: Vec<f64> = x.iter().map(|v| 2.0 * v).collect();
    assert_eq!(r[0].reference, want);
    // Doubling an f32 is exact: the declared-precision run agrees.
    assert_eq!(r[0].declared, want);
}

/// Runs on the GPU, or `None` with a note where no device is usable.
fn gpu_run_or_skip(c: &polyfuse::Compiled) -> Option<polyfuse::runtime::RunReport> {
    let opts = RunOptions {
        check: true,
        bench_runs: 3,
        seed: 5,
    };
    match cuda::run(c, &opts) {
        Ok(r) => Some(r),
        Err(Error::Environment(m)) => {
            eprintln!("note: no usable GPU, skipping: {m}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn hand_written_kernel_runs_and_checks_on_a_gpu() {
    let Some(r) = gpu_run_or_skip(&scale_program(1000, SCALE)) else {
        return;
    };
    let check = r.check.unwrap();
    assert!(check.ok, "{}", check.line());
    assert_eq!(r.launches, 1);
    assert!(r.device.contains("sm_"), "{}", r.device);
    assert!(r.median_us.unwrap() > 0.0);
    // `--bench` also times the kernel on its own.
    assert_eq!(r.kernel_us.len(), 1, "{:?}", r.kernel_us);
    assert_eq!(r.kernel_us[0].0, "scale");
    assert!(r.kernel_us[0].1 > 0.0, "{:?}", r.kernel_us);
    assert_eq!(r.work.flops, 1000);
    assert_eq!(r.work.bytes, 8000);
}

#[test]
fn unwritten_elements_fail_the_check_on_a_gpu() {
    // Writes only the first half: the poisoned second half must fail.
    let half = SCALE.replace("if (i < n)", "if (i < n / 2)");
    let Some(r) = gpu_run_or_skip(&scale_program(1000, &half)) else {
        return;
    };
    let check = r.check.unwrap();
    assert!(!check.ok, "{}", check.line());
    assert_eq!(check.worst.as_ref().map(|w| w.0.as_str()), Some("Y"));
}
