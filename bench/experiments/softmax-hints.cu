// Standalone experiment (2026-11-25, H100): the fused softmax at 16384 x 4096,
// one row a block, 16-byte loads and stores (the fastest form of
// softmax-rows.cu), with cache and prefetch hints on the loads and stores,
// timed against cudaMemcpy in one process. Build: nvcc -O3 -arch=sm_90.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cmath>
#define CK(x) do{cudaError_t e=(x); if(e){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__); exit(1);}}while(0)
#define UPD(x) { float mp = M; M = fmaxf(M, (x)); S = ((mp == M) ? S : (S * expf(mp - M))) + expf((x) - M); }
#define COMB(bM,bS) { float nM = fmaxf(M, bM); S = ((M == nM) ? S : (S * expf(M - nM))) + ((bM == nM) ? bS : (bS * expf(bM - nM))); M = nM; }
// Load hints: 0 none, 1 L2::128B, 2 L2::256B, 3 L1::no_allocate + L2::256B, 4 evict_first policy
template<int H> __device__ __forceinline__ float4 ld(const float* p) {
  float4 v;
  if (H == 0) return *(const float4*)p;
  if (H == 1) asm volatile("ld.global.L2::128B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  if (H == 2) asm volatile("ld.global.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  if (H == 3) asm volatile("ld.global.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  if (H == 4) { unsigned long long pol; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(pol)); }
  return v;
}
// Store hints: 0 none, 1 L1::no_allocate, 2 evict_first policy
template<int H> __device__ __forceinline__ void st(float* p, float4 v) {
  if (H == 0) { *(float4*)p = v; return; }
  if (H == 1) asm volatile("st.global.L1::no_allocate.v4.f32 [%0], {%1,%2,%3,%4};" :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
  if (H == 2) { unsigned long long pol; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1,%2,%3,%4}, %5;" :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(pol) : "memory"); }
}
template<int T, int LH, int SH>
__global__ void __launch_bounds__(T) krow(const float* __restrict__ X, float* __restrict__ Y) {
  const int D = 4096; constexpr int Q = D / (4 * T);
  const size_t r = blockIdx.x;
  float4 cur[Q];
#pragma unroll
  for (int q = 0; q < Q; q++) cur[q] = ld<LH>(X + r * D + 4 * (threadIdx.x + T * q));
  float M = -INFINITY, S = 0.f;
#pragma unroll
  for (int q = 0; q < Q; q++) { UPD(cur[q].x); UPD(cur[q].y); UPD(cur[q].z); UPD(cur[q].w); }
  for (int o = 16; o > 0; o >>= 1) { float bM = __shfl_xor_sync(~0u, M, o); float bS = __shfl_xor_sync(~0u, S, o); COMB(bM, bS); }
  __shared__ float pM[T/32], pS[T/32];
  if ((threadIdx.x & 31) == 0) { pM[threadIdx.x >> 5] = M; pS[threadIdx.x >> 5] = S; }
  __syncthreads();
  M = pM[0]; S = pS[0];
  for (int w = 1; w < T/32; w++) COMB(pM[w], pS[w]);
#pragma unroll
  for (int q = 0; q < Q; q++) { float4 v; v.x = expf(cur[q].x-M)/S; v.y = expf(cur[q].y-M)/S; v.z = expf(cur[q].z-M)/S; v.w = expf(cur[q].w-M)/S; st<SH>(Y + r * D + 4 * (threadIdx.x + T * q), v); }
}
__global__ void kcopy(const float4* __restrict__ a, float4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) b[i] = a[i];
}
template<typename F> float timeit(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 20; i++) f();
  std::vector<float> ts;
  for (int i = 0; i < 100; i++) { cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000); }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end()); return ts[50];
}
int main() {
  size_t n = 16384ull * 4096; float *X, *Y, *Y2;
  CK(cudaMalloc(&X, n * 4)); CK(cudaMalloc(&Y, n * 4)); CK(cudaMalloc(&Y2, n * 4));
  std::vector<float> h(n); for (size_t i = 0; i < n; i++) h[i] = (float)((i * 2654435761u) % 1000) / 100.f - 5.f;
  CK(cudaMemcpy(X, h.data(), n * 4, cudaMemcpyHostToDevice));
  for (int rep = 0; rep < 2; rep++) {
    printf("cudaMemcpy d2d            %.1f us\n", timeit([&]{ cudaMemcpyAsync(Y2, X, n*4, cudaMemcpyDeviceToDevice); }));
    printf("copy kernel float4        %.1f us\n", timeit([&]{ kcopy<<<132*16,256>>>((const float4*)X, (float4*)Y2, n/4); }));
    printf("T128 plain                %.1f us\n", timeit([&]{ krow<128,0,0><<<16384,128>>>(X, Y); }));
    printf("T128 ld L2::128B          %.1f us\n", timeit([&]{ krow<128,1,0><<<16384,128>>>(X, Y2); }));
    printf("T128 ld L2::256B          %.1f us\n", timeit([&]{ krow<128,2,0><<<16384,128>>>(X, Y2); }));
    printf("T128 ld noL1 L2::256B     %.1f us\n", timeit([&]{ krow<128,3,0><<<16384,128>>>(X, Y2); }));
    printf("T128 ld evict_first       %.1f us\n", timeit([&]{ krow<128,4,0><<<16384,128>>>(X, Y2); }));
    printf("T128 st noL1              %.1f us\n", timeit([&]{ krow<128,0,1><<<16384,128>>>(X, Y2); }));
    printf("T128 st evict_first       %.1f us\n", timeit([&]{ krow<128,0,2><<<16384,128>>>(X, Y2); }));
    printf("T128 ld L2::256B st ef    %.1f us\n", timeit([&]{ krow<128,2,2><<<16384,128>>>(X, Y2); }));
    printf("T256 plain                %.1f us\n", timeit([&]{ krow<256,0,0><<<16384,256>>>(X, Y2); }));
    printf("T256 ld L2::256B          %.1f us\n", timeit([&]{ krow<256,2,0><<<16384,256>>>(X, Y2); }));
    printf("T512 plain                %.1f us\n", timeit([&]{ krow<512,0,0><<<16384,512>>>(X, Y2); }));
    printf("T512 ld L2::256B          %.1f us\n", timeit([&]{ krow<512,2,0><<<16384,512>>>(X, Y2); }));
  }
  krow<128,0,0><<<16384,128>>>(X, Y); krow<128,3,2><<<16384,128>>>(X, Y2); CK(cudaDeviceSynchronize());
  std::vector<float> a(n), b(n); cudaMemcpy(a.data(), Y, n*4, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), Y2, n*4, cudaMemcpyDeviceToHost);
  double md = 0; for (size_t i = 0; i < n; i++) md = std::max(md, (double)fabs(a[i]-b[i])/(fabs(a[i])+1e-30)); printf("max rel diff %g\n", md);
}
