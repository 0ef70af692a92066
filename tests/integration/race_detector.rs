//! The race detector of the CPU emulation (issue 30, item 2): a mapping
//! whose threads race fails `--target emulate`, naming the kernel, the
//! array, the element and the two threads; race-free mappings still check.

use crate::common::mirror;

use polyfuse::frontend::load_str;
use polyfuse::gpu::GpuOptions;
use polyfuse::isl::{Isl, IslPrint};
use polyfuse::runtime::cpu::{self, RunOptions};
use polyfuse::{model, Error, Options};

fn run_options() -> RunOptions {
    RunOptions {
        check: true,
        bench_runs: 0,
        seed: 1,
    }
}

#[test]
fn the_emulation_catches_steps_without_a_barrier() {
    let program = load_str(mirror::PROGRAM, "mirror.json").unwrap();
    // The pipeline's own mapping: instrumented, and race-free.
    let options = Options {
        gpu: Some(GpuOptions::default()),
        ..Options::default()
    };
    let mut compiled = polyfuse::compile(&program, &options).unwrap();
    let emulation = compiled.emulation_c.clone().unwrap();
    assert!(emulation.contains("pf_race_w("), "{emulation}");
    assert!(emulation.contains("pf_race_r("), "{emulation}");
    compiled.kernel_c = emulation;
    let report = cpu::run(&compiled, &run_options()).unwrap();
    assert!(report.check.unwrap().ok);

    // The hand-built mapping: a thread band of 32 threads inside the step
    // loop, with (`synced`) or without (`nosync`) a barrier after each step.
    let isl = Isl::new();
    let scop = model::build(&isl, &program).unwrap();
    let block = [32, 1, 1];

    let synced = mirror::tree(&isl, &scop, true);
    let text = polyfuse::codegen::cuda::emulate_mapped(&program, &scop, &synced, block).unwrap();
    assert!(text.contains("pf_race_barrier();"), "{text}");
    compiled.kernel_c = text;
    let report = cpu::run(&compiled, &run_options()).unwrap();
    assert!(report.check.unwrap().ok);

    let unsynced = mirror::tree(&isl, &scop, false);
    let text = polyfuse::codegen::cuda::emulate_mapped(&program, &scop, &unsynced, block).unwrap();
    assert!(!text.contains("pf_race_barrier();"), "{text}");
    compiled.kernel_c = text;
    match cpu::run(&compiled, &run_options()) {
        Err(e @ Error::Illegal { .. }) => {
            let message = e.to_string();
            eprintln!("{message}");
            assert!(
                message.contains("race in kernel_0: Z element "),
                "{message}"
            );
            assert!(message.contains("with no barrier between"), "{message}");
            // Two different threads of block (0, 0, 0).
            let threads: Vec<&str> = message
                .split("thread (")
                .skip(1)
                .map(|s| s.split(')').next().unwrap())
                .collect();
            assert_eq!(threads.len(), 2, "{message}");
            assert_ne!(threads[0], threads[1], "{message}");
            assert_eq!(message.matches("block (0, 0, 0)").count(), 2, "{message}");
            assert_eq!(e.exit_code(), 2);
        }
        other => panic!("expected the race detector to fail the run, got {other:?}"),
    }
}

/// Blocks never synchronise within a kernel: two blocks that touch one
/// element, one of them writing, race whatever the barriers.
#[test]
fn the_emulation_catches_blocks_sharing_an_element() {
    let program = load_str(mirror::PROGRAM, "mirror.json").unwrap();
    let options = Options {
        gpu: Some(GpuOptions::default()),
        ..Options::default()
    };
    let mut compiled = polyfuse::compile(&program, &options).unwrap();
    let isl = Isl::new();
    let scop = model::build(&isl, &program).unwrap();
    // `i` across blocks (one thread each) inside the step loop: step `t`
    // reads in one block what another block wrote at step `t - 1`.
    let domain = scop.domain().unwrap().text();
    let pre = "[T, N] -> ";
    let text = format!(
        "{{ domain: \"{domain}\", child: {{ mark: \"kernel_0\", child: {{ \
         schedule: \"{pre}[{{ S0[t, i] -> [(t)]; S1[t, i] -> [(t)]; S2[t, i] -> [(t)] }}]\", \
         child: {{ mark: \"block_x_1\", child: {{ \
         schedule: \"{pre}[{{ S0[t, i] -> [(i)]; S1[t, i] -> [(i)]; S2[t, i] -> [(i)] }}]\", \
         child: {{ sequence: [ {{ filter: \"{pre}{{ S0[t, i] }}\" }}, \
         {{ filter: \"{pre}{{ S1[t, i]; S2[t, i] }}\" }} ] }} }} }} }} }} }}"
    );
    let mapped = isl.schedule(&text).unwrap();
    let text =
        polyfuse::codegen::cuda::emulate_mapped(&program, &scop, &mapped, [1, 1, 1]).unwrap();
    compiled.kernel_c = text;
    match cpu::run(&compiled, &run_options()) {
        Err(e @ Error::Illegal { .. }) => {
            let message = e.to_string();
            eprintln!("{message}");
            assert!(
                message.contains("race in kernel_0: Z element "),
                "{message}"
            );
            assert!(message.contains("(two blocks of one kernel)"), "{message}");
        }
        other => panic!("expected the race detector to fail the run, got {other:?}"),
    }
}

/// The shared-memory copies: a promoted gemm's copy-in ends with a barrier
/// on the GPU; the same emulation without its barriers has the threads
/// read the copies other threads wrote in the same epoch.
#[test]
fn the_emulation_catches_shared_copies_read_before_the_barrier() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gemm.json");
    let program = polyfuse::frontend::load_file(&path).unwrap();
    let options = Options {
        gpu: Some(GpuOptions::default()),
        ..Options::default()
    };
    let mut compiled = polyfuse::compile(&program, &options).unwrap();
    let emulation = compiled.emulation_c.clone().unwrap();
    assert!(emulation.contains("pf_race_shared("), "{emulation}");
    assert!(emulation.contains("pf_race_barrier();"), "{emulation}");
    compiled.kernel_c = emulation.clone();
    assert!(
        cpu::run(&compiled, &run_options())
            .unwrap()
            .check
            .unwrap()
            .ok
    );
    compiled.kernel_c = emulation.replace("pf_race_barrier();", ";");
    match cpu::run(&compiled, &run_options()) {
        Err(e @ Error::Illegal { .. }) => {
            let message = e.to_string();
            eprintln!("{message}");
            assert!(message.contains("race in kernel_0: "), "{message}");
            assert!(message.contains("(shared copy of "), "{message}");
            assert!(message.contains("with no barrier between"), "{message}");
        }
        other => panic!("expected the race detector to fail the run, got {other:?}"),
    }
}
