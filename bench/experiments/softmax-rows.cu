// Standalone experiment (2026-11-24, H100): the fused softmax at 16384 x 4096
// written by hand in the forms polyfuse could print, timed against
// cudaMemcpy in one process. Build: nvcc -O3 -arch=sm_90 softmax-rows.cu.
// Results: bench/RESULTS.md, "Softmax rows by hand".
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cmath>
#define CK(x) do{cudaError_t e=(x); if(e){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__); exit(1);}}while(0)
typedef int pf_i;
template <typename T> static __device__ __forceinline__ T pf_max(T a, T b){return a>b?a:b;}
#define UPD(x) { float mp = M; M = fmaxf(M, (x)); S = ((mp == M) ? S : (S * expf(mp - M))) + expf((x) - M); }
#define COMB(bM,bS) { float nM = fmaxf(M, bM); S = ((M == nM) ? S : (S * expf(M - nM))) + ((bM == nM) ? bS : (bS * expf(bM - nM))); M = nM; }
template<int VEC, bool VSTORE, bool CS=false>
__global__ void __launch_bounds__(128) ksm(const float* __restrict__ X, float* __restrict__ Y) {
  const int D = 4096;
  for (int c0 = blockIdx.x * 2; c0 <= 16383; c0 += gridDim.x * 2) {
    for (int c1 = 0; c1 < 2; c1++) {
      const float* xr = X + (size_t)(c0 + c1) * D;
      float* yr = Y + (size_t)(c0 + c1) * D;
      float row[32];
      float M = -INFINITY, S = 0.f;
      __syncthreads();
      if (VEC == 1) {
#pragma unroll
        for (int t = 0; t < 32; t++) row[t] = xr[threadIdx.x + 128 * t];
      } else {
#pragma unroll
        for (int q = 0; q < 8; q++) { float4 v = CS ? __ldcs((const float4*)&xr[4 * (threadIdx.x + 128 * q)]) : *(const float4*)&xr[4 * (threadIdx.x + 128 * q)]; row[4*q]=v.x; row[4*q+1]=v.y; row[4*q+2]=v.z; row[4*q+3]=v.w; }
      }
#pragma unroll
      for (int t = 0; t < 32; t++) UPD(row[t]);
      for (int o = 16; o > 0; o >>= 1) { float bM = __shfl_xor_sync(~0u, M, o); float bS = __shfl_xor_sync(~0u, S, o); COMB(bM, bS); }
      __shared__ float pM[4], pS[4];
      if ((threadIdx.x & 31) == 0) { pM[threadIdx.x >> 5] = M; pS[threadIdx.x >> 5] = S; }
      __syncthreads();
      M = pM[0]; S = pS[0];
      for (int w = 1; w < 4; w++) COMB(pM[w], pS[w]);
      __syncthreads();
      if (VEC == 1) {
#pragma unroll
        for (int t = 0; t < 32; t++) yr[threadIdx.x + 128 * t] = expf(row[t] - M) / S;
      } else if (!VSTORE) {
#pragma unroll
        for (int t = 0; t < 32; t++) yr[4 * (threadIdx.x + 128 * (t / 4)) + t % 4] = expf(row[t] - M) / S;
      } else {
#pragma unroll
        for (int q = 0; q < 8; q++) { float4 v; v.x = expf(row[4*q]-M)/S; v.y = expf(row[4*q+1]-M)/S; v.z = expf(row[4*q+2]-M)/S; v.w = expf(row[4*q+3]-M)/S; if (CS) __stcs((float4*)&yr[4 * (threadIdx.x + 128 * q)], v); else *(float4*)&yr[4 * (threadIdx.x + 128 * q)] = v; }
      }
      __syncthreads();
    }
  }
}
__global__ void kcopy(const float4* __restrict__ a, float4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) b[i] = a[i];
}
__global__ void kcopy4(const float4* __restrict__ a, float4* __restrict__ b, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4*stride) { float4 v[4];
#pragma unroll
    for (int k=0;k<4;k++) if (i+k*stride<n) v[k]=a[i+k*stride];
#pragma unroll
    for (int k=0;k<4;k++) if (i+k*stride<n) b[i+k*stride]=v[k]; }
}
template<int V, bool CS, int T> __device__ __forceinline__ float4 ld(const float* p, int q) {
  if (V == 4) return CS ? __ldcs((const float4*)&p[4 * (threadIdx.x + T * q)]) : *(const float4*)&p[4 * (threadIdx.x + T * q)];
  float4 v; v.x = p[threadIdx.x + T * (4*q)]; v.y = p[threadIdx.x + T * (4*q+1)]; v.z = p[threadIdx.x + T * (4*q+2)]; v.w = p[threadIdx.x + T * (4*q+3)]; return v; }
