#!/usr/bin/env python3
"""Times the PyTorch peers of polyfuse programs on the GPU.

    scripts/peers.py SPEC [SPEC ...] [--param NAME=VALUE ...] [--compile LIST]

A SPEC is a program file (examples/gemm.json), a program name looked up in
examples/ and bench/programs/ (gemm, gemm_4096), or `copy`; `@NAME=V,NAME=V`
after it overrides parameters for that program only (gemm@M=37,N=53,K=29),
and `--param` overrides them for every program. `copy@MIB=256` times a
device-to-device copy of that many MiB (default 256), the bandwidth ceiling,
counted as bytes read plus bytes written.

For every program it makes fresh random inputs (uniform in [-1, 1), from
--seed) of the shapes in the file, runs each peer once and compares it with
a float64 reference written from the program's statements (relative error
||out - ref|| / ||ref||, limit --tol), then times it: warm-up, then the
median of many runs, each between two CUDA events (no L2 flush, as
polyfuse's --bench). float32 matrix products run in full float32:
torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
are False, and every line says so.

The peers: torch.matmul (gemm), torch.mv (matvec), linear+relu (fcrelu),
conv2d, max_pool2d, torch.bmm (tbmm), two matmuls (gemm_chain),
torch.softmax, layer_norm, a*x+z, x.sum(dim=1), x.t().contiguous(),
scaled_dot_product_attention (default, flash and cuDNN backends) and
FlexAttention (compiled) for attention (for BigBird, SDPA with a dense
boolean mask and FlexAttention with the same mask as a block mask), and
torch.compile (mode default) of the first peer's eager function where
--compile names the program (all, none, or a comma list of names; default
all).

Output: one JSON line per (program, peer) on stdout (or --out FILE, written
as they come):
  {"program", "params", "peer", "median_us", "runs", "bytes", "flops",
   "gb_per_s", "tflop_per_s", "check": {"ok", "rel_error", "elementwise"},
   "tf32": false}
"rel_error" is the normwise error ||out - ref|| / ||ref|| that decides "ok";
"elementwise" is the error polyfuse's own --check bounds (src/runtime/data.rs:
max |out - ref| / max(|ref|, 1e-2 max |ref|)), reported so that a peer's
accuracy can be read against the bound polyfuse's kernels are held to.
or {"program", "peer", "error"} where a peer failed. Progress on stderr.
--dry-run prints the plan (shapes, bytes, flops) without importing torch.
"""

import argparse
import ast
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i32": 4}


