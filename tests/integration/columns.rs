//! Column reductions (issue 32 item 2): a reduction down a tensor's rows
//! (`S(c) +=! X(r, c)`) maps consecutive columns to consecutive threads of
//! `threadIdx.x` and splits the reduction over `threadIdx.y`, the lanes'
//! partial states combined through shared memory (`gpu::lanes::LaneAxis`).
//! Each program is mapped so (the `columns_on_x` mark of `--emit
//! gpu-tree`, and the CUDA's lanes on y), and runs in the CPU emulation of
//! the GPU mapping with `--check`, at sizes off every tile.

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
    let dir = std::env::temp_dir().join(format!("polyfuse-columns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    file
}

/// A program over `X(R, C)` of `dtype`, with `outputs` and `temps` (JSON
/// members) and `body`.
fn program(dtype: &str, outputs: &str, temps: &str, body: &[&str]) -> String {
    let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"{{"name": "columns", "params": {{"R": 16384, "C": 4096}},
            "inputs": {{"X": {{"dtype": "{dtype}", "shape": ["R", "C"]}},
                       "B": {{"dtype": "f32", "shape": ["C"]}}}},
            "outputs": {{ {outputs} }},
            "temps": {{ {temps} }},
            "body": [{}]}}"#,
        body.join(", ")
    )
}

fn params(r: i64, c: i64) -> [String; 4] {
    [
        "--param".into(),
        format!("R={r}"),
        "--param".into(),
        format!("C={c}"),
    ]
}

/// `polyfuse schedule FILE --emit EMIT` at sizes `(r, c)`: its output.
fn emit(file: &str, what: &str, sizes: (i64, i64)) -> String {
    emit_with(file, what, sizes, &[])
}

