// Issue 37, first measurement: does the Hopper copy engine (TMA) pay for
// polyfuse's wgmma contraction, and does warp specialisation on top?
//
// Three f16 products C(M,N) = A(M,K) B(K,N), row-major, f32 accumulation,
// f16 output, with the tile polyfuse's default picks at 4096^3 (128 x 256 x
// 64, 4 stages, two consumer warpgroups of 64 x 256, wgmma.m64n256k16, the
// 128-byte swizzle and the same shared layouts and descriptors as
// polyfuse's emitted kernel, whose helpers pf_helpers.cuh is a copy of):
//
//   tma      256 threads, one tile a block: thread 0 issues the TMA copies
//            (full barrier a stage, tx-counted), each warp releases a stage
//            on an empty barrier once its wgmma on it is done.
//   ws_mc    ws in clusters of two blocks along m that share B's tile:
//            each copies half of B's boxes, multicast into both, and a
//            stage is refilled once both blocks' consumers released it.
//   ws       384 threads, persistent: warpgroup 0 is the producer (one
//            thread issues the copies, setmaxnreg 40), warpgroups 1 and 2
//            consume (setmaxnreg 232); the producer runs on into the next
//            tile while the consumers store the last one.
//   cublas   cublasGemmEx, f16 in and out, f32 compute.
//
// Each is checked against cuBLAS on the same random inputs (relative max
// error), timed as the median of 100 launches after 20 warm-up launches.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a gemm_tma.cu -lcuda -lcublas
//   ./a.out M N K
#include "pf_helpers.cuh"


struct __align__(64) PfTensorMap {
    unsigned long long opaque[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ unsigned pf_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void pf_mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void pf_mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void pf_mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void pf_mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
static __device__ __forceinline__ void pf_tma_load_2d(unsigned dst, const PfTensorMap *map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// Cluster of two blocks along m sharing B: each block's producer copies its
// own A box and half of B's boxes, multicast into both blocks; a stage is
// refilled once the consumers of both blocks released it.
static __device__ __forceinline__ void pf_tma_load_2d_mc(unsigned dst, const PfTensorMap *map, int c0, int c1, unsigned bar,
                                                         unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
        "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
        : "memory");
}
static __device__ __forceinline__ void pf_mbar_arrive_cluster(unsigned bar, unsigned rank) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
        "r"(rank)
        : "memory");
}
// The same arrival without `.release.cluster`: the default semantics
// (release at CTA scope). The consumer's wgmma reads of the stage are
// complete (wgmma.wait_group) before it arrives, so no fence is needed to
// order them before the peer's refill; the `.cluster` form costs a
// MEMBAR.ALL.GPU-class stall each arrival (ncu: "waiting on a memory
// barrier", 32.6% of the issue gaps at 4096^3).
static __device__ __forceinline__ void pf_mbar_arrive_remote(unsigned bar, unsigned rank) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
                 "r"(rank)
                 : "memory");
}
static __device__ __forceinline__ void pf_cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ unsigned pf_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
#endif

#define BM 128
#define BN 256
#define BK 64
#define STAGES 4
#define A_STAGE (BM * BK)
#define B_STAGE (BN * BK)
#define STAGE_BYTES ((A_STAGE + B_STAGE) * 2)
#define SMEM_BYTES (STAGES * STAGE_BYTES + 2 * STAGES * 8)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One consumer warpgroup's k tile: 4 wgmma of k 16 on stage `st`.
static __device__ __forceinline__ void pf_consume(float *acc, unsigned long long da0, unsigned long long db0, int st, int wg) {
    pf_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        const unsigned long long da = pf_wgmma_desc_at(da0, 2u * (unsigned)(st * A_STAGE + wg * 4096 + ks * 16));
        const unsigned long long db = pf_wgmma_desc_at(db0, 2u * (unsigned)(st * B_STAGE + ks * 1024));
        pf_wgmma_f16_n256_t01(acc, da, db, 1);
    }
    pf_wgmma_commit();
}

