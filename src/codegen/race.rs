//! The race detector of the CPU emulation (issue 30, item 2).
//!
//! The emulation runs the blocks and threads of a kernel one after another,
//! so a race on the GPU does not show in its results. The detector keeps,
//! for each element of each tensor (global memory), the last thread that
//! wrote it and the last two threads that read it, each with the barrier
//! epoch of its block at the time; every global access of an instrumented
//! kernel goes through `pf_race_r` (read) or `pf_race_w` (write) around its
//! index. A conflict fails the run (exit status [`EXIT_STATUS`], a line
//! `race in kernel_K: ...` on stderr):
//!
//! * two different threads of one block touch an element, one of them a
//!   write, in one epoch (no `__syncthreads()` between them: the printer
//!   prints `pf_race_barrier()` in the emulation where the CUDA has one);
//! * two different blocks touch an element, one of them a write, in one
//!   kernel (blocks never synchronise within a kernel).
//!
//! The state is reset at each kernel start (`pf_race_begin`: a new
//! generation, so old entries count as empty). The current thread is set by
//! the emulation's block and thread loops (`pf_race_in`, which leaves index
//! 0 once the loop ends: code outside the thread loops runs as thread 0, as
//! on the GPU) and by the cooperative shared-memory copy (the thread that
//! copies each element on the GPU).
//!
//! Shared memory: the promoted copies of a kernel (`copy_in`, and the
//! statements' reads of them) take the slots after the tensors, registered
//! at each kernel start (`pf_race_shared`); a copy belongs to one block, so
//! only threads of one block conflict there (the emulation reuses one array
//! for every block: another block's entries are stale).
//!
//! Kernels printed by templates (tensor-core contractions, attention and
//! decoding, rows across lanes) are not instrumented: their accesses are
//! printed by their own code.

/// The exit status of an emulation that found a race.
pub const EXIT_STATUS: i32 = 86;

/// Axis codes of `pf_race_in`: threads x, y, z, then blocks x, y, z.
pub fn axis_code(thread: bool, axis: char) -> usize {
    let a = (axis as u8).saturating_sub(b'x').min(2) as usize;
    if thread {
        a
    } else {
        3 + a
    }
}

