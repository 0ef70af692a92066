//! The C ABI (`include/polyfuse.h`) called as a C program would, through
//! the exported functions: results, error codes and messages, null and
//! stale handles, concurrent compiles. (`tests/integration/capi_header.rs` checks
//! that the header is what cbindgen makes of `src/capi`;
//! `scripts/abi-test.sh` covers the same ABI from real C and C++.)

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::process::Command;
use std::ptr::{null, null_mut};

use polyfuse::capi::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Reads and frees a string handed out by polyfuse.
fn take(p: *mut c_char) -> String {
    assert!(!p.is_null(), "expected a string");
    // SAFETY: polyfuse handed out `p` as a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string();
    // SAFETY: freeing once what polyfuse handed out.
    assert_eq!(unsafe { pf_string_free(p) }, PF_OK);
    s
}

fn ctx_error(ctx: *const pf_context) -> String {
    // SAFETY: any handle value is accepted.
    take(unsafe { pf_context_error_message(ctx) })
}

fn last_error() -> String {
    take(pf_last_error_message())
}

/// A context with `setup` applied, compiling `file` from examples/.
fn context(file: &str) -> *mut pf_context {
    let mut ctx = null_mut();
    // SAFETY: `ctx` is a valid place for the handle; the path is a C string.
    unsafe {
        assert_eq!(pf_context_create(&mut ctx), PF_OK);
        let path = c(&format!("{ROOT}/examples/{file}"));
        assert_eq!(pf_context_load_file(ctx, path.as_ptr()), PF_OK);
    }
    ctx
}

fn compile_ok(ctx: *mut pf_context) -> *mut pf_result {
    let mut r = null_mut();
    // SAFETY: valid handle and output place.
    let st = unsafe { pf_compile(ctx, &mut r) };
    assert_eq!(st, PF_OK, "{}", ctx_error(ctx));
    r
}

/// Compiles `ctx`; `None` (the context destroyed) where the environment
/// cannot (no CUDA toolkit for a cuda target).
fn compile_unless_environment(ctx: *mut pf_context) -> Option<*mut pf_result> {
    let mut r = null_mut();
    // SAFETY: valid handle and output place; the context is destroyed
    // once, here, only when it is not returned for further use.
    unsafe {
        let st = pf_compile(ctx, &mut r);
        if st == PF_ERR_ENVIRONMENT {
            pf_context_destroy(ctx);
            return None;
        }
        assert_eq!(st, PF_OK, "{}", ctx_error(ctx));
    }
    Some(r)
}

fn string_of(
    r: *const pf_result,
    f: unsafe extern "C" fn(*const pf_result, *mut *mut c_char) -> pf_status,
) -> String {
    let mut s = null_mut();
    // SAFETY: valid handle and output place.
    assert_eq!(unsafe { f(r, &mut s) }, PF_OK);
    take(s)
}

#[test]
fn version_and_abi() {
    // SAFETY: a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(pf_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
    assert_eq!(pf_abi_version(), 1);
    let header = std::fs::read_to_string(format!("{ROOT}/include/polyfuse.h")).unwrap();
    assert!(header.contains("#define PF_ABI_VERSION 1"));
}