// The stage's copies: A's 128 x 64 box at (k, m0), B's four 64 x 64 boxes.
static __device__ __forceinline__ void pf_produce(const PfTensorMap *ma, const PfTensorMap *mb, unsigned short *sA,
                                                  unsigned short *sB, unsigned bar, int st, int m0, int n0, int k) {
    pf_mbar_expect_tx(bar, STAGE_BYTES);
    pf_tma_load_2d(pf_smem(sA + st * A_STAGE), ma, k, m0, bar);
#pragma unroll
    for (int j = 0; j < 4; j++) pf_tma_load_2d(pf_smem(sB + st * B_STAGE + j * 4096), mb, n0 + 64 * j, k, bar);
}

// The accumulators of warpgroup `wg` (rows wg * 64 ..) stored as f16 pairs.
static __device__ __forceinline__ void pf_store(const float *acc, unsigned short *C, int M, int N, int m0, int n0, int wg, int t) {
    const int lane = t % 32, warp = t / 32;
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int r = 0; r < 4; r += 2) {
            const int m = m0 + wg * 64 + warp * 16 + lane / 4 + (r / 2) * 8;
            const int n = n0 + nt * 8 + (lane % 4) * 2;
            if (m < M && n + 1 < N && (N % 2) == 0) {
                __half2 h = __floats2half2_rn(acc[nt * 4 + r], acc[nt * 4 + r + 1]);
                *(__half2 *)&C[(size_t)m * N + n] = h;
            } else if (m < M) {
                if (n < N) C[(size_t)m * N + n] = pf_f2h(acc[nt * 4 + r]);
                if (n + 1 < N) C[(size_t)m * N + n + 1] = pf_f2h(acc[nt * 4 + r + 1]);
            }
        }
}
#endif

// The accumulators staged in shared memory (the pipeline's stages, free
// once the main loop is over), then copied out a row at a time in 16-byte
// pieces: a warp's store covers 512 contiguous bytes, where pf_store's
// 4-byte pairs touch eight rows (eight lines) per instruction. The pitch of
// BN + 8 halves puts row j at bank 4j, so a warp's pair writes (8 rows, 4
// lanes each) meet 32 distinct banks.
#define C_PITCH (BN + 8)
static __device__ __forceinline__ void pf_store_staged(const float *acc, unsigned short *sC, unsigned short *C, int M, int N, int m0,
                                                       int n0, int tid) {
    const int wg = tid / 128, t = tid % 128, lane = t % 32, warp = t / 32;
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int r = 0; r < 4; r += 2) {
            const int row = wg * 64 + warp * 16 + lane / 4 + (r / 2) * 8, col = nt * 8 + (lane % 4) * 2;
            *(__half2 *)&sC[row * C_PITCH + col] = __floats2half2_rn(acc[nt * 4 + r], acc[nt * 4 + r + 1]);
        }
    __syncthreads();
    for (int i = tid; i < BM * (BN / 8); i += 256) {
        const int row = i / (BN / 8), ch = i % (BN / 8), m = m0 + row, n = n0 + ch * 8;
        if (m >= M) continue;
        const unsigned short *src = &sC[row * C_PITCH + ch * 8];
        unsigned short *dst = &C[(size_t)m * N + n];
        if (n + 7 < N && ((unsigned long long)dst) % 16 == 0)
            *(uint4 *)dst = *(const uint4 *)src;
        else
            for (int j = 0; j < 8 && n + j < N; j++) dst[j] = src[j];
    }
}

