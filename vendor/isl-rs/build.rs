//! Builds the static library libisl from the isl 0.27 sources in `isl/`
//! with the `cc` crate: no autotools, no make.
//!
//! What isl's `./configure --with-int=imath-32 && make` would do:
//!
//! - the sources are Makefile.am's `libisl_la_SOURCES` with `MP_SRC` for
//!   IMath with the small-integer optimisation (`isl_imath.c`,
//!   `imath_wrap/*.c`, `isl_int_sioimath.c`, `isl_val_sioimath.c`); the
//!   other `.c` files in `isl/` are templates that these include;
//! - `isl/isl_config.h`, `isl/gitversion.h` and `isl/include/isl/stdint.h`
//!   are the files configure and make generate, checked in (see README.md);
//!   `isl_config.h` defines `USE_IMATH_FOR_MP` and `USE_SMALL_INT_OPT`;
//! - the include path, `-DHAVE_CONFIG_H` and `-std=gnu99` are configure's;
//!   the optimisation is `-O3`, as configure chose, whatever the Rust
//!   profile. Configure's other flags (`-march=` of the building machine,
//!   `-ffast-math`, `-malign-double`) are left out: the first makes a
//!   library that may not run on another machine, the other two change
//!   floating-point results and the i386 ABI, and none makes isl faster.

use std::path::Path;

/// Makefile.am's `libisl_la_SOURCES` (the `.c` files, in its order), with
/// `MP_SRC` for `--with-int=imath-32` first.
const SOURCES: &[&str] = &[
    // MP_SRC: IMath, wrapped so that its symbols carry an isl_ prefix, and
    // isl_int as a 32-bit integer that overflows into an IMath value.
    "isl_imath.c",
    "imath_wrap/gmp_compat.c",
    "imath_wrap/imath.c",
    "imath_wrap/imrat.c",
    "isl_int_sioimath.c",
    "isl_val_sioimath.c",
    // The rest of libisl_la_SOURCES.
    "isl_aff.c",
    "isl_aff_map.c",
    "isl_affine_hull.c",
    "isl_arg.c",
    "isl_ast.c",
    "isl_ast_build.c",
    "isl_ast_build_expr.c",
    "isl_ast_codegen.c",
    "isl_ast_graft.c",
    "basis_reduction_tab.c",
    "isl_bernstein.c",
    "isl_blk.c",
    "isl_bound.c",
    "isl_box.c",
    "isl_coalesce.c",
    "isl_constraint.c",
    "isl_convex_hull.c",
    "isl_ctx.c",
    "isl_deprecated.c",
    "isl_dim_map.c",
    "isl_equalities.c",
    "isl_factorization.c",
    "isl_farkas.c",
    "isl_ffs.c",
    "isl_flow.c",
    "isl_fold.c",
    "isl_hash.c",
    "isl_id_to_ast_expr.c",
    "isl_id_to_id.c",
    "isl_id_to_pw_aff.c",
    "isl_ilp.c",
    "isl_input.c",
    "isl_local.c",
    "isl_local_space.c",
    "isl_lp.c",
    "isl_map.c",
    "isl_map_list.c",
    "isl_map_simplify.c",
    "isl_map_subtract.c",
    "isl_map_to_basic_set.c",
    "isl_mat.c",
    "isl_morph.c",
    "isl_id.c",
    "isl_obj.c",
    "isl_options.c",
    "isl_output.c",
    "isl_point.c",
    "isl_polynomial.c",
    "isl_printer.c",
    "print.c",
    "isl_range.c",
    "isl_reordering.c",
    "isl_sample.c",
    "isl_scan.c",
    "isl_schedule.c",
    "isl_schedule_band.c",
    "isl_schedule_node.c",
    "isl_schedule_read.c",
    "isl_schedule_tree.c",
    "isl_schedule_constraints.c",
    "isl_scheduler.c",
    "isl_scheduler_clustering.c",
    "isl_scheduler_scc.c",
    "isl_set_list.c",
    "isl_sort.c",
    "isl_space.c",
    "isl_stream.c",
    "isl_seq.c",
    "isl_set_to_ast_graft_list.c",
    "isl_stride.c",
    "isl_tab.c",
    "isl_tab_pip.c",
    "isl_tarjan.c",
    "isl_transitive_closure.c",
    "isl_union_map.c",
    "isl_val.c",
    "isl_vec.c",
    "isl_version.c",
    "isl_vertices.c",
];

fn main() {
    let isl = Path::new("isl");
    println!("cargo:rerun-if-changed=build.rs");
    // Cargo compares the newest modification time under a folder.
    println!("cargo:rerun-if-changed=isl");

    cc::Build::new()
        .files(SOURCES.iter().map(|s| isl.join(s)))
        // configure's `-I. -I$(srcdir) -I$(srcdir)/include -Iinclude/
        // -I./imath_wrap` and `-DHAVE_CONFIG_H`.
        .include(isl)
        .include(isl.join("include"))
        .include(isl.join("imath_wrap"))
        .define("HAVE_CONFIG_H", None)
        .std("gnu99")
        // isl's speed is polyfuse's: `-O3` even in a debug build, and no
        // frame pointers (configure's -fomit-frame-pointer), which cc
        // would otherwise keep whenever it emits debug information.
        .opt_level(3)
        .force_frame_pointer(false)
        // isl's code is not ours to fix: no warnings in cargo's output.
        .warnings(false)
        .extra_warnings(false)
        .cargo_warnings(false)
        // Emits rustc-link-lib=static=isl and the search path.
        .compile("isl");

    // For build scripts of crates that depend on this one
    // (DEP_ISL_INCLUDE): isl's public C headers.
    let include = std::env::current_dir()
        .expect("current directory")
        .join(isl)
        .join("include");
    println!("cargo:include={}", include.display());
}
