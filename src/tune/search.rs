//! `polyfuse tune`: the search space and TC's searches over it.
//!
//! A candidate is a genome, one choice index per gene; genes are the
//! strategy, the tiling mode, one tile size per band member (powers of two
//! and the divisors of the loop extents that leave no partial tile, as
//! TC's tuner offers), sinking, on the GPU the block, promotion, register
//! accumulators and warp reductions, and for a program with a repairable
//! reduction chain (softmax, attention) the repair (the program's, none,
//! rolling or split-k update) and the split factor.
//!
//! * random search: every candidate drawn uniformly;
//! * genetic search (TC): a population evolved by generations. The first
//!   generation is the default, a quarter of neighbours of the default
//!   (one or two genes changed: a tuned schedule is often a small step
//!   from a good heuristic, and a uniform draw over a space of millions
//!   rarely lands near it) and uniform draws for the rest. Fitness is
//!   1 / time (0 for a candidate that failed or whose `--check` failed);
//!   the best `elites` survive unchanged; every other child is a uniform
//!   crossover of three parents picked by fitness-proportional (roulette)
//!   selection — each gene from one of the three — followed by mutation
//!   (each gene redrawn with probability `mutation`).
//!
//! Both draw from one seeded generator in a fixed order, so the same seed
//! gives the same candidates in the same order for the same fitness values
//! (random search: always; genetic search: the first generation always, the
//! later ones when the measured times rank the candidates the same way).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::{measure_with, MeasureTarget, Variant};
use crate::error::{Error, Result};
use crate::frontend::ast::{ExprKind, Program};
use crate::pipeline::{compile_watched, compile_within, unfinished, Compiled, Watch};

/// A small, seedable generator (splitmix64): the search must not depend on
/// a library's stream staying the same across versions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x005e_ed0f_f00d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One gene: a key of the variant text and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Gene {
    pub key: String,
    pub values: Vec<String>,
}

/// The search space of one program on one target.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub genes: Vec<Gene>,
    /// Band members that get a tile-size gene (`tile0`, `tile1`, ...).
    pub tile_dims: usize,
}

pub type Genome = Vec<usize>;

impl Space {
    /// The space for `program`: tile sizes from its loop extents; GPU genes
    /// only when `gpu`.
    pub fn new(program: &Program, gpu: bool) -> Space {
        let extents = loop_extents(program);
        let tile_dims = extents.len().clamp(1, 4);
        let mut genes = vec![
            gene("strategy", &["isl", "min", "max"]),
            gene("tile", &["auto", "sizes", "off"]),
        ];
        for (d, ext) in extents.iter().take(tile_dims).enumerate() {
            genes.push(Gene {
                key: format!("tile{d}"),
                values: tile_sizes(ext).iter().map(|s| s.to_string()).collect(),
            });
        }
        genes.push(gene("sink", &["on", "off"]));
        if gpu {
            let mut blocks = vec!["auto".to_string()];
            for x in [16u32, 32, 64, 128, 256] {
                for y in [1u32, 2, 4, 8, 16, 32] {
                    if x * y <= 1024 && x * y >= 64 {
                        blocks.push(format!("{x}x{y}"));
                    }
                }
            }
            genes.push(Gene {
                key: "block".into(),
                values: blocks,
            });
            genes.push(gene("shared", &["on", "off"]));
            genes.push(gene("registers", &["on", "off"]));
            genes.push(gene("reduce", &["on", "off"]));
            genes.push(gene("vector", &["1", "2", "4"]));
            genes.push(gene("unroll", &["auto", "off", "on"]));
            genes.push(gene("pipeline", &["auto", "off", "on"]));
            if has_low_precision_sum(program) {
                genes.push(gene("ksplit", &["auto", "1", "2", "4", "8"]));
            }
        }
        if has_repairable_chain(program) {
            genes.push(gene("repair", crate::repair::Choice::NAMES));
            genes.push(gene("split", &["4", "8", "16", "32", "64"]));
        }
        Space { genes, tile_dims }
    }

    /// `genome` with `changes` genes (distinct, each with more than one
    /// value) redrawn to a different value.
    pub fn neighbour(&self, genome: &Genome, changes: usize, rng: &mut Rng) -> Genome {
        let mut out = genome.clone();
        let mut free: Vec<usize> = (0..self.genes.len())
            .filter(|&i| self.genes[i].values.len() > 1)
            .collect();
        for _ in 0..changes.min(free.len()) {
            let i = free.swap_remove(rng.below(free.len()));
            let n = self.genes[i].values.len();
            // a value other than the current one
            out[i] = (out[i] + 1 + rng.below(n - 1)) % n;
        }
        out
    }

    pub fn random(&self, rng: &mut Rng) -> Genome {
        self.genes
            .iter()
            .map(|g| rng.below(g.values.len()))
            .collect()
    }

