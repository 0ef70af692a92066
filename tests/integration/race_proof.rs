//! The race proof of the memories the statements do not name (issue 30):
//! shared copies, register tiles, and kernels printed from a template.
//! Each test maps a program as the pipeline does, shows that the proof
//! accepts the mapping, then breaks one thing the proof relies on and
//! shows that it refuses, naming what races.

use polyfuse::frontend::{ast::Program, load_str};
use polyfuse::gpu::{self, mapping::KernelPlan, GpuOptions};
use polyfuse::isl::Isl;
use polyfuse::schedule::Strategy;
use polyfuse::{deps, model, schedule, Error};

/// A gemm and an unrelated statement, at sizes that are not multiples of
/// the tiles.
const GEMM: &str = r#"{
  "name": "gemm_and_scale",
  "params": {"M": 45, "N": 37, "K": 29},
  "inputs": {
    "A": {"dtype": "f32", "shape": ["M", "K"]},
    "B": {"dtype": "f32", "shape": ["K", "N"]},
    "X": {"dtype": "f32", "shape": ["M"]}
  },
  "outputs": {
    "C": {"dtype": "f32", "shape": ["M", "N"]},
    "Y": {"dtype": "f32", "shape": ["M"]}
  },
  "temps": {},
  "body": [
    "Y(i) = X(i) * 2",
    "C(i, j) +=! A(i, k) * B(k, j)"
  ]
}"#;

/// `text` scheduled by isl and mapped with `opts`.
fn mapped(
    isl: &Isl,
    text: &str,
    opts: &GpuOptions,
) -> (Program, model::Scop, isl_rs::Schedule, Vec<KernelPlan>) {
    let program = load_str(text, "program.json").unwrap();
    let scop = model::build(isl, &program).unwrap();
    let order = schedule::canonical(isl, &scop).unwrap();
    let dependences = deps::compute(&scop, &order).unwrap();
    let sched = schedule::compute(isl, &scop, &dependences, Strategy::Isl).unwrap();
    let (tree, plans) =
        gpu::mapping::map(isl, &program, &scop, &dependences, sched, &[16], opts).unwrap();
    (program, scop, tree, plans)
}

/// The message of a refusal, or a panic that says what came instead.
fn refusal(result: polyfuse::error::Result<()>) -> String {
    match result {
        Err(Error::Race { message, .. }) => message,
        other => panic!("expected the race proof to refuse, got {other:?}"),
    }
}

/// The first node of `node`'s subtree that `pick` takes.
fn find(
    node: isl_rs::ScheduleNode,
    pick: &dyn Fn(&isl_rs::ScheduleNode) -> bool,
) -> Option<isl_rs::ScheduleNode> {
    if pick(&node) {
        return Some(node);
    }
    for i in 0..node.n_children().unwrap() {
        if let Some(n) = find(node.get_child(i).unwrap(), pick) {
            return Some(n);
        }
    }
    None
}

fn is_mark(node: &isl_rs::ScheduleNode, name: &str) -> bool {
    node.get_type().unwrap() == isl_rs::ScheduleNodeType::Mark
        && node.mark_get_id().unwrap().get_name().unwrap() == name
}

/// The shared copies of gemm's `A` and `B` tiles are made once per step of
/// the `k` tile loop, which ends each step with a barrier. With that
/// barrier taken away (a `nosync` mark on the loop: the statements alone
/// would not need it, every element of `C` staying on its thread), the
/// copy for one step would overwrite the tile another thread still reads:
/// the proof refuses, naming the shared copy.
#[test]
fn a_shared_copy_needs_a_barrier_between_the_steps_that_refill_it() {
    let isl = Isl::new();
    let opts = GpuOptions::default();
    let (program, scop, tree, plans) = mapped(&isl, GEMM, &opts);
    let gemm = plans
        .iter()
        .find(|p| {
            p.threads()
                .and_then(|t| t.scope.as_ref())
                .is_some_and(|s| !s.arrays.is_empty())
        })
        .expect("the gemm kernel promotes its operands");
    assert!(gemm.register_tile().is_some(), "C is kept in registers");
    gpu::race::prove(&program, &scop, &tree, &plans).unwrap();
    // The band right above the gemm's `shared` mark: the k tile loop.
    let shared = find(tree.get_root().unwrap(), &|n| {
        is_mark(n, "shared")
            && n.copy().unwrap().parent().unwrap().get_type().unwrap()
                == isl_rs::ScheduleNodeType::Band
    })
    .unwrap();
    let step = shared.parent().unwrap();
    assert_eq!(step.get_type().unwrap(), isl_rs::ScheduleNodeType::Band);
    let unsynced = step
        .insert_mark(isl_rs::Id::read_from_str(&isl.ctx, "nosync").unwrap())
        .unwrap()
        .get_schedule()
        .unwrap();
    let message = refusal(gpu::race::prove(&program, &scop, &unsynced, &plans));
    assert!(message.contains("shared copy of"), "{message}");
    assert!(message.contains("without a barrier"), "{message}");
    // The pipeline's fallback puts the barrier back, and it is proven.
    let synced = gpu::race::with_barriers(&isl, &unsynced).unwrap().unwrap();
    gpu::race::prove(&program, &scop, &synced, &plans).unwrap();
}

