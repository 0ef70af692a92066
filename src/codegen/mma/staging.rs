//! Shared-memory staging: the copy of one k tile of both operands into a
//! stage of their shared buffers, `cp.async` on the GPU and `memcpy` in
//! the emulation.
//!
//! Thread `tid` copies chunks `tid + j * threads` (8 elements, 16 bytes,
//! along the contiguous dimension). What does not change from one k tile
//! to the next is set up once ([`Engine::setup_chunks`], before the
//! pipeline on the GPU; in the emulation inside each copy, per emulated
//! thread): the chunk's place in the stage, its source at k = its k
//! offset, the distance between two k (`&X[.., k + 1] - &X[.., k]`), the
//! count along the rows, and the alignment (a k tile moves the source by a
//! multiple of 16 bytes).

use super::engine::Engine;
use super::uniform_lines;
use super::writer::Lines;
use crate::gpu::contraction::{narrow, Operand, SharedTile};

/// One operand's tile as the copies see it.
pub(super) struct Staged<'e> {
    /// `A` or `B`: the chunks' variables are `pf_A0_...`, `pf_B1_...`.
    name: &'static str,
    x: &'e Operand,
    /// The tile's rows (`m` for A, `n` for B).
    rows: i64,
    buf: &'e str,
    /// Elements of a stage.
    len: i64,
    /// `&t_X[...]` at iteration values `(row, k)`.
    address: &'e dyn Fn(&str, &str) -> String,
    /// The domain's extent along the rows and the block's origin there.
    ext: &'static str,
    origin: &'static str,
    /// Chunks of a line, of the tile, and of a thread (at most).
    per_line: i64,
    chunks: i64,
    per_thread: i64,
    /// See [`uniform_lines`]: the lines between a thread's chunks where
    /// they lie in one column.
    uniform: Option<i64>,
    /// Elements from one line of the staged layout to the next.
    line_len: i64,
}

impl Engine<'_, '_> {
    /// A and B, as the copies see them.
    pub(super) fn staged(&self) -> [Staged<'_>; 2] {
        let c = self.c;
        let r = self.region;
        // The operands of the reduction loop being printed (a further
        // sum's operands have the first's layouts: `gpu::contraction`).
        let (a, b, a_address, b_address) = match self.term {
            0 => (&c.a, &c.b, r.a_address, r.b_address),
            j => (
                &c.terms[j - 1].a,
                &c.terms[j - 1].b,
                r.terms[j - 1].a_address,
                r.terms[j - 1].b_address,
            ),
        };
        let operand = |name, x, rows, buf, tile: SharedTile, address, ext, origin| {
            let per_line = tile.chunks_per_line;
            let chunks = tile.lines * per_line;
            let threads = i64::from(self.threads);
            Staged {
                name,
                x,
                rows,
                buf,
                len: tile.stage_len,
                address,
                ext,
                origin,
                per_line,
                chunks,
                per_thread: (chunks + threads - 1) / threads,
                uniform: uniform_lines(c.wgmma, self.wg, per_line, self.threads),
                line_len: tile.line_len,
            }
        };
        [
            operand(
                "A",
                a,
                self.tm,
                &self.ba,
                self.tiles.a,
                a_address,
                "pf_em",
                "pf_m0",
            ),
            operand(
                "B",
                b,
                self.tn,
                &self.bb,
                self.tiles.b,
                b_address,
                "pf_en",
                "pf_n0",
            ),
        ]
    }

    /// The per-thread values of every chunk the thread copies (of the
    /// first only, where the others follow from it by a constant), and
    /// (then) whether all of them are whole aligned copies inside the
    /// tensor, `pf_A_all` and `pf_B_all`.
    pub(super) fn setup_chunks(&self, o: &mut Lines, d: usize) {
        let threads = i64::from(self.threads);
        for s in self.staged() {
            let count = if s.uniform.is_some() { 1 } else { s.per_thread };
            for j in 0..count {
                self.setup_chunk(o, d, &s, j);
            }
            if let Some(step) = s.uniform {
                // Whether every chunk of this thread is one whole 16-byte
                // copy in a k tile that is inside: the copy's fast path
                // then needs no test per chunk.
                let v = format!("pf_{}0", s.name);
                let last = (s.per_thread - 1) * step;
                let live = if s.chunks % threads == 0 {
                    "1".to_string()
                } else {
                    format!("pf_tid + {} < {}", (s.per_thread - 1) * threads, s.chunks)
                };
                let rows_in = if s.x.k_contiguous {
                    format!("{v}_row + {last} < {}", s.ext)
                } else {
                    format!("{v}_rows == 8")
                };
                o.line(
                    d,
                    format!(
                        "const int pf_{}_all = ({live}) && {v}_aligned && ((pf_i)({step} * {v}_ls)) % 8 == 0 && {rows_in};",
                        s.name
                    ),
                );
            }
        }
    }

