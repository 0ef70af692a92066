#!/usr/bin/env python3
"""PyTorch peers of the recurrences in bench/recurrences/ (issue 36),
timed as scripts/peers.py times (CUDA events, warm-up, median; graph replay
for short runs; no TF32).

    python3 bench/recurrences/peers.py [NAME ...] [--out FILE] [--peers A,B] [--param L=32 ...]

Each program's statements are written as the loop they mean, with the
program's scaling (weights times 0.1): eager PyTorch, and the same loop with
its step under torch.compile (the loop itself stays in Python: compiling
T x L unrolled steps takes minutes). The stacked LSTM also runs as
torch.nn.LSTM (cuDNN) with the same weights. Every peer is checked against
the eager loop in float64 on the same inputs (normwise relative error).
One JSON line per (program, peer).
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


def rnd(shape, g, dtype=torch.float32):
    return (torch.rand(shape, generator=g, device="cuda", dtype=torch.float32) * 2 - 1).to(dtype)


def lstm_step(x, h, c, wx, wh, b):
    # wx, wh: (4, H, H) as the program indexes them, [g][k][h]; gates i, f, g, o.
    gates = (torch.einsum("bk,gkh->gbh", x, wx) + torch.einsum("bk,gkh->gbh", h, wh)) * 0.1 + b[:, None, :]
    c = torch.sigmoid(gates[1]) * c + torch.sigmoid(gates[0]) * torch.tanh(gates[2])
    h = torch.sigmoid(gates[3]) * torch.tanh(c)
    return h, c


def stacked_lstm(p, g):
    L, T, B, H = p["L"], p["T"], p["B"], p["H"]
    X = rnd((T, B, H), g)
    Wx, Wh = rnd((L, 4, H, H), g), rnd((L, 4, H, H), g)
    bias = rnd((L, 4, H), g)
    H0, C0 = rnd((L, B, H), g), rnd((L, B, H), g)

    def loop(step):
        def f(X, Wx, Wh, bias, H0, C0):
            inp = X
            for l in range(L):
                h, c, outs = H0[l], C0[l], []
                for t in range(T):
                    h, c = step(inp[t], h, c, Wx[l], Wh[l], bias[l])
                    outs.append(h)
                inp = torch.stack(outs)
            return inp
        return f

    # torch.nn.LSTM with the same weights: weight_ih[g*H + h, k] = 0.1 Wx[g, k, h].
    lstm = torch.nn.LSTM(H, H, num_layers=L).cuda()
    with torch.no_grad():
        for l in range(L):
            getattr(lstm, f"weight_ih_l{l}").copy_((0.1 * Wx[l]).permute(0, 2, 1).reshape(4 * H, H))
            getattr(lstm, f"weight_hh_l{l}").copy_((0.1 * Wh[l]).permute(0, 2, 1).reshape(4 * H, H))
            getattr(lstm, f"bias_ih_l{l}").copy_(bias[l].reshape(4 * H))
            getattr(lstm, f"bias_hh_l{l}").zero_()

    def cudnn(X, Wx, Wh, bias, H0, C0):
        with torch.no_grad():
            return lstm(X, (H0, C0))[0]

    args = (X, Wx, Wh, bias, H0, C0)
    return [("eager loop", loop(lstm_step)), ("torch.compile step loop", loop(torch.compile(lstm_step))),
            ("torch.nn.LSTM (cuDNN)", cudnn)], loop(lstm_step), args


def rnn_step(x, h, w, u):
    return torch.tanh((x @ w.T + h @ u.T) * 0.1)


def stacked_dilated_rnn(p, g):
    T, B, N = p["T"], p["B"], p["N"]
    X = rnd((T, B, N), g)
    W, U = rnd((4, N, N), g), rnd((4, N, N), g)

    def loop(step):
        def f(X, W, U):
            inp = X
            for l, d in enumerate((1, 2, 4, 8)):
                hs = [torch.zeros((B, N), device=X.device, dtype=X.dtype)] * d
                for t in range(T):
                    hs.append(step(inp[t], hs[-d], W[l], U[l]))
                inp = torch.stack(hs[d:])
            return inp
        return f

    return [("eager loop", loop(rnn_step)), ("torch.compile step loop", loop(torch.compile(rnn_step)))], \
        loop(rnn_step), (X, W, U)


def grid_step(up, left, x, u, v):
    return torch.tanh((up @ u + left @ v) * 0.1 + x)


def grid_rnn(p, g):
    R, S, B, N = p["R"], p["S"], p["B"], p["N"]
    X = rnd((R, S, B, N), g)
    U, V = rnd((N, N), g), rnd((N, N), g)
    Top, Left = rnd((S, B, N), g), rnd((R, B, N), g)

    def loop(step):
        def f(X, U, V, Top, Left):
            rows = [list(Top)]
            for i in range(R):
                row, left = [], Left[i]
                for j in range(S):
                    left = step(rows[-1][j], left, X[i, j], U, V)
                    row.append(left)
                rows.append(row)
            return torch.stack([torch.stack(r) for r in rows[1:]])
        return f

    return [("eager loop", loop(grid_step)), ("torch.compile step loop", loop(torch.compile(grid_step)))], \
        loop(grid_step), (X, U, V, Top, Left)


PROGRAMS = [stacked_lstm, stacked_dilated_rnn, grid_rnn]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--peers", help="comma-separated peer names to time (default: all)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="override a size of the program's file, as polyfuse's --param does")
    a = ap.parse_args()
    overrides = {}
    for kv in a.param:
        k, v = kv.split("=", 1)
        overrides[k] = int(v)
    only = set(a.peers.split(",")) if a.peers else None
    sink = open(a.out, "w") if a.out else sys.stdout
    for make in PROGRAMS:
        name = make.__name__
        if a.names and name not in a.names:
            continue
        g = torch.Generator(device="cuda").manual_seed(7)
        p = params(name)
        unknown = set(overrides) - set(p)
        if unknown:
            sys.exit(f"peers.py: {name} has no parameter {', '.join(sorted(unknown))}")
        p = {**p, **overrides}
        candidates, reference, args = make(p, g)
        with torch.no_grad():
            ref = reference(*[x.double() for x in args])
        for peer, fn in candidates:
            if only is not None and peer not in only:
                continue
            try:
                with torch.no_grad():
                    out = fn(*args)
                    err = peers.rel_error(torch, out.double(), ref)
                    us, runs = peers.time_cuda(torch, lambda: fn(*args), 1000.0, 5, 50)
                obj = {"program": name, "params": p, "peer": peer, "median_us": us,
                       "runs": runs, "rel_error": err}
            except Exception as e:  # a peer that fails is reported, not fatal
                obj = {"program": name, "peer": peer, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(obj), file=sink, flush=True)
            peers.log(json.dumps(obj))


if __name__ == "__main__":
    main()
