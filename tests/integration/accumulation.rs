//! How tensor-core sums reach their f32 accumulators
//! (`gpu::contraction::Accumulation`): a contraction whose stored value is
//! f32 adds each run's sums (at most `4 sqrt(k)` of k, at least 64) to its
//! accumulators in IEEE f32 (promoted);
//! one whose value is rounded to f16 or bf16 before it is stored chains
//! them in the tensor cores. Generated programs over the forms a
//! contraction takes (output dtype, an f32 temp accumulator moved into
//! another tensor by an epilogue, two products summed into one
//! accumulator, f16 and bf16 operands), on both engines, each checked in
//! the CPU emulation at sizes off the tile grid.

use polyfuse::frontend::ast::Program;
use polyfuse::frontend::load_str;
use polyfuse::gpu::GpuOptions;
use polyfuse::runtime::cpu::{run, RunOptions};
use polyfuse::runtime::data::CheckResult;
use polyfuse::{compile, Options};

/// One generated contraction: its name, whether its stored value is f32,
/// and the program at sizes `m`, `n`, `k`.
struct Case {
    name: String,
    stored_f32: bool,
    json: String,
}

/// The forms, for operand type `op` (f16 or bf16).
fn cases(op: &str, m: i64, n: i64, k: i64) -> Vec<Case> {
    let header = |name: &str, outputs: &str, temps: &str, body: &str| -> String {
        format!(
            r#"{{ "name": "{name}", "params": {{"M": {m}, "N": {n}, "K": {k}}},
  "inputs": {{ "A": {{"dtype": "{op}", "shape": ["M", "K"]}}, "B": {{"dtype": "{op}", "shape": ["K", "N"]}},
              "A2": {{"dtype": "{op}", "shape": ["M", "K"]}}, "B2": {{"dtype": "{op}", "shape": ["K", "N"]}},
              "bias": {{"dtype": "f32", "shape": ["N"]}} }},
  "outputs": {{ {outputs} }}, "temps": {{ {temps} }},
  "body": [ {body} ] }}"#
        )
    };
    let mut v = Vec::new();
    for out in ["f32", op] {
        v.push(Case {
            name: format!("{op} product into {out}"),
            stored_f32: out == "f32",
            json: header(
                "product",
                &format!(r#""C": {{"dtype": "{out}", "shape": ["M", "N"]}}"#),
                "",
                r#""C(i, j) +=! A(i, k) * B(k, j)""#,
            ),
        });
        // An f32 temp accumulator and an epilogue into another tensor: the
        // stored value is the epilogue's, of the output's dtype.
        let cast = if out == "f32" { "" } else { out };
        v.push(Case {
            name: format!("{op} product in an f32 temp, tanh epilogue into {out}"),
            stored_f32: out == "f32",
            json: header(
                "epilogue",
                &format!(r#""D": {{"dtype": "{out}", "shape": ["M", "N"]}}"#),
                r#""acc": {"dtype": "f32", "shape": ["M", "N"]}"#,
                &format!(
                    r#""acc(i, j) +=! f32(A(i, k)) * f32(B(k, j))", "D(i, j) = {cast}(tanh(acc(i, j) + bias(j)))""#
                ),
            ),
        });
    }
    // Two products summed into one f32 accumulator that is stored (an
    // LSTM cell's gates).
    v.push(Case {
        name: format!("two {op} products into one f32 accumulator"),
        stored_f32: true,
        json: header(
            "two_terms",
            r#""G": {"dtype": "f32", "shape": ["M", "N"]}"#,
            "",
            r#""G(i, j) +=! A(i, k) * B(k, j)", "G(i, j) += A2(i, k) * B2(k, j)""#,
        ),
    });
    v
}

/// The GPU with tile sizes `tile`, or (empty) chosen per kernel as the
/// command line chooses them.
fn options(tile: &[i64]) -> Options {
    Options {
        tile: if tile.is_empty() {
            vec![32]
        } else {
            tile.to_vec()
        },
        gpu: Some(GpuOptions {
            auto_tile: tile.is_empty(),
            ..GpuOptions::default()
        }),
        ..Options::default()
    }
}

fn load(case: &Case) -> Program {
    load_str(&case.json, "generated.json").unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

/// Runs the CPU emulation of `c`'s GPU mapping on inputs from `seed` and
/// returns its check against the f64 reference.
fn emulation_check(mut c: polyfuse::Compiled, seed: u64) -> CheckResult {
    c.kernel_c = c.emulation_c.clone().unwrap();
    let r = run(
        &c,
        &RunOptions {
            check: true,
            bench_runs: 0,
            seed,
        },
    )
    .unwrap();
    r.check.unwrap()
}

/// Compiles `case` with `tile`, checks its emulation against the f64
/// reference and returns the CUDA source.
fn emulated(case: &Case, tile: &[i64]) -> String {
    let c = compile(&load(case), &options(tile))
        .unwrap_or_else(|e| panic!("{} {tile:?}: {e}", case.name));
    let source = c.cuda.as_ref().unwrap().source.clone();
    let check = emulation_check(c, 11);
    assert!(check.ok, "{} {tile:?}: {}", case.name, check.line());
    source
}

#[test]
fn f32_stores_add_each_runs_sums_in_ieee_f32_on_both_engines() {
    // k = 1100: runs of 128 of k (two k tiles of 64, four of 32) end eight
    // times in the middle and once at the block's last, partial, tile.
    for op in ["f16", "bf16"] {
        for case in cases(op, 70, 83, 1100) {
            // wgmma: a run's groups into `pf_step` from zero (scale-d 0),
            // waited for and added; mma.sync: a run's instructions into
            // `pf_step`, zeroed at its start, added at its end.
            let wg = emulated(&case, &[64, 64, 64]);
            assert!(wg.contains("wgmma.mma_async"), "{}", case.name);
            assert_eq!(
                wg.contains("pf_acc[pf_mt][pf_nt][pf_r] += pf_step[pf_mt][pf_nt][pf_r];"),
                case.stored_f32,
                "{}: wgmma promoted",
                case.name
            );
            assert_eq!(
                wg.contains(
                    "&pf_step[0][0][0], pf_da, pf_db, !((pf_kt - pf_kb) % 128 == 0) || pf_ks > 0);"
                ),
                case.stored_f32,
                "{}: a run's first wgmma starts from zero",
                case.name
            );
            let sync = emulated(&case, &[32, 32, 32]);
            assert!(!sync.contains("wgmma.mma_async"), "{}", case.name);
            assert_eq!(
                sync.contains("pf_mma_f16(pf_step[pf_mt][pf_nt],")
                    || sync.contains("pf_mma_bf16(pf_step[pf_mt][pf_nt],"),
                case.stored_f32,
                "{}: mma.sync promoted",
                case.name
            );
            assert_eq!(
                sync.contains("if ((pf_kt - pf_kb + 32) % 128 == 0 || pf_kt + 32 >= pf_ke)"),
                case.stored_f32,
                "{}: mma.sync's run ends every 128 of k",
                case.name
            );
        }
    }
}

#[test]
fn promoted_runs_cross_the_pipelines_rounds_and_end_with_the_blocks_k_range() {
    // Three stages (64 x 64 x 32 tiles unsplit): runs of four k tiles
    // (128 of k at k = 1100) are counted from the block's first k tile,
    // across rounds of three. A split over a cluster: each block's range
    // of k its own runs (one tile of 64 each at k = 1000). Few blocks with
    // all their k tiles resident (the latency regime, the automatic tile
    // at 64 x 96 x 600): every tile its own stage, the loop rolled, a run
    // ending inside it.
    let product = |m: i64, n: i64, k: i64| Case {
        name: format!("f16 product into f32 {m} x {n} x {k}"),
        stored_f32: true,
        json: cases("f16", m, n, k).remove(0).json,
    };
    for (case, split, tile, stages, run_end) in [
        (
            product(130, 200, 1100),
            Some(1),
            &[64, 64, 32][..],
            "(3 stages)",
            "if ((pf_kt - pf_kb + 32) % 128 == 0 || pf_kt + 32 >= pf_ke)",
        ),
        (
            product(130, 200, 1000),
            Some(3),
            &[64, 64, 64][..],
            "(6 stages)",
            "if ((pf_kt - pf_kb + 64) % 64 == 0 || pf_kt + 64 >= pf_ke)",
        ),
        (
            product(64, 96, 600),
            None,
            &[][..],
            "(10 stages)",
            "if ((pf_kt - pf_kb + 64) % 64 == 0 || pf_kt + 64 >= pf_ke)",
        ),
    ] {
        let mut o = options(tile);
        o.gpu.as_mut().unwrap().k_split = split;
        let c = compile(&load(&case), &o).unwrap();
        let src = c.cuda.as_ref().unwrap().source.clone();
        assert!(src.contains(stages), "{} {split:?}", case.name);
        assert_eq!(
            src.contains("__cluster_dims__(1, 1, 3)"),
            split == Some(3),
            "{}",
            case.name
        );
        assert!(src.contains(run_end), "{} {split:?}", case.name);
        let check = emulation_check(c, 3);
        assert!(check.ok, "{} {split:?}: {}", case.name, check.line());
    }
}

#[test]
fn a_reduction_within_one_run_stays_chained() {
    // k = 64 in all is one run (the shortest, one wgmma k tile): promoted,
    // the same truncated sums in a second register set. Chained, the
    // automatic wgmma tile keeps its 256 columns; at 65 it is promoted.
    // (2048 x 2048: too few tiles for two blocks a multiprocessor,
    // `gpu::contraction::two_blocks_per_sm`, which a short reduction on a
    // larger output takes.)
    for (m, n, k, promoted) in [(2048, 2048, 64, false), (2048, 2048, 65, true)] {
        let case = &cases("f16", m, n, k)[0];
        assert!(case.stored_f32, "{}", case.name);
        let c = compile(&load(case), &options(&[])).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert_eq!(src.contains("pf_step"), promoted, "k = {k}");
        let tile = if promoted {
            "128 x 128 x 64"
        } else {
            "128 x 256 x 64"
        };
        assert!(src.contains(&format!("/* tensor cores: {tile}")), "k = {k}");
    }
    // Two products into one accumulator (examples/lstm_cell.json's gates,
    // `G +=! X W; G += Hp U`, one kernel): I + H = 64 of k is one run,
    // 40 + 40 is not, though each product alone is.
    let json = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lstm_cell.json"),
    )
    .unwrap();
    for (i, h, promoted) in [(32, 32, false), (40, 40, true)] {
        let mut p = load_str(&json, "lstm_cell.json").unwrap();
        let sizes = [
            ("B".to_string(), 37),
            ("I".to_string(), i),
            ("H".to_string(), h),
        ];
        polyfuse::frontend::apply_param_overrides(&mut p, &sizes).unwrap();
        let c = compile(&p, &options(&[])).unwrap();
        let src = &c.cuda.as_ref().unwrap().source;
        assert!(src.contains("/* tensor cores: "), "I = {i}, H = {h}");
        assert_eq!(src.contains("pf_step"), promoted, "I = {i}, H = {h}");
        let check = emulation_check(c, 7);
        assert!(check.ok, "lstm_cell I = {i}, H = {h}: {}", check.line());
    }
    // Checked in the emulation off the tile grid, chained at k = 60.
    let short = &cases("f16", 70, 83, 60)[0];
    let c = compile(&load(short), &options(&[64, 64, 64])).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("pf_step"));
    let check = emulation_check(c, 5);
    assert!(check.ok, "{}: {}", short.name, check.line());
}

