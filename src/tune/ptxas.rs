//! Registers, spills and static shared memory per kernel from `ptxas -v`,
//! as `scripts/cuda-compile-check.sh` reads them: the CUDA source goes
//! through NVRTC to PTX, the PTX through `ptxas -arch=ARCH -v`. Both tools
//! come from `scripts/cuda-tools.sh` (or a CUDA toolkit); where either is
//! missing the figures are absent, never guessed.

use std::path::PathBuf;
use std::process::Command;

/// ptxas's report for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub kernel: String,
    pub registers: u32,
    pub spill_stores: u64,
    pub spill_loads: u64,
    pub shared_bytes: u64,
    pub stack_bytes: u64,
}

/// `ptxas` on PATH (or `$CUDA_HOME/bin`, or `./.cuda-tools`' wheel layout).
pub fn find_ptxas() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("CUDA_HOME") {
        dirs.push(PathBuf::from(h).join("bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
}

/// The resources of every kernel of `source` for `arch` (`sm_90`), or
/// `None` when NVRTC or ptxas is not available or fails (the reason is
/// returned as text for a note).
pub fn resources(source: &str, arch: &str) -> std::result::Result<Vec<KernelResources>, String> {
    let ptxas = find_ptxas().ok_or("ptxas not found (scripts/cuda-tools.sh installs it)")?;
    let ptx = crate::runtime::cuda::compile_ptx(source, arch).map_err(|e| e.to_string())?;
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let base = std::env::temp_dir().join(format!(
        "polyfuse-ptxas-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    let ptx_path = base.with_extension("ptx");
    let cubin = base.with_extension("cubin");
    std::fs::write(&ptx_path, ptx).map_err(|e| format!("cannot write PTX: {e}"))?;
    let out = Command::new(&ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg("-o")
        .arg(&cubin)
        .arg(&ptx_path)
        .output();
    let _ = std::fs::remove_file(&ptx_path);
    let _ = std::fs::remove_file(&cubin);
    let out = out.map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!(
            "ptxas failed: {}",
            text.lines().next().unwrap_or("")
        ));
    }
    Ok(parse(&text))
}

/// Parses `ptxas -v` output (one block per entry function).
pub fn parse(text: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(KernelResources {
                kernel: name,
                ..Default::default()
            });
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let next = |k: usize| words.get(i + k).copied().unwrap_or("");
            let num = || w.trim_end_matches(',').parse::<u64>().ok();
            match (next(1), next(2)) {
                ("bytes", "stack") => cur.stack_bytes = num().unwrap_or(0),
                ("bytes", "spill") if next(3).starts_with("stores") => {
                    cur.spill_stores = num().unwrap_or(0)
                }
                ("bytes", "spill") if next(3).starts_with("loads") => {
                    cur.spill_loads = num().unwrap_or(0)
                }
                ("bytes", s) if s.starts_with("smem") => cur.shared_bytes = num().unwrap_or(0),
                (r, _) if r.starts_with("registers") && *w != "Used" => {
                    cur.registers = num().unwrap_or(0) as u32
                }
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptxas_reports() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'gemm_kernel_0' for 'sm_90'\n\
ptxas info    : Function properties for gemm_kernel_0\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 384 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'gemm_kernel_1' for 'sm_90'\n\
ptxas info    : Function properties for gemm_kernel_1\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 18 registers, 368 bytes cmem[0]\n";
        let r = parse(text);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelResources {
                kernel: "gemm_kernel_0".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12,
                shared_bytes: 8192,
                stack_bytes: 8,
            }
        );
        assert_eq!(r[1].registers, 18);
        assert_eq!(r[1].shared_bytes, 0);
    }
}
