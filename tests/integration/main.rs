//! polyfuse's integration tests, one module per subject, built as one test
//! binary: a single link instead of one per file, and a single pool of test
//! threads, so the machine's cores stay busy until the last test (with one
//! binary per file, each file's slowest tests ran alone; CI's time, issue
//! 34). The program fuzzer (`tests/fuzz.rs`) stays its own binary, since
//! `scripts/fuzz.sh` and `scripts/fuzz-parallel.sh` run it on its own.
//!
//! Run one subject with `cargo test --test integration golden::`.

mod common;

mod accumulation;
mod architecture;
mod attention;
mod bench_programs;
mod capi;
mod capi_header;
mod cli;
mod columns;
mod cost;
mod cuda_runtime;
mod disjunction;
mod dtypes;
mod epilogue;
mod examples;
mod factor;
mod fusion;
mod golden;
mod gpu_mapping;
mod loops;
mod numerics;
mod pipeline;
mod race_detector;
mod race_proof;
mod recurrence_gates;
mod repair;
mod row_chains;
mod siblings;
mod soundness;
mod stores;
mod suite;
mod sums;
mod tiles;
mod tma;
mod triangles;
mod tune;
mod watch;
mod workspace;
