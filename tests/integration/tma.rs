//! Operand tiles by Hopper's copy engine (`gpu::tma`, issue 37): the
//! forms a user writes a product in (row-major, either operand
//! transposed, batched, bf16, an f32 temp with an epilogue into f16), each
//! printed with TMA copies where its rows are whole 16-byte units and run
//! in the emulation, which executes the boxes' copies (extents, zero fill,
//! swizzle) and the barriers' phases, and checked against the reference at
//! sizes off every tile; the stage refills run (a reduction of 25 k tiles
//! over 4 or 6 stages, unsplit). Where a map cannot describe the operand
//! (`--no-tma`, or rows of 2 x 1543 bytes) the threads copy, as before.
//! An attention's key and value tiles take the same copies
//! (`codegen::flash`), also run in the emulation.

use std::process::{Command, Output};

fn polyfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_polyfuse"))
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

fn scratch(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("polyfuse-tma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    file
}

/// A program of `dtype` operands with `shapes` (A, B, then the output's),
/// `temps` and `body`, its output `C` of `out_dtype`.
fn program(dtype: &str, out_dtype: &str, shapes: [&str; 3], temps: &str, body: &[&str]) -> String {
    let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"{{"name": "tma", "params": {{"Z": 2, "M": 136, "N": 72, "K": 1544}},
            "inputs": {{"A": {{"dtype": "{dtype}", "shape": {}}},
                       "B": {{"dtype": "{dtype}", "shape": {}}},
                       "bias": {{"dtype": "{dtype}", "shape": ["N"]}}}},
            "outputs": {{"C": {{"dtype": "{out_dtype}", "shape": {}}}}},
            "temps": {{ {temps} }},
            "body": [{}]}}"#,
        shapes[0],
        shapes[1],
        shapes[2],
        body.join(", ")
    )
}