/// [`emit`] with further options `extra`.
fn emit_with(file: &str, what: &str, (r, c): (i64, i64), extra: &[&str]) -> String {
    let p = params(r, c);
    let mut args = vec!["schedule", file, "--emit", what];
    args.extend(p.iter().map(String::as_str));
    args.extend(extra);
    let out = polyfuse(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `file` in the emulation of the GPU mapping with `--check` at
/// sizes `(r, c)`: it must pass.
fn check(name: &str, file: &str, sizes: (i64, i64)) {
    check_with(name, file, sizes, &[])
}

/// [`check`] with further options `extra`.
fn check_with(name: &str, file: &str, (r, c): (i64, i64), extra: &[&str]) {
    let p = params(r, c);
    let mut args = vec!["run", file, "--target", "emulate", "--check"];
    args.extend(p.iter().map(String::as_str));
    args.extend(extra);
    let out = polyfuse(&args);
    assert!(
        text(&out).contains("check: ok"),
        "{name} at R={r} C={c}: {}",
        text(&out)
    );
}

/// The program is mapped as a column reduction at `(r, c)` and checks
/// there.
fn columns_and_check(name: &str, json: &str, sizes: (i64, i64)) {
    let file = scratch(&format!("{name}.json"), json);
    let f = file.to_str().unwrap();
    let tree = emit(f, "gpu-tree", sizes);
    assert!(
        tree.contains("mark: columns_on_x"),
        "{name} at {sizes:?}:\n{tree}"
    );
    let cuda = emit(f, "cuda", sizes);
    // The lanes on y: each starts from the reducer's identity but lane 0,
    // and the parts meet in shared memory.
    assert!(cuda.contains("if (threadIdx.y != 0)"), "{name}:\n{cuda}");
    assert!(cuda.contains("__shared__"), "{name}:\n{cuda}");
    assert!(
        !cuda.contains("__shfl_xor_sync(0xffffffffu, pf_"),
        "{name}:\n{cuda}"
    );
    check(name, f, sizes);
}

const F32_S: &str = r#""S": {"dtype": "f32", "shape": ["C"]}"#;
const F32_Y: &str = r#""Y": {"dtype": "f32", "shape": ["C"]}"#;

#[test]
fn plain_column_reductions_read_along_the_rows_and_check() {
    let cases = [
        ("sum", "S(c) +=! X(r, c)"),
        ("max", "S(c) max=! X(r, c)"),
        ("min", "S(c) min=! X(r, c) * B(c)"),
    ];
    for (name, body) in cases {
        let json = program("f32", F32_S, "", &[body]);
        // Off every tile: 333 columns take 9 a block (a divisor, so every
        // block is full), 1001 rows split unevenly over the lanes; then
        // 5 columns on one block, 37 rows over 2 lanes.
        for sizes in [(1001, 333), (37, 5)] {
            columns_and_check(name, &json, sizes);
        }
    }
}

#[test]
fn a_mean_and_an_epilogue_into_another_tensor_stay_in_the_column_kernel() {
    let cases = [
        ("mean", vec!["S(c) +=! X(r, c)", "Y(c) = S(c) / f32(R)"]),
        (
            "rms_plus_bias",
            vec![
                "S(c) +=! X(r, c) * X(r, c)",
                "Y(c) = sqrt(S(c) / f32(R)) + B(c)",
            ],
        ),
    ];
    for (name, body) in cases {
        let json = program("f32", F32_Y, F32_S, &body);
        columns_and_check(name, &json, (1001, 333));
        // One kernel: the temp never reaches memory.
        let file = scratch(&format!("{name}_1.json"), &json);
        let cuda = emit(file.to_str().unwrap(), "cuda", (1001, 333));
        assert_eq!(cuda.matches("__global__").count(), 1, "{name}\n{cuda}");
        assert!(!cuda.contains("t_S["), "{name}\n{cuda}");
    }
}

#[test]
fn an_f16_column_sums_in_f32_and_rounds_once() {
    let json = program(
        "f16",
        r#""Y": {"dtype": "f16", "shape": ["C"]}"#,
        F32_S,
        &["S(c) +=! f32(X(r, c))", "Y(c) = f16(S(c) / f32(R))"],
    );
    // 333 columns of 2 bytes: no divisor of 333 covers a 32-byte sector,
    // 9 a block still read 18 bytes of each row where a warp per column
    // would read 2.
    columns_and_check("f16_mean", &json, (1001, 333));
    let file = scratch("f16_mean_1.json", &json);
    let cuda = emit(file.to_str().unwrap(), "cuda", (1001, 320));
    // 320 columns: 32 a block (64 bytes of each row).
    assert!(cuda.contains("__launch_bounds__(512)"), "{cuda}");
    assert!(cuda.contains("float pf_part_"), "{cuda}");
    assert!(cuda.contains("__half2float"), "{cuda}");
    check("f16_mean", file.to_str().unwrap(), (1001, 320));
}

#[test]
fn column_logsumexp_rolls_down_the_columns_in_one_kernel() {
    let suite = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/suite/column_logsumexp.json"
    );
    // The rolling maximum and sum (the suite's size chooses it; forced
    // here at sizes off every tile): one pass down each column, the lanes'
    // states combined by the rolling update's proven repair.
    let rolling = ["--repair", "rolling"];
    for sizes in [(1001, 333), (129, 40)] {
        let tree = emit_with(suite, "gpu-tree", sizes, &rolling);
        assert!(tree.contains("mark: columns_on_x"), "{sizes:?}\n{tree}");
        let cuda = emit_with(suite, "cuda", sizes, &rolling);
        assert!(
            cuda.contains("pf_part_pf_priv_kernel_0_Mx"),
            "{sizes:?}\n{cuda}"
        );
        assert_eq!(cuda.matches("__global__").count(), 1, "{sizes:?}\n{cuda}");
        check_with("column_logsumexp rolling", suite, sizes, &rolling);
    }
    // 37 and 64 rows: the column's elements are kept in a thread's
    // registers (read by two statements), which the lanes cannot split:
    // lane 0 runs each column.
    for sizes in [(37, 5), (64, 40)] {
        check_with("column_logsumexp rolling", suite, sizes, &rolling);
    }
    // The default at small sizes: the maximum, then the sum, two loops
    // down each column in one column kernel.
    let tree = emit(suite, "gpu-tree", (1001, 333));
    assert!(tree.contains("mark: columns_on_x"), "{tree}");
    check("column_logsumexp", suite, (1001, 333));
    // One column, and few rows: other mappings, the same values.
    for sizes in [(1001, 1), (37, 5), (64, 40), (129, 40)] {
        check("column_logsumexp", suite, sizes);
    }
    // The suite's size: 16 columns a block (256 blocks of 16 x 32
    // threads), each lane 512 rows of the rolling maximum and sum; the
    // running states never reach memory.
    let cuda = emit(suite, "cuda", (16384, 4096));
    assert_eq!(cuda.matches("__global__").count(), 1, "{cuda}");
    assert!(cuda.contains("__launch_bounds__(512)"), "{cuda}");
    assert!(cuda.contains("blockIdx.x * 16"), "{cuda}");
    // Lane y takes rows y, y + 32, .., eight at a time.
    assert!(
        cuda.contains("pf_base = 0 + (pf_i)threadIdx.y * (1); ; pf_base += 256 * (1)"),
        "{cuda}"
    );
    assert!(
        cuda.contains("const pf_i c2 = pf_base + pf_k * 32 * (1);"),
        "{cuda}"
    );
    assert!(cuda.contains("pf_part_pf_priv_kernel_0_S[512]"), "{cuda}");
    assert!(!cuda.contains("t_Mx["), "{cuda}");
    assert!(!cuda.contains("t_S["), "{cuda}");
}

#[test]
fn a_column_softmax_writes_its_output_down_the_columns_too() {
    // The maximum and sum down each column, then the output: a loop the
    // lanes share that writes every element of its column.
    let json = program(
        "f32",
        r#""Y": {"dtype": "f32", "shape": ["R", "C"]}"#,
        r#""M": {"dtype": "f32", "shape": ["C"]}, "S": {"dtype": "f32", "shape": ["C"]}"#,
        &[
            "M(c) max=! X(r, c)",
            "S(c) +=! exp(X(r, c) - M(c))",
            "Y(r, c) = exp(X(r, c) - M(c)) / S(c)",
        ],
    );
    columns_and_check("column_softmax", &json, (1001, 333));
    let file = scratch("column_softmax_1.json", &json);
    let f = file.to_str().unwrap();
    check_with(
        "column_softmax rolling",
        f,
        (1001, 333),
        &["--repair", "rolling"],
    );
    // Each lane's loads of a batch of eight steps are issued before the
    // steps compute (`codegen::cuda::lanes`, `column_steps`): both loops.
    let cuda = emit_with(f, "cuda", (1001, 333), &["--repair", "rolling"]);
    assert_eq!(cuda.matches("float pf_ld0[8];").count(), 2, "{cuda}");
    assert!(
        cuda.contains("t_Y[(((c2)) * (p_C) + (((c0 + c1))))] = "),
        "{cuda}"
    );
}

#[test]
fn a_batch_of_columns_takes_z_and_row_reductions_keep_their_warps() {
    let batch = r#"{"name": "batch", "params": {"B": 3, "R": 101, "C": 40},
        "inputs": {"X": {"dtype": "f32", "shape": ["B", "R", "C"]}},
        "outputs": {"M": {"dtype": "f32", "shape": ["B", "C"]}},
        "body": ["M(b, c) max=! X(b, r, c)"]}"#;
    let file = scratch("batch.json", batch);
    let f = file.to_str().unwrap();
    let out = polyfuse(&["schedule", f, "--emit", "gpu-tree"]);
    let tree = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(tree.contains("mark: columns_on_x"), "{tree}");
    let out = polyfuse(&["run", f, "--target", "emulate", "--check"]);
    assert!(text(&out).contains("check: ok"), "{}", text(&out));
    // The same reduction along the contiguous dimension is a row
    // reduction: a warp per row, no columns.
    let rows = program("f32", F32_S, "", &["S(r) +=! X(r, c)"]).replace(
        r#""S": {"dtype": "f32", "shape": ["C"]}"#,
        r#""S": {"dtype": "f32", "shape": ["R"]}"#,
    );
    let file = scratch("rows.json", &rows);
    let tree = emit(file.to_str().unwrap(), "gpu-tree", (333, 1001));
    assert!(!tree.contains("columns_on_x"), "{tree}");
    assert!(tree.contains("reduce_x_"), "{tree}");
}