def log(msg):
    print(f"peers: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Programs: files, parameters, shapes


def find_program(name):
    if os.path.isfile(name):
        return name
    for folder in ("examples", os.path.join("bench", "programs")):
        path = os.path.join(ROOT, folder, name + ".json")
        if os.path.isfile(path):
            return path
    raise SystemExit(f"peers: no program file {name} (nor examples/ or bench/programs/{name}.json)")


def parse_params(text, what):
    out = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise SystemExit(f"peers: bad parameter {item!r} in {what}: NAME=VALUE expected")
        k, v = item.split("=", 1)
        out[k.strip()] = int(v)
    return out


def affine(expr, params):
    """Evaluates a shape entry: an integer, a parameter, or +,-,* of them."""
    if isinstance(expr, int):
        return expr

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return params[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
        raise SystemExit(f"peers: shape entry {expr!r} is not affine")

    return ev(ast.parse(str(expr), mode="eval"))


class Program:
    def __init__(self, path, overrides):
        with open(path) as f:
            doc = json.load(f)
        self.path = path
        self.name = doc["name"]
        self.params = dict(doc["params"])
        for k, v in overrides.items():
            if k not in self.params:
                raise SystemExit(f"peers: {self.name} has no parameter {k}")
            self.params[k] = v
        missing = [k for k, v in self.params.items() if v is None]
        if missing:
            raise SystemExit(f"peers: {self.name}: give --param for {', '.join(missing)}")

        def shapes(section):
            return {
                n: (t["dtype"], [affine(e, self.params) for e in t["shape"]])
                for n, t in doc.get(section, {}).items()
            }

        self.body = list(doc.get("body", []))
        self.inputs = shapes("inputs")
        self.outputs = shapes("outputs")
        self.kind = kind_of(self.name)

    def bytes(self):
        total = 0
        for dtype, shape in list(self.inputs.values()) + list(self.outputs.values()):
            total += DTYPE_BYTES[dtype] * math.prod(shape)
        return total


# --------------------------------------------------------------------------
# Peers by kind of program. Each kind has its peers (label, eager function
# of the input tensors by name), a float64 reference written from the
# program's statements, and a flop count (multiply-add = 2).


def kind_of(name):
    best = None
    for kind in KINDS:
        if name == kind or name.startswith(kind + "_"):
            if best is None or len(kind) > len(best):
                best = kind
    return best  # None: no peer known (the program is skipped)


def flops(kind, p):
    if kind in ("gemm", "gemm_nt"):
        return 2 * p["M"] * p["N"] * p["K"]
    if kind == "matvec":
        return 2 * p["M"] * p["N"]
    if kind == "fcrelu":
        return 2 * p["B"] * p["M"] * p["N"] + 2 * p["B"] * p["N"]
    if kind == "conv2d":
        oh, ow = p["H"] - p["KH"] + 1, p["W"] - p["KW"] + 1
        return 2 * p["N"] * p["F"] * oh * ow * p["C"] * p["KH"] * p["KW"]
    if kind == "conv2d_strided":
        return 2 * p["N"] * p["F"] * p["OH"] * p["OW"] * p["C"] * p["KH"] * p["KW"]
    if kind == "maxpool2x2":
        return 4 * p["B"] * p["C"] * p["H"] * p["W"]
    if kind == "tbmm":
        return 2 * p["B"] * p["N"] * p["M"] * p["K"]
    if kind == "gemm_chain":
        return 2 * p["M"] * p["N"] * p["K"] + 2 * p["M"] * p["L"] * p["N"]
    if kind == "softmax":  # max, subtract, exp, sum, divide
        return 5 * p["N"] * p["D"]
    if kind == "layernorm":  # mean 2, variance 4, output 4 per element
        return 10 * p["N"] * p["D"]
    if kind == "scale_add":
        return 2 * p["M"] * p["N"]
    if kind == "rowsum":
        return p["M"] * p["N"]
    if kind == "transpose":
        return 0
    if kind == "gemm_bias_gelu":
        return 2 * p["M"] * p["N"] * p["K"]
    if kind == "layernorm_matmul":  # the product; the statistics are 10 T D
        return 2 * p["T"] * p["D"] * p["N"] + 10 * p["T"] * p["D"]
    if kind == "rmsnorm_ffn_swiglu":  # gate, up and down products
        return 6 * p["T"] * p["D"] * p["F"]
    if kind == "lstm_cell":  # X W and Hp U into the four gates
        return 8 * p["B"] * p["H"] * (p["I"] + p["H"])
    if kind == "attention_global":  # QK^T and PV, 2 flops per multiply-add
        return 4 * p["B"] * p["H"] * p["S"] * p["S"] * p["D"]
    if kind == "attention_causal":  # the pairs j <= i only
        return 4 * p["B"] * p["H"] * (p["S"] * (p["S"] + 1) // 2) * p["D"]
    if kind == "attention_decode_causal":  # j <= KV - NQ + i
        pairs = sum(p["KV"] - p["NQ"] + i + 1 for i in range(p["NQ"]))
        return 4 * p["B"] * p["H"] * pairs * p["D"]
    if kind == "attention_bigbird":  # the pairs the mask allows
        return 4 * p["B"] * p["H"] * bigbird_pairs(p["S"], p["W"], p["G"]) * p["D"]
    raise KeyError(kind)


def input_scales(prog):
    """Factors for inputs that would overflow the program's narrow type
    when every input is standard normal: the weights of a feed-forward
    block (the down projection's sum over F = 11008 products of values
    near 64 x 64 passes f16's 65504), scaled by 1/sqrt(fan-in) as a
    network's initialisation is."""
    if prog.kind == "rmsnorm_ffn_swiglu":
        d, f = prog.params["D"], prog.params["F"]
        return {"Wg": d ** -0.5, "Wu": d ** -0.5, "Wd": f ** -0.5}
    return {}


def attention_scale(prog):
    """The softmax scale: the literal the scores are multiplied by in the
    statement that defines T (`T(...) = P(...) * 0.125 ...`)."""
    import re

    for stmt in prog.body:
        if stmt.replace(" ", "").startswith("T("):
            m = re.search(r"\*\s*([0-9][0-9.eE+-]*)", stmt)
            if m:
                return float(m.group(1))
    raise SystemExit(f"peers: {prog.name}: no `T(...) = P(...) * scale` statement")


def attention_kind(prog):
    """Peers and reference of the attention programs: Q, K, V as
    [B, H, rows, D], Y = softmax(scale Q K^T, masked) V. The mask: none
    (global), j <= i (causal prefill), j <= KV - NQ + i (causal decoding,
    aligned to the end of the cache)."""
    import torch
    import torch.nn.functional as F

    scale = attention_scale(prog)
    p = prog.params
    if prog.kind == "attention_global":
        offset = None
    elif prog.kind == "attention_causal":
        offset = 0
    else:
        offset = p["KV"] - p["NQ"]
    lq, lkv = prog.inputs["Q"][1][2], prog.inputs["K"][1][2]

    def allowed(device):
        i = torch.arange(lq, device=device).unsqueeze(1)
        j = torch.arange(lkv, device=device).unsqueeze(0)
        return j <= i + offset

    def ref(t):
        s = torch.matmul(t["Q"], t["K"].transpose(-1, -2)) * scale
        if offset is not None:
            s = s.masked_fill(~allowed(s.device), float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), t["V"])

    # SDPA: is_causal is top-left aligned, right for prefill (lq == lkv);
    # decoding gets no mask where every j is allowed, else a boolean one.
    if offset is None or (offset == 0 and lq == lkv) or offset >= lkv - 1:
        causal = offset == 0 and lq == lkv and lq > 1
        mask = None
    else:
        causal, mask = False, "explicit"

    def sdpa(t, backend=None):
        m = allowed(t["Q"].device) if mask else None
        if backend is None:
            return F.scaled_dot_product_attention(t["Q"], t["K"], t["V"], attn_mask=m, is_causal=causal, scale=scale)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(t["Q"], t["K"], t["V"], attn_mask=m, is_causal=causal, scale=scale)

    from torch.nn.attention import SDPBackend

    peers = [
        ("SDPA", lambda t: sdpa(t)),
        ("SDPA flash", lambda t: sdpa(t, SDPBackend.FLASH_ATTENTION)),
        ("SDPA cuDNN", lambda t: sdpa(t, SDPBackend.CUDNN_ATTENTION)),
    ]
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        block_masks = {}

        def flex_peer(t):
            bm = None
            if offset is not None:
                key = str(t["Q"].device)
                if key not in block_masks:
                    off = offset
                    block_masks[key] = create_block_mask(
                        lambda b, h, q, kv: kv <= q + off, None, None, lq, lkv, device=t["Q"].device)
                bm = block_masks[key]
            return flex(t["Q"], t["K"], t["V"], block_mask=bm, scale=scale)

        peers.append(("FlexAttention", flex_peer))
    except ImportError:
        pass
    return peers, ref


def bigbird_pairs(s, w, g):
    """The (i, j) that BigBird's mask allows: (i - w <= j <= i + w) or
    j < g or i < g, over i, j < s; by rows, without torch."""
    total = 0
    for i in range(s):
        if i < g:
            total += s
            continue
        lo, hi = max(i - w, 0), min(i + w, s - 1)
        band = hi - lo + 1
        total += band + g - max(0, min(hi, g - 1) - lo + 1)
    return total


def where_mask(torch, prog, rows, cols, device):
    """The mask of the program's `T(...) = ... where COND` statement as a
    boolean [rows, cols] tensor over (i, j): COND evaluated from the text
    (affine comparisons joined by && and ||, parameters from the file), so
    that the reference computes what the program does, whatever the
    peers' own masks say."""
    stmt = next(b for b in prog.body if b.replace(" ", "").startswith("T("))
    cond = stmt.split(" where ", 1)[1].replace("&&", " and ").replace("||", " or ")
    env = dict(prog.params)
    env["i"] = torch.arange(rows, device=device).unsqueeze(1)
    env["j"] = torch.arange(cols, device=device).unsqueeze(0)
    cmps = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq"}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            out = vals[0]
            for v in vals[1:]:
                out = (out & v) if isinstance(node.op, ast.And) else (out | v)
            return out
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = ev(node.left), ev(node.comparators[0])
            return getattr(torch, cmps[type(node.ops[0])])(torch.as_tensor(a, device=device), b)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult):
            a, b = ev(node.left), ev(node.right)
            return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b}[type(node.op)]()
        raise SystemExit(f"peers: {prog.name}: cannot evaluate {ast.dump(node)} in the where clause")

    return torch.broadcast_to(ev(ast.parse(cond, mode="eval")), (rows, cols))