    /// Chunk `j` of operand `s`: its index, place in the stage (padded
    /// rows, or a swizzled line for `wgmma`), row, k, source, distance
    /// between two k (and two lines, where the others follow from it) and
    /// flags.
    fn setup_chunk(&self, o: &mut Lines, d: usize, s: &Staged, j: i64) {
        let (x, per_line, address) = (s.x, s.per_line, s.address);
        let v = format!("pf_{}{j}", s.name);
        o.line(
            d,
            format!(
                "const pf_i {v}_e = pf_tid + {};",
                j * i64::from(self.threads)
            ),
        );
        o.line(d, format!("const int {v}_live = {v}_e < {};", s.chunks));
        o.line(d, format!("const pf_i {v}_line = {v}_e / {per_line};"));
        o.line(d, format!("const pf_i {v}_col = ({v}_e % {per_line}) * 8;"));
        if self.wg {
            // The 128-byte swizzle: a line of 64 elements is 128 bytes,
            // and its 16-byte chunk `q` sits at `q ^ (line % 8)`. K-major:
            // a line is a row's k tile. MN-major: a line is 64 of the rows
            // at one k, the tile's 64-row groups `tk` lines apart.
            let dst = if x.k_contiguous {
                format!("{v}_line * 64 + ((({v}_col / 8) ^ ({v}_line % 8)) * 8)")
            } else if narrow(x, s.rows) {
                // The 64-byte swizzle (an MN-major tile 32 wide): a line
                // is 64 bytes, and its chunk `q` sits at `q ^ ((line / 2)
                // % 4)` (address bits 4-5 XOR bits 7-8).
                format!("{v}_line * 32 + ((({v}_col / 8) ^ (({v}_line / 2) % 4)) * 8)")
            } else {
                format!(
                    "({v}_col / 64) * {} + {v}_line * 64 + (((({v}_col % 64) / 8) ^ ({v}_line % 8)) * 8)",
                    self.tk * 64
                )
            };
            o.line(d, format!("const pf_i {v}_dst = {dst};"));
        } else {
            o.line(
                d,
                format!("const pf_i {v}_dst = {v}_line * {} + {v}_col;", s.line_len),
            );
        }
        let origin = s.origin;
        let (row, k) = if x.k_contiguous {
            (format!("{origin} + {v}_line"), format!("{v}_col"))
        } else {
            (format!("{origin} + {v}_col"), format!("{v}_line"))
        };
        o.line(d, format!("const pf_i {v}_row = {row};"));
        o.line(d, format!("const pf_i {v}_k = {k};"));
        // The row the chunk reads (see [`read_row`]).
        let src_row = read_row(x, &format!("{v}_row"), s.ext);
        let at = address(&src_row, &format!("{v}_k"));
        o.line(
            d,
            format!("const unsigned short *const {v}_src = (const unsigned short *){at};"),
        );
        o.line(
            d,
            format!(
                "const pf_i {v}_ks = (pf_i)((const unsigned short *){} - (const unsigned short *){at});",
                address(&src_row, &format!("{v}_k + 1")),
            ),
        );
        if s.uniform.is_some() {
            // The distance between two lines (rows of a K-major operand,
            // k of an MN-major one).
            let (row1, k1) = if x.k_contiguous {
                (format!("{v}_row + 1"), format!("{v}_k"))
            } else {
                (src_row.clone(), format!("{v}_k + 1"))
            };
            o.line(
                d,
                format!(
                    "const pf_i {v}_ls = (pf_i)((const unsigned short *){} - (const unsigned short *){at});",
                    address(&row1, &k1),
                ),
            );
        }
        chunk_flags(o, d, &v, x, s.ext);
    }

    /// The fast path's copies of operand `s` (one chunk's addresses kept,
    /// the others a constant number of lines on) into `stage` from k tile
    /// `k0`, as (destination, source) pairs; `None` where the operand's
    /// chunks do not lie in one column ([`uniform_lines`]).
    fn fast_chunks(&self, s: &Staged, stage: &str, k0: &str) -> Option<Vec<(String, String)>> {
        let step = s.uniform?;
        let v = format!("pf_{}0", s.name);
        Some(
            (0..s.per_thread)
                .map(|j| {
                    (
                        format!(
                            "&{}[({stage}) * {} + {v}_dst + {}]",
                            s.buf,
                            s.len,
                            j * step * s.line_len
                        ),
                        format!("({v}_src + ({k0}) * {v}_ks + {} * {v}_ls)", j * step),
                    )
                })
                .collect(),
        )
    }