/// A register tile keeps each element of `C` on the one thread that owns
/// it. The same tile over `A`, whose elements every thread of a row reads,
/// would give each of those threads a register of its own: refused. A
/// hoisted initialisation that writes no element of the tile is refused
/// too.
#[test]
fn a_register_tile_holds_each_element_on_one_thread() {
    let isl = Isl::new();
    let opts = GpuOptions::default();
    let (program, scop, tree, plans) = mapped(&isl, GEMM, &opts);
    gpu::race::prove(&program, &scop, &tree, &plans).unwrap();
    let k = plans
        .iter()
        .position(|p| p.register_tile().is_some())
        .unwrap();
    let tile = plans[k].register_tile().cloned().unwrap();
    assert_eq!(tile.tensor, "C");
    assert!(
        tile.init.is_some(),
        "gemm's `+=!` starts its registers at 0"
    );

    let mut over_a = plans.clone();
    over_a[k].register_tile_mut().unwrap().tensor = "A".into();
    let message = refusal(gpu::race::prove(&program, &scop, &tree, &over_a));
    assert!(message.contains("register tile of A"), "{message}");
    assert!(message.contains("different threads or blocks"), "{message}");

    // `Y(i) = X(i) * 2` is statement S0; it writes no element of C.
    let mut wrong_init = plans.clone();
    let init = wrong_init[k]
        .register_tile_mut()
        .unwrap()
        .init
        .as_mut()
        .unwrap();
    init.statement = "S0".into();
    let message = refusal(gpu::race::prove(&program, &scop, &tree, &wrong_init));
    assert!(message.contains("register tile of C"), "{message}");
    assert!(message.contains("does not initialise"), "{message}");
}

/// A tensor-core contraction: the blocks of the template own output tiles
/// along `m` and `n`, so every conflict (the chain of one element's sum)
/// stays in one block. A plan whose blocks were cut along `k` (the
/// recogniser never makes one) would split a chain over blocks that never
/// meet: refused.
#[test]
fn a_contraction_template_keeps_each_sum_in_one_block() {
    let text = GEMM
        .replace(
            "\"f32\", \"shape\": [\"M\", \"K\"]",
            "\"f16\", \"shape\": [\"M\", \"K\"]",
        )
        .replace(
            "\"f32\", \"shape\": [\"K\", \"N\"]",
            "\"f16\", \"shape\": [\"K\", \"N\"]",
        )
        .replace("A(i, k) * B(k, j)", "f32(A(i, k)) * f32(B(k, j))");
    let isl = Isl::new();
    let (program, scop, tree, plans) = mapped(&isl, &text, &GpuOptions::default());
    let k = plans
        .iter()
        .position(|p| p.contraction().is_some())
        .expect("the f16 product runs on tensor cores");
    gpu::race::prove(&program, &scop, &tree, &plans).unwrap();
    let mut along_k = plans.clone();
    let c = along_k[k].contraction_mut().unwrap();
    c.n = c.k.clone();
    let message = refusal(gpu::race::prove(&program, &scop, &tree, &along_k));
    assert!(
        message.contains("tensor-core contraction kernel races"),
        "{message}"
    );
    assert!(message.contains("different blocks"), "{message}");
}

/// Attention on tensor cores: each block owns a tile of query rows, and
/// every conflict (a row's running maximum, sum and output over the keys)
/// stays in its row. A plan whose blocks were cut along the keys (the
/// recogniser never makes one) would split those chains over blocks that
/// never meet: refused.
#[test]
fn an_attention_template_keeps_each_row_in_one_block() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/attention_causal.json");
    let program = polyfuse::frontend::load_file(&path).unwrap();
    let options = polyfuse::Options {
        gpu: Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        }),
        ..polyfuse::Options::default()
    };
    // The repaired program (rolling update), as the pipeline maps it.
    let repaired = polyfuse::compile(&program, &options).unwrap().program;
    let isl = Isl::new();
    let scop = model::build(&isl, &repaired).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let dependences = deps::compute(&scop, &order).unwrap();
    let sched = schedule::compute(&isl, &scop, &dependences, Strategy::Max).unwrap();
    let opts = options.gpu.clone().unwrap();
    let (tree, plans) =
        gpu::mapping::map(&isl, &repaired, &scop, &dependences, sched, &[32], &opts).unwrap();
    let k = plans
        .iter()
        .position(|p| p.attention().is_some())
        .expect("causal attention runs as the tensor-core template");
    gpu::race::prove(&repaired, &scop, &tree, &plans).unwrap();
    let mut along_keys = plans.clone();
    let a = along_keys[k].attention_mut().unwrap();
    a.row = a.key.clone();
    let message = refusal(gpu::race::prove(&repaired, &scop, &tree, &along_keys));
    assert!(message.contains("attention kernel races"), "{message}");
    assert!(message.contains("different blocks"), "{message}");
}
