//! Fusing a producer's loop into its consumer's (`schedule::fuse`),
//! unswitching a loop on a select it does not change (`codegen::unswitch`),
//! loading a thread's contiguous runs in 16-byte pieces (`codegen::rowcopy`)
//! and splitting a thread's reduction into four chains (`codegen::chains`):
//! the pass on hand-made schedules, checked in isl, and the rest on
//! attention prefill, executed (the GPU mapping emulated) against the f64
//! reference; the CUDA-only parts are checked on the GPU by
//! `scripts/gpu-check.sh`.

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::{apply_param_overrides, load_file, load_str};
use polyfuse::gpu::GpuOptions;
use polyfuse::isl::Isl;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::schedule::{self, ScheduleTree, Tree};
use polyfuse::{compile, deps, model, Options};

fn program(body: &[&str]) -> Program {
    let body: Vec<String> = body.iter().map(|s| format!("\"{s}\"")).collect();
    let json = format!(
        r#"{{ "name": "t", "params": {{ "N": 37, "M": 29 }},
             "inputs": {{ "X": {{"dtype": "f32", "shape": ["N", "M"]}} }},
             "outputs": {{ "Y": {{"dtype": "f32", "shape": ["N", "M"]}} }},
             "temps": {{ "T": {{"dtype": "f32", "shape": ["N", "M"]}}, "S": {{"dtype": "f32", "shape": ["N"]}},
                        "U": {{"dtype": "f32", "shape": ["N", "M"]}} }},
             "body": [ {} ] }}"#,
        body.join(", ")
    );
    load_str(&json, "t.json").unwrap()
}

