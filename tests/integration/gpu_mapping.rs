//! The GPU mapping: its legality check in isl, the kernels and launch
//! bounds it produces, and the CUDA it prints. Execution of the mapped
//! tree (CPU emulation) for every example is in `tests/integration/examples.rs`.

use std::collections::HashMap;

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::{apply_param_overrides, load_file, load_str};
use polyfuse::gpu::{mapping, GpuOptions, KernelArg};
use polyfuse::isl::{Isl, IslPrint};
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::schedule::Strategy;
use polyfuse::{compile, deps, model, schedule, Error, Options};

fn gemm(m: i64, n: i64, k: i64) -> String {
    format!(
        r#"{{ "name": "gemm", "params": {{ "M": {m}, "N": {n}, "K": {k} }},
             "inputs": {{ "A": {{"dtype": "f32", "shape": ["M", "K"]}}, "B": {{"dtype": "f32", "shape": ["K", "N"]}} }},
             "outputs": {{ "C": {{"dtype": "f32", "shape": ["M", "N"]}} }},
             "body": [ "C(i, j) +=! A(i, k) * B(k, j)" ] }}"#
    )
}

fn bmm(b: i64, m: i64, n: i64, k: i64) -> String {
    format!(
        r#"{{ "name": "bmm", "params": {{ "B": {b}, "M": {m}, "N": {n}, "K": {k} }},
             "inputs": {{ "A": {{"dtype": "f32", "shape": ["B", "M", "K"]}}, "X": {{"dtype": "f32", "shape": ["B", "K", "N"]}} }},
             "outputs": {{ "C": {{"dtype": "f32", "shape": ["B", "M", "N"]}} }},
             "body": [ "C(b, i, j) +=! A(b, i, k) * X(b, k, j)" ] }}"#
    )
}

fn gpu_options(tile: &[i64]) -> Options {
    Options {
        tile: tile.to_vec(),
        gpu: Some(GpuOptions::default()),
        ..Options::default()
    }
}

/// A schedule for gemm with `mark` above the band of iterator `dim`.
fn gemm_schedule_with_mark(domain: &str, dim: &str) -> String {
    let band = |d: &str, with_init: bool| {
        let init = if with_init {
            format!("S0_init[i, j] -> [({d})]; ")
        } else {
            String::new()
        };
        format!("[M, N, K] -> [{{ {init}S0[i, j, k] -> [({d})] }}]")
    };
    let k_band = band("k", false);
    let inner = if dim == "k" {
        format!("{{ mark: \"thread_x\", child: {{ schedule: \"{k_band}\" }} }}")
    } else {
        format!("{{ schedule: \"{k_band}\" }}")
    };
    let j = if dim == "j" {
        format!(
            "{{ mark: \"thread_x\", child: {{ schedule: \"{}\", child: SEQ }} }}",
            band("j", true)
        )
    } else {
        format!("{{ schedule: \"{}\", child: SEQ }}", band("j", true))
    };
    let seq = format!(
        "{{ sequence: [ {{ filter: \"{{ S0_init[i, j] }}\" }}, {{ filter: \"{{ S0[i, j, k] }}\", child: {inner} }} ] }}"
    );
    format!(
        "{{ domain: \"{domain}\", child: {{ schedule: \"{}\", child: {} }} }}",
        band("i", true),
        j.replace("SEQ", &seq)
    )
}

#[test]
fn mapping_a_reduction_loop_to_threads_is_refused() {
    let p = load_str(&gemm(7, 5, 6), "gemm.json").unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    let domain = scop.domain().unwrap().text();

    let legal = isl
        .schedule(&gemm_schedule_with_mark(&domain, "j"))
        .unwrap();
    schedule::check_legal("gemm.json", &legal, &scop, &d).unwrap();
    mapping::check_parallel(&p, &legal, &scop, &d).unwrap();

    let racy = isl
        .schedule(&gemm_schedule_with_mark(&domain, "k"))
        .unwrap();
    // Sequentially the order is fine ...
    schedule::check_legal("gemm.json", &racy, &scop, &d).unwrap();
    // ... but the k loop carries the reduction: threads would race on C.
    match mapping::check_parallel(&p, &racy, &scop, &d) {
        Err(Error::Illegal { message, .. }) => {
            assert!(message.contains("threadIdx.x"), "{message}");
            assert!(message.contains("S0[i, j, k]"), "{message}");
        }
        other => panic!("expected an illegal-mapping error, got {other:?}"),
    }
}

#[test]
fn gemm_maps_rows_and_columns_to_blocks_and_threads() {
    let p = load_str(&gemm(100, 70, 33), "gemm.json").unwrap();
    let c = compile(&p, &gpu_options(&[32, 16, 8])).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    assert_eq!(cuda.kernels.len(), 1);
    let k = &cuda.kernels[0];
    // j (tile 16) on x, i (tile 32) on y.
    let grid = k.grid_dims(&HashMap::new()).unwrap();
    assert_eq!(grid, [70_u32.div_ceil(16), 100_u32.div_ceil(32), 1]);
    assert_eq!(k.block, [16, 16, 1]);
    let src = &cuda.source;
    for needle in [
        "extern \"C\" __global__ void __launch_bounds__(256) kernel_0(float *__restrict__ t_A, float *__restrict__ t_B, float *__restrict__ t_C)",
        "blockIdx.x",
        "blockIdx.y",
        "threadIdx.x",
        "threadIdx.y",
        "__syncthreads();",
    ] {
        assert!(src.contains(needle), "missing {needle} in\n{src}");
    }
    // The reduction loop is not mapped: no blockIdx.z / threadIdx.z.
    assert!(!src.contains("threadIdx.z *"), "{src}");
    assert_eq!(
        cuda.args
            .iter()
            .map(|a| match a {
                KernelArg::Tensor { name, .. } => name.clone(),
                KernelArg::Param { name } => format!("param {name}"),
                KernelArg::Step { name } => format!("step {name}"),
            })
            .collect::<Vec<_>>(),
        ["A", "B", "C"]
    );
    // The mapped tree carries its marks.
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    for m in ["kernel_0", "block_x_", "block_y_", "thread_x_", "thread_y_"] {
        assert!(tree.contains(m), "missing mark {m} in\n{tree}");
    }
}

#[test]
fn softmax_is_four_kernels_and_symbolic_sizes_become_arguments() {
    let json = r#"{ "name": "softmax", "params": {"N": null, "D": null},
        "inputs": {"X": {"dtype": "f32", "shape": ["N", "D"]}},
        "outputs": {"Y": {"dtype": "f32", "shape": ["N", "D"]}},
        "temps": {"M": {"dtype": "f32", "shape": ["N"]}, "E": {"dtype": "f32", "shape": ["N", "D"]}, "S": {"dtype": "f32", "shape": ["N"]}},
        "body": ["M(r) max=! X(r, c)", "E(r, c) = exp(X(r, c) - M(r))", "S(r) +=! E(r, c)", "Y(r, c) = E(r, c) / S(r)"] }"#;
    let p = load_str(json, "softmax.json").unwrap();
    let c = compile(&p, &gpu_options(&[32])).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    assert_eq!(cuda.kernels.len(), 4, "{}", cuda.source);
    let params: HashMap<String, i64> = [("N".to_string(), 1000), ("D".to_string(), 77)].into();
    // Row reductions: one block dimension over rows.
    assert_eq!(cuda.kernels[0].grid_dims(&params).unwrap(), [32, 1, 1]);
    // Elementwise: columns on x, rows on y.
    assert_eq!(cuda.kernels[1].grid_dims(&params).unwrap(), [3, 32, 1]);
    assert!(
        cuda.source.contains("long p_N, long p_D)"),
        "{}",
        cuda.source
    );
    assert!(cuda
        .args
        .iter()
        .any(|a| matches!(a, KernelArg::Param { name } if name == "D")));
}

#[test]
fn every_kernel_waits_for_its_predecessor_before_touching_global_memory() {
    // Every kernel may be launched as a programmatic dependent of whatever
    // kernel ran before it on the stream (the runtime and the C ABI do so
    // on sm_90): its first statements must be the grid dependency's wait
    // and then the release of its own dependents, before any statement
    // that could read or write a tensor.
    // One program of each kind of kernel: a generic one (several kernels),
    // a contraction on tensor cores, prefill attention, split decoding.
    let mut seen = 0;
    for name in [
        "softmax.json",
        "gemm_f16.json",
        "attention_causal.json",
        "attention_decode_gqa.json",
    ] {
        let path = std::path::Path::new("examples").join(name);
        let p = load_file(&path).unwrap();
        let c = compile(&p, &gpu_options(&[32])).unwrap();
        let cuda = c.cuda.as_ref().unwrap();
        for k in &cuda.kernels {
            assert!(k.dependent, "{}: {}", path.display(), k.name);
            let start = cuda.source.find(&format!(" {}(", k.name)).unwrap();
            let body = &cuda.source[start..];
            let body = &body[body.find("{\n").unwrap() + 2..];
            let lines: Vec<&str> = body.lines().take(4).collect();
            assert_eq!(
                lines,
                [
                    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900",
                    "asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");",
                    "asm volatile(\"griddepcontrol.launch_dependents;\");",
                    "#endif"
                ],
                "{}: {}",
                path.display(),
                k.name
            );
            seen += 1;
        }
    }
    assert!(seen >= 8, "{seen} kernels");
}

#[test]
fn emulation_of_the_mapping_matches_the_reference_with_grids_and_blocks_of_any_size() {
    // Blocks smaller than tiles (each thread runs several points) and a
    // grid smaller than the number of tiles (each block several tiles).
    let p = load_str(&gemm(45, 38, 21), "gemm.json").unwrap();
    for block in [vec![], vec![8, 4], vec![32, 32], vec![1, 1]] {
        for grid in [vec![], vec![2, 1]] {
            let mut o = gpu_options(&[16, 8, 4]);
            o.gpu = Some(GpuOptions {
                block: block.clone(),
                grid: grid.clone(),
                ..GpuOptions::default()
            });
            let mut c = compile(&p, &o).unwrap();
            if !grid.is_empty() {
                let g = c.cuda.as_ref().unwrap().kernels[0]
                    .grid_dims(&HashMap::new())
                    .unwrap();
                assert_eq!(g, [2, 1, 1]);
            }
            c.kernel_c = c.emulation_c.clone().unwrap();
            let r = run(
                &c,
                &RunOptions {
                    check: true,
                    bench_runs: 0,
                    seed: 11,
                },
            )
            .unwrap();
            let check = r.check.unwrap();
            assert!(check.ok, "block {block:?} grid {grid:?}: {}", check.line());
        }
    }
}

fn rowsum_like(body: &str, m: i64, n: i64) -> String {
    format!(
        r#"{{ "name": "rows", "params": {{ "M": {m}, "N": {n} }},
             "inputs": {{ "X": {{"dtype": "f32", "shape": ["M", "N"]}} }},
             "outputs": {{ "S": {{"dtype": "f32", "shape": ["M"]}} }},
             "body": [ "{body}" ] }}"#
    )
}

fn emulate_ok(json: &str, options: &Options) {
    emulated_cuda(&load_str(json, "t.json").unwrap(), options);
}

#[test]
fn a_row_reduction_runs_across_the_lanes_of_a_warp() {
    for (body, warp) in [
        ("S(i) +=! X(i, j)", "pf_warp_sum(pf_red)"),
        ("S(i) max=! X(i, j)", "pf_warp_max(pf_red)"),
        ("S(i) min=! X(i, j) * X(i, j)", "pf_warp_min(pf_red)"),
    ] {
        // 300 columns: each lane runs the four-chain loop twice, then the
        // remainder, on the CPU as on the GPU.
        let json = rowsum_like(body, 37, 300);
        let p = load_str(&json, "rows.json").unwrap();
        let c = compile(&p, &gpu_options(&[16])).unwrap();
        let cuda = c.cuda.as_ref().unwrap();
        assert!(cuda.source.contains(warp), "{body}:\n{}", cuda.source);
        // Lanes on x take the reduction, rows on y.
        assert_eq!(cuda.kernels[0].block, [32, 8, 1], "{body}");
        assert!(c
            .gpu_tree
            .as_ref()
            .unwrap()
            .to_string()
            .contains("reduce_x_"));
        assert!(c.emulation_c.as_ref().unwrap().contains("pf_red3"));
        emulate_ok(&json, &gpu_options(&[16]));
    }
}

#[test]
fn reductions_stay_in_threads_when_there_are_two_parallel_loops() {
    // gemm has rows and columns for the threads: each thread keeps its own
    // sequential k loop, no lanes share a reduction.
    let p = load_str(&gemm(45, 38, 21), "gemm.json").unwrap();
    let c = compile(&p, &gpu_options(&[16])).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("pf_red"));
    // Turning the warp reductions off keeps row reductions sequential too.
    let json = rowsum_like("S(i) +=! X(i, j)", 37, 45);
    let mut o = gpu_options(&[16]);
    o.gpu = Some(GpuOptions {
        reduce: false,
        ..GpuOptions::default()
    });
    let p = load_str(&json, "rows.json").unwrap();
    let c = compile(&p, &o).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("pf_red"));
    emulate_ok(&json, &o);
}

#[test]
fn gemm_keeps_its_accumulators_in_registers() {
    // Odd sizes: partial tiles take the guarded path, full ones the fast
    // path; both are emulated and checked. Large enough for 128 x 128
    // tiles to give 17 x 17 blocks (`ENOUGH_REGISTER_BLOCKS`).
    let json = gemm(2100, 2090, 33);
    let p = load_str(&json, "gemm.json").unwrap();
    let mut auto = gpu_options(&[32]);
    auto.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    let c = compile(&p, &auto).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    assert!(
        cuda.source.contains("float pf_reg_kernel_0_C[8][8];"),
        "{}",
        cuda.source
    );
    assert_eq!(cuda.kernels[0].block, [16, 16, 1]);
    // The reduction steps inside a tile need no barrier: their dependences
    // stay within a thread.
    assert!(c.gpu_tree.as_ref().unwrap().to_string().contains("nosync"));
    emulate_ok(&json, &auto);
    // Without register tiles (emulated at 300 x 270, its automatic tile
    // there).
    let mut off = auto.clone();
    off.gpu = Some(GpuOptions {
        auto_tile: true,
        registers: false,
        ..GpuOptions::default()
    });
    let c = compile(&p, &off).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("pf_reg_"));
    emulate_ok(&gemm(300, 270, 33), &off);
}

/// Auto-tiled GPU options with register groups of `vector` points.
fn grouped(vector: u32, block: &[u32]) -> Options {
    Options {
        gpu: Some(GpuOptions {
            auto_tile: true,
            vector,
            block: block.to_vec(),
            ..GpuOptions::default()
        }),
        ..Options::default()
    }
}

