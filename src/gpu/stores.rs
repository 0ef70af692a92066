//! How a tensor-core contraction's results leave the registers.
//!
//! Each thread owns its accumulators in the tensor cores' fragment layout:
//! for every 8 columns of the tile, two neighbours in each of two rows
//! eight apart. Stored from there, one instruction of a warp writes 4 or 8
//! bytes in each of 8 rows, eight lines of memory for 128 bytes of data,
//! and a 128 x 256 tile takes 1,024 such instructions. On one H200 (f16
//! 4096^3, `bench/experiments/tma`), a hand-written kernel spent 25 us of
//! its 198 us in those stores, and the same kernel with its tile staged
//! through shared memory and copied out a row at a time in 16-byte pieces
//! ran in 191.6 us instead of 203.8 (2000^3: 27.6 us instead of 32.5).
//!
//! Staging needs shared memory for the whole tile, which the pipeline's
//! stages provide once the main loop is over (every product done, no copy
//! in flight): the tile is staged only where it fits in the kernel's
//! shared memory as it is, so the launch and the occupancy do not change.
//! A split reduction's blocks share their partial tiles through the same
//! memory and own scattered accumulators: they store as before.
//!
//! A block of one warpgroup (128 threads) stores as before too: at f16
//! 1000^3 its 64 x 128 tiles ran in 13.8 us staged against 13.1 us with
//! pairs (H200, `bench/experiments/stores`), where every block of two
//! warpgroups gained (f16 4096^3: 193 us against 206; 2000^3: 28.9
//! against 31.0; the fused MLP's products, 175 against 200).

use super::contraction::Contraction;
use crate::frontend::ast::DType;

/// The bytes one piece of the copy-out moves: a 16-byte vector access.
pub const PIECE_BYTES: i64 = 16;

/// The path of a contraction's stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stores {
    /// Each thread stores its own accumulators, two neighbours along `n`
    /// at a time where the output allows (`codegen::mma::epilogue`).
    #[default]
    Pairs,
    /// Through shared memory: each thread writes its epilogue's values
    /// into the block's tile (`pitch` elements a row, from the start of
    /// the dynamic shared memory), and after a barrier the block copies
    /// the tile out a row at a time, `PIECE_BYTES` a thread.
    Staged {
        /// Elements of a staged row: the tile's `n` and one piece of
        /// padding, so that row `j` starts 16 bytes further along the
        /// banks than row `j - 1` and a warp's fragment writes (8 rows, 4
        /// lanes) meet every bank equally often.
        pitch: i64,
        /// Elements of one piece (`PIECE_BYTES` over the element's size).
        piece: i64,
    },
}

impl Stores {
    /// Bytes of shared memory the staged tile takes (0 for pairs).
    pub fn staged_bytes(&self, tile_m: i64, element_bytes: i64) -> i64 {
        match self {
            Stores::Pairs => 0,
            Stores::Staged { pitch, .. } => tile_m * pitch * element_bytes,
        }
    }
}

/// The threads of the smallest block whose tile is staged.
pub const STAGED_MIN_THREADS: u32 = 256;

