#!/usr/bin/env python3
"""PyTorch peers of the programs in bench/suite/ (issue 32), eager and
torch.compile, timed as scripts/peers.py times (CUDA events, warm-up,
median; graph replay for short kernels; no TF32).

    python3 bench/suite/peers.py [NAME ...] [--out FILE] [--check-sizes]

Each peer is written from the program's statements and checked against a
float64 evaluation of the same function on the same inputs (normwise
relative error; the largest over the outputs of a program with several).
One JSON line per (program, peer). --check-sizes runs them at the small
sizes of check-sizes.txt instead of the files' (a quick test of the peers
themselves).
"""
import argparse
import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("peers", os.path.join(HERE, "..", "..", "scripts", "peers.py"))
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def params(name):
    with open(os.path.join(HERE, name + ".json")) as f:
        return json.load(f)["params"]


def rnd(shape, dtype, g):
    return (torch.rand(shape, generator=g, device="cuda", dtype=torch.float32) * 2 - 1).to(dtype)


def product_bias_tanh_f16(p, g):
    A = rnd((p["M"], p["K"]), torch.float16, g)
    B = rnd((p["K"], p["N"]), torch.float16, g)
    bias = rnd((p["N"],), torch.float16, g)
    def f(A, B, bias):
        return torch.tanh(A @ B + bias)
    return f, (A, B, bias)


def layernorm_product_f16(p, g):
    X = rnd((p["M"], p["K"]), torch.float16, g)
    gamma = rnd((p["K"],), torch.float16, g)
    beta = rnd((p["K"],), torch.float16, g)
    W = rnd((p["K"], p["N"]), torch.float16, g)
    def f(X, gamma, beta, W):
        xn = torch.nn.functional.layer_norm(X, (X.shape[1],), gamma, beta, 1e-5)
        return xn @ W
    return f, (X, gamma, beta, W)


def mlp3_f32(p, g):
    B, D = p["B"], p["D"]
    X = rnd((B, D), torch.float32, g)
    ws = [rnd((D, D), torch.float32, g) for _ in range(3)]
    bs = [rnd((D,), torch.float32, g) for _ in range(3)]
    def f(X, W1, b1, W2, b2, W3, b3):
        h = torch.relu(X @ W1 + b1)
        h = torch.relu(h @ W2 + b2)
        return h @ W3 + b3
    return f, (X, ws[0], bs[0], ws[1], bs[1], ws[2], bs[2])


def syrk(p, g):
    N, M = p["N"], p["M"]
    A = rnd((N, M), torch.float32, g)
    C0 = rnd((N, N), torch.float32, g)
    def f(A, C0):
        full = 1.2 * C0 + 1.5 * (A @ A.t())
        return torch.where(torch.ones_like(C0, dtype=torch.bool).tril(), full, C0)
    return f, (A, C0)


def covariance(p, g):
    N, M = p["N"], p["M"]
    data = rnd((N, M), torch.float32, g)
    def f(data):
        c = data - data.mean(dim=0)
        return (c.t() @ c) / (data.shape[0] - 1)
    return f, (data,)


def column_logsumexp(p, g):
    X = rnd((p["R"], p["C"]), torch.float32, g)
    def f(X):
        return torch.logsumexp(X, dim=0)
    return f, (X,)


def grouped_conv(p, g):
    B, G, C, H, W, F = p["B"], p["G"], p["C"], p["H"], p["W"], p["F"]
    X = rnd((B, G * C, H + 2, W + 2), torch.float32, g)
    Wt = rnd((G * F, C, 3, 3), torch.float32, g)
    def f(X, Wt):
        return torch.nn.functional.conv2d(X, Wt, groups=G)
    return f, (X, Wt)


def scalar(g):
    return rnd((), torch.float32, g)


def lower(n, device="cuda"):
    """The mask of j <= i on an n x n matrix."""
    return torch.ones((n, n), dtype=torch.bool, device=device).tril()


def two_mm(p, g):
    alpha, beta = scalar(g), scalar(g)
    A = rnd((p["NI"], p["NK"]), torch.float32, g)
    B = rnd((p["NK"], p["NJ"]), torch.float32, g)
    C = rnd((p["NJ"], p["NL"]), torch.float32, g)
    D0 = rnd((p["NI"], p["NL"]), torch.float32, g)
    def f(alpha, beta, A, B, C, D0):
        return beta * D0 + (alpha * (A @ B)) @ C
    return f, (alpha, beta, A, B, C, D0)


def three_mm(p, g):
    A = rnd((p["NI"], p["NK"]), torch.float32, g)
    B = rnd((p["NK"], p["NJ"]), torch.float32, g)
    C = rnd((p["NJ"], p["NM"]), torch.float32, g)
    D = rnd((p["NM"], p["NL"]), torch.float32, g)
    def f(A, B, C, D):
        return (A @ B) @ (C @ D)
    return f, (A, B, C, D)