    /// The variant of a genome. Tile-size genes matter only with
    /// `tile=sizes`.
    pub fn decode(&self, genome: &Genome) -> Variant {
        let mut pairs = Vec::new();
        let mut sizes = Vec::new();
        let mut tile_mode = "auto";
        for (g, &i) in self.genes.iter().zip(genome) {
            let value = g.values.get(i).map(String::as_str).unwrap_or("auto");
            if g.key.starts_with("tile") && g.key.len() > 4 {
                sizes.push(value.to_string());
            } else if g.key == "tile" {
                tile_mode = value;
            } else {
                pairs.push(format!("{}={value}", g.key));
            }
        }
        pairs.push(match tile_mode {
            "sizes" => format!("tile={}", sizes.join("x")),
            other => format!("tile={other}"),
        });
        // Every value comes from the space, so the text always parses.
        Variant::parse(&pairs.join(",")).unwrap_or_default()
    }

    /// The genome of `v` where the space has its values (the default
    /// variant is always representable).
    pub fn encode(&self, v: &Variant) -> Genome {
        let text = v.canonical();
        let value_of = |key: &str| {
            text.split(',')
                .find_map(|p| p.strip_prefix(&format!("{key}=")))
                .unwrap_or("")
                .to_string()
        };
        let sizes: Vec<String> = match &v.tile {
            super::Tile::Sizes(s) => s.iter().map(|x| x.to_string()).collect(),
            _ => Vec::new(),
        };
        self.genes
            .iter()
            .map(|g| {
                let want = if g.key == "tile" {
                    match &v.tile {
                        super::Tile::Auto => "auto".to_string(),
                        super::Tile::Off => "off".to_string(),
                        super::Tile::Sizes(_) => "sizes".to_string(),
                    }
                } else if let Some(d) = g.key.strip_prefix("tile") {
                    let d: usize = d.parse().unwrap_or(0);
                    sizes
                        .get(d)
                        .or(sizes.last())
                        .cloned()
                        .unwrap_or_else(|| "32".into())
                } else {
                    value_of(&g.key)
                };
                g.values.iter().position(|x| *x == want).unwrap_or(0)
            })
            .collect()
    }

    /// Three-parent uniform crossover: each gene from one of the parents.
    pub fn crossover(&self, parents: [&Genome; 3], rng: &mut Rng) -> Genome {
        (0..self.genes.len())
            .map(|i| parents[rng.below(3)][i])
            .collect()
    }

    /// Each gene redrawn with probability `rate`.
    pub fn mutate(&self, genome: &mut Genome, rate: f64, rng: &mut Rng) {
        for (i, g) in self.genes.iter().enumerate() {
            if rng.unit() < rate {
                genome[i] = rng.below(g.values.len());
            }
        }
    }

    /// Number of distinct variants (saturating).
    pub fn size(&self) -> u64 {
        self.genes
            .iter()
            .fold(1u64, |n, g| n.saturating_mul(g.values.len() as u64))
    }
}

/// Whether `program` has a reduction chain that a rolling or split-k update
/// can fuse (by its `schedule` key or by [`crate::repair::repairable`]).
fn has_repairable_chain(program: &Program) -> bool {
    let isl = crate::isl::Isl::new();
    let Ok(scop) = crate::model::build(&isl, program) else {
        return false;
    };
    crate::repair::steps_for(&isl, program, &scop, crate::repair::Choice::Rolling).is_ok()
}

/// Whether `program` has a sum of f16 or bf16 products: a candidate for
/// tensor cores, whose reduction may be split (`ksplit`).
fn has_low_precision_sum(program: &Program) -> bool {
    use crate::frontend::ast::{AssignOp, DType, Reducer};
    let low = program
        .tensors
        .iter()
        .any(|t| matches!(t.dtype, DType::F16 | DType::BF16));
    low && program.statements.iter().any(|s| {
        matches!(
            s.op,
            AssignOp::Reduce {
                op: Reducer::Sum,
                ..
            }
        )
    })
}

fn gene(key: &str, values: &[&str]) -> Gene {
    Gene {
        key: key.into(),
        values: values.iter().map(|s| s.to_string()).collect(),
    }
}

/// Candidate tile sizes for a loop of extents `ext` (the extents this
/// band member has in the program's statements): powers of two up to the
/// largest extent (at most 256), and divisors of each extent from 8 up
/// that leave no partial tile.
pub fn tile_sizes(ext: &BTreeSet<i64>) -> Vec<i64> {
    let max = ext.iter().copied().max().unwrap_or(32).clamp(1, 256);
    let mut sizes = BTreeSet::new();
    let mut p = 1;
    while p <= max {
        sizes.insert(p);
        p *= 2;
    }
    for &e in ext {
        for d in 8..=e.min(256) {
            if e % d == 0 {
                sizes.insert(d);
            }
        }
    }
    sizes.into_iter().collect()
}

