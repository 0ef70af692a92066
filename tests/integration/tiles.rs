//! The automatic tiles of `wgmma` products by the length of their
//! reduction (`gpu::contraction::two_blocks_per_sm`): the MLP's first
//! product (k = 1024, 4000 x 4096) runs 128 x 128 tiles three stages deep,
//! two blocks a multiprocessor (`__launch_bounds__(256, 2)`); its second
//! (k = 4096) keeps one block of 128 x 256 tiles and four stages. Both
//! tiles' pipelines and stores run in the emulation elsewhere
//! (`tma.rs`, `stores.rs`); the three-stage kernel checked on the GPU at
//! 2051 x 4099 x 1000 (`bench/experiments/two_blocks/ab.sh`).

use crate::common::cli::{polyfuse, text};

#[test]
fn a_short_reduction_runs_two_blocks_of_three_stages() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/suite/mlp_gelu_f16.json");
    let out = polyfuse(&["schedule", file, "--emit", "cuda"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cuda = String::from_utf8_lossy(&out.stdout);
    let regions: Vec<&str> = cuda
        .lines()
        .filter(|l| l.contains("/* tensor cores:") && l.contains("wgmma"))
        .map(str::trim)
        .collect();
    assert_eq!(
        regions,
        [
            "/* tensor cores: 128 x 128 x 64 tiles, 2 warpgroups of 64 x 128 (wgmma.m64n128k16) (3 stages) */",
            "/* tensor cores: 128 x 256 x 64 tiles, 2 warpgroups of 64 x 256 (wgmma.m64n256k16) (4 stages) */",
        ]
    );
    assert!(cuda.contains("__launch_bounds__(256, 2) kernel_0("));
    assert!(cuda.contains("__launch_bounds__(256, 1) kernel_1("));
    // A user's tile keeps four stages.
    let out = polyfuse(&["schedule", file, "--emit", "cuda", "--tile", "128,128,64"]);
    let cuda = String::from_utf8_lossy(&out.stdout);
    assert!(cuda.contains("(wgmma.m64n128k16) (4 stages)"), "{cuda}");
}

/// The three-stage pipeline of two blocks a multiprocessor, run in the
/// emulation at sizes off the tiles (the rule itself takes it only on
/// outputs too large to emulate): through `GpuOptions::wgmma_stages`, with
/// the copy engine (rows of 2000 and 528 bytes) and with `cp.async`, the
/// tile of the rule (128 x 128 x 64), unsplit so the stages are refilled.
/// Two stages are refused.
#[test]
fn a_three_stage_wgmma_pipeline_checks_in_the_emulation() {
    use polyfuse::gpu::GpuOptions;
    use polyfuse::runtime::cpu::{run, RunOptions};
    use polyfuse::{compile, Options};
    let json = r#"{"name": "three_stages", "params": {"M": 136, "N": 264, "K": 1000},
        "inputs": {"A": {"dtype": "f16", "shape": ["M", "K"]},
                   "B": {"dtype": "f16", "shape": ["K", "N"]}},
        "outputs": {"C": {"dtype": "f16", "shape": ["M", "N"]}},
        "body": ["C(i, j) +=! A(i, k) * B(k, j)"]}"#;
    let program = polyfuse::frontend::load_str(json, "three_stages.json").unwrap();
    let options = |tma: bool, stages: i64| Options {
        tile: vec![128, 128, 64],
        gpu: Some(GpuOptions {
            k_split: Some(1),
            tma,
            wgmma_stages: Some(stages),
            ..GpuOptions::default()
        }),
        ..Options::default()
    };
    for tma in [true, false] {
        let mut c = compile(&program, &options(tma, 3)).unwrap();
        let source = &c.cuda.as_ref().unwrap().source;
        assert!(source.contains("(wgmma.m64n128k16) (3 stages)"), "{source}");
        assert_eq!(source.contains("pf_tma_load2(&"), tma);
        c.kernel_c = c.emulation_c.clone().unwrap();
        let r = run(
            &c,
            &RunOptions {
                check: true,
                bench_runs: 0,
                seed: 5,
            },
        )
        .unwrap();
        let check = r.check.unwrap();
        assert!(check.ok, "tma {tma}: {}", check.line());
    }
    let refused = compile(&program, &options(true, 2)).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("a refilled wgmma pipeline of 2 stages"),
        "{refused}"
    );
}