#[test]
fn register_groups_give_each_thread_neighbouring_points_read_as_vectors() {
    // 128 x 128 register tiles on 16 x 16 threads: 8 slots per axis, in
    // two groups of four. A(i, k) is read along i by the threads of y, so
    // its shared tile is laid out k-major (A_shared[k][i]); B(k, j) is
    // already j-innermost. Rows are padded by 4 (132), not 1, so that
    // groups stay 16-byte aligned. Odd M and N take the guarded path.
    let json = gemm(2100, 2092, 36);
    let p = load_str(&json, "gemm.json").unwrap();
    // The variants with their tiles given are emulated at 300 x 270 (the
    // same code, partial tiles along every axis).
    let small = load_str(&gemm(300, 270, 36), "gemm.json").unwrap();
    // The code with each line's indentation dropped: whether the region is
    // printed once for every tile (`codegen::cuda::box_reads`) or twice
    // moves it by a level.
    let flat = |c: String| c.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    // The automatic tile (128 x 128 x 16, unrolled, double-buffered) is
    // the code that
    // `double_buffered_tiles_fetch_the_next_step_while_computing_on_this_one`
    // emulates.
    let cuda = flat(compile(&p, &grouped(4, &[])).unwrap().cuda.unwrap().source);
    for text in [
        "const pf_i pf_t1 = (pf_rx / 4) * 64 + (pf_i)threadIdx.x * 4 + pf_rx % 4;",
        "const pf_i c4 = (pf_ry / 4) * 64 + (pf_i)threadIdx.y * 4 + pf_ry % 4;",
        "pf_shared_kernel_0_A[pf_a0 * 1 + pf_a1 * 132 + 396] = pf_v.w;",
        "pf_shared_kernel_0_B[pf_a0 * 132 + pf_a1 * 1 + 3] = pf_v.w;",
        // Two stages of 2,112 (16 x 132): the mapping's register tiles
        // double-buffer their shared tiles (`simt_tile`).
        "__shared__ __align__(16) float pf_shared_kernel_0_A[4224];",
    ] {
        assert!(cuda.contains(text), "{text}\n{cuda}");
    }
    // The step loop along k inside a shared tile is printed twice: for
    // the full k tiles with its constant bound, for the last one (K = 36,
    // no multiple of 16) clipped (`codegen::cuda::full_steps`).
    let full_steps = "if ((15 <= ((-c2) + 35))) {\nfor (pf_i c3 = 0; (c3 <= 15); c3 += 1) {";
    // The mapping's sizes come unrolled (`simt_tile`): the clipped one to
    // 16 steps, the tile's size, with the end of K tested inside; the
    // loop over k tiles is not.
    let unroll_step =
        "#pragma unroll\nfor (pf_i c3 = 0; (c3 <= 15); c3 += 1) {\nif ((c3 <= ((-c2) + 35))) {";
    let unroll_full =
        "if ((15 <= ((-c2) + 35))) {\n#pragma unroll\nfor (pf_i c3 = 0; (c3 <= 15); c3 += 1) {";
    assert!(cuda.contains(unroll_step), "{cuda}");
    assert!(cuda.contains(unroll_full), "{cuda}");
    assert!(!cuda.contains("#pragma unroll\nfor (pf_i c2"), "{cuda}");
    // With the sizes given, the steps are unrolled on request only.
    let mut given = grouped(4, &[16, 16]);
    given.tile = vec![128, 128, 16];
    if let Some(g) = given.gpu.as_mut() {
        g.auto_tile = false;
    }
    let cuda = flat(cuda_emulated_on(&p, &small, &given));
    assert!(cuda.contains(full_steps), "{cuda}");
    assert!(!cuda.contains(unroll_step), "{cuda}");
    assert!(!cuda.contains(unroll_full), "{cuda}");
    let mut unrolled = given.clone();
    if let Some(g) = unrolled.gpu.as_mut() {
        g.unroll = Some(true);
    }
    let cuda = flat(cuda_emulated_on(&p, &small, &unrolled));
    assert!(cuda.contains(unroll_step), "{cuda}");
    assert!(cuda.contains(unroll_full), "{cuda}");
    // 32 steps on 8 x 8 registers: past the unrolling limit (NVRTC's
    // compile time grows by minutes), the step loop stays a loop.
    let mut deep = unrolled.clone();
    deep.tile = vec![128, 128, 32];
    if let Some(g) = deep.gpu.as_mut() {
        g.auto_tile = false;
        g.block = vec![16, 16];
    }
    let cuda = cuda_emulated_on(&p, &small, &deep);
    let step = cuda.find("for (pf_i c3 = 0;").unwrap();
    assert!(
        !cuda[..step].trim_end().ends_with("#pragma unroll"),
        "{cuda}"
    );
    // The default is cyclic, with the one-element padding.
    let plain = emulated_cuda(&p, &grouped(1, &[]));
    assert!(plain.contains("const pf_i pf_t1 = (pf_i)threadIdx.x + pf_rx * 16;"));
    assert!(plain.contains("pf_shared_kernel_0_B[pf_a0 * 129 + pf_a1 * 1 + 3]"));
    // Groups of two on a 32 x 4 block; K not a multiple of 4 (no vector
    // copy); rows of 48 (3 slots per thread of y, no whole group of 4)
    // stay cyclic while columns of 64 (4 slots) are grouped.
    emulated_cuda(
        &load_str(&gemm(67, 133, 29), "g.json").unwrap(),
        &grouped(2, &[32, 4]),
    );
    let mut odd = grouped(4, &[16, 16]);
    odd.tile = vec![48, 64, 8];
    if let Some(g) = odd.gpu.as_mut() {
        g.auto_tile = false;
    }
    let cuda = emulated_cuda(&load_str(&gemm(100, 90, 20), "g.json").unwrap(), &odd);
    assert!(
        cuda.contains("pf_t0 = (pf_i)threadIdx.y + pf_ry * 16;"),
        "{cuda}"
    );
    assert!(
        cuda.contains("pf_t1 = (pf_rx / 4) * 64 + (pf_i)threadIdx.x * 4"),
        "{cuda}"
    );
    // A batch of one (slots whose element formula ignores a thread
    // member), in program order.
    let options = Options {
        strategy: schedule::Strategy::Canonical,
        ..grouped(4, &[])
    };
    emulated_cuda(&load_str(&bmm(1, 37, 45, 29), "b.json").unwrap(), &options);
    // A width polyfuse does not print is an input error.
    let err = compile(&p, &grouped(3, &[])).unwrap_err();
    assert!(matches!(err, Error::Input { .. }), "{err}");
    assert!(err.to_string().contains("vector 3"), "{err}");
}

#[test]
fn double_buffered_tiles_fetch_the_next_step_while_computing_on_this_one() {
    // Two stages of each shared array; the first k step copies into stage
    // 0, every step with a next one loads the next tiles into registers
    // before the arithmetic and stores them into the other stage after
    // it. K = 36: the last k tile is partial, and the step after it does
    // not exist (the emulation copies the next tile at the same offsets
    // and tests; a wrong stage or offset fails its check).
    let json = gemm(2100, 2092, 36);
    let p = load_str(&json, "gemm.json").unwrap();
    let mut options = grouped(4, &[]);
    if let Some(g) = options.gpu.as_mut() {
        g.pipeline = Some(true);
        g.unroll = Some(true);
    }
    // The automatic tile here is 128 x 128 x 16 on 16 x 16 threads: given
    // so, the code is the same, and is emulated at 300 x 270.
    let mut given = options.clone();
    given.tile = vec![128, 128, 16];
    if let Some(g) = given.gpu.as_mut() {
        g.auto_tile = false;
        g.block = vec![16, 16];
    }
    let small = load_str(&gemm(300, 270, 36), "gemm.json").unwrap();
    let cuda = cuda_emulated_on(&p, &small, &given);
    for auto in [&options, &grouped(4, &[])] {
        let c = compile(&p, auto).unwrap();
        assert_eq!(c.cuda.as_ref().unwrap().source, cuda, "the automatic tile");
    }
    for text in [
        "__shared__ __align__(16) float pf_shared_kernel_0_A[4224];",
        "const pf_i pf_stage = ((c2 - (0)) / 16) % 2;",
        "const int pf_has_next = ((c2 + 16) <= 35);",
        "const pf_i pf_n0_1 = (c2 + 16);",
        "float pf_next0[2][4];",
        "pf_shared_kernel_0_A[pf_stage * 2112 + ",
        "pf_shared_kernel_0_B[(1 - pf_stage) * 2112 + pf_a0 * 132 + pf_a1 * 1 + 3] = pf_next1[pf_s][3];",
    ] {
        assert!(cuda.contains(text), "{text}\n{cuda}");
    }
    // The launch record counts what the kernel declares: both stages of
    // both arrays (2 x 2112 f32 each).
    let c = compile(&p, &options).unwrap();
    let kernels = &c.cuda.as_ref().unwrap().kernels;
    assert_eq!(kernels[0].static_shared, 2 * 4224 * 4, "{kernels:?}");
    // Without the vector layout, with a batch (tiles of one) and odd
    // sizes.
    let mut plain = gpu_options(&[1, 32]);
    plain.gpu = Some(GpuOptions {
        pipeline: Some(true),
        ..GpuOptions::default()
    });
    let batch = load_str(&bmm(3, 37, 45, 70), "b.json").unwrap();
    let cuda = emulated_cuda(&batch, &plain);
    assert!(cuda.contains("pf_has_next"), "{cuda}");
    // One tile along the batch: its block iterator has no loop, and the
    // copies of both steps name its value.
    plain.tile = vec![32, 16];
    let cuda = emulated_cuda(&batch, &plain);
    assert!(cuda.contains("pf_has_next"), "{cuda}");
    assert!(cuda.contains("const pf_i c0 = 0; (void)c0;"), "{cuda}");
    // Two stages that do not fit the shared-memory budget: one stage.
    let mut small = options.clone();
    if let Some(g) = small.gpu.as_mut() {
        g.shared_limit = 20_000;
    }
    let cuda = emulated_cuda(&p, &small);
    assert!(cuda.contains("pf_shared_kernel_0_A[2112];"), "{cuda}");
    assert!(!cuda.contains("pf_stage"), "{cuda}");
}

#[test]
fn register_tiles_copy_only_the_slots_of_their_thread_points() {
    // A batch of one: `b` is 0 everywhere in the domain, so the element
    // formula of C's register tile does not depend on the thread member
    // mapped from `b` and every register slot along it names the same
    // element. Only the slot whose thread point is in the domain may be
    // loaded and stored back; storing the others (never updated) once
    // overwrote the result with zeros. Canonical order puts `b` in the
    // register band; sizes are not multiples of the tiles.
    let json = &bmm(1, 37, 45, 29);
    for strategy in [schedule::Strategy::Canonical, schedule::Strategy::Isl] {
        let options = Options {
            strategy,
            ..gpu_options(&[32])
        };
        let p = load_str(json, "bmm1.json").unwrap();
        let c = compile(&p, &options).unwrap();
        let cuda = &c.cuda.as_ref().unwrap().source;
        if strategy == schedule::Strategy::Canonical {
            // The slots along `b` are there, and the copies test the
            // thread point against the domain.
            assert!(cuda.contains("_C[32][2][2];"), "{cuda}");
            assert!(cuda.contains("pf_t0 == 0"), "{cuda}");
        }
        emulate_ok(json, &options);
    }
}

/// A program of partial reductions `R(h, s) max=! x`, `x` a read of `X`
/// (declared with `shape`) over the reduction loop `u`.
fn partial_reductions(h: i64, s: i64, u: i64, shape: &str, x: &str) -> String {
    format!(
        r#"{{ "name": "partial", "params": {{ "H": {h}, "S": {s}, "U": {u} }},
             "inputs": {{ "X": {{"dtype": "f32", "shape": {shape}}} }},
             "outputs": {{ "R": {{"dtype": "f32", "shape": ["H", "S"]}} }},
             "body": [ "R(h, s) max=! {x}" ] }}"#
    )
}

