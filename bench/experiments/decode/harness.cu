// Standalone experiment (2026-11-25, H100): the decoding kernels polyfuse
// emits for attention_decode_causal_b1h32kv32768d128 (split 64), included
// from kernel.cu (variants made by variants.sh), timed with device events
// against a plain read of the same bytes. Not a polyfuse measurement.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda.h>
#include "kernel.cu"
#define CK(x) do { cudaError_t e = (x); if (e) { printf("error %s at line %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
#ifndef PDL
#define PDL 0
#endif
static const size_t B = 1, H = 32, NQ = 1, KV = 32768, D = 128, S = 64;
__global__ void fill(unsigned short *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed; x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __half_as_ushort(__float2half(((x & 0xffff) / 65536.0f - 0.5f) * 2.0f));
  }
}
// The bytes the first kernel must read (K and V), read with 16-byte loads.
__global__ void readall(const uint4 *__restrict__ p, size_t n, float *out) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678u) out[0] = 1.0f;
}
int main() {
  unsigned short *Q, *K, *V, *Y; float *P, *T, *M, *E, *L, *O, *Ml, *Ll, *Ol;
  CK(cudaMalloc(&Q, B * H * NQ * D * 2)); CK(cudaMalloc(&K, B * H * KV * D * 2)); CK(cudaMalloc(&V, B * H * KV * D * 2));
  CK(cudaMalloc(&Y, B * H * NQ * D * 2));
  CK(cudaMalloc(&P, 16)); CK(cudaMalloc(&T, 16)); CK(cudaMalloc(&M, 16)); CK(cudaMalloc(&E, 16)); CK(cudaMalloc(&L, 16)); CK(cudaMalloc(&O, 16));
  CK(cudaMalloc(&Ml, B * H * NQ * S * 4)); CK(cudaMalloc(&Ll, B * H * NQ * S * 4)); CK(cudaMalloc(&Ol, B * H * NQ * D * S * 4));
  fill<<<1024, 256>>>(Q, B * H * NQ * D, 1); fill<<<1024, 256>>>(K, B * H * KV * D, 2); fill<<<1024, 256>>>(V, B * H * KV * D, 3);
  CK(cudaFuncSetAttribute(kernel_0, cudaFuncAttributeMaxDynamicSharedMemorySize, 108800));
  auto run = [&]() {
    kernel_0<<<dim3(64, 32, 1), 128, 108800>>>(Q, K, V, Y, P, T, M, E, L, O, Ml, Ll, Ol);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 32, 32); cfg.blockDim = dim3(128, 1, 1); cfg.dynamicSmemBytes = 0; cfg.stream = 0;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = PDL ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kernel_0_combine, Q, K, V, Y, P, T, M, E, L, O, Ml, Ll, Ol));
  };
  cudaEvent_t a, b, c; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); CK(cudaEventCreate(&c));
  for (int i = 0; i < 20; i++) run();
  CK(cudaDeviceSynchronize());
  std::vector<float> tot, k0, rd;
  for (int i = 0; i < 100; i++) {
    CK(cudaEventRecord(a)); run(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); tot.push_back(ms * 1e3f);
  }
  for (int i = 0; i < 100; i++) {
    CK(cudaEventRecord(a)); kernel_0<<<dim3(64, 32, 1), 128, 108800>>>(Q, K, V, Y, P, T, M, E, L, O, Ml, Ll, Ol); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); k0.push_back(ms * 1e3f);
  }
  for (int i = 0; i < 100; i++) {
    CK(cudaEventRecord(a)); readall<<<132 * 16, 256>>>((const uint4 *)K, B * H * KV * D * 2 / 16, P); readall<<<132 * 16, 256>>>((const uint4 *)V, B * H * KV * D * 2 / 16, P); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); rd.push_back(ms * 1e3f);
  }
  CK(cudaGetLastError());
  auto med = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  run(); CK(cudaDeviceSynchronize());
  std::vector<unsigned short> y(B * H * NQ * D);
  CK(cudaMemcpy(y.data(), Y, y.size() * 2, cudaMemcpyDeviceToHost));
  double sum = 0; for (auto v : y) { __half_raw r; r.x = v; sum += (double)__half2float(__half(r)) * 1.0; }
  printf("total %.1f us  first kernel %.1f us  read of K and V %.1f us  checksum %.6f\n", med(tot), med(k0), med(rd), sum);
  return 0;
}