#[test]
fn short_reductions_into_f32_are_promoted_and_pass_where_chained_ones_fail() {
    // An f16 product into an f32 temp, then `tanh(acc + bias)` into f32 at
    // 130 x 264 x 200: tanh's outputs near zero make the check's floor
    // small (1e-2 of the largest output, which is about 1), so the sum's
    // absolute error shows. Chained through its 200 of k, the tensor
    // cores' truncations took 2.40 times the declared-precision run's
    // error at seed 42 (the check admits 2); runs of 64 of k (at most
    // `4 sqrt(k)`) took 0.90, and the worst of 31 seeds 1.06. A k tile of
    // 128 makes runs of 128: 1.26 at seed 42, 1.32 the worst.
    let case = Case {
        name: "f16 product in an f32 temp, tanh epilogue into f32".to_string(),
        stored_f32: true,
        json: r#"{"name": "staged", "params": {"M": 130, "N": 264, "K": 200},
 "inputs": {"A": {"dtype": "f16", "shape": ["M", "K"]}, "B": {"dtype": "f16", "shape": ["K", "N"]},
            "bias": {"dtype": "f16", "shape": ["N"]}},
 "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
 "temps": {"acc": {"dtype": "f32", "shape": ["M", "N"]}},
 "body": ["acc(i, j) +=! f32(A(i, k)) * f32(B(k, j))", "C(i, j) = f32(tanh(acc(i, j) + f32(bias(j))))"]}"#
            .to_string(),
    };
    for (tile, seed, chained, limit) in [
        ([16, 16, 16], 42, true, None),
        ([16, 16, 16], 42, false, Some(1.2)),
        ([16, 16, 16], 5, false, Some(1.2)),
        ([64, 64, 64], 42, false, Some(1.2)),
        ([128, 128, 128], 42, false, Some(1.5)),
    ] {
        let mut o = options(&tile);
        let gpu = o.gpu.as_mut().unwrap();
        gpu.k_split = Some(1);
        gpu.chained_accumulation = chained;
        let c = compile(&load(&case), &o).unwrap();
        assert_eq!(
            c.cuda.as_ref().unwrap().source.contains("pf_step"),
            !chained,
            "{tile:?}"
        );
        let check = emulation_check(c, seed);
        let ratio = check.max_rel_err / check.declared_rel_err;
        match limit {
            None => assert!(!check.ok, "{tile:?} chained: {}", check.line()),
            Some(l) => assert!(
                check.ok && ratio < l,
                "{tile:?} seed {seed}: {}",
                check.line()
            ),
        }
    }
}

