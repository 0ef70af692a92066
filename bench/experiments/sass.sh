# SASS instruction mix of a program's kernels: F2F/HADD2 conversions, loads, FMAs.
P=${POLYFUSE:-target/release/polyfuse}
for f in "$@"; do
  $P schedule $f --emit ptx --no-cache > /tmp/k.ptx 2>/dev/null || { echo "no ptx for $f"; continue; }
  ptxas -arch=sm_90 -v /tmp/k.ptx -o /tmp/k.cubin 2>&1 | grep -E "Used" | head -3
  cuobjdump -sass /tmp/k.cubin > /tmp/k.sass
  echo "$f: F2F $(grep -c 'F2F' /tmp/k.sass) HADD2.F32 $(grep -c 'HADD2.F32' /tmp/k.sass) LDG $(grep -c 'LDG' /tmp/k.sass) FFMA $(grep -c 'FFMA' /tmp/k.sass) MUFU $(grep -c MUFU /tmp/k.sass) total $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' /tmp/k.sass)"
done