/// For each loop depth, the extents of the statements' index variables at
/// that depth (left-side indices, then reduction indices), where a tensor
/// shape gives them at the program's parameter values.
pub fn loop_extents(program: &Program) -> Vec<BTreeSet<i64>> {
    let mut out: Vec<BTreeSet<i64>> = Vec::new();
    for st in &program.statements {
        // index -> extent, from plain subscripts of the accesses
        let mut extent: HashMap<String, i64> = HashMap::new();
        let mut note = |tensor: &str, subs: &[crate::frontend::ast::Affine]| {
            let Some(t) = program.tensor(tensor) else {
                return;
            };
            let Some(shape) = &t.shape else { return };
            for (s, dim) in subs.iter().zip(shape) {
                if s.constant == 0 && s.terms.len() == 1 {
                    if let (Some((name, 1)), Some(v)) =
                        (s.terms.iter().next(), program.evaluate(dim))
                    {
                        extent.entry(name.clone()).or_insert(v);
                    }
                }
            }
        };
        let lhs: Vec<_> = st
            .lhs_indices
            .iter()
            .map(|i| crate::frontend::ast::Affine::var(i))
            .collect();
        note(&st.lhs_tensor, &lhs);
        visit_accesses(&st.rhs, &mut note);
        for (d, idx) in st.all_indices().iter().enumerate() {
            if out.len() <= d {
                out.push(BTreeSet::new());
            }
            if let Some(v) = extent.get(idx) {
                out[d].insert(*v);
            }
        }
    }
    for set in &mut out {
        if set.is_empty() {
            set.insert(32);
        }
    }
    out
}

fn visit_accesses(
    e: &crate::frontend::ast::Expr,
    f: &mut impl FnMut(&str, &[crate::frontend::ast::Affine]),
) {
    match &e.kind {
        ExprKind::Access { tensor, subscripts } => f(tensor, subscripts),
        ExprKind::Unary(_, a) | ExprKind::Cast(_, a) => visit_accesses(a, f),
        ExprKind::Binary(_, a, b) => {
            visit_accesses(a, f);
            visit_accesses(b, f);
        }
        ExprKind::Select(c, a, b) => {
            visit_accesses(c, f);
            visit_accesses(a, f);
            visit_accesses(b, f);
        }
        ExprKind::Call(_, args) => args.iter().for_each(|a| visit_accesses(a, f)),
        _ => {}
    }
}

/// Which search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    Genetic,
    Random,
}

/// The settings of one tuning run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub search: Search,
    pub seed: u64,
    /// Wall-clock budget, the check's reference included: no generation
    /// starts and no candidate is measured after it (the default, measured
    /// first, always is); the candidate being measured when it runs out
    /// finishes.
    pub budget: Duration,
    /// At most this many candidates measured (None: only the budget).
    pub max_candidates: Option<usize>,
    /// Candidates per generation (genetic) or per batch (random).
    pub population: usize,
    /// Best candidates kept unchanged into the next generation.
    pub elites: usize,
    /// Probability of redrawing each gene of a child.
    pub mutation: f64,
    /// Where candidates are measured: one entry per device (several CUDA
    /// devices measure a generation's candidates in parallel, candidate i
    /// on device i mod n).
    pub targets: Vec<MeasureTarget>,
    /// Timed runs per candidate.
    pub runs: usize,
    /// Compile threads.
    pub jobs: usize,
    /// The program at smaller sizes to check every candidate on (compiled
    /// with the same options), where the f64 reference at the tuned sizes
    /// would take too long on the CPU; the time is still measured at the
    /// tuned sizes. None: checked at the tuned sizes.
    pub check_program: Option<Program>,
}

/// One evaluated candidate.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Order of evaluation, from 0 (0 is the default).
    pub index: usize,
    pub generation: usize,
    pub variant: Variant,
    /// The median time, when the candidate compiled and its check passed.
    pub time_us: Option<f64>,
    /// Why it has no time.
    pub error: Option<String>,
}

/// What a tuning run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub candidates: Vec<Candidate>,
    /// Index into `candidates` of the default variant.
    pub default: usize,
    /// Index of the fastest checked candidate.
    pub best: Option<usize>,
    /// The compiled program of the best candidate.
    pub best_compiled: Option<Compiled>,
    pub device: Option<String>,
    pub space_size: u64,
    /// Seconds spent on the f64 reference before the search (GPU targets).
    pub reference_seconds: Option<f64>,
}

/// Called after every generation with the candidates so far and the best.
pub type Progress<'a> = dyn FnMut(&[Candidate], Option<usize>) + 'a;

