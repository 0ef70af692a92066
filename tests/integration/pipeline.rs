//! The pipeline stages on small programs: model checks, dependences, the
//! legality check, tiling and sinking. Each behaviour is also executed
//! (see `run_ok`), never only printed.

use polyfuse::frontend::load_str;
use polyfuse::isl::{Isl, IslPrint};
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::schedule::{self, Strategy, Tree};
use polyfuse::{compile, deps, model, Error, Options};

fn program(body: &[&str], params: &str, inputs: &str, outputs: &str, temps: &str) -> String {
    let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        r#"{{ "name": "t", "params": {{ {params} }}, "inputs": {{ {inputs} }},
             "outputs": {{ {outputs} }}, "temps": {{ {temps} }}, "body": [ {} ] }}"#,
        body.join(", ")
    )
}

fn gemm() -> String {
    program(
        &["C(i, j) +=! A(i, k) * B(k, j)"],
        r#""M": 37, "N": 53, "K": 29"#,
        r#""A": {"dtype": "f32", "shape": ["M", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}"#,
        r#""C": {"dtype": "f32", "shape": ["M", "N"]}"#,
        "",
    )
}

fn run_ok(json: &str, options: &Options) {
    let p = load_str(json, "test.json").unwrap();
    let c = compile(&p, options).unwrap_or_else(|e| panic!("{e}"));
    let r = run(
        &c,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed: 3,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let check = r.check.unwrap();
    assert!(check.ok, "{}", check.line());
}

/// isl is built with IMath's 32-bit small integers (`imath-32`, set by the
/// checked-in `vendor/isl-rs/isl/isl_config.h`), not plain IMath: the
/// attention examples compile 2 to 4.5 times faster with it.
#[test]
fn isl_uses_small_integers() {
    let v = polyfuse::isl::version();
    assert!(
        v.contains("IMath-32"),
        "isl was built without the small-integer optimisation: {v}"
    );
}

#[test]
fn gemm_dependences_are_exact() {
    let p = load_str(&gemm(), "gemm.json").unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    // Flow: init -> first update, update k -> update k+1; nothing else.
    let expected = isl
        .union_map(
            "[M, N, K] -> { S0_init[i, j] -> S0[i, j, 0] : M = 37 and N = 53 and K = 29 and 0 <= i < 37 and 0 <= j < 53; \
             S0[i, j, k] -> S0[i, j, k + 1] : M = 37 and N = 53 and K = 29 and 0 <= i < 37 and 0 <= j < 53 and 0 <= k < 28 }",
        )
        .unwrap();
    assert!(
        d.flow.is_equal(&expected).unwrap(),
        "flow = {}",
        d.flow.text()
    );
    // Anti: every read of C(i, j) at step k before every later write, so
    // the distances are (0, 0, d) for every d in [1, K).
    let anti = d.anti.copy().unwrap().deltas().unwrap();
    let expected = isl
        .union_set("[M, N, K] -> { S0[0, 0, d] : M = 37 and N = 53 and K = 29 and 0 < d <= 28 }")
        .unwrap();
    assert!(
        anti.is_equal(&expected).unwrap(),
        "anti deltas {}",
        anti.text()
    );
}

#[test]
fn reversed_loop_is_refused_with_the_violated_dependence() {
    let p = load_str(&gemm(), "gemm.json").unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    // Run the reduction loop backwards: k -> -k.
    let bad = isl
        .schedule(&format!(
            "{{ domain: \"{}\", child: {{ sequence: [ {{ filter: \"{{ S0_init[i, j] }}\" }}, \
             {{ filter: \"{{ S0[i, j, k] }}\", child: {{ schedule: \"[{{ S0[i, j, k] -> [(i)] }}, {{ S0[i, j, k] -> [(j)] }}, {{ S0[i, j, k] -> [(-k)] }}]\" }} }} ] }} }}",
            scop.domain().unwrap().text()
        ))
        .unwrap();
    let err = schedule::check_legal("gemm.json", &bad, &scop, &d).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Illegal { .. }));
    assert_eq!(err.exit_code(), 2);
    assert!(
        msg.contains("gemm.json") && msg.contains("dependence"),
        "{msg}"
    );
    assert!(msg.contains("S0[i, j, k]"), "{msg}");
    // The program-order schedule itself is legal.
    schedule::check_legal("gemm.json", &order, &scop, &d).unwrap();
}