#[test]
fn few_long_rows_without_reuse_are_reduced_by_warps() {
    // Two parallel loops with 31 x 63 instances and 600-step reductions
    // that read a different element each (the partial reductions of a
    // split-k update): a warp per row, not a thread. X's rows run along
    // h, so the read is no streaming one and no column either (neither the
    // reduction nor the innermost row moves along its last dimension):
    // the few rows alone decide. Odd sizes, emulated.
    let json = |h, s| partial_reductions(h, s, 600, r#"["S", "U", "H"]"#, "X(s, u, h)");
    // Program order keeps (h, s, u) in one band: two parallel members.
    let options = Options {
        strategy: schedule::Strategy::Canonical,
        ..auto_gpu()
    };
    let few = json(31, 63);
    let c = compile(&load_str(&few, "p.json").unwrap(), &options).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(src.contains("pf_warp_max(pf_red)"), "{src}");
    assert_eq!(c.cuda.as_ref().unwrap().kernels[0].block[0], 32);
    emulate_ok(&few, &options);
    // Many rows: one thread per row keeps the device busy already.
    let many = json(64, 128);
    let c = compile(&load_str(&many, "p.json").unwrap(), &options).unwrap();
    assert!(!c
        .cuda
        .as_ref()
        .unwrap()
        .source
        .contains("pf_warp_max(pf_red)"));
    // With X's rows along s, consecutive rows read consecutive elements:
    // a column reduction (`gpu::lanes::LaneAxis::Y`), the reduction split
    // over threadIdx.y, the rows on x (63 = 7 x 9: 9 per block).
    let columns = partial_reductions(31, 63, 600, r#"["H", "U", "S"]"#, "X(h, u, s)");
    let c = compile(&load_str(&columns, "p.json").unwrap(), &options).unwrap();
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    assert!(tree.contains("columns_on_x"), "{tree}");
    // (Program order puts the initialisation in a kernel of its own.)
    let blocks: Vec<[u32; 3]> = c
        .cuda
        .as_ref()
        .unwrap()
        .kernels
        .iter()
        .map(|k| k.block)
        .collect();
    assert!(blocks.contains(&[9, 32, 1]), "{blocks:?}");
    emulate_ok(&columns, &options);
}

#[test]
fn streaming_reductions_are_reduced_by_warps_however_many_rows() {
    // 37 x 129 rows (more than few), each the max of its own row of X,
    // contiguous along the reduction: every element is read once, and a
    // warp per row reads it coalesced, where a thread per row would read
    // with a stride of a row. Odd sizes, emulated.
    let shape = r#"["H", "S", "U"]"#;
    let options = Options {
        strategy: schedule::Strategy::Canonical,
        ..auto_gpu()
    };
    let streaming = partial_reductions(37, 129, 45, shape, "X(h, s, u)");
    let c = compile(&load_str(&streaming, "p.json").unwrap(), &options).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    assert!(
        cuda.source.contains("pf_warp_max(pf_red)"),
        "{}",
        cuda.source
    );
    assert_eq!(cuda.kernels[0].block, [32, 8, 1]);
    emulate_ok(&streaming, &options);
    // Fewer steps than lanes: a thread per row.
    let short = partial_reductions(37, 129, 20, shape, "X(h, s, u)");
    let c = compile(&load_str(&short, "p.json").unwrap(), &options).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(!src.contains("pf_warp_max(pf_red)"), "{src}");
    // An operand that misses a row (reused by the rows of another s) is no
    // stream: the rows keep their threads.
    let reused = partial_reductions(37, 129, 45, r#"["H", "U"]"#, "X(h, u)");
    let c = compile(&load_str(&reused, "p.json").unwrap(), &options).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(!src.contains("pf_warp_max(pf_red)"), "{src}");
    emulate_ok(&reused, &options);
}

/// The program in `file` (relative to the crate) with parameters set to
/// `values`.
fn program_with(file: &str, values: &[(&str, i64)]) -> Program {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let mut p = load_file(&path).unwrap();
    let sizes: Vec<(String, i64)> = values.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    apply_param_overrides(&mut p, &sizes).unwrap();
    p
}

/// The benchmark's attention decoding (split-k, one query per head) at
/// small sizes that are no multiples of 32 or 8.
fn small_decoding() -> Program {
    program_with(
        "bench/programs/attention_decode_causal_b1h32kv32768d128.json",
        &[("H", 3), ("KV", 1000), ("D", 72)],
    )
}

#[test]
fn decoding_reads_its_keys_with_a_warp_per_score() {
    // QK^T of decoding: P(b, h, i, j) +=! Q(b, h, i, d) * K(b, h, j, d)
    // with b and i of one instance. Each key element feeds one score, so
    // the scores are reduced by warps, lanes along d (K's contiguous
    // dimension), rows on h and j; b and i take no thread axis and no
    // tile. Every schedule strategy that puts d in the band of the rows
    // (canonical, min) or in a band of its own below a sequence with the
    // scaling of the scores (isl) maps it so; all are emulated.
    let p = small_decoding();
    let tile_32 = Options {
        gpu: Some(GpuOptions::default()),
        ..gpu_options(&[32])
    };
    for (label, options) in [
        ("isl", auto_gpu()),
        (
            "canonical",
            Options {
                strategy: schedule::Strategy::Canonical,
                ..auto_gpu()
            },
        ),
        (
            "min",
            Options {
                strategy: schedule::Strategy::Min,
                ..auto_gpu()
            },
        ),
        ("isl, tile 32", tile_32),
    ] {
        let c = compile(&p, &options).unwrap_or_else(|e| panic!("{label}: {e}"));
        let cuda = c.cuda.as_ref().unwrap();
        // The kernel that reads K (V is read by another one).
        let texts: Vec<&str> = cuda
            .source
            .split("extern \"C\" __global__")
            .skip(1)
            .collect();
        assert_eq!(texts.len(), cuda.kernels.len(), "{label}");
        let readers: Vec<usize> = (0..texts.len())
            .filter(|k| texts[*k].contains("t_K["))
            .collect();
        assert_eq!(readers.len(), 1, "{label}:\n{}", cuda.source);
        let (text, kernel) = (texts[readers[0]], &cuda.kernels[readers[0]]);
        assert!(
            text.contains("pf_red = pf_warp_sum(pf_red);"),
            "{label}:\n{text}"
        );
        assert!(!text.contains("pf_reg_"), "{label}:\n{text}");
        assert_eq!(kernel.block, [32, 8, 1], "{label}");
        // Tiles of j on x (8 rows, a row per warp; or the user's 32), of
        // h on y (one head; or the user's 32), nothing on z.
        let (j, h) = if label.contains("tile 32") {
            (32, 32)
        } else {
            (8, 1)
        };
        assert_eq!(
            kernel.grid_dims(&HashMap::new()).unwrap(),
            [1000_u32.div_ceil(j), 3_u32.div_ceil(h), 1],
            "{label}"
        );
        let tree = c.gpu_tree.as_ref().unwrap().to_string();
        let start = tree.find(&format!("mark: {}", kernel.name)).unwrap();
        let end = tree[start + 1..]
            .find("mark: kernel_")
            .map_or(tree.len(), |e| start + 1 + e);
        assert!(tree[start..end].contains("reduce_x_"), "{label}:\n{tree}");
        emulation_checks(c, label);
    }
}

#[test]
fn contractions_with_a_batch_of_one_keep_their_register_tiles() {
    // gemm's operands each miss a row member, and so does a batched
    // matmul's with the batch of one: the operands are reused, not
    // streamed, so the register tiles stay (no warp reduction).
    for json in [gemm(300, 200, 100), bmm(1, 300, 200, 100)] {
        let c = compile(&load_str(&json, "t.json").unwrap(), &auto_gpu()).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert!(src.contains("float pf_reg_kernel_0_C["), "{src}");
        assert!(!src.contains("pf_red"), "{src}");
        emulate_ok(&json, &auto_gpu());
    }
}

#[test]
fn small_problems_get_smaller_register_tiles() {
    // 150 x 70 makes 2 x 1 blocks of 128 x 128: too few, so 32 x 32 tiles.
    let p = load_str(&gemm(150, 70, 33), "gemm.json").unwrap();
    let mut auto = gpu_options(&[32]);
    auto.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    let c = compile(&p, &auto).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    assert!(
        cuda.source.contains("float pf_reg_kernel_0_C[2][2];"),
        "{}",
        cuda.source
    );
    assert_eq!(
        cuda.kernels[0].grid_dims(&HashMap::new()).unwrap(),
        [3, 5, 1]
    );
    emulate_ok(&gemm(150, 70, 33), &auto);
}

#[test]
fn impossible_blocks_and_grids_are_input_errors() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gemm.json");
    for (args, needle) in [
        (vec!["--block", "0,8"], "at least 1"),
        (vec!["--grid", "4,0"], "at least 1"),
        (vec!["--block", "64,32"], "larger than CUDA allows"),
        (vec!["--block", "1,1,128"], "larger than CUDA allows"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_polyfuse"))
            .args(["schedule", file, "--emit", "cuda"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.contains("gemm.json"), "{args:?}: {err}");
    }
}

#[test]
fn a_warp_reduction_keeps_the_rows_per_block_the_user_asked_for() {
    let json = rowsum_like("S(i) +=! X(i, j)", 37, 300);
    let p = load_str(&json, "rows.json").unwrap();
    let mut o = gpu_options(&[16]);
    o.gpu = Some(GpuOptions {
        block: vec![32, 16],
        ..GpuOptions::default()
    });
    let c = compile(&p, &o).unwrap();
    assert_eq!(c.cuda.as_ref().unwrap().kernels[0].block, [32, 16, 1]);
    emulate_ok(&json, &o);
}

#[test]
fn register_tiles_start_at_the_identity_of_their_reduction() {
    // `op=!` over the whole output: the registers start at the reducer's
    // identity instead of being loaded, for sum and max, and the results
    // still match the reference (odd sizes, partial tiles).
    for (op, start) in [("+=!", "= 0.0f;"), ("max=!", "= (-INFINITY);")] {
        let json = gemm(150, 70, 33).replace("+=!", op);
        let p = load_str(&json, "gemm.json").unwrap();
        let mut auto = gpu_options(&[32]);
        auto.gpu = Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        });
        let c = compile(&p, &auto).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert!(src.contains("pf_reg_kernel_0_C"), "{src}");
        assert!(
            src.contains(&format!("pf_reg_kernel_0_C[pf_ry][pf_rx] {start}")),
            "{op}:\n{src}"
        );
        assert!(!src.contains("= t_C[("), "{op}: C is loaded:\n{src}");
        emulate_ok(&json, &auto);
    }
}

fn contraction(a: &str, b: &str, body: &str, dtype: &str, sizes: (i64, i64, i64)) -> String {
    contraction_into(a, b, body, dtype, sizes, "f32")
}

/// The same with an output of dtype `out`: an f16 output keeps the tensor
/// cores' chained accumulation, an f32 one adds each run's sums in IEEE
/// f32 (`Accumulation`, tests/integration/accumulation.rs).
fn contraction_into(
    a: &str,
    b: &str,
    body: &str,
    dtype: &str,
    sizes: (i64, i64, i64),
    out: &str,
) -> String {
    let (m, n, k) = sizes;
    format!(
        r#"{{ "name": "mm", "params": {{ "M": {m}, "N": {n}, "K": {k} }},
             "inputs": {{ "A": {{"dtype": "{dtype}", "shape": {a}}}, "B": {{"dtype": "{dtype}", "shape": {b}}} }},
             "outputs": {{ "C": {{"dtype": "{out}", "shape": ["M", "N"]}} }},
             "body": [ "{body}" ] }}"#
    )
}

/// gemm `C +=! A B` of f16 operands (both row-major), f32 output.
fn gemm_f16(m: i64, n: i64, k: i64) -> String {
    contraction(
        r#"["M","K"]"#,
        r#"["K","N"]"#,
        "C(i, j) +=! A(i, k) * B(k, j)",
        "f16",
        (m, n, k),
    )
}

fn auto_gpu() -> Options {
    let mut o = gpu_options(&[32]);
    o.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    o
}

#[test]
fn f16_and_bf16_contractions_run_on_tensor_cores_in_every_operand_layout() {
    // Row- and column-major operands (ldmatrix with and without .trans),
    // sizes that leave partial tiles along m, n and k, both 16-bit types;
    // the CPU emulation executes ldmatrix and mma from their definitions.
    let cases = [
        (
            r#"["M","K"]"#,
            r#"["K","N"]"#,
            "C(i, j) +=! A(i, k) * B(k, j)",
        ),
        (
            r#"["M","K"]"#,
            r#"["N","K"]"#,
            "C(i, j) +=! A(i, k) * B(j, k)",
        ),
        (
            r#"["K","M"]"#,
            r#"["K","N"]"#,
            "C(i, j) +=! A(k, i) * B(k, j)",
        ),
        (
            r#"["K","M"]"#,
            r#"["N","K"]"#,
            "C(i, j) +=! f32(A(k, i)) * f32(B(j, k))",
        ),
    ];
    for (a, b, body) in cases {
        for dtype in ["f16", "bf16"] {
            let json = contraction(a, b, body, dtype, (70, 45, 41));
            let p = load_str(&json, "mm.json").unwrap();
            let c = compile(&p, &auto_gpu()).unwrap();
            let cuda = c.cuda.as_ref().unwrap();
            for needle in ["mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async.cg"] {
                assert!(cuda.source.contains(needle), "{body} {dtype}: no {needle}");
            }
            // Partial chunks (k = 41 and n = 45 end mid-chunk) are copied
            // element by element: an asynchronous copy with a smaller
            // source size is reported out of bounds by memcheck at the end
            // of a tensor (H100, gemm f16 129 x 255 x 100: 13 errors).
            assert!(!cuda.source.contains("pf_cp_async16(pf_dst, pf_src"));
            assert!(cuda
                .source
                .contains("_aligned && pf_count == 8) pf_cp_async16_full(pf_dst, pf_src);"));
            let trans = cuda.source.contains("pf_ldmatrix_x4_trans(pf_");
            assert_eq!(
                trans,
                a.starts_with(r#"["K""#) || b.starts_with(r#"["K""#),
                "{body}"
            );
            let k = &cuda.kernels[0];
            assert_eq!(k.block[0] % 32, 0);
            assert!(k.dynamic_shared > 0);
            emulate_ok(&json, &auto_gpu());
        }
    }
}

#[test]
fn user_tiles_choose_the_warps_and_odd_tiles_fall_back() {
    let json = gemm_f16(150, 140, 70);
    let p = load_str(&json, "mm.json").unwrap();
    for (tile, block, warps) in [
        (vec![64, 64, 16], vec![], "2 x 4 warps"),
        (vec![64, 64, 32], vec![128], "2 x 2 warps"),
        (vec![32, 64, 16], vec![64], "1 x 2 warps"),
    ] {
        let mut o = gpu_options(&tile);
        o.gpu = Some(GpuOptions {
            block: block.clone(),
            ..GpuOptions::default()
        });
        let c = compile(&p, &o).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert!(src.contains(warps), "{tile:?} {block:?}:\n{src}");
        emulate_ok(&json, &o);
    }
    // A k tile that is no multiple of 16 has no fragment form.
    let c = compile(&p, &gpu_options(&[32, 32, 8])).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("mma.sync"));
    emulate_ok(&json, &gpu_options(&[32, 32, 8]));
}

#[test]
fn contractions_that_do_not_fit_the_fragments_stay_on_the_ordinary_cores() {
    let simt = |json: &str, o: &Options| {
        let p = load_str(json, "mm.json").unwrap();
        let c = compile(&p, o).unwrap();
        assert!(
            !c.cuda.as_ref().unwrap().source.contains("mma.sync"),
            "{json}"
        );
        emulate_ok(json, o);
    };
    // f32 operands.
    simt(&gemm(70, 45, 41), &auto_gpu());
    // Asked not to.
    let f16 = gemm_f16(70, 45, 41);
    let mut off = auto_gpu();
    off.gpu = Some(GpuOptions {
        auto_tile: true,
        tensor_cores: false,
        ..GpuOptions::default()
    });
    simt(&f16, &off);
    // Not a plain product: a sum of products, and a strided operand.
    simt(
        &contraction(
            r#"["M","K"]"#,
            r#"["K","N"]"#,
            "C(i, j) +=! A(i, k) * B(k, j) + A(i, k)",
            "f16",
            (70, 45, 41),
        ),
        &auto_gpu(),
    );
    simt(
        &contraction(
            r#"["M","K"]"#,
            r#"["K","N"]"#,
            "C(i, j) +=! A(i, 2 * k) * B(k, j) where k in 0:20",
            "f16",
            (70, 45, 41),
        ),
        &auto_gpu(),
    );
    // A triangular domain is no box.
    simt(
        &contraction(
            r#"["M","K"]"#,
            r#"["K","N"]"#,
            "C(i, j) +=! A(i, k) * B(k, j) where k <= i",
            "f16",
            (70, 45, 70),
        ),
        &auto_gpu(),
    );
}

#[test]
fn reductions_into_half_precision_tensors_round_once_on_every_path() {
    // 300 products summed into an f16 output: rounding every step would
    // miss the f16 bound; f32 accumulation (registers, CPU) keeps it.
    let json = gemm_f16(40, 33, 300).replace(r#""C": {"dtype": "f32""#, r#""C": {"dtype": "f16""#);
    let p = load_str(&json, "mm.json").unwrap();
    // The CPU schedule.
    let c = compile(&p, &Options::default()).unwrap();
    assert!(c.kernel_c.contains("pf_wide_C"), "{}", c.kernel_c);
    let r = run(
        &c,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed: 3,
        },
    )
    .unwrap();
    assert!(r.check.as_ref().unwrap().ok, "{}", r.check.unwrap().line());
    // The GPU's ordinary path (register tiles in f32) and the tensor cores.
    for tensor_cores in [false, true] {
        let mut o = auto_gpu();
        o.gpu = Some(GpuOptions {
            auto_tile: true,
            tensor_cores,
            ..GpuOptions::default()
        });
        let c = compile(&p, &o).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert_eq!(src.contains("mma.sync.aligned"), tensor_cores);
        if !tensor_cores {
            assert!(src.contains("float pf_reg_kernel_0_C"), "{src}");
        }
        emulate_ok(&json, &o);
    }
}