def atax(p, g):
    A = rnd((p["M"], p["N"]), torch.float32, g)
    x = rnd((p["N"],), torch.float32, g)
    def f(A, x):
        return A.t() @ (A @ x)
    return f, (A, x)


def bicg(p, g):
    A = rnd((p["N"], p["M"]), torch.float32, g)
    pv = rnd((p["M"],), torch.float32, g)
    r = rnd((p["N"],), torch.float32, g)
    def f(A, pv, r):
        return r @ A, A @ pv
    return f, (A, pv, r)


def gesummv(p, g):
    alpha, beta = scalar(g), scalar(g)
    N = p["N"]
    A = rnd((N, N), torch.float32, g)
    B = rnd((N, N), torch.float32, g)
    x = rnd((N,), torch.float32, g)
    def f(alpha, beta, A, B, x):
        return alpha * (A @ x) + beta * (B @ x)
    return f, (alpha, beta, A, B, x)


def gemver(p, g):
    alpha, beta = scalar(g), scalar(g)
    N = p["N"]
    A = rnd((N, N), torch.float32, g)
    u1, v1, u2, v2, x0, y, z, w0 = [rnd((N,), torch.float32, g) for _ in range(8)]
    def f(alpha, beta, A, u1, v1, u2, v2, x0, y, z, w0):
        Ah = A + torch.outer(u1, v1) + torch.outer(u2, v2)
        x = x0 + beta * (Ah.t() @ y) + z
        w = w0 + alpha * (Ah @ x)
        return Ah, x, w
    return f, (alpha, beta, A, u1, v1, u2, v2, x0, y, z, w0)


def mvt(p, g):
    N = p["N"]
    A = rnd((N, N), torch.float32, g)
    x1_0, x2_0, y1, y2 = [rnd((N,), torch.float32, g) for _ in range(4)]
    def f(A, x1_0, x2_0, y1, y2):
        return x1_0 + A @ y1, x2_0 + A.t() @ y2
    return f, (A, x1_0, x2_0, y1, y2)


def syr2k(p, g):
    alpha, beta = scalar(g), scalar(g)
    N, M = p["N"], p["M"]
    A = rnd((N, M), torch.float32, g)
    B = rnd((N, M), torch.float32, g)
    C0 = rnd((N, N), torch.float32, g)
    def f(alpha, beta, A, B, C0):
        full = beta * C0 + alpha * (B @ A.t() + A @ B.t())
        return torch.where(lower(C0.shape[0], C0.device), full, C0)
    return f, (alpha, beta, A, B, C0)


def trmm_out_of_place(p, g):
    # PolyBench's trmm updates B in place; row i reads the rows k > i,
    # which it has not updated yet, so out of place it is
    # alpha * (B + L^T B) with L the strictly lower triangle of A.
    alpha = scalar(g)
    M, N = p["M"], p["N"]
    A = rnd((M, M), torch.float32, g)
    B = rnd((M, N), torch.float32, g)
    def f(alpha, A, B):
        return alpha * (B + torch.tril(A, -1).t() @ B)
    return f, (alpha, A, B)


def symm_out_of_place(p, g):
    # PolyBench's symm: C = alpha * S B + beta * C with S the symmetric
    # matrix whose lower triangle (diagonal included) A holds.
    alpha, beta = scalar(g), scalar(g)
    M, N = p["M"], p["N"]
    A = rnd((M, M), torch.float32, g)
    B = rnd((M, N), torch.float32, g)
    C0 = rnd((M, N), torch.float32, g)
    def f(alpha, beta, A, B, C0):
        S = torch.tril(A) + torch.tril(A, -1).t()
        return beta * C0 + alpha * (S @ B)
    return f, (alpha, beta, A, B, C0)


def doitgen(p, g):
    A = rnd((p["R"], p["Q"], p["P"]), torch.float32, g)
    C4 = rnd((p["P"], p["P"]), torch.float32, g)
    def f(A, C4):
        return A @ C4
    return f, (A, C4)


def correlation(p, g):
    data = rnd((p["N"], p["M"]), torch.float32, g)
    def f(data):
        n = data.shape[0]
        mean = data.mean(dim=0)
        sd = ((data - mean) ** 2).mean(dim=0).sqrt()
        sd = torch.where(sd <= 0.1, torch.ones_like(sd), sd)
        z = (data - mean) / (n ** 0.5 * sd)
        corr = z.t() @ z
        eye = torch.eye(corr.shape[0], dtype=torch.bool, device=corr.device)
        return torch.where(eye, torch.ones_like(corr), corr)
    return f, (data,)


def mlp_gelu_f16(p, g):
    B, D, F = p["B"], p["D"], p["F"]
    X = rnd((B, D), torch.float16, g)
    W1 = rnd((D, F), torch.float16, g)
    b1 = rnd((F,), torch.float16, g)
    W2 = rnd((F, D), torch.float16, g)
    b2 = rnd((D,), torch.float16, g)
    def f(X, W1, b1, W2, b2):
        h = torch.nn.functional.gelu(X @ W1 + b1, approximate="tanh")
        return h @ W2 + b2
    return f, (X, W1, b1, W2, b2)


