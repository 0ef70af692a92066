//! Attention decoding on tensor cores (`gpu::decoding`, the split kernel of
//! `codegen::flash`): which split-k programs are recognised, the two
//! kernels they run as, and their emulation (the first kernel's warps and
//! `mma` fragments, the second kernel's lanes and butterflies) against the
//! f64 reference at sizes that leave partial key tiles, partial slices and
//! idle lanes. The CUDA itself runs in `scripts/gpu-check.sh`.

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::{apply_param_overrides, load_file};
use polyfuse::gpu::GpuOptions;
use polyfuse::repair::Choice;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::{compile, Compiled, Options};

fn load(path: &str, sizes: &[(&str, i64)]) -> Program {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let mut p = load_file(&path).unwrap();
    let sizes: Vec<(String, i64)> = sizes.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    apply_param_overrides(&mut p, &sizes).unwrap();
    p
}

fn compiled(p: &Program, split: Option<i64>) -> Compiled {
    let options = Options {
        gpu: Some(GpuOptions {
            tensor_cores: true,
            auto_tile: true,
            ..GpuOptions::default()
        }),
        repair: split.map_or(Choice::Program, Choice::SplitK),
        ..Options::default()
    };
    compile(p, &options).unwrap_or_else(|e| panic!("{}: {e}", p.name))
}

/// Whether `c` runs as the split kernel on tensor cores and its combination.
fn on_tensor_cores(c: &Compiled) -> bool {
    let cuda = c.cuda.as_ref().unwrap();
    cuda.kernels.len() == 2
        && cuda.kernels[1].name.ends_with("_combine")
        && cuda.source.contains("pf_fa_q")
        && cuda.source.contains("pf_ldmatrix_x4_trans(")
}

/// Runs the emulation of `c` on the CPU against the f64 reference.
fn emulation_check(c: &mut Compiled, seed: u64) -> f64 {
    c.kernel_c = c.emulation_c.clone().unwrap();
    let r = run(
        c,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed,
        },
    )
    .unwrap();
    let check = r.check.unwrap();
    assert!(check.ok, "{}: {}", c.program.name, check.line());
    check.max_rel_err
}

#[test]
fn decoding_with_query_rows_runs_on_tensor_cores_off_the_tile_and_slice_grids() {
    // KV = 61: one partial key tile; KV = 300 in 7 slices of 43 keys: key
    // tiles that straddle slices; 3 slices: lanes without a slice in the
    // combination; 150 slices of 2 keys: most of a block's tile masked,
    // and more slices than lanes (several a lane, a partial unroll).
    for (name, sizes, split) in [
        ("attention_decode_causal", vec![("KV", 61), ("D", 32)], None),
        (
            "attention_decode_causal",
            vec![("KV", 300), ("D", 16), ("NQ", 3)],
            Some(7),
        ),
        ("attention_decode_causal", vec![("KV", 300)], Some(3)),
        ("attention_decode_causal", vec![("KV", 300)], Some(150)),
        ("attention_decode_gqa", vec![("KV", 61), ("D", 32)], None),
        ("attention_decode_gqa", vec![("KV", 200), ("R", 5)], Some(6)),
    ] {
        let p = load(&format!("examples/{name}.json"), &sizes);
        let mut c = compiled(&p, split);
        assert!(
            on_tensor_cores(&c),
            "{name} {sizes:?} is not on tensor cores"
        );
        let cuda = c.cuda.as_ref().unwrap();
        // The scores, weights and value products never go through memory:
        // the first kernel writes the local states, the second reads them.
        for t in ["t_P[", "t_T[", "t_E[", "t_M[", "t_L[", "t_O["] {
            assert!(!cuda.source.contains(t), "{name}: {t} in the kernels");
        }
        assert!(cuda.source.contains("t_O_local["));
        // The combination: a warp per (row, column), four a block.
        let d = p.evaluate(&p.tensor("Y").unwrap().shape.as_ref().unwrap()[3]);
        let d = d.unwrap_or_else(|| panic!("{name}: no D"));
        assert_eq!(cuda.kernels[1].block, [128, 1, 1]);
        assert_eq!(
            cuda.kernels[1].grid[2],
            polyfuse::codegen::ast::Expr::Int((d + 3) / 4),
            "{name}"
        );
        let err = emulation_check(&mut c, sizes.len() as u64 + split.unwrap_or(0) as u64);
        // The weights are split in two f16 terms: the output's own
        // rounding (f16, 2^-11) dominates the error.
        assert!(err < 1e-3, "{name} {sizes:?}: {err}");
    }
}

#[test]
fn the_combination_folds_the_slices_across_lanes_and_each_warp_writes_its_column() {
    let p = load(
        "bench/programs/attention_decode_causal_b1h32kv32768d128.json",
        &[],
    );
    let c = compiled(&p, None);
    assert!(on_tensor_cores(&c));
    let src = &c.cuda.as_ref().unwrap().source;
    let combine = &src[src.find("kernel_0_combine(").unwrap()..];
    // Lanes on consecutive slices, a butterfly of max for the predecessor
    // and of sums for the targets, and the output written by lane 0.
    assert!(combine.contains("for (pf_i pf_s = pf_l; pf_s < 64; pf_s += 32)"));
    assert!(combine.contains("fmaxf(pf_v, __shfl_xor_sync(0xffffffffu, pf_v, pf_o))"));
    assert!(combine.contains("pf_v + __shfl_xor_sync(0xffffffffu, pf_v, pf_o)"));
    assert!(combine.contains("if (pf_l == 0) t_Y["));
    // The first kernel keeps two key tiles in flight: three stages.
    assert!(src.contains("% 3)"));
    assert!(src.contains("pf_cp_async_wait<2>();"));
}

#[test]
fn decoding_outside_the_form_keeps_the_ordinary_mapping_and_stays_correct() {
    // A head dimension that is no multiple of 16; one query a head (no
    // row index: the kernel's 16-row tiles need one).
    for (name, sizes) in [
        ("attention_decode_causal", vec![("KV", 61), ("D", 13)]),
        ("attention_decode_gqa", vec![("KV", 61), ("D", 13)]),
        ("attention_decode_alibi", vec![("KV", 61)]),
        ("attention_decode_softcap", vec![("KV", 61)]),
    ] {
        let p = load(&format!("examples/{name}.json"), &sizes);
        let mut c = compiled(&p, None);
        assert!(!on_tensor_cores(&c), "{name}");
        assert!(
            !c.cuda.as_ref().unwrap().source.contains("pf_fa_q"),
            "{name}"
        );
        emulation_check(&mut c, 13);
    }
}
