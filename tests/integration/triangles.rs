//! Products over a triangular output (syrk, syr2k, covariance; issue 32):
//! the diagonal tiles of the register tile run every slot of their box, a
//! slot beyond the triangle's bound clamped onto it and writing its own
//! dead register (`gpu::registers::closed`, `codegen::cuda`'s
//! `closed_clamp`), where the gpu stage proves the register dead.
//! Generated programs: lower and upper triangles, strict or not, shifted
//! off the diagonal, accumulated in place, in a temp with an epilogue into
//! another tensor, or through a cast; executed in the emulation against
//! the f64 reference at sizes off the tile grid. And the cases the clamp
//! must leave alone: two statements on the two triangles of one
//! accumulator, and a triangle in the reduction index.

use std::collections::HashSet;

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::load_str;
use polyfuse::gpu::mapping::{self, KernelBody};
use polyfuse::gpu::GpuOptions;
use polyfuse::isl::Isl;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::schedule::Strategy;
use polyfuse::{compile, deps, model, schedule, Compiled, Options};

/// For each register tile of `p`'s mapping (isl's schedule, tiles chosen
/// by the mapping): the statements that touch its tensor, and those the
/// gpu stage lets run beyond their slot loops' bounds
/// (`RegisterTile::slot_closed`).
fn register_tiles(p: &Program, strategy: Strategy) -> Vec<(HashSet<String>, HashSet<String>)> {
    let isl = Isl::new();
    let scop = model::build(&isl, p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    let sched = schedule::compute(&isl, &scop, &d, strategy).unwrap();
    let opts = GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    };
    let (_, plans) = mapping::map(&isl, p, &scop, &d, sched, &[32], &opts).unwrap();
    plans
        .iter()
        .filter_map(|k| match &k.body {
            KernelBody::Threads(t) => t.registers.as_ref().map(|r| r.tile()),
            _ => None,
        })
        .map(|r| {
            let touching = r.accesses.iter().map(|(s, _)| s.clone()).collect();
            (touching, r.slot_closed.clone())
        })
        .collect()
}

fn gpu() -> Options {
    Options {
        gpu: Some(GpuOptions {
            auto_tile: true,
            ..GpuOptions::default()
        }),
        ..Options::default()
    }
}

/// How a generated triangle's sum reaches its output.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// `C(i, j) = C0(i, j); C(i, j) += A(i, k) * A(j, k)`.
    InPlace,
    /// `T(i, j) +=! A(i, k) * B(j, k); C(i, j) = tanh(T(i, j)) + C0(i, j)`.
    TempEpilogue,
    /// `C(i, j) +=! f32(f64(A(i, k)) * f64(A(j, k)))`.
    Cast,
}

/// A product over the triangle `cond` of an `N x N` output with
/// reduction length `M`, the rest of the output copied from `C0`.
fn triangle(cond: &str, other: &str, form: Form, n: i64, m: i64) -> Program {
    let body = match form {
        Form::InPlace => vec![
            format!("C(i, j) = C0(i, j) where {cond}"),
            format!("C(i, j) += A(i, k) * A(j, k) where {cond}"),
        ],
        Form::TempEpilogue => vec![
            format!("T(i, j) +=! A(i, k) * B(j, k) where {cond}"),
            format!("C(i, j) = tanh(T(i, j)) + C0(i, j) where {cond}"),
        ],
        Form::Cast => vec![format!(
            "C(i, j) +=! f32(f64(A(i, k)) * f64(A(j, k))) where {cond}"
        )],
    };
    let mut body: Vec<String> = body.into_iter().map(|s| format!("\"{s}\"")).collect();
    body.push(format!("\"C(i, j) = C0(i, j) where {other}\""));
    let temps = match form {
        Form::TempEpilogue => r#", "temps": {"T": {"dtype": "f32", "shape": ["N", "N"]}}"#,
        _ => "",
    };
    let json = format!(
        r#"{{"name": "triangle", "params": {{"N": {n}, "M": {m}}},
        "inputs": {{"A": {{"dtype": "f32", "shape": ["N", "M"]}},
                   "B": {{"dtype": "f32", "shape": ["N", "M"]}},
                   "C0": {{"dtype": "f32", "shape": ["N", "N"]}}}},
        "outputs": {{"C": {{"dtype": "f32", "shape": ["N", "N"]}}}}{temps},
        "body": [{}]}}"#,
        body.join(", ")
    );
    load_str(&json, "triangle.json").unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// Runs `c`'s GPU mapping in the emulation against the f64 reference.
fn check_in_emulation(mut c: Compiled, what: &str) {
    c.kernel_c = c.emulation_c.clone().unwrap();
    let out = run(
        &c,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed: 11,
        },
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let check = out.check.unwrap();
    assert!(check.ok, "{what}: {}", check.line());
}

