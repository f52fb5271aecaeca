"""Entmax attention for a few queries against a grouped key cache (decoding with GQA), in one launch.

Layout (batch, heads, seq, head_dim); arXiv:2506.16640, section 2 with the semantics of attention_fwd.py:
z = q_scale * scale * q.k - slope * |pos(r) - j|, p = alpha-entmax(z) (softmax when alpha = 1), out = p @ v,
query head h reading KV head h // group. The one-launch kernel of attention_decode_short.py reads a KV head
once per query head; with its heads packed it reads it once per group but leaves only B * Hkv programs, each
streaming the whole cache; the split path of attention_decode.py has both but takes two or three launches.
Here a program handles one (chunk of keys, pack of the query heads sharing a KV head: attention_common.
heads_per_program, the whole group while group * Nq <= 16, as rows of one score tile), on a grid of
(chunks, B * H / pack) with about GROUPED_PROGRAMS_PER_SM programs a multiprocessor:

1. every program writes the scores s = c * z of its chunk for the pack's rows into the fp32 scratch (-inf on
   hidden keys and on the padding up to whole chunks) and the chunk's row maxima, then adds 1 to the pack's
   arrival counter (atomic, acq_rel at GPU scope: its stores are visible to whoever sees the count);
2. the program that arrives last (the count before its add is chunks - 1; no program ever waits for
   another, so any number of them may be resident) resets the counter to 0 for the next call, finds the
   thresholds of the pack's rows over all stored scores (attention_common.solve_rows: the bracketing passes
   of attention_fwd.py, the same as on the other paths) and
3. streams V once for the pack: out = sum_j p_j v_j / Z, loading only the V rows whose weight is nonzero in
   some row of the pack (a sparse entmax row reads its support's values; softmax reads every visible key).

So K is read once per pack spread over the chunks' programs, V once per pack by one program. The counters
live in a per-device ring (arrival_counters) zeroed once when allocated: each call takes the next B * H /
pack slots, so calls that overlap in time on different streams use different counters (unless the ring
wraps around between them: COUNTER_RING / (B * H / pack) calls), and each call leaves its slots at 0.
Forward only, Nq <= MAX_QUERIES; attention_decode.entmax_attention_decode picks this path for grouped caches
whose pack rows x keys are at most GROUPED_SCORES (attention_decode.decode_path).
"""

import functools

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
    solve_rows,
    stored_score_tile,
    threshold_tile,
    weighted_values_tile,
)

GROUPED_PROGRAMS_PER_SM = 2  # the chunk count aims at this many programs a multiprocessor
MIN_CHUNK = 128  # fewest keys a program scores
INTERPRETER_SMS = 132  # the multiprocessors assumed off CUDA (the interpreter): an H200's
COUNTER_RING = 1 << 16  # arrival counters a device's ring holds (at least; 256 KB)


@triton.jit(do_not_specialize=["n_q", "n_k", "n_chunks", "chunk", "s_stride", "max_offset", "inv_z_offset",
                               "count_slot", "max_iter"])