/// Runs the search. Candidates of a generation are compiled in parallel
/// (`jobs` threads) and then measured, candidate i on target i mod
/// `targets.len()` (one thread per target). The default variant is always
/// the first candidate, so the best is never slower than the default as
/// measured in this run.
pub fn tune(
    program: &Program,
    settings: &Settings,
    progress: &mut Progress<'_>,
) -> Result<Outcome> {
    let Some(first_target) = settings.targets.first().copied() else {
        return Err(Error::Internal("tune without a target".into()));
    };
    let gpu = first_target.gpu();
    let space = Space::new(program, gpu);
    // On a GPU, the f64 reference of the check is computed once, on the
    // CPU, before the budget starts (it is the same for every schedule).
    let mut reference_seconds = None;
    let reference = if settings
        .targets
        .iter()
        .any(|t| matches!(t, MeasureTarget::Cuda(_)))
    {
        let t0 = Instant::now();
        let checked = settings.check_program.as_ref().unwrap_or(program);
        // Any schedule gives the same reference: one isl does not finish
        // is replaced by minimal fusion.
        let mut options = Variant::default().options(gpu);
        let c = compile_watched(checked, &mut options, Watch::from_env()?, |_| ())?;
        let r = crate::runtime::cpu::reference_outputs(&c, settings.seed)?;
        reference_seconds = Some(t0.elapsed().as_secs_f64());
        Some(r)
    } else {
        None
    };
    let mut eval = |fresh: &[Variant], deadline: Option<Instant>, best_us: Option<f64>| {
        evaluate(
            program,
            fresh,
            settings,
            gpu,
            reference.as_deref(),
            deadline,
            best_us,
        )
    };
    // The budget is wall-clock time for the whole tune, the reference
    // included.
    let settings = &Settings {
        budget: settings
            .budget
            .saturating_sub(Duration::from_secs_f64(reference_seconds.unwrap_or(0.0))),
        ..settings.clone()
    };
    let mut outcome = search(&space, settings, &mut eval, progress)?;
    outcome.reference_seconds = reference_seconds;
    Ok(outcome)
}

/// Measures a generation's new variants (None: skipped, the budget ran
/// out before it).
/// The third argument is the best time so far, if any (see
/// [`GIVE_UP_FACTOR`]).
pub type Evaluator<'a> =
    dyn FnMut(&[Variant], Option<Instant>, Option<f64>) -> Result<Vec<Option<Evaluated>>> + 'a;

/// A candidate whose first run takes this many times the best time so far
/// is not timed further (it cannot become the best, and a 4096^3 gemm with
/// a poor schedule takes seconds per run, which a five-minute budget cannot
/// afford 15 times per candidate); it counts as failed, with its one time.
pub const GIVE_UP_FACTOR: f64 = 10.0;

