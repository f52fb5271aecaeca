"""Fused entmax attention backward kernels (arXiv:2506.16640, section 2) and their launcher.

Layout (batch, heads, seq, head_dim). The forward saved per row tau (s units), 1/Z and delta's ingredient
o2, so p is recomputed tile by tile as p = [s - tau]_+^(1/(alpha-1)) / Z (softmax: exp2(s - tau)).
The alpha-entmax Jacobian is diag(g) - g g^T / sum g with g = p^(2-alpha) on the support, hence

    dz_ij = g_ij (dO_i . v_j - delta_i),   delta_i = sum_j g_ij dO_i . v_j / sum_j g_ij = dO_i . o2_i,

and z = q_scale * scale * q.k + bias gives dq_i = q_scale_i scale sum_j dz_ij k_j,
dk_j = scale sum_i q_scale_i dz_ij q_i, dv_j = sum_i p_ij dO_i, dq_scale_i = scale q_i . sum_j dz_ij k_j.
Two kernels (as FlashAttention-2): one per query block for dq and dq_scale, which first computes its rows'
delta = dO . o2 and stores it, then one per key block for dk, dv (looping over the query heads of its
GQA group), which reads those deltas. dO is read through its strides (only its last dimension must be
dense). A tile whose forward max is <= tau on every row of the query block is all zeros: loops run over the
range of live tiles only (attention_common.live_range).
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.attention_common import (
    causal_key_end,
    cdiv,
    entmax_power,
    entmax_slope,
    full_tiles,
    live_range,
    load_tile,
    logit_constants,
    logits_from_dot,
    next_power_of_2,
    row_multiplier,
    tile_logits,
)


@triton.jit
def _probs(s, tau, inv_z, g_scale, inv_am1, MODE: tl.constexpr):
    """(p, g): the attention weights and their Jacobian weights p^(2-alpha) for one tile."""
    if MODE == 0:
        p = tl.exp2(s - tau[:, None])
        g = p
    else:
        u = tl.maximum(s - tau[:, None], 0.0)
        p = entmax_power(u, inv_am1, MODE) * inv_z[:, None]
        g = entmax_slope(u, inv_am1, MODE) * g_scale[:, None]
    return p, g


@triton.jit
def _dkdv_tiles(Q, DO, Tau, InvZ, GScale, Delta, QScale, kt, v, dk, dv, offs_m0, offs_n, offs_d, d_in, b, h,
                bh, sqb, sqh, sqm, sdob, sdoh, sdom, n_q, n_k, scale, bias_mult, inv_am1, slope, kpm_ptr,
                qb_lo, qb_hi,
                BLOCK_M: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
                HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """dk, dv of one key block accumulated over the query blocks [qb_lo, qb_hi) of query head h. Rows past
    n_q load tau = +inf, hence p = g = 0: only keys need masking (MASKED, see full_tiles)."""
    for qb in range(qb_lo, qb_hi):
        offs_m = qb * BLOCK_M + offs_m0
        row_in = offs_m < n_q
        row_ptr = bh * n_q + offs_m
        tau = tl.load(Tau + row_ptr, mask=row_in, other=float("inf"))
        pos_m = offs_m + (n_k - n_q)
        q = load_tile(Q + b * sqb + h * sqh, offs_m, sqm, offs_d, n_q, d_in, False, True, EVEN_D)
        do = load_tile(DO + b * sdob + h * sdoh, offs_m, sdom, offs_d, n_q, d_in, False, True, EVEN_D)
        z_mult = row_multiplier(QScale, row_ptr, row_in, scale, BLOCK_M, HAS_QSCALE)
        s = tile_logits(q, kt, z_mult * bias_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI,
                        HAS_KPM, DOT_PRECISION, MASKED)
        inv_z = tl.load(InvZ + row_ptr, mask=row_in, other=0.0)
        g_scale = tl.load(GScale + row_ptr, mask=row_in, other=0.0)
        delta = tl.load(Delta + row_ptr, mask=row_in, other=0.0)
        p, g = _probs(s, tau, inv_z, g_scale, inv_am1, MODE)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        dz = g * (dp - delta[:, None]) * z_mult[:, None]
        dk += tl.dot(tl.trans(dz.to(q.dtype)), q, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["n_q", "n_k", "n_qb", "n_kb"])
def _entmax_attention_bwd_dkdv(
    Q, K, V, DO, DK, DV, Tau, InvZ, GScale, Delta, TileMax, BlockTauMin, QScale, Slopes, KPM,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
    n_heads, group, n_q, n_k, n_qb, n_kb, head_dim, scale, bias_mult, inv_am1,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SCAN: tl.constexpr, EVEN_D: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
    n_kv_heads = n_heads // group
    b = pid_bk // n_kv_heads
    hk = pid_bk % n_kv_heads
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim
    kv_mask = (offs_n[:, None] < n_k) & d_in[None, :]
    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
    kt = tl.trans(k)
    kpm_ptr = KPM + b * n_k
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    qb_first = 0  # first query block that may see this key block
    if CAUSAL:
        first_row = start_n - (n_k - n_q)
        if first_row > 0:
            qb_first = first_row // BLOCK_M
    for j in range(0, group):
        h = hk * group + j
        bh = b * n_heads + h
        slope = 0.0
        if HAS_ALIBI:
            slope = tl.load(Slopes + bh) * bias_mult
        qb_lo = qb_first
        qb_hi = n_qb
        if MODE != 0:
            column = TileMax + (bh * n_qb + qb_first) * n_kb + pid_n  # tiles (qb, pid_n), qb >= qb_first
            first, last = live_range(column, n_kb, n_qb - qb_first, 0.0, BlockTauMin + bh * n_qb + qb_first,
                                     True, SCAN)
            qb_lo = qb_first + first
            qb_hi = qb_first + last
        # query blocks that cross the causal diagonal need the mask, the later ones do not (all need it when
        # the key block runs past n_k)
        qb_split = qb_lo
        if start_n + BLOCK_N > n_k:
            qb_split = qb_hi
        elif CAUSAL:
            first_unmasked = tl.cdiv(start_n + BLOCK_N - 1 - (n_k - n_q), BLOCK_M)
            qb_split = tl.minimum(tl.maximum(qb_lo, first_unmasked), qb_hi)
        dk, dv = _dkdv_tiles(Q, DO, Tau, InvZ, GScale, Delta, QScale, kt, v, dk, dv, offs_m0, offs_n, offs_d,
                             d_in, b, h, bh, sqb, sqh, sqm, sdob, sdoh, sdom, n_q, n_k, scale, bias_mult,
                             inv_am1, slope, kpm_ptr, qb_lo, qb_split, BLOCK_M, MODE, CAUSAL, HAS_ALIBI,
                             HAS_QSCALE, HAS_KPM, DOT_PRECISION, True, EVEN_D)
        dk, dv = _dkdv_tiles(Q, DO, Tau, InvZ, GScale, Delta, QScale, kt, v, dk, dv, offs_m0, offs_n, offs_d,
                             d_in, b, h, bh, sqb, sqh, sqm, sdob, sdoh, sdom, n_q, n_k, scale, bias_mult,
                             inv_am1, slope, kpm_ptr, qb_split, qb_hi, BLOCK_M, MODE, CAUSAL, HAS_ALIBI,
                             HAS_QSCALE, HAS_KPM, DOT_PRECISION, False, EVEN_D)
    out_mask = (offs_n[:, None] < n_k) & d_in[None, :]
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=out_mask)
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=out_mask)


@triton.jit
def _dq_tiles(q, do, k_base, v_base, skn, svn, acc, dqs, offs_n0, offs_d, d_in, s_mult, pos_m, slope,
              kpm_ptr, n_k, tau, inv_z, g_scale, delta, inv_am1, kb_lo, kb_hi,
              BLOCK_N: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr,
              MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """acc += dz @ k and dqs += rowsum(dz * q.k) (dqs * scale: the gradient of q_scale) over the key tiles
    [kb_lo, kb_hi) of one query block."""
    for kb in range(kb_lo, kb_hi):
        offs_n = kb * BLOCK_N + offs_n0
        k = load_tile(k_base, offs_n, skn, offs_d, n_k, d_in, False, MASKED, EVEN_D)
        v = load_tile(v_base, offs_n, svn, offs_d, n_k, d_in, False, MASKED, EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = logits_from_dot(qk, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                            MASKED)
        p, g = _probs(s, tau, inv_z, g_scale, inv_am1, MODE)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        dz = g * (dp - delta[:, None])
        acc += tl.dot(dz.to(k.dtype), k, input_precision=DOT_PRECISION)
        if HAS_QSCALE:  # in fp32 from the fp32 q.k tile: sum_j dz_j = 0 makes this a cancelling sum
            dqs += tl.sum(dz * qk, 1)
    return acc, dqs


@triton.jit(do_not_specialize=["n_q", "n_k", "n_kb"])
def _entmax_attention_bwd_dq(
    Q, K, V, DO, O2, DQ, DQScale, Tau, InvZ, GScale, Delta, TileMax, BlockTauMin, QScale, Slopes, KPM,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdqb, sdqh, sdqm,
    n_heads, group, n_q, n_k, n_kb, head_dim, scale, bias_mult, inv_am1,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MODE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_QSCALE: tl.constexpr, HAS_KPM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SCAN: tl.constexpr, EVEN_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    hk = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < head_dim
    row_in = offs_m < n_q
    pos_m = offs_m + (n_k - n_q)
    row_ptr = pid_bh * n_q + offs_m
    q = load_tile(Q + b * sqb + h * sqh, offs_m, sqm, offs_d, n_q, d_in, False, True, EVEN_D)
    do = load_tile(DO + b * sdob + h * sdoh, offs_m, sdom, offs_d, n_q, d_in, False, True, EVEN_D)
    z_mult = row_multiplier(QScale, row_ptr, row_in, scale, BLOCK_M, HAS_QSCALE)
    s_mult = z_mult * bias_mult
    tau = tl.load(Tau + row_ptr, mask=row_in, other=float("inf"))
    inv_z = tl.load(InvZ + row_ptr, mask=row_in, other=0.0)
    g_scale = tl.load(GScale + row_ptr, mask=row_in, other=0.0)
    o2 = tl.load(O2 + row_ptr[:, None] * head_dim + offs_d[None, :], mask=row_in[:, None] & d_in[None, :],
                 other=0.0)
    delta = tl.sum(do.to(tl.float32) * o2, 1)  # fp32 (o2 is), for this kernel and the dk, dv kernel
    tl.store(Delta + row_ptr, delta, mask=row_in)
    tau_min = tl.min(tau, 0)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Slopes + pid_bh) * bias_mult
    kpm_ptr = KPM + b * n_k
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    tiles = TileMax + (pid_bh * tl.num_programs(0) + pid_m) * n_kb
    kb_lo = 0
    kb_hi = tl.cdiv(causal_key_end(pid_m, n_q, n_k, BLOCK_M, CAUSAL), BLOCK_N)
    if MODE != 0:
        kb_lo, kb_hi = live_range(tiles, 1, kb_hi, tau_min, tiles, False, SCAN)
    n_full = full_tiles(pid_m * BLOCK_M + n_k - n_q, n_k, BLOCK_N, CAUSAL)  # tiles [0, n_full) need no mask
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dqs = tl.zeros([BLOCK_M], tl.float32)
    acc, dqs = _dq_tiles(q, do, k_base, v_base, skn, svn, acc, dqs, offs_n0, offs_d, d_in, s_mult, pos_m,
                         slope, kpm_ptr, n_k, tau, inv_z, g_scale, delta, inv_am1, kb_lo,
                         tl.minimum(kb_hi, n_full), BLOCK_N, MODE, CAUSAL, HAS_ALIBI, HAS_QSCALE, HAS_KPM,
                         DOT_PRECISION, False, EVEN_D)
    acc, dqs = _dq_tiles(q, do, k_base, v_base, skn, svn, acc, dqs, offs_n0, offs_d, d_in, s_mult, pos_m,
                         slope, kpm_ptr, n_k, tau, inv_z, g_scale, delta, inv_am1, tl.maximum(kb_lo, n_full),
                         kb_hi, BLOCK_N, MODE, CAUSAL, HAS_ALIBI, HAS_QSCALE, HAS_KPM, DOT_PRECISION, True,
                         EVEN_D)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :],
             (acc * z_mult[:, None]).to(DQ.dtype.element_ty), mask=row_in[:, None] & d_in[None, :])
    if HAS_QSCALE:
        tl.store(DQScale + row_ptr, scale * dqs, mask=row_in)


def resampled_tile_table(tile_max, table_blocks, blocks, n_q, n_k):
    """The forward's tile table (B, H, n_qb, n_kb) of (BLOCK_M, BLOCK_N) = table_blocks, at the tiles
    `blocks` (powers of two, as the table's) of a backward kernel: each entry the max over the table's
    tiles that overlap that tile, which bounds the tile's max from above (all that live_range needs).
    Entries the forward left unwritten (tiles no row of their query block can see: NaN-poisoned in the
    tests) are read as -inf; a coarser tile never consists of those alone within its kernel's loops."""
    if tuple(blocks[:2]) == tuple(table_blocks[:2]):
        return tile_max
    table = tile_max
    for axis, (fine, tile, n) in enumerate(zip(table_blocks[:2], blocks[:2], (n_q, n_k), strict=True)):
        dim = 2 + axis
        if tile > fine:
            ratio = tile // fine
            size = table.shape[dim]
            pad = [0, 0] * (3 - dim) + [0, cdiv(size, ratio) * ratio - size]
            table = torch.nn.functional.pad(table.nan_to_num(float("-inf")), pad, value=float("-inf"))
            table = table.unflatten(dim, (-1, ratio)).amax(dim + 1)
        elif tile < fine:
            table = table.repeat_interleave(fine // tile, dim).narrow(dim, 0, cdiv(n, tile))
    return table.contiguous()


def entmax_attention_bwd(do, q, k, v, o2, tau, inv_z, tile_max, *, mode, alpha, scale, causal, slopes,
                         q_scale, kpm, blocks, backward_blocks):
    """Gradients (dq, dk, dv, dq_scale or None) of the fused forward; arguments as its launcher returned
    (blocks: the forward's, the tile table's granularity). backward_blocks: (BLOCK_M, BLOCK_N, num_warps,
    num_stages) of the dq kernel and of the dk/dv kernel (attention_common.kernel_blocks)."""
    batch, heads, n_q, dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    dq_blocks, dkdv_blocks = backward_blocks
    c, inv_am1 = logit_constants(mode, alpha)
    if do.stride(-1) != 1:
        do = do.contiguous()
    delta = torch.empty(batch, heads, n_q, device=q.device, dtype=torch.float32)  # the dq kernel fills it
    g_scale = inv_z if mode == 0 else inv_z ** (2.0 - alpha)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dq_scale = torch.empty(batch, heads, n_q, device=q.device, dtype=torch.float32) if q_scale is not None \
        else None
    dummy = tau
    block_d = max(16, next_power_of_2(dim))

    def options(kernel_blocks):
        block_m, block_n, num_warps, num_stages = kernel_blocks
        return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, EVEN_D=block_d == dim, MODE=mode,
                    CAUSAL=causal, HAS_ALIBI=slopes is not None, HAS_QSCALE=q_scale is not None,
                    HAS_KPM=kpm is not None, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                    SCAN=512, num_warps=num_warps, num_stages=num_stages)

    tables = {}  # tile shape -> the resampled table: made once when both kernels share a shape (D = 128)

    def extras(kernel_blocks, block_tau_min):
        tile = tuple(kernel_blocks[:2])
        if tile not in tables:
            tables[tile] = resampled_tile_table(tile_max, blocks, kernel_blocks, n_q, n_k)
        table = tables[tile]
        return (table, block_tau_min, q_scale if q_scale is not None else dummy,
                slopes if slopes is not None else dummy, kpm if kpm is not None else table)

    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    n_qb, n_kb = cdiv(n_q, dq_blocks[0]), cdiv(n_k, dq_blocks[1])
    _entmax_attention_bwd_dq[(n_qb, batch * heads)](
        q, k, v, do, o2, dq, dq_scale if dq_scale is not None else dummy, tau, inv_z, g_scale, delta,
        *extras(dq_blocks, dummy), *strides, dq.stride(0), dq.stride(1), dq.stride(2),
        heads, group, n_q, n_k, n_kb, dim, scale, c, inv_am1, **options(dq_blocks))
    block_m = dkdv_blocks[0]
    n_qb, n_kb = cdiv(n_q, block_m), cdiv(n_k, dkdv_blocks[1])
    block_tau_min = torch.nn.functional.pad(tau, (0, n_qb * block_m - n_q), value=float("inf")).view(
        batch, heads, n_qb, block_m).amin(-1).contiguous()  # the lowest tau of each of its query blocks
    _entmax_attention_bwd_dkdv[(n_kb, batch * kv_heads)](
        q, k, v, do, dk, dv, tau, inv_z, g_scale, delta, *extras(dkdv_blocks, block_tau_min), *strides,
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        heads, group, n_q, n_k, n_qb, n_kb, dim, scale, c, inv_am1, **options(dkdv_blocks))
    return dq, dk, dv, dq_scale
