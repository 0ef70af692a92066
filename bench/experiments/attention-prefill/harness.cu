// Standalone experiment (2026-11-26, H100): polyfuse's attention prefill
// kernel (kernel.cu, from `polyfuse schedule bench/programs/attention_*.json
// --emit cuda`, possibly edited by variants.sh) timed alone: B4 H16 S4096
// D64 f16, one launch between a pair of events, median of REPS after a
// warm-up. The output is compared with the one a reference build (ref.bin,
// written by the first variant, whose kernel `polyfuse --check` verified
// against f64) gave on the same inputs, by the elementwise error polyfuse's
// check uses. Not a polyfuse measurement: its figures are for choosing.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "kernel.cu"
#define CK(x) do { cudaError_t e = (x); if (e) { printf("error %s at line %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
static const int B = 4, H = 16, S = 4096, D = 64;

static unsigned short f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
static float h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "kernel";
  const char *ref = argc > 2 ? argv[2] : "";
  const int reps = argc > 3 ? atoi(argv[3]) : 30;
  const size_t n = (size_t)B * H * S * D;
  std::vector<unsigned short> hq(n), hk(n), hv(n), hy(n);
  unsigned long long s = 0x9E3779B97F4A7C15ull;
  auto uni = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)((s >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0); };
  for (size_t i = 0; i < n; i++) { hq[i] = f2h(uni()); hk[i] = f2h(uni()); hv[i] = f2h(uni()); }
  unsigned short *q, *k, *v, *y;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&y, n * 2));
  CK(cudaMemcpy(q, hq.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(y, 0xff, n * 2));  // NaN: every element must be written
  CK(cudaFuncSetAttribute(kernel_0, cudaFuncAttributeMaxDynamicSharedMemorySize, EMITTED_SMEM));
  dim3 grid(EMITTED_GX, EMITTED_GY, 1);
  auto launch = [&]() { kernel_0<<<grid, 128, EMITTED_SMEM>>>(q, k, v, y, EMITTED_REST); };
  launch();
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hy.data(), y, n * 2, cudaMemcpyDeviceToHost));
  double err = 0; size_t bad = 0;
  FILE *f = fopen(ref, "rb");
  if (f) {
    std::vector<unsigned short> r(n);
    if (fread(r.data(), 2, n, f) != n) { printf("%s: short reference\n", label); return 1; }
    fclose(f);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = std::max(scale, (double)fabsf(h2f(r[i])));
    for (size_t i = 0; i < n; i++) {
      double a = h2f(hy[i]), b = h2f(r[i]);
      double e = std::isnan(a) ? INFINITY : fabs(a - b) / std::max(fabs(b), 1e-2 * scale);
      if (e > 1e-2) bad++;
      err = std::max(err, e);
    }
  } else if (ref[0]) {
    f = fopen(ref, "wb"); fwrite(hy.data(), 2, n, f); fclose(f);
    for (size_t i = 0; i < n; i++) if (std::isnan(h2f(hy[i]))) bad++;
  }
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; i++) launch();
  std::vector<float> t;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(e0)); launch(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  printf("%-28s median %8.1f us  (min %8.1f)  vs ref: max err %.2e, %zu elements over 1e-2\n", label, t[t.size() / 2], t[0], err, bad);
  return bad ? 1 : 0;
}