/// The search itself, over `space`, with candidates measured by `eval`
/// (see [`tune`]).
pub fn search(
    space: &Space,
    settings: &Settings,
    eval: &mut Evaluator<'_>,
    progress: &mut Progress<'_>,
) -> Result<Outcome> {
    let mut rng = Rng::new(settings.seed);
    let start = Instant::now();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut outcome = Outcome {
        candidates: Vec::new(),
        default: 0,
        best: None,
        best_compiled: None,
        device: None,
        space_size: space.size(),
        reference_seconds: None,
    };
    let population = settings.population.max(2);
    let limit = settings.max_candidates.unwrap_or(usize::MAX).max(1);
    // the current population: genomes with their fitness
    let mut current: Vec<(Genome, f64)> = Vec::new();
    let mut generation = 0;
    let mut stale = 0;
    loop {
        if outcome.candidates.len() >= limit
            || (generation > 0 && start.elapsed() >= settings.budget)
        {
            break;
        }
        // The genomes of this generation.
        let mut genomes: Vec<Genome> = Vec::new();
        if generation == 0 {
            genomes.push(space.encode(&Variant::default()));
        }
        // Random draws (the random search, and the genetic search's first
        // generation): variants not measured yet and not drawn twice (many
        // genomes decode to one variant), within a bound on the draws. The
        // genetic search's first generation starts with neighbours of the
        // default.
        if settings.search == Search::Random || current.is_empty() {
            let mut drawn: std::collections::HashSet<String> = genomes
                .iter()
                .map(|g| space.decode(g).canonical())
                .collect();
            // The default and a quarter of the population of neighbours:
            // with half, a 5-minute tune of fused softmax on the H100 stayed
            // near the default (1.02x) where uniform draws had found a
            // variant 1.11x faster.
            let neighbours = if settings.search == Search::Genetic && generation == 0 {
                1 + population / 4
            } else {
                0
            };
            let origin = space.encode(&Variant::default());
            let mut tries = 0;
            while genomes.len() < population && tries < 100 * population {
                tries += 1;
                let g = if genomes.len() < neighbours {
                    space.neighbour(&origin, 1 + rng.below(2), &mut rng)
                } else {
                    space.random(&mut rng)
                };
                let text = space.decode(&g).canonical();
                if !seen.contains_key(&text) && drawn.insert(text) {
                    genomes.push(g);
                }
            }
        } else {
            let mut ranked = current.clone();
            // stable: ties keep the earlier candidate first
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            for (g, _) in ranked.iter().take(settings.elites.min(population - 1)) {
                genomes.push(g.clone());
            }
            let total: f64 = ranked.iter().map(|(_, f)| *f).sum();
            let pick = |rng: &mut Rng| -> usize {
                if total <= 0.0 {
                    return rng.below(ranked.len());
                }
                let mut x = rng.unit() * total;
                for (i, (_, f)) in ranked.iter().enumerate() {
                    if x < *f {
                        return i;
                    }
                    x -= f;
                }
                ranked.len() - 1
            };
            while genomes.len() < population {
                let (a, b, c) = (pick(&mut rng), pick(&mut rng), pick(&mut rng));
                let mut child =
                    space.crossover([&ranked[a].0, &ranked[b].0, &ranked[c].0], &mut rng);
                space.mutate(&mut child, settings.mutation, &mut rng);
                genomes.push(child);
            }
        }
        // New variants of this generation, in order, within the limit.
        let mut fresh: Vec<Variant> = Vec::new();
        for g in &genomes {
            let v = space.decode(g);
            let text = v.canonical();
            if !seen.contains_key(&text)
                && !fresh.iter().any(|f| f.canonical() == text)
                && outcome.candidates.len() + fresh.len() < limit
            {
                fresh.push(v);
            }
        }
        if fresh.is_empty() {
            stale += 1;
            if stale > 20 || settings.search == Search::Random && stale > 3 {
                break; // the space (or its reachable part) is exhausted
            }
        } else {
            stale = 0;
        }
        // Candidates not measured when the budget runs out are dropped
        // (the default, the first candidate measured, always is: the
        // deadline is tested before each candidate).
        let deadline = Some(start + settings.budget);
        let best_us = outcome.best.and_then(|b| outcome.candidates[b].time_us);
        let results = eval(&fresh, deadline, best_us)?;
        for (v, result) in fresh.into_iter().zip(results) {
            let Some((result, device)) = result else {
                continue;
            };
            let index = outcome.candidates.len();
            seen.insert(v.canonical(), index);
            if let Some(d) = device {
                outcome.device.get_or_insert(d);
            }
            let (time_us, error, compiled) = match result {
                Ok((t, c)) => (Some(t), None, c),
                Err(e) => (None, Some(e), None),
            };
            if let Some(t) = time_us {
                let better = outcome
                    .best
                    .and_then(|b| outcome.candidates[b].time_us)
                    .is_none_or(|bt| t < bt);
                if better {
                    outcome.best = Some(index);
                    outcome.best_compiled = compiled;
                }
            }
            outcome.candidates.push(Candidate {
                index,
                generation,
                variant: v,
                time_us,
                error,
            });
        }
        // The population the next generation is bred from: this
        // generation's genomes with their fitness (repeats look theirs up).
        current = genomes
            .iter()
            .map(|g| {
                let text = space.decode(g).canonical();
                let fit = seen
                    .get(&text)
                    .and_then(|i| outcome.candidates[*i].time_us)
                    .map_or(0.0, |t| 1.0 / t.max(1e-3));
                (g.clone(), fit)
            })
            .collect();
        progress(&outcome.candidates, outcome.best);
        generation += 1;
    }
    Ok(outcome)
}

/// A measured candidate: its time and compiled program, or why it has no
/// time; and the device it ran on.
pub type Evaluated = (
    std::result::Result<(f64, Option<Compiled>), String>,
    Option<String>,
);