#[test]
fn whole_swizzle_atoms_get_a_wgmma_path_emulated_from_its_descriptors() {
    // Each operand K-major or MN-major: the kernel carries wgmma for
    // sm_90a (transpose flags from the layouts, tiles in the 128-byte
    // swizzle) and mma.sync for the rest; the CPU runs the wgmma path,
    // reading the swizzled tiles the way the tensor cores address them.
    // Sizes no multiple of the tiles: partial tiles along m, n and k.
    for (a_mn, b_mn) in [(false, false), (false, true), (true, false), (true, true)] {
        let (a, a_use) = if a_mn {
            (r#"["K","M"]"#, "A(k, i)")
        } else {
            (r#"["M","K"]"#, "A(i, k)")
        };
        let (b, b_use) = if b_mn {
            (r#"["K","N"]"#, "B(k, j)")
        } else {
            (r#"["N","K"]"#, "B(j, k)")
        };
        let body = format!("C(i, j) +=! {a_use} * {b_use}");
        let trans = format!("t{}{}", u8::from(a_mn), u8::from(b_mn));
        for dtype in ["f16", "bf16"] {
            let json = contraction(a, b, &body, dtype, (150, 300, 100));
            let p = load_str(&json, "mm.json").unwrap();
            for tile in [[128, 256, 64], [64, 128, 64]] {
                let o = gpu_options(&tile);
                let c = compile(&p, &o).unwrap();
                let src = &c.cuda.as_ref().unwrap().source;
                let helper = format!("pf_wgmma_{dtype}_n{}_{trans}(", tile[1]);
                assert!(src.contains(&helper), "{body} {tile:?}: no {helper}");
                assert!(src.contains(&format!(
                    "wgmma.mma_async.sync.aligned.m64n{}k16.f32.{dtype}.{dtype}",
                    tile[1]
                )));
                assert!(src.contains("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)"));
                assert!(src.contains("__align__(1024)"), "the swizzle's base");
                // The copies keep one chunk's addresses per operand, with a
                // fast path free of tests for whole tiles; the partial
                // tiles at these sizes take the per-chunk path.
                assert!(src.contains("if (pf_full && pf_A_all) {"), "{tile:?}");
                assert!(src.contains("if (pf_full && pf_B_all) {"), "{tile:?}");
                // A few blocks and two k tiles each (the latency regime):
                // a stage per k tile, both copied first, none refilled, so
                // every step's wgmma stays in flight until the loop ends.
                assert!(src.contains("(2 stages)"), "{tile:?}");
                assert!(!src.contains("pf_wgmma_wait1();"), "{tile:?}");
                assert!(src.contains("pf_wgmma_wait0();"), "{tile:?}");
                // Neighbouring outputs stored in pairs where they can be.
                assert!(src.contains("*(float2 *)&t_C["), "{tile:?}");
                assert!(src.contains("mma.sync.aligned.m16n8k16"), "the fallback");
                // An f32 output, 100 of k: longer than one run of the
                // promoted sum (64, `4 sqrt(k)` at least one k tile), so
                // each k tile's sums are added in IEEE f32
                // (tests/integration/accumulation.rs).
                assert!(
                    c.emulation_c
                        .as_ref()
                        .unwrap()
                        .contains("pf_emu_wgmma(&pf_step"),
                    "100 of k: promoted"
                );
                emulate_ok(&json, &o);
            }
        }
    }
    // A k tile other than one swizzle row, or an MN-major operand tile
    // that is not whole 64-row groups: mma.sync only.
    for (b, body, tile) in [
        (
            r#"["N","K"]"#,
            "C(i, j) +=! A(i, k) * B(j, k)",
            [128, 256, 32],
        ),
        (
            r#"["K","N"]"#,
            "C(i, j) +=! A(i, k) * B(k, j)",
            [128, 96, 64],
        ),
    ] {
        let json = contraction(r#"["M","K"]"#, b, body, "f16", (300, 520, 100));
        let p = load_str(&json, "mm.json").unwrap();
        let o = gpu_options(&tile);
        let c = compile(&p, &o).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert!(!src.contains("wgmma.mma_async"), "{tile:?}");
        assert!(src.contains("mma.sync.aligned.m16n8k16"), "{tile:?}");
        emulate_ok(&json, &o);
    }
}

#[test]
fn a_32_wide_mn_major_tile_takes_the_64_byte_swizzle() {
    // B row-major ([K][N]) in a 32-wide tile: one 64-byte line per k, laid
    // out in the 64-byte swizzle (chunk `q` of line `l` at `q ^ (l / 2 %
    // 4)`), read through descriptors of that mode; K-major B in the same
    // tile stays in the 128-byte swizzle. Sizes off the tiles along m, n
    // and k; k = 1100 (18 tiles: more than shared memory holds) refills
    // the stages, k = 100 holds every k tile in a stage of its own.
    for (b, b_use, narrow) in [
        (r#"["K","N"]"#, "B(k, j)", true),
        (r#"["N","K"]"#, "B(j, k)", false),
    ] {
        for dtype in ["f16", "bf16"] {
            for k in [100, 1100] {
                let body = format!("C(i, j) +=! A(i, k) * {b_use}");
                // An output of the operands' type: chained accumulation,
                // whose refilled stages wait for the step before.
                let json = contraction_into(r#"["M","K"]"#, b, &body, dtype, (130, 70, k), dtype);
                let mut o = gpu_options(&[64, 32, 64]);
                // Unsplit (the automatic split would share k = 1100 among
                // four blocks of a cluster, five tiles each).
                o.gpu.as_mut().unwrap().k_split = Some(1);
                let c = compile(&load_str(&json, "mm.json").unwrap(), &o).unwrap();
                let src = &c.cuda.as_ref().unwrap().source;
                let what = format!("{body} {dtype} k={k}");
                assert!(!src.contains("__cluster_dims__"), "{what}");
                assert!(
                    src.contains("wgmma.mma_async.sync.aligned.m64n32k16"),
                    "{what}"
                );
                assert_eq!(
                    src.contains("pf_wgmma_desc_sw64(pf_mma_kernel_0_B, "),
                    narrow,
                    "{what}"
                );
                // Each step's descriptors: the buffers' own, computed once,
                // moved by the step's offset.
                assert!(
                    src.contains("pf_wgmma_desc_at(pf_mma_kernel_0_A_desc, ")
                        && src.contains("pf_wgmma_desc_at(pf_mma_kernel_0_B_desc, "),
                    "{what}"
                );
                assert_eq!(
                    src.contains("((pf_B0_line / 2) % 4)) * 8)"),
                    narrow,
                    "{what}"
                );
                // Refilled stages wait for the step before; whole-k ones
                // do not.
                assert_eq!(src.contains("pf_wgmma_wait1();"), k == 1100, "{what}");
                // Partial tiles: the copies test each k tile's end and the
                // epilogue the output's bounds.
                assert!(!src.contains("const int pf_full = 1;"), "{what}");
                assert!(!src.contains("if (pf_A_all && pf_B_all) {"), "{what}");
                emulate_ok(&json, &o);
            }
        }
    }
    // Extents that are multiples of the tiles: whole tiles known at
    // compile time, so neither test is printed; still the reference's
    // result on the CPU.
    for dtype in ["f16", "bf16"] {
        let json = contraction(
            r#"["M","K"]"#,
            r#"["K","N"]"#,
            "C(i, j) +=! A(i, k) * B(k, j)",
            dtype,
            (128, 64, 192),
        );
        let o = gpu_options(&[64, 32, 64]);
        let c = compile(&load_str(&json, "mm.json").unwrap(), &o).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert!(src.contains("const int pf_full = 1;"), "{src}");
        // The first tiles' copies in a loop of their own where every
        // chunk is aligned and inside (on the GPU).
        assert!(src.contains("if (pf_A_all && pf_B_all) {"), "{src}");
        assert!(src.contains("pf_inside[pf_c] = 1;"), "{src}");
        assert!(!src.contains("pf_m0 + pf_lm < pf_em"), "{src}");
        emulate_ok(&json, &o);
    }
}

#[test]
fn wgmma_tiles_of_batched_and_fused_contractions_are_emulated() {
    // A batch member on the grid (tbmm) and epilogue statements applied to
    // the accumulators (fcrelu: bias and ReLU, f32 output stored in pairs)
    // on the wgmma path, at sizes no multiple of the tiles.
    for (name, values, tensor) in [
        (
            "tbmm_bf16",
            &[("B", 3), ("N", 70), ("M", 45), ("K", 83)][..],
            "t_Z[",
        ),
        (
            "fcrelu_f16",
            &[("B", 70), ("M", 45), ("N", 83)][..],
            "t_O1[",
        ),
    ] {
        let p = example_with(name, values);
        for tile in [[64, 64, 64], [64, 128, 64]] {
            let src = emulated_cuda(&p, &gpu_options(&tile));
            assert!(src.contains("wgmma.mma_async"), "{name} {tile:?}");
            assert!(
                src.contains(&format!("*)&{tensor}")),
                "{name}: paired stores"
            );
        }
    }
}

#[test]
fn a_contractions_reduction_split_over_a_cluster_is_emulated() {
    // k split over the blocks of a cluster (grid z): each block runs its
    // range of k tiles, the partial tiles are summed in rank order and
    // each block stores the registers it owns. Both engines (wgmma at
    // 64 x 64 x 64, mma.sync at 32 x 32 x 32), splits that leave the last
    // block a shorter range or none (8 ranks of 777 = 13 k tiles of 64:
    // two each, the last one none), partial tiles along m, n and k. The
    // split of 8 at 130 x 200 (35 tiles of 32 x 32: 280 blocks) unrolls
    // the pipeline; the others, at 70 x 83, roll it.
    for tile in [[64, 64, 64], [32, 32, 32]] {
        for split in [2u32, 3, 8] {
            let (m, n) = if split == 8 { (130, 200) } else { (70, 83) };
            let json = gemm_f16(m, n, 777);
            let p = load_str(&json, "mm.json").unwrap();
            let mut o = gpu_options(&tile);
            o.gpu.as_mut().unwrap().k_split = Some(split);
            let c = compile(&p, &o).unwrap();
            let cuda = c.cuda.as_ref().unwrap();
            let g = cuda.kernels[0].grid_dims(&HashMap::new()).unwrap();
            assert_eq!(g[2], split, "{tile:?} {split}: grid z");
            let src = &cuda.source;
            assert!(
                src.contains(&format!("__cluster_dims__(1, 1, {split})")),
                "{tile:?} {split}"
            );
            assert!(src.contains("pf_cluster_load(&pf_part["));
            assert_eq!(
                src.matches("pf_cluster_sync();").count(),
                if tile[0] == 64 { 4 } else { 2 },
                "two barriers per engine"
            );
            // Blocks before sm_90: rank 0 alone, all of k.
            assert!(src.contains("if (pf_ranks > 1 || blockIdx.z == 0) {"));
            assert!(cuda.kernels[0].dynamic_shared >= (tile[0] * tile[1] * 4) as usize);
            // No more blocks than the H100 has multiprocessors, and every k
            // tile of a block fits a stage: the pipeline's loops roll (no
            // unrolled copies); 35 tiles of 32 x 32 split 8 are 280 blocks.
            let blocks =
                (m + tile[0] - 1) / tile[0] * ((n + tile[1] - 1) / tile[1]) * i64::from(split);
            assert_eq!(
                src.contains("for (int pf_s = 0; pf_s <"),
                blocks <= 132,
                "{tile:?} {split}"
            );
            emulate_ok(&json, &o);
        }
    }
    // A long k (79 tiles, 40 a block): more than shared memory holds, so
    // the unrolled pipeline, split in two; one wave of 64 x 64 tiles: six
    // stages, four tiles ahead.
    let long = gemm_f16(70, 83, 5000);
    let mut o = gpu_options(&[64, 64, 64]);
    o.gpu.as_mut().unwrap().k_split = Some(2);
    let c = compile(&load_str(&long, "mm.json").unwrap(), &o).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(
        src.contains("(6 stages)") && !src.contains("pf_s = 0"),
        "{src}"
    );
    assert!(src.contains("__cluster_dims__(1, 1, 2)"));
    emulate_ok(&long, &o);
    // Accumulating into values set before (no `!`): rank 0 alone starts
    // from them. An epilogue (bias, ReLU, f16 output in pairs) on the
    // owned registers after the sums.
    let json = r#"{ "name": "mm", "params": { "M": 70, "N": 90, "K": 300 },
        "inputs": { "A": {"dtype": "f16", "shape": ["M","K"]}, "B": {"dtype": "f16", "shape": ["K","N"]},
                    "D": {"dtype": "f32", "shape": ["M","N"]} },
        "outputs": { "C": {"dtype": "f32", "shape": ["M","N"]} },
        "body": [ "C(i, j) = D(i, j)", "C(i, j) += A(i, k) * B(k, j)" ] }"#;
    let p = load_str(json, "acc.json").unwrap();
    let mut o = gpu_options(&[64, 64, 64]);
    o.gpu.as_mut().unwrap().k_split = Some(3);
    // Fused with the update, the first statement would have to set the
    // accumulators' start: that kernel stays off the tensor cores (isl's
    // grouping, kept with the cost model's choice off) ...
    o.gpu.as_mut().unwrap().fusion_by_cost = false;
    let c = compile(&p, &o).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("tensor cores"));
    emulate_ok(json, &o);
    // ... which the default's cost model splits (issue 32).
    o.gpu.as_mut().unwrap().fusion_by_cost = true;
    let c = compile(&p, &o).unwrap();
    assert!(c
        .gpu_tree
        .as_ref()
        .unwrap()
        .to_string()
        .contains("minimal_fusion_by_cost"));
    assert!(c.cuda.as_ref().unwrap().source.contains("tensor cores"));
    // In kernels of their own, the update starts from C.
    o.strategy = Strategy::Min;
    let c = compile(&p, &o).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(src.contains("pf_in && pf_rank == 0 ?"), "{src}");
    emulate_ok(json, &o);
    let p = example_with("fcrelu_f16", &[("B", 70), ("M", 45), ("N", 300)]);
    let mut o = gpu_options(&[64, 64, 64]);
    o.gpu.as_mut().unwrap().k_split = Some(4);
    let src = emulated_cuda(&p, &o);
    assert!(src.contains("__cluster_dims__(1, 1, 4)"));
}

#[test]
fn a_deeper_pipeline_refills_its_stages_in_order() {
    // 12 blocks of 64 x 64 whose 16 k tiles do not fit in shared memory
    // at once (unsplit): six stages, four tiles ahead, refilled as the
    // tensor cores finish with them; partial tiles along m, n and k.
    // An f16 output: the chained accumulation keeps each step's wgmma in
    // flight until the next step's wait.
    let json = contraction_into(
        r#"["M","K"]"#,
        r#"["K","N"]"#,
        "C(i, j) +=! A(i, k) * B(k, j)",
        "f16",
        (130, 200, 1000),
        "f16",
    );
    let mut o = gpu_options(&[64, 64, 64]);
    o.gpu.as_mut().unwrap().k_split = Some(1);
    let c = compile(&load_str(&json, "mm.json").unwrap(), &o).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(src.contains("wgmma.m64n64k16) (6 stages)"), "{src}");
    assert!(src.contains("pf_wgmma_wait1();"), "{src}");
    emulate_ok(&json, &o);
}

#[test]
fn few_output_tiles_split_the_reduction_by_default() {
    // 128 x 1024 x 1024 (TC's latency case) has too few output tiles to
    // give each of the H100's multiprocessors a block: the automatic
    // choice splits k; 4096^3 has enough tiles and does not; a batch takes
    // the grid's z and keeps one block per tile.
    let split_of = |json: &str| {
        let p = load_str(json, "mm.json").unwrap();
        let c = compile(&p, &auto_gpu()).unwrap();
        let cuda = c.cuda.as_ref().unwrap();
        let g = cuda.kernels[0].grid_dims(&HashMap::new()).unwrap();
        let clusters = cuda.source.contains("__cluster_dims__");
        assert_eq!(clusters, g[2] > 1);
        g[2]
    };
    // Unless one wave of blocks can hold all of k at once: 128 x 1024 x
    // 1024 takes 64 x 32 tiles (64 blocks), unsplit, each of its 16 k
    // tiles in a stage of its own.
    assert_eq!(split_of(&gemm_f16(128, 1024, 1024)), 1);
    let p = load_str(&gemm_f16(128, 1024, 1024), "mm.json").unwrap();
    let c = compile(&p, &auto_gpu()).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(
        src.contains("64 x 32 x 64 tiles, 1 warpgroups") && src.contains("(16 stages)"),
        "{src}"
    );
    assert_eq!(
        c.cuda.as_ref().unwrap().kernels[0]
            .grid_dims(&HashMap::new())
            .unwrap(),
        [32, 2, 1]
    );
    // 32 k tiles do not fit: 64 x 64 tiles split in 4 (128 blocks), each
    // block's 8 k tiles in stages of their own.
    assert_eq!(split_of(&gemm_f16(64, 2048, 2048)), 4);
    let c = compile(
        &load_str(&gemm_f16(64, 2048, 2048), "mm.json").unwrap(),
        &auto_gpu(),
    )
    .unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    assert!(
        src.contains("64 x 64 x 64 tiles, 1 warpgroups") && src.contains("(8 stages)"),
        "{src}"
    );
    assert_eq!(split_of(&gemm_f16(4096, 4096, 4096)), 1);
    // One wave of 64 x 64 tiles whose k does not fit (128 x 4096 x 4096):
    // six stages, four tiles copied ahead; larger tiles and more blocks
    // keep four.
    let stages_of = |json: &str| {
        let c = compile(&load_str(json, "mm.json").unwrap(), &auto_gpu()).unwrap();
        let src = c.cuda.as_ref().unwrap().source.clone();
        let at = src.find(" stages) */").expect("a pipeline");
        let from = src[..at].rfind('(').unwrap() + 1;
        src[from..at].parse::<i64>().unwrap()
    };
    assert_eq!(stages_of(&gemm_f16(128, 4096, 4096)), 6);
    assert_eq!(stages_of(&gemm_f16(1024, 1024, 1024)), 4);
    assert_eq!(stages_of(&gemm_f16(4096, 4096, 4096)), 4);
    // Tiles of 64 rows or more, the smallest split that gives 128 blocks:
    // 256 x 1024 takes 64 x 64 tiles split in two (not 32 x 32 unsplit),
    // 1024 x 1024 takes 64 x 128 tiles unsplit.
    let tile_of = |json: &str| {
        let c = compile(&load_str(json, "mm.json").unwrap(), &auto_gpu()).unwrap();
        let src = c.cuda.as_ref().unwrap().source.clone();
        let at = src.find("tensor cores: ").expect("on tensor cores") + 14;
        src[at..].split(" tiles").next().unwrap().to_string()
    };
    assert_eq!(split_of(&gemm_f16(256, 1024, 4096)), 2);
    assert_eq!(tile_of(&gemm_f16(256, 1024, 4096)), "64 x 64 x 64");
    assert_eq!(split_of(&gemm_f16(1024, 1024, 1024)), 1);
    assert_eq!(tile_of(&gemm_f16(1024, 1024, 1024)), "64 x 128 x 64");
    // Fewer than 64 rows: 32-row tiles (mma.sync).
    assert_eq!(tile_of(&gemm_f16(37, 530, 290)), "32 x 32 x 32");
    // k too short to share: one k tile per block at most.
    assert_eq!(split_of(&gemm_f16(128, 1024, 64)), 1);
    let p = example_with("tbmm_bf16", &[("B", 2), ("N", 64), ("M", 64), ("K", 4096)]);
    let c = compile(&p, &auto_gpu()).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("__cluster_dims__"));
}

/// `examples/NAME.json` with parameters set to `values`.
fn example_with(name: &str, values: &[(&str, i64)]) -> Program {
    program_with(&format!("examples/{name}.json"), values)
}

/// Compiles `p` for the GPU and checks its emulation against the f64
/// reference; returns the CUDA source.
fn emulated_cuda(p: &Program, options: &Options) -> String {
    let c = compile(p, options).unwrap_or_else(|e| panic!("{e}"));
    let source = c.cuda.as_ref().unwrap().source.clone();
    emulation_checks(c, "");
    source
}

/// The CUDA of `p` under `options`, its text only; the same options'
/// emulation is checked on `small` instead (a smaller program of the same
/// statements: the mapping's code paths at a tenth of the emulated work).
fn cuda_emulated_on(p: &Program, small: &Program, options: &Options) -> String {
    let c = compile(p, options).unwrap_or_else(|e| panic!("{e}"));
    emulated_cuda(small, options);
    c.cuda.as_ref().unwrap().source.clone()
}

/// Runs the CPU emulation of `c`'s GPU mapping and checks it against the
/// f64 reference (`what` names the case in a failure).
fn emulation_checks(mut c: polyfuse::Compiled, what: &str) {
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
    assert!(check.ok, "{what}: {}", check.line());
}

/// The text of kernel `k` in a CUDA source.
fn kernel_text(source: &str, k: usize) -> &str {
    let start = source.find(&format!(" kernel_{k}(")).unwrap();
    let end = source[start..]
        .find(&format!(" kernel_{}(", k + 1))
        .map_or(source.len(), |e| start + e);
    &source[start..end]
}

#[test]
fn the_running_state_of_a_rolling_update_stays_in_the_threads_registers() {
    // Fused softmax at odd sizes, one kernel (the output loop fused into
    // the rows after the rolling update): the rolling maximum, its
    // previous value and the rolling sum belong to one row each, so they
    // live in the registers of the row's lanes and never touch global
    // memory (no other kernel reads them).
    let p = example_with("softmax_fused", &[("N", 37), ("D", 300)]);
    let src = emulated_cuda(&p, &auto_gpu());
    assert_eq!(src.matches("__global__").count(), 1, "{src}");
    let k0 = kernel_text(&src, 0);
    for t in ["M", "M_prev", "S"] {
        assert!(k0.contains(&format!("pf_priv_kernel_0_{t};")), "{t}:\n{k0}");
        assert!(!k0.contains(&format!("t_{t}[")), "{t}:\n{k0}");
    }
    // X is not one row's alone in the sense of private storage (each lane
    // holds its share of the row, see the test of lanes below).
    assert!(!k0.contains("pf_priv_kernel_0_X"), "{k0}");
    // Without registers, nothing is private: the row's lane 0 runs it
    // alone, still correct.
    let mut off = auto_gpu();
    off.gpu.as_mut().unwrap().registers = false;
    let src = emulated_cuda(&p, &off);
    assert!(!src.contains("pf_priv_"), "{src}");
    assert!(!src.contains("__shfl_xor_sync(0xffffffffu, pf_"), "{src}");
}

#[test]
fn attention_rows_keep_query_output_and_scores_in_registers() {
    // Global attention fused into one kernel (maximal fusion; isl fuses
    // it so at these sizes), odd sizes (B = 3, H = 5, S = 130, D = 19): a
    // thread per query row keeps the output row (D elements, the loops
    // over them unrolled), the running maximum and sum for the whole row,
    // and the score of one key (P, accumulated over d) for one iteration of
    // the key loop. Emulated and checked against the f64 reference.
    let p = example_with(
        "attention_global",
        &[("B", 3), ("H", 5), ("S", 130), ("D", 19)],
    );
    let options = Options {
        strategy: schedule::Strategy::Max,
        ..auto_gpu()
    };
    let src = emulated_cuda(&p, &options);
    assert_eq!(src.matches("__global__").count(), 1, "{src}");
    assert!(src.contains("float pf_priv_kernel_0_O[19];"), "{src}");
    assert!(src.contains("float pf_priv_kernel_0_P;"), "{src}");
    assert!(src.contains("float pf_priv_kernel_0_M;"), "{src}");
    assert!(src.contains("float pf_priv_kernel_0_L;"), "{src}");
    assert!(src.contains("#pragma unroll"), "{src}");
    assert!(!src.contains("t_P["), "{src}");
    assert!(!src.contains("t_O["), "{src}");
    // K and V rows are read by every thread of a (batch, head): shared,
    // never private.
    assert!(!src.contains("pf_priv_kernel_0_K"), "{src}");
    assert!(!src.contains("pf_priv_kernel_0_V"), "{src}");
}

#[test]
fn statements_whose_thread_loop_vanished_update_the_register_of_their_owner() {
    // Split-k decoding under maximal fusion: in the partial-reduction
    // kernel the last key slice (j_s = 63 of 64 at KV = 1000) has no keys,
    // so isl prints its initialisations apart, without the thread loop
    // along x (one value). They used to run on thread 0's register slot 0,
    // which belongs to another slice (relative error inf); they must run
    // on the thread and slot that own their element. Emulated, odd sizes.
    let p = small_decoding();
    let options = Options {
        strategy: schedule::Strategy::Max,
        ..auto_gpu()
    };
    let src = emulated_cuda(&p, &options);
    assert!(
        src.contains("((pf_b1 + pf_t1)) == ((63))"),
        "the owner test:\n{src}"
    );
}

#[test]
fn private_copies_run_on_the_threads_that_run_their_statements() {
    // One row: the thread loop over rows has one iteration and isl prints
    // none, so the rolling statements run on thread 0 of block 0 only. The
    // stores of the private M and S must too: the other threads' copies
    // were never computed, and they stored them to the same elements.
    // (The emulation runs one thread here, so only the CUDA shows it.)
    let p = example_with("softmax_fused", &[("N", 1), ("D", 300)]);
    let c = compile(&p, &auto_gpu()).unwrap();
    let src = &c.cuda.as_ref().unwrap().source;
    let k0 = kernel_text(src, 0);
    for t in ["M", "S"] {
        let store = k0
            .lines()
            .find(|l| {
                l.contains(&format!("t_{t}[")) && l.contains(&format!("= pf_priv_kernel_0_{t};"))
            })
            .unwrap_or_else(|| panic!("no store of {t}:\n{k0}"));
        assert!(store.contains("threadIdx.x == 0"), "{store}");
        assert!(store.contains("blockIdx.x == 0"), "{store}");
    }
    emulation_checks(c, "one row");
}

#[test]
fn private_copies_are_stored_only_by_the_iterations_that_compute_them() {
    // Maximal fusion makes one kernel of `H = 2 X` and `Y(i, k) +=! H(i, j)
    // W(j, k) where j < k`: a thread per row, whose iterations run over
    // the 32-wide tiles of j (D = 45: two). Y's reduction reads j < k <= 28,
    // the first tile only, so Y's row is private to the iteration over the
    // first tile; the iteration over the second computes only H, yet it
    // stored its copy of Y, never written, over the row (issue 30, class
    // 2: relative error 7.0e1 in the emulation before). The copies are
    // made only by the iterations that touch the array.
    let json = r#"{ "name": "lower", "params": { "N": 70, "D": 45, "M": 29 },
        "inputs": { "X": {"dtype": "f32", "shape": ["N", "D"]},
                    "W": {"dtype": "f32", "shape": ["D", "M"]} },
        "outputs": { "Y": {"dtype": "f32", "shape": ["N", "M"]} },
        "temps": { "H": {"dtype": "f32", "shape": ["N", "D"]} },
        "body": [ "H(i, j) = X(i, j) * 2",
                  "Y(i, k) +=! H(i, j) * W(j, k) where j < k" ] }"#;
    let p = load_str(json, "lower.json").unwrap();
    let options = Options {
        strategy: schedule::Strategy::Max,
        ..auto_gpu()
    };
    let src = emulated_cuda(&p, &options);
    assert_eq!(src.matches("__global__").count(), 1, "{src}");
    let store = src
        .lines()
        .find(|l| l.contains("t_Y[") && l.contains("= pf_priv_kernel_0_Y["))
        .unwrap_or_else(|| panic!("Y is no longer private:\n{src}"));
    assert!(store.contains("c2 == 0"), "{store}");
}

/// Untiled split-k softmax: isl splits the loop over a slice's elements
/// into pieces, and the piece holding only the initialisation of a slice's
/// maximum has no loop for the iterator the shared copy of `X` is offset
/// by. That piece runs without the copy (it reads no `X`); before, the
/// printer named the undefined iterator and the code did not compile. The
/// emulation compiles it and checks it against the reference, at a row
/// length that is no multiple of the split.
#[test]
fn a_piece_of_a_loop_without_its_iterator_runs_without_the_shared_copy() {
    let p = program_with("examples/softmax_fused.json", &[("N", 37), ("D", 203)]);
    for factor in [16, 5] {
        let options = Options {
            tile: Vec::new(),
            repair: polyfuse::repair::Choice::SplitK(factor),
            gpu: Some(GpuOptions::default()),
            ..Default::default()
        };
        let c = compile(&p, &options).unwrap();
        let cuda = c.cuda.as_ref().unwrap().source.clone();
        assert!(
            cuda.contains("pf_shared_kernel_0_X"),
            "X is still promoted:\n{cuda}"
        );
        emulation_checks(c, &format!("split {factor}"));
    }
}

#[test]
fn a_rolling_update_splits_each_row_over_the_lanes_of_a_warp_or_a_block() {
    // Fused softmax, fused whole after its rolling update (one kernel):
    // each lane takes iterations l, l + W, .. of the row's loops, runs
    // the rolling maximum and sum over its share from the identities, and
    // the lanes' states combine with the proven repair (the partner's sum
    // moved to the combined maximum). Rows of 300 get a warp (8 rows per
    // block), rows of 2000 two warps and rows of 4100 eight (a block per
    // row, the warps' states combined through shared memory). X, read by
    // both loops, is read from memory once, into each lane's registers.
    for (d, width) in [(300, 32u32), (2000, 64), (4100, 256)] {
        let p = example_with("softmax_fused", &[("N", 5), ("D", d)]);
        let c = compile(&p, &auto_gpu()).unwrap_or_else(|e| panic!("{e}"));
        let cuda = c.cuda.as_ref().unwrap();
        assert_eq!(cuda.kernels.len(), 1, "D = {d}");
        // Rows on a warp: 8 a block; wider rows: a block tile's two rows
        // side by side on y, each group of rows on its own barrier and its
        // own warps' parts.
        let rows = if width == 32 { 8 } else { 2 };
        assert_eq!(cuda.kernels[0].block, [width, rows, 1], "D = {d}");
        if width > 32 {
            let src = &cuda.source;
            let warps = width / 32;
            assert!(src.contains(&format!(
                "__shared__ float pf_part_pf_priv_kernel_0_S[{}];",
                2 * warps
            )));
            assert!(src.contains(&format!(
                "pf_part_pf_priv_kernel_0_S[threadIdx.y * {warps} + (threadIdx.x >> 5)] = pf_priv_kernel_0_S;"
            )));
            assert!(src.contains(r#"asm volatile("bar.sync %0, %1;" :: "r"(threadIdx.y + 1), "r"(blockDim.x) : "memory");"#));
            // The block's own barrier only outside the rows' loop (around
            // the block tile's shared copy).
            let rows_loop = src.find("for (pf_i c1 = 0 + (pf_i)threadIdx.y").unwrap();
            let end = src[rows_loop..].find("\n      }\n").unwrap() + rows_loop;
            assert!(
                !src[rows_loop..end].contains("__syncthreads"),
                "D = {d}:\n{src}"
            );
        }
        let src = cuda.source.clone();
        for t in ["M", "S"] {
            assert!(
                src.contains(&format!(
                    "__shfl_xor_sync(0xffffffffu, pf_priv_kernel_0_{t}, pf_o)"
                )),
                "D = {d}:\n{src}"
            );
        }
        assert!(
            src.contains("(pf_b_pf_priv_kernel_0_S * expf((pf_b_pf_priv_kernel_0_M + (-pf_n_pf_priv_kernel_0_M))))"),
            "D = {d}:\n{src}"
        );
        assert_eq!(
            src.contains("__shared__ float pf_part_pf_priv_kernel_0_S["),
            width > 32,
            "D = {d}:\n{src}"
        );
        let slots = (d as u32).div_ceil(width);
        assert!(
            src.contains(&format!("float pf_row_kernel_0_X[{slots}];")),
            "D = {d}:\n{src}"
        );
        // Loaded once into the registers (the block's shared copy of X, where
        // one fits, is not read in the loops), slot `t` of lane `l` being
        // iteration `l + W t` (rows side by side or on warps do not take
        // their slots in fours).
        assert_eq!(
            src.matches("pf_row_kernel_0_X[pf_t] = t_X[").count(),
            1,
            "D = {d}:\n{src}"
        );
        assert!(!src.contains("*(const float4 *)pf_a"), "D = {d}:\n{src}");
        assert!(
            src.contains("fmaxf(pf_priv_kernel_0_M, pf_row_kernel_0_X[pf_t])"),
            "D = {d}:\n{src}"
        );
        assert!(
            src.contains(
                "(expf((pf_row_kernel_0_X[pf_t] - pf_priv_kernel_0_M)) / pf_priv_kernel_0_S)"
            ),
            "D = {d}:\n{src}"
        );
        emulation_checks(c, &format!("softmax_fused D = {d}"));
    }
}

#[test]
fn plain_reductions_of_a_row_split_over_the_lanes_too() {
    // Layer norm under maximal fusion: the mean and the variance are
    // plain sums over the row (the variance reads the finished mean), and
    // the output loop reads both; each sum is split over the lanes and
    // combined with `+`.
    for d in [700, 2000, 2002] {
        let p = example_with("layernorm", &[("N", 5), ("D", d)]);
        let options = Options {
            strategy: Strategy::Max,
            ..auto_gpu()
        };
        let c = compile(&p, &options).unwrap_or_else(|e| panic!("{e}"));
        let src = c.cuda.as_ref().unwrap().source.clone();
        for t in ["Mean", "Var"] {
            assert!(
                src.contains(&format!(
                    "pf_n_pf_priv_kernel_0_{t} = pf_priv_kernel_0_{t} + pf_b_pf_priv_kernel_0_{t};"
                )),
                "{src}"
            );
        }
        // Rows of 2000 (and 2002) on a block of 64 threads, one row at a
        // time, 32 slots a lane: the lanes take their slots in fours, each
        // four of the cached row loaded and each four outputs stored as one
        // 16-byte access where the address is aligned (at D = 2002 every
        // other row is not: one element at a time there), and the
        // emulation runs the same order. Rows of 700 take a warp.
        let block = c.cuda.as_ref().unwrap().kernels[0].block;
        if d == 700 {
            assert_eq!(block[0], 32);
            assert!(!src.contains("pf_t / 4"), "{src}");
        } else {
            assert_eq!(block, [64, 1, 1]);
            assert!(
                src.contains("(4 * ((pf_i)threadIdx.x + 64 * (pf_t / 4)) + pf_t % 4)"),
                "{src}"
            );
            assert!(
                src.contains("const float4 pf_v = *(const float4 *)pf_a;"),
                "{src}"
            );
            assert!(
                src.contains("(((unsigned long long)pf_a) & 15) == 0"),
                "{src}"
            );
            assert!(
                src.contains(
                    "*(float4 *)pf_a = make_float4(pf_vs[0], pf_vs[1], pf_vs[2], pf_vs[3]);"
                ),
                "{src}"
            );
        }
        emulation_checks(c, &format!("layernorm D = {d}"));
    }
}

#[test]
fn the_default_strategy_fuses_rows_that_stay_across_lanes() {
    // Layer norm under the default strategy: isl's schedule puts the output
    // in a kernel of its own, which reads each row from memory again;
    // maximal fusion gives one kernel whose rows run across lanes, so the
    // GPU path takes it. Odd sizes, emulated.
    let p = example_with("layernorm", &[("N", 37), ("D", 1500)]);
    let c = compile(&p, &auto_gpu()).unwrap_or_else(|e| panic!("{e}"));
    let cuda = c.cuda.as_ref().unwrap();
    assert_eq!(cuda.kernels.len(), 1, "{}", cuda.source);
    assert!(cuda.source.contains("__shfl_xor_sync"), "{}", cuda.source);
    emulation_checks(c, "layernorm, default strategy");
    // Without the lanes (warp reductions off), fusing would put a row on
    // one thread: isl's two kernels stay.
    let mut no_lanes = auto_gpu();
    no_lanes.gpu.as_mut().unwrap().reduce = false;
    let c = compile(&p, &no_lanes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.cuda.as_ref().unwrap().kernels.len(), 2);
    // Softmax at 128 x 256 (no repair at these sizes) with its
    // exponentials as a tensor of their own: maximal fusion gives fewer
    // kernels, but not all of them run rows across lanes, so isl's stay.
    let p = example_with("softmax", &[("N", 128), ("D", 256)]);
    let kernels = |strategy| {
        let options = Options {
            strategy,
            ..auto_gpu()
        };
        compile(&p, &options).unwrap().cuda.unwrap().kernels.len()
    };
    assert!(kernels(Strategy::Max) < kernels(Strategy::Isl));
    assert_eq!(kernels(Strategy::Isl), 4);
}

/// A program whose row loop carries a dependence through a tensor that is
/// not one value per row (`B` reads the `A` of the previous column), and a
/// schedule that hands that loop to the lanes of a warp anyway.
fn shifted_row_under_lanes() -> Program {
    let text = r#"{ "name": "shift", "params": { "N": 4, "D": 8 },
        "inputs": { "X": {"dtype": "f32", "shape": ["N", "D"]} },
        "outputs": { "S": {"dtype": "f32", "shape": ["N"]} },
        "temps": { "A": {"dtype": "f32", "shape": ["N", "D"]}, "B": {"dtype": "f32", "shape": ["N", "D"]} },
        "body": [ "A(r, c) = X(r, c) * 2",
                  "B(r, c) = A(r, c - 1) where c in 1:D",
                  "S(r) +=! X(r, c)" ] }"#;
    load_str(text, "shift.json").unwrap()
}

#[test]
fn lanes_may_split_only_the_chains_of_a_rows_states() {
    let p = shifted_row_under_lanes();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    let domain = scop.domain().unwrap().text();
    let band = |stmts: &[(&str, &str)]| {
        let parts: Vec<String> = stmts
            .iter()
            .map(|(s, e)| format!("{s} -> [({e})]"))
            .collect();
        format!("[N, D] -> [{{ {} }}]", parts.join("; "))
    };
    let schedule_with = |inner: &[&str]| {
        let members: Vec<(&str, &str)> = inner.iter().map(|s| (*s, "c")).collect();
        let filters: Vec<String> = inner
            .iter()
            .map(|s| format!("{{ filter: \"{{ {s} }}\" }}"))
            .collect();
        let rows: Vec<(&str, &str)> = vec![
            ("S0[r, c]", "r"),
            ("S1[r, c]", "r"),
            ("S2_init[r]", "r"),
            ("S2[r, c]", "r"),
        ];
        let rest: Vec<String> = ["S0[r, c]", "S1[r, c]", "S2[r, c]"]
            .iter()
            .filter(|s| !inner.contains(s))
            .map(|s| {
                format!(
                    "{{ filter: \"{{ {s} }}\", child: {{ schedule: \"{}\" }} }}",
                    band(&[(s, "c")])
                )
            })
            .collect();
        let mut seq = vec!["{ filter: \"{ S2_init[r] }\" }".to_string()];
        seq.push(format!(
            "{{ filter: \"{{ {} }}\", child: {{ mark: \"lanes_0\", child: {{ schedule: \"{}\", child: {{ sequence: [ {} ] }} }} }} }}",
            inner.join("; "),
            band(&members),
            filters.join(", ")
        ));
        seq.extend(rest);
        format!(
            "{{ domain: \"{domain}\", child: {{ schedule: \"{}\", child: {{ sequence: [ {} ] }} }} }}",
            band(&rows),
            seq.join(", ")
        )
    };
    // The sum's chain is a state of the row (one element per row): the
    // lanes may split its loop.
    let legal = isl.schedule(&schedule_with(&["S2[r, c]"])).unwrap();
    schedule::check_legal("shift.json", &legal, &scop, &d).unwrap();
    mapping::check_parallel(&p, &legal, &scop, &d).unwrap();
    // B reads A of the previous column: sequentially fine, but the lanes
    // would read A before another lane wrote it.
    let racy = isl
        .schedule(&schedule_with(&["S0[r, c]", "S1[r, c]"]))
        .unwrap();
    schedule::check_legal("shift.json", &racy, &scop, &d).unwrap();
    match mapping::check_parallel(&p, &racy, &scop, &d) {
        Err(Error::Illegal { message, .. }) => {
            assert!(message.contains("lanes_0"), "{message}");
            assert!(message.contains("S0[r, c] -> S1["), "{message}");
        }
        other => panic!("expected an illegal-mapping error, got {other:?}"),
    }
}

/// The band line right below the `thread_x` mark of kernel `k` of `tree`
/// (a `--emit gpu-tree` text).
fn thread_x_band(tree: &str, k: usize) -> &str {
    let kernel = tree
        .split("mark: kernel_")
        .find(|text| text.starts_with(&format!("{k}\n")))
        .unwrap_or_else(|| panic!("no kernel_{k}:\n{tree}"));
    let at = kernel.find("mark: thread_x_").unwrap();
    kernel[at..].lines().nth(1).unwrap()
}

#[test]
fn threads_on_x_take_the_member_that_coalesces_the_most_accesses() {
    // Partial sums of a split reduction, written with the slice last:
    // O(h, d, s) += E(h, s, u) * V(h, s, u, d). The band's innermost
    // parallel member is s, but with s on x a warp reads 32 rows of V a
    // slice apart (and 32 elements of E); with d on x it reads one row of
    // V and one element of E. The accumulator O is left out of the count
    // (it stays in registers along u). Odd sizes, emulated.
    let partials = |d_last: bool| {
        let (shape, lhs) = if d_last {
            (r#"["H", "S", "D"]"#, "O(h, s, d)")
        } else {
            (r#"["H", "D", "S"]"#, "O(h, d, s)")
        };
        format!(
            r#"{{ "name": "partials", "params": {{ "H": 3, "S": 37, "U": 45, "D": 70 }},
                 "inputs": {{ "E": {{"dtype": "f32", "shape": ["H", "S", "U"]}},
                             "V": {{"dtype": "f16", "shape": ["H", "S", "U", "D"]}} }},
                 "outputs": {{ "O": {{"dtype": "f32", "shape": {shape}}} }},
                 "body": [ "{lhs} +=! E(h, s, u) * V(h, s, u, d)" ] }}"#
        )
    };
    for d_last in [false, true] {
        let json = partials(d_last);
        let c = compile(&load_str(&json, "p.json").unwrap(), &auto_gpu()).unwrap();
        let tree = c.gpu_tree.as_ref().unwrap().to_string();
        assert!(
            thread_x_band(&tree, 0).contains("((d) mod"),
            "d_last {d_last}:\n{tree}"
        );
        emulate_ok(&json, &auto_gpu());
    }
    // A transposition coalesces one of its two accesses on either member:
    // the tie keeps the innermost one (j, the written tensor's last).
    let transpose = r#"{ "name": "t", "params": { "M": 33, "N": 65 },
        "inputs": { "A": {"dtype": "f32", "shape": ["M", "N"]} },
        "outputs": { "B": {"dtype": "f32", "shape": ["N", "M"]} },
        "body": [ "B(j, i) = A(i, j)" ] }"#;
    let c = compile(&load_str(transpose, "t.json").unwrap(), &auto_gpu()).unwrap();
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    assert!(thread_x_band(&tree, 0).contains("((i) mod"), "{tree}");
    // The benchmark's decoding at odd sizes: its partial P V kernel (the
    // one reading V) puts d, V's contiguous dimension, on x.
    let c = compile(&small_decoding(), &auto_gpu()).unwrap();
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    let cuda = c.cuda.as_ref().unwrap();
    let reader = (0..cuda.kernels.len())
        .find(|k| kernel_text(&cuda.source, *k).contains("t_V["))
        .unwrap();
    assert!(thread_x_band(&tree, reader).contains("((d) mod"), "{tree}");
    emulation_checks(c, "decoding");
}

/// The bodies of the loops that the lanes of a row share in CUDA `source`
/// (`for (pf_i cK = .. + (pf_i)threadIdx.x * (..); ..; cK += W * (..))`).
fn lane_loop_bodies(source: &str) -> Vec<String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut bodies = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let l = line.trim_start();
        if !(l.starts_with("for (pf_i c") && l.contains("(pf_i)threadIdx.x * (")) {
            continue;
        }
        let mut depth = 0i32;
        let mut body = String::new();
        for inner in &lines[i..] {
            depth += inner.matches('{').count() as i32 - inner.matches('}').count() as i32;
            body.push_str(inner);
            body.push('\n');
            if depth <= 0 {
                break;
            }
        }
        bodies.push(body);
    }
    bodies
}

#[test]
fn a_single_row_runs_across_its_lanes_like_many() {
    // One row (or one row per block tile): the rows' thread loop has a
    // single iteration, so isl leaves it out and its mapping stays
    // pending. The statements inside the loops the lanes share must still
    // run on every lane, with no barrier inside (lanes with one step more
    // than others would never reach it): printed as code outside the
    // threads, they ran on lane 0 alone and hung at 4100 columns on the
    // H100 (256 lanes, 17 steps for some, 16 for others).
    for (values, tile) in [
        (&[("N", 1), ("D", 4100)][..], None),
        (&[("N", 1), ("D", 300)][..], None),
        (&[("N", 37), ("D", 4100)][..], Some(vec![1])),
    ] {
        let p = program_with("bench/programs/softmax_fused_16k.json", values);
        let options = match &tile {
            Some(t) => Options {
                gpu: Some(GpuOptions::default()),
                ..gpu_options(t)
            },
            None => auto_gpu(),
        };
        let c = compile(&p, &options).unwrap_or_else(|e| panic!("{values:?}: {e}"));
        let source = c.cuda.as_ref().unwrap().source.clone();
        let bodies = lane_loop_bodies(&source);
        assert!(bodies.len() >= 2, "{values:?}:\n{source}");
        for body in &bodies {
            assert!(!body.contains("__sync"), "{values:?}:\n{body}");
            assert!(!body.contains("bar.sync"), "{values:?}:\n{body}");
            assert!(!body.contains("threadIdx.x == 0"), "{values:?}:\n{body}");
        }
        emulation_checks(c, "single row");
    }
}

#[test]
fn rows_on_a_block_come_two_to_a_tile_and_rows_on_a_warp_eight() {
    // Rows across lanes: a row longer than 1024 takes a block (256 threads
    // at 4100 columns) and a block tile holds 2 rows; a shorter row takes
    // a warp, 8 rows to a block, one per warp. 37 rows, emulated.
    for (d, block, rows) in [(4100, [256, 2, 1], 2), (300, [32, 8, 1], 8)] {
        let p = program_with(
            "bench/programs/softmax_fused_16k.json",
            &[("N", 37), ("D", d)],
        );
        let c = compile(&p, &auto_gpu()).unwrap_or_else(|e| panic!("{e}"));
        let cuda = c.cuda.as_ref().unwrap();
        assert_eq!(cuda.kernels.len(), 1, "{}", cuda.source);
        let kernel = &cuda.kernels[0];
        assert_eq!(kernel.block, block, "D={d}");
        assert_eq!(
            kernel.grid_dims(&HashMap::new()).unwrap(),
            [37_u32.div_ceil(rows), 1, 1],
            "D={d}"
        );
        emulation_checks(c, "rows per tile");
    }
}

/// A register tile cut by the end of the tensor (300 rows, 270 columns)
/// runs its slots clamped onto the tensor (`codegen::cuda::clamp`) where
/// it reads global memory (no shared copies): the product's update, which
/// writes only the register tile, runs on every slot without a test, while
/// the epilogue into another tensor runs where the registers are stored,
/// under the store's test of each slot's element
/// (`gpu::registers::store_statements`). With shared copies, whose reads
/// stay inside them at every slot, the whole box runs (`box_reads`: the
/// epilogue at the store and the hoisted initialisation do not count):
/// one copy of the region, no slot clamped or tested. The emulation checks
/// both against the f64 reference.
#[test]
fn partial_register_tiles_clamp_their_slots_and_test_other_writes() {
    let json = r#"{"name": "epilogue", "params": {"M": 300, "N": 270, "K": 20},
        "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]},
                   "B": {"dtype": "f32", "shape": ["K", "N"]},
                   "bias": {"dtype": "f32", "shape": ["N"]}},
        "outputs": {"H": {"dtype": "f32", "shape": ["M", "N"]}},
        "temps": {"Z": {"dtype": "f32", "shape": ["M", "N"]}},
        "body": ["Z(i, j) +=! A(i, k) * B(k, j)",
                 "H(i, j) = max(Z(i, j) + bias(j), 0.0)"]}"#;
    let p = load_str(json, "epilogue.json").unwrap();
    let mut auto = gpu_options(&[32]);
    auto.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    let whole = emulated_cuda(&p, &auto);
    assert!(whole.contains("pf_reg_kernel_0_Z["), "{whole}");
    assert!(!whole.contains("pf_slot_c"), "{whole}");
    let whole_updates = whole
        .lines()
        .filter(|l| l.contains("pf_reg_kernel_0_Z[pf_ry][pf_rx] = pf_reg_kernel_0_Z"))
        .count();
    assert_eq!(whole_updates, 1, "the region printed once: {whole}");
    auto.gpu = Some(GpuOptions {
        auto_tile: true,
        shared: false,
        ..GpuOptions::default()
    });
    let cuda = emulated_cuda(&p, &auto);
    assert!(cuda.contains("pf_reg_kernel_0_Z["), "{cuda}");
    assert!(cuda.contains("= pf_min(pf_slot_c"), "{cuda}");
    let lines: Vec<&str> = cuda.lines().collect();
    let update = |l: &&&str| l.contains("pf_reg_kernel_0_Z[pf_ry][pf_rx] = pf_reg_kernel_0_Z");
    let store = |l: &&&str| l.contains("t_H[");
    // Inside the clamped slots (after a `pf_slot_` definition), the
    // update runs without a test; the epilogue's store is the registers'
    // store, which tests each slot's element against the tensor.
    let clamped = lines
        .iter()
        .position(|l| l.contains("const pf_i pf_slot_c"))
        .expect("no clamped slot");
    let rest = &lines[clamped..];
    let stores: Vec<_> = rest.iter().filter(store).collect();
    assert!(!stores.is_empty(), "{cuda}");
    assert!(
        stores.iter().all(|l| l.contains("pf_g0 < (p_M)")
            && l.contains("pf_g1 < (p_N)")
            && l.contains("t_Z[")),
        "{stores:?}"
    );
    let updates: Vec<_> = rest.iter().filter(update).collect();
    assert!(!updates.is_empty(), "{cuda}");
    assert!(
        updates.iter().all(|l| !l.contains("pf_slot_c")),
        "{updates:?}"
    );
}

