//! A fingerprint of the compiler's sources, so that the compilation cache
//! reuses a compiled program only from the same polyfuse build (tuned
//! options stay valid across builds; generated code may not).

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let mut list = Vec::new();
    files(Path::new("src"), &mut list);
    list.push(PathBuf::from("Cargo.lock"));
    list.sort();
    // FNV-1a 64 over every path and its contents.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in &list {
        let bytes = std::fs::read(p).unwrap_or_default();
        for b in p.to_string_lossy().as_bytes().iter().chain(&bytes) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=POLYFUSE_SOURCE_HASH={h:016x}");
}
