//! Input data and the comparison with the reference.
//!
//! Inputs are uniform in [-1, 1) (i32 and i64 in [-8, 8], u8 in [0, 255],
//! bool 0 or 1) from splitmix64 with a fixed seed, rounded to the tensor's
//! dtype (the 8-bit floats to nearest even, [`fp8_from_f64`]).
//!
//! The check compares each output element `y` with the f64 reference `r`:
//!
//! ```text
//!   err = |y - r| / max(|r|, 1e-2 * max_j |r_j|)
//! ```
//!
//! an elementwise relative error with a floor that keeps elements near zero
//! (where cancellation is expected) from dominating. NaN matches only NaN.
//!
//! The unoptimised program also runs with every stored value rounded to its
//! declared dtype (the declared-precision run, `codegen::expr::Mode::Declared`),
//! and its largest `err` against the same reference, `d`, is what the
//! program's own dtypes cost: an f16 temp costs f16 rounding even where the
//! output is f32. An output passes when its largest `err` is at most
//! `max(tolerance(dtype), 2 d)` ([`bound`]), the rule FlashAttention's tests
//! apply against a reference in the working precision.

use crate::frontend::ast::DType;

/// The relative error bound a check accepts for outputs of dtype `t`.
/// Integers and bool are exact. An 8-bit float output is allowed one unit
/// in the last place (2^-3 for e4m3's 3 mantissa bits, 2^-2 for e5m2's
/// 2): a kernel that computes in f32 what the reference computes in f64
/// may round a value near a tie to the neighbour the reference does not.
pub fn tolerance(t: DType) -> f64 {
    match t {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        DType::BF16 => 6e-2,
        DType::F8E4M3 => 1.25e-1,
        DType::F8E5M2 => 2.5e-1,
        DType::I32 | DType::I64 | DType::U8 | DType::Bool => 0.0,
    }
}

/// The two 8-bit float formats: mantissa bits, exponent bias, largest
/// finite value.
fn fp8_format(t: DType) -> (i32, i32, f64) {
    match t {
        DType::F8E4M3 => (3, 7, 448.0),
        DType::F8E5M2 => (2, 15, 57344.0),
        _ => panic!("{t} is not an 8-bit float"),
    }
}

