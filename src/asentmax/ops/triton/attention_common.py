"""Shared Triton helpers of the fused entmax attention kernels (forward and backward).

Layout (batch, heads, seq, head_dim). The kernels work in "s units": s = c * z with z the attention logit of
arXiv:2506.16640, section 2 (z = q_scale * scale * q.k - slope * |pos(r) - j|) and c = alpha - 1 for entmax
(p = [s - tau]_+^(1/(alpha-1))) or c = log2(e) for softmax (p = exp2(s - tau)). `MODE` picks the
normaliser at compile time: 0 softmax, 1 entmax-1.5 (p = u^2), 2 sparsemax (p = u), 3 any other alpha.

Names: the per-query inverse temperature (the paper's theta) is `q_scale` in Python and the pointer `QScale`
in the kernels; z_mult = scale * q_scale is the factor of q.k in z, s_mult = c * z_mult its factor in s.
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.limits import MAX_QUERIES

MODE_SOFTMAX, MODE_ENTMAX15, MODE_SPARSEMAX, MODE_GENERAL = 0, 1, 2, 3


# Host-side integer helpers of the launchers. triton.cdiv / triton.next_power_of_2 are constexpr functions
# in triton 3.6, about 2 us a host call: at short decoding caches, a noticeable part of a step.
def cdiv(n, d):
    """ceil(n / d) for ints n >= 0, d > 0."""
    return -(-n // d)


def next_power_of_2(n):
    """The smallest power of two >= n, for ints n >= 1."""
    return 1 << (n - 1).bit_length()


# Threshold passes of the decoding kernels over stored score rows: (BLOCK, num_warps), 8 or 16 scores a
# thread. The smallest tile that holds the scores keeps them in registers, else the largest streams them;
# two sizes only, so a growing cache compiles few variants.
THRESHOLD_TILES = ((1024, 4), (4096, 8))
WORKSPACE_ALIGN = 32  # workspace regions start at multiples of 32 floats (128 bytes)


def threshold_tile(n_scores):
    """(BLOCK, num_warps) of THRESHOLD_TILES for a pass over `n_scores` stored scores."""
    small, large = THRESHOLD_TILES
    return small if n_scores <= small[0] else large


def aligned(n):
    """n floats rounded up to a whole WORKSPACE_ALIGN region."""
    return cdiv(n, WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def decode_buffers(q, workspace_floats):
    """(fp32 workspace, out (B, H, Nq, D) in q.dtype, tau (B, H, Nq) fp32, support (B, H, Nq) int32) of a
    decoding launcher. The kernels index the workspace with int32 (fewer registers than int64), so a larger
    one is refused (ValueError), not silently wrong."""
    if workspace_floats >= 2**31:
        raise ValueError(f"decoding workspace of {workspace_floats} floats (batch * heads * q_len * cache) "
                         "exceeds 2^31; split the batch")
    batch, heads, n_q, dim = q.shape
    dev = q.device
    return (torch.empty(workspace_floats, device=dev, dtype=torch.float32),
            torch.empty(batch, heads, n_q, dim, device=dev, dtype=q.dtype),
            torch.empty(batch, heads, n_q, device=dev, dtype=torch.float32),
            torch.empty(batch, heads, n_q, device=dev, dtype=torch.int32))


def heads_per_program(group, n_q):
    """How many of a KV head's `group` query heads one decoding program handles: all of them when their
    group * n_q query rows fit the MAX_QUERIES rows of a score tile (then the program reads its K and V once
    for the whole group, as SDPA does), else the largest divisor of `group` whose rows fit (1 always does,
    n_q <= MAX_QUERIES). 1 for multi-head attention (group = 1)."""
    if group * n_q <= MAX_QUERIES:  # the common case, without the search (host time of a decoding step)
        return group
    return max(p for p in range(1, group) if group % p == 0 and p * n_q <= MAX_QUERIES)


def mode_of(alpha):
    """Compile-time normaliser id for `alpha` (>= 1)."""
    if alpha == 1.0:
        return MODE_SOFTMAX
    if alpha == 1.5:
        return MODE_ENTMAX15
    if alpha == 2.0:
        return MODE_SPARSEMAX
    return MODE_GENERAL


def logit_constants(mode, alpha):
    """(c, inv_am1) of the launchers: c scales the logits z into the kernels' score units s = c z (log2 e for
    softmax, whose kernels use exp2; alpha - 1 for entmax) and inv_am1 = 1 / (alpha - 1) is entmax's power
    (1 for softmax, unused)."""
    if mode == MODE_SOFTMAX:
        return 1.4426950408889634, 1.0
    return alpha - 1.0, 1.0 / (alpha - 1.0)


# Tile shapes (BLOCK_M, BLOCK_N, num_warps, num_stages) of the fused kernels per head dim: the largest head
# dim of each entry -> (forward, dq kernel, dk/dv kernel). The backward kernels read the forward's tile
# table resampled to their own tiles (attention_bwd.resampled_tile_table), so each kernel's shape is free
# (powers of two). benchmarks/tune_attention_gpu.py sweeps them: D = 128 per kernel in
# results/attention_tuning4.md, D = 64 (one shape for all three) in results/attention_tuning2.md; D = 256
# has no sweep in results/.
KERNEL_BLOCKS = {
    64: ((64, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 3)),
    128: ((64, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 2)),
    256: ((32, 32, 8, 1), (32, 32, 8, 1), (32, 32, 8, 1)),
}
SHORT_BLOCKS = (16, 64, 4, 2)  # n_q <= 16 (decoding-sized query blocks), every head dim and kernel


def kernel_blocks(head_dim, n_q):
    """(forward, dq, dkdv) tile shapes of KERNEL_BLOCKS for `head_dim` (<= 256) and n_q queries. Keyed on
    head_dim only (and decoding), never on the length."""
    if n_q <= 16:
        return SHORT_BLOCKS, SHORT_BLOCKS, SHORT_BLOCKS
    for largest_dim, blocks in KERNEL_BLOCKS.items():  # in increasing head dims
        if head_dim <= largest_dim:
            return blocks
    raise ValueError(f"head_dim {head_dim} is above the fused kernels' {max(KERNEL_BLOCKS)}")


def forward_blocks(head_dim, n_q):
    """The forward's (BLOCK_M, BLOCK_N, num_warps, num_stages) of kernel_blocks: also the granularity of the
    tile table it writes."""
    return kernel_blocks(head_dim, n_q)[0]


@triton.jit
def packed_queries(Q, QScale, Slopes, pid, sqb, sqh, sqm, n_packs, pack, n_q, n_k, head_dim, scale, bias_mult,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ALIBI: tl.constexpr,
                   HAS_QSCALE: tl.constexpr):
    """The query tile of decoding program `pid`: `pack` heads (heads_per_program) of one batch row, all of
    one KV head, with their n_q queries each, as pack * n_q <= BLOCK_M rows (row r: head r // n_q, query
    r % n_q). Programs run over (batch, n_packs = heads // pack); rows of a program are consecutive in the
    flat (batch, head, query) order of q_scale, tau and the output, from pid * pack * n_q.

    Returns q (BLOCK_M, BLOCK_D) (0 on the padding rows), s_mult (BLOCK_M,) = c * scale * q_scale of each
    row, slope = c * m_h of each row's head as a (BLOCK_M, 1) column (0.0 without ALiBi), the rows'
    positions pos_m (BLOCK_M,) (queries sit at the last n_q of n_k positions), their flat indices `rows`,
    row_in (the rows that exist) and the pack's first head."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = offs_m < pack * n_q
    rows = pid * pack * n_q + offs_m
    head_in_pack = offs_m // n_q
    query = offs_m % n_q
    first_head = (pid % n_packs) * pack
    q_rows = Q + (pid // n_packs).to(tl.int64) * sqb + (first_head + head_in_pack) * sqh + query * sqm
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=row_in[:, None] & (offs_d < head_dim)[None, :],
                other=0.0)
    s_mult = row_multiplier(QScale, rows, row_in, scale, BLOCK_M, HAS_QSCALE) * bias_mult
    slope = 0.0
    if HAS_ALIBI:  # Slopes (batch, heads): pid * pack is the flat index of the pack's first head
        slope = (tl.load(Slopes + pid * pack + head_in_pack, mask=row_in, other=0.0) * bias_mult)[:, None]
    return q, s_mult, slope, query + (n_k - n_q), rows, row_in, first_head


@triton.jit
def filled_keys(Lengths, b, n_k, HAS_LENGTHS: tl.constexpr):
    """Decoding: the keys batch row b holds, Lengths[b] clamped to [0, n_k] (the filled slots of a cache
    buffer of n_k slots; kv_lengths of entmax_attention), or n_k without HAS_LENGTHS."""
    if HAS_LENGTHS:
        return tl.minimum(tl.maximum(tl.load(Lengths + b).to(tl.int32), 0), n_k)
    return n_k


@triton.jit
def stored_score_tile(q, k_base, skn, offs_n, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, s_rows,
                      row_in, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """Decoding: the scores of key tile offs_n for the rows of packed_queries (tile_logits), stored at
    s_rows + offs_n (rows row_in); returns their row maxima (BLOCK_M,)."""
    kt = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None],
                 mask=(offs_n[None, :] < n_k) & d_in[:, None], other=0.0)
    s = tile_logits(q, kt, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                    DOT_PRECISION)
    row_max = tl.max(s, 1)
    tl.store(s_rows + offs_n[None, :], s, mask=row_in[:, None])
    return row_max