#[test]
fn promoted_wgmma_tiles_leave_registers_for_the_runs_sums() {
    // At 4096^3 the automatic wgmma tile is 128 x 256 (128 accumulators a
    // thread); promoted, the run's sums need as many again, so the tile
    // is 128 wide and the block keeps one block's registers.
    for case in cases("f16", 4096, 4096, 4096) {
        let c =
            compile(&load(&case), &options(&[])).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let source = &c.cuda.as_ref().unwrap().source;
        let tile = if case.stored_f32 {
            "128 x 128 x 64 tiles"
        } else {
            "128 x 256 x 64 tiles"
        };
        let found = source.lines().find(|l| l.contains("/* tensor cores: "));
        assert!(
            source.contains(&format!("/* tensor cores: {tile}")),
            "{}: {found:?}",
            case.name
        );
        // 64 accumulators a thread would ask for two blocks' registers
        // (`__launch_bounds__(256, 2)`, 128 registers); with the step's
        // sums, one.
        assert!(
            source.contains("__launch_bounds__(256, 1)"),
            "{}",
            case.name
        );
    }
}

#[test]
fn chained_sums_fail_the_check_at_a_long_reduction_and_promoted_ones_pass() {
    // The emulation sums each instruction's products as the tensor cores
    // do (`pf_emu_tc_sum`: truncated, not rounded to nearest). An f16
    // product into f32 at k = 8192, on both engines: chained through the
    // whole reduction its truncations add up past twice the
    // declared-precision run's error (on the H200: 2.4 times); promoted,
    // it stays well inside.
    let case = Case {
        name: "f16 product into f32, k = 8192".to_string(),
        stored_f32: true,
        json: cases("f16", 64, 64, 8192).remove(0).json,
    };
    for tile in [[64, 64, 64], [32, 32, 32]] {
        for chained in [false, true] {
            let mut o = options(&tile);
            let gpu = o.gpu.as_mut().unwrap();
            gpu.k_split = Some(1);
            gpu.chained_accumulation = chained;
            let c = compile(&load(&case), &o).unwrap();
            let check = emulation_check(c, 11);
            let ratio = check.max_rel_err / check.declared_rel_err;
            if chained {
                assert!(!check.ok, "{tile:?} chained: {}", check.line());
            } else {
                // Measured here (runs of 256 of k): 0.25 on both engines.
                assert!(
                    check.ok && ratio < 0.5,
                    "{tile:?} promoted: {}",
                    check.line()
                );
            }
        }
    }
}