def bigbird_kind(prog):
    """BigBird (examples/attention_bigbird.json): a window of W keys either
    side, G global rows and G global columns. The reference applies the
    program's own `where` clause (where_mask); the peers build the mask
    from W and G: SDPA with it as a dense boolean mask, and FlexAttention
    (compiled) with the same mask_mod through create_block_mask, at blocks
    of 64 (the kernel's key tile) and at Flex's default 128. The masks are
    built once per device, outside the timing."""
    import torch
    import torch.nn.functional as F

    scale = attention_scale(prog)
    p = prog.params
    s, w, g = p["S"], p["W"], p["G"]

    def mask_mod(b, h, q, kv):
        return ((kv >= q - w) & (kv <= q + w)) | (kv < g) | (q < g)

    def ref(t):
        sc = torch.matmul(t["Q"], t["K"].transpose(-1, -2)) * scale
        sc = sc.masked_fill(~where_mask(torch, prog, s, s, sc.device), float("-inf"))
        return torch.matmul(torch.softmax(sc, dim=-1), t["V"])

    dense = {}

    def allowed(device):
        key = str(device)
        if key not in dense:
            i = torch.arange(s, device=device).unsqueeze(1)
            j = torch.arange(s, device=device).unsqueeze(0)
            dense[key] = mask_mod(None, None, i, j)
        return dense[key]

    def sdpa(t):
        m = allowed(t["Q"].device)
        return F.scaled_dot_product_attention(t["Q"], t["K"], t["V"], attn_mask=m, scale=scale)

    peers = [("SDPA (boolean mask)", sdpa)]
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        block_masks = {}

        def flex_peer(block, options):
            def run(t):
                key = (str(t["Q"].device), block)
                if key not in block_masks:
                    block_masks[key] = create_block_mask(
                        mask_mod, None, None, s, s, device=t["Q"].device, BLOCK_SIZE=block)
                return flex(t["Q"], t["K"], t["V"], block_mask=block_masks[key], scale=scale,
                            kernel_options=options)

            return run

        # Blocks of 64 (the target's): the kernel's tiles must divide the
        # mask's blocks, and its one default configuration without
        # max-autotune has 128 query rows, so they are given. Flex's own
        # default (blocks of 128, its default tiles) as well.
        peers.append(("FlexAttention (blocks of 64)", flex_peer(64, {"BLOCK_M": 64, "BLOCK_N": 64})))
        peers.append(("FlexAttention", flex_peer(128, None)))
    except ImportError:
        pass
    return peers, ref