    /// The copies of stage `pf_s` when every chunk of both operands is
    /// aligned and inside (`pf_A_all && pf_B_all`) and the tile is whole:
    /// the fast branches of [`Engine::copy`] alone (GPU only; `None` where
    /// an operand has no such branch).
    pub(super) fn fast_copies(&self) -> Option<Vec<(String, String)>> {
        let k0 = format!("pf_kb + pf_s * {}", self.tk);
        let mut copies = Vec::new();
        for s in self.staged() {
            copies.extend(self.fast_chunks(&s, "pf_s", &k0)?);
        }
        Some(copies)
    }

    /// The copy of the k tile from `k0` into `stage`; on the GPU one
    /// `cp.async` group, committed at its end.
    pub(super) fn copy(&self, o: &mut Lines, d0: usize, stage: &str, k0: &str) {
        let d = self.target.open_threads(o, d0, self.threads);
        if self.emulated() {
            self.setup_chunks(o, d);
        }
        if self.region.full_tiles {
            o.line(d, "const int pf_full = 1;");
        } else {
            o.line(
                d,
                format!("const int pf_full = ({k0}) + {} <= pf_ek;", self.tk),
            );
        }
        for s in self.staged() {
            self.copy_operand(o, d, &s, stage, k0);
        }
        if self.emulated() {
            self.target.close_threads(o, d0);
        } else {
            o.line(d, "pf_cp_async_commit();");
        }
    }

    /// Operand `s`'s chunks: where they lie in one column, the fast path
    /// (a whole tile with every chunk inside, no test per chunk) and the
    /// general one, which derives each chunk from the first.
    fn copy_operand(&self, o: &mut Lines, d: usize, s: &Staged, stage: &str, k0: &str) {
        if let Some(fast) = self.fast_chunks(s, stage, k0) {
            o.line(d, format!("if (pf_full && pf_{}_all) {{", s.name));
            for (dst, src) in fast {
                o.line(d + 1, self.target.copy16(&dst, &src));
            }
            o.line(d, "} else {");
        }
        let d = if s.uniform.is_some() { d + 1 } else { d };
        for j in 0..s.per_thread {
            match s.uniform {
                Some(step) if j > 0 => {
                    o.line(d, "{");
                    self.derive_chunk(o, d + 1, s, j, step * j);
                    self.copy_chunk(o, d + 1, s, j, stage, k0);
                    o.line(d, "}");
                }
                _ => self.copy_chunk(o, d, s, j, stage, k0),
            }
        }
        if s.uniform.is_some() {
            o.line(d - 1, "}");
        }
    }

    /// Chunk `j`, `dl` lines after chunk 0 in the same column: its values
    /// follow from chunk 0's, so the kernel keeps only chunk 0's across
    /// the pipeline.
    fn derive_chunk(&self, o: &mut Lines, d: usize, s: &Staged, j: i64, dl: i64) {
        let v = format!("pf_{}{j}", s.name);
        let v0 = format!("pf_{}0", s.name);
        let (row, k) = if s.x.k_contiguous {
            (format!("{v0}_row + {dl}"), format!("{v0}_k"))
        } else {
            (format!("{v0}_row"), format!("{v0}_k + {dl}"))
        };
        o.line(
            d,
            format!(
                "const int {v}_live = pf_tid + {} < {};",
                j * i64::from(self.threads),
                s.chunks
            ),
        );
        o.line(
            d,
            format!("const pf_i {v}_dst = {v0}_dst + {};", dl * s.line_len),
        );
        o.line(d, format!("const pf_i {v}_row = {row};"));
        o.line(d, format!("const pf_i {v}_k = {k};"));
        o.line(
            d,
            format!("const unsigned short *const {v}_src = {v0}_src + {dl} * {v0}_ls;"),
        );
        o.line(d, format!("const pf_i {v}_ks = {v0}_ks;"));
        chunk_flags(o, d, &v, s.x, s.ext);
    }

