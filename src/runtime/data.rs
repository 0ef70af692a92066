//! Input data and the comparison with the reference.
//!
//! Inputs are uniform in [-1, 1) (integers in [-8, 8]) from splitmix64 with
//! a fixed seed, rounded to the tensor's dtype.
//!
//! The check compares each output element `y` with the f64 reference `r`:
//!
//! ```text
//!   err = |y - r| / max(|r|, 1e-2 * max_j |r_j|)
//! ```
//!
//! an elementwise relative error with a floor that keeps elements near zero
//! (where cancellation is expected) from dominating. The largest `err` over
//! all outputs must not exceed the bound of the output's dtype
//! ([`tolerance`]). NaN matches only NaN.

use crate::frontend::ast::DType;

/// The relative error bound a check accepts for outputs of dtype `t`.
pub fn tolerance(t: DType) -> f64 {
    match t {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        DType::BF16 => 6e-2,
        DType::I32 => 0.0,
    }
}

/// splitmix64: small, fast, and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// `count` random elements of dtype `t`, as stored bytes (little endian).
pub fn random_bytes(t: DType, count: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(count * t.size());
    for _ in 0..count {
        let v = rng.uniform();
        match t {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&((v * 8.0).round() as i32).to_le_bytes()),
        }
    }
    out
}

/// Stored bytes of dtype `t` as f64 values.
pub fn to_f64(t: DType, bytes: &[u8]) -> Vec<f64> {
    let n = t.size();
    bytes
        .chunks_exact(n)
        .map(|c| match t {
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F64 => f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
        })
        .collect()
}

/// The outcome of comparing all outputs with the reference.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub ok: bool,
    /// Largest error over all outputs, relative to each output's bound
    /// being the one that decides `ok`.
    pub max_rel_err: f64,
    /// Where the largest error is: tensor and flat element index.
    pub worst: Option<(String, usize)>,
    /// Per output: name, dtype, largest error, bound.
    pub per_output: Vec<(String, DType, f64, f64)>,
}

impl CheckResult {
    /// The one line the spec asks for.
    pub fn line(&self) -> String {
        let status = if self.ok { "ok" } else { "FAILED" };
        let mut s = format!(
            "check: {status} max relative error {:.3e}",
            self.max_rel_err
        );
        let parts: Vec<String> = self
            .per_output
            .iter()
            .map(|(n, t, e, b)| format!("{n} ({t}): {e:.3e} <= {b:.0e}"))
            .collect();
        if !parts.is_empty() {
            s.push_str(&format!(" [{}]", parts.join(", ")));
        }
        if let (false, Some((t, i))) = (self.ok, &self.worst) {
            s.push_str(&format!(" worst at {t}[flat {i}]"));
        }
        s
    }
}

/// Elementwise relative error of `y` against `r` (see the module comment).
pub fn max_relative_error(y: &[f64], r: &[f64]) -> (f64, usize) {
    let scale = r
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let floor = (1e-2 * scale).max(f64::MIN_POSITIVE);
    let mut worst = (0.0, 0);
    for (i, (a, b)) in y.iter().zip(r).enumerate() {
        let e = if a.is_nan() && b.is_nan() {
            0.0
        } else if a.is_nan() || b.is_nan() {
            f64::INFINITY
        } else if a == b {
            0.0
        } else {
            (a - b).abs() / b.abs().max(floor)
        };
        if e > worst.0 || e.is_nan() {
            worst = (e, i);
        }
    }
    worst
}

/// Compares every output (name, dtype, values) with its reference.
pub fn compare(outputs: &[(String, DType, Vec<f64>, Vec<f64>)]) -> CheckResult {
    let mut ok = true;
    let mut max = 0.0f64;
    let mut worst = None;
    let mut per = Vec::new();
    for (name, t, y, r) in outputs {
        let (e, i) = max_relative_error(y, r);
        let bound = tolerance(*t);
        if e > bound || y.len() != r.len() {
            ok = false;
        }
        if e >= max {
            max = e;
            worst = Some((name.clone(), i));
        }
        per.push((name.clone(), *t, e, bound));
    }
    CheckResult {
        ok,
        max_rel_err: max,
        worst,
        per_output: per,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_deterministic_and_in_range() {
        let a = random_bytes(DType::F32, 1000, 7);
        let b = random_bytes(DType::F32, 1000, 7);
        let c = random_bytes(DType::F32, 1000, 8);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let v = to_f64(DType::F32, &a);
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.1, "mean {mean}");
    }

    #[test]
    fn half_types_round_trip() {
        for t in [DType::F16, DType::BF16] {
            let b = random_bytes(t, 100, 1);
            assert_eq!(b.len(), 200);
            let v = to_f64(t, &b);
            assert!(v.iter().all(|x| (-1.0..=1.0).contains(x)));
        }
    }

    #[test]
    fn relative_error_uses_floor_and_nan_rules() {
        let (e, i) = max_relative_error(&[1.0, 2.0, 0.0], &[1.0, 2.2, 0.0]);
        assert!((e - 0.2 / 2.2).abs() < 1e-12);
        assert_eq!(i, 1);
        // near zero the floor (1% of the largest magnitude) applies
        let (e, _) = max_relative_error(&[1e-6, 100.0], &[0.0, 100.0]);
        assert!((e - 1e-6).abs() < 1e-12);
        let (e, _) = max_relative_error(&[f64::NAN], &[f64::NAN]);
        assert_eq!(e, 0.0);
        let (e, _) = max_relative_error(&[f64::NAN], &[1.0]);
        assert!(e.is_infinite());
    }

    #[test]
    fn compare_applies_dtype_bounds() {
        let r = vec![1.0, 2.0];
        let ok = compare(&[("Y".into(), DType::F32, vec![1.0, 2.00001], r.clone())]);
        assert!(ok.ok);
        assert!(ok.line().starts_with("check: ok"));
        let bad = compare(&[("Y".into(), DType::F32, vec![1.0, 2.1], r.clone())]);
        assert!(!bad.ok);
        assert!(bad.line().starts_with("check: FAILED"));
        let f16 = compare(&[("Y".into(), DType::F16, vec![1.0, 2.001], r)]);
        assert!(f16.ok);
    }
}