const ROW_MAJOR: [&str; 3] = [r#"["M", "K"]"#, r#"["K", "N"]"#, r#"["M", "N"]"#];

/// The CUDA of `json` under `flags` (with the file's sizes), and its
/// emulation's check, which must pass.
fn cuda_and_check(name: &str, json: &str, flags: &[&str]) -> String {
    let file = scratch(name, json);
    let f = file.to_str().unwrap();
    let out = polyfuse(&[&["schedule", f, "--emit", "cuda"], flags].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cuda = String::from_utf8_lossy(&out.stdout).into_owned();
    let out = polyfuse(&[&["run", f, "--target", "emulate", "--check"], flags].concat());
    assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("check: ok"),
        "{name}: {}",
        text(&out)
    );
    cuda
}

/// Unsplit reductions, so the stages are refilled; `tile` the block's.
fn flags(tile: &'static str) -> [&'static str; 4] {
    ["--k-split", "1", "--tile", tile]
}

#[test]
fn row_major_products_copy_by_the_engine_and_check() {
    let json = program(
        "f16",
        "f32",
        ROW_MAJOR,
        "",
        &["C(i, j) +=! A(i, k) * B(k, j)"],
    );
    // Two warpgroups; and a 32-wide B in the 64-byte swizzle.
    for tile in ["128,64,64", "64,32,64"] {
        let cuda = cuda_and_check("rm.json", &json, &flags(tile));
        assert!(cuda.contains("pf_tma_load2(&"), "{tile}: no TMA copy");
        assert!(cuda.contains("const __grid_constant__ PfTensorMap pf_map_b"));
        // The refill of the step before's stage, after its release.
        assert!(cuda.contains("pf_mbar_arrive(&pf_bar_kernel_0["), "{tile}");
        // The wgmma branch (sm_90a) copies by the engine alone; the
        // mma.sync branch for other targets keeps its cp.async copies.
        let start = cuda.find("(wgmma.m64n").expect("a wgmma region");
        let end = start
            + cuda[start..]
                .find("\n#else\n")
                .expect("the region's other branch");
        let wgmma = &cuda[start..end];
        assert!(
            !wgmma.contains("pf_cp_async16_full(&pf_mma"),
            "{tile}: a cp.async copy left"
        );
    }
}

#[test]
fn transposed_operands_copy_by_the_engine_and_check() {
    // A stored K x M (m contiguous), B stored N x K (k contiguous).
    let json = program(
        "f16",
        "f32",
        [r#"["K", "M"]"#, r#"["N", "K"]"#, r#"["M", "N"]"#],
        "",
        &["C(i, j) +=! A(k, i) * B(j, k)"],
    );
    let cuda = cuda_and_check("tt.json", &json, &flags("128,64,64"));
    assert!(cuda.contains("pf_tma_load2(&"));
}

#[test]
fn batched_bf16_products_with_an_epilogue_copy_by_the_engine_and_check() {
    let json = program(
        "bf16",
        "bf16",
        [
            r#"["Z", "M", "K"]"#,
            r#"["Z", "K", "N"]"#,
            r#"["Z", "M", "N"]"#,
        ],
        r#""acc": {"dtype": "f32", "shape": ["Z", "M", "N"]}"#,
        &[
            "acc(z, i, j) +=! f32(A(z, i, k)) * f32(B(z, k, j))",
            "C(z, i, j) = bf16(tanh(acc(z, i, j) + f32(bias(j))))",
        ],
    );
    let cuda = cuda_and_check("batched.json", &json, &flags("64,64,64"));
    assert!(
        cuda.contains("pf_tma_load3(&"),
        "a rank-3 map for the batch"
    );
}

#[test]
fn without_the_engine_or_a_map_the_threads_copy() {
    let json = program(
        "f16",
        "f32",
        ROW_MAJOR,
        "",
        &["C(i, j) +=! A(i, k) * B(k, j)"],
    );
    let cuda = cuda_and_check(
        "off.json",
        &json,
        &[&flags("128,64,64")[..], &["--no-tma"]].concat(),
    );
    assert!(!cuda.contains("pf_tma_load"));
    assert!(cuda.contains("pf_cp_async16_full(&pf_mma"));
    // Rows of A of 2 x 1543 bytes: no tensor map describes them.
    let odd = json.replace("\"K\": 1544", "\"K\": 1543");
    let cuda = cuda_and_check("odd.json", &odd, &flags("128,64,64"));
    assert!(!cuda.contains("pf_tma_load"));
    assert!(!cuda.contains("PfTensorMap pf_map"));
}

/// An attention's key and value tiles by the copy engine: the prefill
/// bench programs (D = 64, so the kernel has its `wgmma` path) at 200 rows
/// (off the 64-row tiles: the last tile's rows past the tensor are the
/// engine's zeros), global and causal, f32 and f16 weights, checked in the
/// emulation, which runs the boxes and the tile barriers' phases.
#[test]
fn attention_tiles_copy_by_the_engine_and_check() {
    let root = env!("CARGO_MANIFEST_DIR");
    for name in [
        "attention_global_b4h16s4096d64",
        "attention_causal_b4h16s4096d64",
        "attention_causal_f16w_b4h16s4096d64",
    ] {
        let file = format!("{root}/bench/programs/{name}.json");
        let sizes = ["--param", "B=1", "--param", "H=2", "--param", "S=200"];
        let out = polyfuse(&[&["schedule", file.as_str(), "--emit", "cuda"], &sizes[..]].concat());
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let cuda = String::from_utf8_lossy(&out.stdout);
        assert!(
            cuda.contains("pf_tma_load4(&pf_fa_k"),
            "{name}: the key tile by the engine"
        );
        assert!(
            cuda.contains("pf_tma_load4(&pf_fa_v0"),
            "{name}: the value tile by the engine"
        );
        assert!(
            cuda.contains("const __grid_constant__ PfTensorMap pf_map_1"),
            "{name}"
        );
        let out = polyfuse(
            &[
                &["run", file.as_str(), "--target", "emulate", "--check"],
                &sizes[..],
            ]
            .concat(),
        );
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("check: ok"),
            "{name}: {}",
            text(&out)
        );
        let out = polyfuse(
            &[
                &["schedule", file.as_str(), "--emit", "cuda", "--no-tma"],
                &sizes[..],
            ]
            .concat(),
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("pf_tma_load"),
            "{name}"
        );
    }
}