extern "C" __global__ void __launch_bounds__(256, 1)
    gemm_tma(const __grid_constant__ PfTensorMap ma, const __grid_constant__ PfTensorMap mb, unsigned short *C, int M, int N, int K,
             int staged) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
    unsigned short *sA = pf_dynamic_shared;
    unsigned short *sB = sA + STAGES * A_STAGE;
    unsigned long long *bars = (unsigned long long *)(sB + STAGES * B_STAGE);
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            pf_mbar_init(pf_smem(&bars[s]), 1);
            pf_mbar_init(pf_smem(&bars[STAGES + s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int kts = (K + BK - 1) / BK;
    const unsigned long long da0 = pf_wgmma_desc(sA, 16, 1024), db0 = pf_wgmma_desc(sB, 8192, 1024);
    if (tid == 0)
        for (int t = 0; t < STAGES && t < kts; t++) pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[t]), t, m0, n0, t * BK);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
    for (int t = 0; t < kts; t++) {
        const int st = t % STAGES;
        pf_mbar_wait(pf_smem(&bars[st]), (t / STAGES) & 1);
        pf_consume(acc, da0, db0, st, wg);
        pf_wgmma_wait1();
        if (t > 0) {
            const int ps = (t - 1) % STAGES;
            __syncwarp();
            if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[STAGES + ps]));
            if (tid == 0 && t - 1 + STAGES < kts) {
                pf_mbar_wait(pf_smem(&bars[STAGES + ps]), ((t - 1) / STAGES) & 1);
                pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[ps]), ps, m0, n0, (t - 1 + STAGES) * BK);
            }
        }
    }
    pf_wgmma_wait0();
    if (staged)
        pf_store_staged(acc, sA, C, M, N, m0, n0, tid);
    else
        pf_store(acc, C, M, N, m0, n0, wg, tid % 128);
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_ws(const __grid_constant__ PfTensorMap ma, const __grid_constant__ PfTensorMap mb, unsigned short *C, int M, int N, int K,
            int store) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
    unsigned short *sA = pf_dynamic_shared;
    unsigned short *sB = sA + STAGES * A_STAGE;
    unsigned long long *bars = (unsigned long long *)(sB + STAGES * B_STAGE);
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            pf_mbar_init(pf_smem(&bars[s]), 1);
            pf_mbar_init(pf_smem(&bars[STAGES + s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const int kts = (K + BK - 1) / BK;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % tiles_m) * BM, n0 = (tile / tiles_m) * BN;
                for (int t = 0; t < kts; t++, it++) {
                    const int st = it % STAGES;
                    if (it >= STAGES) pf_mbar_wait(pf_smem(&bars[STAGES + st]), ((it / STAGES) - 1) & 1);
                    pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[st]), st, m0, n0, t * BK);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int cw = wg - 1, t128 = tid % 128;
        const unsigned long long da0 = pf_wgmma_desc(sA, 16, 1024), db0 = pf_wgmma_desc(sB, 8192, 1024);
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int m0 = (tile % tiles_m) * BM, n0 = (tile / tiles_m) * BN;
            float acc[128];
#pragma unroll
            for (int i = 0; i < 128; i++) acc[i] = 0.0f;
            for (int t = 0; t < kts; t++, it++) {
                const int st = it % STAGES;
                pf_mbar_wait(pf_smem(&bars[st]), (it / STAGES) & 1);
                pf_consume(acc, da0, db0, st, cw);
                pf_wgmma_wait1();
                if (t > 0) {
                    __syncwarp();
                    if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[STAGES + (it - 1) % STAGES]));
                }
            }
            pf_wgmma_wait0();
            __syncwarp();
            if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[STAGES + (it - 1) % STAGES]));
            // store 0: the main loop alone (a store the compiler cannot drop).
            if (store || acc[0] == 1234.5f) pf_store(acc, C, M, N, m0, n0, cw, t128);
        }
    }
#endif
}


