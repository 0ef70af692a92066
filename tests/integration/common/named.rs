//! A program file whose `name` must be its file's name, compiled for the
//! GPU at the file's own sizes as `--target cuda` does (nothing runs):
//! shared by the bench programs' test (`bench_programs.rs`) and the
//! suite's (`suite.rs`).

use std::path::Path;

use polyfuse::frontend::{ast::Program, load_file};
use polyfuse::gpu::GpuOptions;
use polyfuse::{compile, Compiled, Options};

/// `file`, loaded; its `name` is `name`.
pub fn load_named(file: &Path, name: &str) -> Program {
    let program = load_file(file).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        program.name,
        name,
        "{}: name differs from the file name",
        file.display()
    );
    program
}

/// `program` scheduled, tiled and mapped to the GPU at its own sizes,
/// with CUDA generated.
pub fn compile_for_gpu(program: &Program, name: &str) -> Compiled {
    let full =
        compile(program, &gpu_options()).unwrap_or_else(|e| panic!("{name} at its own sizes: {e}"));
    assert!(full.cuda.is_some(), "{name}: no CUDA generated");
    full
}

/// The options of `--target cuda` with polyfuse's defaults.
pub fn gpu_options() -> Options {
    Options {
        gpu: Some(GpuOptions::default()),
        ..Options::default()
    }
}
