"""Would the weights' remainder term survive e4m3?  (CPU, numpy; no GPU.)

polyfuse's prefill kernel splits each f32 weight p = exp(s - m) into
hi = f16(p) and lo = f16(p - hi) and multiplies both by the values: 1.5
times FlashAttention's tensor work.  On the H100 an e4m3 product runs at
twice the f16 rate, so the remainder term in e4m3 would cost half as
much.  This emulates it: lo scaled by 2^16 (|lo| <= 2^-11 p, and e4m3's
smallest subnormal is 2^-9), rounded to e4m3 (3 mantissa bits, round to
nearest even, saturating at 448), times the values rounded to e4m3, the
product scaled back; the output rounded to f16 and compared with the f64
reference by polyfuse's elementwise metric (src/runtime/data.rs; the
bound for f16 is 1e-2).  Products of the rounded terms are exact (f64):
the tensor cores' f32 accumulation adds far less than the rounding.

usage: PYTHONPATH=... python e4m3_remainder.py
"""
import numpy as np


def e4m3(x):
    """Round to the nearest e4m3 value (subnormals below 2^-6 in steps of
    2^-9; saturating at 448)."""
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -6)
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)


def f16(x):
    return x.astype(np.float16).astype(np.float64)


def run(rng, s_len, depth, dist, scale_exp=16):
    def make():
        x = rng.uniform(-1, 1, (s_len, depth)) if dist == "uniform" else rng.standard_normal((s_len, depth))
        return f16(x)

    q, k, v = make(), make(), make()
    s = (q @ k.T) / np.sqrt(depth)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p @ v) / p.sum(1, keepdims=True)
    # the kernel's f32 scores and weights
    s32 = (q.astype(np.float32) @ k.T.astype(np.float32)) * np.float32(1 / np.sqrt(depth))
    p32 = np.exp(s32 - s32.max(1, keepdims=True)).astype(np.float64)
    hi = f16(p32)
    lo = p32 - hi
    rows = p32.sum(1, keepdims=True)
    ways = {
        "rounded once": (hi @ v) / rows,
        "f16 remainder": (hi @ v + f16(lo) @ v) / rows,
        "e4m3 remainder": (hi @ v + (e4m3(lo * 2.0**scale_exp) @ e4m3(v)) * 2.0**-scale_exp) / rows,
    }
    floor = 1e-2 * np.abs(ref).max()
    for name, y in ways.items():
        err = np.max(np.abs(f16(y) - ref) / np.maximum(np.abs(ref), floor))
        print(f"| {dist} | {s_len} | {depth} | {name} | {err:.2e} |")


def main():
    rng = np.random.default_rng(1)
    print("| inputs | S | D | remainder | elementwise error |")
    print("| --- | --- | --- | --- | --- |")
    for dist in ("uniform", "normal"):
        for s_len, depth in ((1031, 64), (4096, 64), (1031, 128)):
            run(rng, s_len, depth, dist)


if __name__ == "__main__":
    main()