template<int V, bool CS, int T> __device__ __forceinline__ void st(float* p, int q, float4 v) {
  if (V == 4) { if (CS) __stcs((float4*)&p[4 * (threadIdx.x + T * q)], v); else *(float4*)&p[4 * (threadIdx.x + T * q)] = v; return; }
  p[threadIdx.x + T * (4*q)] = v.x; p[threadIdx.x + T * (4*q+1)] = v.y; p[threadIdx.x + T * (4*q+2)] = v.z; p[threadIdx.x + T * (4*q+3)] = v.w; }
// one row per block, T threads, rows pipelined: next row's loads issued before this row's math
template<int T, int V=4, bool CS=false>
__global__ void __launch_bounds__(T) kpipe(const float* __restrict__ X, float* __restrict__ Y) {
  const int D = 4096; constexpr int Q = D / (4 * T);
  float4 cur[Q], nxt[Q];
  int r = blockIdx.x;
#pragma unroll
  for (int q = 0; q < Q; q++) cur[q] = ld<V,CS,T>(X + (size_t)r * D, q);
  for (; r < 16384; r += gridDim.x) {
    int rn = r + gridDim.x;
    if (rn < 16384) {
#pragma unroll
      for (int q = 0; q < Q; q++) nxt[q] = ld<V,CS,T>(X + (size_t)rn * D, q);
    }
    float M = -INFINITY, S = 0.f;
#pragma unroll
    for (int q = 0; q < Q; q++) { UPD(cur[q].x); UPD(cur[q].y); UPD(cur[q].z); UPD(cur[q].w); }
    for (int o = 16; o > 0; o >>= 1) { float bM = __shfl_xor_sync(~0u, M, o); float bS = __shfl_xor_sync(~0u, S, o); COMB(bM, bS); }
    __shared__ float pM[T/32], pS[T/32];
    if ((threadIdx.x & 31) == 0) { pM[threadIdx.x >> 5] = M; pS[threadIdx.x >> 5] = S; }
    __syncthreads();
    M = pM[0]; S = pS[0];
    for (int w = 1; w < T/32; w++) COMB(pM[w], pS[w]);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < Q; q++) { float4 v; v.x = expf(cur[q].x-M)/S; v.y = expf(cur[q].y-M)/S; v.z = expf(cur[q].z-M)/S; v.w = expf(cur[q].w-M)/S; st<V,CS,T>(Y + (size_t)r * D, q, v); }
#pragma unroll
    for (int q = 0; q < Q; q++) cur[q] = nxt[q];
  }
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
  int grid = 8192;
  for (int rep = 0; rep < 2; rep++) {
  printf("cudaMemcpy d2d  %.1f us\n", timeit([&]{ cudaMemcpyAsync(Y2, X, n*4, cudaMemcpyDeviceToDevice); }));
  printf("polyfuse-like 2rows scalar %.1f us\n", timeit([&]{ ksm<1,false><<<8192,128>>>(X, Y); }));
  printf("1row T128 scalar   %.1f us\n", timeit([&]{ kpipe<128,1><<<16384,128>>>(X, Y2); }));
  printf("1row T128 vec      %.1f us\n", timeit([&]{ kpipe<128,4><<<16384,128>>>(X, Y2); }));
  printf("1row T128 vec cs   %.1f us\n", timeit([&]{ kpipe<128,4,true><<<16384,128>>>(X, Y2); }));
  printf("1row T64 vec       %.1f us\n", timeit([&]{ kpipe<64,4><<<16384,64>>>(X, Y2); }));
  printf("1row T64 scalar    %.1f us\n", timeit([&]{ kpipe<64,1><<<16384,64>>>(X, Y2); }));
  printf("1row T256 vec      %.1f us\n", timeit([&]{ kpipe<256,4><<<16384,256>>>(X, Y2); }));
  printf("1row T256 scalar   %.1f us\n", timeit([&]{ kpipe<256,1><<<16384,256>>>(X, Y2); }));
  printf("pipe T128 vec g528 %.1f us\n", timeit([&]{ kpipe<128,4><<<528,128>>>(X, Y2); }));
  }
  ksm<1,false><<<grid,128>>>(X, Y); kpipe<128><<<132*4,128>>>(X, Y2); CK(cudaDeviceSynchronize());
  std::vector<float> a(n), b(n); cudaMemcpy(a.data(), Y, n*4, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), Y2, n*4, cudaMemcpyDeviceToHost);
  double md = 0; for (size_t i = 0; i < n; i++) md = std::max(md, (double)fabs(a[i]-b[i])/(fabs(a[i])+1e-30)); printf("max rel diff %g\n", md);
}
