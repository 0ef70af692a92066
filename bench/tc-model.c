// A model of the tensor cores' f32 accumulation, for choosing how often a
// contraction stored as f32 adds its sums in IEEE f32
// (gpu::contraction::Accumulation). A model, not a measurement: each
// instruction's terms (16 exact f16 products and the incoming accumulator)
// are aligned to the largest exponent, each truncated BITS bits below it,
// summed exactly, and the sum truncated to 24 bits. Inputs are f16 values
// uniform in [-1, 1) as the check's; the error is the check's (relative,
// floor 1e-2 of the largest reference value), for the sequential f32 sum
// (the declared-precision run), the chained tensor-core sum, and sums
// promoted every instruction, every 64 and every 256 of k.
//
//   cc -O2 -o /tmp/tc bench/tc-model.c -lm && /tmp/tc K OUTPUTS BITS
//
// 2026-11-28, K 8192, 20000 outputs: BITS 24, 25, 26 give the chained sum
// 1.41x, 2.47x, 3.40x the declared run's error; promoted, 0.11x to 0.26x.
// Measured on the H200 for the chained sum (f16 gemm into f32, K 8192):
// 2.42x.
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
static uint64_t s = 12345;
static double rnd(void) { s += 0x9e3779b97f4a7c15ull; uint64_t z = s; z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull; z ^= z >> 31; return (double)(z >> 11) / 9007199254740992.0 * 2 - 1; }
static double f16(double x) { // round to f16 (normal range)
  if (x == 0) return 0; int e; frexp(x, &e); double q = ldexp(1.0, e - 11); return nearbyint(x / q) * q; }
static double trunc_to(double x, int e, int bits) { double q = ldexp(1.0, e - bits); return trunc(x / q) * q; }
static double tc_sum(const double *t, int n, int bits) {
  double m = 0; for (int i = 0; i < n; i++) if (fabs(t[i]) > m) m = fabs(t[i]);
  if (m == 0) return 0; int e; frexp(m, &e);
  double sum = 0; for (int i = 0; i < n; i++) sum += trunc_to(t[i], e, bits);
  if (sum == 0) return 0; int e2; frexp(sum, &e2); return trunc_to(sum, e2, 24);
}
int main(int argc, char **argv) {
  int K = atoi(argv[1]), NOUT = atoi(argv[2]), bits = atoi(argv[3]);
  enum { NRUN = 6 };
  const int run[NRUN] = {16, 64, 256, 512, 1024, 2048};
  double *a = malloc(sizeof(double) * K), *b = malloc(sizeof(double) * K);
  double maxr = 0, *R = malloc(8 * NOUT), *D = malloc(8 * NOUT), *C = malloc(8 * NOUT), *P[NRUN];
  for (int q = 0; q < NRUN; q++) P[q] = malloc(8 * NOUT);
  for (int o = 0; o < NOUT; o++) {
    for (int k = 0; k < K; k++) { a[k] = f16(rnd()); b[k] = f16(rnd()); }
    double r = 0; float d = 0; for (int k = 0; k < K; k++) { r += a[k] * b[k]; d = d + (float)(a[k] * b[k]); }
    // chained: per 16 of k, terms = 16 products + acc
    double acc = 0, t[17];
    for (int k = 0; k < K; k += 16) { for (int j = 0; j < 16; j++) t[j] = a[k + j] * b[k + j]; t[16] = acc; acc = tc_sum(t, 17, bits); }
    // promoted every run[q] of k: that run's instructions chained from zero, then an f32 RN add
    for (int q = 0; q < NRUN; q++) {
      float p = 0;
      for (int k0 = 0; k0 < K; k0 += run[q]) {
        double part = 0;
        for (int k = k0; k < k0 + run[q] && k < K; k += 16) { for (int j = 0; j < 16; j++) t[j] = a[k + j] * b[k + j]; t[16] = part; part = tc_sum(t, 17, bits); }
        p = p + (float)part;
      }
      P[q][o] = p;
    }
    R[o] = r; D[o] = d; C[o] = acc; if (fabs(r) > maxr) maxr = fabs(r);
  }
  double fl = 0.01 * maxr, ed = 0, ec = 0, ep[NRUN] = {0};
  for (int o = 0; o < NOUT; o++) { double den = fmax(fabs(R[o]), fl);
    ed = fmax(ed, fabs(D[o] - R[o]) / den); ec = fmax(ec, fabs(C[o] - R[o]) / den);
    for (int q = 0; q < NRUN; q++) ep[q] = fmax(ep[q], fabs(P[q][o] - R[o]) / den); }
  printf("K=%d n=%d bits=%d declared %.3e chained %.3e (%.2fx)", K, NOUT, bits, ed, ec, ec / ed);
  for (int q = 0; q < NRUN; q++) printf(" /%d %.2fx", run[q], ep[q] / ed);
  printf("\n");
}