@triton.jit
def weighted_values_tile(acc, s_rows, offs_n, row_in, tau, v_base, svn, offs_d, d_in, n_k, inv_am1,
                         MODE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Decoding: acc + p @ v over key tile offs_n, p = [s - tau]_+^(1/(alpha-1)) (exp2(s - tau) for softmax)
    from the scores stored by stored_score_tile (unnormalised: the caller multiplies by 1 / Z)."""
    s = tl.load(s_rows + offs_n[None, :], mask=row_in[:, None], other=float("-inf"))
    if MODE == 0:
        p = tl.exp2(s - tau[:, None])
    else:
        p = entmax_power(tl.maximum(s - tau[:, None], 0.0), inv_am1, MODE)
    v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :],
                mask=(offs_n[:, None] < n_k) & d_in[None, :], other=0.0)
    return acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)


@triton.jit
def tile_logits(q, kt, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k,
                CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr,
                DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr = True):
    """s = s_mult * (q @ kt) - slope * |pos - j| on visible keys, -inf elsewhere. (BLOCK_M, BLOCK_N) fp32.

    q (BLOCK_M, BLOCK_D), kt (BLOCK_D, BLOCK_N); s_mult (BLOCK_M,) = c * scale * q_scale; slope = c * m_h,
    a scalar or a (BLOCK_M, 1) column of per-row slopes (decoding rows of several heads: packed_queries).
    MASKED=False: the caller guarantees every key of the tile is < n_k and causally visible to every row
    (a tile left of the diagonal, see full_tiles), so only the key padding mask is applied.
    """
    qk = tl.dot(q, kt, input_precision=DOT_PRECISION)
    return logits_from_dot(qk, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                           MASKED)


@triton.jit
def logits_from_dot(qk, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k,
                    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr,
                    MASKED: tl.constexpr = True):
    """tile_logits given the fp32 tile qk = q @ kt."""
    s = qk * s_mult[:, None]
    if HAS_ALIBI:
        s = s - slope * tl.abs(pos_m[:, None] - offs_n[None, :]).to(tl.float32)
    if MASKED:
        visible = (offs_n < n_k)[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= pos_m[:, None])
        if HAS_KPM:
            real = tl.load(kpm_ptr + offs_n, mask=offs_n < n_k, other=0) != 0
            visible = visible & real[None, :]
        s = tl.where(visible, s, float("-inf"))
    elif HAS_KPM:
        s = tl.where((tl.load(kpm_ptr + offs_n) != 0)[None, :], s, float("-inf"))
    return s


@triton.jit
def row_multiplier(QScale, rows, row_in, scale, BLOCK_M: tl.constexpr, HAS_QSCALE: tl.constexpr):
    """scale * q_scale of the query rows `rows` (the factor of q.k in the logit z), fp32 (BLOCK_M,)."""
    z_mult = tl.full([BLOCK_M], 1.0, tl.float32) * scale
    if HAS_QSCALE:
        z_mult = z_mult * tl.load(QScale + rows, mask=row_in, other=1.0).to(tl.float32)
    return z_mult


@triton.jit
def causal_key_end(pid_m, n_q, n_k, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """Keys [0, end) may be visible to query block pid_m (queries sit at the last n_q of n_k positions)."""
    end = n_k
    if CAUSAL:
        rows_after = n_q - (pid_m + 1) * BLOCK_M
        if rows_after > 0:
            end = n_k - rows_after
    return end


@triton.jit
def full_tiles(first_pos, n_k, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Number of leading BLOCK_N key tiles that lie inside [0, n_k) and are causally visible to every query
    at position >= first_pos: on them the logits need no mask (MASKED=False)."""
    n = n_k // BLOCK_N
    if CAUSAL:
        n = tl.minimum(n, (first_pos + 1) // BLOCK_N)
    return n


@triton.jit
def load_tile(base, offs_rows, stride, offs_d, n_rows, d_in, TRANSPOSE: tl.constexpr, MASKED: tl.constexpr,
              EVEN_D: tl.constexpr):
    """Rows offs_rows of a (n_rows, head_dim) matrix with unit last stride, as (rows, BLOCK_D) or, when
    TRANSPOSE, (BLOCK_D, rows). MASKED=False: all rows are < n_rows; EVEN_D: head_dim == BLOCK_D."""
    if TRANSPOSE:
        ptrs = base + offs_rows[None, :] * stride + offs_d[:, None]
        if MASKED:
            tile = tl.load(ptrs, mask=(offs_rows[None, :] < n_rows) & d_in[:, None], other=0.0)
        elif EVEN_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=d_in[:, None], other=0.0)
    else:
        ptrs = base + offs_rows[:, None] * stride + offs_d[None, :]
        if MASKED:
            tile = tl.load(ptrs, mask=(offs_rows[:, None] < n_rows) & d_in[None, :], other=0.0)
        elif EVEN_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=d_in[None, :], other=0.0)
    return tile