// ws with its tile staged in shared memory of its own (3 stages, so that
// the stages and the staged tile fit: 3 x 48 KB + 128 x 264 x 2 bytes):
// the producer refills the stages for the next tile while the consumers
// store this one, each warpgroup its own 64 rows behind a named barrier.
#define WS_ST_STAGES 3
#define WS_ST_SMEM (WS_ST_STAGES * STAGE_BYTES + BM * C_PITCH * 2 + 2 * WS_ST_STAGES * 8)
static __device__ __forceinline__ void pf_bar_named(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_ws_st(const __grid_constant__ PfTensorMap ma, const __grid_constant__ PfTensorMap mb, unsigned short *C, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
    unsigned short *sA = pf_dynamic_shared;
    unsigned short *sB = sA + WS_ST_STAGES * A_STAGE;
    unsigned short *sC = sB + WS_ST_STAGES * B_STAGE;
    unsigned long long *bars = (unsigned long long *)(sC + BM * C_PITCH);
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < WS_ST_STAGES; s++) {
            pf_mbar_init(pf_smem(&bars[s]), 1);
            pf_mbar_init(pf_smem(&bars[WS_ST_STAGES + s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const int kts = (K + BK - 1) / BK;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % tiles_m) * BM, n0 = (tile / tiles_m) * BN;
                for (int t = 0; t < kts; t++, it++) {
                    const int st = it % WS_ST_STAGES;
                    if (it >= WS_ST_STAGES) pf_mbar_wait(pf_smem(&bars[WS_ST_STAGES + st]), ((it / WS_ST_STAGES) - 1) & 1);
                    pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[st]), st, m0, n0, t * BK);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int cw = wg - 1, t128 = tid % 128, lane = t128 % 32, warp = t128 / 32;
        const unsigned long long da0 = pf_wgmma_desc(sA, 16, 1024), db0 = pf_wgmma_desc(sB, 8192, 1024);
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int m0 = (tile % tiles_m) * BM, n0 = (tile / tiles_m) * BN;
            float acc[128];
#pragma unroll
            for (int i = 0; i < 128; i++) acc[i] = 0.0f;
            for (int t = 0; t < kts; t++, it++) {
                const int st = it % WS_ST_STAGES;
                pf_mbar_wait(pf_smem(&bars[st]), (it / WS_ST_STAGES) & 1);
                pf_consume(acc, da0, db0, st, cw);
                pf_wgmma_wait1();
                if (t > 0) {
                    __syncwarp();
                    if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[WS_ST_STAGES + (it - 1) % WS_ST_STAGES]));
                }
            }
            pf_wgmma_wait0();
            __syncwarp();
            if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[WS_ST_STAGES + (it - 1) % WS_ST_STAGES]));
            // This warpgroup's 64 rows: staged, then copied out.
            pf_bar_named(1 + cw, 128);
#pragma unroll
            for (int nt = 0; nt < 32; nt++)
#pragma unroll
                for (int r = 0; r < 4; r += 2) {
                    const int row = cw * 64 + warp * 16 + lane / 4 + (r / 2) * 8, col = nt * 8 + (lane % 4) * 2;
                    *(__half2 *)&sC[row * C_PITCH + col] = __floats2half2_rn(acc[nt * 4 + r], acc[nt * 4 + r + 1]);
                }
            pf_bar_named(1 + cw, 128);
            for (int i = t128; i < 64 * (BN / 8); i += 128) {
                const int row = cw * 64 + i / (BN / 8), ch = i % (BN / 8), m = m0 + row, n = n0 + ch * 8;
                if (m >= M) continue;
                const unsigned short *src = &sC[row * C_PITCH + ch * 8];
                unsigned short *dst = &C[(size_t)m * N + n];
                if (n + 7 < N && ((unsigned long long)dst) % 16 == 0)
                    *(uint4 *)dst = *(const uint4 *)src;
                else
                    for (int j = 0; j < 8 && n + j < N; j++) dst[j] = src[j];
            }
        }
    }
#endif
}

// The tile stored by the copy engine (TMA store): each thread writes its
// values as f16 into the tile in shared memory, laid out as the 128-byte
// swizzle of 64 x 64 boxes (a warpgroup's 64 rows, four boxes along n),
// fences the writes for the async proxy, and after the warpgroup's barrier
// one thread issues the four boxes' stores; the engine clips what lies
// past the tensor. The consumers go on at once; the buffer is reused once
// the engine has read it (wait_group.read).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ void pf_tma_store_2d(const PfTensorMap *map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"((unsigned long long)map),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
static __device__ __forceinline__ void pf_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
static __device__ __forceinline__ void pf_bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
static __device__ __forceinline__ void pf_bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
static __device__ __forceinline__ void pf_fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Warpgroup cw's 64 x 256 accumulators into its four swizzled boxes at sW.
static __device__ __forceinline__ void pf_stage_swizzled(const float *acc, unsigned char *sW, int t128) {
    const int lane = t128 % 32, warp = t128 / 32;
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int r = 0; r < 4; r += 2) {
            const int row = warp * 16 + lane / 4 + (r / 2) * 8, col = nt * 8 + (lane % 4) * 2;
            const int box = col / 64, chunk = (col % 64) / 8, byte = (col % 8) * 2;
            unsigned char *p = sW + box * 8192 + row * 128 + ((chunk ^ (row % 8)) * 16) + byte;
            *(__half2 *)p = __floats2half2_rn(acc[nt * 4 + r], acc[nt * 4 + r + 1]);
        }
}
static __device__ __forceinline__ void pf_store_boxes(const PfTensorMap *mc, const unsigned char *sW, int m0, int n0) {
#pragma unroll
    for (int b = 0; b < 4; b++) pf_tma_store_2d(mc, pf_smem(sW + b * 8192), n0 + 64 * b, m0);
    pf_bulk_commit();
}