/// The lines of the register updates of the CUDA (`pf_reg_.. = pf_reg_..`
/// or a plain store of a register), with the test right above each.
fn updates_and_tests(cuda: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = cuda.lines().collect();
    (0..lines.len())
        .filter(|&i| {
            let l = lines[i].trim_start();
            l.contains("pf_reg_kernel_") && l.contains("[pf_ry][pf_rx] = ") && l.contains("t_A")
                || l.starts_with("pf_reg_kernel_")
                    && l.contains("[pf_ry][pf_rx] = ")
                    && l.contains("pf_shared_kernel_")
        })
        .map(|i| {
            let above = lines[..i]
                .iter()
                .rev()
                .find(|l| l.trim_start().starts_with("if ("))
                .map_or(String::new(), |l| l.trim().to_string());
            (lines[i].trim().to_string(), above)
        })
        .collect()
}

/// Whether the diagonal tiles of `cuda` run every slot: no register
/// update tests its slot against the triangle (the slots beyond it are
/// moved onto its bound, or the whole box runs: `codegen::cuda::box_reads`).
fn runs_every_slot(cuda: &str) -> bool {
    let updates = updates_and_tests(cuda);
    !updates.is_empty()
        && updates.iter().all(|(_, test)| {
            !(test.contains("pf_slot_c5") || test.contains("(c5 <=") || test.contains("(c5 >="))
        })
}

/// Every generated triangle computes what the reference computes; where
/// the triangle bounds one slot by the other (all but the strict and
/// shifted forms isl may print otherwise), the diagonal tiles run every
/// slot instead of testing it (`runs_every_slot`), and no update tests
/// `c5` against the triangle.
#[test]
fn triangles_run_every_slot_of_the_diagonal_tiles_and_check() {
    let cases = [
        ("j <= i", "j > i"),
        ("j >= i", "j < i"),
        ("j < i", "j >= i"),
        ("j > i", "j <= i"),
        ("j <= i + 3", "j > i + 3"),
        ("j >= i - 5", "j < i - 5"),
    ];
    let mut clamped = 0;
    for (k, (cond, other)) in cases.iter().enumerate() {
        for form in [Form::InPlace, Form::TempEpilogue, Form::Cast] {
            // Sizes off the 64 and 32 tiles, different for each case.
            let n = 200 + 7 * k as i64;
            let m = 37 + k as i64;
            let what = format!("{cond} ({form:?}) at N = {n}, M = {m}");
            let c = compile(&triangle(cond, other, form, n, m), &gpu())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let cuda = c.cuda.as_ref().unwrap().source.clone();
            if runs_every_slot(&cuda) {
                clamped += 1;
            }
            check_in_emulation(c, &what);
        }
    }
    // The plain triangles of every form run every slot (in place, a temp
    // and a cast, lower and upper).
    assert!(
        clamped >= 6,
        "only {clamped} generated triangles run every slot"
    );
}

/// A triangle's sum into an accumulator the tile also holds beyond the
/// triangle (an initialisation of the whole square): the slots beyond the
/// triangle's bound are live registers, so the gpu stage does not let the
/// sum run there (the initialisation of every slot may); the result
/// checks.
#[test]
fn a_triangle_inside_a_live_square_keeps_its_tests() {
    for (cond, strategy) in [("j <= i", Strategy::Isl), ("j >= i", Strategy::Max)] {
        let json = format!(
            r#"{{"name": "square", "params": {{"N": 203, "M": 41}},
            "inputs": {{"A": {{"dtype": "f32", "shape": ["N", "M"]}},
                       "C0": {{"dtype": "f32", "shape": ["N", "N"]}}}},
            "outputs": {{"C": {{"dtype": "f32", "shape": ["N", "N"]}}}},
            "body": ["C(i, j) = C0(i, j)",
                     "C(i, j) += A(i, k) * A(j, k) where {cond}"]}}"#
        );
        let p = load_str(&json, "square.json").unwrap();
        let tiles = register_tiles(&p, strategy);
        let both: Vec<_> = tiles
            .iter()
            .filter(|(touching, _)| touching.contains("S0") && touching.contains("S1"))
            .collect();
        assert!(!both.is_empty(), "{cond}: no tile holds both: {tiles:?}");
        for (_, closed) in both {
            assert!(!closed.contains("S1"), "{cond}: {closed:?}");
        }
        let options = Options { strategy, ..gpu() };
        check_in_emulation(compile(&p, &options).unwrap(), cond);
    }
}

