#!/usr/bin/env python3
"""Variants of polyfuse's fused-softmax kernel (softmax_fused_16k), edited
by hand: which change to the emitted form gives the one-row-a-block
speed? Usage: variants.py EMITTED.cu OUTDIR; writes OUTDIR/<name>/kernel.cu
and OUTDIR/<name>/launch.h (grid and block)."""
import os, re, sys

src = open(sys.argv[1]).read()
out = sys.argv[2]

def one_row(s):
    s = s.replace("blockIdx.x * 2;", "blockIdx.x * 1;").replace("gridDim.x * 2)", "gridDim.x * 1)")
    s = s.replace("(c1 <= 1)", "(c1 <= 0)").replace("pf_e < 2048", "pf_e < 1024")
    return s

def no_shared(s):
    # the shared copy is never read: drop its loop (up to the barrier after it)
    a = s.index("for (pf_i pf_e = threadIdx.x")
    b = s.index("__syncthreads();", a)
    return s[:a] + s[b:]

def vec16(s):
    # row cache as 16-byte slots: thread t holds elements 4 (t + 128 q) + r
    s = re.sub(r"#pragma unroll\n(\s*)for \(int pf_t = 0; pf_t < 32; pf_t\+\+\) \{\n\s*const pf_i c2 = [^\n]*\n\s*if \(\(c2 <= 4095\)\) pf_row_kernel_0_X\[pf_t\] = t_X\[([^\n]*)\];\n\s*\}",
               r"#pragma unroll\n\1for (int pf_q = 0; pf_q < 8; pf_q++) { const float4 pf_v = *(const float4 *)&t_X[(c0 + c1) * p_D + 4 * (threadIdx.x + 128 * pf_q)]; pf_row_kernel_0_X[4 * pf_q] = pf_v.x; pf_row_kernel_0_X[4 * pf_q + 1] = pf_v.y; pf_row_kernel_0_X[4 * pf_q + 2] = pf_v.z; pf_row_kernel_0_X[4 * pf_q + 3] = pf_v.w; }", s, count=1)
    assert "pf_q < 8" in s
    s = re.sub(r"#pragma unroll\n(\s*)for \(int pf_t = 0; pf_t < 32; pf_t\+\+\) \{\n\s*const pf_i c2 = [^\n]*\n\s*if \(\(c2 <= 4095\)\) \{\n\s*t_Y\[[^\n]*\] = \((expf\(\(pf_row_kernel_0_X\[pf_t\] - pf_priv_kernel_0_M\)\) / pf_priv_kernel_0_S)\);\n\s*\}\n\s*\}",
               r"#pragma unroll\n\1for (int pf_q = 0; pf_q < 8; pf_q++) { float4 pf_v; float *pf_o = &pf_v.x; for (int pf_r = 0; pf_r < 4; pf_r++) { const int pf_t = 4 * pf_q + pf_r; pf_o[pf_r] = \2; } *(float4 *)&t_Y[(c0 + c1) * p_D + 4 * (threadIdx.x + 128 * pf_q)] = pf_v; }", s, count=1)
    assert s.count("pf_q < 8") == 2
    return s

def rows_on_y(s):
    s = s.replace("pf_part_pf_priv_kernel_0_M[4]", "pf_part_pf_priv_kernel_0_M[8]").replace("pf_part_pf_priv_kernel_0_S[4]", "pf_part_pf_priv_kernel_0_S[8]")
    s = s.replace("[threadIdx.x >> 5]", "[threadIdx.y * 4 + (threadIdx.x >> 5)]")
    s = s.replace("pf_part_pf_priv_kernel_0_M[0]", "pf_part_pf_priv_kernel_0_M[threadIdx.y * 4]").replace("pf_part_pf_priv_kernel_0_S[0]", "pf_part_pf_priv_kernel_0_S[threadIdx.y * 4]")
    s = s.replace("pf_part_pf_priv_kernel_0_M[pf_w]", "pf_part_pf_priv_kernel_0_M[threadIdx.y * 4 + pf_w]").replace("pf_part_pf_priv_kernel_0_S[pf_w]", "pf_part_pf_priv_kernel_0_S[threadIdx.y * 4 + pf_w]")
    s = s.replace("__launch_bounds__(128)", "__launch_bounds__(256)")
    return s

V = {
    "emitted": (lambda s: s, 8192, (128, 1)),
    "no_shared": (no_shared, 8192, (128, 1)),
    "vec16": (lambda s: vec16(no_shared(s)), 8192, (128, 1)),
    "one_row": (lambda s: one_row(no_shared(s)), 16384, (128, 1)),
    "one_row_vec16": (lambda s: vec16(one_row(no_shared(s))), 16384, (128, 1)),
    "rows_on_y": (lambda s: rows_on_y(no_shared(s)), 8192, (128, 2)),
    "rows_on_y_vec16": (lambda s: vec16(rows_on_y(no_shared(s))), 8192, (128, 2)),
}
for name, (f, grid, block) in V.items():
    d = os.path.join(out, name); os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "kernel.cu"), "w").write(f(src))
    open(os.path.join(d, "launch.h"), "w").write(f"#define GRID {grid}\n#define BX {block[0]}\n#define BY {block[1]}\n")
print(" ".join(V))