#[test]
fn canonical_bands_are_annotated_and_tiled() {
    let p = load_str(&gemm(), "gemm.json").unwrap();
    let opts = Options {
        strategy: Strategy::Canonical,
        tile: vec![8, 4],
        sink: true,
        gpu: None,
        ..Default::default()
    };
    let c = compile(&p, &opts).unwrap();
    let text = c.tree.to_string();
    assert!(
        text.contains("mark: tile") && text.contains("mark: point"),
        "{text}"
    );
    assert!(
        c.kernel_c.contains("+= 8") && c.kernel_c.contains("+= 4"),
        "{}",
        c.kernel_c
    );
    run_ok(&gemm(), &opts);
}

/// Counts the point marks below each tile mark on the path to the leaves.
fn tile_marks_above_points(t: &Tree, seen_point: bool, bad: &mut bool) {
    match t {
        Tree::Mark(m, c) => {
            if m == "tile" && seen_point {
                *bad = true;
            }
            tile_marks_above_points(c, seen_point || m == "point", bad)
        }
        Tree::Band(_, c) => tile_marks_above_points(c, seen_point, bad),
        Tree::Sequence(ch) | Tree::Set(ch) => {
            for (_, c) in ch {
                tile_marks_above_points(c, seen_point, bad)
            }
        }
        Tree::Leaf => {}
    }
}

#[test]
fn point_loops_sink_below_inner_tile_loops() {
    // Two reductions over the same rows fuse under the row band; the row
    // band's point loop must end up below the inner tile loops.
    let json = program(
        &["S(r) +=! X(r, c)", "Y(r, c) = X(r, c) - S(r)"],
        r#""R": 37, "C": 53"#,
        r#""X": {"dtype": "f32", "shape": ["R", "C"]}"#,
        r#""Y": {"dtype": "f32", "shape": ["R", "C"]}"#,
        r#""S": {"dtype": "f32", "shape": ["R"]}"#,
    );
    let p = load_str(&json, "t.json").unwrap();
    for strategy in [Strategy::Isl, Strategy::Max] {
        let opts = Options {
            strategy,
            tile: vec![8],
            sink: true,
            gpu: None,
            ..Default::default()
        };
        let c = compile(&p, &opts).unwrap();
        let mut bad = false;
        tile_marks_above_points(&c.tree.root, false, &mut bad);
        assert!(!bad, "a tile loop below a point loop:\n{}", c.tree);
        run_ok(&json, &opts);
        let unsunk = Options {
            sink: false,
            gpu: None,
            ..opts
        };
        run_ok(&json, &unsunk);
    }
}

#[test]
fn out_of_bounds_read_names_statement_tensor_and_point() {
    // Inferred ranges never read out of bounds; an explicit range can.
    let json = program(
        &["Y(i) = X(i + 1) where i in 0:N"],
        r#""N": 10"#,
        r#""X": {"dtype": "f32", "shape": ["N"]}"#,
        r#""Y": {"dtype": "f32", "shape": ["N"]}"#,
        "",
    );
    let p = load_str(&json, "oob.json").unwrap();
    let err = compile(&p, &Options::default()).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.exit_code(), 2);
    assert!(
        msg.contains("oob.json") && msg.contains("statement 1"),
        "{msg}"
    );
    assert!(msg.contains("X") && msg.contains("out of bounds"), "{msg}");
}

#[test]
fn unwritten_output_element_is_an_error() {
    let json = program(
        &["Y(i) = X(i) where i < 5"],
        r#""N": 10"#,
        r#""X": {"dtype": "f32", "shape": ["N"]}"#,
        r#""Y": {"dtype": "f32", "shape": ["N"]}"#,
        "",
    );
    let p = load_str(&json, "partial.json").unwrap();
    let err = compile(&p, &Options::default()).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.exit_code(), 2);
    assert!(
        msg.contains("output Y") && msg.contains("no statement writes"),
        "{msg}"
    );
}

#[test]
fn underconstrained_index_asks_for_a_where_clause() {
    let json = program(
        &["P(i) max=! X(i) * u"],
        r#""N": 10"#,
        r#""X": {"dtype": "f32", "shape": ["N"]}"#,
        r#""P": {"dtype": "f32", "shape": ["N"]}"#,
        "",
    );
    let p = load_str(&json, "pool.json").unwrap();
    let err = compile(&p, &Options::default()).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.exit_code(), 2);
    assert!(msg.contains("`u`") && msg.contains("where u in"), "{msg}");
}

#[test]
fn range_inference_uses_earlier_rounds() {
    // k from W alone (round 1), then i from I(i + k) (round 2): i in [0, N-K+1).
    let json = program(
        &["O(i) +=! I(i + k) * W(k)"],
        r#""N": 40, "K": 5"#,
        r#""I": {"dtype": "f32", "shape": ["N"]}, "W": {"dtype": "f32", "shape": ["K"]}"#,
        r#""O": {"dtype": "f32", "shape": ["N - K + 1"]}"#,
        "",
    );
    let p = load_str(&json, "conv1d.json").unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let s = scop.statement("S0").unwrap();
    let expected = isl
        .set("[N, K] -> { S0[i, k] : N = 40 and K = 5 and 0 <= i <= 35 and 0 <= k <= 4 }")
        .unwrap();
    assert!(s.domain.is_equal(&expected).unwrap(), "{}", s.domain.text());
    run_ok(&json, &Options::default());
}