/// A triangular output (`where j <= i`, `where j >= i`) bounds one slot
/// loop of the register tile by the other slot: the tiles off the diagonal
/// are full, and run the region's copy without the slots' tests
/// (`codegen::cuda::slot_box`); where the product's registers beyond the
/// triangle are dead and its reads stay in its shared copies, every tile
/// runs that copy, the diagonal's too. Checked in the emulation against
/// the f64 reference at sizes off the tile grid.
#[test]
fn triangular_register_tiles_run_without_slot_tests() {
    for (name, lower, upper) in [("lower", "j <= i", "j > i"), ("upper", "j >= i", "j < i")] {
        let json = format!(
            r#"{{"name": "{name}", "params": {{"N": 200, "M": 37}},
            "inputs": {{"A": {{"dtype": "f32", "shape": ["N", "M"]}},
                       "C0": {{"dtype": "f32", "shape": ["N", "N"]}}}},
            "outputs": {{"C": {{"dtype": "f32", "shape": ["N", "N"]}}}},
            "body": ["C(i, j) = 1.2 * C0(i, j) where {lower}",
                     "C(i, j) += A(i, k) * A(j, k) where {lower}",
                     "C(i, j) = C0(i, j) where {upper}"]}}"#
        );
        // (Without a constant factor in the sum, which would move out of
        // it into an epilogue: `repair::factor`.)
        let p = load_str(&json, "triangle.json").unwrap();
        let mut auto = gpu_options(&[32]);
        auto.gpu = Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        });
        let cuda = emulated_cuda(&p, &auto);
        let lines: Vec<&str> = cuda.lines().collect();
        let updates: Vec<usize> = (0..lines.len())
            .filter(|&i| {
                let l = lines[i].trim_start();
                l.starts_with("pf_reg_kernel_") && l.contains("_C[pf_ry][pf_rx] = pf_reg_kernel_")
            })
            .collect();
        assert!(!updates.is_empty(), "{name}: no update\n{cuda}");
        let test_above = |i: usize| {
            lines[..i]
                .iter()
                .rev()
                // Past the initialisation's test of the first step.
                .find(|l| l.trim_start().starts_with("if (") && !l.contains("== 0)"))
                .unwrap()
                .trim()
        };
        // The corner of the upper triangle (a slot loop of one iteration,
        // isl may print it without its loop) is proven by the register
        // tile's owner rule, not with a barrier in every step
        // (`gpu::race`'s `conflicts` leave the tile's tensor out).
        assert!(!cuda.contains("barrier_for_race_freedom"), "{name}\n{cuda}");
        // Every tile, the diagonal's too, runs the region without the
        // slots' tests: the product's registers beyond the triangle are
        // dead (`gpu::registers::closed`) and its reads stay in the shared
        // copies (`codegen::cuda::box_reads`), so the region is printed
        // once, for the whole box (the kinds that must keep their tests:
        // tests/integration/triangles.rs).
        for &u in &updates {
            assert_eq!(test_above(u), "if (1) {", "{name}\n{cuda}");
        }
    }
}