/// `x` as the byte of the 8-bit float `t` (`f8e4m3` or `f8e5m2`), as
/// CUDA's `__nv_cvt_double_to_fp8(x, __NV_SATFINITE, ..)` converts it and
/// as the generated C does (`codegen::c::DTYPE_HELPERS`): to nearest even;
/// beyond the largest finite value (infinities too) that value with the
/// sign; NaN to 0x7f.
pub fn fp8_from_f64(t: DType, x: f64) -> u8 {
    let (mant, bias, max) = fp8_format(t);
    if x.is_nan() {
        return 0x7f;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(f64::MAX);
    if a == 0.0 {
        return sign;
    }
    // The exponent of a's binade, no less than the least normal one.
    let e = (a.log2().floor() as i32).max(1 - bias);
    // log2 may be off by one near a power of two: correct it.
    let e = if a < 2f64.powi(e) && e > 1 - bias {
        e - 1
    } else if a >= 2f64.powi(e + 1) {
        e + 1
    } else {
        e
    };
    let step = 2f64.powi(e - mant);
    let r = ((a / step).round_ties_even() * step).min(max);
    if r == 0.0 {
        return sign;
    }
    let min_normal = 2f64.powi(1 - bias);
    if r < min_normal {
        return sign | (r / 2f64.powi(1 - bias - mant)) as u8;
    }
    let re = r.log2().floor() as i32;
    let re = if r < 2f64.powi(re) {
        re - 1
    } else if r >= 2f64.powi(re + 1) {
        re + 1
    } else {
        re
    };
    let m = (r / 2f64.powi(re - mant)) as i32 - (1 << mant);
    sign | (((re + bias) << mant) as u8) | m as u8
}

/// The value of byte `b` of the 8-bit float `t`.
pub fn fp8_to_f64(t: DType, b: u8) -> f64 {
    let (mant, bias, _) = fp8_format(t);
    let e = ((b & 0x7f) >> mant) as i32;
    let m = (b & ((1 << mant) - 1)) as i32;
    let top = (1 << (7 - mant)) - 1;
    let v = if t == DType::F8E4M3 && e == top && m == (1 << mant) - 1 {
        f64::NAN
    } else if t == DType::F8E5M2 && e == top {
        if m == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if e == 0 {
        m as f64 * 2f64.powi(1 - bias - mant)
    } else {
        ((1 << mant) + m) as f64 * 2f64.powi(e - bias - mant)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
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
            DType::I64 => out.extend_from_slice(&((v * 8.0).round() as i64).to_le_bytes()),
            DType::U8 => out.push(((v + 1.0) * 128.0).floor().clamp(0.0, 255.0) as u8),
            DType::Bool => out.push(u8::from(v >= 0.0)),
            DType::F8E4M3 | DType::F8E5M2 => out.push(fp8_from_f64(t, v)),
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
            DType::I64 => {
                i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64
            }
            DType::U8 => c[0] as f64,
            DType::Bool => f64::from(u8::from(c[0] != 0)),
            DType::F8E4M3 | DType::F8E5M2 => fp8_to_f64(t, c[0]),
        })
        .collect()
}

/// The f64 reference values of one output and those of the
/// declared-precision run, both from the CPU, what every target's outputs
/// are compared with.
#[derive(Debug, Clone)]
pub struct ReferenceOutput {
    pub name: String,
    pub dtype: DType,
    pub reference: Vec<f64>,
    pub declared: Vec<f64>,
}

/// The bound an output of dtype `t` is held to when the declared-precision
/// run's error is `declared`: the larger of the dtype's [`tolerance`] and
/// twice `declared`. An infinite or NaN `declared` (the declared run
/// overflowed, or made a NaN the reference has not) allows nothing beyond
/// the tolerance: an allowance without limit would pass any result.
pub fn bound(t: DType, declared: f64) -> f64 {
    if declared.is_finite() {
        tolerance(t).max(2.0 * declared)
    } else {
        tolerance(t)
    }
}

/// The check of one output.
#[derive(Debug, Clone)]
pub struct OutputCheck {
    pub name: String,
    pub dtype: DType,
    /// Largest error of the result against the reference.
    pub error: f64,
    /// Largest error of the declared-precision run against the reference.
    pub declared: f64,
    /// The bound applied ([`bound`]).
    pub bound: f64,
}

impl OutputCheck {
    /// Whether the bound is twice the declared-precision error rather
    /// than the dtype's tolerance.
    pub fn bound_from_declared(&self) -> bool {
        self.bound > tolerance(self.dtype)
    }
}

/// The outcome of comparing all outputs with the reference.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub ok: bool,
    /// Largest error of the result over all outputs.
    pub max_rel_err: f64,
    /// Largest error of the declared-precision run over all outputs.
    pub declared_rel_err: f64,
    /// Where the largest error is: tensor and flat element index.
    pub worst: Option<(String, usize)>,
    pub per_output: Vec<OutputCheck>,
}