/// Compiles `variants` on `jobs` threads, then measures them, candidate i on
/// target i mod n (one thread per target).
fn evaluate(
    program: &Program,
    variants: &[Variant],
    settings: &Settings,
    gpu: bool,
    reference: Option<&crate::runtime::cuda::Reference>,
    deadline: Option<Instant>,
    best_us: Option<f64>,
) -> Result<Vec<Option<Evaluated>>> {
    let jobs = settings.jobs.max(1).min(variants.len().max(1));
    // A candidate isl's scheduler does not finish in the schedule timeout
    // (POLYFUSE_SCHEDULE_TIMEOUT, else 60 s) fails to compile.
    let limit = Watch::from_env()?.fallback;
    let compile = |p: &Program, options: &crate::Options| match compile_within(p, options, limit) {
        Ok(Some(c)) => Ok(c),
        Ok(None) => Err(unfinished(limit)),
        Err(e) => Err(e.to_string()),
    };
    type Both = std::result::Result<(Compiled, Option<Compiled>), String>;
    let mut compiled: Vec<Option<Both>> = (0..variants.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let chunks: Vec<_> = compiled
            .chunks_mut(variants.len().div_ceil(jobs).max(1))
            .enumerate()
            .map(|(c, slots)| {
                let per = variants.len().div_ceil(jobs).max(1);
                s.spawn(move || {
                    for (k, slot) in slots.iter_mut().enumerate() {
                        let v = &variants[c * per + k];
                        let options = v.options(gpu);
                        let both = compile(program, &options).and_then(|full| {
                            match &settings.check_program {
                                None => Ok((full, None)),
                                Some(p) => compile(p, &options)
                                    .map(|small| (full, Some(small)))
                                    .map_err(|e| format!("at the check sizes: {e}")),
                            }
                        });
                        *slot = Some(both);
                    }
                })
            })
            .collect();
        for h in chunks {
            let _ = h.join();
        }
    });
    let n = settings.targets.len().max(1);
    let mut out: Vec<Option<Evaluated>> = (0..variants.len()).map(|_| None).collect();
    let env_error: std::sync::Mutex<Option<Error>> = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (t, target) in settings.targets.iter().copied().enumerate() {
            let mine: Vec<(usize, &Both)> = compiled
                .iter()
                .enumerate()
                .filter(|(i, _)| i % n == t)
                .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
                .collect();
            let env_error = &env_error;
            handles.push(s.spawn(move || {
                let mut res = Vec::new();
                // The best time this thread knows of: the search's, then
                // its own (the default, measured first, sets it in the
                // first generation).
                let mut best = best_us;
                for (i, c) in mine {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                    let give_up = best.map(|b| b * GIVE_UP_FACTOR);
                    let r = match c {
                        Err(e) => (Err(format!("compile: {e}")), None),
                        Ok((c, small)) => {
                            match measure_candidate(
                                c,
                                small.as_ref(),
                                target,
                                settings,
                                reference,
                                give_up,
                            ) {
                                Ok((check, Some(t), device))
                                    if give_up.is_some_and(|g| t > g)
                                        && check.as_ref().is_none_or(|ch| ch.ok) =>
                                {
                                    let text = format!(
                                        "too slow: {t:.1} us (one run, or predicted from the check sizes), over {GIVE_UP_FACTOR}x the best {:.1} us",
                                        best.unwrap_or(0.0)
                                    );
                                    (Err(text), Some(device))
                                }
                                Ok((check, time, device)) => {
                                    if check.as_ref().is_some_and(|ch| ch.ok) {
                                        if let Some(t) = time {
                                            best = Some(best.map_or(t, |b| b.min(t)));
                                        }
                                    }
                                    let device = Some(device);
                                    match (&check, time) {
                                        (Some(ch), Some(t)) if ch.ok => {
                                            (Ok((t, Some(c.clone()))), device)
                                        }
                                        (Some(ch), _) if !ch.ok => (Err(ch.line()), device),
                                        _ => (Err("not measured".into()), device),
                                    }
                                }
                                Err(e @ Error::Environment(_)) => {
                                    let text = e.to_string();
                                    if let Ok(mut slot) = env_error.lock() {
                                        slot.get_or_insert(e);
                                    }
                                    (Err(text), None)
                                }
                                Err(e) => (Err(e.to_string()), None),
                            }
                        }
                    };
                    res.push((i, r));
                }
                res
            }));
        }
        for (t, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(res) => {
                    for (i, r) in res {
                        out[i] = Some(r);
                    }
                }
                Err(_) => {
                    for (i, slot) in out.iter_mut().enumerate() {
                        if i % n == t {
                            *slot = Some((Err("the measuring thread failed".into()), None));
                        }
                    }
                }
            }
        }
    });
    if let Some(e) = env_error.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(out)
}

