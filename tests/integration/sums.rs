//! Two products summed into one accumulator (issue 35: an LSTM cell's
//! gates, `G +=! X W; G += H U`) run in one tensor-core kernel, a
//! reduction loop each over the same accumulators (`schedule::sums`,
//! `gpu::contraction`'s terms), at sizes where isl left the sums apart and
//! where it fused them with a loop each; checked on the CPU and in the
//! emulation of the GPU mapping at sizes off every tile.

use std::process::{Command, Output};

fn polyfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_polyfuse"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const CELL: &str = "examples/lstm_cell.json";

/// The CUDA of the LSTM cell at `params`, split into its kernels' texts.
fn kernels(params: &[&str]) -> Vec<String> {
    let mut args = vec!["schedule", CELL, "--emit", "cuda", "--no-cache"];
    for p in params {
        if p.starts_with("--") {
            args.push(p);
        } else {
            args.extend(["--param", p]);
        }
    }
    let out = polyfuse(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cuda = String::from_utf8_lossy(&out.stdout).into_owned();
    cuda.split("__global__").skip(1).map(String::from).collect()
}

#[test]
fn both_gate_products_run_in_one_tensor_core_kernel() {
    // The example's sizes (isl puts the second sum in a loop nest of its
    // own), sizes off the tiles, and I = 300 (past isl's constant shifts:
    // isl fuses the sums itself, each reduction in a loop below).
    for params in [
        &[][..],
        &["B=37", "I=29", "H=13"][..],
        &["B=70", "I=300", "H=45"][..],
        // isl prints the block's loops in two pieces here, by statement.
        &["B=37", "I=29", "H=13", "--tile=64,64,64"][..],
    ] {
        let ks = kernels(params);
        assert_eq!(ks.len(), 2, "{params:?}: {} kernels", ks.len());
        let gates = &ks[0];
        // Both products' operands read in the one kernel (every kernel
        // takes every tensor as a parameter: the reads are `&t_X[`), the
        // second sum a pipeline of its own (on each engine) after the
        // first, each region printed once.
        for t in ["&t_X[", "&t_W[", "&t_Hp[", "&t_U["] {
            assert!(
                gates.contains(t),
                "{params:?}: {t} not in the gates' kernel"
            );
        }
        // One region per engine (wgmma and mma.sync where the tile fits
        // wgmma, else mma.sync alone), each with the further sum.
        let regions = gates.matches("/* tensor cores:").count();
        assert!(
            regions == 1 || regions == 2,
            "{params:?}: {regions} tensor-core regions"
        );
        assert_eq!(
            gates.matches("then S1's sum").count(),
            regions,
            "{params:?}: one further sum per region"
        );
        // The nonlinearities read the gates in the next kernel.
        assert!(!ks[1].contains("&t_X["), "{params:?}");
    }
}

#[test]
fn the_fused_gates_check_on_the_cpu_and_in_the_emulation() {
    for params in [["B=37", "I=29", "H=13"], ["B=70", "I=300", "H=45"]] {
        for target in [&["--target", "cpu"][..], &["--target", "emulate"][..]] {
            for tiles in [&[][..], &["--tile", "64,64,64"][..]] {
                let mut args = vec!["run", CELL, "--check"];
                args.extend(target);
                args.extend(tiles);
                for p in params {
                    args.extend(["--param", p]);
                }
                let out = polyfuse(&args);
                assert!(
                    out.status.code() == Some(0) && text(&out).contains("check: ok"),
                    "{args:?}: {}",
                    text(&out)
                );
            }
        }
    }
}