/// The mapping's register tiles unroll and double-buffer by default;
/// `unroll: Some(false)` and `pipeline: Some(false)` turn that off (the
/// command line's --no-unroll, --no-pipeline), and both ways check in the
/// emulation.
#[test]
fn the_mappings_unrolled_pipeline_can_be_turned_off() {
    let json = gemm(130, 150, 40);
    let p = load_str(&json, "gemm.json").unwrap();
    let on = emulated_cuda(&p, &grouped(1, &[]));
    assert!(on.contains("pf_stage"), "{on}");
    assert!(on.contains("#pragma unroll\n"), "{on}");
    let mut off = grouped(1, &[]);
    if let Some(g) = off.gpu.as_mut() {
        g.unroll = Some(false);
        g.pipeline = Some(false);
    }
    let cuda = emulated_cuda(&p, &off);
    assert!(!cuda.contains("pf_stage"), "{cuda}");
    let steps = cuda.find("for (pf_i c3 = 0;").unwrap();
    assert!(
        !cuda[..steps].trim_end().ends_with("#pragma unroll"),
        "{cuda}"
    );
}

/// A reduction range bounded by the row (`where k < i`, symm's and trmm's
/// triangle) moves the start of a slot loop with the reduction's step
/// (`c4 >= max(0, c2 + c3 - c0 + 1)`): the full tiles keep their copy of
/// the region (`full_tile_test` covers only starts that other slots move),
/// and within it the steps of a tile below the diagonal run a copy without
/// the start test, selected once per step where the start is 0 for every
/// slot and every step of the tile (`full_steps`); the steps on the
/// diagonal keep the test. The emulation checks it against the f64
/// reference.
#[test]
fn a_start_moved_by_the_reduction_is_tested_on_the_diagonal_steps_only() {
    let json = r#"{"name": "ktri", "params": {"M": 200, "N": 150},
        "inputs": {"A": {"dtype": "f32", "shape": ["M", "M"]},
                   "B": {"dtype": "f32", "shape": ["M", "N"]}},
        "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
        "body": ["C(i, j) = B(i, j)",
                 "C(i, j) += A(i, k) * B(k, j) where k < i"]}"#;
    let p = load_str(json, "ktri.json").unwrap();
    let mut auto = gpu_options(&[32]);
    auto.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    let cuda = emulated_cuda(&p, &auto);
    let lines: Vec<&str> = cuda.lines().collect();
    let updates: Vec<usize> = (0..lines.len())
        .filter(|&i| {
            let l = lines[i].trim_start();
            l.starts_with("pf_reg_kernel_") && l.contains(" = pf_reg_kernel_")
        })
        .collect();
    assert!(updates.len() >= 4, "full and partial copies\n{cuda}");
    // The full tiles' test: the last slot within the tensor's columns.
    assert!(cuda.contains("(31 <= pf_min(31, ((-c1) + 149)))"), "{cuda}");
    // Each update either tests its slot's start, or sits in the copy of a
    // step that the start test of the whole step selected.
    let mut untested = 0;
    for &u in &updates {
        let above = lines[..u]
            .iter()
            .rev()
            .find(|l| l.contains(">= pf_max(0,") || l.contains(")) <= 0)"))
            .unwrap_or_else(|| panic!("no test above line {u}\n{cuda}"));
        if above.contains("c4 >= ") {
            assert!(above.contains("c2"), "{above}\n{cuda}");
        } else {
            // `max(0, (-c0 + c2) + S) <= 0`: the step lies below the
            // diagonal for every slot and every step of the tile.
            assert!(
                above.contains("c0") && above.contains("c2"),
                "{above}\n{cuda}"
            );
            untested += 1;
        }
    }
    assert!(untested > 0 && untested < updates.len(), "{cuda}");
}