/// Checks and times one candidate: checked and timed in one run, or, with
/// a `small` program at the check sizes, checked there first and then timed
/// at the tuned sizes without a check. Returns the check, the median time
/// and the device.
fn measure_candidate(
    full: &Compiled,
    small: Option<&Compiled>,
    target: MeasureTarget,
    settings: &Settings,
    reference: Option<&crate::runtime::cuda::Reference>,
    give_up_after_us: Option<f64>,
) -> Result<(
    Option<crate::runtime::data::CheckResult>,
    Option<f64>,
    String,
)> {
    let Some(small) = small else {
        let r = measure_with(
            full,
            target,
            settings.runs,
            settings.seed,
            true,
            reference,
            give_up_after_us,
        )?;
        return Ok((r.check, r.median_us, r.device));
    };
    // Timed once at the check sizes when there is a limit: scaled by the
    // work (flops, else bytes) it predicts the time at the tuned sizes; a
    // prediction over the limit spares a run that can take seconds (an
    // untiled 4096^3 gemm took 6 to 54 s per run on the H100). Small sizes
    // underuse the GPU, so the prediction errs on the slow side: a
    // candidate it drops is slower than the limit or near it.
    let runs = usize::from(give_up_after_us.is_some());
    let checked = measure_with(small, target, runs, settings.seed, true, reference, None)?;
    if !checked.check.as_ref().is_some_and(|c| c.ok) {
        return Ok((checked.check, None, checked.device));
    }
    if let (Some(limit), Some(t)) = (give_up_after_us, checked.median_us) {
        let full_work = crate::runtime::work::measure(full)?;
        let ratio = |f: u64, s: u64| (s > 0).then(|| f as f64 / s as f64);
        let scale = ratio(full_work.flops, checked.work.flops)
            .or_else(|| ratio(full_work.bytes, checked.work.bytes));
        if let Some(predicted) = scale.map(|k| t * k).filter(|p| *p > limit) {
            return Ok((checked.check, Some(predicted), checked.device));
        }
    }
    let timed = measure_with(
        full,
        target,
        settings.runs,
        settings.seed,
        false,
        None,
        give_up_after_us,
    )?;
    Ok((checked.check, timed.median_us, timed.device))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm() -> Program {
        crate::frontend::load_str(
            r#"{"name": "gemm", "params": {"M": 96, "N": 64, "K": 48},
            "inputs": {"A": {"dtype": "f32", "shape": ["M", "K"]}, "B": {"dtype": "f32", "shape": ["K", "N"]}},
            "outputs": {"C": {"dtype": "f32", "shape": ["M", "N"]}},
            "body": ["C(i, j) +=! A(i, k) * B(k, j)"]}"#,
            "<test>",
        )
        .unwrap()
    }

    #[test]
    fn tile_sizes_are_powers_of_two_and_divisors() {
        let e = loop_extents(&gemm());
        assert_eq!(e.len(), 3);
        assert_eq!(e[0], BTreeSet::from([96]));
        assert_eq!(e[2], BTreeSet::from([48]));
        let s = tile_sizes(&e[0]);
        for x in [1, 2, 4, 8, 16, 32, 64, 12, 24, 48, 96] {
            assert!(s.contains(&x), "{x} in {s:?}");
        }
        assert!(!s.contains(&128) && !s.contains(&10));
    }

    #[test]
    fn genomes_decode_to_valid_variants_and_back() {
        for gpu in [false, true] {
            let space = Space::new(&gemm(), gpu);
            let def = space.encode(&Variant::default());
            assert_eq!(space.decode(&def), Variant::default());
            let mut rng = Rng::new(3);
            for _ in 0..200 {
                let g = space.random(&mut rng);
                let v = space.decode(&g);
                assert_eq!(Variant::parse(&v.canonical()).unwrap(), v);
                assert_eq!(space.decode(&space.encode(&v)), v);
            }
        }
    }

    #[test]
    fn operators_are_deterministic_under_a_seed() {
        let space = Space::new(&gemm(), true);
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let a = space.random(&mut rng);
            let b = space.random(&mut rng);
            let c = space.random(&mut rng);
            let mut child = space.crossover([&a, &b, &c], &mut rng);
            space.mutate(&mut child, 0.2, &mut rng);
            (a, b, c, child)
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // uniform crossover takes every gene from one of the parents
        let (a, b, c, _) = run(7);
        let mut rng = Rng::new(1);
        let child = space.crossover([&a, &b, &c], &mut rng);
        for i in 0..child.len() {
            assert!(child[i] == a[i] || child[i] == b[i] || child[i] == c[i]);
        }
    }

    /// A deterministic stand-in for measuring: `sink=off` is 20 us faster,
    /// plus up to 10 us of noise from a hash of the variant's text; fails
    /// for `strategy=max`.
    fn synthetic(
        fresh: &[Variant],
        _: Option<Instant>,
        _: Option<f64>,
    ) -> Result<Vec<Option<Evaluated>>> {
        Ok(fresh
            .iter()
            .map(|v| {
                if v.strategy == crate::schedule::Strategy::Max {
                    return Some((Err("check: FAILED".into()), None));
                }
                let h =
                    u64::from_str_radix(&super::super::canon::hash_hex(&v.canonical())[..8], 16)
                        .unwrap();
                let t = 100.0 + (h % 1000) as f64 / 100.0 - if v.sink { 0.0 } else { 20.0 };
                Some((Ok((t, None)), Some("synthetic".into())))
            })
            .collect())
    }

    fn settings(search: Search, seed: u64) -> Settings {
        Settings {
            search,
            seed,
            budget: Duration::from_secs(3600),
            max_candidates: Some(60),
            population: 8,
            elites: 2,
            mutation: 0.1,
            targets: vec![MeasureTarget::Cpu],
            runs: 1,
            jobs: 1,
            check_program: None,
        }
    }

    fn run(search: Search, seed: u64) -> Outcome {
        let space = Space::new(&gemm(), true);
        super::search(
            &space,
            &settings(search, seed),
            &mut synthetic,
            &mut |_, _| {},
        )
        .unwrap()
    }

    fn texts(o: &Outcome) -> Vec<String> {
        o.candidates.iter().map(|c| c.variant.canonical()).collect()
    }

    #[test]
    fn the_whole_search_is_deterministic_for_the_same_times() {
        for search in [Search::Genetic, Search::Random] {
            let a = run(search, 5);
            assert_eq!(a.candidates.len(), 60);
            assert!(a.candidates.iter().map(|c| c.generation).max().unwrap() >= 5);
            assert_eq!(texts(&a), texts(&run(search, 5)));
            assert_ne!(texts(&a), texts(&run(search, 6)));
            assert_eq!(a.candidates[0].variant, Variant::default());
            // no candidate twice; the best is the fastest checked one
            let unique: std::collections::HashSet<_> = texts(&a).into_iter().collect();
            assert_eq!(unique.len(), 60);
            let best = a.best.unwrap();
            let fastest = a
                .candidates
                .iter()
                .filter_map(|c| c.time_us)
                .fold(f64::INFINITY, f64::min);
            assert_eq!(a.candidates[best].time_us, Some(fastest));
            // failed candidates have no time and a reason
            for c in &a.candidates {
                assert_eq!(c.time_us.is_none(), c.error.is_some());
            }
        }
    }

    #[test]
    fn the_genetic_search_breeds_from_the_fast() {
        // The synthetic time favours sink=off by 20 us; after a few
        // generations most of the genetic search's children carry it, more
        // than the random search's.
        let share = |o: &Outcome| {
            let late: Vec<_> = o.candidates.iter().filter(|c| c.generation >= 4).collect();
            late.iter().filter(|c| !c.variant.sink).count() as f64 / late.len().max(1) as f64
        };
        let (mut g, mut r) = (0.0, 0.0);
        for seed in 0..6 {
            g += share(&run(Search::Genetic, seed));
            r += share(&run(Search::Random, seed));
        }
        assert!(g > r, "genetic {g} vs random {r}");
    }

    #[test]
    fn the_first_generation_searches_near_the_default() {
        let o = run(Search::Genetic, 2);
        let def = Variant::default().canonical();
        let distance = |v: &Variant| {
            v.canonical()
                .split(',')
                .zip(def.split(','))
                .filter(|(a, b)| a != b)
                .count()
        };
        let first: Vec<&Candidate> = o.candidates.iter().filter(|c| c.generation == 0).collect();
        assert_eq!(first.len(), 8);
        let near = first
            .iter()
            .filter(|c| (1..=3).contains(&distance(&c.variant)))
            .count();
        // population 8: the default, 2 neighbours (a tile-mode change may
        // also change the tile text: distance up to 3), 5 uniform draws
        assert!(near >= 2, "{near} neighbours in {:?}", texts(&o));
        // the random search stays uniform: its draws are rarely that close
        let r = run(Search::Random, 2);
        let near_r = r.candidates[1..8]
            .iter()
            .filter(|c| (1..=2).contains(&distance(&c.variant)))
            .count();
        assert!(near_r < near, "random {near_r} vs genetic {near}");
    }

    #[test]
    fn neighbours_change_the_genes_asked_for() {
        let space = Space::new(&gemm(), true);
        let origin = space.encode(&Variant::default());
        let mut rng = Rng::new(9);
        for changes in [1, 2] {
            for _ in 0..50 {
                let n = space.neighbour(&origin, changes, &mut rng);
                let differ = n.iter().zip(&origin).filter(|(a, b)| a != b).count();
                assert_eq!(differ, changes);
            }
        }
    }

    #[test]
    fn programs_with_a_repairable_chain_search_the_repair() {
        let keys = |p: &Program| -> Vec<String> {
            Space::new(p, true)
                .genes
                .iter()
                .map(|g| g.key.clone())
                .collect()
        };
        assert!(!keys(&gemm()).contains(&"repair".to_string()));
        // a softmax written plainly (no `schedule` key): its sum depends on
        // its maximum over the same loop
        let softmax = crate::frontend::load_str(
            r#"{"name": "softmax", "params": {"M": 4, "N": 40},
            "inputs": {"X": {"dtype": "f32", "shape": ["M", "N"]}},
            "outputs": {"Y": {"dtype": "f32", "shape": ["M", "N"]}},
            "body": ["Mx(i) max=! X(i, j)", "S(i) +=! exp(X(i, j) - Mx(i))",
                     "Y(i, j) = exp(X(i, j) - Mx(i)) / S(i)"]}"#,
            "<test>",
        )
        .unwrap();
        let space = Space::new(&softmax, true);
        let k = keys(&softmax);
        assert!(k.contains(&"repair".to_string()) && k.contains(&"split".to_string()));
        // every repair choice decodes, with the factor only for split-k
        let mut seen = std::collections::HashSet::new();
        let mut rng = Rng::new(4);
        for _ in 0..400 {
            let v = space.decode(&space.random(&mut rng));
            assert_eq!(space.decode(&space.encode(&v)), v);
            seen.insert(v.repair);
        }
        for c in [
            crate::repair::Choice::Program,
            crate::repair::Choice::Off,
            crate::repair::Choice::Rolling,
            crate::repair::Choice::SplitK(4),
            crate::repair::Choice::SplitK(64),
        ] {
            assert!(seen.contains(&c), "{c:?} never drawn");
        }
        assert!(!seen.contains(&crate::repair::Choice::SplitK(16 + 1)));
    }
}