/// The detector's C code, placed before `pf_kernel`, for `names` (the
/// tensors in argument order), at most `shared` shared arrays per kernel
/// and `blocks` emulated blocks per axis.
pub fn helpers(names: &[String], shared: usize, blocks: u32) -> String {
    let tensors = names.len();
    let n = (tensors + shared).max(1);
    let quoted: Vec<String> = names.iter().map(|s| format!("\"{s}\"")).collect();
    let names = if quoted.is_empty() {
        "\"\"".to_string()
    } else {
        quoted.join(", ")
    };
    let names = format!("{names}{}", ", \"\"".repeat(shared));
    let per_axis = blocks;
    let all_blocks = blocks * blocks * blocks;
    format!(
        r#"/* The race detector (codegen::race). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct {{ unsigned gen_w, w, ep_w, gen_r, r, ep_r, r2, ep_r2; }} pf_race_cell;
#define PF_RACE_NONE 0xffffffffu
static const char *pf_race_names[{n}] = {{ {names} }};
#define PF_RACE_TENSORS {tensors}
static pf_race_cell *pf_race_shadow[{n}];
static long pf_race_len[{n}];
static unsigned pf_race_gen;
static const char *pf_race_kernel = "";
static long pf_race_dims[3] = {{1, 1, 1}};
static long pf_race_id[6];
static unsigned pf_race_epoch[{all_blocks}];
/* The current thread (block * threads + thread), its block, the threads per block. */
static unsigned pf_race_cur, pf_race_cur_b, pf_race_T = 1;
static inline void pf_race_update(void) {{
  pf_race_cur_b = (unsigned)(pf_race_id[3] + {per_axis} * (pf_race_id[4] + {per_axis} * pf_race_id[5]));
  pf_race_cur = pf_race_cur_b * pf_race_T
    + (unsigned)(pf_race_id[0] + pf_race_dims[0] * (pf_race_id[1] + pf_race_dims[1] * pf_race_id[2]));
}}
static void pf_race_setup(const long *counts) {{
  for (int t = 0; t < PF_RACE_TENSORS; t++) pf_race_len[t] = counts[t];
}}
static void pf_race_begin(const char *kernel, long x, long y, long z) {{
  pf_race_gen++;
  pf_race_kernel = kernel;
  pf_race_dims[0] = x; pf_race_dims[1] = y; pf_race_dims[2] = z;
  memset(pf_race_id, 0, sizeof pf_race_id);
  memset(pf_race_epoch, 0, sizeof pf_race_epoch);
  pf_race_T = (unsigned)(x * y * z);
  pf_race_update();
  for (int t = 0; t < {n}; t++) {{
    if (!pf_race_shadow[t] && pf_race_len[t] > 0) {{
      pf_race_shadow[t] = (pf_race_cell *)calloc(pf_race_len[t], sizeof(pf_race_cell));
      if (!pf_race_shadow[t]) {{ fprintf(stderr, "race detector: out of memory\n"); exit(66); }}
    }}
  }}
}}
/* Slot `t` (after the tensors) holds the kernel's shared array `name` of `len` elements. */
static void pf_race_shared(int t, const char *name, long len) {{
  pf_race_names[t] = name;
  if (len > pf_race_len[t]) {{
    free(pf_race_shadow[t]);
    pf_race_shadow[t] = (pf_race_cell *)calloc(len, sizeof(pf_race_cell));
    if (!pf_race_shadow[t]) {{ fprintf(stderr, "race detector: out of memory\n"); exit(66); }}
    pf_race_len[t] = len;
  }}
}}
static inline int pf_race_in(int axis, long v, int in) {{
  pf_race_id[axis] = in ? v : 0;
  pf_race_update();
  return in;
}}
static inline void pf_race_thread_linear(long l) {{
  pf_race_id[0] = l % pf_race_dims[0];
  pf_race_id[1] = (l / pf_race_dims[0]) % pf_race_dims[1];
  pf_race_id[2] = l / (pf_race_dims[0] * pf_race_dims[1]);
  pf_race_update();
}}
static inline unsigned pf_race_threads(void) {{ return pf_race_T; }}
static void pf_race_barrier(void) {{ pf_race_epoch[pf_race_cur_b]++; }}
static void pf_race_who(unsigned id, char *s, size_t n) {{
  unsigned t = id % pf_race_threads(), b = id / pf_race_threads();
  snprintf(s, n, "block (%u, %u, %u) thread (%u, %u, %u)",
    b % {per_axis}, (b / {per_axis}) % {per_axis}, b / ({per_axis} * {per_axis}),
    (unsigned)(t % pf_race_dims[0]), (unsigned)((t / pf_race_dims[0]) % pf_race_dims[1]),
    (unsigned)(t / (pf_race_dims[0] * pf_race_dims[1])));
}}
static void pf_race_report(int t, long i, unsigned other, const char *did, unsigned me, const char *does) {{
  char a[96], b[96];
  pf_race_who(other, a, sizeof a);
  pf_race_who(me, b, sizeof b);
  int blocks = other / pf_race_threads() != me / pf_race_threads();
  fprintf(stderr, "race in %s: %s element %ld %s by %s and %s by %s %s\n",
    pf_race_kernel, pf_race_names[t], i, did, a, does, b,
    blocks ? "(two blocks of one kernel)" : "with no barrier between");
  exit({status});
}}
/* Whether an access by `me` (block b, epoch ep) to slot t conflicts with
   one by `who` at epoch `at` (in shared memory, only within a block). */
static inline int pf_race_clash(int t, unsigned who, unsigned at, unsigned me, unsigned b, unsigned ep) {{
  if (who == PF_RACE_NONE || who == me) return 0;
  if (who / pf_race_threads() != b) return t < PF_RACE_TENSORS;
  return at == ep;
}}
static inline long pf_race_r(int t, long i) {{
  if (i < 0 || i >= pf_race_len[t] || !pf_race_shadow[t]) return i;
  pf_race_cell *c = &pf_race_shadow[t][i];
  unsigned me = pf_race_cur, b = pf_race_cur_b, ep = pf_race_epoch[b];
  if (c->gen_w == pf_race_gen && pf_race_clash(t, c->w, c->ep_w, me, b, ep))
    pf_race_report(t, i, c->w, "written", me, "read");
  if (c->gen_r != pf_race_gen) {{
    c->gen_r = pf_race_gen; c->r = me; c->ep_r = ep; c->r2 = PF_RACE_NONE;
  }} else if (c->r == me) {{
    c->ep_r = ep;
  }} else {{
    c->r2 = c->r; c->ep_r2 = c->ep_r; c->r = me; c->ep_r = ep;
  }}
  return i;
}}
static inline long pf_race_w(int t, long i) {{
  if (i < 0 || i >= pf_race_len[t] || !pf_race_shadow[t]) return i;
  pf_race_cell *c = &pf_race_shadow[t][i];
  unsigned me = pf_race_cur, b = pf_race_cur_b, ep = pf_race_epoch[b];
  if (c->gen_w == pf_race_gen && pf_race_clash(t, c->w, c->ep_w, me, b, ep))
    pf_race_report(t, i, c->w, "written", me, "written");
  if (c->gen_r == pf_race_gen) {{
    if (pf_race_clash(t, c->r, c->ep_r, me, b, ep)) pf_race_report(t, i, c->r, "read", me, "written");
    if (pf_race_clash(t, c->r2, c->ep_r2, me, b, ep)) pf_race_report(t, i, c->r2, "read", me, "written");
  }}
  c->gen_w = pf_race_gen; c->w = me; c->ep_w = ep;
  return i;
}}
"#,
        status = EXIT_STATUS
    )
}