@triton.jit
def dot_split(a, b, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr):
    """a @ b for fp32 a and b of a 16-bit dtype: a rounded to that dtype, or (SPLIT) as a hi + lo pair in two
    products, which keeps about 16 of a's mantissa bits instead of 8 (bf16)."""
    hi = a.to(b.dtype)
    prod = tl.dot(hi, b, input_precision=DOT_PRECISION)
    if SPLIT:
        prod += tl.dot((a - hi.to(tl.float32)).to(b.dtype), b, input_precision=DOT_PRECISION)
    return prod


@triton.jit
def entmax_power(u, inv_am1, MODE: tl.constexpr):
    """u^(1/(alpha-1)) for u >= 0 (the unnormalised entmax weight)."""
    if MODE == 1:
        return u * u
    elif MODE == 2:
        return u
    else:
        return tl.where(u > 0, tl.exp2(tl.log2(u) * inv_am1), 0.0)


@triton.jit
def entmax_slope(u, inv_am1, MODE: tl.constexpr):
    """u^((2-alpha)/(alpha-1)) on u > 0, else 0: proportional to p^(2-alpha), the entmax Jacobian weight."""
    if MODE == 1:
        return u
    elif MODE == 2:
        return tl.where(u > 0, 1.0, 0.0)
    else:
        return tl.where(u > 0, tl.exp2(tl.log2(u) * (inv_am1 - 1.0)), 0.0)