#[test]
fn temp_shape_is_inferred_from_its_writer() {
    let json = program(
        &["T(i) = X(i) * 2", "Y(i) = T(i) + 1"],
        r#""N": 19"#,
        r#""X": {"dtype": "f32", "shape": ["N"]}"#,
        r#""Y": {"dtype": "f32", "shape": ["N"]}"#,
        r#""T": {"dtype": "f32"}"#,
    );
    let p = load_str(&json, "t.json").unwrap();
    let c = compile(&p, &Options::default()).unwrap();
    let t = c.tensors.iter().find(|t| t.name == "T").unwrap();
    assert_eq!(t.shape.len(), 1);
    assert_eq!(t.shape[0].to_string(), "19");
    run_ok(&json, &Options::default());
    // With N symbolic the extent is the affine expression N.
    let symbolic = json.replace(r#""N": 19"#, r#""N": null"#);
    let p = load_str(&symbolic, "t.json").unwrap();
    let c = compile(&p, &Options::default()).unwrap();
    let t = c.tensors.iter().find(|t| t.name == "T").unwrap();
    assert_eq!(t.shape[0].to_string(), "N");
}

#[test]
fn symbolic_parameters_schedule_but_need_values_to_run() {
    let json = program(
        &["C(i, j) +=! A(i, k) * B(k, j)"],
        r#""M": null, "N": null, "K": 16"#,
        r#""A": {"dtype": "f32", "shape": ["M", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}"#,
        r#""C": {"dtype": "f32", "shape": ["M", "N"]}"#,
        "",
    );
    let p = load_str(&json, "sym.json").unwrap();
    let c = compile(&p, &Options::default()).unwrap();
    assert!(c.kernel_c.contains("pf_params[0]"), "{}", c.kernel_c);
    let err = c.param_values().unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("--param M="), "{err}");
}

#[test]
fn half_precision_and_causal_where() {
    let json = program(
        &["M(i) max=! S(i, j) where j <= i", "Y(i) = f16(M(i)) * 2"],
        r#""N": 45"#,
        r#""S": {"dtype": "f16", "shape": ["N", "N"]}"#,
        r#""Y": {"dtype": "f16", "shape": ["N"]}"#,
        r#""M": {"dtype": "f32", "shape": ["N"]}"#,
    );
    for strategy in [Strategy::Isl, Strategy::Canonical] {
        run_ok(
            &json,
            &Options {
                strategy,
                tile: vec![16],
                sink: true,
                gpu: None,
                ..Default::default()
            },
        );
    }
}

#[test]
fn inferred_ranges_keep_reads_in_bounds() {
    // i is inferred as [0, N - 1) from X(i + 1): Y(N - 1) is then unwritten.
    let json = program(
        &["Y(i) = X(i + 1)"],
        r#""N": 10"#,
        r#""X": {"dtype": "f32", "shape": ["N"]}"#,
        r#""Y": {"dtype": "f32", "shape": ["N"]}"#,
        "",
    );
    let p = load_str(&json, "shift.json").unwrap();
    let msg = compile(&p, &Options::default()).unwrap_err().to_string();
    assert!(msg.contains("Y[a0 = 9]") || msg.contains("Y[9]"), "{msg}");
}

/// A compilation for the GPU side alone (`Options::cpu_kernel` off, what
/// `schedule --emit cuda` asks for) prints the same GPU program, mapped
/// tree and reference as a full one, and builds no CPU kernel: its tree is
/// the untiled schedule and its kernel C is empty.
#[test]
fn gpu_only_compilation_builds_no_cpu_kernel_and_the_same_gpu_side() {
    let p = load_str(&gemm(), "test.json").unwrap();
    let full = Options {
        gpu: Some(polyfuse::gpu::GpuOptions {
            auto_tile: true,
            ..Default::default()
        }),
        ..Options::default()
    };
    let gpu_only = Options {
        cpu_kernel: false,
        ..full.clone()
    };
    let a = compile(&p, &full).unwrap();
    let b = compile(&p, &gpu_only).unwrap();
    let source = |c: &polyfuse::Compiled| c.cuda.as_ref().unwrap().source.clone();
    assert_eq!(source(&a), source(&b));
    assert_eq!(a.gpu_tree, b.gpu_tree);
    assert_eq!(a.emulation_c, b.emulation_c);
    assert_eq!(a.reference_c, b.reference_c);
    assert!(a.kernel_c.contains("pf_kernel"));
    assert!(b.kernel_c.is_empty());
    assert_eq!(b.tree, b.untiled_tree);
    assert_ne!(a.tree, a.untiled_tree, "the full compilation tiles");
}

