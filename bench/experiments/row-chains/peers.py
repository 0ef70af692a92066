#!/usr/bin/env python3
"""PyTorch peers of chain10.json (a chain of maps and row sums, written
from its statements), eager and torch.compile, timed as scripts/peers.py
times them; checked against a float64 evaluation. One JSON line a peer."""
import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("peers", os.path.join(HERE, "..", "..", "..", "scripts", "peers.py"))
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)


def chain10(X):
    t1 = torch.exp(X * 0.5)
    s2 = t1.sum(dim=1, keepdim=True)
    t3 = t1 - s2 * 0.01
    t4 = torch.exp(t3 * 0.5)
    s5 = t4.sum(dim=1, keepdim=True)
    t6 = t4 - s5 * 0.01
    t7 = torch.exp(t6 * 0.5)
    s8 = t7.sum(dim=1, keepdim=True)
    t9 = t7 - s8 * 0.01
    return torch.exp(t9 * 0.5)


def main():
    p = json.load(open(os.path.join(HERE, "chain10.json")))["params"]
    g = torch.Generator(device="cuda").manual_seed(7)
    X = torch.rand((p["R"], p["C"]), generator=g, device="cuda") * 2 - 1
    ref = chain10(X.double())
    for peer, fn in [("eager", chain10), ("torch.compile", torch.compile(chain10))]:
        out = fn(X)
        err = peers.rel_error(torch, out.double(), ref)
        us, runs = peers.time_cuda(torch, lambda: fn(X), 300.0, 10, 200)
        print(json.dumps({"program": "chain10", "peer": peer, "median_us": us, "runs": runs,
                          "rel_error": err}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