def _decode_grouped(
    Q, K, V, Out, Tau, Support, Work, Counts, QScale, Slopes, KPM,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
    n_packs, pack, group, n_q, n_k, n_chunks, chunk, s_stride, max_offset, inv_z_offset, count_slot,
    head_dim, scale, bias_mult, inv_am1, two_minus_alpha, tol, max_iter,
    ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SOLVE_BLOCK: tl.constexpr, RESIDENT: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr, MODE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Chunk pid_c (keys pid_c * chunk + [0, chunk)) of pack pid_p (packed_queries' rows). Scratch Work:
    scores at [row * s_stride + j], chunk maxima at [max_offset + row * n_chunks + c], 1 / Z at
    [inv_z_offset + row]. Counts[count_slot + pid_p]: the pack's arrivals, 0 before and after the launch."""
    pid_c = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = (pid_p // n_packs).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim

    # 1. this chunk's scores and row maxima, then the arrival
    q, s_mult, slope, pos_m, rows, row_in, first_head = packed_queries(
        Q, QScale, Slopes, pid_p, sqb, sqh, sqm, n_packs, pack, n_q, n_k, head_dim, scale, bias_mult,
        BLOCK_M, BLOCK_D, HAS_ALIBI, HAS_QSCALE)
    kv_head = first_head // group
    k_base = K + b * skb + kv_head * skh
    s_rows = Work + rows[:, None] * s_stride
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start in range(0, chunk, BLOCK_N):
        offs_n = pid_c * chunk + start + tl.arange(0, BLOCK_N)
        m = tl.maximum(m, stored_score_tile(q, k_base, skn, offs_n, offs_d, d_in, s_mult, pos_m, slope,
                                            KPM + b * n_k, n_k, s_rows, row_in, CAUSAL, HAS_ALIBI, HAS_KPM,
                                            DOT_PRECISION))
    tl.store(Work + max_offset + rows * n_chunks + pid_c, m, mask=row_in)
    tl.debug_barrier()  # every thread's scores are stored before the arrival is counted (release)
    arrived = tl.atomic_add(Counts + count_slot + pid_p, 1, sem="acq_rel", scope="gpu")
    if arrived == n_chunks - 1:  # the last of the pack: every chunk's scores are stored (acquire)
        tl.store(Counts + count_slot + pid_p, 0)

        # 2. thresholds of the pack's rows over all its chunks, on a tile of ROWS rows
        offs_r = tl.arange(0, ROWS)
        solve_rows(Work, Tau, Support, pid_p * pack * n_q + offs_r, offs_r < pack * n_q, s_stride, max_offset,
                   inv_z_offset, n_chunks, inv_am1, two_minus_alpha, tol, max_iter, ROWS, 32, SOLVE_BLOCK,
                   RESIDENT, MODE)
        tl.debug_barrier()  # the rows' tau and 1 / Z, stored in the ROWS layout, are read in the BLOCK_M one

        # 3. output over the whole cache, V rows of nonzero weight only
        tau = tl.load(Tau + rows, mask=row_in, other=float("inf"))
        inv_z = tl.load(Work + inv_z_offset + rows, mask=row_in, other=0.0)
        v_base = V + b * svb + kv_head * svh
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start in range(0, s_stride, BLOCK_N):
            acc = weighted_values_tile(acc, s_rows, start + tl.arange(0, BLOCK_N), row_in, tau, v_base, svn,
                                       offs_d, d_in, n_k, inv_am1, MODE, DOT_PRECISION, True)
        out = (acc * inv_z[:, None]).to(Out.dtype.element_ty)
        tl.store(Out + rows[:, None] * head_dim + offs_d[None, :], out, mask=row_in[:, None] & d_in[None, :])


@functools.cache
def multiprocessors(device):
    """Streaming multiprocessors of `device` (INTERPRETER_SMS off CUDA)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def grouped_chunk(n_k, n_packs, sms, block_n):
    """Keys a program of _decode_grouped scores: the cache cut into about GROUPED_PROGRAMS_PER_SM * sms /
    n_packs chunks (one at least), each a multiple of the key tile block_n and at least MIN_CHUNK keys."""
    chunks = max(1, GROUPED_PROGRAMS_PER_SM * sms // n_packs)
    return max(MIN_CHUNK, cdiv(cdiv(n_k, chunks), block_n) * block_n)


_rings = {}  # device -> [int32 counters (all 0 between calls), the next free slot]


def arrival_counters(device, n):
    """(counters, first slot) of n arrival counters of `device` for one launch, all 0: the next n slots of
    the device's ring (from slot 0 again where fewer are left). The ring is zeroed once when allocated (a
    torch.zeros launch), the launch's last arrivers reset their slots; so it must be allocated outside a
    CUDA graph capture (RuntimeError), where torch.zeros would not run until the graph is replayed."""
    ring = _rings.get(device)
    if ring is None or ring[0].numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("grouped entmax decoding allocates its arrival counters on its first call on "
                               "a device: make one call before capturing a CUDA graph")
        ring = _rings[device] = [torch.zeros(max(COUNTER_RING, 2 * n), dtype=torch.int32, device=device), 0]
    counters, slot = ring
    if slot + n > counters.numel():
        slot = 0
    ring[1] = slot + n
    return counters, slot


def entmax_attention_decode_grouped(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, tol,
                                    max_iter, chunk=None):
    """Forward only, Nq <= MAX_QUERIES, any cache length (grouped or not: a pack of one head when the group
    is 1). Arguments and result as attention_decode.entmax_attention_decode; `chunk` keys a program (a
    multiple of the key tile, 128 keys up to head dim 64, else 64: K and V tiles of 16 KB in bf16, as in
    attention_decode_short.py; default grouped_chunk's). num_warps: threshold_tile's for a pack's rows x
    padded cache."""
    batch, heads, n_q, dim = q.shape
    _, kv_heads, n_k, _ = k.shape
    group = heads // kv_heads
    pack = heads_per_program(group, n_q)
    n_packs = batch * heads // pack
    device = q.device
    block_d = max(16, next_power_of_2(dim))
    block_n = 128 if block_d <= 64 else 64
    if chunk is None:
        chunk = grouped_chunk(n_k, n_packs, multiprocessors(device), block_n)
    n_chunks = cdiv(n_k, chunk)
    s_stride = n_chunks * chunk
    rows = next_power_of_2(pack * n_q)
    tile, warps = threshold_tile(rows * s_stride)
    n_rows = batch * heads * n_q
    # workspace: scores (n_rows, s_stride) | chunk maxima (n_rows, n_chunks) | 1 / Z (n_rows,)
    max_offset = n_rows * s_stride
    inv_z_offset = max_offset + aligned(n_rows * n_chunks)
    work, out, tau, support = decode_buffers(q, inv_z_offset + n_rows)
    counters, slot = arrival_counters(device, n_packs)
    _decode_grouped[(n_chunks, n_packs)](
        q, k, v, out, tau, support, work, counters, q_scale if q_scale is not None else tau,
        slopes if slopes is not None else tau, kpm if kpm is not None else support,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        heads // pack, pack, group, n_q, n_k, n_chunks, chunk, s_stride, max_offset, inv_z_offset, slot, dim,
        scale, *logit_constants(mode, alpha), 2.0 - alpha, tol, max_iter,
        ROWS=rows, BLOCK_M=MAX_QUERIES, BLOCK_N=block_n, BLOCK_D=block_d,
        SOLVE_BLOCK=tile // rows, RESIDENT=s_stride <= tile // rows, CAUSAL=causal,
        HAS_ALIBI=slopes is not None, HAS_QSCALE=q_scale is not None, HAS_KPM=kpm is not None, MODE=mode,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=warps)
    return out, tau, support
