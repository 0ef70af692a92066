"""The PyTorch extension on the GPU (issue 33 item 7); run by check.sh.

Builds the extension (polyfuse_torch.extension()), then for each case:
compiles the program through the extension, runs it on random tensors on
torch's current stream, checks it against torch, times it (CUDA events,
median of many runs after a warm-up) beside `polyfuse run --bench` of the
same program and sizes, and launches it once more from a fresh Python
thread on the default stream (that thread has no current CUDA context
until something makes one: polyfuse must find the tensors' context
itself), and loads the command line's ahead-of-time artifact of it
(`polyfuse schedule --emit artifact`, PTX for this device) through the
extension without compiling. Prints a table; writes check.log and
results.json to --out.

Exit status: 0 every check passed (and gemm within --tolerance of the
command line's time), 1 otherwise.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

LOG = None


def say(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


def median_us(torch, fn, warmup, runs, per_pair):
    """Median over `runs` event pairs of `per_pair` back-to-back calls,
    per call, in microseconds, on the current stream. As `polyfuse run
    --bench` times: the pairs are queued without waiting in between, so
    once the queue is ahead of the GPU the host's launch latency is not
    what is timed (for programs longer than the host's work per call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_pair):
            fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 / per_pair for s, e in pairs)


def cli_bench(binary, program, params, runs, log_dir, name):
    """`polyfuse run --target cuda --bench --json` of the same program and
    sizes (no cache: the default options, as the extension compiles)."""
    cmd = [binary, "run", program, "--target", "cuda", "--bench", "--runs", str(runs), "--json",
           "--no-cache"]
    for k, v in params.items():
        cmd += ["--param", f"{k}={v}"]
    say("  $", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    with open(os.path.join(log_dir, f"{name}.cli.json"), "w") as f:
        f.write(p.stdout)
    with open(os.path.join(log_dir, f"{name}.cli.stderr"), "w") as f:
        f.write(p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"polyfuse run exited {p.returncode}: {p.stderr.strip()[-500:]}")
    report = json.loads(p.stdout.strip().splitlines()[-1])
    return report["median_us"], report.get("device")


def rel_error(torch, got, want):
    got, want = got.double(), want.double()
    scale = want.abs().max().item() or 1.0
    return (got - want).abs().max().item() / scale


def case_gemm(torch, F, size):
    M, N, K = size
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    params = {"M": M, "N": N, "K": K}

    def reference():
        return torch.mm(A.float(), B.float())

    return dict(
        name="gemm_f16",
        program=os.path.join(ROOT, "examples", "gemm_f16.json"),
        params=params,
        inputs=[A, B],
        by_name={"B": B, "A": A},
        reference=reference,
        tolerance=1e-3,
        peer=("torch.mm f16", lambda: torch.mm(A, B)),
    )


def case_attention(torch, F, size):
    Bt, H, S, D = size
    q, k, v = (torch.randn(Bt, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    params = {"B": Bt, "H": H, "S": S, "D": D}

    def reference():
        # The program scales the scores by 0.25 whatever D is.
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                              scale=0.25)

    return dict(
        name="attention_causal",
        program=os.path.join(ROOT, "examples", "attention_causal.json"),
        params=params,
        inputs=[q, k, v],
        by_name={"V": v, "K": k, "Q": q},
        reference=reference,
        tolerance=2e-2,
        peer=("sdpa f16", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 scale=0.25)),
    )


def case_softmax(torch, F, size):
    N, D = size
    x = torch.randn(N, D, device="cuda", dtype=torch.float32)
    return dict(
        name="softmax",
        program=os.path.join(ROOT, "examples", "softmax.json"),
        params={"N": N, "D": D},
        inputs=[x],
        by_name={"X": x},
        reference=lambda: torch.softmax(x.double(), dim=1),
        tolerance=1e-5,
        peer=("torch.softmax", lambda: torch.softmax(x, dim=1)),
    )


def run_case(torch, polyfuse_torch, ext, case, args, log_dir):
    row = {"program": case["name"], "params": case["params"]}
    say(f"== {case['name']} {case['params']}")
    t0 = time.perf_counter()
    prog = polyfuse_torch.compile(case["program"], **case["params"])
    row["compile_s"] = round(time.perf_counter() - t0, 3)
    row["kernels"] = prog.num_kernels
    row["temps"] = prog.num_temps
    row["temps_in_memory"] = prog.num_temps_in_memory
    row["workspace_bytes"] = prog.workspace_bytes
    say(f"  compiled in {row['compile_s']} s: {prog.num_kernels} kernel(s); "
        f"{prog.num_temps} temps, {prog.num_temps_in_memory} in memory, workspace "
        f"{prog.workspace_bytes} bytes (the caller allocates no temp)")
    with open(os.path.join(log_dir, f"{case['name']}.cu"), "w") as f:
        f.write(prog.cuda_source())

    # First call: NVRTC compiles and the module loads (timed apart).
    t0 = time.perf_counter()
    out = prog(*case["inputs"])
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.perf_counter() - t0, 3)
    want = case["reference"]()
    err = rel_error(torch, out, want)
    row["max_rel_error"] = err
    ok = err <= case["tolerance"]
    # Inputs by name give the same result.
    again = prog(**case["by_name"])
    torch.cuda.synchronize()
    same = torch.equal(again, out)
    ok = ok and same
    say(f"  first call {row['first_call_s']} s; max relative error {err:.3e} "
        f"(tolerance {case['tolerance']}); by name: {'same' if same else 'DIFFERENT'}")

    # A fresh thread on the default stream, outputs given (so that nothing
    # in the call makes a CUDA context current before polyfuse launches).
    fresh = {}
    preset = torch.empty_like(out)
    preset.fill_(float("nan")) if preset.is_floating_point() else preset.zero_()
    torch.cuda.synchronize()

    def worker():
        try:
            fresh["context_before"] = ext.thread_has_cuda_context()
            prog(*case["inputs"], out=preset)
            fresh["context_after"] = ext.thread_has_cuda_context()
            fresh["stream"] = torch.cuda.current_stream().cuda_stream
        except Exception as e:  # noqa: BLE001 - reported below
            fresh["error"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    torch.cuda.synchronize()
    if "error" in fresh:
        fresh_ok = False
        say(f"  fresh thread: FAILED: {fresh['error']}")
    else:
        fresh_ok = torch.equal(preset, out)
        say(f"  fresh thread (stream handle {fresh['stream']}, current context before: "
            f"{fresh['context_before']}, after: {fresh['context_after']}): "
            f"{'same result' if fresh_ok else 'DIFFERENT result'}")
    row["fresh_thread"] = {"ok": fresh_ok, **fresh}
    ok = ok and fresh_ok

    # The workspace from torch's caching allocator gives the same result.
    if prog.workspace_bytes > 0:
        tw = polyfuse_torch.compile(case["program"], torch_workspace=True, **case["params"])
        tw_out = tw(*case["inputs"])
        torch.cuda.synchronize()
        tw_same = torch.equal(tw_out, out)
        say(f"  torch-allocated workspace: {'same result' if tw_same else 'DIFFERENT result'}")
        row["torch_workspace_same"] = tw_same
        ok = ok and tw_same

    # Ahead of time: the command line's artifact (with PTX for this
    # device) loaded by the extension, without compiling; its first call
    # loads the stored PTX instead of running NVRTC.
    try:
        cc = torch.cuda.get_device_capability()
        path = os.path.join(log_dir, f"{case['name']}.artifact.json")
        cmd = [args.polyfuse, "schedule", case["program"], "--emit", "artifact", "--arch",
               f"sm_{cc[0]}{cc[1]}", "--no-cache"]
        for k, v in case["params"].items():
            cmd += ["--param", f"{k}={v}"]
        with open(path, "w") as f:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"polyfuse schedule --emit artifact: {p.stderr.strip()[-500:]}")
        t0 = time.perf_counter()
        aot = polyfuse_torch.compile(path)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        aot_out = aot(*case["inputs"])
        torch.cuda.synchronize()
        aot_first = time.perf_counter() - t0
        aot_err = rel_error(torch, aot_out, want)
        aot_ok = aot_err <= case["tolerance"]
        row["aot"] = {"load_s": round(load_s, 4), "first_call_s": round(aot_first, 3),
                      "max_rel_error": aot_err, "ok": aot_ok}
        say(f"  artifact ({os.path.getsize(path)} bytes): loaded in {load_s * 1e3:.1f} ms, first "
            f"call {aot_first:.3f} s (compiled: {row['compile_s']} s + {row['first_call_s']} s), "
            f"max relative error {aot_err:.3e}")
    except Exception as e:  # noqa: BLE001 - reported and counted
        aot_ok = False
        row["aot"] = {"ok": False, "error": str(e)}
        say(f"  artifact: FAILED: {e}")
    ok = ok and aot_ok

    call = lambda: prog(*case["inputs"], out=preset)  # noqa: E731
    row["ext_us"] = median_us(torch, call, args.warmup, args.runs, 1)
    row["ext_b2b_us"] = median_us(torch, call, args.warmup, max(args.runs // 5, 5), 10)
    peer_name, peer = case["peer"]
    row["peer"] = peer_name
    row["peer_us"] = median_us(torch, peer, args.warmup, args.runs, 1)
    try:
        row["cli_us"], row["device"] = cli_bench(args.polyfuse, case["program"], case["params"],
                                                 args.runs, log_dir, case["name"])
    except Exception as e:  # noqa: BLE001 - reported in the table
        row["cli_us"] = None
        row["cli_error"] = str(e)
        say(f"  polyfuse run --bench failed: {e}")
    if row["cli_us"]:
        row["ext_over_cli"] = row["ext_us"] / row["cli_us"]
    row["ok"] = ok
    say(f"  extension {row['ext_us']:.1f} us (10 back to back: {row['ext_b2b_us']:.1f} us); "
        f"polyfuse run --bench {row['cli_us']} us; {peer_name} {row['peer_us']:.1f} us")
    return row


def main():
    global LOG
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/polyfuse-torch-check")
    ap.add_argument("--polyfuse", default=os.path.join(ROOT, "target", "release", "polyfuse"))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="gemm's allowed slowdown against the command line (0.05: 5%%)")
    ap.add_argument("--gemm", default="4096,4096,4096", help="M,N,K")
    ap.add_argument("--attention", default="4,16,2048,64", help="B,H,S,D")
    ap.add_argument("--softmax", default="4096,1024", help="N,D")
    ap.add_argument("--only", default="", help="comma-separated subset: gemm,attention,softmax")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "check.log"), "w")

    import torch
    import torch.nn.functional as F

    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
    if not torch.cuda.is_available():
        say("check: FAILED: torch sees no GPU")
        return 1
    import polyfuse_torch

    # The build folder stays out of --out: its objects are large, and
    # $OUT is what comes back from the GPU machine.
    os.environ.setdefault("POLYFUSE_TORCH_BUILD", "/tmp/polyfuse-torch-build")
    t0 = time.perf_counter()
    try:
        ext = polyfuse_torch.extension(verbose=True)
    except Exception:
        say("check: FAILED: the extension did not build")
        say(traceback.format_exc())
        return 1
    say(f"extension built in {time.perf_counter() - t0:.1f} s")
    torch.manual_seed(0)

    sizes = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    cases = [("gemm", case_gemm, sizes(args.gemm)),
             ("attention", case_attention, sizes(args.attention)),
             ("softmax", case_softmax, sizes(args.softmax))]
    only = set(filter(None, args.only.split(",")))
    rows = []
    for key, make, size in cases:
        if only and key not in only:
            continue
        try:
            rows.append(run_case(torch, polyfuse_torch, ext, make(torch, F, size), args, args.out))
        except Exception:
            say(f"  {key}: FAILED")
            say(traceback.format_exc())
            rows.append({"program": key, "ok": False, "error": traceback.format_exc()})
        torch.cuda.empty_cache()

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)

    say("")
    say(f"{'program':<18}{'sizes':<28}{'check':<7}{'rel err':>10}{'ws bytes':>12}"
        f"{'ext us':>10}{'ext b2b':>10}{'cli us':>10}{'ext/cli':>9}{'peer us':>10}  peer")
    ok = True
    for r in rows:
        if "ext_us" not in r:
            say(f"{r['program']:<18}{'':<28}{'FAIL':<7}")
            ok = False
            continue
        p = ",".join(f"{k}={v}" for k, v in r["params"].items())
        ratio = f"{r['ext_over_cli']:.3f}" if r.get("ext_over_cli") else "-"
        cli = f"{r['cli_us']:.1f}" if r.get("cli_us") else "-"
        say(f"{r['program']:<18}{p:<28}{'ok' if r['ok'] else 'FAIL':<7}{r['max_rel_error']:>10.2e}"
            f"{r['workspace_bytes']:>12}{r['ext_us']:>10.1f}{r['ext_b2b_us']:>10.1f}{cli:>10}"
            f"{ratio:>9}{r['peer_us']:>10.1f}  {r['peer']}")
        ok = ok and r["ok"]
        if r["program"] == "gemm_f16":
            within = r.get("ext_over_cli") is not None and r["ext_over_cli"] <= 1 + args.tolerance
            r["within_tolerance"] = within
            ok = ok and within
    say("ext us: one call per event pair, pairs queued back to back (torch's current stream); "
        "ext b2b: 10 calls per pair; cli us: polyfuse run --bench (same program and sizes, no "
        "cache; programs under 100 us replayed as a CUDA graph there); peer: torch's own op")
    gemm = [r for r in rows if r.get("program") == "gemm_f16" and "ext_over_cli" in r]
    if gemm:
        say(f"gemm f16 through the extension: {gemm[0]['ext_over_cli']:.3f}x the command line "
            f"({'within' if gemm[0].get('within_tolerance') else 'NOT within'} "
            f"{args.tolerance:.0%})")
    say(f"check: {'ok' if ok else 'FAILED'} (logs in {args.out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