@triton.jit
def row_sums8(a0, a1, a2, a3, a4, a5, a6, a7):
    """The row sums of eight (ROWS, BLOCK) tiles as one reduction: the tiles joined along three new minor
    dimensions, summed over axis 1, split back. One exchange between warps for the eight sums instead of
    eight (the threshold passes of the decoding kernels are latency-bound), and plain tl.sum, which the
    interpreter CI runs computes as fast as eight (a tl.reduce with a combine function runs 40x slower
    there)."""
    joined = tl.join(tl.join(tl.join(a0, a1), tl.join(a2, a3)), tl.join(tl.join(a4, a5), tl.join(a6, a7)))
    low, high = tl.split(tl.sum(joined, 1))
    low_low, low_high = tl.split(low)
    high_low, high_high = tl.split(high)
    s0, s1 = tl.split(low_low)
    s2, s3 = tl.split(low_high)
    s4, s5 = tl.split(high_low)
    s6, s7 = tl.split(high_high)
    return s0, s1, s2, s3, s4, s5, s6, s7


@triton.jit
def candidate_stats(s, lo, d, inv_am1, f0, f1, f2, f3, g0, g1, g2, g3, MODE: tl.constexpr):
    """The running row sums f0..f3 and g0..g3 plus, over one tile s (BLOCK_M, BLOCK_N), the sums of
    f = u^(1/(alpha-1)) and g = u^((2-alpha)/(alpha-1)), u = [s - t]_+, at the four candidate thresholds
    t = lo + c d (c = 0..3); lo, d are (BLOCK_M,). The eight row sums are one reduction (row_sums8)."""
    u0 = tl.maximum(s - lo[:, None], 0.0)
    u1 = tl.maximum(u0 - d[:, None], 0.0)
    u2 = tl.maximum(u1 - d[:, None], 0.0)
    u3 = tl.maximum(u2 - d[:, None], 0.0)
    s0, s1, s2, s3, s4, s5, s6, s7 = row_sums8(
        entmax_power(u0, inv_am1, MODE), entmax_power(u1, inv_am1, MODE), entmax_power(u2, inv_am1, MODE),
        entmax_power(u3, inv_am1, MODE), entmax_slope(u0, inv_am1, MODE), entmax_slope(u1, inv_am1, MODE),
        entmax_slope(u2, inv_am1, MODE), entmax_slope(u3, inv_am1, MODE))
    return f0 + s0, f1 + s1, f2 + s2, f3 + s3, g0 + s4, g1 + s5, g2 + s6, g3 + s7