def make_kinds():
    """Peers and references; torch is imported by the caller first."""
    import torch
    import torch.nn.functional as F

    def conv_ref(t, stride):
        i, w = t["I"], t["Wt"]
        kh, kw = w.shape[2], w.shape[3]
        patches = i.unfold(2, kh, stride).unfold(3, kw, stride)  # n c h w y x
        return torch.einsum("nchwyx,fcyx->nfhw", patches, w)

    def softmax_ref(t):
        x = t["X"]
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)

    def layernorm_ref(t):
        x = t["X"]
        d = x.shape[1]
        mean = (x / d).sum(dim=1, keepdim=True)
        var = ((x - mean) * (x - mean) / d).sum(dim=1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5) * t["gamma"] + t["beta"]

    def gelu_tanh(x):
        return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    def rmsnorm(t, dtype):
        x = t["X"].to(dtype)
        ms = (x * x).mean(dim=1, keepdim=True)
        return x * torch.rsqrt(ms + 1e-6) * t["w"].to(dtype)

    def ffn_swiglu(t):
        xn = rmsnorm(t, torch.float32).to(t["X"].dtype)
        h = F.silu(torch.matmul(xn, t["Wg"]).float()) * torch.matmul(xn, t["Wu"]).float()
        return torch.matmul(h.to(t["X"].dtype), t["Wd"])

    def ffn_swiglu_ref(t):
        xn = rmsnorm(t, torch.float64)
        g, u = xn @ t["Wg"], xn @ t["Wu"]
        return (g * torch.sigmoid(g) * u) @ t["Wd"]

    def lstm_cell(t, ref):
        g = torch.matmul(t["X"], t["W"]).float() + torch.matmul(t["Hp"], t["U"]).float() + t["bias"]
        if ref:
            g = g.double()
        i, f, c, o = g.chunk(4, dim=1)
        cn = torch.sigmoid(f) * t["Cp"] + torch.sigmoid(i) * torch.tanh(c)
        hn = torch.sigmoid(o) * torch.tanh(cn)
        return hn if ref else hn.to(t["Hp"].dtype)

    return {
        "gemm_bias_gelu": (
            [("F.gelu(A @ B + bias, tanh)",
              lambda t: F.gelu(torch.matmul(t["A"], t["B"]) + t["bias"], approximate="tanh"))],
            lambda t: gelu_tanh(t["A"] @ t["B"] + t["bias"]),
        ),
        "layernorm_matmul": (
            [("F.layer_norm then matmul",
              lambda t: torch.matmul(
                  F.layer_norm(t["X"], (t["X"].shape[1],), t["gamma"], t["beta"], eps=1e-5), t["W"]))],
            lambda t: layernorm_ref(t) @ t["W"],
        ),
        "rmsnorm_ffn_swiglu": (
            [("RMSNorm, silu(x Wg) * (x Wu), then Wd", ffn_swiglu)],
            ffn_swiglu_ref,
        ),
        "lstm_cell": (
            [("two matmuls, gates (h only)", lambda t: lstm_cell(t, False))],
            lambda t: lstm_cell(t, True),
        ),
        "gemm": (
            [("torch.matmul", lambda t: torch.matmul(t["A"], t["B"]))],
            lambda t: torch.einsum("ik,kj->ij", t["A"], t["B"]),
        ),
        "gemm_nt": (
            [("torch.matmul(A, B.t())", lambda t: torch.matmul(t["A"], t["B"].t()))],
            lambda t: torch.einsum("ik,jk->ij", t["A"], t["B"]),
        ),
        "matvec": (
            [("torch.mv", lambda t: torch.mv(t["A"], t["x"]))],
            lambda t: torch.einsum("ij,j->i", t["A"], t["x"]),
        ),
        "fcrelu": (
            [("linear+relu", lambda t: torch.relu(F.linear(t["I"], t["W1"], t["B1"])))],
            lambda t: torch.clamp(torch.einsum("bm,nm->bn", t["I"], t["W1"]) + t["B1"], min=0),
        ),
        "conv2d": (
            [("F.conv2d", lambda t: F.conv2d(t["I"], t["Wt"]))],
            lambda t: conv_ref(t, 1),
        ),
        "conv2d_strided": (
            [("F.conv2d stride 2", lambda t: F.conv2d(t["I"], t["Wt"], stride=2))],
            lambda t: conv_ref(t, 2),
        ),
        "maxpool2x2": (
            [("F.max_pool2d", lambda t: F.max_pool2d(t["X"], 2))],
            lambda t: t["X"].unfold(2, 2, 2).unfold(3, 2, 2).amax(dim=(-1, -2)),
        ),
        "tbmm": (
            [("torch.bmm", lambda t: torch.bmm(t["X"], t["Y"].transpose(1, 2)))],
            lambda t: torch.einsum("bnk,bmk->bnm", t["X"], t["Y"]),
        ),
        "gemm_chain": (
            [("2x torch.matmul", lambda t: torch.matmul(torch.matmul(t["A"], t["B"]), t["C"]))],
            lambda t: torch.einsum("ij,jl->il", torch.einsum("ik,kj->ij", t["A"], t["B"]), t["C"]),
        ),
        "softmax": (
            [("torch.softmax", lambda t: torch.softmax(t["X"], dim=1))],
            softmax_ref,
        ),
        "layernorm": (
            [
                (
                    "F.layer_norm",
                    lambda t: F.layer_norm(t["X"], (t["X"].shape[1],), t["gamma"], t["beta"], eps=1e-5),
                )
            ],
            layernorm_ref,
        ),
        "scale_add": (
            [("a*x+z", lambda t: t["a"] * t["X"] + t["Z"])],
            lambda t: t["a"].reshape(()) * t["X"] + t["Z"],
        ),
        "rowsum": (
            [("x.sum(dim=1)", lambda t: t["X"].sum(dim=1))],
            lambda t: torch.einsum("ij->i", t["X"]),
        ),
        "transpose": (
            [("x.t().contiguous()", lambda t: t["X"].t().contiguous())],
            lambda t: t["X"].permute(1, 0).clone(),
        ),
        # Built per program (scale and mask from the file).
        "attention_global": attention_kind,
        "attention_causal": attention_kind,
        "attention_decode_causal": attention_kind,
        "attention_bigbird": bigbird_kind,
    }