#[test]
fn cpu_result_exposes_c_tree_and_arguments() {
    let ctx = context("gemm.json");
    let r = compile_ok(ctx);
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(string_of(r, pf_result_target), "cpu");
        let mut n = 9;
        assert_eq!(pf_result_num_kernels(r, &mut n), PF_OK);
        assert_eq!(n, 0);
        let c_src = string_of(r, pf_result_c_source);
        assert!(c_src.contains("void pf_kernel(const long *pf_params, void **pf_tensors)"));
        let tree = string_of(r, pf_result_schedule_tree);
        assert!(tree.contains("domain"), "{tree}");
        let mut s = null_mut();
        assert_eq!(pf_result_cuda_source(r, &mut s), PF_ERR_INVALID_ARGUMENT);
        let msg = take(pf_result_error_message(r));
        assert!(msg.contains("cpu target"), "{msg}");
        assert_eq!(
            pf_result_launch(r, 0, null(), null_mut(), null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );

        assert_eq!(pf_result_num_params(r, &mut n), PF_OK);
        assert_eq!(n, 0);
        assert_eq!(pf_result_num_args(r, &mut n), PF_OK);
        assert_eq!(n, 3);
        let mut names = Vec::new();
        for i in 0..3 {
            let mut kind = -1;
            assert_eq!(pf_result_arg_kind(r, i, &mut kind), PF_OK);
            assert_eq!(kind, PF_ARG_TENSOR);
            let mut name = null_mut();
            assert_eq!(pf_result_arg_name(r, i, &mut name), PF_OK);
            names.push(take(name));
            let mut t = -1;
            assert_eq!(pf_result_arg_dtype(r, i, &mut t), PF_OK);
            assert_eq!(t, PF_DTYPE_F32);
            let mut rank = 0;
            assert_eq!(pf_result_arg_rank(r, i, &mut rank), PF_OK);
            assert_eq!(rank, 2);
        }
        assert_eq!(names, ["A", "B", "C"]);
        let mut dim = null_mut();
        assert_eq!(pf_result_arg_dim(r, 0, 1, &mut dim), PF_OK);
        assert_eq!(take(dim), "K");
        let mut e = 0;
        assert_eq!(pf_result_arg_extent(r, 1, 1, null(), 0, &mut e), PF_OK);
        assert_eq!(e, 256);
        let mut bytes = 0;
        assert_eq!(pf_result_arg_bytes(r, 0, null(), 0, &mut bytes), PF_OK);
        assert_eq!(bytes, 128 * 64 * 4);
        // Out of range.
        let mut rank = 0;
        assert_eq!(pf_result_arg_rank(r, 3, &mut rank), PF_ERR_INVALID_ARGUMENT);
        assert_eq!(
            pf_result_arg_dim(r, 0, 2, &mut dim),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            pf_result_kernel_name(r, 0, &mut dim),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(take(pf_result_error_message(r)).contains("out of range"));
        // A success clears the result's error.
        assert_eq!(pf_result_num_args(r, &mut n), PF_OK);
        assert!(pf_result_error_message(r).is_null());

        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn cuda_result_describes_kernels_and_launch() {
    let ctx = context("gemm.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let mut r = null_mut();
        let st = pf_compile(ctx, &mut r);
        if st == PF_ERR_ENVIRONMENT {
            // The GPU mapping is not in this build: the message says so.
            assert!(ctx_error(ctx).contains("CUDA"));
            pf_context_destroy(ctx);
            return;
        }
        assert_eq!(st, PF_OK, "{}", ctx_error(ctx));
        let mut n = 0;
        assert_eq!(pf_result_num_kernels(r, &mut n), PF_OK);
        assert!(n >= 1);
        let src = string_of(r, pf_result_cuda_source);
        for k in 0..n {
            let mut name = null_mut();
            assert_eq!(pf_result_kernel_name(r, k, &mut name), PF_OK);
            let name = take(name);
            assert!(src.contains(&name), "{name} not in the source");
            let mut block = [0u32; 3];
            assert_eq!(pf_result_kernel_block(r, k, block.as_mut_ptr()), PF_OK);
            assert!(block.iter().all(|b| *b >= 1));
            assert!(block.iter().product::<u32>() <= 1024);
            let mut grid = [0u32; 3];
            assert_eq!(
                pf_result_kernel_grid(r, k, null(), 0, grid.as_mut_ptr()),
                PF_OK
            );
            assert!(grid.iter().all(|g| *g >= 1), "{grid:?}");
            let (mut dynamic, mut stat) = (usize::MAX, usize::MAX);
            assert_eq!(
                pf_result_kernel_shared_memory(r, k, &mut dynamic, &mut stat),
                PF_OK
            );
            assert!(dynamic < usize::MAX && stat < usize::MAX);
        }
        // Too many parameter values for a program whose sizes are fixed.
        let mut grid = [0u32; 3];
        assert_eq!(
            pf_result_kernel_grid(r, 0, [4i64].as_ptr(), 1, grid.as_mut_ptr()),
            PF_ERR_INVALID_ARGUMENT
        );
        // Without a driver the launch is an environment error, not a crash
        // (the pointers are never dereferenced; null ones would be refused).
        if polyfuse::runtime::cuda::probe_driver().is_err() {
            let mut ptrs = [std::ptr::without_provenance_mut(0x1000); 3];
            assert_eq!(
                pf_result_launch(r, 0, null(), ptrs.as_mut_ptr(), null_mut()),
                PF_ERR_ENVIRONMENT
            );
            assert!(take(pf_result_error_message(r)).contains("CUDA driver"));
        }
        assert!(string_of(r, pf_result_schedule_tree).contains("domain"));
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn kernels_without_tma_copies_take_no_tensor_maps() {
    let ctx = context("gemm.json");
    // SAFETY: valid handles and output places throughout; `ptrs` holds the
    // three pointers passed, `out` 128 aligned bytes.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        let mut n = 0;
        assert_eq!(pf_result_num_kernels(r, &mut n), PF_OK);
        for k in 0..n {
            let mut maps = 9;
            assert_eq!(pf_result_kernel_num_tensor_maps(r, k, &mut maps), PF_OK);
            assert_eq!(maps, 0, "kernel {k} of an f32 gemm");
        }
        let mut maps = 0;
        assert_eq!(
            pf_result_kernel_num_tensor_maps(r, n, &mut maps),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(
            take(pf_result_error_message(r)).contains(&format!("kernel index {n} is out of range"))
        );
        assert_eq!(
            pf_result_kernel_num_tensor_maps(r, 0, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        // No map to encode: refused before the driver is asked.
        #[repr(C, align(64))]
        struct Map([u64; 16]);
        let mut out = Map([0; 16]);
        let ptrs = [std::ptr::without_provenance::<std::ffi::c_void>(0x1000); 3];
        assert_eq!(
            pf_result_kernel_tensor_map(r, 0, 0, ptrs.as_ptr(), 3, (&raw mut out).cast()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(
            take(pf_result_error_message(r)).contains("tensor map index 0 is out of range (0..0)")
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
    // A cpu result has no kernels to ask about.
    let ctx = context("gemm.json");
    let r = compile_ok(ctx);
    let mut maps = 0;
    // SAFETY: valid handles and output place.
    unsafe {
        assert_eq!(
            pf_result_kernel_num_tensor_maps(r, 0, &mut maps),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn destroying_a_result_after_a_failed_launch_touches_no_driver() {
    // pf_result_destroy unloads the modules a result loaded, each in its
    // context, and releases the primary contexts it retained (issue 30;
    // the order is tested against a fake driver in capi::launch). A
    // result whose launches all failed (no driver here) loaded nothing:
    // destroying it succeeds once and never calls the driver.
    let ctx = context("gemm.json");
    // SAFETY: valid handles and output places; each handle destroyed once
    // (the second destroy is refused, not performed).
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        if polyfuse::runtime::cuda::probe_driver().is_err() {
            let mut ptrs = [std::ptr::without_provenance_mut(0x1000); 3];
            for _ in 0..2 {
                assert_eq!(
                    pf_result_launch(r, 0, null(), ptrs.as_mut_ptr(), null_mut()),
                    PF_ERR_ENVIRONMENT
                );
            }
        }
        assert_eq!(pf_result_destroy(r), PF_OK, "{}", last_error());
        assert_eq!(pf_result_destroy(r), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn attention_asked_for_without_tiles_is_one_kernel_on_tensor_cores() {
    // SAFETY: valid handles and output places throughout.
    unsafe {
        for (tile, fused) in [(None, true), (Some([16i64]), false)] {
            let ctx = context("attention_causal.json");
            assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
            if let Some(t) = tile {
                assert_eq!(pf_context_set_tile(ctx, t.as_ptr(), 1), PF_OK);
            }
            let Some(r) = compile_unless_environment(ctx) else {
                return;
            };
            let mut n = 0;
            assert_eq!(pf_result_num_kernels(r, &mut n), PF_OK);
            let src = string_of(r, pf_result_cuda_source);
            // A user's tiles are for the tree's own mapping.
            assert_eq!(
                src.contains("pf_ldmatrix_x4_trans("),
                fused,
                "tile {tile:?}"
            );
            if fused {
                assert_eq!(n, 1);
                let mut block = [0u32; 3];
                assert_eq!(pf_result_kernel_block(r, 0, block.as_mut_ptr()), PF_OK);
                assert_eq!(block, [128, 1, 1]);
                let (mut dynamic, mut stat) = (0, 0);
                assert_eq!(
                    pf_result_kernel_shared_memory(r, 0, &mut dynamic, &mut stat),
                    PF_OK
                );
                assert!(dynamic > 0);
            }
            assert_eq!(pf_result_destroy(r), PF_OK);
            assert_eq!(pf_context_destroy(ctx), PF_OK);
        }
    }
}

#[test]
fn every_kernel_is_a_programmatic_dependent_of_the_one_before_it() {
    // SAFETY: valid handles and output places throughout.
    unsafe {
        let ctx = context("attention_decode_causal.json");
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        let mut n = 0;
        assert_eq!(pf_result_num_kernels(r, &mut n), PF_OK);
        assert_eq!(n, 2);
        let mut dependent = [-1i32; 2];
        for (k, d) in dependent.iter_mut().enumerate() {
            assert_eq!(pf_result_kernel_dependent(r, k, d), PF_OK);
        }
        // The split kernel waits for whatever ran before it on the stream,
        // the combination for the split kernel.
        assert_eq!(dependent, [1, 1]);
        assert_eq!(
            pf_result_kernel_dependent(r, 2, &mut dependent[0]),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            pf_result_kernel_dependent(r, 1, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn symbolic_parameters_are_passed_by_value() {
    let json = r#"{ "name": "scale", "params": { "N": null, "M": 8 },
        "inputs": { "X": { "dtype": "f16", "shape": ["N", "M"] } },
        "outputs": { "Y": { "dtype": "f16", "shape": ["N", "M"] } },
        "body": [ "Y(i, j) = X(i, j) * 2" ] }"#;
    let mut ctx = null_mut();
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_create(&mut ctx), PF_OK);
        assert_eq!(pf_context_load_json(ctx, c(json).as_ptr()), PF_OK);
        let r = compile_ok(ctx);
        let mut n = 0;
        assert_eq!(pf_result_num_params(r, &mut n), PF_OK);
        assert_eq!(n, 1);
        let mut name = null_mut();
        assert_eq!(pf_result_param_name(r, 0, &mut name), PF_OK);
        assert_eq!(take(name), "N");
        assert_eq!(pf_result_num_args(r, &mut n), PF_OK);
        assert_eq!(n, 3);
        let mut kind = -1;
        assert_eq!(pf_result_arg_kind(r, 2, &mut kind), PF_OK);
        assert_eq!(kind, PF_ARG_PARAM);
        let mut t = 0;
        assert_eq!(pf_result_arg_dtype(r, 2, &mut t), PF_ERR_INVALID_ARGUMENT);
        let mut bytes = 0;
        assert_eq!(
            pf_result_arg_bytes(r, 0, [10i64].as_ptr(), 1, &mut bytes),
            PF_OK
        );
        assert_eq!(bytes, 10 * 8 * 2);
        // The count must match, and values are positive.
        assert_eq!(
            pf_result_arg_bytes(r, 0, null(), 0, &mut bytes),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            pf_result_arg_bytes(r, 0, [0i64].as_ptr(), 1, &mut bytes),
            PF_ERR_INPUT
        );
        pf_result_destroy(r);
        // Giving N a value makes it a compile-time constant.
        assert_eq!(pf_context_set_param(ctx, c("N=5").as_ptr()), PF_OK);
        let r = compile_ok(ctx);
        assert_eq!(pf_result_num_params(r, &mut n), PF_OK);
        assert_eq!(n, 0);
        let mut e = 0;
        assert_eq!(pf_result_arg_extent(r, 1, 0, null(), 0, &mut e), PF_OK);
        assert_eq!(e, 5);
        pf_result_destroy(r);
        pf_context_destroy(ctx);
    }
}

#[test]
fn bad_json_and_bad_programs_are_input_errors() {
    let mut ctx = null_mut();
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_create(&mut ctx), PF_OK);
        assert_eq!(
            pf_context_load_json(ctx, c("{ nope").as_ptr()),
            PF_ERR_INPUT
        );
        let msg = ctx_error(ctx);
        assert!(
            msg.contains("not valid JSON") && msg.contains("<json>"),
            "{msg}"
        );
        assert_eq!(last_error(), msg);
        // Nothing loaded: compiling is an input error.
        let mut r = null_mut();
        assert_eq!(pf_compile(ctx, &mut r), PF_ERR_INPUT);
        assert!(ctx_error(ctx).contains("no program is loaded"));
        assert!(r.is_null());
        let bad = r#"{ "name": "t", "params": {}, "inputs": {},
            "outputs": { "Y": { "dtype": "f32", "shape": [4] } }, "body": [ "Y(i) = Q(i)" ] }"#;
        assert_eq!(pf_context_load_json(ctx, c(bad).as_ptr()), PF_ERR_INPUT);
        assert!(ctx_error(ctx).contains("unknown tensor or function `Q`"));
        let missing = c("/nonexistent/program.json");
        assert_eq!(pf_context_load_file(ctx, missing.as_ptr()), PF_ERR_INPUT);
        assert!(ctx_error(ctx).contains("cannot read the file"));
        // Not UTF-8.
        let latin1 = [0xffu8, 0];
        assert_eq!(
            pf_context_load_json(ctx, latin1.as_ptr().cast()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_context_load_json(ctx, null()), PF_ERR_INVALID_ARGUMENT);
        // Text with a length (issue 33, item 9): a NUL inside is an input
        // error naming its offset, where the NUL-terminated call compiled
        // the prefix; text without a terminator loads.
        let good = r#"{ "name": "t", "params": {}, "inputs": { "X": { "dtype": "f32", "shape": [4] } },
            "outputs": { "Y": { "dtype": "f32", "shape": [4] } }, "body": [ "Y(i) = X(i)" ] }"#;
        let mut bytes = good.as_bytes().to_vec();
        let cut = bytes.len();
        bytes.extend_from_slice(b"\0 trailing garbage");
        assert_eq!(
            pf_context_load_json_n(ctx, bytes.as_ptr().cast(), bytes.len()),
            PF_ERR_INPUT
        );
        assert!(
            ctx_error(ctx).contains(&format!("NUL byte at offset {cut}")),
            "{}",
            ctx_error(ctx)
        );
        let unterminated = good.as_bytes().to_vec();
        assert_eq!(
            pf_context_load_json_n(ctx, unterminated.as_ptr().cast(), unterminated.len()),
            PF_OK
        );
        let mut r = null_mut();
        assert_eq!(pf_compile(ctx, &mut r), PF_OK);
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(
            pf_context_load_json_n(ctx, latin1.as_ptr().cast(), 1),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            pf_context_load_json_n(ctx, null(), 3),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn bad_options_are_refused_with_a_message() {
    let ctx = context("gemm.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        let fails = |st: pf_status, code: pf_status, needle: &str| {
            assert_eq!(st, code);
            let m = ctx_error(ctx);
            assert!(m.contains(needle), "`{m}` lacks `{needle}`");
        };
        fails(
            pf_context_set_strategy(ctx, c("greedy").as_ptr()),
            PF_ERR_INPUT,
            "unknown strategy `greedy`",
        );
        fails(
            pf_context_set_target(ctx, c("tpu").as_ptr()),
            PF_ERR_INPUT,
            "unknown target",
        );
        fails(
            pf_context_set_tile(ctx, [32i64, 0].as_ptr(), 2),
            PF_ERR_INPUT,
            "tile size 0",
        );
        fails(
            pf_context_set_tile(ctx, null(), 2),
            PF_ERR_INVALID_ARGUMENT,
            "sizes is null",
        );
        fails(
            pf_context_set_param(ctx, c("M").as_ptr()),
            PF_ERR_INPUT,
            "NAME=VALUE",
        );
        fails(
            pf_context_set_param(ctx, c("M=0").as_ptr()),
            PF_ERR_INPUT,
            "positive integer",
        );
        fails(
            pf_context_set_param(ctx, c("Q=3").as_ptr()),
            PF_ERR_INPUT,
            "no parameter `Q`",
        );
        fails(
            pf_context_set_block(ctx, [32u32, 0].as_ptr(), 2),
            PF_ERR_INPUT,
            "block",
        );
        fails(
            pf_context_set_grid(ctx, [1u32, 1, 1, 1].as_ptr(), 4),
            PF_ERR_INPUT,
            "grid",
        );
        fails(
            pf_context_set_directives(ctx, c("{").as_ptr()),
            PF_ERR_INPUT,
            "not valid JSON",
        );
        // Good options still compile after the refusals.
        assert_eq!(pf_context_set_strategy(ctx, c("max").as_ptr()), PF_OK);
        assert!(pf_context_error_message(ctx).is_null());
        assert_eq!(pf_context_set_tile(ctx, [16i64, 8].as_ptr(), 2), PF_OK);
        assert_eq!(pf_context_set_param(ctx, c("M=37").as_ptr()), PF_OK);
        assert_eq!(pf_context_set_sink(ctx, 0), PF_OK);
        let r = compile_ok(ctx);
        let mut e = 0;
        assert_eq!(pf_result_arg_extent(r, 0, 0, null(), 0, &mut e), PF_OK);
        assert_eq!(e, 37);
        pf_result_destroy(r);
        // Directives are passed through as the `schedule` key: a template
        // that is not a list of steps is refused by the compile, a good one
        // (tile sizes) compiles.
        assert_eq!(
            pf_context_set_directives(ctx, c(r#"{"tile": [8]}"#).as_ptr()),
            PF_OK
        );
        let mut r = null_mut();
        fails(pf_compile(ctx, &mut r), PF_ERR_INPUT, "list of steps");
        assert_eq!(
            pf_context_set_directives(ctx, c(r#"[{"tile": [8]}]"#).as_ptr()),
            PF_OK
        );
        let r = compile_ok(ctx);
        pf_result_destroy(r);
        assert_eq!(pf_context_set_directives(ctx, null()), PF_OK);
        let r = compile_ok(ctx);
        pf_result_destroy(r);
        pf_context_destroy(ctx);
    }
}

#[test]
fn null_handles_and_outputs_are_refused() {
    // SAFETY: the point of the test: null and forged handles.
    unsafe {
        assert_eq!(pf_context_create(null_mut()), PF_ERR_INVALID_ARGUMENT);
        assert_eq!(pf_context_destroy(null_mut()), PF_ERR_INVALID_HANDLE);
        assert!(last_error().contains("pf_context is null"));
        assert_eq!(
            pf_context_load_json(null_mut(), c("{}").as_ptr()),
            PF_ERR_INVALID_HANDLE
        );
        assert_eq!(pf_context_set_sink(null_mut(), 1), PF_ERR_INVALID_HANDLE);
        let mut r = null_mut();
        assert_eq!(pf_compile(null_mut(), &mut r), PF_ERR_INVALID_HANDLE);
        let mut n = 0;
        assert_eq!(pf_result_num_kernels(null(), &mut n), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_result_destroy(null_mut()), PF_ERR_INVALID_HANDLE);
        assert_eq!(
            pf_result_launch(null(), 0, null(), null_mut(), null_mut()),
            PF_ERR_INVALID_HANDLE
        );
        assert!(pf_context_error_message(null()).is_null());
        assert!(pf_result_error_message(null()).is_null());
        // Forged handles: small integers and an arbitrary address.
        let forged = 0x1234usize as *mut pf_context;
        assert_eq!(pf_context_set_sink(forged, 1), PF_ERR_INVALID_HANDLE);
        let mut local = 0u64;
        let stack = (&mut local as *mut u64).cast::<pf_result>();
        assert_eq!(pf_result_num_args(stack, &mut n), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_string_free(null_mut()), PF_OK);
        let mut mine = *b"not polyfuse's\0";
        assert_eq!(
            pf_string_free(mine.as_mut_ptr().cast()),
            PF_ERR_INVALID_HANDLE
        );

        // Null outputs on live handles.
        let ctx = context("gemm.json");
        assert_eq!(pf_compile(ctx, null_mut()), PF_ERR_INVALID_ARGUMENT);
        let r = compile_ok(ctx);
        assert_eq!(pf_result_num_args(r, null_mut()), PF_ERR_INVALID_ARGUMENT);
        assert_eq!(pf_result_c_source(r, null_mut()), PF_ERR_INVALID_ARGUMENT);
        pf_result_destroy(r);
        pf_context_destroy(ctx);
    }
}

#[test]
fn double_free_and_use_after_free_return_errors() {
    let ctx = context("matvec.json");
    let r = compile_ok(ctx);
    // SAFETY: the point of the test: stale handles and strings.
    unsafe {
        // A result handle is not a context, and survives the attempt.
        assert_eq!(
            pf_context_destroy(r.cast::<pf_context>()),
            PF_ERR_INVALID_HANDLE
        );
        assert_eq!(
            pf_result_destroy(ctx.cast::<pf_result>()),
            PF_ERR_INVALID_HANDLE
        );
        let mut s = null_mut();
        assert_eq!(pf_result_c_source(r, &mut s), PF_OK);
        assert_eq!(pf_string_free(s), PF_OK);
        assert_eq!(pf_string_free(s), PF_ERR_INVALID_HANDLE);
        assert!(last_error().contains("already freed"));

        assert_eq!(pf_context_destroy(ctx), PF_OK);
        // The result outlives its context.
        assert!(string_of(r, pf_result_schedule_tree).contains("domain"));
        assert_eq!(pf_context_destroy(ctx), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_context_set_sink(ctx, 1), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_result_destroy(r), PF_ERR_INVALID_HANDLE);
        let mut n = 0;
        assert_eq!(pf_result_num_args(r, &mut n), PF_ERR_INVALID_HANDLE);
        // Handles are never reused, so a new context does not revive an
        // old handle.
        let ctx2 = context("matvec.json");
        assert_ne!(ctx2, ctx);
        assert_eq!(pf_context_destroy(ctx), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_context_destroy(ctx2), PF_OK);
    }
}

/// Everything a compile hands out, as text, for comparing compiles.
fn describe(file: &str, target: &str, strategy: &str) -> String {
    let ctx = context(file);
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c(target).as_ptr()), PF_OK);
        assert_eq!(pf_context_set_strategy(ctx, c(strategy).as_ptr()), PF_OK);
        let mut r = null_mut();
        let st = pf_compile(ctx, &mut r);
        if st != PF_OK {
            let m = ctx_error(ctx);
            pf_context_destroy(ctx);
            return format!("error {st}: {m}");
        }
        let mut out = string_of(r, pf_result_schedule_tree) + &string_of(r, pf_result_c_source);
        let mut n = 0;
        pf_result_num_kernels(r, &mut n);
        if n > 0 {
            out += &string_of(r, pf_result_cuda_source);
        }
        pf_result_destroy(r);
        pf_context_destroy(ctx);
        out
    }
}

#[test]
fn contexts_compile_concurrently_with_identical_results() {
    let cases = [
        ("gemm.json", "cpu", "isl"),
        ("softmax.json", "cpu", "max"),
        ("conv2d.json", "cuda", "isl"),
        ("layernorm.json", "cuda", "min"),
    ];
    let expected: Vec<String> = cases.iter().map(|(f, t, s)| describe(f, t, s)).collect();
    for e in &expected {
        assert!(!e.starts_with("error"), "{e}");
    }
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                // Each thread walks the cases from a different start, so
                // different programs compile at the same time.
                (0..cases.len() * 2)
                    .map(|j| {
                        let k = (i + j) % cases.len();
                        let (f, t, s) = cases[k];
                        (k, describe(f, t, s))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        for (k, got) in t.join().unwrap() {
            assert_eq!(got, expected[k], "case {k} differs under concurrency");
        }
    }
}

#[test]
fn one_context_shared_by_threads_is_serialised() {
    let ctx = context("gemm.json") as usize;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let ctx = ctx as *mut pf_context;
                let r = compile_ok(ctx);
                let text = string_of(r, pf_result_c_source);
                // SAFETY: a live result handle.
                assert_eq!(unsafe { pf_result_destroy(r) }, PF_OK);
                text
            })
        })
        .collect();
    let texts: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(texts.windows(2).all(|w| w[0] == w[1]));
    // SAFETY: a live context handle.
    assert_eq!(unsafe { pf_context_destroy(ctx as *mut pf_context) }, PF_OK);
}

/// The tree of the GQA decoding example at KV = 300 in 37 split-k slices
/// (isl's scheduler does not finish it with fusion), compiled through the
/// C ABI with a strategy or a schedule timeout.
fn gqa_split_37_tree(strategy: Option<&str>, timeout: Option<u32>) -> String {
    gqa_split_37(strategy, timeout).0
}

/// The tree, and the notices the context's log received.
fn gqa_split_37(strategy: Option<&str>, timeout: Option<u32>) -> (String, Vec<(i32, String)>) {
    let ctx = context("attention_decode_gqa.json");
    let mut notices: Vec<(i32, String)> = Vec::new();
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_param(ctx, c("KV=300").as_ptr()), PF_OK);
        let directives = c(r#"[{"split-k": ["L", "O"], "factor": 37}]"#);
        assert_eq!(pf_context_set_directives(ctx, directives.as_ptr()), PF_OK);
        assert_eq!(pf_context_set_cache(ctx, null()), PF_OK);
        let user = (&mut notices as *mut Vec<(i32, String)>).cast();
        assert_eq!(pf_context_set_log(ctx, Some(collect_notice), user), PF_OK);
        if let Some(s) = strategy {
            assert_eq!(pf_context_set_strategy(ctx, c(s).as_ptr()), PF_OK);
        }
        if let Some(t) = timeout {
            assert_eq!(pf_context_set_schedule_timeout(ctx, t), PF_OK);
        }
        let r = compile_ok(ctx);
        let tree = string_of(r, pf_result_schedule_tree);
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
        (tree, notices)
    }
}

/// A `pf_log_fn` that appends to the `Vec<(i32, String)>` at `user`.
unsafe extern "C" fn collect_notice(
    user: *mut std::ffi::c_void,
    level: i32,
    message: *const c_char,
) {
    // SAFETY: the tests pass a live Vec as `user`, and polyfuse a C string
    // valid for the call.
    unsafe {
        let notices = &mut *user.cast::<Vec<(i32, String)>>();
        notices.push((
            level,
            CStr::from_ptr(message).to_string_lossy().into_owned(),
        ));
    }
}

/// The library's notices go to the context's log, and only there: a
/// fallback is a warning there; a compilation with nothing to say says
/// nothing; a cache named on the context that cannot be read is a warning
/// and the compilation goes on; without a cache named, none is read.
#[test]
fn notices_go_to_the_log_callback_and_nowhere_else() {
    let (_, notices) = gqa_split_37(None, Some(2));
    assert!(
        notices
            .iter()
            .any(|(level, m)| *level == PF_LOG_WARNING && m.contains("minimal fusion")),
        "{notices:?}"
    );
    let (_, quiet) = gqa_split_37(Some("min"), None);
    assert!(quiet.is_empty(), "{quiet:?}");

    let bogus =
        std::env::temp_dir().join(format!("polyfuse-bogus-cache-{}.db", std::process::id()));
    std::fs::write(&bogus, "not a database, not even close: ".repeat(64)).unwrap();
    for named in [true, false] {
        let ctx = context("gemm.json");
        let mut notices: Vec<(i32, String)> = Vec::new();
        // SAFETY: valid handles; `notices` outlives the context.
        unsafe {
            if named {
                let path = c(bogus.to_str().unwrap());
                assert_eq!(pf_context_set_cache(ctx, path.as_ptr()), PF_OK);
            }
            let user = (&mut notices as *mut Vec<(i32, String)>).cast();
            assert_eq!(pf_context_set_log(ctx, Some(collect_notice), user), PF_OK);
            let r = compile_ok(ctx);
            let mut from_cache = -1;
            assert_eq!(pf_result_from_cache(r, &mut from_cache), PF_OK);
            assert_eq!(from_cache, 0);
            assert_eq!(pf_result_destroy(r), PF_OK);
            assert_eq!(pf_context_destroy(ctx), PF_OK);
        }
        if named {
            assert!(
                notices
                    .iter()
                    .any(|(level, m)| *level == PF_LOG_WARNING && m.contains("cache not used")),
                "{notices:?}"
            );
        } else {
            assert!(notices.is_empty(), "{notices:?}");
        }
    }
    let _ = std::fs::remove_file(&bogus);
    // SAFETY: any pointer value is accepted.
    assert_eq!(
        unsafe { pf_context_set_log(null_mut(), None, null_mut()) },
        PF_ERR_INVALID_HANDLE
    );
}

/// The library writes nothing to stderr or stdout (a framework's process
/// is not ours to write to): only the command-line program prints. Test
/// code is exempt.
#[test]
fn the_library_does_not_print() {
    let mut offenders = Vec::new();
    let mut stack = vec![Path::new(ROOT).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_str().unwrap();
            // The binary's own files (src/bin/) may print.
            let binary = path.starts_with(Path::new(ROOT).join("src/bin"));
            if !name.ends_with(".rs") || binary {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (k, line) in code.lines().enumerate() {
                let printing = [
                    "eprintln!",
                    "eprint!",
                    "println!",
                    "print!",
                    "stderr()",
                    "stdout()",
                ]
                .iter()
                .any(|p| {
                    line.match_indices(p).any(|(at, _)| {
                        !line[..at]
                            .chars()
                            .last()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    })
                });
                let exempt = line.trim_start().starts_with("//");
                if printing && !exempt {
                    offenders.push(format!("{}:{}: {}", path.display(), k + 1, line.trim()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn a_schedule_isl_does_not_finish_is_replaced_by_minimal_fusion() {
    // Without the timeout pf_compile would not return (isl's integer
    // lexicographic minimum runs for over 20 minutes); after 3 s the
    // compilation is redone with minimal fusion, as the command line does.
    let started = std::time::Instant::now();
    let tree = gqa_split_37_tree(None, Some(3));
    assert!(started.elapsed() >= std::time::Duration::from_secs(3));
    assert!(tree.starts_with("domain: "), "{tree}");
    assert_eq!(tree, gqa_split_37_tree(Some("min"), None));
    // A null context is refused as by every setter.
    // SAFETY: any pointer value is accepted.
    assert_eq!(
        unsafe { pf_context_set_schedule_timeout(null_mut(), 3) },
        PF_ERR_INVALID_HANDLE
    );
}

/// The dtypes after the first five keep their own numbers (5 to 9, after
/// the first five's 0 to 4) and their sizes in bytes.
#[test]
fn new_dtypes_have_their_codes_and_sizes() {
    let ctx = context("quant_fp8.json");
    let r = compile_ok(ctx);
    // SAFETY: valid handles and output places throughout.
    unsafe {
        let want = [
            ("A", PF_DTYPE_F8E4M3, 64 * 128),
            ("B", PF_DTYPE_F8E4M3, 128 * 96),
            ("Sa", PF_DTYPE_F32, 64 * 4),
            ("Sb", PF_DTYPE_F32, 96 * 4),
            ("Img", PF_DTYPE_U8, 64 * 96),
            ("Y", PF_DTYPE_F32, 64 * 96 * 4),
            ("Q", PF_DTYPE_F8E4M3, 64 * 96),
            ("Pos", PF_DTYPE_BOOL, 64 * 96),
        ];
        for (i, (name, dtype, bytes)) in want.into_iter().enumerate() {
            let mut n = null_mut();
            assert_eq!(pf_result_arg_name(r, i, &mut n), PF_OK);
            assert_eq!(take(n), name);
            let mut t = -1;
            assert_eq!(pf_result_arg_dtype(r, i, &mut t), PF_OK);
            assert_eq!(t, dtype, "{name}");
            let mut b = 0;
            assert_eq!(pf_result_arg_bytes(r, i, null(), 0, &mut b), PF_OK);
            assert_eq!(b, bytes, "{name}");
        }
        assert_eq!(
            [
                PF_DTYPE_I64,
                PF_DTYPE_U8,
                PF_DTYPE_BOOL,
                PF_DTYPE_F8E4M3,
                PF_DTYPE_F8E5M2
            ],
            [5, 6, 7, 8, 9]
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

/// Typed metadata in one call (issue 33, item 3): roles, types, extents
/// and sizes of every tensor argument as integers for the given
/// parameters, names valid while the result lives; parameters set by name.
#[test]
fn every_tensor_is_described_in_one_call() {
    let ctx = context("attention_decode_causal.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_param_value(ctx, c("KV").as_ptr(), 77), PF_OK);
        assert_eq!(
            pf_context_set_param_value(ctx, c("KV").as_ptr(), 0),
            PF_ERR_INPUT
        );
        // An unknown name: the message names the program's parameters and
        // no command-line option.
        assert_eq!(
            pf_context_set_param_value(ctx, c("KVX").as_ptr(), 5),
            PF_ERR_INPUT
        );
        let m = ctx_error(ctx);
        assert!(m.contains("no parameter `KVX`") && m.contains("KV"), "{m}");
        assert!(!m.contains("--param"), "{m}");
        let r = compile_ok(ctx);
        let mut count = 0usize;
        assert_eq!(
            pf_result_tensors(r, null(), 0, null_mut(), 0, &mut count),
            PF_OK
        );
        let mut infos = vec![std::mem::zeroed::<pf_tensor_info>(); count];
        let mut again = 0usize;
        assert_eq!(
            pf_result_tensors(r, null(), 0, infos.as_mut_ptr(), count, &mut again),
            PF_OK
        );
        assert_eq!(again, count);
        let by_name = |n: &str| {
            infos
                .iter()
                .find(|i| CStr::from_ptr(i.name).to_str().unwrap() == n)
                .unwrap_or_else(|| panic!("no tensor {n}"))
        };
        let (q, y, p) = (by_name("Q"), by_name("Y"), by_name("P"));
        assert_eq!(
            (q.role, y.role, p.role),
            (PF_ROLE_INPUT, PF_ROLE_OUTPUT, PF_ROLE_TEMP)
        );
        assert_eq!(q.dtype, PF_DTYPE_F16);
        assert_eq!(p.dtype, PF_DTYPE_F32);
        // P(b, h, i, j) over B=1, H=4, NQ=2, KV=77 (set by name).
        assert_eq!(p.rank, 4);
        assert_eq!(&p.extents[..5], &[1, 4, 2, 77, 0]);
        assert_eq!(p.bytes, 4 * 4 * 2 * 77);
        // The same as the one-field calls.
        for info in &infos {
            let mut role = -1;
            assert_eq!(pf_result_arg_role(r, info.arg_index, &mut role), PF_OK);
            assert_eq!(role, info.role);
            let mut bytes = 0usize;
            assert_eq!(
                pf_result_arg_bytes(r, info.arg_index, null(), 0, &mut bytes),
                PF_OK
            );
            assert_eq!(bytes, info.bytes);
            assert_eq!(
                take(pf_result_arg_name_string(r, info.arg_index)),
                CStr::from_ptr(info.name).to_str().unwrap()
            );
        }
        // A short array gets the first entries and the full count.
        let mut two = vec![std::mem::zeroed::<pf_tensor_info>(); 2];
        assert_eq!(
            pf_result_tensors(r, null(), 0, two.as_mut_ptr(), 2, &mut again),
            PF_OK
        );
        assert_eq!(again, count);
        assert_eq!(two[1].arg_index, infos[1].arg_index);
        assert_eq!(
            pf_result_tensors(r, null(), 0, null_mut(), 2, &mut again),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

/// `pf_result_arg_name` as an owned string pointer (for `take`).
unsafe fn pf_result_arg_name_string(r: *mut pf_result, index: usize) -> *mut c_char {
    let mut s = null_mut();
    // SAFETY: valid handle and output place.
    assert_eq!(unsafe { pf_result_arg_name(r, index, &mut s) }, PF_OK);
    s
}

/// The errors of the one-call metadata: a parameter argument has no role,
/// and a tensor of more than `PF_MAX_RANK` dimensions does not fit the
/// struct (its extents stay available one by one).
#[test]
fn metadata_refuses_what_it_cannot_describe() {
    let idx = ["a", "b", "c", "d", "e", "f", "g", "h", "i"].join(", ");
    let shape = ["2"; 9].join(", ");
    let json = format!(
        r#"{{"name": "nine", "params": {{"N": null}},
            "inputs": {{"X": {{"dtype": "f32", "shape": [{shape}]}}, "V": {{"dtype": "f32", "shape": ["N"]}}}},
            "outputs": {{"Y": {{"dtype": "f32", "shape": [{shape}]}}, "W": {{"dtype": "f32", "shape": ["N"]}}}},
            "body": ["Y({idx}) = X({idx}) * 2", "W(n) = V(n)"]}}"#
    );
    let mut ctx = null_mut();
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_create(&mut ctx), PF_OK);
        assert_eq!(pf_context_load_json(ctx, c(&json).as_ptr()), PF_OK);
        let r = compile_ok(ctx);
        let mut n = 0usize;
        assert_eq!(pf_result_num_args(r, &mut n), PF_OK);
        let param = (0..n)
            .find(|&i| {
                let mut kind = -1;
                pf_result_arg_kind(r, i, &mut kind);
                kind == PF_ARG_PARAM
            })
            .expect("N is an argument");
        let mut role = -1;
        assert_eq!(
            pf_result_arg_role(r, param, &mut role),
            PF_ERR_INVALID_ARGUMENT
        );
        let params = [5i64];
        let mut count = 0usize;
        assert_eq!(
            pf_result_tensors(r, params.as_ptr(), 1, null_mut(), 0, &mut count),
            PF_ERR_INVALID_ARGUMENT
        );
        let message = take(pf_result_error_message(r));
        assert!(message.contains("PF_MAX_RANK"), "{message}");
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

/// Every tensor of `r` for the given parameter values.
unsafe fn tensors_of(r: *const pf_result, params: &[i64]) -> Vec<pf_tensor_info> {
    let mut count = 0usize;
    // SAFETY: valid handle and output places; `infos` has `count` entries.
    unsafe {
        assert_eq!(
            pf_result_tensors(r, params.as_ptr(), params.len(), null_mut(), 0, &mut count),
            PF_OK
        );
        let mut infos = vec![std::mem::zeroed::<pf_tensor_info>(); count];
        assert_eq!(
            pf_result_tensors(
                r,
                params.as_ptr(),
                params.len(),
                infos.as_mut_ptr(),
                count,
                &mut count
            ),
            PF_OK
        );
        infos
    }
}

/// The workspace's size, and each temp's offset (-1: no memory), by name.
unsafe fn workspace_of(r: *const pf_result, params: &[i64]) -> (usize, Vec<(String, i64, usize)>) {
    // SAFETY: valid handle and output places.
    unsafe {
        let mut size = usize::MAX;
        assert_eq!(
            pf_result_workspace_size(r, params.as_ptr(), params.len(), &mut size),
            PF_OK
        );
        let mut temps = Vec::new();
        for t in tensors_of(r, params) {
            let mut offset = i64::MIN;
            let st = pf_result_arg_workspace_offset(
                r,
                t.arg_index,
                params.as_ptr(),
                params.len(),
                &mut offset,
            );
            if t.role == PF_ROLE_TEMP {
                assert_eq!(st, PF_OK);
                let name = CStr::from_ptr(t.name).to_str().unwrap().to_string();
                temps.push((name, offset, t.bytes));
            } else {
                assert_eq!(st, PF_ERR_INVALID_ARGUMENT);
                assert!(take(pf_result_error_message(r)).contains("not a temp"));
            }
        }
        (size, temps)
    }
}

#[test]
fn temps_no_kernel_touches_take_no_workspace() {
    // issue 33 item 2: causal attention's one kernel keeps every temp in
    // registers or never computes it (M_prev): the caller allocated 3.0 GiB
    // for them at B4 H16 S2048 D64. Now the workspace is empty.
    let ctx = context("attention_causal.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        let (size, temps) = workspace_of(r, &[]);
        assert_eq!(size, 0);
        assert!(temps.iter().any(|t| t.0 == "M_prev"), "{temps:?}");
        assert!(temps.iter().all(|t| t.1 == -1), "{temps:?}");
        // The per-tensor launch takes null for them (no driver here: the
        // launch gets as far as the driver); a null input is refused first.
        let infos = tensors_of(r, &[]);
        let mut ptrs: Vec<*mut std::ffi::c_void> = infos
            .iter()
            .map(|t| {
                if t.role == PF_ROLE_TEMP {
                    null_mut()
                } else {
                    std::ptr::without_provenance_mut(0x1000 * (t.arg_index + 1))
                }
            })
            .collect();
        if polyfuse::runtime::cuda::probe_driver().is_err() {
            assert_eq!(
                pf_result_launch(r, 0, null(), ptrs.as_mut_ptr(), null_mut()),
                PF_ERR_ENVIRONMENT
            );
        }
        ptrs[0] = null_mut();
        assert_eq!(
            pf_result_launch(r, 0, null(), ptrs.as_mut_ptr(), null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        let m = take(pf_result_error_message(r));
        assert!(m.contains("is null") && m.contains("Q"), "{m}");
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn the_workspace_holds_the_temps_kernels_touch_aligned_and_apart() {
    // softmax passes row maxima, exponentials and sums between kernels
    // through memory: each temp that some kernel touches has its place,
    // aligned, in argument order, none overlapping; the size covers them.
    let ctx = context("softmax.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        assert_eq!(pf_context_set_param_value(ctx, c("N").as_ptr(), 37), PF_OK);
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        let (size, temps) = workspace_of(r, &[]);
        let placed: Vec<&(String, i64, usize)> = temps.iter().filter(|t| t.1 >= 0).collect();
        assert!(!placed.is_empty(), "{temps:?}");
        let mut end = 0usize;
        for (name, offset, bytes) in &placed {
            let offset = *offset as usize;
            assert_eq!(offset % PF_WORKSPACE_ALIGN, 0, "{name}");
            assert!(offset >= end, "{name} overlaps the temp before it");
            end = offset + bytes;
        }
        assert!(
            size >= end && size < end + PF_WORKSPACE_ALIGN,
            "{size} {end}"
        );
        // A launch with the caller's inputs and outputs only checks the
        // workspace before it needs a driver: too small, misaligned.
        let mut io: Vec<*mut std::ffi::c_void> = tensors_of(r, &[])
            .iter()
            .filter(|t| t.role != PF_ROLE_TEMP)
            .map(|t| std::ptr::without_provenance_mut(0x10_0000 * (t.arg_index + 1)))
            .collect();
        assert_eq!(io.len(), 2);
        let ws = std::ptr::without_provenance_mut::<std::ffi::c_void>(0x4000_0000);
        assert_eq!(
            pf_result_launch_workspace(r, 0, null(), io.as_mut_ptr(), ws, size - 1, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(take(pf_result_error_message(r)).contains("pf_result_workspace_size"));
        let odd = std::ptr::without_provenance_mut::<std::ffi::c_void>(0x4000_0010);
        assert_eq!(
            pf_result_launch_workspace(r, 0, null(), io.as_mut_ptr(), odd, size, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(take(pf_result_error_message(r)).contains("aligned"));
        if polyfuse::runtime::cuda::probe_driver().is_err() {
            for w in [ws, null_mut()] {
                assert_eq!(
                    pf_result_launch_workspace(r, 0, null(), io.as_mut_ptr(), w, size, null_mut()),
                    PF_ERR_ENVIRONMENT
                );
            }
        }
        // Kernel 0 reads X (the row maxima): its pointer may not be null.
        io[0] = null_mut();
        assert_eq!(
            pf_result_launch_workspace(r, 0, null(), io.as_mut_ptr(), ws, size, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(take(pf_result_error_message(r)).contains("tensor X"));
        assert_eq!(
            pf_result_launch_workspace(r, 0, null(), null_mut(), ws, size, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn a_cpu_result_counts_every_temp_and_cannot_launch() {
    // The C function of a cpu result touches every tensor it is passed.
    let ctx = context("softmax.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        let r = compile_ok(ctx);
        let (size, temps) = workspace_of(r, &[]);
        assert_eq!(temps.len(), 3);
        assert!(temps.iter().all(|t| t.1 >= 0), "{temps:?}");
        let sum: usize = temps.iter().map(|t| t.2).sum();
        assert!(size >= sum, "{size} < {sum}");
        let mut io = [std::ptr::without_provenance_mut(0x1000); 2];
        assert_eq!(
            pf_result_launch_workspace(r, 0, null(), io.as_mut_ptr(), null_mut(), 0, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(take(pf_result_error_message(r)).contains("cpu target"));
        // A symbolic size: the workspace follows the values passed.
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
    let json = r#"{"name": "s", "params": {"N": null},
        "inputs": {"X": {"dtype": "f32", "shape": ["N"]}},
        "outputs": {"Y": {"dtype": "f32", "shape": ["N"]}},
        "temps": {"T": {"dtype": "f32", "shape": ["N"]}},
        "body": ["T(i) = X(i) * 2.0", "Y(i) = T(i) + 1.0"]}"#;
    // SAFETY: valid handles and output places throughout.
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(pf_context_create(&mut ctx), PF_OK);
        assert_eq!(pf_context_load_json(ctx, c(json).as_ptr()), PF_OK);
        let r = compile_ok(ctx);
        let (small, _) = workspace_of(r, &[10]);
        let (large, _) = workspace_of(r, &[1000]);
        assert_eq!((small, large), (40, 4000));
        let mut bytes = 0usize;
        assert_eq!(
            pf_result_workspace_size(r, null(), 0, &mut bytes),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            pf_result_workspace_size(r, [10i64].as_ptr(), 1, null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn the_tuning_cache_is_looked_up_for_the_named_device() {
    // issue 33 item 4: the cache was keyed by device 0's architecture
    // whatever the device. A device named with pf_context_set_device is
    // the one looked up; where its architecture cannot be told (no driver
    // here, or no such device), the cache is not used and the log says
    // why.
    let bogus =
        std::env::temp_dir().join(format!("polyfuse-device-cache-{}.db", std::process::id()));
    std::fs::write(&bogus, "not a database").unwrap();
    let ctx = context("gemm.json");
    let mut notices: Vec<(i32, String)> = Vec::new();
    // SAFETY: valid handles; `notices` outlives the context.
    unsafe {
        assert_eq!(pf_context_set_device(ctx, -2), PF_ERR_INPUT);
        assert!(ctx_error(ctx).contains("ordinal"));
        assert_eq!(pf_context_set_device(null_mut(), 0), PF_ERR_INVALID_HANDLE);
        assert_eq!(pf_context_set_device(ctx, -1), PF_OK);
        assert_eq!(pf_context_set_device(ctx, 4095), PF_OK);
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let path = c(bogus.to_str().unwrap());
        assert_eq!(pf_context_set_cache(ctx, path.as_ptr()), PF_OK);
        let user = (&mut notices as *mut Vec<(i32, String)>).cast();
        assert_eq!(pf_context_set_log(ctx, Some(collect_notice), user), PF_OK);
        if let Some(r) = compile_unless_environment(ctx) {
            assert_eq!(pf_result_destroy(r), PF_OK);
            assert_eq!(pf_context_destroy(ctx), PF_OK);
        }
    }
    let _ = std::fs::remove_file(&bogus);
    assert!(
        notices
            .iter()
            .any(|(level, m)| *level == PF_LOG_WARNING && m.contains("cache not used")),
        "{notices:?}"
    );
}

/// The artifact of `r` (`pf_result_save` with `archs`), or the status.
unsafe fn save(r: *const pf_result, archs: Option<&str>) -> Result<String, pf_status> {
    let archs = archs.map(c);
    let mut s = null_mut();
    // SAFETY: valid handle and output place; `archs` outlives the call.
    let st = unsafe { pf_result_save(r, archs.as_ref().map_or(null(), |a| a.as_ptr()), &mut s) };
    if st == PF_OK {
        Ok(take(s))
    } else {
        Err(st)
    }
}

/// A result loaded from `doc`.
unsafe fn load(doc: &str) -> *mut pf_result {
    let mut r = null_mut();
    // SAFETY: `doc` is `len` readable bytes; valid output place.
    let st = unsafe { pf_result_load(doc.as_ptr().cast(), doc.len(), &mut r) };
    assert_eq!(st, PF_OK, "{}", last_error());
    r
}

/// Everything a launcher reads from a cuda result, as text.
unsafe fn launch_description(r: *const pf_result) -> String {
    // SAFETY: valid handle and output places.
    unsafe {
        let mut out = string_of(r, pf_result_cuda_source);
        let mut n = 0;
        assert_eq!(pf_result_num_kernels(r, &mut n), PF_OK);
        for k in 0..n {
            let mut name = null_mut();
            assert_eq!(pf_result_kernel_name(r, k, &mut name), PF_OK);
            let (mut grid, mut block) = ([0u32; 3], [0u32; 3]);
            assert_eq!(
                pf_result_kernel_grid(r, k, null(), 0, grid.as_mut_ptr()),
                PF_OK
            );
            assert_eq!(pf_result_kernel_block(r, k, block.as_mut_ptr()), PF_OK);
            let (mut dynamic, mut stat, mut dep) = (0, 0, 0);
            assert_eq!(
                pf_result_kernel_shared_memory(r, k, &mut dynamic, &mut stat),
                PF_OK
            );
            assert_eq!(pf_result_kernel_dependent(r, k, &mut dep), PF_OK);
            out += &format!("\n{} {grid:?} {block:?} {dynamic} {stat} {dep}", take(name));
        }
        for t in tensors_of(r, &[]) {
            out += &format!(
                "\n{} {} {} {} {:?} {}",
                CStr::from_ptr(t.name).to_str().unwrap(),
                t.arg_index,
                t.role,
                t.dtype,
                &t.extents[..t.rank],
                t.bytes
            );
        }
        let (size, temps) = workspace_of(r, &[]);
        out += &format!("\nworkspace {size} {temps:?}");
        out += "\n";
        out += &string_of(r, pf_result_schedule_tree);
        out
    }
}

#[test]
fn a_saved_result_loads_back_without_compiling() {
    // issue 33 item 5: the first launch compiled (0.1 to 4 s) and nothing
    // could be kept. An artifact holds the compiled program; loading it
    // runs no isl, so it takes a fraction of the compilation.
    let ctx = context("attention_causal.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        assert_eq!(pf_context_set_param_value(ctx, c("S").as_ptr(), 96), PF_OK);
        let started = std::time::Instant::now();
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        let compile_time = started.elapsed();
        let doc = save(r, None).unwrap();
        let started = std::time::Instant::now();
        let back = load(&doc);
        let load_time = started.elapsed();
        assert!(
            load_time * 3 < compile_time,
            "loading took {load_time:?}, compiling {compile_time:?}"
        );
        assert_eq!(launch_description(back), launch_description(r));
        // The sizes set on the context came along (S = 96).
        assert!(launch_description(back).contains("[2, 2, 96, 16]"));
        let mut from_cache = -1;
        assert_eq!(pf_result_from_cache(back, &mut from_cache), PF_OK);
        assert_eq!(from_cache, 3);
        // Saving the loaded result writes the same document.
        assert_eq!(save(back, None).unwrap(), doc);
        // PTX needs NVRTC: here either it is found and stored under the
        // architecture the launch looks up, or the error says it is not.
        match save(r, Some("sm_90")) {
            Ok(with_ptx) => {
                let v: serde_json::Value = serde_json::from_str(&with_ptx).unwrap();
                let ptx = v["ptx"].as_object().unwrap();
                assert_eq!(ptx.keys().collect::<Vec<_>>(), ["sm_90a"]);
                assert!(ptx["sm_90a"].as_str().unwrap().contains(".entry"));
                let loaded = load(&with_ptx);
                assert_eq!(launch_description(loaded), launch_description(r));
                assert_eq!(pf_result_destroy(loaded), PF_OK);
            }
            Err(st) => {
                assert_eq!(st, PF_ERR_ENVIRONMENT);
                assert!(take(pf_result_error_message(r)).contains("NVRTC"));
            }
        }
        assert_eq!(save(r, Some("compute_90")), Err(PF_ERR_INPUT));
        // Without a driver the loaded result's launch fails cleanly too.
        if polyfuse::runtime::cuda::probe_driver().is_err() {
            let mut ptrs = [std::ptr::without_provenance_mut(0x1000); 4];
            assert_eq!(
                pf_result_launch_workspace(
                    back,
                    0,
                    null(),
                    ptrs.as_mut_ptr(),
                    null_mut(),
                    0,
                    null_mut()
                ),
                PF_ERR_ENVIRONMENT
            );
        }
        assert_eq!(pf_result_destroy(back), PF_OK);
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn artifacts_keep_symbolic_sizes_and_cpu_results() {
    let json = r#"{"name": "s", "params": {"N": null},
        "inputs": {"X": {"dtype": "f32", "shape": ["N"]}},
        "outputs": {"Y": {"dtype": "f32", "shape": ["N"]}},
        "temps": {"T": {"dtype": "f32", "shape": ["N"]}},
        "body": ["T(i) = X(i) * 2.0", "Y(i) = T(i) + 1.0"]}"#;
    // SAFETY: valid handles and output places throughout.
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(pf_context_create(&mut ctx), PF_OK);
        assert_eq!(
            pf_context_load_json_n(ctx, json.as_ptr().cast(), json.len()),
            PF_OK
        );
        let r = compile_ok(ctx);
        // A cpu result has no CUDA to make PTX of.
        assert_eq!(save(r, Some("sm_90")), Err(PF_ERR_INVALID_ARGUMENT));
        let back = load(&save(r, Some("")).unwrap());
        assert_eq!(string_of(back, pf_result_target), "cpu");
        assert_eq!(
            string_of(back, pf_result_c_source),
            string_of(r, pf_result_c_source)
        );
        let mut n = 0;
        assert_eq!(pf_result_num_params(back, &mut n), PF_OK);
        assert_eq!(n, 1);
        assert_eq!(workspace_of(back, &[1000]).0, 4000);
        assert_eq!(pf_result_destroy(back), PF_OK);
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}

#[test]
fn what_is_no_artifact_is_refused() {
    // SAFETY: the texts are readable for their lengths; output places valid.
    unsafe {
        let mut r = null_mut();
        for (doc, why) in [
            ("{", "not valid JSON"),
            (r#"{"polyfuse_artifact": 7}"#, "version 7"),
            (r#"{"name": "gemm"}"#, "no polyfuse_artifact"),
        ] {
            assert_eq!(
                pf_result_load(doc.as_ptr().cast(), doc.len(), &mut r),
                PF_ERR_INPUT
            );
            assert!(last_error().contains(why), "{doc}");
            assert!(r.is_null());
        }
        let doc = "{}";
        assert_eq!(
            pf_result_load(doc.as_ptr().cast(), doc.len(), null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(pf_result_load(null(), 4, &mut r), PF_ERR_INVALID_ARGUMENT);
        assert_eq!(
            pf_result_save(null(), null(), &mut null_mut()),
            PF_ERR_INVALID_HANDLE
        );
    }
}

#[test]
fn the_command_line_writes_artifacts_the_abi_loads() {
    let bin = env!("CARGO_BIN_EXE_polyfuse");
    let file = format!("{ROOT}/examples/gemm.json");
    let run = |args: &[&str]| {
        let out = Command::new(bin).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let common = ["--param", "M=33", "--no-cache"];
    let doc = run(&[
        &["schedule", &file, "--emit", "artifact", "--arch", "none"],
        &common[..],
    ]
    .concat());
    let cuda = run(&[&["schedule", &file, "--emit", "cuda"], &common[..]].concat());
    // SAFETY: valid handles and output places.
    unsafe {
        let r = load(&doc);
        assert_eq!(string_of(r, pf_result_target), "cuda");
        assert_eq!(string_of(r, pf_result_cuda_source), cuda);
        let infos = tensors_of(r, &[]);
        assert_eq!(infos[0].extents[0], 33);
        assert_eq!(pf_result_destroy(r), PF_OK);
    }
}

#[test]
fn kernels_in_a_host_loop_are_launched_by_launch_all() {
    // rnn's step runs on a host loop (schedule::host): its kernels take the
    // loop's iterator (an argument of kind PF_ARG_STEP), which only
    // pf_result_launch_all supplies; pf_result_launch refuses them before
    // it touches a driver.
    let ctx = context("rnn.json");
    // SAFETY: valid handles and output places throughout.
    unsafe {
        assert_eq!(pf_context_set_target(ctx, c("cuda").as_ptr()), PF_OK);
        let Some(r) = compile_unless_environment(ctx) else {
            return;
        };
        let mut n = 0;
        assert_eq!(pf_result_num_args(r, &mut n), PF_OK);
        let mut kind = PF_ARG_TENSOR;
        assert_eq!(pf_result_arg_kind(r, n - 1, &mut kind), PF_OK);
        assert_eq!(kind, PF_ARG_STEP);
        let mut name = null_mut();
        assert_eq!(pf_result_arg_name(r, n - 1, &mut name), PF_OK);
        assert_eq!(take(name), "c0");
        let mut ptrs = [null_mut(); 6];
        // Kernel 1 is the step's product, inside the loop.
        assert_eq!(
            pf_result_launch(r, 1, null(), ptrs.as_mut_ptr(), null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        assert!(take(pf_result_error_message(r)).contains("pf_result_launch_all"));
        // Null pointers for tensors the kernels touch are refused before
        // the driver; with pointers, the launches get as far as the driver.
        assert_eq!(
            pf_result_launch_all(r, null(), ptrs.as_mut_ptr(), null_mut()),
            PF_ERR_INVALID_ARGUMENT
        );
        let mut ptrs: Vec<*mut std::ffi::c_void> = (0..6)
            .map(|i| std::ptr::without_provenance_mut(0x1000 * (i + 1)))
            .collect();
        if polyfuse::runtime::cuda::probe_driver().is_err() {
            assert_eq!(
                pf_result_launch_all(r, null(), ptrs.as_mut_ptr(), null_mut()),
                PF_ERR_ENVIRONMENT
            );
        }
        assert_eq!(pf_result_destroy(r), PF_OK);
        assert_eq!(pf_context_destroy(ctx), PF_OK);
    }
}
