#!/usr/bin/env bash
# GPU checks at odd sizes of the programs whose epilogue moved to the store.
P=${POLYFUSE:-target/release/polyfuse}
for a in "bench/suite/mlp_silu_f32.json --param B=67 --param D=45 --param F=133" \
         "bench/suite/mlp3_f32.json --param B=67 --param D=45" \
         "bench/suite/two_mm.json --param NI=61 --param NJ=37 --param NK=45 --param NL=53" \
         "examples/fcrelu.json" "examples/attention_decode_alibi.json" "examples/attention_decode_softcap.json"; do
  # shellcheck disable=SC2086
  echo "$a: $(timeout 60 $P run $a --target cuda --check 2>&1 | grep -E '^check|rror' | head -2)"
done
