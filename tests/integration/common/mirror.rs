//! A racy mapping built by hand, shared by the race proof's test
//! (`tests/integration/soundness.rs`) and the emulation's race detector's
//! (`tests/integration/race_detector.rs`): each step `t` of a sequential loop runs its
//! rows on `threadIdx.x` (32 of them, one a thread), and step `t` reads the
//! row that step `t - 1` wrote at the mirrored column, `Z(t - 1, N - 1 -
//! i)`, which another thread wrote. With a barrier after each step that is
//! right; under a `nosync` mark it races.

use polyfuse::isl::{Isl, IslPrint};
use polyfuse::model::Scop;

/// The program.
pub const PROGRAM: &str = r#"{"name": "mirror", "params": {"T": 5, "N": 37},
    "inputs": {"X": {"dtype": "f32", "shape": ["T", "N"]}},
    "outputs": {"Y": {"dtype": "f32", "shape": ["T", "N"]}},
    "temps": {"Z": {"dtype": "f32", "shape": ["T", "N"]}},
    "body": ["Z(t, i) = X(t, i) * 2",
             "Y(t, i) = X(t, i) where t in 0:1, i in 0:N",
             "Y(t, i) = Z(t - 1, N - 1 - i) + 1 where t in 1:T, i in 0:N"]}"#;

/// The mapped tree: one kernel, the step loop, the rows on `threadIdx.x`;
/// with `barrier`, a barrier ends each step, without, the step loop is
/// under a `nosync` mark.
pub fn tree(isl: &Isl, scop: &Scop, barrier: bool) -> isl_rs::Schedule {
    let (open, close) = if barrier {
        ("", "")
    } else {
        ("{ mark: \"nosync\", child: ", " }")
    };
    let domain = scop.domain().unwrap().text();
    let pre = "[T, N] -> ";
    let text = format!(
        "{{ domain: \"{domain}\", child: {{ mark: \"kernel_0\", child: {open}{{ \
         schedule: \"{pre}[{{ S0[t, i] -> [(t)]; S1[t, i] -> [(t)]; S2[t, i] -> [(t)] }}]\", \
         child: {{ mark: \"thread_x_1\", child: {{ \
         schedule: \"{pre}[{{ S0[t, i] -> [(i)]; S1[t, i] -> [(i)]; S2[t, i] -> [(i)] }}]\", \
         child: {{ sequence: [ {{ filter: \"{pre}{{ S0[t, i] }}\" }}, \
         {{ filter: \"{pre}{{ S1[t, i]; S2[t, i] }}\" }} ] }} }} }} }}{close} }} }}"
    );
    isl.schedule(&text).unwrap()
}