#[test]
fn products_keep_their_tiles_and_vector_products_down_columns_split() {
    // gemm with A transposed: B(k, j) and A(k, i) are both contiguous
    // along a row member, but each misses the other one (reused by every
    // row of it): no column reduction; the register tile stays.
    let gemm_t = r#"{"name": "gemm_t", "params": {"M": 200, "N": 190, "K": 70},
        "inputs": {"A": {"dtype": "f32", "shape": ["K", "M"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
        "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
        "body": ["C(i, j) +=! A(k, i) * B(k, j)"]}"#;
    let file = scratch("gemm_t.json", gemm_t);
    let f = file.to_str().unwrap();
    let out = polyfuse(&["schedule", f, "--emit", "gpu-tree"]);
    let tree = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!tree.contains("columns_on_x"), "{tree}");
    assert!(tree.contains("mark: registers"), "{tree}");
    // A vector times a matrix, and atax's second product (`A^T tmp`): the
    // matrix is read once, down its columns.
    let cases = [
        (
            "vecmat",
            r#"{"name": "vecmat", "params": {"N": 333, "K": 1001},
             "inputs": {"x": {"dtype": "f32", "shape": ["K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
             "outputs": {"y": {"dtype": "f32", "shape": ["N"]}},
             "body": ["y(j) +=! x(k) * B(k, j)"]}"#,
        ),
        (
            "atax",
            r#"{"name": "atax", "params": {"M": 1001, "N": 333},
             "inputs": {"A": {"dtype": "f32", "shape": ["M", "N"]}, "x": {"dtype": "f32", "shape": ["N"]}},
             "outputs": {"y": {"dtype": "f32", "shape": ["N"]}},
             "temps": {"tmp": {"dtype": "f32", "shape": ["M"]}},
             "body": ["tmp(i) +=! A(i, j) * x(j)", "y(j) +=! A(i, j) * tmp(i)"]}"#,
        ),
    ];
    for (name, json) in cases {
        let file = scratch(&format!("{name}.json"), json);
        let f = file.to_str().unwrap();
        let out = polyfuse(&["schedule", f, "--emit", "gpu-tree"]);
        let tree = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(tree.contains("mark: columns_on_x"), "{name}\n{tree}");
        let out = polyfuse(&["run", f, "--target", "emulate", "--check"]);
        assert!(text(&out).contains("check: ok"), "{name}: {}", text(&out));
    }
}
