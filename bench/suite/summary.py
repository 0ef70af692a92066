#!/usr/bin/env python3
"""The suite's table from one call of bench/suite/run.sh: per program, the
checks, polyfuse's default and --no-fusion-by-cost times, the fastest PyTorch
peer timed in the same call, and the ratio (polyfuse default / best peer).

    python3 bench/suite/summary.py OUT_DIR     # reads suite.jsonl, peers.jsonl
"""
import json
import sys
from collections import defaultdict


def main(out):
    runs = defaultdict(dict)
    checks = defaultdict(list)
    for line in open(f"{out}/suite.jsonl"):
        r = json.loads(line)
        if r["what"] == "check":
            checks[r["program"]].append("ok" if r["line"].startswith("check: ok") else "FAILED")
        elif r.get("result"):
            runs[r["program"]][r["what"]] = r["result"]["median_us"]
    peers = defaultdict(dict)
    for line in open(f"{out}/peers.jsonl"):
        r = json.loads(line)
        if r.get("median_us"):
            peers[r["program"]][r["peer"]] = r["median_us"]
    print("| program | checks | default us | no-fusion-by-cost us | best peer | peer us | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in sorted(set(runs) | set(checks)):
        d = runs[name].get("default")
        n = runs[name].get("no-fusion-by-cost")
        best = min(peers[name].items(), key=lambda kv: kv[1]) if peers[name] else (None, None)
        ratio = f"{d / best[1]:.2f}x" if d and best[1] else ""
        c = checks[name]
        cs = f"{c.count('ok')}/{len(c)} ok" if c else ""
        fmt = lambda v: f"{v:.1f}" if v else "failed"
        print(f"| {name} | {cs} | {fmt(d)} | {fmt(n)} | {best[0] or ''} | {fmt(best[1]) if best[1] else ''} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/suite")
