"""Entmax attention for a few queries against a key cache (decoding): the launcher, and the split over keys.

Layout (batch, heads, seq, head_dim); arXiv:2506.16640, section 2 with the semantics of attention_fwd.py. With
Nq <= 16 the fused forward would give each (batch, head) a single program that streams the whole cache
several times. Here the work is split along the keys instead, so that K and V are each read once:

1. scores: one program per (key chunk, batch, pack of query heads sharing a KV head: the whole group of
   grouped-query attention while group * Nq <= 16, attention_common.heads_per_program) writes s = c * z for
   its chunk (Nq x Nk fp32 a head, small next to K) and the chunk's row max;
2. threshold: one program per query row: max, then the bracketing threshold passes of attention_fwd.py
   over the stored scores (held in registers when the row fits in one block, else re-read from L2), then
   Z = sum_j p_j, 1 / Z and the support size;
3. output: one program per (key chunk, batch, pack of heads) accumulates p @ v / Z over its chunk. A cache
   of one chunk writes the output directly; otherwise the chunks' partial sums go to the workspace and
4. reduce: one program per query row adds them and writes the output in q's dtype.

The host side is kept to one fp32 workspace (the kernels' scratch, addressed by offsets), the three result
tensors and these three or four launches. At short caches that fixed cost still dominates, so
entmax_attention_decode, the launcher, sends caches of at most SHORT_CACHE keys to the one-launch kernel of
attention_decode_short.py instead. Forward only: the autograd wrapper uses the fused kernels when gradients
are needed.
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.attention_common import (
    MAX_QUERIES,
    aligned,
    cdiv,
    decode_buffers,
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

_BLOCK_M, _BLOCK_N, _CHUNK = MAX_QUERIES, 64, 1024


@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks"])
def _decode_scores(
    Q, K, Work, QScale, Slopes, KPM,
    sqb, sqh, sqm, skb, skh, skn,
    n_packs, pack, group, n_q, n_k, n_chunks, s_stride, max_offset, head_dim, scale, bias_mult,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Scores of chunk pid_c for the rows of pack pid_p (packed_queries): Work[row * s_stride + j], -inf on
    keys j >= n_k up to s_stride (the padding is written, so the later kernels read whole chunks unmasked),
    and the chunk's row max at Work[max_offset + row * n_chunks + pid_c]."""
    pid_c = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_p // n_packs
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim
    q, s_mult, slope, pos_m, rows, row_in, first_head = packed_queries(
        Q, QScale, Slopes, pid_p, sqb, sqh, sqm, n_packs, pack, n_q, n_k, head_dim, scale, bias_mult, BLOCK_M,
        BLOCK_D, HAS_ALIBI, HAS_QSCALE)
    k_base = K + b * skb + (first_head // group) * skh
    s_rows = Work + rows[:, None] * s_stride
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start in range(0, CHUNK, BLOCK_N):
        offs_n = pid_c * CHUNK + start + tl.arange(0, BLOCK_N)
        m = tl.maximum(m, stored_score_tile(q, k_base, skn, offs_n, offs_d, d_in, s_mult, pos_m, slope,
                                            KPM + b * n_k, n_k, s_rows, row_in, CAUSAL, HAS_ALIBI, HAS_KPM,
                                            DOT_PRECISION))
    tl.store(Work + max_offset + rows * n_chunks + pid_c, m, mask=row_in)


@triton.jit(do_not_specialize=["n_chunks", "max_iter"])
def _decode_threshold(
    Work, Tau, Support, s_stride, max_offset, inv_z_offset, n_chunks, inv_am1, two_minus_alpha, tol, max_iter,
    BLOCK: tl.constexpr, RESIDENT: tl.constexpr, MODE: tl.constexpr,
):
    """One program per query row, handled as a (1, BLOCK) tile so that the fused kernel's helpers apply.
    Writes tau, the support size and 1 / Z (Work[inv_z_offset + row]; 0 on rows with no visible key)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)[None, :]
    m_part = tl.full([1, BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_chunks, BLOCK):
        m_part = tl.maximum(m_part, tl.load(Work + max_offset + row * n_chunks + start + offs,
                                            mask=start + offs < n_chunks, other=float("-inf")))
    one = tl.arange(0, 1)
    s_row = Work + row.to(tl.int64) * s_stride + one[:, None]  # (1, 1)
    t, inv_z, count = stored_rows_threshold(s_row, one[:, None] < 1, s_stride, tl.max(m_part, 1), inv_am1,
                                            two_minus_alpha, tol, max_iter, BLOCK, RESIDENT, MODE)
    tl.store(Tau + row + one, t)
    tl.store(Work + inv_z_offset + row + one, inv_z)
    tl.store(Support + row + one, count)


@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks"])
def _decode_output(
    V, Work, Tau, Out, svb, svh, svn,
    n_packs, pack, group, n_q, n_k, n_chunks, s_stride, inv_z_offset, partial_offset, head_dim, inv_am1,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MODE: tl.constexpr, SINGLE_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """sum_j p_j v_j / Z over chunk pid_c for the rows of pack pid_p (as _decode_scores): into Out
    (B, H, Nq, D) when the cache is one chunk, else to Work[partial_offset + (row * n_chunks + pid_c) *
    head_dim + d] for _decode_reduce."""
    pid_c = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = pid_p // n_packs
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = offs_m < pack * n_q
    d_in = offs_d < head_dim
    rows = pid_p * pack * n_q + offs_m
    tau = tl.load(Tau + rows, mask=row_in, other=float("inf"))
    inv_z = tl.load(Work + inv_z_offset + rows, mask=row_in, other=0.0)
    v_base = V + b * svb + ((pid_p % n_packs) * pack // group) * svh
    s_rows = Work + rows[:, None] * s_stride
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, CHUNK, BLOCK_N):
        acc = weighted_values_tile(acc, s_rows, pid_c * CHUNK + start + tl.arange(0, BLOCK_N), row_in, tau,
                                   v_base, svn, offs_d, d_in, n_k, inv_am1, MODE, DOT_PRECISION)
    acc = acc * inv_z[:, None]
    out_mask = row_in[:, None] & d_in[None, :]
    if SINGLE_CHUNK:
        tl.store(Out + rows[:, None] * head_dim + offs_d[None, :], acc.to(Out.dtype.element_ty),
                 mask=out_mask)
    else:
        tl.store(Work + partial_offset + (rows[:, None] * n_chunks + pid_c) * head_dim + offs_d[None, :], acc,
                 mask=out_mask)


@triton.jit(do_not_specialize=["n_chunks"])
def _decode_reduce(Work, Out, partial_offset, n_chunks, head_dim, BLOCK_C: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """Out[row] = sum over the chunks of the row's partial outputs, in Out's dtype. One program per row."""
    row = tl.program_id(0)
    offs_c = tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim
    base = Work + partial_offset + row * n_chunks * head_dim
    acc = tl.zeros([BLOCK_C, BLOCK_D], tl.float32)
    for start in range(0, n_chunks, BLOCK_C):
        chunk = start + offs_c
        acc += tl.load(base + chunk[:, None] * head_dim + offs_d[None, :],
                       mask=(chunk[:, None] < n_chunks) & d_in[None, :], other=0.0)
    tl.store(Out + row * head_dim + offs_d, tl.sum(acc, 0).to(Out.dtype.element_ty), mask=d_in)


def entmax_attention_decode(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol, max_iter):
    """Forward only, for Nq <= MAX_QUERIES. Arguments as attention_fwd.entmax_attention_fwd.

    Returns out (B, H, Nq, D) in q.dtype, tau (B, H, Nq) fp32 in s units, support (B, H, Nq) int32.
    Caches of at most SHORT_CACHE keys take the one-launch kernel of attention_decode_short.py (a program per
    query head), longer ones the split over the keys below (a program per key chunk and pack of query heads,
    heads_per_program). The one-launch kernel reads a head's whole cache in one program, so its time grows
    with the cache at B * H programs, while
    the split path's fixed cost of four launches dominates at short caches. SHORT_CACHE = 2048 by measurement
    (results/decode_gpu.md, both paths forced in one run on the H200, before the packing): at 1K-2K the
    one-launch kernel is faster in 9 of 10 rows, at 4K the split in 5 of 6 (q_len 4, head dim 128, GQA).
    """
    launcher = entmax_attention_decode_short if k.shape[2] <= SHORT_CACHE else entmax_attention_decode_split
    return launcher(q, k, v, mode=mode, alpha=alpha, scale=scale, causal=causal, slopes=slopes,
                    q_scale=q_scale, kpm=kpm, tol=tol, max_iter=max_iter)


def entmax_attention_decode_split(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol,
                                  max_iter, pack=None, chunk=_CHUNK):
    """entmax_attention_decode by the split-over-keys kernels (any cache length; the path for long caches).
    `pack` as in attention_decode_short.entmax_attention_decode_short (default heads_per_program); `chunk`
    keys a program (a multiple of 64: fewer keys give more programs, e.g. for a grouped cache's few packs)."""
    batch, heads, n_q, dim = q.shape
    group = heads // k.shape[1]
    if pack is None:
        pack = heads_per_program(group, n_q)
    n_k = k.shape[2]
    n_chunks = cdiv(n_k, chunk)
    s_stride = n_chunks * chunk  # score rows padded to whole chunks
    n_rows = batch * heads * n_q
    block_d = max(16, next_power_of_2(dim))
    c, inv_am1 = logit_constants(mode, alpha)
    # workspace: scores (n_rows, s_stride) | chunk maxima (n_rows, n_chunks) | 1 / Z (n_rows,)
    # | partial outputs (n_rows, n_chunks, dim), the last only with more than one chunk
    max_offset = n_rows * s_stride
    inv_z_offset = max_offset + aligned(n_rows * n_chunks)
    partial_offset = inv_z_offset + aligned(n_rows)
    partials = n_rows * n_chunks * dim if n_chunks > 1 else 0
    work, out, tau, support = decode_buffers(q, partial_offset + partials)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_scores[(n_chunks, batch * heads // pack)](
        q, k, work, q_scale if q_scale is not None else tau, slopes if slopes is not None else tau,
        kpm if kpm is not None else support,
        *q.stride()[:3], *k.stride()[:3],
        heads // pack, pack, group, n_q, n_k, n_chunks, s_stride, max_offset, dim, scale, c,
        CHUNK=chunk, BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, BLOCK_D=block_d, CAUSAL=causal,
        HAS_ALIBI=slopes is not None, HAS_QSCALE=q_scale is not None, HAS_KPM=kpm is not None,
        DOT_PRECISION=precision, num_warps=4)
    row_block, row_warps = threshold_tile(s_stride)  # a row of <= 4096 scores in registers, else streamed
    _decode_threshold[(n_rows,)](
        work, tau, support, s_stride, max_offset, inv_z_offset, n_chunks, inv_am1, 2.0 - alpha, tol, max_iter,
        BLOCK=row_block, RESIDENT=s_stride <= row_block, MODE=mode, num_warps=row_warps)
    _decode_output[(n_chunks, batch * heads // pack)](
        v, work, tau, out, *v.stride()[:3],
        heads // pack, pack, group, n_q, n_k, n_chunks, s_stride, inv_z_offset, partial_offset, dim, inv_am1,
        CHUNK=chunk, BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, BLOCK_D=block_d, MODE=mode,
        SINGLE_CHUNK=n_chunks == 1, DOT_PRECISION=precision, num_warps=4)
    if n_chunks > 1:
        _decode_reduce[(n_rows,)](work, out, partial_offset, n_chunks, dim, BLOCK_C=16, BLOCK_D=block_d,
                                  num_warps=4)
    return out, tau, support
