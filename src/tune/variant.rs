//! One point of the option space: every choice `compare` shows side by side
//! and `tune` searches over, with one text form
//! (`strategy=min,tile=64x64,block=32x8`) used on the command line, in
//! variant files, in the cache and in reports.

use std::fmt;

use crate::error::{Error, Result};
use crate::gpu::GpuOptions;
use crate::pipeline::Options;
use crate::repair::{Choice, AUTO_SPLIT};
use crate::schedule::Strategy;

/// The tile sizes of a variant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tile {
    /// The default: 32 on the CPU; on the GPU chosen per kernel by the
    /// mapping (`GpuOptions::auto_tile`).
    Auto,
    /// No tiling.
    Off,
    /// These sizes for the members of each permutable band (the last one
    /// repeats).
    Sizes(Vec<i64>),
}

/// A set of compilation options in the form `compare` and `tune` handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub strategy: Strategy,
    pub tile: Tile,
    /// TC's imperfectly nested tiling (point loops sunk below tile loops).
    pub sink: bool,
    /// GPU threads per block (x, y, z); empty: from the tile sizes.
    pub block: Vec<u32>,
    /// GPU upper bounds on blocks (x, y, z); empty: one block per tile.
    pub grid: Vec<u32>,
    /// GPU: promotion to shared memory.
    pub shared: bool,
    /// GPU: accumulators in registers across the sequential loops (the
    /// register tiles of the mapping).
    pub registers: bool,
    /// GPU: warp-shuffle reductions.
    pub reduce: bool,
    /// GPU: register tiles in groups of this many points per thread, with
    /// shared tiles laid out for vector loads (`GpuOptions::vector`).
    pub vector: u32,
    /// GPU: unrolled step loops of register tiles (`GpuOptions::unroll`);
    /// `None`: the mapping's choice.
    pub unroll: Option<bool>,
    /// GPU: double-buffered shared tiles (`GpuOptions::pipeline`); `None`:
    /// the mapping's choice.
    pub pipeline: Option<bool>,
    /// GPU: blocks a contraction's reduction is split over
    /// (`GpuOptions::k_split`); `None`: polyfuse's choice.
    pub k_split: Option<u32>,
    /// The algebraic repair (rolling or split-k update, with its split
    /// factor), or the program's own.
    pub repair: Choice,
}

impl Default for Variant {
    /// What the command line does without options.
    fn default() -> Self {
        let gpu = GpuOptions::default();
        Variant {
            strategy: Strategy::Isl,
            tile: Tile::Auto,
            sink: true,
            block: Vec::new(),
            grid: Vec::new(),
            shared: gpu.shared,
            registers: gpu.registers,
            reduce: gpu.reduce,
            vector: gpu.vector,
            unroll: gpu.unroll,
            pipeline: gpu.pipeline,
            k_split: gpu.k_split,
            repair: Choice::Program,
        }
    }
}

/// The keys of the text form, in canonical order.
pub const KEYS: &[&str] = &[
    "strategy",
    "tile",
    "sink",
    "block",
    "grid",
    "shared",
    "registers",
    "reduce",
    "repair",
    "split",
    "vector",
    "unroll",
    "pipeline",
    "ksplit",
];