KINDS = [
    "gemm", "gemm_nt", "matvec", "fcrelu", "conv2d", "conv2d_strided", "maxpool2x2", "tbmm",
    "gemm_chain", "softmax", "layernorm", "scale_add", "rowsum", "transpose",
    "attention_global", "attention_causal", "attention_decode_causal", "attention_bigbird",
    "gemm_bias_gelu", "layernorm_matmul", "rmsnorm_ffn_swiglu", "lstm_cell",
]


# --------------------------------------------------------------------------
# Timing


def time_cpu(fn, target_ms, min_runs, max_runs):
    """--device cpu (to try the script without a GPU): host clock."""
    for _ in range(2):
        fn()
    t0 = time.perf_counter()
    fn()
    per_run_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    runs = int(min(max_runs, max(min_runs, target_ms / per_run_ms)))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times) * 1000.0, runs


def time_cuda(torch, fn, target_ms, min_runs, max_runs):
    """Median of single runs between CUDA events, after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    # Estimate one run to size the sample.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    per_run_ms = max(start.elapsed_time(end) / 5, 1e-3)
    runs = int(min(max_runs, max(min_runs, target_ms / per_run_ms)))
    if per_run_ms < 0.1:
        # Short kernels: the host's dispatch (Python, the framework) would
        # be timed too. Capture one call in a CUDA graph and time replays,
        # 20 per event pair (METHOD.md: graph replay for small launches).
        try:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
                with torch.cuda.graph(graph, stream=stream):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            reps = 20
            for _ in range(3):
                graph.replay()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
            for s_, e_ in zip(starts, ends):
                s_.record()
                for _ in range(reps):
                    graph.replay()
                e_.record()
            torch.cuda.synchronize()
            times = [s_.elapsed_time(e_) / reps for s_, e_ in zip(starts, ends)]
            return statistics.median(times) * 1000.0, runs
        except Exception as e:  # not capturable: time plain calls
            log(f"graph capture failed ({type(e).__name__}); timing single calls")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(times) * 1000.0, runs


def rel_error(torch, out, ref):
    out = out.double()
    if out.shape != ref.shape:
        return math.inf, f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not bool(torch.isfinite(out).all()):
        return math.inf, "non-finite output"
    denom = float(torch.linalg.vector_norm(ref))
    num = float(torch.linalg.vector_norm(out - ref))
    return (num / denom if denom > 0 else num), None


def elementwise_error(torch, out, ref):
    """polyfuse's --check metric: max |out - ref| / max(|ref|, 1e-2 max |ref|)."""
    out = out.double()
    if out.shape != ref.shape or not bool(torch.isfinite(out).all()):
        return None
    floor = 1e-2 * float(ref.abs().max())
    if floor == 0.0:
        return float((out - ref).abs().max())
    return float(((out - ref).abs() / ref.abs().clamp(min=floor)).max())