impl CheckResult {
    /// The one line the spec asks for, then per output its error and the
    /// bound applied (marked where twice the declared-precision error set
    /// it).
    pub fn line(&self) -> String {
        let status = if self.ok { "ok" } else { "FAILED" };
        let mut s = format!(
            "check: {status} max relative error {:.3e} (declared precision: {:.3e})",
            self.max_rel_err, self.declared_rel_err
        );
        let parts: Vec<String> = self
            .per_output
            .iter()
            .map(|o| {
                let (n, t, e, b) = (&o.name, o.dtype, o.error, o.bound);
                if o.bound_from_declared() {
                    format!("{n} ({t}): {e:.3e} <= {b:.3e} = 2 x declared")
                } else {
                    format!("{n} ({t}): {e:.3e} <= {b:e}")
                }
            })
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

/// Compares every output (its reference values, the values computed) with
/// its reference under [`bound`].
pub fn compare(outputs: &[(&ReferenceOutput, &[f64])]) -> CheckResult {
    let mut ok = true;
    let mut max = 0.0f64;
    let mut declared_max = 0.0f64;
    let mut worst = None;
    let mut per = Vec::new();
    for (r, y) in outputs {
        let (e, i) = max_relative_error(y, &r.reference);
        let (d, _) = max_relative_error(&r.declared, &r.reference);
        let b = bound(r.dtype, d);
        if e > b || e.is_nan() || y.len() != r.reference.len() {
            ok = false;
        }
        if e >= max {
            max = e;
            worst = Some((r.name.clone(), i));
        }
        declared_max = declared_max.max(d);
        per.push(OutputCheck {
            name: r.name.clone(),
            dtype: r.dtype,
            error: e,
            declared: d,
            bound: b,
        });
    }
    CheckResult {
        ok,
        max_rel_err: max,
        declared_rel_err: declared_max,
        worst,
        per_output: per,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fp8_known_values() {
        let e4 = |x: f64| fp8_from_f64(DType::F8E4M3, x);
        let e5 = |x: f64| fp8_from_f64(DType::F8E5M2, x);
        // Largest finite values, and saturation beyond them (satfinite).
        assert_eq!(e4(448.0), 0x7e);
        assert_eq!(fp8_to_f64(DType::F8E4M3, 0x7e), 448.0);
        assert_eq!(e4(463.9), 0x7e);
        assert_eq!(e4(464.0), 0x7e); // tie to even: 448 (mantissa 110)
        assert_eq!(e4(1e6), 0x7e);
        assert_eq!(e4(f64::INFINITY), 0x7e);
        assert_eq!(e4(f64::NEG_INFINITY), 0xfe);
        assert_eq!(e5(57344.0), 0x7b);
        assert_eq!(fp8_to_f64(DType::F8E5M2, 0x7b), 57344.0);
        assert_eq!(e5(61440.0), 0x7b); // the tie rounds up to 2^16: saturates
        assert_eq!(e5(f64::INFINITY), 0x7b);
        assert_eq!(e5(-1e9), 0xfb);
        // NaN: 0x7f in both (CUDA's canonical NaN of a float input).
        assert_eq!(e4(f64::NAN), 0x7f);
        assert_eq!(e5(f64::NAN), 0x7f);
        assert!(fp8_to_f64(DType::F8E4M3, 0x7f).is_nan());
        assert!(fp8_to_f64(DType::F8E4M3, 0xff).is_nan());
        assert!(fp8_to_f64(DType::F8E5M2, 0x7f).is_nan());
        assert_eq!(fp8_to_f64(DType::F8E5M2, 0x7c), f64::INFINITY);
        assert_eq!(fp8_to_f64(DType::F8E5M2, 0xfc), f64::NEG_INFINITY);
        // Ones, signs and zeros.
        assert_eq!(e4(1.0), 0x38);
        assert_eq!(e4(-1.0), 0xb8);
        assert_eq!(e5(1.0), 0x3c);
        assert_eq!(e4(-0.0), 0x80);
        assert_eq!(e4(0.0), 0x00);
        // Ties to even: 1 + 1/16 is halfway between 1 and 1.125 (e4m3).
        assert_eq!(e4(1.0625), 0x38);
        assert_eq!(e4(1.1875), 0x3a); // between 1.125 (odd) and 1.25: up
        assert_eq!(e5(1.125), 0x3c); // between 1 and 1.25 (e5m2): even is 1
        assert_eq!(e5(1.375), 0x3e); // between 1.25 (odd) and 1.5: up
                                     // Subnormals: e4m3's least is 2^-9, e5m2's 2^-16.
        assert_eq!(e4(2f64.powi(-9)), 0x01);
        assert_eq!(fp8_to_f64(DType::F8E4M3, 0x01), 2f64.powi(-9));
        assert_eq!(e4(2f64.powi(-10)), 0x00); // a tie with zero: even
        assert_eq!(e4(1.5 * 2f64.powi(-10)), 0x01);
        assert_eq!(e4(3.0 * 2f64.powi(-10)), 0x02); // 1.5 units: tie to even 2
        assert_eq!(e4(7.0 * 2f64.powi(-9)), 0x07);
        assert_eq!(e4(7.5 * 2f64.powi(-9)), 0x08); // rounds up into the normals
        assert_eq!(fp8_to_f64(DType::F8E4M3, 0x08), 2f64.powi(-6));
        assert_eq!(e5(2f64.powi(-16)), 0x01);
        assert_eq!(e5(3.0 * 2f64.powi(-16)), 0x03);
        assert_eq!(e5(-2f64.powi(-17)), 0x80);
    }

    #[test]
    fn fp8_round_trip_and_monotone() {
        for t in [DType::F8E4M3, DType::F8E5M2] {
            let mut last = f64::NEG_INFINITY;
            // Every finite byte reads back as itself; values increase.
            for b in (0x80u8..=0xff).rev().chain(0x00..=0x7f) {
                let v = fp8_to_f64(t, b);
                if !v.is_finite() {
                    continue;
                }
                if b != 0x80 {
                    assert!(v > last || (v == 0.0 && last == 0.0), "{t} {b:#x}");
                }
                last = v;
                assert_eq!(fp8_from_f64(t, v), b, "{t} {v}");
            }
        }
    }

    #[test]
    fn new_dtypes_round_trip_and_ranges() {
        let u = random_bytes(DType::U8, 1000, 3);
        assert!(u.iter().any(|&b| b > 200) && u.iter().any(|&b| b < 50));
        let b = to_f64(DType::Bool, &random_bytes(DType::Bool, 1000, 3));
        assert!(b.iter().all(|&v| v == 0.0 || v == 1.0) && b.contains(&0.0) && b.contains(&1.0));
        let i = to_f64(DType::I64, &random_bytes(DType::I64, 100, 3));
        assert!(i.iter().all(|v| v.fract() == 0.0 && v.abs() <= 8.0));
        for t in [DType::F8E4M3, DType::F8E5M2] {
            let v = to_f64(t, &random_bytes(t, 1000, 5));
            assert!(v.iter().all(|x| x.abs() <= 1.0));
            // Representable: converting again changes nothing.
            assert!(v.iter().all(|&x| fp8_to_f64(t, fp8_from_f64(t, x)) == x));
        }
        for t in DType::ALL {
            assert_eq!(DType::parse(t.name()), Some(t));
        }
    }

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

    /// An output whose reference is `r` and whose declared-precision run
    /// gave `declared`.
    fn output(t: DType, r: &[f64], declared: &[f64]) -> ReferenceOutput {
        ReferenceOutput {
            name: "Y".into(),
            dtype: t,
            reference: r.to_vec(),
            declared: declared.to_vec(),
        }
    }

    #[test]
    fn compare_applies_dtype_bounds() {
        let r = [1.0, 2.0];
        let exact = output(DType::F32, &r, &r);
        let ok = compare(&[(&exact, &[1.0, 2.00001][..])]);
        assert!(ok.ok);
        assert_eq!(ok.declared_rel_err, 0.0);
        assert!(ok
            .line()
            .starts_with("check: ok max relative error 5.000e-6 (declared precision: 0.000e0) [Y (f32): 5.000e-6 <= 1e-4]"), "{}", ok.line());
        let bad = compare(&[(&exact, &[1.0, 2.1][..])]);
        assert!(!bad.ok);
        assert!(bad.line().starts_with("check: FAILED"));
        let f16 = output(DType::F16, &r, &r);
        assert!(compare(&[(&f16, &[1.0, 2.001][..])]).ok);
    }

    #[test]
    fn the_declared_precision_error_widens_the_bound_twice_over() {
        // The declared run is 1e-3 off: an f32 output may be 2e-3 off.
        let r = [1.0, 2.0];
        let o = output(DType::F32, &r, &[1.0, 2.002]);
        let c = compare(&[(&o, &[1.0, 2.0039][..])]);
        assert!(c.ok, "{}", c.line());
        assert!((c.declared_rel_err - 1e-3).abs() < 1e-12);
        assert!((c.per_output[0].bound - 2e-3).abs() < 1e-12);
        assert!(
            c.line().contains("<= 2.000e-3 = 2 x declared"),
            "{}",
            c.line()
        );
        let c = compare(&[(&o, &[1.0, 2.0041][..])]);
        assert!(!c.ok, "{}", c.line());
        // A declared run that overflowed allows nothing beyond the dtype's.
        let inf = output(DType::F32, &r, &[1.0, f64::INFINITY]);
        assert!(!compare(&[(&inf, &[1.0, 2.1][..])]).ok);
        assert_eq!(bound(DType::F32, f64::INFINITY), 1e-4);
        assert_eq!(bound(DType::F32, f64::NAN), 1e-4);
    }
}
