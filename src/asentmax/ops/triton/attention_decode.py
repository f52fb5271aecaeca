"""Entmax attention for a few queries against a long key cache (decoding), split over the keys.

Layout (batch, heads, seq, head_dim); PAPER.md section 2 with the semantics of attention_fwd.py. With
Nq <= 16 the fused forward would give each (batch, head) a single program that streams the whole cache
several times. Here the work is split along the keys instead, so that K and V are each read once:

1. scores: one program per (key chunk, batch * head) writes s = c * z for its chunk (Nq x Nk fp32, small
   next to K) and the chunk's row max;
2. threshold: one program per query row: max, then the bracketing threshold passes of attention_fwd.py
   over the stored scores (which stay in L2), then Z = sum_j p_j and the support size;
3. output: one program per (key chunk, batch * head) accumulates p @ v over its chunk; the chunks' partial
   sums are added and divided by Z on the host side (a (B, H, chunks, Nq, D) tensor).
Forward only: the autograd wrapper uses the fused kernels when gradients are needed.
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.attention_common import bracket_update, candidate_stats, entmax_power, tile_logits

MAX_QUERIES = 16  # decoding path for Nq <= MAX_QUERIES
_BLOCK_M, _BLOCK_N, _CHUNK, _BLOCK_ROW = MAX_QUERIES, 64, 1024, 1024


@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks"])
def _decode_scores(
    Q, K, S, ChunkMax, QScale, Slopes, KPM,
    sqb, sqh, sqm, skb, skh, skn,
    n_heads, group, n_q, n_k, n_chunks, head_dim, scale, bias_mult,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = offs_m < n_q
    d_in = offs_d < head_dim
    pos_m = offs_m + (n_k - n_q)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
                mask=row_in[:, None] & d_in[None, :], other=0.0)
    zmult = tl.full([BLOCK_M], 1.0, tl.float32) * scale
    if HAS_QSCALE:
        zmult = zmult * tl.load(QScale + pid_bh * n_q + offs_m, mask=row_in, other=1.0)
    rowmult = zmult * bias_mult
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Slopes + pid_bh) * bias_mult
    k_base = K + b * skb + (h // group) * skh
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start in range(0, CHUNK, BLOCK_N):
        offs_n = pid_c * CHUNK + start + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None],
                     mask=(offs_n[None, :] < n_k) & d_in[:, None], other=0.0)
        s = tile_logits(q, kt, rowmult, pos_m, offs_n, slope, KPM + b * n_k, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                        DOT_PRECISION)
        m = tl.maximum(m, tl.max(s, 1))
        tl.store(S + (pid_bh * n_q + offs_m[:, None]) * n_k + offs_n[None, :], s,
                 mask=row_in[:, None] & (offs_n[None, :] < n_k))
    tl.store(ChunkMax + (pid_bh * n_q + offs_m) * n_chunks + pid_c, m, mask=row_in)


@triton.jit(do_not_specialize=["n_k", "n_chunks", "max_iter"])
def _decode_threshold(
    S, ChunkMax, Tau, Z, Support, n_k, n_chunks, inv_am1, two_minus_alpha, tol, max_iter,
    BLOCK: tl.constexpr, MODE: tl.constexpr,
):
    """One program per query row, handled as a (1, BLOCK) tile so that the fused kernel's helpers apply."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)[None, :]
    m_part = tl.full([1, BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_chunks, BLOCK):
        m_part = tl.maximum(m_part, tl.load(ChunkMax + row * n_chunks + start + offs,
                                            mask=start + offs < n_chunks, other=float("-inf")))
    m = tl.max(m_part, 1)  # (1,)
    ok = m > float("-inf")
    m = tl.where(ok, m, 0.0)
    s_row = S + row * n_k
    t = m
    if MODE != 0:
        t = m - 1.0
        hi_t = m
        it = 0
        err = tol + 1.0
        while (it < max_iter) & (err > tol):
            d = (hi_t - t) * 0.25
            f0 = tl.zeros([1], tl.float32)
            f1 = tl.zeros([1], tl.float32)
            f2 = tl.zeros([1], tl.float32)
            f3 = tl.zeros([1], tl.float32)
            g0 = tl.zeros([1], tl.float32)
            g1 = tl.zeros([1], tl.float32)
            g2 = tl.zeros([1], tl.float32)
            g3 = tl.zeros([1], tl.float32)
            for start in range(0, n_k, BLOCK):
                s = tl.load(s_row + start + offs, mask=start + offs < n_k, other=float("-inf"))
                a0, a1, a2, a3, b0, b1, b2, b3 = candidate_stats(s, t, d, inv_am1, MODE)
                f0 += a0
                f1 += a1
                f2 += a2
                f3 += a3
                g0 += b0
                g1 += b1
                g2 += b2
                g3 += b3
            t, hi_t, excess = bracket_update(t, hi_t, f0, f1, f2, f3, g0, g1, g2, g3, ok, two_minus_alpha,
                                             MODE)
            err = tl.max(excess, 0)
            it += 1
    z = tl.zeros([1], tl.float32)
    count = tl.zeros([1], tl.int32)
    for start in range(0, n_k, BLOCK):
        s = tl.load(s_row + start + offs, mask=start + offs < n_k, other=float("-inf"))
        if MODE == 0:
            p = tl.exp2(s - t[:, None])
        else:
            p = entmax_power(tl.maximum(s - t[:, None], 0.0), inv_am1, MODE)
        z += tl.sum(p, 1)
        count += tl.sum((p > 0).to(tl.int32), 1)
    if MODE == 0:  # fold Z into tau: the output pass's p is then already normalised
        t = t + tl.log2(z)
        z = z * 0.0 + 1.0
    one = tl.arange(0, 1)
    tl.store(Tau + row + one, tl.where(ok, t, float("inf")))
    tl.store(Z + row + one, tl.where(ok, z, 0.0))
    tl.store(Support + row + one, tl.where(ok, count, 0))


@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks"])
def _decode_output(
    V, S, Tau, Partial, svb, svh, svn,
    n_heads, group, n_q, n_k, n_chunks, head_dim, inv_am1,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MODE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = offs_m < n_q
    d_in = offs_d < head_dim
    tau = tl.load(Tau + pid_bh * n_q + offs_m, mask=row_in, other=float("inf"))
    v_base = V + b * svb + (h // group) * svh
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, CHUNK, BLOCK_N):
        offs_n = pid_c * CHUNK + start + tl.arange(0, BLOCK_N)
        s = tl.load(S + (pid_bh * n_q + offs_m[:, None]) * n_k + offs_n[None, :],
                    mask=row_in[:, None] & (offs_n[None, :] < n_k), other=float("-inf"))
        if MODE == 0:
            p = tl.exp2(s - tau[:, None])
        else:
            p = entmax_power(tl.maximum(s - tau[:, None], 0.0), inv_am1, MODE)
        v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :],
                    mask=(offs_n[:, None] < n_k) & d_in[None, :], other=0.0)
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    tl.store(Partial + ((pid_bh * n_chunks + pid_c) * BLOCK_M + offs_m[:, None]) * BLOCK_D + offs_d[None, :],
             acc)


