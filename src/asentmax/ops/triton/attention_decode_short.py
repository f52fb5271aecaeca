"""Entmax attention for a few queries against a short key cache (decoding), the whole step in one launch.

Layout (batch, heads, seq, head_dim); arXiv:2506.16640, section 2 with the semantics of attention_fwd.py:
z = q_scale * scale * q.k - slope * |pos(r) - j|, p = alpha-entmax(z) (softmax when alpha = 1), out = p @ v.
At caches of a few thousand keys the split-over-keys kernels of attention_decode.py spend most of a call on
their four launches, so here one program does the whole step for its rows: the Nq <= 16 queries of one
head by default, or of `pack` heads that share a KV head (attention_common.heads_per_program), which read
that KV head once for the pack, as SDPA does, but leave B * H / pack programs. One head per program is the
default by measurement: on the H200 the packed programs took 0.97-3.2x the per-head time at 1K-2K caches
with groups of 4 (results/decode_gpu.md, seventh session). Each row keeps its own head's q_scale, ALiBi
slope and threshold.

1. stream K in BLOCK_N tiles: scores s = c * z into the program's rows of an fp32 scratch (-inf on hidden
   keys and on the padding up to a whole tile) and the row maxima;
2. the threshold tau of each row by the bracketing passes of attention_fwd.py over the stored scores, held in
   registers while rows x keys fits a tile of 4096, else re-read from L2 (stored_rows_threshold), then 1 / Z;
3. stream V: out = sum_j p_j v_j / Z, written in q's dtype.

K and V are each read once per program. The stages hand their results to each other through the scratch
behind a barrier (the score tile of a stage has BLOCK_M = 16 rows for tl.dot, the threshold tile only the
next power of two of pack * Nq). Forward only, Nq <= MAX_QUERIES; attention_decode.entmax_attention_decode
picks this path for caches of at most SHORT_CACHE keys, multi-head or grouped, and up to WIDE_SHORT_CACHE
keys for one query a head in small groups with many heads (attention_decode.takes_short_path; under CUDA-graph
capture grouped caches from 1K keys go to the split path); longer ones take the split path, whose programs
read a KV head once per pack.

The launcher's block_n, num_warps and num_stages are tuning knobs (the K and V tile, the warps, the software
pipelining of the key loops), swept by benchmarks/tune_decode_gpu.py; their defaults (tuned_launch) are that
sweep's fastest configs on the H200 for caches of at least TUNED_CACHE keys (results/tune_decode.md,
fifteenth session: 1.05-1.43x faster than the untuned defaults at 1K-4K keys, same outputs and supports).
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
    logit_constants,
    next_power_of_2,
    packed_queries,
    stored_rows_threshold,
    stored_score_tile,
    threshold_tile,
    weighted_values_tile,
)
from asentmax.ops.triton.launch import cached_launch

SHORT_CACHE = 2048  # most keys of a cache this path takes (attention_decode.takes_short_path)
TUNED_CACHE = 1024  # fewest keys of a cache the tuned launch is used for (the sweep's range: 1K-4K keys)


def tuned_launch(block_d, group, n_k, item_size):
    """(block_n, num_warps, num_stages) by default, or None (the untuned defaults) for caches shorter than
    TUNED_CACHE or head dims above 128. From the sweep of results/tune_decode.md (bf16, H200, 16 cases of
    1K-4K keys, Nq 1 and 4, grouped and not): head dims <= 64: tiles of 512 keys, 4 warps, 3 stages; head
    dim 128: tiles of 256 keys, 3 stages, 8 warps where query heads share a KV head, else 4. These are
    within 3 % of the sweep's fastest agreeing config in 15 of the 16 cases (groups of 8: 1.18x) and
    1.05-1.43x faster than the untuned default in all 16. Inputs of item_size 4 bytes (fp32) get tiles of
    half as many keys, the sweep's bytes a tile: with the bf16 tiles their 3 stages need 352 KB of shared
    memory at head dim 64, over the H200's 227 KB (OutOfResources at 1,024 keys, twenty-first session)."""
    if n_k < TUNED_CACHE or block_d > 128:
        return None
    keys = 512 if block_d <= 64 else 256
    if item_size > 2:
        keys //= 2
    return keys, 4 if block_d <= 64 or group == 1 else 8, 3