impl Variant {
    /// Parses `key=value` pairs separated by commas or spaces; keys not
    /// given keep their default. `default` alone is the default variant.
    pub fn parse(text: &str) -> std::result::Result<Variant, String> {
        let mut v = Variant::default();
        let mut repair_name: Option<String> = None;
        let mut split: Option<i64> = None;
        let text = text.trim();
        if text.is_empty() || text == "default" {
            return Ok(v);
        }
        for pair in text.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not KEY=VALUE (keys: {})", KEYS.join(", ")))?;
            let value = value.trim();
            match key.trim() {
                "strategy" => {
                    v.strategy = Strategy::parse(value).ok_or_else(|| {
                        format!("unknown strategy `{value}` (isl, min, max, canonical)")
                    })?
                }
                "tile" => {
                    v.tile = match value {
                        "auto" | "default" => Tile::Auto,
                        "off" | "none" => Tile::Off,
                        _ => {
                            let sizes = parse_sizes::<i64>(value, "tile")?;
                            if sizes.is_empty() || sizes.iter().any(|s| *s < 1) {
                                return Err(format!(
                                    "tile `{value}`: sizes are integers of at least 1, e.g. 64x64x8"
                                ));
                            }
                            Tile::Sizes(sizes)
                        }
                    }
                }
                "sink" => v.sink = parse_flag(value, "sink")?,
                "block" => v.block = parse_dims(value, "block")?,
                "grid" => v.grid = parse_dims(value, "grid")?,
                "shared" => v.shared = parse_flag(value, "shared")?,
                "registers" => v.registers = parse_flag(value, "registers")?,
                "unroll" => v.unroll = parse_auto_flag(value, "unroll")?,
                "pipeline" => v.pipeline = parse_auto_flag(value, "pipeline")?,
                "ksplit" => {
                    v.k_split = match value {
                        "auto" | "default" => None,
                        _ => Some(value.parse::<u32>().map_err(|_| {
                            format!("ksplit `{value}`: auto, or the blocks of the split, 1 to 8")
                        })?),
                    }
                }
                "reduce" => v.reduce = parse_flag(value, "reduce")?,
                "vector" => {
                    v.vector = value
                        .parse::<u32>()
                        .map_err(|_| format!("vector `{value}`: the group width is 1, 2 or 4"))?
                }
                "repair" => {
                    repair_name = Some(value.to_string());
                }
                "split" => {
                    split = Some(value.parse::<i64>().map_err(|_| {
                        format!("split `{value}`: the factor is an integer of at least 2")
                    })?);
                }
                other => return Err(format!("unknown key `{other}` (keys: {})", KEYS.join(", "))),
            }
        }
        // The split factor belongs to split-k only: other choices ignore it,
        // so that one compilation has one canonical text.
        v.repair = Choice::from_parts(repair_name.as_deref(), split)?;
        let gpu = GpuOptions {
            block: v.block.clone(),
            grid: v.grid.clone(),
            vector: v.vector,
            k_split: v.k_split,
            ..Default::default()
        };
        gpu.validate()?;
        Ok(v)
    }

    /// The canonical text: every key, in [`KEYS`] order.
    pub fn canonical(&self) -> String {
        format!(
            "strategy={},tile={},sink={},block={},grid={},shared={},registers={},reduce={},repair={},split={},vector={},unroll={},pipeline={},ksplit={}",
            self.strategy.name(),
            self.tile_text(),
            on_off(self.sink),
            dims_text(&self.block),
            dims_text(&self.grid),
            on_off(self.shared),
            on_off(self.registers),
            on_off(self.reduce),
            self.repair.name(),
            match self.repair {
                Choice::SplitK(f) => f,
                _ => AUTO_SPLIT,
            },
            self.vector,
            auto_on_off(self.unroll),
            auto_on_off(self.pipeline),
            self.k_split
                .map_or_else(|| "auto".to_string(), |s| s.to_string()),
        )
    }

    /// The keys that differ from the default, or `default`.
    pub fn label(&self) -> String {
        let def = Variant::default().canonical();
        let mine = self.canonical();
        let diff: Vec<&str> = mine
            .split(',')
            .zip(def.split(','))
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a)
            .collect();
        if diff.is_empty() {
            "default".into()
        } else {
            diff.join(",")
        }
    }

    pub fn tile_text(&self) -> String {
        match &self.tile {
            Tile::Auto => "auto".into(),
            Tile::Off => "off".into(),
            Tile::Sizes(s) => s
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join("x"),
        }
    }

    /// The compilation options: with the GPU mapping when `gpu`.
    pub fn options(&self, gpu: bool) -> Options {
        let tile = match &self.tile {
            Tile::Auto => vec![32],
            Tile::Off => Vec::new(),
            Tile::Sizes(s) => s.clone(),
        };
        Options {
            strategy: self.strategy,
            tile,
            sink: self.sink,
            gpu: gpu.then(|| GpuOptions {
                block: self.block.clone(),
                grid: self.grid.clone(),
                shared: self.shared,
                registers: self.registers,
                reduce: self.reduce,
                vector: self.vector,
                unroll: self.unroll,
                pipeline: self.pipeline,
                k_split: self.k_split,
                auto_tile: self.tile == Tile::Auto,
                ..Default::default()
            }),
            repair: self.repair,
            cpu_kernel: true,
            dump: None,
        }
    }

    /// Reads a variant file: one variant per line; blank lines and lines
    /// starting with `#` are skipped. Errors name the file and the line.
    pub fn read_file(path: &std::path::Path) -> Result<Vec<Variant>> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Input {
            file: file.clone(),
            message: format!("cannot read the variants: {e}"),
        })?;
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            out.push(Variant::parse(line).map_err(|message| Error::Input {
                file: file.clone(),
                message: format!("line {}: {message}", n + 1),
            })?);
        }
        Ok(out)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// `auto` for the mapping's choice, else [`on_off`].
fn auto_on_off(b: Option<bool>) -> &'static str {
    b.map_or("auto", on_off)
}

/// `auto` (or `default`): the mapping's choice; else [`parse_flag`].
fn parse_auto_flag(value: &str, key: &str) -> std::result::Result<Option<bool>, String> {
    match value {
        "auto" | "default" => Ok(None),
        _ => parse_flag(value, key)
            .map(Some)
            .map_err(|_| format!("{key}={value}: the value is auto, on or off")),
    }
}

fn parse_flag(value: &str, key: &str) -> std::result::Result<bool, String> {
    match value {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{key}={value}: the value is on or off")),
    }
}

fn parse_sizes<T: std::str::FromStr>(
    value: &str,
    key: &str,
) -> std::result::Result<Vec<T>, String> {
    value
        .split(['x', ':'])
        .map(|s| {
            s.trim()
                .parse::<T>()
                .map_err(|_| format!("{key}={value}: `{s}` is not a size (write e.g. 32x8)"))
        })
        .collect()
}