/// `examples/attention_global.json` with its output `Y` declared f32 (and
/// its weights f32, as the example declares them), at `S`, `D`.
fn attention_into_f32(s: i64, d: i64) -> Program {
    let text = std::fs::read_to_string("examples/attention_global.json").unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["outputs"]["Y"]["dtype"] = "f32".into();
    for (name, value) in [("B", 1), ("H", 1), ("S", s), ("D", d)] {
        json["params"][name] = value.into();
    }
    load_str(&json.to_string(), "attention_f32.json").unwrap()
}

#[test]
fn attention_stored_as_f32_adds_each_key_tiles_value_sums_in_ieee_f32() {
    // The rolling attention's value products, chained over 3072 keys in
    // the tensor cores, failed the check in the emulation (1.8e-4 against
    // a bound of 1.2e-4, twice the declared run's 6.1e-5); each key tile's
    // sums from zero, added in IEEE f32, pass. D = 16 runs mma.sync; D =
    // 64 wgmma (at S = 512, for its code: the emulation of 3072 keys at
    // that depth takes a minute at -O0).
    for (s, d, engine) in [
        (3072, 16, "pf_mma_f16(&pf_ot0"),
        (512, 64, "pf_fa_wgmma_rs_n64(pf_ot0"),
    ] {
        let c = compile(&attention_into_f32(s, d), &options(&[]))
            .unwrap_or_else(|e| panic!("S {s} D {d}: {e}"));
        let source = c.cuda.as_ref().unwrap().source.clone();
        assert!(source.contains(engine), "S {s} D {d}: no {engine}");
        assert!(
            source.contains("pf_o0[pf_i] += pf_ot0[pf_i];"),
            "S {s} D {d}"
        );
        let check = emulation_check(c, 11);
        assert!(check.ok, "S {s} D {d}: {}", check.line());
    }
    // An f16 output keeps the chained sums.
    let mut p = attention_into_f32(64, 16);
    p.tensors.iter_mut().find(|t| t.name == "Y").unwrap().dtype =
        polyfuse::frontend::ast::DType::F16;
    let c = compile(&p, &options(&[])).unwrap();
    assert!(!c.cuda.as_ref().unwrap().source.contains("pf_ot0"));
    // So does an f32 output computed from the row states alone (the
    // log-sum-exp beside an f16 `Y`).
    let text = std::fs::read_to_string("examples/attention_lse.json").unwrap();
    let p = load_str(&text, "attention_lse.json").unwrap();
    assert!(p
        .tensors
        .iter()
        .any(|t| t.dtype == polyfuse::frontend::ast::DType::F32
            && t.role == polyfuse::frontend::ast::TensorRole::Output));
    let c = compile(&p, &options(&[])).unwrap();
    let source = &c.cuda.as_ref().unwrap().source;
    assert!(source.contains("pf_o0[") && !source.contains("pf_ot0"));
}
