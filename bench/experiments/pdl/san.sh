#!/bin/bash
# The contraction examples at sizes whose last chunk of a row ends inside a 16-byte copy
# (K or N no multiple of 8), checked and under memcheck and racecheck.  usage: san.sh POLYFUSE
set -u
P=$1; E=examples
for c in "gemm_f16 M=129 N=255 K=100" "gemm_f16 M=70 N=45 K=41" "gemm_f16 M=256 N=192 K=160" "fcrelu_f16 B=33 M=71 N=100" \
         "tbmm_bf16 B=3 N=37 M=29 K=13" "tbmm B=3 N=37 M=29 K=13" "gemm_chain M=77 K=33 N=45 L=19" "fcrelu B=33 M=71 N=100" "gemm M=77 N=45 K=33"; do
  set -- $c; f=$1; shift; a=(); for x in "$@"; do a+=(--param "$x"); done
  for tool in memcheck racecheck; do
    printf '%-10s %-40s ' $tool "$c"
    timeout 120 compute-sanitizer --tool $tool "$P" run $E/$f.json "${a[@]}" --target cuda --check 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^check:" | cut -c1-60 | tr '\n' ' '; echo
  done
done
