"""Entmax attention for a few queries against a key cache (decoding): the launcher, and the split over keys.

Layout (batch, heads, seq, head_dim); arXiv:2506.16640, section 2 with the semantics of attention_fwd.py:
z = q_scale * scale * q.k - slope * |pos(r) - j|, p = alpha-entmax(z) = [(alpha - 1) z - tau]_+^(1/(alpha-1))
with tau such that sum_j p_j = 1 (softmax when alpha = 1), out = p @ v. With Nq <= 16 the fused forward would
give each (batch, head) a single program that streams the whole cache several times. Here the work is split
along the keys instead, so that K and V are each read once, and a grouped cache once per group:

1. scores: one program per (key chunk, batch, pack of query heads sharing a KV head: the whole group of
   grouped-query attention while group * Nq <= 16, attention_common.heads_per_program; their rows are the
   rows of one score tile, so q.k is one tl.dot) writes s = c * z for its chunk (Nq x Nk fp32 a head, small
   next to K) and the chunk's row max;
2. threshold: one program per query row: the row max over the chunks' maxima, then the bracketing threshold
   passes of attention_fwd.py over the stored scores of the whole row (held in registers when the row fits
   in one block, else re-read from L2), then Z = sum_j p_j, 1 / Z and the support size. tau needs every key,
   so it is found here exactly as on the other paths (same passes, same stopping rule), never merged from
   per-chunk thresholds. Where a pack's rows x cache are few (<= 16384 scores, see entmax_attention_decode_
   split: a cache of up to 4K keys with groups of 4 or without groups, at Nq = 1) there is no such launch:
   every output program of the pack solves its rows itself, the same passes over the same stored scores;
3. output: one program per (key chunk, batch, pack of heads) accumulates p @ v / Z over its chunk. A cache
   of one chunk writes the output directly; otherwise the chunks' partial sums go to the workspace and the
   last program of a pack to arrive (an atomic count) adds them up and writes the output in q's dtype.

With per-row lengths (kv_lengths: a static cache's buffers, filled up to a count read on the device) the grid
covers the whole buffer, and the chunks past a row's length are neither scored, solved over nor read.
The host side is kept to one fp32 workspace (the kernels' scratch, addressed by offsets), the three result
tensors and these three launches (two when the output kernel solves). Caches of at most SHORT_CACHE keys
(and some of up to WIDE_SHORT_CACHE) take the one-launch kernel of attention_decode_short.py instead, except
grouped ones under CUDA-graph capture (entmax_attention_decode, the launcher, gives both rules).
Forward only: the autograd wrapper uses the fused kernels when gradients are needed.
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.attention_common import (
    MAX_QUERIES,
    aligned,
    cdiv,
    decode_buffers,
    filled_keys,
    heads_per_program,
    logit_constants,
    next_power_of_2,
    packed_queries,
    stored_rows_threshold,
    stored_score_tile,
    threshold_tile,
    weighted_values_tile,
)
from asentmax.ops.triton.attention_decode_short import SHORT_CACHE, entmax_attention_decode_short
from asentmax.ops.triton.launch import cached_launch

_BLOCK_M, _BLOCK_N = MAX_QUERIES, 64


@cached_launch
@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks"])
def _decode_scores(
    Q, K, Work, QScale, Slopes, KPM, Lengths,
    sqb, sqh, sqm, skb, skh, skn,
    n_packs, pack, group, n_q, n_k, n_chunks, s_stride, max_offset, count_offset, head_dim, scale, bias_mult,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr,
    HAS_LENGTHS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Scores of chunk pid_c for the rows of pack pid_p (packed_queries): Work[row * s_stride + j], -inf on
    keys j >= n_k up to s_stride (the padding is written, so the later kernels read whole chunks unmasked),
    and the chunk's row max at Work[max_offset + row * n_chunks + pid_c]. The program of chunk 0 also sets
    the pack's arrival count of _decode_output (Work[count_offset + pid_p]) to 0. HAS_LENGTHS: the batch
    row holds its first Lengths[b] of the n_k slots (filled_keys); the keys past them are -inf too, and a
    chunk past them all writes only its row max, -inf (no later kernel reads its scores: scored_extent)."""
    pid_c = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_p // n_packs
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim
    n_keys = filled_keys(Lengths, b, n_k, HAS_LENGTHS)
    q, s_mult, slope, pos_m, rows, row_in, first_head = packed_queries(
        Q, QScale, Slopes, pid_p, sqb, sqh, sqm, n_packs, pack, n_q, n_keys, head_dim, scale, bias_mult,
        BLOCK_M, BLOCK_D, HAS_ALIBI, HAS_QSCALE)
    k_base = K + b * skb + (first_head // group) * skh
    s_rows = Work + rows[:, None] * s_stride
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if pid_c * CHUNK < n_keys:  # always true without HAS_LENGTHS: the grid covers cdiv(n_k, CHUNK) chunks
        for start in range(0, CHUNK, BLOCK_N):
            offs_n = pid_c * CHUNK + start + tl.arange(0, BLOCK_N)
            m = tl.maximum(m, stored_score_tile(q, k_base, skn, offs_n, offs_d, d_in, s_mult, pos_m, slope,
                                                KPM + b * n_k, n_keys, s_rows, row_in, CAUSAL, HAS_ALIBI,
                                                HAS_KPM, DOT_PRECISION))
    tl.store(Work + max_offset + rows * n_chunks + pid_c, m, mask=row_in)
    if pid_c == 0:
        tl.store(Work + count_offset + pid_p, 0.0)


@triton.jit
def scored_extent(Lengths, b, n_k, s_stride, CHUNK: tl.constexpr, HAS_LENGTHS: tl.constexpr):
    """The stored scores of a row of batch row b: s_stride, or with HAS_LENGTHS the whole chunks that hold
    its first Lengths[b] keys (_decode_scores scores no chunk past them)."""
    if HAS_LENGTHS:
        return tl.cdiv(filled_keys(Lengths, b, n_k, True), CHUNK) * CHUNK
    return s_stride


@triton.jit
def solve_rows(Work, Tau, Support, rows, r_in, s_stride, extent, max_offset, inv_z_offset, n_chunks, inv_am1,
               two_minus_alpha, tol, max_iter, ROWS: tl.constexpr, MAX_TILE: tl.constexpr,
               BLOCK: tl.constexpr, RESIDENT: tl.constexpr, MODE: tl.constexpr):
    """Thresholds of the score rows `rows` (ROWS,) (those with r_in), rows of s_stride scores of which the
    first `extent` are stored (scored_extent): each row's max over its chunks' maxima (read MAX_TILE chunks
    at a time), then stored_rows_threshold over those scores, in tiles of (ROWS, BLOCK). Writes tau, the
    support size and 1 / Z (Work[inv_z_offset + row]; 0 on rows with no visible key)."""
    offs_c = tl.arange(0, MAX_TILE)
    m_part = tl.full([ROWS, MAX_TILE], float("-inf"), tl.float32)
    for start in range(0, n_chunks, MAX_TILE):
        chunk = start + offs_c
        m_part = tl.maximum(m_part, tl.load(Work + max_offset + rows[:, None] * n_chunks + chunk[None, :],
                                            mask=r_in[:, None] & (chunk < n_chunks)[None, :],
                                            other=float("-inf")))
    t, inv_z, count = stored_rows_threshold(Work + rows.to(tl.int64)[:, None] * s_stride, r_in[:, None],
                                            extent, tl.max(m_part, 1), inv_am1, two_minus_alpha, tol,
                                            max_iter, BLOCK, RESIDENT, MODE)
    tl.store(Tau + rows, t, mask=r_in)
    tl.store(Work + inv_z_offset + rows, inv_z, mask=r_in)
    tl.store(Support + rows, count, mask=r_in)


@cached_launch
@triton.jit(do_not_specialize=["n_k", "n_chunks", "max_iter"])
def _decode_threshold(
    Work, Tau, Support, Lengths, s_stride, max_offset, inv_z_offset, n_chunks, n_k, rows_per_batch, inv_am1,
    two_minus_alpha, tol, max_iter,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, RESIDENT: tl.constexpr, HAS_LENGTHS: tl.constexpr,
    MODE: tl.constexpr,
):
    """One program per query row (solve_rows on a tile of one row, so that the fused kernel's helpers
    apply); rows_per_batch = heads * n_q rows share a batch row's Lengths."""
    row = tl.program_id(0)
    rows = row + tl.arange(0, 1)
    extent = scored_extent(Lengths, row // rows_per_batch, n_k, s_stride, CHUNK, HAS_LENGTHS)
    solve_rows(Work, Tau, Support, rows, rows >= 0, s_stride, extent, max_offset, inv_z_offset, n_chunks,
               inv_am1, two_minus_alpha, tol, max_iter, 1, BLOCK, BLOCK, RESIDENT, MODE)


@triton.jit
def chunk_sum(base, n_chunks, head_dim, d_in, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    """sum over c < n_chunks of the partial outputs base[c * head_dim + d], (BLOCK_D,) fp32. Read at L2 (.cg):
    other programs wrote them."""
    offs_c = tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_C, BLOCK_D], tl.float32)
    for start in range(0, n_chunks, BLOCK_C):
        chunk = start + offs_c
        acc += tl.load(base + chunk[:, None] * head_dim + offs_d[None, :],
                       mask=(chunk[:, None] < n_chunks) & d_in[None, :], other=0.0, cache_modifier=".cg")
    return tl.sum(acc, 0)


@cached_launch
@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks", "max_iter"])
def _decode_output(
    V, Work, Tau, Support, Out, Lengths, svb, svh, svn,
    n_packs, pack, group, n_q, n_k, n_chunks, s_stride, max_offset, inv_z_offset, partial_offset,
    count_offset, head_dim, inv_am1, two_minus_alpha, tol, max_iter,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_C: tl.constexpr, MODE: tl.constexpr, SINGLE_CHUNK: tl.constexpr, SOLVE: tl.constexpr,
    ROWS: tl.constexpr, SOLVE_BLOCK: tl.constexpr, RESIDENT: tl.constexpr, HAS_LENGTHS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """sum_j p_j v_j / Z over chunk pid_c for the rows of pack pid_p (as _decode_scores): into Out
    (B, H, Nq, D) when the cache is one chunk. Otherwise to Work[partial_offset + (row * n_chunks + pid_c) *
    head_dim + d]; then the program adds 1 to the pack's arrival count, and the one that arrives last (all
    the pack's partials are stored) sums them over the chunks into Out, in Out's dtype.

    SOLVE: there was no _decode_threshold launch; each program first finds the thresholds of its pack's rows
    itself (solve_rows on tiles of ROWS x SOLVE_BLOCK over the pack's scores of every chunk, held in
    registers when RESIDENT, else re-read from L2 each pass), every program of the pack the same values by
    the same passes, and reads them back after a barrier. HAS_LENGTHS: V is read only at the batch row's
    first Lengths[b] slots (filled_keys; past them the weights are 0, and the slots may hold anything), and
    a chunk past them all adds a zero partial without reading anything."""
    pid_c = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_p // n_packs
    n_keys = filled_keys(Lengths, b, n_k, HAS_LENGTHS)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = offs_m < pack * n_q
    d_in = offs_d < head_dim
    rows = pid_p * pack * n_q + offs_m
    if SOLVE:
        rows_r = pid_p * pack * n_q + tl.arange(0, ROWS)
        extent = scored_extent(Lengths, b, n_k, s_stride, CHUNK, HAS_LENGTHS)
        solve_rows(Work, Tau, Support, rows_r, tl.arange(0, ROWS) < pack * n_q, s_stride, extent, max_offset,
                   inv_z_offset, n_chunks, inv_am1, two_minus_alpha, tol, max_iter, ROWS, 32, SOLVE_BLOCK,
                   RESIDENT, MODE)
        tl.debug_barrier()  # the rows' tau and 1 / Z, stored in the ROWS layout, are read in the BLOCK_M one
    tau = tl.load(Tau + rows, mask=row_in, other=float("inf"))
    inv_z = tl.load(Work + inv_z_offset + rows, mask=row_in, other=0.0)
    v_base = V + b * svb + ((pid_p % n_packs) * pack // group) * svh
    s_rows = Work + rows[:, None] * s_stride
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if pid_c * CHUNK < n_keys:  # as in _decode_scores: a chunk past the row's filled keys reads no V
        for start in range(0, CHUNK, BLOCK_N):
            acc = weighted_values_tile(acc, s_rows, pid_c * CHUNK + start + tl.arange(0, BLOCK_N), row_in,
                                       tau, v_base, svn, offs_d, d_in, n_keys, inv_am1, MODE, DOT_PRECISION)
    acc = acc * inv_z[:, None]
    out_mask = row_in[:, None] & d_in[None, :]
    if SINGLE_CHUNK:
        tl.store(Out + rows[:, None] * head_dim + offs_d[None, :], acc.to(Out.dtype.element_ty),
                 mask=out_mask)
    else:
        tl.store(Work + partial_offset + (rows[:, None] * n_chunks + pid_c) * head_dim + offs_d[None, :], acc,
                 mask=out_mask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted (release)
        arrived = tl.atomic_add(Work + count_offset + pid_p, 1.0, sem="acq_rel", scope="gpu")
        if arrived == n_chunks - 1:  # exact: counts < 2^24 in fp32
            for r in range(0, pack * n_q):
                row = pid_p * pack * n_q + r
                total = chunk_sum(Work + partial_offset + row * n_chunks * head_dim, n_chunks, head_dim, d_in,
                                  BLOCK_C, BLOCK_D)
                tl.store(Out + row * head_dim + offs_d, total.to(Out.dtype.element_ty), mask=d_in)


# Longer caches the one-launch kernel still takes (takes_short_path; entmax_attention_decode's docstring has
# the measurements): one query a head, groups of at most 4, at least 128 query heads.
WIDE_SHORT_CACHE = 4096
WIDE_SHORT_GROUP = 4
WIDE_SHORT_PROGRAMS = 128
# The split path's launch configuration (entmax_attention_decode_split's docstring gives the rule).
SPLIT_CHUNK = 1024  # keys a program, a multiple of _BLOCK_N
SOLVE_SCORES = 16384  # most scores (64 KB) of a pack an output program solves itself (see the split launcher)
SOLVE_PROGRAMS = 256  # and at most this many times that over all output programs (2 a SM of an H200)
# Under CUDA-graph capture (graphed_launch): the configuration fastest in GPU time (entmax_attention_decode).
GRAPH_SPLIT_CACHE = 1024  # grouped caches of at least this many keys take the split path
GRAPH_CHUNKS = (1024, 512, 256)  # the largest that gives GRAPH_PROGRAMS programs, else the smallest
GRAPH_PROGRAMS = 256
GRAPH_SOLVE_SCORES = 2048  # most scores of a pack an output program solves itself
GRAPH_PACKED_PROGRAMS = 64  # fewer packed programs than this even in the smallest chunks: a head a program


def graphed_launch(q):
    """True while q's CUDA stream is being captured into a CUDA graph: the launches are then replayed
    without their host time, so the launcher picks the configuration fastest in GPU time."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def takes_short_path(batch, heads, kv_heads, n_q, n_k, graphed):
    """True where entmax_attention_decode takes the one-launch kernel: caches of at most SHORT_CACHE keys,
    multi-head or grouped, and of at most WIDE_SHORT_CACHE keys for one query a head in groups of at most
    WIDE_SHORT_GROUP with at least WIDE_SHORT_PROGRAMS query heads in all (a program each); except grouped
    caches of at least GRAPH_SPLIT_CACHE keys under graph capture."""
    group = heads // kv_heads
    if graphed and group > 1 and n_k >= GRAPH_SPLIT_CACHE:
        return False
    if n_k <= SHORT_CACHE:
        return True
    return (n_k <= WIDE_SHORT_CACHE and n_q == 1 and group <= WIDE_SHORT_GROUP
            and batch * heads >= WIDE_SHORT_PROGRAMS)


def split_pack(batch, heads, kv_heads, n_q, n_k, graphed):
    """Query heads a program of the split path: heads_per_program, or under graph capture one where packs of
    heads_per_program would give fewer than GRAPH_PACKED_PROGRAMS programs even in chunks of the smallest of
    GRAPH_CHUNKS (a single sequence's short cache: too few programs to fill the GPU)."""
    pack = heads_per_program(heads // kv_heads, n_q)
    if graphed and cdiv(n_k, GRAPH_CHUNKS[-1]) * (batch * heads // pack) < GRAPH_PACKED_PROGRAMS:
        return 1
    return pack


def split_chunk(n_k, n_packs, graphed):
    """Keys a program of the split path: SPLIT_CHUNK, or under graph capture the largest of GRAPH_CHUNKS
    whose chunks x packs reach GRAPH_PROGRAMS programs (else the smallest)."""
    if not graphed:
        return SPLIT_CHUNK
    for chunk in GRAPH_CHUNKS:
        if cdiv(n_k, chunk) * n_packs >= GRAPH_PROGRAMS:
            return chunk
    return GRAPH_CHUNKS[-1]


def output_solves(pack_scores, n_programs, graphed):
    """Whether the split path's output programs find the thresholds themselves (one launch less, each
    program re-reading its pack's `pack_scores` scores on every pass) instead of _decode_threshold's launch:
    at most SOLVE_SCORES a program and SOLVE_PROGRAMS x that over all programs, or under graph capture, where
    the saved launch costs no host time, at most GRAPH_SOLVE_SCORES a program."""
    if graphed:
        return pack_scores <= GRAPH_SOLVE_SCORES
    return pack_scores <= SOLVE_SCORES and n_programs * pack_scores <= SOLVE_SCORES * SOLVE_PROGRAMS


def entmax_attention_decode(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol, max_iter,
                            lengths=None):
    """Forward only, for Nq <= MAX_QUERIES. Arguments as attention_fwd.entmax_attention_fwd.

    Returns out (B, H, Nq, D) in q.dtype, tau (B, H, Nq) fp32 in s units, support (B, H, Nq) int32.
    Two rules, by what a call costs:

    - Called directly (each launch pays tens of microseconds of host time, which at these sizes is most of a
      call): the fewest launches. Caches of at most SHORT_CACHE = 2048 keys take the one-launch kernel of
      attention_decode_short.py (a program per query head, grouped or not); longer ones the split over the
      keys in chunks of SPLIT_CHUNK = 1024, the output kernel solving the thresholds where output_solves
      allows. By measurement on the H200 (results/decode_gpu.md, ninth and seventh sessions; B 8, H 16,
      Hkv 4 unless said): at 1K keys the split path took 0.090 ms where the one-launch kernel took 0.036
      (head dim 128) and 0.040 against 0.029 (B 1, H 32, Hkv 8); at 2K the one-launch kernel won 3 of the 4
      comparisons (0.038-0.079 ms against 0.053-0.120); at 4K the split path won 8 of 10. Since the
      thirty-second session the one-launch kernel also takes caches of up to WIDE_SHORT_CACHE = 4096 keys
      with one query a head, groups of at most 4 and at least 128 query heads: in the five runs of
      bench_decode_gpu.py on record (results/decode_gpu.md, decode_gpu_session20.md, decode_gpu_session21.md;
      results/session29_gpu and session32_gpu on an H100) each path forced at 4K, B 8, H 16, Nq 1, took
      0.045-0.049 / 0.063-0.066 ms on the one-launch kernel against 0.063-0.078 / 0.073-0.083 split
      (Hkv 4, head dim 64 / 128) and 0.056-0.084 / 0.083-0.109 against 0.068-0.127 / 0.095-0.133 (Hkv 16);
      split stayed faster with Nq 4 (GPU time 0.058-0.064 against 0.088), groups of 8 (0.049-0.051 against
      0.116-0.123) and B 1 (H 32, Hkv 8: 4 of the 5 runs). Under graph capture that reaches multi-head
      caches only, where the one-launch kernel's GPU time was also the lower at 4K (0.053-0.062 / 0.080-0.104
      against 0.063-0.070 / 0.090-0.116 ms).
    - Under CUDA-graph capture (graphed_launch: asentmax eval and lm eval replay their decoding steps as
      graphs), where only GPU time counts: grouped caches of at least GRAPH_SPLIT_CACHE = 1024 keys take
      the split path too, in chunks of split_chunk (enough programs to fill the GPU), a program per query
      head where packs would leave too few programs (split_pack), with the thresholds in their own launch
      unless a pack holds at most GRAPH_SOLVE_SCORES scores. From the split-path sweep
      on an H100 (results/session29_gpu/decode/tune_decode.md, GPU time, bf16, Nq 1): with the thresholds
      in their own launch and this rule's chunks, 0.029 / 0.045 ms at 4K keys (B 8, H 16, Hkv 4, head dim
      64 / 128) where the direct rule's configuration took 0.054 / 0.066; 0.021 against 0.052 ms for
      B 1, H 32, Hkv 8 at 4K and 0.016 against 0.019 at 1K; 0.021 / 0.030 against the one-launch kernel's
      0.025 / 0.033 at 2K; level with it (0.016 / 0.020) at 1K for B 8. Solving in the output kernel was
      slower wherever a pack held 4,096 scores or more (0.050 against 0.030 ms at 4K, chunks of 1024) and
      faster only with 1,024 (0.013 against 0.014 ms, B 1 at 1K with packs of one head). Packs of one
      head (solving, 64-key tiles): 0.014 ms against 0.016 with packs of 4 for B 1 at 1K (32 packed
      programs); at 4K (128 packed programs) 0.024 against 0.021 (thresholds launched). Through this
      launcher under capture (thirty-second session, an H100, results/session32_gpu/README.md, before
      split_pack): 1.19-2.07x SDPA's GPU time on the grouped rows at 1K-4K keys, 2.07x being B 1 at 1K
      (0.017 ms, packs of 4).
    """
    graphed = graphed_launch(q)
    if takes_short_path(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], graphed):
        launcher = entmax_attention_decode_short
    else:
        launcher = entmax_attention_decode_split
    return launcher(q, k, v, mode=mode, alpha=alpha, scale=scale, causal=causal, slopes=slopes,
                    q_scale=q_scale, kpm=kpm, tol=tol, max_iter=max_iter, lengths=lengths)


def entmax_attention_decode_split(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol,
                                  max_iter, lengths=None, pack=None, chunk=None, solve=None, block_n=None,
                                  num_warps=None):
    """entmax_attention_decode by the split-over-keys kernels (any cache length). `pack` as in
    attention_decode_short.entmax_attention_decode_short (default heads_per_program); `chunk` keys a
    program (a multiple of 64, default split_chunk: SPLIT_CHUNK = 1024 called directly, a grid of
    (cdiv(Nk, chunk), B * H / pack)); under graph capture the default pack is split_pack's.

    `solve` has the output kernel find the thresholds instead of a launch of _decode_threshold: one launch
    less (a Triton launch costs tens of microseconds of host time: in results/decode_gpu.md the split path's
    four launches took 0.045-0.15 ms at 1K caches where the one-launch kernel took 0.02-0.05 ms), paid by
    every output program re-reading its pack's scores on each threshold pass. Default (output_solves), called
    directly: when that is at most SOLVE_SCORES = 16384 scores (64 KB) a program and SOLVE_PROGRAMS = 256 x
    that over all programs: the pack's next_power_of_2(pack * Nq) rows x padded cache <= 16384 and times the
    programs <= 2^22. So grouped caches of up to 4K keys with groups of 4 at Nq = 1 (B = 8, Hkv = 4) and
    multi-head ones up to 4K (B = 8, H = 16, Nq = 1) solve in the output kernel; 16 rows at 4K, or multi-head
    caches of 8K keys and more, keep the threshold launch. Under graph capture chunks and solving follow
    entmax_attention_decode's second rule. Tuning knobs: `block_n` keys a K or V tile in the scores and
    output kernels (a power of two >= 16 dividing the chunk; default 64) and `num_warps` of those two kernels
    (default 4; a solving output kernel takes threshold_tile's); the threshold kernel always takes
    threshold_tile's.
    """
    if block_n is None:
        block_n = _BLOCK_N
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, not {block_n}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, not {num_warps}")
    batch, heads, n_q, dim = q.shape
    group = heads // k.shape[1]
    n_k = k.shape[2]
    graphed = graphed_launch(q)
    if pack is None:
        pack = split_pack(batch, heads, k.shape[1], n_q, n_k, graphed)
    n_packs = batch * heads // pack
    if chunk is None:
        chunk = split_chunk(n_k, n_packs, graphed)
    if chunk % block_n:
        raise ValueError(f"chunk ({chunk}) must be a multiple of block_n ({block_n})")
    n_chunks = cdiv(n_k, chunk)
    s_stride = n_chunks * chunk  # score rows padded to whole chunks
    n_rows = batch * heads * n_q
    block_d = max(16, next_power_of_2(dim))
    c, inv_am1 = logit_constants(mode, alpha)
    # workspace: scores (n_rows, s_stride) | chunk maxima (n_rows, n_chunks) | 1 / Z (n_rows,)
    # | arrival counts (n_packs,) | partial outputs (n_rows, n_chunks, dim), the last only with > 1 chunk
    max_offset = n_rows * s_stride
    inv_z_offset = max_offset + aligned(n_rows * n_chunks)
    count_offset = inv_z_offset + aligned(n_rows)
    partial_offset = count_offset + aligned(n_packs)
    partials = n_rows * n_chunks * dim if n_chunks > 1 else 0
    work, out, tau, support = decode_buffers(q, partial_offset + partials)
    lengths_arg = lengths if lengths is not None else support  # any pointer where HAS_LENGTHS is off
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_scores[(n_chunks, n_packs)](
        q, k, work, q_scale if q_scale is not None else tau, slopes if slopes is not None else tau,
        kpm if kpm is not None else support, lengths_arg,
        *q.stride()[:3], *k.stride()[:3],
        heads // pack, pack, group, n_q, n_k, n_chunks, s_stride, max_offset, count_offset, dim, scale, c,
        CHUNK=chunk, BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=causal,
        HAS_ALIBI=slopes is not None, HAS_QSCALE=q_scale is not None, HAS_KPM=kpm is not None,
        HAS_LENGTHS=lengths is not None, DOT_PRECISION=precision, num_warps=num_warps or 4)
    rows = next_power_of_2(pack * n_q)
    solve_tile, solve_warps = threshold_tile(rows * s_stride)
    if solve is None:  # each output program re-reads its pack's scores every pass: bound that traffic
        solve = output_solves(rows * s_stride, n_chunks * n_packs, graphed)
    if not solve:
        row_block, row_warps = threshold_tile(s_stride)  # a row of <= 4096 scores in registers, else streamed
        _decode_threshold[(n_rows,)](
            work, tau, support, lengths_arg, s_stride, max_offset,
            inv_z_offset, n_chunks, n_k, heads * n_q, inv_am1, 2.0 - alpha, tol, max_iter, CHUNK=chunk,
            BLOCK=row_block, RESIDENT=s_stride <= row_block, HAS_LENGTHS=lengths is not None, MODE=mode,
            num_warps=row_warps)
    _decode_output[(n_chunks, n_packs)](
        v, work, tau, support, out, lengths_arg, *v.stride()[:3],
        heads // pack, pack, group, n_q, n_k, n_chunks, s_stride, max_offset, inv_z_offset, partial_offset,
        count_offset, dim, inv_am1, 2.0 - alpha, tol, max_iter,
        CHUNK=chunk, BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_C=16, MODE=mode,
        SINGLE_CHUNK=n_chunks == 1, SOLVE=solve, ROWS=rows if solve else 1,
        SOLVE_BLOCK=solve_tile // rows if solve else 1, RESIDENT=solve and s_stride <= solve_tile // rows,
        HAS_LENGTHS=lengths is not None, DOT_PRECISION=precision,
        num_warps=solve_warps if solve else num_warps or 4)
    return out, tau, support
