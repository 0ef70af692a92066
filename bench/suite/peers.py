#!/usr/bin/env python3
"""PyTorch peers of the programs in bench/suite/ (issue 32), eager and
torch.compile, timed as scripts/peers.py times (CUDA events, warm-up,
median; graph replay for short kernels; no TF32).

    python3 bench/suite/peers.py [NAME ...] [--out FILE]

Each peer is written from the program's statements and checked against a
float64 evaluation of the same function on the same inputs (normwise
relative error). One JSON line per (program, peer).
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


PROGRAMS = [product_bias_tanh_f16, layernorm_product_f16, mlp3_f32, syrk, covariance,
            column_logsumexp, grouped_conv]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out")
    a = ap.parse_args()
    sink = open(a.out, "w") if a.out else sys.stdout
    for make in PROGRAMS:
        name = make.__name__
        if a.names and name not in a.names:
            continue
        g = torch.Generator(device="cuda").manual_seed(7)
        p = params(name)
        f, args = make(p, g)
        ref = f(*[x.double() for x in args])
        for peer, fn in [("eager", f), ("torch.compile", torch.compile(f))]:
            try:
                out = fn(*args)
                err = peers.rel_error(torch, out.double(), ref)
                us, runs = peers.time_cuda(torch, lambda: fn(*args), 300.0, 10, 200)
                obj = {"program": name, "params": p, "peer": peer, "median_us": us,
                       "runs": runs, "rel_error": err}
            except Exception as e:  # a peer that fails is reported, not fatal
                obj = {"program": name, "peer": peer, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(obj), file=sink, flush=True)
            peers.log(json.dumps(obj))


if __name__ == "__main__":
    main()