/// `Options::dump`: every stage's value comes to the sink in the order the
/// stages run, with content a wrong stage would get wrong, and asking for
/// the dumps leaves the compiled program as it is.
#[test]
fn each_stage_dumps_its_value_in_order_and_the_result_is_unchanged() {
    use polyfuse::pipeline::{Dump, Stage};
    let p = load_str(&gemm(), "gemm.json").unwrap();
    let gpu = Options {
        gpu: Some(polyfuse::gpu::GpuOptions::default()),
        ..Options::default()
    };
    let (dump, list) = Dump::collect(Stage::ALL.to_vec());
    let dumped = compile(
        &p,
        &Options {
            dump: Some(dump),
            ..gpu.clone()
        },
    )
    .unwrap();
    let plain = compile(&p, &gpu).unwrap();
    assert_eq!(dumped.kernel_c, plain.kernel_c);
    assert_eq!(dumped.tree.to_string(), plain.tree.to_string());
    let cuda = |c: &polyfuse::Compiled| c.cuda.as_ref().unwrap().source.clone();
    assert_eq!(cuda(&dumped), cuda(&plain));

    let list = list.lock().unwrap();
    let stages: Vec<Stage> = list.iter().map(|d| d.stage).collect();
    assert_eq!(stages, Stage::ALL);
    assert!(list.iter().all(|d| d.program == "t"));
    let text = |s: Stage| list.iter().find(|d| d.stage == s).unwrap().text.as_str();
    let has = |s: Stage, needle: &str| {
        assert!(
            text(s).contains(needle),
            "{s} lacks `{needle}`:\n{}",
            text(s)
        );
    };
    has(Stage::Model, "S0[i, j, k] -> B[k, j]");
    has(Stage::Repair, "scheduled: the program as written");
    // The k loop carries the accumulation: each k reads what k - 1 wrote.
    has(Stage::Deps, "S0[i, j, k] -> S0[i' = i, j' = j, k' = 1 + k]");
    // isl's YAML of a band over (i, j, k) whose k member is not parallel.
    has(Stage::Schedule, "permutable: 1");
    has(Stage::Schedule, "coincident: [ 1, 1, 0 ]");
    has(Stage::Gpu, "mark: \"kernel_0\"");
    has(Stage::Gpu, "kernel_0: grid [");
    // The plan's decisions, a line each (gpu::describe), not its Debug.
    has(Stage::Gpu, "\n  shared A: f32 ");
    has(Stage::Gpu, "\n  registers C: f32 in pf_reg_kernel_0_C");
    has(Stage::Kernels, "kernel_0: grid [");
    has(Stage::Kernels, "globals [A, B, C]");
    has(Stage::Cpu, "mark: \"tile\"");
    has(Stage::Cpu, "void pf_kernel(");
}

/// A repaired program's repair dump names its steps and the repaired
/// program's statements; a CPU compilation says it has no GPU stages; the
/// dependences alone (`--emit deps`) dump the first three stages.
#[test]
fn a_repair_and_a_cpu_target_show_in_the_dumps() {
    use polyfuse::pipeline::{Dump, Stage};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/softmax_fused.json");
    let p = polyfuse::frontend::load_file(std::path::Path::new(path)).unwrap();
    let (dump, list) = Dump::collect(Stage::ALL.to_vec());
    let options = Options {
        dump: Some(dump),
        ..Options::default()
    };
    compile(&p, &options).unwrap();
    {
        let list = list.lock().unwrap();
        let text = |s: Stage| list.iter().find(|d| d.stage == s).unwrap().text.clone();
        let repair = text(Stage::Repair);
        assert!(repair.contains("RollingUpdate"), "{repair}");
        assert!(
            repair.contains("scheduled: the repaired program"),
            "{repair}"
        );
        assert!(repair.contains("its model:"), "{repair}");
        assert!(text(Stage::Schedule).contains("strategy: max"));
        assert_eq!(text(Stage::Gpu), "none: the target is the CPU\n");
        assert_eq!(text(Stage::Kernels), "none: the target is the CPU\n");
    }
    list.lock().unwrap().clear();
    polyfuse::pipeline::dependences(&p, &options).unwrap();
    let stages: Vec<Stage> = list.lock().unwrap().iter().map(|d| d.stage).collect();
    assert_eq!(stages, [Stage::Model, Stage::Repair, Stage::Deps]);
}