def entmax_attention_decode(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol, max_iter):
    """Forward only, for Nq <= 16. Arguments as attention_fwd.entmax_attention_fwd.

    Returns out (B, H, Nq, D) in q.dtype, tau (B, H, Nq) fp32 in s units, support (B, H, Nq) int32.
    """
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    n_chunks = triton.cdiv(n_k, _CHUNK)
    block_d = max(16, triton.next_power_of_2(dim))
    c = 1.4426950408889634 if mode == 0 else alpha - 1.0
    inv_am1 = 1.0 if mode == 0 else 1.0 / (alpha - 1.0)
    dev = q.device
    scores = torch.empty(batch, heads, n_q, n_k, device=dev, dtype=torch.float32)
    chunk_max = torch.empty(batch, heads, n_q, n_chunks, device=dev, dtype=torch.float32)
    tau = torch.empty(batch, heads, n_q, device=dev, dtype=torch.float32)
    z = torch.empty_like(tau)
    support = torch.empty(batch, heads, n_q, device=dev, dtype=torch.int32)
    partial = torch.empty(batch, heads, n_chunks, _BLOCK_M, block_d, device=dev, dtype=torch.float32)
    group = heads // k.shape[1]
    _decode_scores[(n_chunks, batch * heads)](
        q, k, scores, chunk_max, q_scale if q_scale is not None else tau,
        slopes if slopes is not None else tau, kpm if kpm is not None else support,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        heads, group, n_q, n_k, n_chunks, dim, scale, c,
        CHUNK=_CHUNK, BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, BLOCK_D=block_d, CAUSAL=causal,
        HAS_ALIBI=slopes is not None, HAS_QSCALE=q_scale is not None, HAS_KPM=kpm is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    _decode_threshold[(batch * heads * n_q,)](
        scores, chunk_max, tau, z, support, n_k, n_chunks, inv_am1, 2.0 - alpha, tol, max_iter,
        BLOCK=_BLOCK_ROW, MODE=mode, num_warps=4)
    _decode_output[(n_chunks, batch * heads)](
        v, scores, tau, partial, v.stride(0), v.stride(1), v.stride(2),
        heads, group, n_q, n_k, n_chunks, dim, inv_am1,
        CHUNK=_CHUNK, BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, BLOCK_D=block_d, MODE=mode,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    out = partial.sum(2)[:, :, :n_q, :dim] / z.clamp_min(1e-30)[..., None]
    return out.to(q.dtype), tau, support