def mlp_silu_f32(p, g):
    B, D, F = p["B"], p["D"], p["F"]
    X = rnd((B, D), torch.float32, g)
    W1 = rnd((D, F), torch.float32, g)
    b1 = rnd((F,), torch.float32, g)
    W2 = rnd((F, D), torch.float32, g)
    b2 = rnd((D,), torch.float32, g)
    def f(X, W1, b1, W2, b2):
        return torch.nn.functional.silu(X @ W1 + b1) @ W2 + b2
    return f, (X, W1, b1, W2, b2)


def rmsnorm_product_f16(p, g):
    M, N, K = p["M"], p["N"], p["K"]
    X = rnd((M, K), torch.float16, g)
    gw = rnd((K,), torch.float16, g)
    W = rnd((K, N), torch.float16, g)
    def f(X, gw, W):
        # The statistics in f32 (f64 for the reference), the normalised
        # row rounded to the input's type before the product.
        wide = torch.promote_types(X.dtype, torch.float32)
        x = X.to(wide)
        xn = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * gw.to(wide)
        return xn.to(X.dtype) @ W
    return f, (X, gw, W)


def depthwise_conv(p, g):
    B, C, H, W = p["B"], p["C"], p["H"], p["W"]
    X = rnd((B, C, H + 2, W + 2), torch.float32, g)
    Wt = rnd((C, 3, 3), torch.float32, g)
    def f(X, Wt):
        return torch.nn.functional.conv2d(X, Wt.unsqueeze(1), groups=Wt.shape[0])
    return f, (X, Wt)


def avgpool2x2(p, g):
    X = rnd((p["B"], p["C"], 2 * p["H"], 2 * p["W"]), torch.float32, g)
    def f(X):
        return torch.nn.functional.avg_pool2d(X, 2)
    return f, (X,)


def row_sum_max(p, g):
    X = rnd((p["R"], p["C"]), torch.float32, g)
    def f(X):
        return X.sum(dim=1), X.amax(dim=1)
    return f, (X,)


def column_sum_mean(p, g):
    X = rnd((p["R"], p["C"]), torch.float32, g)
    def f(X):
        return X.sum(dim=0), X.mean(dim=0)
    return f, (X,)


def column_softmax(p, g):
    X = rnd((p["R"], p["C"]), torch.float32, g)
    def f(X):
        return torch.softmax(X, dim=0)
    return f, (X,)


PROGRAMS = [product_bias_tanh_f16, layernorm_product_f16, mlp3_f32, syrk, covariance,
            column_logsumexp, grouped_conv,
            two_mm, three_mm, atax, bicg, gesummv, gemver, mvt, syr2k, trmm_out_of_place,
            symm_out_of_place, doitgen, correlation,
            mlp_gelu_f16, mlp_silu_f32, rmsnorm_product_f16, depthwise_conv, avgpool2x2,
            row_sum_max, column_sum_mean, column_softmax]


def check_sizes():
    """The first line of each program in bench/suite/check-sizes.txt
    (NAME --param P=V ...)."""
    sizes = {}
    with open(os.path.join(HERE, "check-sizes.txt")) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            # A program's first line: its small sizes.
            sizes.setdefault(words[0], {k: int(v) for k, v in
                                        (w.split("=", 1) for w in words[1:] if w != "--param")})
    return sizes


def error(out, ref):
    """The largest normwise relative error over the outputs (one tensor or
    a tuple), and the reason where one is not comparable."""
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    worst, why = 0.0, None
    for o, r in zip(outs, refs):
        e, reason = peers.rel_error(torch, o, r)
        worst, why = max(worst, e), why or reason
    return worst, why


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--check-sizes", action="store_true",
                    help="run at the sizes of check-sizes.txt (a quick test of the peers)")
    a = ap.parse_args()
    small = check_sizes() if a.check_sizes else {}
    sink = open(a.out, "w") if a.out else sys.stdout
    for make in PROGRAMS:
        name = make.__name__
        if a.names and name not in a.names:
            continue
        g = torch.Generator(device="cuda").manual_seed(7)
        p = params(name)
        p.update(small.get(name, {}))
        f, args = make(p, g)
        ref = f(*[x.double() for x in args])
        for peer, fn in [("eager", f), ("torch.compile", torch.compile(f))]:
            try:
                out = fn(*args)
                err, why = error(out, ref)
                us, runs = peers.time_cuda(torch, lambda: fn(*args), 300.0, 10, 200)
                obj = {"program": name, "params": p, "peer": peer, "median_us": us,
                       "runs": runs, "rel_error": err}
                if why:
                    obj["error"] = why
            except Exception as e:  # a peer that fails is reported, not fatal
                obj = {"program": name, "peer": peer, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(obj), file=sink, flush=True)
            peers.log(json.dumps(obj))


if __name__ == "__main__":
    main()