/// The program-order schedule of `body` (one band per statement, in a
/// sequence) before and after the pass, both checked against the
/// dependences.
fn fused_canonical(body: &[&str]) -> (Tree, Tree) {
    let p = program(body);
    let isl = Isl::new();
    let scop = model::build(&isl, &p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    let order = schedule::annotate_bands(&isl, order, &d, &scop.param_prefix).unwrap();
    let before = ScheduleTree::from_isl(&order.get_root().unwrap()).unwrap();
    let after = schedule::fuse::aligned_loops(&isl, order, &scop, &d).unwrap();
    schedule::check_legal("t.json", &after, &scop, &d).unwrap();
    let after = ScheduleTree::from_isl(&after.get_root().unwrap()).unwrap();
    (before.root, after.root)
}

#[test]
fn a_consumer_reading_the_same_iteration_takes_in_its_producer_loop() {
    let (before, after) = fused_canonical(&["T(i, j) = X(i, j) * 2.0", "Y(i, j) = T(i, j) + 1.0"]);
    let Tree::Sequence(children) = &before else {
        panic!("program order is a sequence: {before:?}");
    };
    assert_eq!(children.len(), 2);
    // One band over both statements, the two in sequence below it.
    let Tree::Band(band, child) = &after else {
        panic!("not fused: {after:?}");
    };
    assert!(band.schedule.contains("S0[") && band.schedule.contains("S1["));
    // Both members stay parallel: every dependence between the two is at
    // the same point.
    assert_eq!(band.coincident, vec![true, true]);
    assert!(
        matches!(&**child, Tree::Sequence(parts) if parts.len() == 2),
        "{child:?}"
    );
}

#[test]
fn a_consumer_of_a_whole_reduction_keeps_its_own_loop() {
    // Y(i, j) needs S(i) after the last j: fusing the j loops would read
    // it early (illegal), so the pass leaves the program order.
    let (before, after) = fused_canonical(&["S(i) +=! X(i, j)", "Y(i, j) = X(i, j) / S(i)"]);
    assert_eq!(before, after);
}

#[test]
fn a_consumer_one_iteration_behind_keeps_its_own_loop() {
    // Legal to fuse (the distance is 1, forward), but not aligned: the
    // value would not live in one register between the two.
    let (before, after) = fused_canonical(&[
        "T(i, j) = X(i, j) * 2.0",
        "U(i, j) = T(i, j - 1) where j >= 1",
        "Y(i, j) = X(i, j)",
    ]);
    assert_eq!(before, after);
}

/// Runs the GPU mapping's emulation of `c` on the CPU against the f64
/// reference.
fn emulation_passes_its_check(c: &mut polyfuse::Compiled, seed: u64) {
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
    assert!(check.ok, "{}", check.line());
}

fn prefill(name: &str) -> Program {
    prefill_with(name, 16)
}

fn prefill_with(name: &str, d: i64) -> Program {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("bench/programs")
        .join(name);
    let mut p = load_file(&path).unwrap();
    let sizes: Vec<(String, i64)> = [("B", 1), ("H", 2), ("S", 67), ("D", d)]
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    apply_param_overrides(&mut p, &sizes).unwrap();
    p
}

#[test]
fn attention_prefill_keeps_its_scores_in_a_register_and_is_unswitched_on_the_repair() {
    for name in [
        "attention_global_b4h16s4096d64.json",
        "attention_causal_b4h16s4096d64.json",
    ] {
        let p = prefill(name);
        // The SIMT form (tensor cores off; with them, `tests/integration/attention.rs`).
        let options = Options {
            gpu: Some(GpuOptions {
                tensor_cores: false,
                ..GpuOptions::default()
            }),
            ..Options::default()
        };
        let mut c = compile(&p, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
        let cuda = c.cuda.as_ref().unwrap().source.clone();
        // The scores (QK^T scaled, `T`) are computed in the rolling loop,
        // one per iteration in a register: never in memory.
        assert!(!cuda.contains("t_T["), "{name}: scores go through memory");
        assert!(cuda.contains("float pf_priv_kernel_0_T;"), "{name}");
        // The repair's guard is tested once per key, around the loop over
        // the head dimension, not in each of its iterations.
        let guard = "if ((pf_priv_kernel_0_M_prev == pf_priv_kernel_0_M)) {";
        assert!(cuda.contains(guard), "{name}: not unswitched\n{cuda}");
        assert!(c.emulation_c.as_ref().unwrap().contains(guard), "{name}");
        emulation_passes_its_check(&mut c, 5);
    }
}

#[test]
fn attention_prefill_reads_its_key_and_value_rows_in_sixteen_byte_pieces_and_its_query_in_f32() {
    // At these sizes K and V would fit in shared memory (read from there,
    // not from global memory); at S = 4096 they do not.
    let options = Options {
        gpu: Some(GpuOptions {
            shared: false,
            tensor_cores: false,
            ..GpuOptions::default()
        }),
        ..Options::default()
    };
    let name = "attention_global_b4h16s4096d64.json";
    // D = 16 f16 elements: two 16-byte pieces per row of K and of V, read
    // where the address is aligned, one element at a time where not.
    let mut c = compile(&prefill(name), &options).unwrap();
    let cuda = c.cuda.as_ref().unwrap().source.clone();
    for t in ["K", "V"] {
        let decl = format!("union {{ uint4 v[2]; unsigned short e[16]; }} pf_run0_{t};");
        assert!(cuda.contains(&decl), "no run of {t}\n{cuda}");
        assert!(
            cuda.contains(&format!("pf_h2f(pf_run0_{t}.e[(c7) - 0])")),
            "{t}"
        );
    }
    assert!(cuda.contains("pf_run0_K.v[pf_g] = ((const uint4 *)pf_at)[pf_g];"));
    // The query row, read at every key, is held in f32: converted once.
    assert!(cuda.contains("float pf_reg_priv_kernel_0_Q[16];"), "{cuda}");
    assert!(cuda.contains("pf_reg_priv_kernel_0_Q[pf_l3] = pf_h2f(t_Q["));
    assert!(cuda
        .contains("(pf_reg_priv_kernel_0_Q[(((c7)) - pf_p4_3)] * pf_h2f(pf_run0_K.e[(c7) - 0]))"));
    assert!(cuda.contains("pf_run0_K.e[pf_l] = pf_at[pf_l];"));
    // The score, a sum over the 16 elements of the head dimension, runs in
    // four chains instead of one.
    assert!(cuda.contains("float pf_acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};"));
    assert!(cuda.contains(
        "pf_priv_kernel_0_P = pf_priv_kernel_0_P + ((pf_acc[0] + pf_acc[1]) + (pf_acc[2] + pf_acc[3]));"
    ));
    // The emulation reads memory as before (no vectors in C), and the
    // program still computes attention.
    assert!(!c.emulation_c.as_ref().unwrap().contains("pf_run0_"));
    emulation_passes_its_check(&mut c, 9);
    // D = 13: a row is no whole number of pieces, so it is read as before
    // (13 steps still make four chains); D = 6: too short for chains.
    let c = compile(&prefill_with(name, 13), &options).unwrap();
    let cuda = &c.cuda.as_ref().unwrap().source;
    assert!(!cuda.contains("union {"), "{cuda}");
    assert!(cuda.contains("t_K[") && cuda.contains("pf_acc[4]"));
    let c = compile(&prefill_with(name, 6), &options).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("pf_acc"));
}

#[test]
fn a_query_row_stored_back_by_a_repeated_region_keeps_its_f16_copy() {
    // With tiles of one point isl prints the thread's region in several
    // pieces, and each piece stores every private array back to its
    // tensor: an f32 copy of the f16 query would be stored into `Q` as
    // f32 values converted to integers.
    let options = Options {
        tile: vec![1],
        gpu: Some(GpuOptions {
            shared: false,
            tensor_cores: false,
            ..GpuOptions::default()
        }),
        ..Options::default()
    };
    let mut c = compile(&prefill("attention_global_b4h16s4096d64.json"), &options).unwrap();
    let cuda = c.cuda.as_ref().unwrap().source.clone();
    let stores =
        "t_Q[(((pf_p4_0) * (p_H) + pf_p4_1) * (p_S) + pf_p4_2) * (p_D) + (pf_p4_3 + pf_l3)] = ";
    assert!(
        cuda.contains(&format!("{stores}pf_priv_kernel_0_Q[pf_l3];")),
        "{cuda}"
    );
    assert!(!cuda.contains("pf_reg_priv_kernel_0_Q"), "{cuda}");
    emulation_passes_its_check(&mut c, 13);
}
