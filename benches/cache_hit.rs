//! How long a cache hit takes: `tune::compile_tuned` (open the SQLite
//! cache, look up the tuned options, read the compiled program back) for
//! each example and bench program, against compiling it. Target: under
//! 10 ms. Run with `cargo bench --bench cache_hit`.

use std::path::Path;
use std::time::Instant;

use polyfuse::tune::cache::{Cache, Key};
use polyfuse::tune::{compile_tuned, Variant};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("polyfuse-cache-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("cache.sqlite");
    let mut files: Vec<_> = ["examples", "bench/programs"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).into_iter().flatten())
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    println!(
        "{:<28} {:>6} {:>12} {:>12} {:>12}",
        "program", "target", "compile ms", "hit median", "hit max"
    );
    let mut worst: f64 = 0.0;
    for f in &files {
        let Ok(program) = polyfuse::frontend::load_file(f) else {
            continue;
        };
        for (gpu, arch) in [(false, "cpu"), (true, "sm_90")] {
            let variant = Variant::default();
            let t0 = Instant::now();
            let Ok(compiled) = polyfuse::compile(&program, &variant.options(gpu)) else {
                continue;
            };
            let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
            let mut db = Cache::open(&path).expect("cache");
            db.set_best(&Key::new(&program, arch), &variant, 1.0, Some(&compiled))
                .expect("store");
            drop(db);
            let mut times = Vec::new();
            for _ in 0..20 {
                let t = Instant::now();
                let (c, used) = compile_tuned(&program, arch, gpu, &path)
                    .expect("lookup")
                    .expect("a tuned entry");
                times.push(t.elapsed().as_secs_f64() * 1e3);
                assert!(used.hit && c.kernel_c == compiled.kernel_c);
            }
            times.sort_by(f64::total_cmp);
            let max = times[times.len() - 1];
            worst = worst.max(max);
            println!(
                "{:<28} {:>6} {:>12.1} {:>12.2} {:>12.2}",
                f.strip_prefix(root).unwrap_or(f).display(),
                if gpu { "cuda" } else { "cpu" },
                compile_ms,
                times[times.len() / 2],
                max
            );
        }
    }
    println!("slowest cache hit: {worst:.2} ms (target: under 10 ms)");
    let _ = std::fs::remove_dir_all(&dir);
}