/// The stores of `c`, whose stored tensor has elements of `stored`: staged
/// where the tile fits in the stages' shared memory, the elements are 2
/// or 4 bytes (a piece is then 8 or 4 of them), the tile's rows are whole
/// pieces, the block has at least `STAGED_MIN_THREADS` threads and the
/// reduction is not split; pairs otherwise.
pub fn choose(c: &Contraction, stored: DType) -> Stores {
    if !matches!(stored, DType::F16 | DType::BF16 | DType::F32) {
        return Stores::Pairs;
    }
    let size = stored.size() as i64;
    let piece = PIECE_BYTES / size;
    let [tm, tn, _] = c.tile;
    if c.split > 1 || tn % piece != 0 || c.threads() < STAGED_MIN_THREADS {
        return Stores::Pairs;
    }
    let staged = Stores::Staged {
        pitch: tn + piece,
        piece,
    };
    let stages = (c.stages as usize * c.stage_bytes()) as i64;
    if staged.staged_bytes(tm, size) <= stages {
        staged
    } else {
        Stores::Pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::Analysed;
    use crate::gpu::GpuOptions;

    /// The contraction of an f16 product into an f16 `C` (M x N) at
    /// 2000 x 2000 x 4000 under the automatic tiles (two warpgroups), its
    /// reduction unsplit, with the staged stores on or off.
    fn gemm(staged_stores: bool) -> Contraction {
        let json = r#"{"name": "mm", "params": {"M": 2000, "N": 2000, "K": 4000},
            "inputs": {"A": {"dtype": "f16", "shape": ["M", "K"]},
                       "B": {"dtype": "f16", "shape": ["K", "N"]}},
            "outputs": {"C": {"dtype": "f16", "shape": ["M", "N"]}},
            "body": ["C(i, j) +=! A(i, k) * B(k, j)"]}"#;
        let options = GpuOptions {
            auto_tile: true,
            k_split: Some(1),
            staged_stores,
            ..GpuOptions::default()
        };
        Analysed::new(json)
            .plans(&[32], &options)
            .into_iter()
            .find_map(|p| p.contraction().cloned())
            .expect("a contraction on tensor cores")
    }

    #[test]
    fn the_mapping_stages_a_wgmma_tile_with_one_piece_of_padding() {
        let c = gemm(true);
        assert!(c.wgmma, "{:?}", c.tile);
        let tn = c.tile[1];
        assert_eq!(
            c.stores,
            Stores::Staged {
                pitch: tn + 8,
                piece: 8
            }
        );
        // The tile fits in the stages: the launch's shared memory is the
        // stages' alone.
        let staged = c.stores.staged_bytes(c.tile[0], 2) as usize;
        assert!(staged <= c.shared_bytes(), "{staged} {}", c.shared_bytes());
        assert_eq!(gemm(false).stores, Stores::Pairs);
        // An f32 output: pieces of 4.
        assert_eq!(
            choose(&c, DType::F32),
            Stores::Staged {
                pitch: tn + 4,
                piece: 4
            }
        );
    }

    #[test]
    fn split_reductions_small_blocks_and_other_types_store_pairs() {
        let mut c = gemm(true);
        assert_eq!(choose(&c, DType::F64), Stores::Pairs);
        assert_eq!(choose(&c, DType::I32), Stores::Pairs);
        let mut one_warpgroup = c.clone();
        one_warpgroup.tile[0] = 64;
        one_warpgroup.warps = [1, 4];
        assert_eq!(one_warpgroup.threads(), 128);
        assert_eq!(choose(&one_warpgroup, DType::F16), Stores::Pairs);
        c.split = 2;
        assert_eq!(choose(&c, DType::F16), Stores::Pairs);
    }

    #[test]
    fn a_tile_larger_than_its_stages_stores_pairs() {
        // Two stages: less shared memory than an f32 tile needs, more
        // than an f16 one.
        let mut c = gemm(true);
        c.stages = 2;
        let [tm, tn, _] = c.tile;
        let stages = 2 * c.stage_bytes() as i64;
        assert!(stages < tm * (tn + 4) * 4, "{stages}");
        assert_eq!(choose(&c, DType::F32), Stores::Pairs);
        assert!(stages >= tm * (tn + 8) * 2, "{stages}");
        assert!(matches!(choose(&c, DType::F16), Stores::Staged { .. }));
    }

    #[test]
    fn staged_bytes_count_the_padded_rows() {
        let s = Stores::Staged {
            pitch: 264,
            piece: 8,
        };
        assert_eq!(s.staged_bytes(128, 2), 128 * 264 * 2);
        assert_eq!(Stores::Pairs.staged_bytes(128, 2), 0);
    }
}
