//! Which tensors each kernel touches in global memory
//! (`gpu::Kernel::globals`), the list the C ABI's workspace is sized
//! from: a temp in no kernel's list gets no memory and a null pointer, so
//! a list that missed a tensor the code accesses would send a kernel
//! through a null pointer. The lists are noted by the printer as it emits
//! each access; here they are checked against the printed source of every
//! example (the check reads the text; the library never does).

use std::collections::BTreeSet;

use polyfuse::frontend::ast::TensorRole;
use polyfuse::frontend::load_file;
use polyfuse::gpu::{CudaProgram, GpuOptions, KernelArg};
use polyfuse::{compile, Options};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `file` (under examples/) compiled for the GPU as the C ABI's cuda
/// target compiles it (tiles chosen per kernel), and its temps.
fn cuda_of(file: &str) -> (CudaProgram, BTreeSet<String>) {
    cuda_with(
        file,
        GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        },
    )
}

/// `file` compiled for the GPU with `gpu`, and its temps.
fn cuda_with(file: &str, gpu: GpuOptions) -> (CudaProgram, BTreeSet<String>) {
    let program = load_file(&std::path::Path::new(ROOT).join("examples").join(file)).unwrap();
    let options = Options {
        gpu: Some(gpu),
        ..Options::default()
    };
    let compiled = compile(&program, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
    let temps = compiled
        .tensors
        .iter()
        .filter(|t| t.role == TensorRole::Temp)
        .map(|t| t.name.clone())
        .collect();
    (compiled.cuda.expect("a CUDA program"), temps)
}

/// The tensors named in each kernel's body (after its signature) in the
/// printed source, by kernel name.
fn named_in_bodies(cuda: &CudaProgram) -> Vec<(String, BTreeSet<String>)> {
    let tensors: Vec<&str> = cuda
        .args
        .iter()
        .filter_map(|a| match a {
            KernelArg::Tensor { name, .. } => Some(name.as_str()),
            KernelArg::Param { .. } | KernelArg::Step { .. } => None,
        })
        .collect();
    let mut out = Vec::new();
    let pieces: Vec<&str> = cuda.source.split("extern \"C\" __global__").collect();
    for k in &cuda.kernels {
        let piece = pieces
            .iter()
            .find(|p| {
                p.lines()
                    .next()
                    .is_some_and(|l| l.contains(&format!(" {}(", k.name)))
            })
            .unwrap_or_else(|| panic!("kernel {} not in the source", k.name));
        let body: String = piece.lines().skip(1).collect::<Vec<_>>().join("\n");
        let named = tensors
            .iter()
            .filter(|t| mentions(&body, &format!("t_{t}")))
            .map(|t| t.to_string())
            .collect();
        out.push((k.name.clone(), named));
    }
    out
}

/// Whether `text` has `word` as a whole identifier.
fn mentions(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[test]
fn every_kernel_lists_exactly_the_tensors_its_code_touches() {
    let mut files: Vec<String> = std::fs::read_dir(format!("{ROOT}/examples"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.ends_with(".json").then_some(name)
        })
        .collect();
    files.sort();
    assert!(files.len() >= 20, "{files:?}");
    let mut untouched_temps = 0;
    for file in &files {
        let (cuda, temps) = cuda_of(file);
        for ((name, named), k) in named_in_bodies(&cuda).into_iter().zip(&cuda.kernels) {
            let listed: BTreeSet<String> = k.globals.iter().cloned().collect();
            assert_eq!(listed, named, "{file}: kernel {name}");
        }
        let touched: BTreeSet<&String> = cuda.kernels.iter().flat_map(|k| &k.globals).collect();
        untouched_temps += temps.iter().filter(|t| !touched.contains(t)).count();
    }
    // Some temps never reach memory (the attention examples' row states
    // and M_prev at least): the lists are not every tensor.
    assert!(untouched_temps >= 5, "{untouched_temps}");
}

#[test]
fn causal_attention_touches_its_inputs_and_output_only() {
    // issue 33: the caller allocated 3.0 GiB of temps (B4 H16 S2048 D64)
    // that the one kernel never touches, M_prev among them.
    let (cuda, temps) = cuda_of("attention_causal.json");
    assert!(temps.contains("M_prev"), "{temps:?}");
    assert_eq!(cuda.kernels.len(), 1);
    assert_eq!(cuda.kernels[0].globals, ["Q", "K", "V", "Y"]);
}

#[test]
fn an_accumulator_moved_into_another_tensor_is_not_touched() {
    // `acc +=! f32(A) * f32(B); C = f16(gelu(acc + bias))`: the tensor-core
    // kernel starts its accumulators at zero and stores the epilogue's
    // value into C, so acc never reaches memory. Its element was printed
    // (and so noted) for a load the zero start does not make, which put
    // acc in the list and made the caller allocate it.
    let (cuda, temps) = cuda_of("gemm_bias_gelu_f16.json");
    assert!(temps.contains("acc"), "{temps:?}");
    assert_eq!(cuda.kernels.len(), 1);
    let globals: BTreeSet<&str> = cuda.kernels[0].globals.iter().map(String::as_str).collect();
    assert_eq!(globals, BTreeSet::from(["A", "B", "bias", "C"]));
}

#[test]
fn a_product_and_its_softmax_touch_their_temps() {
    // softmax's kernels pass their row maxima and sums through memory:
    // those temps are in the lists, so the workspace holds them.
    let (cuda, temps) = cuda_of("softmax.json");
    let touched: BTreeSet<&String> = cuda.kernels.iter().flat_map(|k| &k.globals).collect();
    assert!(
        temps.iter().any(|t| touched.contains(t)),
        "{temps:?} {touched:?}"
    );
}

#[test]
fn the_lists_hold_under_the_printer_s_other_paths() {
    // Double-buffered tiles, vector groups, unrolled steps, a split
    // reduction, no tensor cores, no promotion, no warp reductions: each
    // prints its global accesses its own way.
    let variants = [
        GpuOptions {
            pipeline: Some(true),
            vector: 4,
            unroll: Some(true),
            ..GpuOptions::default()
        },
        GpuOptions {
            pipeline: Some(true),
            ..GpuOptions::default()
        },
        GpuOptions {
            auto_tile: true,
            k_split: Some(4),
            ..GpuOptions::default()
        },
        GpuOptions {
            tensor_cores: false,
            reduce: false,
            ..GpuOptions::default()
        },
        GpuOptions {
            shared: false,
            registers: false,
            ..GpuOptions::default()
        },
    ];
    for file in [
        "gemm.json",
        "gemm_f16.json",
        "fcrelu_f16.json",
        "conv2d.json",
        "softmax.json",
        "layernorm.json",
        "tbmm_bf16.json",
        "matvec.json",
    ] {
        for (v, gpu) in variants.iter().enumerate() {
            let (cuda, _) = cuda_with(file, gpu.clone());
            for ((name, named), k) in named_in_bodies(&cuda).into_iter().zip(&cuda.kernels) {
                let listed: BTreeSet<String> = k.globals.iter().cloned().collect();
                assert_eq!(listed, named, "{file}, variant {v}: kernel {name}");
            }
        }
    }
}
