/* Experiment (2026-11-27): the global prefill kernel with one tile's
   softmax overlapped with the tensor cores inside the warpgroup. Per key
   tile kt: the scores of kt and the value products of kt-1 are issued
   together; the softmax of kt runs while the value products are in
   flight; the accumulators are repaired after they land. Hand-written
   from polyfuse's emitted kernel (same helpers, layouts and signature),
   specialised to B4 H16 S4096 D64, scale 1/8, every tile whole. */
#define OV_S 4096
#define OV_H 16
#define OV_D 64
static __device__ __forceinline__ void ov_load(unsigned short *dst, const unsigned short *src, int t) {
#pragma unroll
  for (int n = 0; n < 4; n++) {
    const int r = t / 8 + n * 16, q = (t % 8) * 8;
    pf_cp_async16_line(&dst[r * 64 + (((q / 8) ^ (r % 8)) * 8)], &src[r * OV_D + q]);
  }
}
extern "C" __global__ void __launch_bounds__(128, 4) kernel_0(unsigned short *__restrict__ t_Q, unsigned short *__restrict__ t_K, unsigned short *__restrict__ t_V, unsigned short *__restrict__ t_Y, float *__restrict__ t_P, float *__restrict__ t_T, float *__restrict__ t_M, float *__restrict__ t_E, float *__restrict__ t_L, float *__restrict__ t_O, float *__restrict__ t_M_prev) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int t = threadIdx.x, w = t / 32, l = t % 32, g = l / 4, c = l % 4;
  (void)c;
  const int bx = blockIdx.x, bt = blockIdx.y;
  const int b1 = bt % 16, b0 = (bt / 16) % 4;
  const int i0 = (bx % 64) * 64;
  extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
  unsigned short *const sq = pf_dynamic_shared;
  unsigned short *const sk = pf_dynamic_shared + 4096;   /* two stages */
  unsigned short *const sv = pf_dynamic_shared + 12288;  /* three stages */
  const size_t head = ((size_t)b0 * OV_H + b1) * OV_S * OV_D;
  const int nk = OV_S / 64;
  __shared__ float ov_pin[128];
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const unsigned long long dk0 = pf_wgmma_desc(pf_dynamic_shared, 16, 1024);
  const unsigned long long dv0 = pf_wgmma_desc(pf_dynamic_shared, 8192, 1024);
  float s[32], o[32], m[2], sum[2];
  unsigned pa[16], pl[16];
  ov_load(sq, t_Q + head + (size_t)i0 * OV_D, t);
  ov_load(sk, t_K + head, t);
  ov_load(sv, t_V + head, t);
  pf_cp_async_commit();
  ov_load(sk + 4096, t_K + head + 64 * OV_D, t);
  ov_load(sv + 4096, t_V + head + 64 * OV_D, t);
  pf_cp_async_commit();
#pragma unroll
  for (int r = 0; r < 2; r++) { m[r] = -INFINITY; sum[r] = 0.0f; }
#pragma unroll
  for (int k = 0; k < 32; k++) o[k] = 0.0f;
  pf_cp_async_wait<1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  /* the scores of tile kt into s, waited for */
#define OV_SCORES(kt)                                                                              \
  {                                                                                                \
    unsigned short *const kc_ = sk + ((kt) & 1) * 4096;                                            \
    _Pragma("unroll") for (int kk = 0; kk < 4; kk++) {                                             \
      const unsigned long long da = pf_wgmma_desc_at(dk0, pf_shared_bytes(&sq[kk * 16]));          \
      const unsigned long long db = pf_wgmma_desc_at(dk0, pf_shared_bytes(&kc_[kk * 16]));         \
      pf_fa_wgmma_ss_n64(s, da, db, kk);                                                           \
    }                                                                                              \
    pf_wgmma_commit();                                                                             \
  }
#define OV_VALUES(kt)                                                                              \
  {                                                                                                \
    unsigned short *const vc_ = sv + ((kt) % 3) * 4096;                                           \
    _Pragma("unroll") for (int kc = 0; kc < 4; kc++) {                                             \
      const unsigned long long db = pf_wgmma_desc_at(dv0, pf_shared_bytes(&vc_[kc * 1024]));       \
      pf_fa_wgmma_rs_n64(o, &pa[kc * 4], db);                                                      \
      pf_fa_wgmma_rs_n64(o, &pl[kc * 4], db);                                                      \
    }                                                                                              \
    pf_wgmma_commit();                                                                             \
  }
  float mn[2], cf[2];
  /* the softmax of the scores in s: new maximum, factor, exponentials in
     place, row sums */