#endif

extern "C" __global__ void __launch_bounds__(256, 1)
    gemm_tma_tst(const __grid_constant__ PfTensorMap ma, const __grid_constant__ PfTensorMap mb, const __grid_constant__ PfTensorMap mc,
                 int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
    unsigned short *sA = pf_dynamic_shared;
    unsigned short *sB = sA + STAGES * A_STAGE;
    unsigned long long *bars = (unsigned long long *)(sB + STAGES * B_STAGE);
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            pf_mbar_init(pf_smem(&bars[s]), 1);
            pf_mbar_init(pf_smem(&bars[STAGES + s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int kts = (K + BK - 1) / BK;
    const unsigned long long da0 = pf_wgmma_desc(sA, 16, 1024), db0 = pf_wgmma_desc(sB, 8192, 1024);
    if (tid == 0)
        for (int t = 0; t < STAGES && t < kts; t++) pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[t]), t, m0, n0, t * BK);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
    for (int t = 0; t < kts; t++) {
        const int st = t % STAGES;
        pf_mbar_wait(pf_smem(&bars[st]), (t / STAGES) & 1);
        pf_consume(acc, da0, db0, st, wg);
        pf_wgmma_wait1();
        if (t > 0) {
            const int ps = (t - 1) % STAGES;
            __syncwarp();
            if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[STAGES + ps]));
            if (tid == 0 && t - 1 + STAGES < kts) {
                pf_mbar_wait(pf_smem(&bars[STAGES + ps]), ((t - 1) / STAGES) & 1);
                pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[ps]), ps, m0, n0, (t - 1 + STAGES) * BK);
            }
        }
    }
    pf_wgmma_wait0();
    __syncthreads();
    unsigned char *sW = (unsigned char *)pf_dynamic_shared + wg * 32768;
    pf_stage_swizzled(acc, sW, tid % 128);
    pf_fence_async_shared();
    pf_bar_named(1 + wg, 128);
    if (tid % 128 == 0) {
        pf_store_boxes(&mc, sW, m0 + wg * 64, n0);
        pf_bulk_wait_read0();
    }
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_ws_tst(const __grid_constant__ PfTensorMap ma, const __grid_constant__ PfTensorMap mb, const __grid_constant__ PfTensorMap mc,
                int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
    unsigned short *sA = pf_dynamic_shared;
    unsigned short *sB = sA + WS_ST_STAGES * A_STAGE;
    unsigned char *sC = (unsigned char *)(sB + WS_ST_STAGES * B_STAGE);
    unsigned long long *bars = (unsigned long long *)(sC + BM * BN * 2);
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < WS_ST_STAGES; s++) {
            pf_mbar_init(pf_smem(&bars[s]), 1);
            pf_mbar_init(pf_smem(&bars[WS_ST_STAGES + s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const int kts = (K + BK - 1) / BK;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % tiles_m) * BM, n0 = (tile / tiles_m) * BN;
                for (int t = 0; t < kts; t++, it++) {
                    const int st = it % WS_ST_STAGES;
                    if (it >= WS_ST_STAGES) pf_mbar_wait(pf_smem(&bars[WS_ST_STAGES + st]), ((it / WS_ST_STAGES) - 1) & 1);
                    pf_produce(&ma, &mb, sA, sB, pf_smem(&bars[st]), st, m0, n0, t * BK);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int cw = wg - 1, t128 = tid % 128;
        unsigned char *sW = sC + cw * 32768;
        const unsigned long long da0 = pf_wgmma_desc(sA, 16, 1024), db0 = pf_wgmma_desc(sB, 8192, 1024);
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int m0 = (tile % tiles_m) * BM, n0 = (tile / tiles_m) * BN;
            float acc[128];
#pragma unroll
            for (int i = 0; i < 128; i++) acc[i] = 0.0f;
            for (int t = 0; t < kts; t++, it++) {
                const int st = it % WS_ST_STAGES;
                pf_mbar_wait(pf_smem(&bars[st]), (it / WS_ST_STAGES) & 1);
                pf_consume(acc, da0, db0, st, cw);
                pf_wgmma_wait1();
                if (t > 0) {
                    __syncwarp();
                    if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[WS_ST_STAGES + (it - 1) % WS_ST_STAGES]));
                }
            }
            pf_wgmma_wait0();
            __syncwarp();
            if (tid % 32 == 0) pf_mbar_arrive(pf_smem(&bars[WS_ST_STAGES + (it - 1) % WS_ST_STAGES]));
            if (t128 == 0) pf_bulk_wait_read0();
            pf_bar_named(1 + cw, 128);
            pf_stage_swizzled(acc, sW, t128);
            pf_fence_async_shared();
            pf_bar_named(1 + cw, 128);
            if (t128 == 0) pf_store_boxes(&mc, sW, m0 + cw * 64, n0);
        }
        if (t128 == 0) pf_bulk_wait0();
    }