# --------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", metavar="SPEC")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="override a parameter in every program")
    ap.add_argument("--compile", default="all",
                    help="programs that also get a torch.compile peer: all, none, or names")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-4, help="relative error limit (f32)")
    ap.add_argument("--target-ms", type=float, default=300.0, help="timed milliseconds per peer")
    ap.add_argument("--min-runs", type=int, default=10)
    ap.add_argument("--max-runs", type=int, default=500)
    ap.add_argument("--out", help="write the JSON lines to this file (default: stdout)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the script without a GPU")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, import no torch")
    args = ap.parse_args()

    common = parse_params(",".join(args.param), "--param")
    jobs = []
    for spec in args.specs:
        name, _, over = spec.partition("@")
        if name == "copy":
            jobs.append(("copy", parse_params(over, spec)))
            continue
        overrides = dict(common)
        overrides.update(parse_params(over, spec))
        prog = Program(find_program(name), overrides)
        if prog.kind is None:
            log(f"{prog.name}: no peer known (known: {', '.join(sorted(KINDS))}); skipped")
            continue
        jobs.append(("program", prog))
    compile_all = args.compile == "all"
    compile_set = set() if args.compile in ("all", "none") else set(filter(None, args.compile.split(",")))

    if args.dry_run:
        for what, job in jobs:
            if what == "copy":
                mib = job.get("MIB", 256)
                print(json.dumps({"program": "copy", "bytes": 2 * mib * 2**20}))
            else:
                print(json.dumps({
                    "program": job.name, "kind": job.kind, "params": job.params,
                    "inputs": {k: v[1] for k, v in job.inputs.items()},
                    "outputs": {k: v[1] for k, v in job.outputs.items()},
                    "bytes": job.bytes(), "flops": flops(job.kind, job.params),
                    "compile": compile_all or job.name in compile_set,
                }))
        return 0

    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        log("no CUDA device visible to PyTorch")
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = True
    kinds = make_kinds()
    dev = torch.device(args.device)
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    failed = 0

    sink = open(args.out, "w") if args.out else sys.stdout

    def emit(obj):
        print(json.dumps(obj), file=sink, flush=True)

    def timed(fn):
        if cuda:
            return time_cuda(torch, fn, args.target_ms, args.min_runs, args.max_runs)
        return time_cpu(fn, args.target_ms, args.min_runs, args.max_runs)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for what, job in jobs:
        if what == "copy":
            mib = job.get("MIB", 256)
            n = mib * 2**20 // 4
            try:
                src = torch.rand(n, device=dev)
                dst = torch.empty_like(src)
                us, runs = timed(lambda: dst.copy_(src))
                ok = bool(torch.equal(dst, src))
                nbytes = 2 * n * 4
                emit({"program": "copy", "params": {"MIB": mib}, "peer": "device-to-device copy",
                      "device": device_name, "median_us": us, "runs": runs, "bytes": nbytes,
                      "flops": 0, "gb_per_s": nbytes / us / 1e3, "tflop_per_s": 0.0,
                      "check": {"ok": ok, "rel_error": 0.0 if ok else math.inf}, "tf32": False})
                log(f"copy {mib} MiB: {us:.1f} us, {nbytes / us / 1e3:.0f} GB/s")
                del src, dst
            except Exception as e:  # keep going: report and continue
                failed += 1
                emit({"program": "copy", "peer": "device-to-device copy", "error": f"{type(e).__name__}: {e}"})
            continue

        prog = job
        entry = kinds[prog.kind]
        peers, ref_fn = entry(prog) if callable(entry) else entry
        gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed)
        try:
            tensors = {}
            narrow = {"f16": torch.float16, "bf16": torch.bfloat16}
            for name, (dtype, shape) in prog.inputs.items():
                if dtype == "f32":
                    tensors[name] = torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * 2 - 1
                elif dtype in narrow:
                    # Random normal values, stored narrow: the peer runs in
                    # the program's precision (f32 accumulation in cuBLAS).
                    x = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32)
                    tensors[name] = x.to(narrow[dtype])
                else:
                    raise ValueError(f"input {name} is {dtype}; peers.py makes f32, f16 and bf16 inputs")
            for name, factor in input_scales(prog).items():
                tensors[name] = (tensors[name].float() * factor).to(tensors[name].dtype)
            ref = ref_fn({k: v.double() for k, v in tensors.items()})
            # The error limit of the narrowest type the program stores.
            dtypes = {d for d, _ in list(prog.inputs.values()) + list(prog.outputs.values())}
            tol = args.tol
            if "bf16" in dtypes:
                tol = max(tol, 1e-2)
            elif "f16" in dtypes:
                tol = max(tol, 2e-3)
        except Exception as e:
            failed += 1
            emit({"program": prog.name, "peer": "inputs", "error": f"{type(e).__name__}: {e}"})
            log(f"{prog.name}: inputs or reference failed: {e}")
            continue

        nbytes, nflops = prog.bytes(), flops(prog.kind, prog.params)
        plist = list(peers)
        if compile_all or prog.name in compile_set:
            # A fresh compile per program: static shapes (no automatic
            # dynamic shapes carried over from an earlier size).
            torch._dynamo.reset()
            eager = peers[0][1]
            plist.append((f"torch.compile({peers[0][0]})", torch.compile(eager, dynamic=False)))
        for label, fn in plist:
            t0 = time.time()
            try:
                out = fn(tensors)
                sync()
                err, why = rel_error(torch, out, ref)
                ok = why is None and err <= tol
                elementwise = elementwise_error(torch, out, ref)
                del out
                us, runs = timed(lambda: fn(tensors))
                line = {
                    "program": prog.name, "params": prog.params, "peer": label, "device": device_name,
                    "median_us": us, "runs": runs, "bytes": nbytes, "flops": nflops,
                    "gb_per_s": nbytes / us / 1e3, "tflop_per_s": nflops / us / 1e6,
                    "check": {"ok": ok, "rel_error": err if math.isfinite(err) else None,
                              "elementwise": elementwise},
                    "tf32": False,
                }
                if why:
                    line["check"]["why"] = why
                if not ok:
                    failed += 1
                emit(line)
                log(f"{prog.name}: {label}: {us:.1f} us, rel error {err:.2e}"
                    f"{'' if ok else ' FAILED'} ({time.time() - t0:.1f} s)")
            except Exception as e:
                first = str(e).splitlines()[0] if str(e) else ""
                if "No available kernel" in first:
                    # An SDPA backend forced on inputs it has no kernel for
                    # (FlashAttention with a mask other than causal): the
                    # peer does not apply, nothing failed.
                    emit({"program": prog.name, "params": prog.params, "peer": label,
                          "skipped": "the backend has no kernel for these inputs"})
                    log(f"{prog.name}: {label}: not applicable (no kernel for these inputs)")
                    continue
                failed += 1
                emit({"program": prog.name, "params": prog.params, "peer": label,
                      "error": f"{type(e).__name__}: {first}"})
                log(f"{prog.name}: {label}: FAILED: {type(e).__name__}: {e}")
        del tensors, ref
        if cuda:
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
