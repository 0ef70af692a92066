//! Chains of maps and row reductions (issues 32 and 34): generated
//! programs of 3 to 12 statements over an R x C matrix, each map reading
//! the previous tensor and each reduction summing or maximising it along
//! the row. On the GPU the default keeps the whole chain in one kernel,
//! its rows across lanes (`gpu::lanes`); before, a map fused into the
//! loop of the reduction that reads it ran each row on one thread, and
//! the cost model then chose a kernel per statement. Each program is
//! executed in the emulation against the f64 reference at sizes off the
//! lanes' grid.

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::load_str;
use polyfuse::gpu::GpuOptions;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::{compile, Options};

/// A chain of `n` statements: maps and reductions in turn (kind `k % 3`),
/// the reductions a sum or, every other one, a maximum; a map after a
/// reduction subtracts it from the row.
fn chain(n: usize, r: i64, c: i64) -> Program {
    let mut body = Vec::new();
    let mut temps = Vec::new();
    let mut cur = "X".to_string();
    let mut state: Option<String> = None;
    for k in 1..=n {
        let last = k == n;
        let t = if last {
            "Y".to_string()
        } else {
            format!("t{k}")
        };
        if k % 3 == 2 && !last {
            let s = format!("s{k}");
            let op = if k % 2 == 0 { "+=!" } else { "max=!" };
            body.push(format!("\"{s}(r) {op} {cur}(r, c)\""));
            temps.push(format!(
                "\"{s}\": {{\"dtype\": \"f32\", \"shape\": [\"R\"]}}"
            ));
            state = Some(s);
            continue;
        }
        match &state {
            Some(s) if k % 3 == 0 => {
                body.push(format!("\"{t}(r, c) = {cur}(r, c) - {s}(r) * 0.01\""))
            }
            _ => body.push(format!("\"{t}(r, c) = tanh({cur}(r, c) * 0.5)\"")),
        }
        if !last {
            temps.push(format!(
                "\"{t}\": {{\"dtype\": \"f32\", \"shape\": [\"R\", \"C\"]}}"
            ));
        }
        cur = t;
    }
    let json = format!(
        r#"{{"name": "chain{n}", "params": {{"R": {r}, "C": {c}}},
 "inputs": {{"X": {{"dtype": "f32", "shape": ["R", "C"]}}}},
 "outputs": {{"Y": {{"dtype": "f32", "shape": ["R", "C"]}}}},
 "temps": {{{}}},
 "body": [{}]}}"#,
        temps.join(", "),
        body.join(", ")
    );
    load_str(&json, "chain.json").unwrap()
}

fn gpu() -> Options {
    Options {
        gpu: Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        }),
        ..Options::default()
    }
}

#[test]
fn a_chain_of_maps_and_row_reductions_is_one_kernel_with_its_rows_across_lanes() {
    for n in [3, 4, 7, 10, 12] {
        let c = compile(&chain(n, 4096, 1024), &gpu()).unwrap();
        let cuda = c.cuda.as_ref().unwrap();
        assert_eq!(
            cuda.kernels.len(),
            1,
            "chain of {n}: {} kernels",
            cuda.kernels.len()
        );
        let tree = c.gpu_tree.as_ref().unwrap().to_string();
        assert!(tree.contains("lanes_"), "chain of {n}: no lanes\n{tree}");
        // Every reduction of the chain is a split loop: its states combine
        // across the lanes (a reduction on one lane has no combination).
        let reductions = (1..n).filter(|k| k % 3 == 2).count();
        let combined = cuda.source.matches("__shfl_xor_sync").count();
        assert!(
            combined > 0 && reductions > 0,
            "chain of {n}: no lane combination"
        );
    }
}

#[test]
fn chains_across_lanes_compute_what_the_reference_computes() {
    for (n, r, c) in [(4, 37, 1001), (7, 5, 2000), (10, 40, 700), (12, 9, 513)] {
        let mut compiled = compile(&chain(n, r, c), &gpu()).unwrap();
        let tree = compiled.gpu_tree.as_ref().unwrap().to_string();
        assert!(
            tree.contains("lanes_"),
            "chain of {n} at {r} x {c}: no lanes"
        );
        compiled.kernel_c = compiled.emulation_c.clone().unwrap();
        let out = run(
            &compiled,
            &RunOptions {
                check: true,
                bench_runs: 0,
                seed: n as u64,
            },
        )
        .unwrap();
        let check = out.check.unwrap();
        assert!(check.ok, "chain of {n} at {r} x {c}: {}", check.line());
    }
}
