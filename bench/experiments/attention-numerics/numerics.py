"""How accurate the attention peers are under polyfuse's own check.

polyfuse's `--check` bounds the elementwise error
    max_i |y_i - r_i| / max(|r_i|, 1e-2 * max_j |r_j|)
by 1e-2 for f16 outputs (src/runtime/data.rs); peers.py reports the
normwise error ||y - r|| / ||r||.  This script computes both for the
attention peers (SDPA's FlashAttention-2 and cuDNN back ends,
FlexAttention) and for two emulations of the value product's arithmetic:
the weights rounded once to f16 (what FlashAttention does) and the weights
split in two f16 terms (what polyfuse's kernel does), on polyfuse's input
distribution (uniform in [-1, 1), rounded to f16) and on peers.py's (normal).
The reference is float64 from the f16 inputs.

usage: python numerics.py [B H S D ...]   (groups of four; default below)
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# the two metrics as scripts/peers.py computes them for gpu-check
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts"))
from peers import elementwise_error, rel_error  # noqa: E402


def elementwise(y, r):
    return elementwise_error(torch, y, r.double())


def normwise(y, r):
    return rel_error(torch, y, r.double())[0]


def reference(q, k, v, scale, causal):
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):  # a batch at a time: the scores in f64 are large
        s = torch.matmul(q[b].double(), k[b].double().transpose(-1, -2)) * scale
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        out[b] = torch.matmul(torch.softmax(s, dim=-1), v[b].double())
    return out


def emulated(q, k, v, scale, causal, split):
    """The value product with f32 weights exp(s - m) rounded to f16 once, or
    split as hi = f16(p), lo = f16(p - hi); row sums of the f32 weights; f16 out."""
    out = torch.empty(q.shape, dtype=torch.float16, device=q.device)
    for b in range(q.shape[0]):
        s = torch.matmul(q[b].float(), k[b].float().transpose(-1, -2)) * scale
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        hi = p.half().float()
        w = hi + (p - hi).half().float() if split else hi
        # f64 products of the rounded terms: the tensor cores' f32 accumulation
        # adds far less error than the rounding measured here
        o = torch.matmul(w.double(), v[b].double()) / p.double().sum(-1, keepdim=True)
        out[b] = o.half()
    return out


def main():
    args = [int(a) for a in sys.argv[1:]] or [1, 2, 1031, 64, 1, 16, 4096, 64]
    shapes = [args[i:i + 4] for i in range(0, len(args), 4)]
    dev = "cuda"
    flex = torch.compile(flex_attention, dynamic=False)
    print("| inputs | B H S D | mask | computation | elementwise (polyfuse's check; f16 bound 1e-2) | normwise |")
    print("| --- | --- | --- | --- | --- | --- |")
    for B, H, S, D in shapes:
        for dist in ("uniform", "normal"):
            g = torch.Generator(device=dev)
            g.manual_seed(1)
            make = (lambda: torch.rand(B, H, S, D, generator=g, device=dev) * 2 - 1) if dist == "uniform" else \
                (lambda: torch.randn(B, H, S, D, generator=g, device=dev))
            q, k, v = (make().half() for _ in range(3))
            scale = D ** -0.5
            for causal in (False, True):
                r = reference(q, k, v, scale, causal)
                bm = create_block_mask(lambda b, h, i, j: j <= i, None, None, S, S, device=dev) if causal else None
                runs = []
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    runs.append(("SDPA FlashAttention-2", F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    runs.append(("SDPA cuDNN", F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)))
                runs.append(("FlexAttention", flex(q, k, v, block_mask=bm, scale=scale)))
                runs.append(("emulated: weights rounded once", emulated(q, k, v, scale, causal, False)))
                runs.append(("emulated: weights split in two", emulated(q, k, v, scale, causal, True)))
                for name, y in runs:
                    print(f"| {dist} | {B} {H} {S} {D} | {'causal' if causal else 'none'} | {name} | "
                          f"{elementwise(y, r):.2e} | {normwise(y, r):.2e} |", flush=True)
                del r, runs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