fn parse_dims(value: &str, key: &str) -> std::result::Result<Vec<u32>, String> {
    if value == "auto" || value == "default" {
        return Ok(Vec::new());
    }
    let dims = parse_sizes::<u32>(value, key)?;
    crate::gpu::check_sizes(&dims, key)?;
    Ok(dims)
}

fn dims_text(d: &[u32]) -> String {
    if d.is_empty() {
        "auto".into()
    } else {
        d.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("x")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        let v = Variant::parse("strategy=min, tile=64x64x8 block=32x8 shared=off").unwrap();
        assert_eq!(v.strategy, Strategy::Min);
        assert_eq!(v.tile, Tile::Sizes(vec![64, 64, 8]));
        assert_eq!(v.block, vec![32, 8]);
        assert!(!v.shared);
        assert_eq!(Variant::parse(&v.canonical()).unwrap(), v);
        assert_eq!(v.label(), "strategy=min,tile=64x64x8,block=32x8,shared=off");
        assert_eq!(Variant::default().label(), "default");
        assert_eq!(Variant::parse("default").unwrap(), Variant::default());
    }

    #[test]
    fn bad_text_is_refused() {
        for bad in [
            "strategy=fast",
            "tile=0",
            "tile=ax2",
            "block=2048",
            "block=1x1x1x1",
            "shared=maybe",
            "colour=red",
            "tile",
            "split=1",
            "split=x",
            "repair=sometimes",
        ] {
            assert!(Variant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_repair_and_its_split_factor_have_one_text_per_compilation() {
        let v = Variant::parse("repair=split-k,split=32").unwrap();
        assert_eq!(v.repair, Choice::SplitK(32));
        assert_eq!(v.options(true).repair, Choice::SplitK(32));
        assert_eq!(Variant::parse(&v.canonical()).unwrap(), v);
        assert_eq!(v.label(), "repair=split-k,split=32");
        // a factor alone asks for split-k, the default factor too
        assert_eq!(Variant::parse("split=8").unwrap().repair, Choice::SplitK(8));
        assert_eq!(
            Variant::parse("split=16").unwrap().repair,
            Choice::SplitK(16)
        );
        // other choices ignore the factor: one canonical text each
        let r = Variant::parse("repair=rolling,split=64").unwrap();
        assert_eq!(r.repair, Choice::Rolling);
        assert_eq!(
            r.canonical(),
            Variant::parse("repair=rolling").unwrap().canonical()
        );
        assert_eq!(Variant::parse("repair=off").unwrap().repair, Choice::Off);
        assert_eq!(Variant::default().repair, Choice::Program);
        assert!(Variant::default()
            .canonical()
            .ends_with("repair=program,split=16,vector=1,unroll=auto,pipeline=auto,ksplit=auto"));
    }

    #[test]
    fn the_split_of_a_contractions_reduction_is_a_key() {
        let v = Variant::parse("ksplit=4").unwrap();
        assert_eq!(v.k_split, Some(4));
        assert_eq!(v.options(true).gpu.unwrap().k_split, Some(4));
        assert_eq!(v.label(), "ksplit=4");
        assert_eq!(Variant::parse(&v.canonical()).unwrap(), v);
        assert_eq!(Variant::parse("ksplit=auto").unwrap(), Variant::default());
        for bad in ["ksplit=0", "ksplit=9", "ksplit=x"] {
            assert!(Variant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_register_group_width_is_a_key() {
        let v = Variant::parse("vector=4,unroll=on,pipeline=on").unwrap();
        assert_eq!(v.vector, 4);
        assert_eq!((v.unroll, Variant::default().unroll), (Some(true), None));
        assert_eq!(
            (v.pipeline, Variant::default().pipeline),
            (Some(true), None)
        );
        let gpu = v.options(true).gpu.unwrap();
        assert_eq!(
            (gpu.vector, gpu.unroll, gpu.pipeline),
            (4, Some(true), Some(true))
        );
        // Off is a choice of its own, auto the mapping's.
        let off = Variant::parse("unroll=off,pipeline=off").unwrap();
        assert_eq!((off.unroll, off.pipeline), (Some(false), Some(false)));
        assert_eq!(Variant::parse(&off.canonical()).unwrap(), off);
        assert_eq!(
            Variant::parse("unroll=auto,pipeline=auto").unwrap(),
            Variant::default()
        );
        assert!(Variant::parse("unroll=maybe").is_err());
        assert_eq!(v.label(), "vector=4,unroll=on,pipeline=on");
        assert_eq!(Variant::parse(&v.canonical()).unwrap(), v);
        assert_eq!(Variant::default().vector, 1);
        for bad in ["vector=3", "vector=8", "vector=x", "vector=0"] {
            assert!(Variant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn options_follow_the_command_line_defaults() {
        let o = Variant::default().options(false);
        assert_eq!(o.tile, vec![32]);
        assert!(o.gpu.is_none());
        let g = Variant::default().options(true).gpu.unwrap();
        assert!(g.auto_tile);
        let o = Variant::parse("tile=off").unwrap().options(true);
        assert!(o.tile.is_empty());
        assert!(!o.gpu.unwrap().auto_tile);
    }
}