    /// Chunk `j` of operand `s` into `stage`: one 16-byte copy where it is
    /// whole, aligned and inside; else the elements inside the domain and
    /// zeros for the rest.
    fn copy_chunk(&self, o: &mut Lines, d: usize, s: &Staged, j: i64, stage: &str, k0: &str) {
        let v = format!("pf_{}{j}", s.name);
        let dst = format!("&{}[({stage}) * {} + {v}_dst]", s.buf, s.len);
        let src = format!("({v}_src + ({k0}) * {v}_ks)");
        o.line(
            d,
            format!(
                "if (pf_full && {v}_fast) {}",
                self.target.copy16(&dst, &src)
            ),
        );
        o.line(d, format!("else if ({v}_live) {{"));
        // How many of the chunk's 8 elements lie in the domain.
        let count = if s.x.k_contiguous {
            format!("{v}_rows ? (int)pf_max(pf_min(pf_ek - ({k0} + {v}_k), (pf_i)8), (pf_i)0) : 0")
        } else {
            format!("({k0} + {v}_k < pf_ek) ? {v}_rows : 0")
        };
        o.line(d + 1, format!("const int pf_count = {count};"));
        if self.emulated() {
            o.line(d + 1, format!("uint16_t *pf_dst = {dst};"));
            o.line(d + 1, format!("const uint16_t *pf_src = {src};"));
            o.line(
                d + 1,
                "for (int pf_q = 0; pf_q < 8; pf_q++) pf_dst[pf_q] = pf_q < pf_count ? pf_src[pf_q] : 0;",
            );
        } else {
            o.line(d + 1, format!("unsigned short *pf_dst = {dst};"));
            o.line(d + 1, "if (pf_count > 0) {");
            o.line(d + 2, format!("const unsigned short *pf_src = {src};"));
            // A whole aligned chunk is copied asynchronously; a partial
            // one element by element. (`cp.async` with a smaller source
            // size reads only those bytes, but compute-sanitizer's
            // memcheck counts all 16, and a chunk at the end of a tensor
            // would be reported.)
            o.line(
                d + 2,
                format!("if ({v}_aligned && pf_count == 8) pf_cp_async16_full(pf_dst, pf_src);"),
            );
            o.line(
                d + 2,
                "else for (int pf_q = 0; pf_q < 8; pf_q++) pf_dst[pf_q] = pf_q < pf_count ? pf_src[pf_q] : (unsigned short)0;",
            );
            o.line(d + 1, "} else {");
            o.line(d + 2, "*(uint4 *)pf_dst = make_uint4(0, 0, 0, 0);");
            o.line(d + 1, "}");
        }
        o.line(d, "}");
    }
}

/// The row (of the tile's `m` or `n`) that a chunk starting at `row`
/// reads. An MN-major operand's chunk runs along the rows (8 columns of
/// `B` at one k); one wholly past the domain's extent `ext` (the last
/// column tile of a product whose `N` is off the tile grid) reads the
/// last whole chunk inside instead, `8 (ext / 8 - 1)`, and so copies as
/// the chunks inside do: one 16-byte `cp.async`, no zero fill, no
/// element loop, no divergence from its warp. Its values land in the
/// accumulator's columns past the extent, which no statement reads and
/// no store writes (an output element is a sum over its own row of `A`
/// and column of `B` only). On an H200, f16 gemm with N = 1000 took 2.6
/// times the time at N = 1024 before (the edge blocks set a one-wave
/// kernel's time). A K-major operand's chunk runs along k, which must
/// read zeros past the reduction's end, so it is not moved.
fn read_row(x: &Operand, row: &str, ext: &str) -> String {
    if x.k_contiguous {
        row.to_string()
    } else {
        format!("(({row}) >= ({ext}) && ({ext}) >= 8 ? (({ext}) / 8 - 1) * 8 : ({row}))")
    }
}

/// A chunk's flags from its `_live`, `_row` and `_src`: how many of its
/// rows are inside (`_rows`), whether its source is 16-byte aligned, and
/// whether it is one 16-byte copy in a k tile that is inside too (`_fast`:
/// all its rows inside).
fn chunk_flags(o: &mut Lines, d: usize, v: &str, x: &Operand, ext: &str) {
    let (rows, rows_in) = if x.k_contiguous {
        (format!("{v}_live && {v}_row < {ext}"), format!("{v}_rows"))
    } else {
        // A chunk wholly past the rows reads a whole chunk inside them
        // (`read_row`): all 8 of its elements are read.
        (
            format!(
                "{v}_live ? ({v}_row >= {ext} && {ext} >= 8 ? 8 : (int)pf_max(pf_min({ext} - {v}_row, (pf_i)8), (pf_i)0)) : 0"
            ),
            format!("{v}_rows == 8"),
        )
    };
    o.line(d, format!("const int {v}_rows = {rows};"));
    o.line(
        d,
        format!("const int {v}_aligned = (((unsigned long long){v}_src) & 15) == 0;"),
    );
    o.line(
        d,
        format!("const int {v}_fast = {v}_live && {v}_aligned && {rows_in};"),
    );
}