@triton.jit
def bracket_update(lo, hi, f0, f1, f2, f3, g0, g1, g2, g3, ok, two_minus_alpha, MODE: tl.constexpr):
    """One threshold pass's update of the bracket lo <= tau <= hi from the candidates lo + c (hi - lo) / 4.

    f is decreasing in t, so the largest candidate with f >= 1 is the best lower bound and the smallest with
    f < 1 the best upper bound. From the lower one a Newton step on the convex h(t) = f(t)^(alpha-1) stays a
    lower bound (exact at once when the top scores are equal). Returns (lo, hi, f(best lower) - 1).
    """
    d = (hi - lo) * 0.25
    t_best, f_best, g_best = lo, f0, g0
    t_best = tl.where(f1 >= 1.0, lo + d, t_best)
    g_best = tl.where(f1 >= 1.0, g1, g_best)
    f_best = tl.where(f1 >= 1.0, f1, f_best)
    t_best = tl.where(f2 >= 1.0, lo + 2.0 * d, t_best)
    g_best = tl.where(f2 >= 1.0, g2, g_best)
    f_best = tl.where(f2 >= 1.0, f2, f_best)
    t_best = tl.where(f3 >= 1.0, lo + 3.0 * d, t_best)
    g_best = tl.where(f3 >= 1.0, g3, g_best)
    f_best = tl.where(f3 >= 1.0, f3, f_best)
    hi = tl.where(f3 < 1.0, lo + 3.0 * d, hi)
    hi = tl.where(f2 < 1.0, lo + 2.0 * d, hi)
    hi = tl.where(f1 < 1.0, lo + d, hi)
    lo = newton_step(t_best, f_best, g_best, hi, ok, two_minus_alpha, MODE)
    return lo, hi, tl.where(ok, f_best - 1.0, 0.0)


@triton.jit
def newton_step(t, f, g, hi, ok, two_minus_alpha, MODE: tl.constexpr):
    """Newton step on the convex, decreasing h(t) = f(t)^(alpha-1) from t (f = f(t), g its slope sum as in
    candidate_stats), clipped to hi. From a lower bound of tau it stays one, and it is exact at once when
    the support does not change; from t > tau (f < 1) it steps left."""
    if MODE == 1:
        f_pow = tl.sqrt(f)
    elif MODE == 2:
        f_pow = tl.full(f.shape, 1.0, tl.float32)
    else:
        f_pow = tl.exp2(tl.log2(f) * two_minus_alpha)
    step = tl.where(ok & (g > 0), (f - f_pow) / g, 0.0)
    return tl.minimum(t + step, hi)


@triton.jit
def weight_sums(s, t, inv_am1, MODE: tl.constexpr):
    """(sum_j p_j, #{p_j > 0}) per row of a score tile s (ROWS, BLOCK) at thresholds t (ROWS,) (softmax:
    #{visible keys})."""
    if MODE == 0:
        p = tl.exp2(s - t[:, None])
        live = s > float("-inf")
    else:
        p = entmax_power(tl.maximum(s - t[:, None], 0.0), inv_am1, MODE)
        live = p > 0
    return tl.sum(p, 1), tl.sum(live.to(tl.int32), 1)