/// The other triangle (`k > i`): a step loop whose start the block moves
/// (`c3 = max(0, c0 - c2 + 1)`) and whose slots' bound moves with the step
/// (`c4 <= min(S, c2 + c3 - c0 - 1)`) gets a copy from 0 to the constant
/// bound without the slot test, for the steps past the diagonal; checked
/// in the emulation at sizes off the tiles.
#[test]
fn a_bound_moved_by_the_reduction_is_tested_on_the_diagonal_steps_only() {
    let json = r#"{"name": "ktri2", "params": {"M": 203, "N": 150},
        "inputs": {"A": {"dtype": "f32", "shape": ["M", "M"]},
                   "B": {"dtype": "f32", "shape": ["M", "N"]}},
        "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
        "body": ["C(i, j) = B(i, j)",
                 "C(i, j) += A(k, i) * B(k, j) where k > i"]}"#;
    let p = load_str(json, "ktri2.json").unwrap();
    let mut auto = gpu_options(&[32]);
    auto.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    let cuda = emulated_cuda(&p, &auto);
    let full = cuda
        .lines()
        .find(|l| l.contains("== 0) && (") && l.contains(">= "))
        .unwrap_or_else(|| panic!("no full step copy\n{cuda}"));
    assert!(full.contains("c0") && full.contains("c2"), "{full}");
    // The copy: the steps from 0 to the constant bound, and no slot test
    // of the step's bound before the else branch.
    let copy = &cuda[cuda.find(full).unwrap()..];
    let copy = &copy[..copy.find("} else {").unwrap()];
    assert!(
        copy.contains("for (pf_i c3 = 0; (c3 <= 31); c3 += 1)"),
        "{copy}"
    );
    assert!(!copy.contains("c4 <= pf_min("), "{copy}");
    let rest = &cuda[cuda.find(full).unwrap() + copy.len()..];
    assert!(
        rest.contains("c4 <= pf_min("),
        "the diagonal keeps its test\n{rest}"
    );
}

/// Every band of `node`'s subtree.
fn bands_below(node: isl_rs::ScheduleNode, out: &mut Vec<isl_rs::ScheduleNode>) {
    if node.get_type().unwrap() == isl_rs::ScheduleNodeType::Band {
        out.push(node.copy().unwrap());
    }
    for i in 0..node.n_children().unwrap() {
        bands_below(node.get_child(i).unwrap(), out);
    }
}

/// `pairs_differing_only_at`, which the parallelism check and the
/// mapping's barrier test use for `D ∩ differ_only_from(band)`, is that
/// set (and `same_value_on`, which the race proof's walk uses for `m⁻¹ ∘
/// m`, keeps and separates the same pairs) at every band of the mapped
/// trees of a contraction, a row chain (layer norm, its rows across lanes)
/// and a softmax, for their dependences and for pairs that are not
/// dependences (every two instances): the fast forms decide exactly what
/// the old ones did.
#[test]
fn pairs_differing_only_at_a_band_are_the_dependences_the_band_separates() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let programs = [
        load_str(&gemm(100, 70, 33), "gemm.json").unwrap(),
        load_file(&root.join("examples/layernorm.json")).unwrap(),
        load_file(&root.join("examples/softmax.json")).unwrap(),
    ];
    for p in &programs {
        let isl = Isl::new();
        let scop = model::build(&isl, p).unwrap();
        let order = schedule::canonical(&isl, &scop).unwrap();
        let d = deps::compute(&scop, &order).unwrap();
        let sched = schedule::compute(&isl, &scop, &d, Strategy::Isl).unwrap();
        let (mapped, _) = mapping::map(
            &isl,
            p,
            &scop,
            &d,
            sched,
            &[32, 16, 8],
            &GpuOptions::default(),
        )
        .unwrap();
        let domain = scop.domain().unwrap();
        let every_two =
            isl_rs::UnionMap::from_domain_and_range(domain.copy().unwrap(), domain.copy().unwrap())
                .unwrap();
        let mut bands = Vec::new();
        bands_below(mapped.get_root().unwrap(), &mut bands);
        assert!(bands.len() > 1, "{}", p.source);
        for band in &bands {
            for pairs in [d.all().unwrap(), every_two.copy().unwrap()] {
                let fast = mapping::pairs_differing_only_at(&pairs, band).unwrap();
                // The race proof's walk keeps and separates pairs by each
                // member with `same_value_on` in place of `m⁻¹ ∘ m`.
                let (_, member) = mapping::prefix_and_member(band).unwrap();
                let every = member
                    .copy()
                    .unwrap()
                    .apply_range(member.copy().unwrap().reverse().unwrap())
                    .unwrap();
                let on_pairs = mapping::same_value_on(&pairs, &member).unwrap();
                let kept = |same: &isl_rs::UnionMap| {
                    pairs
                        .copy()
                        .unwrap()
                        .intersect(same.copy().unwrap())
                        .unwrap()
                };
                let separated = |same: &isl_rs::UnionMap| {
                    pairs
                        .copy()
                        .unwrap()
                        .subtract(same.copy().unwrap())
                        .unwrap()
                };
                assert!(kept(&on_pairs).is_equal(&kept(&every)).unwrap());
                assert!(separated(&on_pairs).is_equal(&separated(&every)).unwrap());
                let old = pairs
                    .intersect(mapping::differ_only_from(band).unwrap())
                    .unwrap();
                assert!(
                    fast.is_equal(&old).unwrap(),
                    "{}: {}",
                    p.source,
                    band.text()
                );
            }
        }
    }
}