#endif
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)
    gemm_ws_mc(const __grid_constant__ PfTensorMap ma, const __grid_constant__ PfTensorMap mb, unsigned short *C, int M, int N, int K,
               int store, int plain_arrive) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned short pf_dynamic_shared[];
    unsigned short *sA = pf_dynamic_shared;
    unsigned short *sB = sA + STAGES * A_STAGE;
    unsigned long long *bars = (unsigned long long *)(sB + STAGES * B_STAGE);
    const int tid = threadIdx.x, wg = tid / 128;
    const unsigned rank = pf_cluster_rank(), peer = rank ^ 1u;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            pf_mbar_init(pf_smem(&bars[s]), 1);
            pf_mbar_init(pf_smem(&bars[STAGES + s]), 16);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    pf_cluster_sync_all();
    // Tiles in pairs along m: the cluster's two blocks take the pair's two
    // row tiles of one column tile.
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int pairs_m = (tiles_m + 1) / 2, pairs = pairs_m * tiles_n;
    const int kts = (K + BK - 1) / BK;
    const int cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            int it = 0;
            for (int p = cluster; p < pairs; p += clusters) {
                const int m0 = (2 * (p % pairs_m) + (int)rank) * BM, n0 = (p / pairs_m) * BN;
                for (int t = 0; t < kts; t++, it++) {
                    const int st = it % STAGES;
                    if (it >= STAGES) pf_mbar_wait(pf_smem(&bars[STAGES + st]), ((it / STAGES) - 1) & 1);
                    const unsigned bar = pf_smem(&bars[st]);
                    pf_mbar_expect_tx(bar, STAGE_BYTES);
                    pf_tma_load_2d(pf_smem(sA + st * A_STAGE), &ma, t * BK, m0, bar);
#pragma unroll
                    for (int j = 2 * (int)rank; j < 2 * (int)rank + 2; j++)
                        pf_tma_load_2d_mc(pf_smem(sB + st * B_STAGE + j * 4096), &mb, n0 + 64 * j, t * BK, bar, (unsigned short)3);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int cw = wg - 1, t128 = tid % 128;
        const unsigned long long da0 = pf_wgmma_desc(sA, 16, 1024), db0 = pf_wgmma_desc(sB, 8192, 1024);
        int it = 0;
        for (int p = cluster; p < pairs; p += clusters) {
            const int m0 = (2 * (p % pairs_m) + (int)rank) * BM, n0 = (p / pairs_m) * BN;
            float acc[128];
#pragma unroll
            for (int i = 0; i < 128; i++) acc[i] = 0.0f;
            for (int t = 0; t < kts; t++, it++) {
                const int st = it % STAGES;
                pf_mbar_wait(pf_smem(&bars[st]), (it / STAGES) & 1);
                pf_consume(acc, da0, db0, st, cw);
                pf_wgmma_wait1();
                if (t > 0) {
                    __syncwarp();
                    if (tid % 32 == 0) {
                        const unsigned e = pf_smem(&bars[STAGES + (it - 1) % STAGES]);
                        pf_mbar_arrive(e);
                        if (plain_arrive) pf_mbar_arrive_remote(e, peer); else pf_mbar_arrive_cluster(e, peer);
                    }
                }
            }
            pf_wgmma_wait0();
            __syncwarp();
            if (tid % 32 == 0) {
                const unsigned e = pf_smem(&bars[STAGES + (it - 1) % STAGES]);
                pf_mbar_arrive(e);
                if (plain_arrive) pf_mbar_arrive_remote(e, peer); else pf_mbar_arrive_cluster(e, peer);
            }
            // store 0: the main loop alone (a store the compiler cannot drop).
            if (store || acc[0] == 1234.5f) pf_store(acc, C, M, N, m0, n0, cw, t128);
        }
    }
    // No block leaves while its peer may still copy into it or arrive on it.
    pf_cluster_sync_all();
#endif
}