@cached_launch
@triton.jit(do_not_specialize=["n_q", "n_k", "s_stride", "max_iter"])
def _decode_short(
    Q, K, V, Out, Tau, Support, Work, QScale, Slopes, KPM, Lengths,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
    n_packs, pack, group, n_q, n_k, s_stride, row_region, head_dim, scale, bias_mult, inv_am1,
    two_minus_alpha, tol, max_iter,
    ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SOLVE_BLOCK: tl.constexpr, RESIDENT: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr, HAS_LENGTHS: tl.constexpr, MODE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Rows pid * pack * n_q + (0 .. pack * n_q - 1) (packed_queries; pid = batch * n_packs + pack index).
    Scratch Work: row maxima at [row], 1 / Z at [row_region + row], scores at
    [2 * row_region + row * s_stride + j], j < s_stride. HAS_LENGTHS: the batch row holds its first
    Lengths[b] keys of the n_k slots (clamped to [0, n_k]); only their tiles are read and solved over."""
    pid = tl.program_id(0)
    b = (pid // n_packs).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim
    n_rows = pack * n_q
    n_keys = filled_keys(Lengths, b, n_k, HAS_LENGTHS)

    # 1. scores and row maxima
    q, s_mult, slope, pos_m, rows, row_in, first_head = packed_queries(
        Q, QScale, Slopes, pid, sqb, sqh, sqm, n_packs, pack, n_q, n_keys, head_dim, scale, bias_mult,
        BLOCK_M, BLOCK_D, HAS_ALIBI, HAS_QSCALE)
    s_rows = Work + 2 * row_region + rows.to(tl.int64)[:, None] * s_stride
    kv_head = first_head // group
    k_base = K + b * skb + kv_head * skh
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start in range(0, n_keys, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        m = tl.maximum(m, stored_score_tile(q, k_base, skn, offs_n, offs_d, d_in, s_mult, pos_m, slope,
                                            KPM + b * n_k, n_keys, s_rows, row_in, CAUSAL, HAS_ALIBI, HAS_KPM,
                                            DOT_PRECISION))
    tl.store(Work + rows, m, mask=row_in)
    tl.debug_barrier()

    # 2. thresholds, on a tile of ROWS rows
    offs_r = tl.arange(0, ROWS)
    r_in = offs_r < n_rows
    rows_r = pid * n_rows + offs_r
    tau, inv_z, count = stored_rows_threshold(
        Work + 2 * row_region + rows_r.to(tl.int64)[:, None] * s_stride, r_in[:, None],
        tl.cdiv(n_keys, BLOCK_N) * BLOCK_N,
        tl.load(Work + rows_r, mask=r_in, other=float("-inf")), inv_am1, two_minus_alpha, tol, max_iter,
        SOLVE_BLOCK, RESIDENT, MODE)
    tl.store(Tau + rows_r, tau, mask=r_in)
    tl.store(Support + rows_r, count, mask=r_in)
    tl.store(Work + row_region + rows_r, inv_z, mask=r_in)
    tl.debug_barrier()

    # 3. output
    tau = tl.load(Tau + rows, mask=row_in, other=float("inf"))
    inv_z = tl.load(Work + row_region + rows, mask=row_in, other=0.0)
    v_base = V + b * svb + kv_head * svh
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, n_keys, BLOCK_N):
        acc = weighted_values_tile(acc, s_rows, start + tl.arange(0, BLOCK_N), row_in, tau, v_base, svn,
                                   offs_d, d_in, n_keys, inv_am1, MODE, DOT_PRECISION)
    out = (acc * inv_z[:, None]).to(Out.dtype.element_ty)
    tl.store(Out + rows[:, None] * head_dim + offs_d[None, :], out, mask=row_in[:, None] & d_in[None, :])


def entmax_attention_decode_short(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol,
                                  max_iter, lengths=None, pack=1, block_n=None, num_warps=None,
                                  num_stages=None):
    """Forward only, Nq <= MAX_QUERIES, for caches of up to SHORT_CACHE keys (any length works). Arguments
    and result as attention_decode.entmax_attention_decode; `pack` (query heads a program handles, a divisor
    of the group with pack * Nq <= MAX_QUERIES, e.g. heads_per_program's) defaults to 1, a program per head
    (see the module docstring). Tuning knobs (None: tuned_launch's for caches of >= TUNED_CACHE keys, else
    the untuned defaults): `block_n` keys a K and V tile (a power of two >= 16; untuned 128 keys at head dims
    <= 64, else 64), `num_warps` (a power of two, 1-32; untuned threshold_tile's) and `num_stages` (>= 1,
    the software pipelining of the two key loops; untuned Triton's, 3)."""
    if block_n is not None and (block_n < 16 or block_n & (block_n - 1)):
        raise ValueError(f"block_n must be a power of two >= 16, not {block_n}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, not {num_warps}")
    if num_stages is not None and num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, not {num_stages}")
    batch, heads, n_q, dim = q.shape
    _, kv_heads, n_k, _ = k.shape
    group = heads // kv_heads
    block_d = max(16, next_power_of_2(dim))
    tuned = tuned_launch(block_d, group, n_k, q.element_size())
    if tuned is not None:
        block_n = tuned[0] if block_n is None else block_n
        num_warps = tuned[1] if num_warps is None else num_warps
        num_stages = tuned[2] if num_stages is None else num_stages
    if block_n is None:
        block_n = 128 if block_d <= 64 else 64  # K and V tiles of 16 KB in bf16
    s_stride = cdiv(n_k, block_n) * block_n  # the score rows hold whole tiles
    rows = next_power_of_2(pack * n_q)
    tile, warps = threshold_tile(rows * s_stride)  # the rows x keys threshold tile, at most 3 variants per Nq
    launch = dict(num_warps=warps if num_warps is None else num_warps)
    if num_stages is not None:
        launch["num_stages"] = num_stages
    solve_block = tile // rows
    n_rows = batch * heads * n_q
    row_region = aligned(n_rows)
    work, out, tau, support = decode_buffers(q, 2 * row_region + n_rows * s_stride)
    _decode_short[(batch * heads // pack,)](
        q, k, v, out, tau, support, work, q_scale if q_scale is not None else tau,
        slopes if slopes is not None else tau, kpm if kpm is not None else support,
        lengths if lengths is not None else support,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        heads // pack, pack, group, n_q, n_k, s_stride, row_region, dim, scale,
        *logit_constants(mode, alpha),
        2.0 - alpha, tol, max_iter,
        ROWS=rows, BLOCK_M=MAX_QUERIES, BLOCK_N=block_n, BLOCK_D=block_d, SOLVE_BLOCK=solve_block,
        RESIDENT=s_stride <= solve_block, CAUSAL=causal, HAS_ALIBI=slopes is not None,
        HAS_QSCALE=q_scale is not None, HAS_KPM=kpm is not None, HAS_LENGTHS=lengths is not None, MODE=mode,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch)
    return out, tau, support
