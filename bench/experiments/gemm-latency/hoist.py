#!/usr/bin/env python3
"""hoist.py IN OUT: polyfuse's emitted gemm kernel with the wgmma engine's
prologue (every k tile's copies) split by hand into a loop of the fast
copies alone, taken when every chunk of both operands is aligned and
inside (pf_A_all && pf_B_all), and the emitted loop otherwise."""
import re, sys
s = open(sys.argv[1]).read()
start = s.index("#pragma unroll 1\n", s.index("pf_B_all = "))
end = s.index("for (pf_i pf_k0", start)
loop = s[start:end]
def fast(name):
    i = loop.index(f"if (pf_full && pf_{name}_all) {{")
    j = loop.index("} else {", i)
    return loop[loop.index("\n", i) + 1:j]
head = re.search(r"for \(int pf_s = 0; pf_s < (\d+); pf_s\+\+\) \{\n\s*if \(([^\n]*)\) \{", loop)
body = fast("A") + fast("B")
new = ("if (pf_A_all && pf_B_all) {\n#pragma unroll 1\nfor (int pf_s = 0; pf_s < %s; pf_s++) {\nif (%s) {\n%s}\npf_cp_async_commit();\n}\n} else {\n%s}\n"
       % (head.group(1), head.group(2), body, loop))
open(sys.argv[2], "w").write(s[:start] + new + s[end:])
