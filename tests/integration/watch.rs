//! A compilation isl's scheduler does not finish is stopped, not left
//! running (`pipeline::watch`). Its own test binary, so that the count of
//! the process's threads is this test's alone.

use std::time::{Duration, Instant};

use polyfuse::frontend::load_str;
use polyfuse::pipeline::{compile_watched, compile_within, Watch, WatchEvent};
use polyfuse::schedule::Strategy;
use polyfuse::Options;

/// The GQA decoding example at KV = 300 in 37 split-k slices: isl's
/// scheduler does not finish it with fusion (over 20 minutes).
fn gqa_split_37() -> polyfuse::frontend::ast::Program {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/attention_decode_gqa.json"
    ))
    .unwrap()
    .replace("\"factor\": 4", "\"factor\": 37")
    .replace("\"KV\": 64", "\"KV\": 300");
    assert!(text.contains("\"factor\": 37") && text.contains("\"KV\": 300"));
    load_str(&text, "gqa37.json").unwrap()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits up to 20 s for the process to be back to `n` threads.
fn back_to(n: usize) -> bool {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if threads() <= n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn an_unfinished_schedule_is_stopped_and_replaced() {
    let program = gqa_split_37();
    let before = threads();

    // Given 2 s, the compilation with isl's scheduler does not finish: no
    // result, and its thread ends (isl stopped at its next pivot).
    let started = Instant::now();
    let got = compile_within(&program, &Options::default(), Duration::from_secs(2)).unwrap();
    assert!(got.is_none());
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(back_to(before), "{} threads, {before} before", threads());

    // Watched: reported, stopped, and compiled again with minimal fusion,
    // which gives the tree minimal fusion gives.
    let mut options = Options::default();
    let mut events = Vec::new();
    let watch = Watch {
        notice: Duration::from_secs(1),
        fallback: Duration::from_secs(2),
    };
    let c = compile_watched(&program, &mut options, watch, |e| events.push(e)).unwrap();
    assert_eq!(
        events,
        vec![
            WatchEvent::StillCompiling(Duration::from_secs(1)),
            WatchEvent::FellBack(Duration::from_secs(2))
        ]
    );
    assert_eq!(options.strategy, Strategy::Min);
    let min = polyfuse::compile(
        &program,
        &Options {
            strategy: Strategy::Min,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(c.tree.to_string(), min.tree.to_string());
    assert!(back_to(before), "{} threads, {before} before", threads());

    // A compilation that finishes in time is returned as it is.
    let quick = compile_within(&program, &options, Duration::from_secs(120))
        .unwrap()
        .expect("minimal fusion finishes");
    assert_eq!(quick.tree.to_string(), min.tree.to_string());
}