#ifndef __CUDACC_RTC__
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t ck_ = (x);                                                          \
        if (ck_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(ck_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

// A row-major rows x cols f16 matrix as a 2-D tensor map with box
// box_cols x box_rows (box_cols * 2 = 128 bytes: the 128-byte swizzle).
static PfTensorMap make_map(void *base, int rows, int cols, int box_rows, int box_cols) {
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    cuuint32_t estr[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, base, dims, strides, box, estr,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r);
        exit(1);
    }
    PfTensorMap p;
    static_assert(sizeof(CUtensorMap) == sizeof(PfTensorMap), "tensor map size");
    memcpy(&p, &m, sizeof m);
    return p;
}

template <typename F> static float median_us(F launch, int warm, int runs) {
    for (int i = 0; i < warm; i++) launch();
    CK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> ev(2 * runs);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < runs; i++) {
        CK(cudaEventRecord(ev[2 * i]));
        launch();
        CK(cudaEventRecord(ev[2 * i + 1]));
    }
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<float> t(runs);
    for (int i = 0; i < runs; i++) CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
    for (auto &e : ev) CK(cudaEventDestroy(e));
    std::sort(t.begin(), t.end());
    return t[runs / 2] * 1000.0f;
}

static double rel_err(const std::vector<__half> &x, const std::vector<__half> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); i++) {
        double a = __half2float(x[i]), b = __half2float(ref[i]);
        if (!std::isfinite(a)) return INFINITY;
        num = std::max(num, std::fabs(a - b));
        den = std::max(den, std::fabs(b));
    }
    return num / den;
}

