//! The attention kernel on the GPU: CUDA, each thread running the block's
//! code as its own, the warp-wide instructions as the hardware's.

use std::fmt::Write;

use crate::frontend::ast::{DType, Reducer};
use crate::gpu::attention::{Attention, BLOCK_KEYS};

use super::target::{FlashTarget, Fragment};
use super::{Emit, VALUE_LBO};

/// CUDA, run by the GPU.
pub(super) struct Gpu;

/// CUDA helpers: a pair of weights split into the rounded pair and the
/// rounded remainders, each as one packed A-fragment register (one
/// `cvt.rn.f16x2.f32` per pair).
pub fn gpu_helpers(a: &Attention) -> String {
    let dtype = a.dtype;
    let (t2, pack, unpack) = if dtype == DType::BF16 {
        (
            "__nv_bfloat162",
            "__floats2bfloat162_rn",
            "__bfloat1622float2",
        )
    } else {
        ("__half2", "__floats2half2_rn", "__half22float2")
    };
    format!(
        "static __device__ __forceinline__ float pf_exp2_ftz(float x) {{ float y; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y; }}\n\
         static __device__ __forceinline__ void pf_split2(float a, float b, unsigned *hi, unsigned *lo) {{\n\
         \x20 {t2} h = {pack}(a, b);\n\
         \x20 float2 f = {unpack}(h);\n\
         \x20 {t2} l = {pack}(a - f.x, b - f.y);\n\
         \x20 *hi = *(unsigned *)&h; *lo = *(unsigned *)&l;\n\
         }}\n{}{}",
        if a.contractions.iter().any(|c| c.rounded_once) {
            format!(
                "static __device__ __forceinline__ void pf_round2(float a, float b, unsigned *hi) {{\n\
                 \x20 {t2} h = {pack}(a, b);\n\
                 \x20 *hi = *(unsigned *)&h;\n\
                 }}\n"
            )
        } else {
            String::new()
        },
        if a.wgmma() {
            wgmma_helpers(a)
        } else {
            String::new()
        }
    )
}

/// The `wgmma` helpers of a kernel with a `wgmma` path (sm_90a):
/// `pf_fa_wgmma_ss_nN(d, da, db, acc)`, both operands K-major in shared
/// memory, `d = A B` (`acc` 0) or `d += A B`; `pf_fa_wgmma_rs_nN(d, a,
/// db)`, `d += A B` with A's fragment in registers and B MN-major; and
/// `pf_fa_keep_nN(d)`, which ties the accumulators to the point after the
/// wait, so that the compiler reads none of them before the tensor cores
/// have written them.
fn wgmma_helpers(a: &Attention) -> String {
    let ty = if a.dtype == DType::BF16 {
        "bf16"
    } else {
        "f16"
    };
    let mut widths: Vec<i64> = vec![a.warp_keys()];
    widths.extend(a.contractions.iter().map(|c| c.width));
    widths.sort_unstable();
    widths.dedup();
    let mut o = String::from("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n");
    for n in widths {
        let regs = n / 2;
        let (outs, cons) = super::super::mma::accumulator_operands(n);
        let _ = writeln!(
            o,
            "static __device__ __forceinline__ void pf_fa_wgmma_ss_n{n}(float *d, unsigned long long da, unsigned long long db, int acc) {{\n\
             \x20 asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{s}, 0;\\n\"\n\
             \x20   \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{outs}}}, %{da}, %{db}, p, 1, 1, 0, 0;\\n}}\\n\"\n\
             \x20   : {cons}\n\
             \x20   : \"l\"(da), \"l\"(db), \"r\"(acc));\n\
             }}\n\
             static __device__ __forceinline__ void pf_fa_wgmma_rs_n{n}(float *d, const unsigned *a, unsigned long long db) {{\n\
             \x20 asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n\"\n\
             \x20   \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{outs}}}, {{%{a0}, %{a1}, %{a2}, %{a3}}}, %{rb}, p, 1, 1, 1;\\n}}\\n\"\n\
             \x20   : {cons}\n\
             \x20   : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(db));\n\
             }}\n\
             static __device__ __forceinline__ void pf_fa_keep_n{n}(float *d) {{\n\
             \x20 asm volatile(\"\" : {cons} :: \"memory\");\n\
             }}",
            s = regs + 2,
            da = regs,
            db = regs + 1,
            a0 = regs,
            a1 = regs + 1,
            a2 = regs + 2,
            a3 = regs + 3,
            rb = regs + 4,
        );
    }
    o.push_str("#endif\n");
    o
}