#define OV_SOFTMAX()                                                                               \
  {                                                                                                \
    float mt[2] = {-INFINITY, -INFINITY};                                                          \
    _Pragma("unroll") for (int r = 0; r < 2; r++)                                                  \
    _Pragma("unroll") for (int n = 0; n < 8; n++)                                                  \
    _Pragma("unroll") for (int h = 0; h < 2; h++) mt[r] = fmaxf(mt[r], s[n * 4 + 2 * r + h]);      \
    _Pragma("unroll") for (int r = 0; r < 2; r++) {                                                \
      float v = mt[r];                                                                             \
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));                                            \
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));                                            \
      mn[r] = fmaxf(m[r], v * 0.125f);                                                             \
      const float e_ = pf_exp2_ftz((m[r] - mn[r]) * 1.4426950408889634f);                         \
      cf[r] = (m[r] == mn[r]) ? 1.0f : e_;                                                         \
      m[r] = mn[r];                                                                                \
    }                                                                                              \
    float st[2] = {0.0f, 0.0f};                                                                    \
    _Pragma("unroll") for (int r = 0; r < 2; r++) {                                                \
      const float nm = -(mn[r] * 1.4426950408889634f);                                             \
      _Pragma("unroll") for (int n = 0; n < 8; n++)                                                \
      _Pragma("unroll") for (int h = 0; h < 2; h++) {                                              \
        const int k = n * 4 + 2 * r + h;                                                           \
        s[k] = pf_exp2_ftz(fmaf(s[k], 0.18033688f, nm));                                           \
        st[r] += s[k];                                                                             \
      }                                                                                            \
    }                                                                                              \
    _Pragma("unroll") for (int r = 0; r < 2; r++) {                                                \
      float v = st[r];                                                                             \
      v = v + __shfl_xor_sync(0xffffffffu, v, 1);                                                  \
      v = v + __shfl_xor_sync(0xffffffffu, v, 2);                                                  \
      sum[r] = sum[r] * cf[r] + v;                                                                 \
    }                                                                                              \
  }
  /* after the value products landed: repair the accumulators, split the
     weights for the next value products */
#define OV_REPAIR_SPLIT()                                                                          \
  {                                                                                                \
    if (__any_sync(0xffffffffu, cf[0] != 1.0f || cf[1] != 1.0f)) {                                \
      _Pragma("unroll") for (int r = 0; r < 2; r++)                                                \
      _Pragma("unroll") for (int n = 0; n < 8; n++)                                                \
      _Pragma("unroll") for (int h = 0; h < 2; h++) o[n * 4 + 2 * r + h] *= cf[r];                 \
    }                                                                                              \
    _Pragma("unroll") for (int r = 0; r < 2; r++)                                                  \
    _Pragma("unroll") for (int n = 0; n < 8; n++)                                                  \
      pf_split2(s[n * 4 + 2 * r], s[n * 4 + 2 * r + 1], &pa[(n / 2) * 4 + (n % 2) * 2 + r],       \
                &pl[(n / 2) * 4 + (n % 2) * 2 + r]);                                               \
  }
  pf_wgmma_fence();
  OV_SCORES(0);
  pf_wgmma_wait0();
  pf_fa_keep_n64(s);
  OV_SOFTMAX();
  OV_REPAIR_SPLIT();
  for (int kt = 1; kt < nk; kt++) {
    pf_cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + 1 < nk) {
      ov_load(sk + ((kt + 1) & 1) * 4096, t_K + head + (size_t)(kt + 1) * 64 * OV_D, t);
      ov_load(sv + ((kt + 1) % 3) * 4096, t_V + head + (size_t)(kt + 1) * 64 * OV_D, t);
    }
    pf_cp_async_commit();
    pf_wgmma_fence();
    OV_SCORES(kt);
    OV_VALUES(kt - 1);
    pf_wgmma_wait1();
    pf_fa_keep_n64(s);
    OV_SOFTMAX();
    /* a branch on the softmax's last result: ptxas schedules within a
       block, so the wait for the value products stays below the softmax
       (without it the wait rises to the first shuffle) */
    asm volatile("st.shared.f32 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(&ov_pin[t])), "f"(sum[0]) : "memory");
    pf_wgmma_wait0();
    pf_fa_keep_n64(o);
    OV_REPAIR_SPLIT();
  }
  pf_wgmma_fence();
  OV_VALUES(nk - 1);
  pf_wgmma_wait0();
  pf_fa_keep_n64(o);
  pf_cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; r++)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int ei = i0 + w * 16 + g + 8 * r, ee = n * 8 + 2 * c + h;
        t_Y[head + (size_t)ei * OV_D + ee] = pf_f2h(o[n * 4 + 2 * r + h] / sum[r]);
      }
#endif
}