/// The product of a single triangle is closed (its slots are the tile's
/// live slots at every step): the positive counterpart of the cases above,
/// on the gpu stage's own data.
#[test]
fn a_single_triangles_product_is_closed() {
    let p = triangle("j <= i", "j > i", Form::InPlace, 203, 41);
    let tiles = register_tiles(&p, Strategy::Isl);
    assert!(
        tiles.iter().any(|(_, closed)| closed.contains("S1")),
        "{tiles:?}"
    );
}

/// A triangle in the reduction index (`k < i`, symm's): a slot row runs
/// at some steps and not at others, so where its bound fails its register
/// is live: the gpu stage does not let the product run beyond its bound,
/// and the result checks.
#[test]
fn a_triangle_in_the_reduction_index_is_not_clamped() {
    for cond in ["k < i", "k > i"] {
        let json = format!(
            r#"{{"name": "ktri", "params": {{"M": 203, "N": 150}},
            "inputs": {{"A": {{"dtype": "f32", "shape": ["M", "M"]}},
                       "B": {{"dtype": "f32", "shape": ["M", "N"]}}}},
            "outputs": {{"C": {{"dtype": "f32", "shape": ["M", "N"]}}}},
            "body": ["C(i, j) = B(i, j)",
                     "C(i, j) += A(i, k) * B(k, j) where {cond}"]}}"#
        );
        let p = load_str(&json, "ktri.json").unwrap();
        let tiles = register_tiles(&p, Strategy::Isl);
        assert!(
            tiles.iter().any(|(touching, _)| touching.contains("S1")),
            "{cond}: no register tile: {tiles:?}"
        );
        for (_, closed) in &tiles {
            assert!(!closed.contains("S1"), "{cond}: {closed:?}");
        }
        check_in_emulation(compile(&p, &gpu()).unwrap(), cond);
    }
}

/// The block axes each kernel with a register tile starts at its last
/// tile (`KernelPlan::reversed`, `gpu::block_order`).
fn reversed_axes(p: &Program) -> Vec<[bool; 3]> {
    let isl = Isl::new();
    let scop = model::build(&isl, p).unwrap();
    let order = schedule::canonical(&isl, &scop).unwrap();
    let d = deps::compute(&scop, &order).unwrap();
    let sched = schedule::compute(&isl, &scop, &d, Strategy::Isl).unwrap();
    let opts = GpuOptions {
        auto_tile: true,
        ..GpuOptions::default()
    };
    let (_, plans) = mapping::map(&isl, p, &scop, &d, sched, &[32], &opts).unwrap();
    plans
        .iter()
        .filter(|k| matches!(&k.body, KernelBody::Threads(t) if t.registers.is_some()))
        .map(|k| k.reversed)
        .collect()
}

/// Generated triangles in the reduction index, whose blocks' work grows
/// or shrinks along the rows: the rows' axis (y) starts at the last tile
/// exactly where a row tile further down runs more steps (`k < i`, `k <=
/// i + 5`: symm's lower product), never where it runs fewer (`k > i`, `k
/// < M - i`) or as many (a plain product, whose last tile is cut short);
/// every one checks in the emulation, whose three blocks stride over
/// the tiles in the reversed order too.
#[test]
fn blocks_whose_work_grows_along_an_axis_start_at_its_last_tile() {
    let cases = [
        ("k < i", true),
        ("k <= i + 5", true),
        ("k > i", false),
        ("k < M - i", false),
        ("k >= 0", false),
    ];
    for (n, (cond, heavier_last)) in cases.iter().enumerate() {
        // Three or more row tiles of 128, off the grid.
        let (m, cols) = (301 + 13 * n as i64, 150 + 7 * n as i64);
        let json = format!(
            r#"{{"name": "ktri", "params": {{"M": {m}, "N": {cols}}},
            "inputs": {{"A": {{"dtype": "f32", "shape": ["M", "M"]}},
                       "B": {{"dtype": "f32", "shape": ["M", "N"]}}}},
            "outputs": {{"C": {{"dtype": "f32", "shape": ["M", "N"]}}}},
            "body": ["C(i, j) = B(i, j)",
                     "C(i, j) += A(i, k) * B(k, j) where {cond}"]}}"#
        );
        let p = load_str(&json, "ktri.json").unwrap();
        let axes = reversed_axes(&p);
        assert!(!axes.is_empty(), "{cond}: no register tile");
        for a in &axes {
            assert_eq!(a[1], *heavier_last, "{cond} at M = {m}: reversed {a:?}");
            assert!(!a[0] && !a[2], "{cond}: columns reversed {a:?}");
        }
        let c = compile(&p, &gpu()).unwrap();
        let cuda = c.cuda.as_ref().unwrap().source.clone();
        assert_eq!(
            cuda.contains("(pf_i)gridDim.y - 1 - (pf_i)blockIdx.y"),
            *heavier_last,
            "{cond}"
        );
        check_in_emulation(c, cond);
    }
}