impl FlashTarget for Gpu {
    fn unroll(&self) -> &'static str {
        "#pragma unroll\n"
    }

    fn unroll4(&self) -> &'static str {
        "#pragma unroll 4\n"
    }

    fn at(&self, name: &str, idx: &str) -> String {
        format!("{name}[{idx}]")
    }

    fn threads(&self, out: &mut String, _threads: u32, code: &str) {
        let _ = writeln!(out, "{{\n{code}}}");
    }

    fn warps(&self, out: &mut String, _warps: i64, code: &str) {
        let _ = writeln!(out, "{{\n{code}}}");
    }

    fn barrier(&self) -> &'static str {
        "__syncthreads();\n"
    }

    fn ldsm(&self, dst: &str, off: &str, addr: &str, trans: bool) -> String {
        format!(
            "pf_ldmatrix_x4{}(&{dst}[{off}], {addr});\n",
            if trans { "_trans" } else { "" }
        )
    }

    fn mma(&self, d: Fragment<'_>, a: Fragment<'_>, b: Fragment<'_>, bf16: bool) -> String {
        format!(
            "pf_mma_{}(&{}[{}], &{}[{}], &{}[{}]);\n",
            if bf16 { "bf16" } else { "f16" },
            d.0,
            d.1,
            a.0,
            a.1,
            b.0,
            b.1
        )
    }

    /// Two xor-shuffles.
    fn quad(&self, out: &mut String, threads: u32, name: &str, n: i64, op: Reducer) {
        let comb = |x: &str, y: &str| match op {
            Reducer::Sum => format!("{x} + {y}"),
            Reducer::Max => format!("fmaxf({x}, {y})"),
            _ => format!("fminf({x}, {y})"),
        };
        let mut code = String::new();
        let _ = writeln!(
            code,
            "{}for (int pf_r = 0; pf_r < {n}; pf_r++) {{ float pf_v = {name}[pf_r];",
            self.unroll()
        );
        for m in [1, 2] {
            let _ = writeln!(
                code,
                "  pf_v = {};",
                comb("pf_v", &format!("__shfl_xor_sync(0xffffffffu, pf_v, {m})"))
            );
        }
        let _ = writeln!(code, "  {name}[pf_r] = pf_v; }}");
        self.threads(out, threads, &code);
    }

    fn fast_exp(&self) -> bool {
        true
    }

    fn u16(&self) -> &'static str {
        "unsigned short"
    }

    fn copy_chunk(&self, src: &str, tensor: &str) -> (String, String) {
        (
            format!("pf_cp_async16_line(pf_dst, &{src});"),
            format!("pf_cp_async16(pf_dst, {tensor}, 0);"),
        )
    }

    fn commit(&self) -> &'static str {
        "pf_cp_async_commit();\n"
    }

    fn wait(&self, n: i32) -> String {
        format!("pf_cp_async_wait<{n}>();\n")
    }

    fn proxy_fence(&self) -> &'static str {
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
         asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n\
         #endif\n"
    }

    fn emulated(&self) -> bool {
        false
    }

    fn tile_barriers(&self, name: &str, stages: i64) -> String {
        format!(
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             __shared__ __align__(8) unsigned long long {name}[{stages}];\n\
             if (threadIdx.x == 0) {{\n\
             for (int pf_s = 0; pf_s < {stages}; pf_s++) pf_mbar_init(&{name}[pf_s], 1);\n\
             asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n\
             }}\n\
             __syncthreads();\n\
             #endif\n"
        )
    }

    fn tma_or(&self, tma: &str, threads: &str) -> String {
        format!("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n{tma}#else\n{threads}#endif\n")
    }

    fn expect_bytes(&self, bar: &str, bytes: i64) -> String {
        format!("pf_mbar_expect_tx({bar}, {bytes});\n")
    }

    fn tile_landed(&self, n: i32, bar: &str, parity: &str) -> String {
        format!(
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             pf_cp_async_wait<0>();\n\
             asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n\
             pf_mbar_wait({bar}, {parity});\n\
             #else\n\
             pf_cp_async_wait<{n}>();\n\
             #endif\n"
        )
    }

    fn beside_wgmma<'a>(&self, e: &mut Emit<'a>, mma_sync: fn(&mut Emit<'a>)) {
        e.line("#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)");
        mma_sync(e);
        e.line("#endif");
    }

    /// One warpgroup's `wgmma` steps through descriptors of the swizzled
    /// tiles, committed and waited for.
    fn wgmma_scores(&self, e: &mut Emit<'_>) {
        let a = e.a;
        let qa = a.block_rows() * 64;
        let groups = a.warps() / 4;
        let ka = BLOCK_KEYS * 64;
        let steps = a.depth / 16;
        let _ = writeln!(
            e.out,
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n{{\n\
             const int pf_wg = {wg};\n\
             pf_wgmma_fence();\n\
             #pragma unroll\n\
             for (int pf_kk = 0; pf_kk < {steps}; pf_kk++) {{\n\
             const unsigned long long pf_da = pf_wgmma_desc_at(pf_dk0, pf_shared_bytes(&pf_fa_q[pf_wg * 4096 + (pf_kk / 4) * {qa} + (pf_kk % 4) * 16]));\n\
             const unsigned long long pf_db = pf_wgmma_desc_at(pf_dk0, pf_shared_bytes(&pf_kcur[(pf_kk / 4) * {ka} + (pf_kk % 4) * 16]));\n\
             pf_fa_wgmma_ss_n{n}(pf_s, pf_da, pf_db, pf_kk);\n\
             }}\n\
             pf_wgmma_commit();\n\
             pf_wgmma_wait0();\n\
             pf_fa_keep_n{n}(pf_s);\n\
             }}\n#endif",
            n = a.warp_keys(),
            // One warpgroup: its query tile is the block's (a constant
            // offset, folded into the descriptors).
            wg = if groups == 1 { "0" } else { "pf_w / 4" }
        );
    }

    /// Every contraction's products issued after one fence, then one
    /// commit and wait for all of them.
    fn wgmma_values(&self, e: &mut Emit<'_>) {
        let a = e.a;
        let steps = a.warp_keys() / 16;
        e.line("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n{");
        // Promoted sums start at zero before the fence orders the
        // registers' writes before the tensor cores'.
        for (k, x) in a.contractions.iter().enumerate() {
            e.start_tile_sums(k, x);
        }
        e.line("pf_wgmma_fence();");
        for (k, x) in a.contractions.iter().enumerate() {
            let o = Emit::value_sums(k, x);
            let _ = writeln!(
                e.out,
                "#pragma unroll\n\
                 for (int pf_kc = 0; pf_kc < {steps}; pf_kc++) {{\n\
                 const unsigned long long pf_db = pf_wgmma_desc_at(pf_dv0, pf_shared_bytes(&pf_vcur{k}[pf_kc * 1024]));\n\
                 pf_fa_wgmma_rs_n{n}({o}, &pf_pa{k}[pf_kc * 4], pf_db);\n\
                 {remainder}\
                 }}",
                n = x.width,
                remainder = if x.rounded_once {
                    String::new()
                } else {
                    format!("pf_fa_wgmma_rs_n{}({o}, &pf_pl{k}[pf_kc * 4], pf_db);\n", x.width)
                }
            );
        }
        e.line("pf_wgmma_commit();\npf_wgmma_wait0();");
        for (k, x) in a.contractions.iter().enumerate() {
            let o = Emit::value_sums(k, x);
            let _ = writeln!(e.out, "pf_fa_keep_n{}({o});", x.width);
            e.add_tile_values(k, x);
        }
        e.line("}\n#endif");
    }

    fn shared_memory(&self, a: &Attention) -> String {
        format!(
            "extern __shared__ __align__({}) unsigned short pf_dynamic_shared[];\n",
            a.shared_layout().align
        )
    }

    fn wgmma_descriptors(&self) -> String {
        format!(
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n\
             const unsigned long long pf_dk0 = pf_wgmma_desc(pf_dynamic_shared, 16, 1024);\n\
             const unsigned long long pf_dv0 = pf_wgmma_desc(pf_dynamic_shared, {VALUE_LBO}, 1024);\n\
             #endif\n"
        )
    }

    fn per_thread(&self, _threads: u32, ty: &str, name: &str, len: i64) -> String {
        let ty = if ty == "uint32_t" { "unsigned" } else { ty };
        format!("{ty} {name}[{len}];\n")
    }

    fn open_block(&self, _a: &Attention, batch_decl: &str) -> String {
        format!(
            "const int pf_t = threadIdx.x, pf_w = pf_t / 32, pf_l = pf_t % 32, pf_g = pf_l / 4, pf_c = pf_l % 4;\n\
             (void)pf_w; (void)pf_g; (void)pf_c;\n\
             const pf_i pf_bx = blockIdx.x, pf_bt = blockIdx.y;\n{batch_decl}\n"
        )
    }

    fn close_block(&self) -> &'static str {
        ""
    }

    fn any_lane(&self, conds: &[String]) -> String {
        format!("if (__any_sync(0xffffffffu, {}))", conds.join(" || "))
    }

    fn dtype_arg(&self, _bf16: bool) -> String {
        String::new()
    }

    fn merge_buffer(&self, _floats: i64) -> String {
        "float *const pf_mg = (float *)pf_dynamic_shared;\n".into()
    }

    fn warp_fold(&self, var: &str, lanes: &str, combine: &dyn Fn(&str, &str) -> String) -> String {
        format!(
            "float {var};\n{{ {lanes}#pragma unroll\n\
             for (int pf_o = 16; pf_o > 0; pf_o /= 2) pf_v = {};\n\
             {var} = pf_v; }}\n",
            combine("pf_v", "__shfl_xor_sync(0xffffffffu, pf_v, pf_o)")
        )
    }

    fn combine_grid(&self, _a: &Attention, code: &str) -> String {
        format!(
            "const int pf_t = threadIdx.x, pf_w = pf_t / 32, pf_l = pf_t % 32;\n\
             const pf_i pf_ei = blockIdx.x, pf_bt = blockIdx.y, pf_ez = blockIdx.z;\n{code}\n"
        )
    }
}