int main(int argc, char **argv) {
    const int M = argc > 1 ? atoi(argv[1]) : 4096, N = argc > 2 ? atoi(argv[2]) : 4096, K = argc > 3 ? atoi(argv[3]) : 4096;
    if (K % 8 || N % 8) {
        fprintf(stderr, "TMA needs row strides that are multiples of 16 bytes (K, N multiples of 8)\n");
        return 2;
    }
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<__half> hA((size_t)M * K), hB((size_t)K * N);
    for (auto &v : hA) v = __float2half(u(rng));
    for (auto &v : hB) v = __float2half(u(rng));
    __half *dA, *dB, *dC, *dR;
    CK(cudaMalloc(&dA, hA.size() * 2));
    CK(cudaMalloc(&dB, hB.size() * 2));
    CK(cudaMalloc(&dC, (size_t)M * N * 2));
    CK(cudaMalloc(&dR, (size_t)M * N * 2));
    CK(cudaMemcpy(dA, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hB.data(), hB.size() * 2, cudaMemcpyHostToDevice));

    cublasHandle_t h;
    cublasCreate(&h);
    const float one = 1.f, zero = 0.f;
    auto cublas = [&]() {
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, dB, CUDA_R_16F, N, dA, CUDA_R_16F, K, &zero, dR, CUDA_R_16F,
                     N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    cublas();
    CK(cudaDeviceSynchronize());
    std::vector<__half> ref((size_t)M * N), out((size_t)M * N);
    CK(cudaMemcpy(ref.data(), dR, ref.size() * 2, cudaMemcpyDeviceToHost));

    PfTensorMap ma = make_map(dA, M, K, BM, BK), mb = make_map(dB, K, N, BK, 64);
    CK(cudaFuncSetAttribute(gemm_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    CK(cudaFuncSetAttribute(gemm_ws, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    CK(cudaFuncSetAttribute(gemm_ws_mc, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    CK(cudaFuncSetAttribute(gemm_ws_st, cudaFuncAttributeMaxDynamicSharedMemorySize, WS_ST_SMEM));
    CK(cudaFuncSetAttribute(gemm_tma_tst, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    CK(cudaFuncSetAttribute(gemm_ws_tst, cudaFuncAttributeMaxDynamicSharedMemorySize, WS_ST_SMEM));
    PfTensorMap mc = make_map(dC, M, N, 64, 64);
    const int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    dim3 grid_tma((N + BN - 1) / BN, (M + BM - 1) / BM);
    const int grid_ws = std::min(tiles, prop.multiProcessorCount);
    auto tma = [&]() { gemm_tma<<<grid_tma, 256, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 0); };
    auto tma_staged = [&]() { gemm_tma<<<grid_tma, 256, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 1); };
    auto ws = [&]() { gemm_ws<<<grid_ws, 384, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 1); };
    auto ws_st = [&]() { gemm_ws_st<<<grid_ws, 384, WS_ST_SMEM>>>(ma, mb, (unsigned short *)dC, M, N, K); };
    auto tma_tst = [&]() { gemm_tma_tst<<<grid_tma, 256, SMEM_BYTES>>>(ma, mb, mc, M, N, K); };
    auto ws_tst = [&]() { gemm_ws_tst<<<grid_ws, 384, WS_ST_SMEM>>>(ma, mb, mc, M, N, K); };
    auto ws_nostore = [&]() { gemm_ws<<<grid_ws, 384, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 0); };
    // Clusters of two: an even grid, at most one block a multiprocessor.
    // As many clusters as fit at once: a GPC's multiprocessors pair up, and
    // an odd one out (or one the driver keeps back) hosts no cluster, so
    // half the multiprocessor count can be more than fit and would leave a
    // second, nearly empty wave.
    int max_clusters = 0;
    {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(2 * ((tiles + 1) / 2));
        cfg.blockDim = dim3(384);
        cfg.dynamicSmemBytes = SMEM_BYTES;
        CK(cudaOccupancyMaxActiveClusters(&max_clusters, (void *)gemm_ws_mc, &cfg));
    }
    printf("clusters of two at once: %d (multiprocessors %d)\n", max_clusters, prop.multiProcessorCount);
    const int grid_mc = std::min(2 * ((tiles + 1) / 2), 2 * max_clusters);
    auto ws_mc = [&]() { gemm_ws_mc<<<grid_mc, 384, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 1, 0); };
    auto ws_mc_plain = [&]() { gemm_ws_mc<<<grid_mc, 384, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 1, 1); };
    auto ws_mc_plain_nostore = [&]() { gemm_ws_mc<<<grid_mc, 384, SMEM_BYTES>>>(ma, mb, (unsigned short *)dC, M, N, K, 0, 1); };

    struct V {
        const char *name;
        std::function<void()> f;
    };
    double flop = 2.0 * M * N * K;
    float t_cublas = median_us(cublas, 20, 100);
    printf("%-8s M %d N %d K %d: %8.1f us %6.1f TFLOP/s\n", "cublas", M, N, K, t_cublas, flop / t_cublas * 1e-6);
    for (auto v : {V{"tma", tma}, V{"tma_st", tma_staged}, V{"tma_tst", tma_tst}, V{"ws", ws}, V{"ws_st", ws_st}, V{"ws_tst", ws_tst}, V{"ws_mc", ws_mc}, V{"ws_mc_pl", ws_mc_plain}, V{"ws_ns", ws_nostore},
                   V{"ws_mc_ns", ws_mc_plain_nostore}}) {
        CK(cudaMemset(dC, 0xff, (size_t)M * N * 2));  // poison: NaN
        v.f();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(out.data(), dC, out.size() * 2, cudaMemcpyDeviceToHost));
        double err = rel_err(out, ref);
        float t = median_us(v.f, 20, 100);
        printf("%-8s M %d N %d K %d: %8.1f us %6.1f TFLOP/s  %.2fx cuBLAS  err %.2e %s\n", v.name, M, N, K, t,
               flop / t * 1e-6, t / t_cublas, err, err < 1e-2 ? "ok" : "WRONG");
    }
    return 0;
}
#endif