fn auto_options() -> Options {
    let mut o = gpu_options(&[32]);
    o.gpu = Some(GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    });
    o
}

/// The grid of kernel `k` at the program's own sizes.
fn grid_of(c: &polyfuse::Compiled, p: &Program, k: usize) -> [u32; 3] {
    c.cuda.as_ref().unwrap().kernels[k]
        .grid_dims(&p.known_params())
        .unwrap()
}

fn pointwise_conv(n: i64, f: i64, h: i64, w: i64, ch: i64) -> String {
    format!(
        r#"{{"name": "pw", "params": {{"N": {n}, "F": {f}, "H": {h}, "W": {w}, "C": {ch}}},
        "inputs": {{"X": {{"dtype": "f32", "shape": ["N", "C", "H", "W"]}}, "Wt": {{"dtype": "f32", "shape": ["F", "C"]}}}},
        "outputs": {{"Y": {{"dtype": "f32", "shape": ["N", "F", "H", "W"]}}}},
        "body": ["Y(n, f, h, w) +=! X(n, c, h, w) * Wt(f, c)"]}}"#
    )
}

#[test]
fn four_parallel_loops_all_run_on_blocks() {
    // Batch and channel folded onto z (`fold_outer_members`): before, the
    // batch ran one image after another inside every block. Odd sizes.
    let json = pointwise_conv(3, 5, 37, 41, 7);
    let p = load_str(&json, "pw.json").unwrap();
    let c = compile(&p, &auto_options()).unwrap();
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    let z = tree
        .lines()
        .skip_while(|l| !l.contains("block_z"))
        .nth(1)
        .unwrap();
    assert!(z.contains("5n + f"), "z should run n and f: {z}\n{tree}");
    assert_eq!(grid_of(&c, &p, 0)[2], 15, "{tree}");
    emulate_ok(&json, &auto_options());
}

#[test]
fn register_tiles_are_no_wider_than_their_loops() {
    // A 56 x 56 plane: 128-wide tiles would leave three quarters of their
    // slots empty; 64 fits (enough blocks from the batch and channels).
    let json = pointwise_conv(8, 64, 56, 56, 16);
    let p = load_str(&json, "pw.json").unwrap();
    let c = compile(&p, &auto_options()).unwrap();
    let tree = c.gpu_tree.as_ref().unwrap().to_string();
    assert!(tree.contains("(w - (w) mod 64)"), "{tree}");
    assert!(!tree.contains("mod 128"), "{tree}");
    assert!(c
        .cuda
        .as_ref()
        .unwrap()
        .source
        .contains("pf_reg_kernel_0_Y"));
}

#[test]
fn a_wavefronts_cells_run_on_blocks_of_one_launch() {
    // Stacked LSTM, wavefront over (layer, time): the products' blocks
    // cover the cells of one diagonal (at most L of them, times the four
    // gates), not every time step of the recurrence, and keep their
    // accumulators in registers; the emulation checks it at odd sizes.
    let file = "bench/recurrences/stacked_lstm.json";
    let mut p = load_file(std::path::Path::new(file)).unwrap();
    apply_param_overrides(
        &mut p,
        &[
            ("L".into(), 3),
            ("T".into(), 9),
            ("B".into(), 13),
            ("H".into(), 37),
        ],
    )
    .unwrap();
    let c = compile(&p, &auto_options()).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    let products: Vec<usize> = (0..cuda.kernels.len())
        .filter(|k| {
            cuda.source.contains(&format!(
                "pf_reg_kernel_{}_G",
                cuda.kernels[*k].name.trim_start_matches("kernel_")
            ))
        })
        .collect();
    assert!(!products.is_empty(), "{}", cuda.source);
    for k in products {
        assert_eq!(grid_of(&c, &p, k)[2], 3 * 4, "kernel {k}");
    }
    emulation_checks(c, "stacked lstm");
}

#[test]
fn a_folded_grid_stays_within_cudas_limit_on_z() {
    // 300 x 300 images of 2 x 3: 90,000 values on z, over CUDA's 65,535;
    // the blocks stride over the rest.
    let json = r#"{"name": "big_batch", "params": {"N": 300, "F": 300, "H": 2, "W": 3},
        "inputs": {"X": {"dtype": "f32", "shape": ["N", "F", "H", "W"]}},
        "outputs": {"Y": {"dtype": "f32", "shape": ["N", "F", "H", "W"]}},
        "body": ["Y(n, f, h, w) = X(n, f, h, w) * 2.0"]}"#;
    let p = load_str(json, "big_batch.json").unwrap();
    let c = compile(&p, &auto_options()).unwrap();
    let grid = grid_of(&c, &p, 0);
    assert_eq!(grid[2], 65_535, "{grid:?}");
    emulate_ok(json, &auto_options());
}

/// An MLP layer on the SIMT units at sizes off every tile: `body` after
/// the product `Z +=! X W1`.
fn mlp_layer(body: &[&str]) -> String {
    let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"{{"name": "mlp_layer", "params": {{"B": 67, "D": 45, "F": 133}},
        "inputs": {{"X": {{"dtype": "f32", "shape": ["B", "D"]}},
                   "W1": {{"dtype": "f32", "shape": ["D", "F"]}},
                   "b1": {{"dtype": "f32", "shape": ["F"]}}}},
        "outputs": {{"H": {{"dtype": "f32", "shape": ["B", "F"]}}}},
        "temps": {{"Z": {{"dtype": "f32", "shape": ["B", "F"]}}}},
        "body": ["Z(b, f) +=! X(b, d) * W1(d, f)", {}]}}"#,
        body.join(", ")
    )
}

/// The lines of `source` that write tensor `t`: `t_T[...] = ...`.
fn writes_of<'a>(source: &'a str, t: &str) -> Vec<&'a str> {
    let at = format!("t_{t}[");
    source
        .lines()
        .filter(|l| {
            l.match_indices(&at).any(|(i, _)| {
                let rest = &l[i..];
                let end = rest.find(';').unwrap_or(rest.len());
                let lhs_end = rest.find("] = ").unwrap_or(usize::MAX);
                lhs_end < end && !rest[..lhs_end].contains(" = ")
            })
        })
        .collect()
}

#[test]
fn a_products_epilogue_runs_where_its_registers_are_stored() {
    // SiLU after the product (the suite's f32 MLP): run once per element
    // after the k loop, with the store of the registers, not inside the
    // unrolled steps behind a test of the last one; its bias is read from
    // global memory there, not copied to shared memory at every step.
    for body in [
        vec!["H(b, f) = (Z(b, f) + b1(f)) * sigmoid(Z(b, f) + b1(f))"],
        // A chain: in place on the accumulator, then moved out.
        vec!["Z(b, f) = Z(b, f) + b1(f)", "H(b, f) = tanh(Z(b, f))"],
    ] {
        let json = mlp_layer(&body);
        let p = load_str(&json, "mlp_layer.json").unwrap();
        let c = compile(&p, &auto_options()).unwrap();
        let source = c.cuda.as_ref().unwrap().source.clone();
        let h = writes_of(&source, "H");
        assert!(!h.is_empty(), "{source}");
        for line in &h {
            // The store's line: the element `pf_g`, the register, and the
            // store of the accumulator after the epilogue.
            assert!(
                line.contains("pf_g0") && line.contains("pf_reg_") && line.contains("t_Z["),
                "{body:?}: {line}\n{source}"
            );
        }
        assert!(!source.contains("pf_shared_kernel_0_b1"), "{source}");
        emulation_checks(c, "mlp layer");
    }
}

#[test]
fn an_epilogue_on_part_of_the_tensor_stays_in_the_loop() {
    // The epilogue's domain is not every element of Z: at the store it
    // would also run on the elements it excludes, so it keeps its place
    // at the last step.
    let json = mlp_layer(&[
        "H(b, f) = Z(b, f) * 2.0 where f in 0:F-3",
        "H(b, f) = 0.0 where f in F-3:F",
    ]);
    let p = load_str(&json, "mlp_layer.json").unwrap();
    let c = compile(&p, &auto_options()).unwrap();
    let source = c.cuda.as_ref().unwrap().source.clone();
    let h = writes_of(&source, "H");
    assert!(!h.is_empty(), "{source}");
    assert!(h.iter().all(|l| !l.contains("t_Z[")), "{h:?}\n{source}");
    emulation_checks(c, "partial epilogue");
}

fn elementwise(m: i64, n: i64) -> String {
    format!(
        r#"{{ "name": "scale", "params": {{ "M": {m}, "N": {n} }},
             "inputs": {{ "X": {{"dtype": "f32", "shape": ["M", "N"]}} }},
             "outputs": {{ "Y": {{"dtype": "f32", "shape": ["M", "N"]}} }},
             "body": [ "Y(i, j) = X(i, j) * 2.0 + 1.0" ] }}"#
    )
}

#[test]
fn small_elementwise_launches_take_smaller_tiles() {
    // 64 x 64 tiles where they make at least 264 blocks, else 32 x 32
    // where those do, else 8 x 32 (one element a thread of 32 x 8).
    for ((m, n), grid) in [
        ((2048, 4096), [64, 32, 1]),
        ((600, 700), [22, 19, 1]),
        ((300, 500), [16, 38, 1]),
    ] {
        let p = load_str(&elementwise(m, n), "scale.json").unwrap();
        let c = compile(&p, &auto_gpu()).unwrap();
        let cuda = c.cuda.as_ref().unwrap();
        assert_eq!(cuda.kernels.len(), 1);
        assert_eq!(
            cuda.kernels[0].grid_dims(&HashMap::new()).unwrap(),
            grid,
            "{m} x {n}"
        );
    }
    emulate_ok(&elementwise(300, 500), &auto_gpu());
    emulate_ok(&elementwise(37, 301), &auto_gpu());
    // A block the user gave keeps the default tiles (64 x 64: 8 x 5).
    let mut user_block = auto_gpu();
    if let Some(g) = user_block.gpu.as_mut() {
        g.block = vec![16, 16];
    }
    let p = load_str(&elementwise(300, 500), "scale.json").unwrap();
    let c = compile(&p, &user_block).unwrap();
    assert_eq!(
        c.cuda.as_ref().unwrap().kernels[0]
            .grid_dims(&HashMap::new())
            .unwrap(),
        [8, 5, 1]
    );
    emulate_ok(&elementwise(300, 500), &user_block);
}

/// Four parallel members (a step, a gate, a row, a column): the mapping
/// folds the first two into one block member, `4 t + g`.
fn gated_products(t: i64, b: i64, h: i64, k: i64) -> String {
    format!(
        r#"{{ "name": "gates", "params": {{ "T": {t}, "B": {b}, "H": {h}, "K": {k} }},
             "inputs": {{ "X": {{"dtype": "f32", "shape": ["T", "B", "K"]}},
                          "W": {{"dtype": "f32", "shape": [4, "K", "H"]}} }},
             "outputs": {{ "G": {{"dtype": "f32", "shape": ["T", 4, "B", "H"]}} }},
             "body": [ "G(t, g, b, h) +=! X(t, b, k) * W(g, k, h)" ] }}"#
    )
}

/// The element count of shared array `name` in `source`.
fn shared_len(source: &str, name: &str) -> Option<i64> {
    let at = source.find(&format!("{name}["))?;
    let rest = &source[at + name.len() + 1..];
    rest[..rest.find(']')?].parse().ok()
}

#[test]
fn a_folded_member_fixes_the_promoted_box_along_its_remainder() {
    // Each block computes one gate: its copy of W holds that gate's k x h
    // tile (the gate is `c mod 4` of the folded member, which the box
    // hull's affine offset cannot express), not all four.
    let p = load_str(&gated_products(3, 64, 256, 64), "gates.json").unwrap();
    let c = compile(&p, &auto_gpu()).unwrap();
    let cuda = c.cuda.as_ref().unwrap();
    let w = shared_len(&cuda.source, "pf_shared_kernel_0_W").expect("W is promoted");
    let x = shared_len(&cuda.source, "pf_shared_kernel_0_X").expect("X is promoted");
    assert!(
        cuda.source.contains("% 4)"),
        "the gate's offset is a remainder:\n{}",
        cuda.source
    );
    assert!(
        w <= x,
        "W's copy ({w}) spans more than one gate:\n{}",
        cuda.source
    );
    emulate_ok(&gated_products(3, 37, 45, 29), &auto_gpu());
    emulate_ok(&gated_products(2, 64, 256, 64), &auto_gpu());
}

#[test]
fn chunks_past_an_mn_major_operands_columns_read_the_last_whole_chunk() {
    // B is K x N, contiguous along n: the last column tile's chunks wholly
    // past N copy the last whole chunk inside (their accumulator columns
    // are never stored), so they take the copies' fast path; a chunk
    // that straddles N (N = 203) keeps the per-element path with zeros.
    // A is M x K, contiguous along k: its chunks are not moved (along k
    // the copies must give zeros past K; rows past M cost the zero fill
    // only, and moving them measured slower).
    for (m, n, k) in [(70, 200, 72), (70, 203, 72), (33, 1000, 40), (131, 64, 100)] {
        for tile in [[64, 128, 64], [128, 256, 64]] {
            let json = gemm_f16(m, n, k);
            let o = gpu_options(&tile);
            let c = compile(&load_str(&json, "mm.json").unwrap(), &o).unwrap();
            let src = &c.cuda.as_ref().unwrap().source;
            assert!(
                src.contains("(pf_B0_row) >= (pf_en) && (pf_en) >= 8 ? ((pf_en) / 8 - 1) * 8"),
                "{m} x {n} x {k} {tile:?}: B's chunks past N are not moved inside"
            );
            assert!(!src.contains("(pf_A0_row) >= (pf_em)"), "{tile:?}");
            emulate_ok(&json, &o);
        }
    }
}
