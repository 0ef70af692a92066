#!/bin/bash
# usage: variants.sh POLYFUSE: polyfuse's emitted kernel for gemm f16 128 x 1024 x 1024 edited by
# hand (perl), each variant built with harness.cu and timed beside cuBLAS and the hand-written
# cp.async kernel of the same tiles (cpa_64x32_split1).
set -u
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d)
"$1" schedule "$HERE/../../programs/gemm_f16_128x1024x1024.json" --emit cuda > "$W/base.cu" || exit 1
v() { # name, perl -0 script, dynamic shared bytes[, source other than base.cu]
  mkdir -p "$W/$1"; perl -0pe "$2" "$W/${4:-base.cu}" > "$W/$1/kernel.cu"
  (cd "$W/$1" && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DEMITTED_SMEM=$3 -DEMITTED_GX=32 -DEMITTED_GY=2 -DEMITTED_GZ=1 -I. -o run "$HERE/harness.cu" -lcuda -lcublas > build.log 2>&1 || echo "$1: build failed: $(grep error build.log | head -3)") &
}
# the wgmma engine's main loop (the first loop over pf_u) unrolled
UNROLL='s/#pragma unroll 1(\n\s*for \(int pf_u = 0; pf_u < 16)/#pragma unroll$1/'
v base '' 229376
v smem196k '' 196608
v bounds1 's/__launch_bounds__\(128, 2\)/__launch_bounds__(128, 1)/' 229376
v unrolled "$UNROLL" 229376
v expect 's/if \(pf_full && pf_([AB])_all\) \{/if (__builtin_expect(pf_full && pf_$1_all, 1)) {/g; s/if \(pf_inside\[0\] && pf_inside\[1\] && /if (__builtin_expect(pf_inside[0] && pf_inside[1], 1) && /g' 229376
#v nowg 's/pf_wg \* 4096 \+ //g' 229376
#v nowg_unrolled "$UNROLL; s/pf_wg \* 4096 \+ //g" 229376
# the epilogue's pair test (adjacent and aligned) assumed true: an upper bound on what a test
# hoisted out of the epilogue would give
EPI='s/if \(pf_inside\[0\] && pf_inside\[1\] && [^\n]*\) \{/if (1) {/g'
v epi "$EPI" 229376
# the hoisted loop of the first copies unrolled; the fast copies asking the L2 for 128- or 256-byte lines
PRO='s/(if \(pf_A_all && pf_B_all\) \{\n\s*)#pragma unroll 1/$1#pragma unroll/'
v pro_unrolled "$PRO" 229376
# waits for the previous grid before anything else and lets the next one launch at once (run as
# emitted_pdl: launched with programmatic stream serialization)
v pdl 's/(kernel_0\([^)]*\) \{)/$1\n  asm volatile("griddepcontrol.wait;" ::: "memory");\n  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");/' 229376
v l2_128 's/cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16;/cp.async.cg.shared.global.L2::128B [%0], [%1], 16;/' 229376
v l2_256 's/cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16;/cp.async.cg.shared.global.L2::256B [%0], [%1], 16;/' 229376
v pro_l2_256 "$PRO; "'s/cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16;/cp.async.cg.shared.global.L2::256B [%0], [%1], 16;/' 229376
# the barrier after the main loop dropped (one output tile per block: no later copy reuses the stages)
v nosync 's/(pf_wgmma_wait0\(\);\n\s*pf_cp_async_wait<0>\(\);\n)(\s*)__syncthreads\(\);/$1$2/' 229376
v epi_unrolled "$EPI; $UNROLL" 229376
v all "$UNROLL; s/__launch_bounds__\(128, 2\)/__launch_bounds__(128, 1)/" 196608
wait
for rep in 1 2; do
  for n in ${ONLY:-base unrolled bounds1 nosync epi epi_unrolled pro_unrolled l2_128 l2_256 pro_l2_256}; do [ -x "$W/$n/run" ] && { echo "== $n"; "$W/$n/run" emitted; }; done
  [ -x "$W/pdl/run" ] && { echo "== pdl"; "$W/pdl/run" emitted_pdl; }
  "$W/base/run" cpa_64x32_split1; "$W/base/run" cublas
done
if [ -n "${NCU:-}" ]; then
  M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.avg,smsp__cycles_active.avg
  for r in no_instruction barrier long_scoreboard wait lg_throttle short_scoreboard membar branch_resolving dispatch_stall imc_miss math_pipe_throttle mio_throttle not_selected selected sleeping drain misc tex_throttle; do
    M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
  done
  for n in base; do echo "== ncu $n"; QUICK=1 $NCU --metrics $M "$W/$n/run" emitted 2>&1 | grep -E "^  [a-z_]|  (gpu|smsp|sm)__" | tail -24; done
  echo "== ncu cpa"; QUICK=1 $NCU --metrics $M "$W/base/run" cpa_64x32_split1_nocluster 2>&1 | grep -E "^  [a-z_]|  (gpu|smsp|sm)__" | tail -24
  echo "== ncu cublas"; QUICK=1 $NCU --metrics $M "$W/base/run" cublas 2>&1 | grep -E "^  [a-z_]|  (gpu|smsp|sm)__" | tail -24
fi