@triton.jit
def stored_rows_threshold(s_rows, row_in, s_stride, m, inv_am1, two_minus_alpha, tol, max_iter,
                          BLOCK: tl.constexpr, RESIDENT: tl.constexpr, MODE: tl.constexpr):
    """Threshold of score rows stored in memory (the decoding kernels' scratch), bracketing passes as in the
    fused forward (bracket_update) until sum_j p_j at the lower bound is within tol of 1.

    s_rows (ROWS, 1): pointers to rows of s_stride scores (-inf on hidden keys); row_in (ROWS, 1): the rows
    that exist; m (ROWS,): the rows' maxima (-inf: no visible key). RESIDENT: a row fits in one BLOCK and is
    loaded once into registers; otherwise every pass re-reads it in BLOCKs (from L2).
    Returns (tau, 1 / Z, support size), each (ROWS,), Z = sum_j p_j at tau; +inf, 0, 0 on rows with no
    visible key. Softmax (MODE 0): tau = max + log2 Z and 1 / Z = 1, so that exp2(s - tau) is normalised.
    """
    offs = tl.arange(0, BLOCK)[None, :]
    ok = m > float("-inf")
    m = tl.where(ok, m, 0.0)
    if RESIDENT:
        s_resident = tl.load(s_rows + offs, mask=row_in & (offs < s_stride), other=float("-inf"))
    t = m
    if MODE != 0:
        t = m - 1.0
        hi_t = m
        it = 0
        err = tol + 1.0
        while (it < max_iter) & (err > tol):
            d = (hi_t - t) * 0.25
            zero = tl.zeros_like(t)
            f0, f1, f2, f3, g0, g1, g2, g3 = zero, zero, zero, zero, zero, zero, zero, zero
            if RESIDENT:
                f0, f1, f2, f3, g0, g1, g2, g3 = candidate_stats(s_resident, t, d, inv_am1, f0, f1, f2, f3,
                                                                 g0, g1, g2, g3, MODE)
            else:
                for start in range(0, s_stride, BLOCK):
                    s = tl.load(s_rows + start + offs, mask=row_in & (start + offs < s_stride),
                                other=float("-inf"))
                    f0, f1, f2, f3, g0, g1, g2, g3 = candidate_stats(s, t, d, inv_am1, f0, f1, f2, f3, g0, g1,
                                                                     g2, g3, MODE)
            t, hi_t, excess = bracket_update(t, hi_t, f0, f1, f2, f3, g0, g1, g2, g3, ok, two_minus_alpha,
                                             MODE)
            err = tl.max(excess, 0)
            it += 1
    if RESIDENT:
        z, count = weight_sums(s_resident, t, inv_am1, MODE)
    else:
        z = tl.zeros_like(t)
        count = tl.zeros_like(t).to(tl.int32)
        for start in range(0, s_stride, BLOCK):
            s = tl.load(s_rows + start + offs, mask=row_in & (start + offs < s_stride), other=float("-inf"))
            z_part, count_part = weight_sums(s, t, inv_am1, MODE)
            z += z_part
            count += count_part
    if MODE == 0:
        t = t + tl.log2(z)
        z = z * 0.0 + 1.0
    return (tl.where(ok, t, float("inf")), tl.where(ok, 1.0 / tl.maximum(z, 1e-30), 0.0),
            tl.where(ok, count, 0))


@triton.jit
def live_range(tiles, stride, n_tiles, threshold, thresholds_ptr, PER_TILE: tl.constexpr, SCAN: tl.constexpr):
    """(first, last + 1) over i < n_tiles of the tiles with tiles[i * stride] > threshold (or
    > thresholds_ptr[i] when PER_TILE). A tile whose max score is <= the lowest tau of its query block holds
    only zeros. Loops then run over that range without branches, which keeps their loads software-pipelined;
    dead tiles inside the range are computed (their weights are exactly zero)."""
    first = n_tiles
    last = -1
    for start in range(0, n_tiles, SCAN):
        idx = start + tl.arange(0, SCAN)
        tile_max = tl.load(tiles + idx * stride, mask=idx < n_tiles, other=float("-inf"))
        if PER_TILE:
            live = tile_max > tl.load(thresholds_ptr + idx, mask=idx < n_tiles, other=float("inf"))
        else:
            live = tile_max > threshold
        first = tl.minimum(first, tl.min(tl.where(live, idx, n_tiles), 0))
        last = tl.maximum(last, tl.max(tl.where(live, idx, -1), 0))
    return first, last + 1
