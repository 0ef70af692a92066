#!/bin/bash
# The device calls of this experiment (2026-11-26, H100), one per argument; each writes under $OUT.
# Builds in bench-bin/: polyfuse (before), polyfuse-ov / polyfuse-one (overlap-codegen.patch: two
# loops / one loop), polyfuse-copy (whole-tile copies), polyfuse-ovc (both).
#   hand      the hand-written kernel (body.cu) against the emitted one, with Nsight Compute
#   nopin     the emitted overlapped kernel with and without the store that keeps the wait late
#   nobranch  ... without the partial tiles' step (global only: every tile whole)
#   lb3       ... under __launch_bounds__(128, 3)
#   loops     two loops against one loop, each also without the partial tiles' step
#   ncu       stall samples: before, the one-loop build, and it without the partial step
#   copy1     the kernel before with its copies' whole-tile test removed
#   nobranch2 the copies' build and overlap + copies, each without the partial tiles' step
#   split     19c4389 against whole tiles in a loop of their own (the rest in a second loop)
#   final     before, overlap + copies, copies alone; memcheck and racecheck; gpu-check with peers
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd); cd "$ROOT"
V=bench/experiments/attention-prefill/variants.sh
for c in "$@"; do case $c in
  hand) bash bench/experiments/attention-overlap/run.sh "$OUT/hand" bench-bin/polyfuse ;;
  nopin) VARIANTS=nopin VARIANT_nopin='s/asm volatile\("st\.shared\.f32[^\n]*\n//g' \
           bash $V "$OUT/ab" base=bench-bin/polyfuse ov=bench-bin/polyfuse-ov ;;
  nobranch) VARIANTS=nobranch VARIANT_nobranch='s/if \(pf_full\) \{/if (1) {/g' \
           bash $V "$OUT/ab" base=bench-bin/polyfuse ov=bench-bin/polyfuse-ov ;;
  lb3) VARIANTS=lb3 VARIANT_lb3='s/__launch_bounds__\(128, 4\)/__launch_bounds__(128, 3)/g' \
           bash $V "$OUT/ab" base=bench-bin/polyfuse ov=bench-bin/polyfuse-ov ;;
  loops) VARIANTS=nobranch VARIANT_nobranch='s/if \(pf_full\) \{/if (1) {/g' \
           bash $V "$OUT/ab" base=bench-bin/polyfuse two=bench-bin/polyfuse-ov one=bench-bin/polyfuse-one ;;
  ncu) for b in polyfuse polyfuse-one; do echo "== $b"; bash bench/experiments/attention-overlap/ncu.sh "$OUT" bench-bin/$b; done
       echo "== polyfuse-one without the partial step"
       bash bench/experiments/attention-overlap/ncu.sh "$OUT" bench-bin/polyfuse-one 's/if \(pf_full\) \{/if (1) {/g' ;;
  copy1) VARIANTS=copy1 VARIANT_copy1='s/if \(\(pf_kt \+ 1\) \* 64 \+ 64 <= 4096\) \{/if (1) {/g' \
           bash $V "$OUT/ab" one=bench-bin/polyfuse-one base=bench-bin/polyfuse ;;
  nobranch2) for b in polyfuse-copy polyfuse-ovc; do
           VARIANTS=nobranch VARIANT_nobranch='s/if \(pf_full\) \{/if (1) {/g' \
           bash $V "$OUT/ab-$b" base=bench-bin/polyfuse $b=bench-bin/$b; done ;;
  split) bash $V "$OUT/ab" head=bench-bin/polyfuse-head split=bench-bin/polyfuse-split ;;
  final) SAN=1 NO_GEMM=1 GC_PARTS="examples benches peers" GC_BUDGET=330 bash bench/experiments/attention-prefill/call.sh \
           "$OUT" base=bench-bin/polyfuse ovc=bench-bin/polyfuse-ovc copy=bench-bin/polyfuse-copy ;;
  *) echo "unknown call $c"; exit 2 ;;
esac; done
