"""Fused entmax attention forward kernel (arXiv:2506.16640, section 2) and its launcher.

Layout (batch, heads, seq, head_dim). One program owns BLOCK_M query rows of one head. It computes per row
the threshold tau of p = [s - tau]_+^(1/(alpha-1)) (s = (alpha-1) z; softmax: the row max and
p = exp2(s - max), s = log2(e) z), the output and what the backward reads, by one of two paths the launcher
picks from the number of keys n_k (the constexpr KEYS; register_tile_keys):

Multi-pass path (KEYS = 0, long rows): several passes over the head's keys in (BLOCK_N) tiles, never
materialising the (Nq, Nk) logits:

1. max pass: m = max_j s_j per row, and the max of every (BLOCK_M, BLOCK_N) tile, kept in a small tile table
   (B, H, Nq/BLOCK_M, Nk/BLOCK_N) that later passes and the backward read. Each row also keeps its
   START_TOPK largest per-tile maxima: distinct keys, so the root of f over them alone is a lower bound of
   tau, the start of the passes (else m - 1; tau lies in [m - 1, m]).
2. threshold passes (alpha > 1): each pass evaluates f(t) = sum_j [s_j - t]_+^p (p = 1/(alpha-1)) and its
   slope at the current lower bound t, and takes a Newton step on the convex h(t) = f(t)^(alpha-1) =
   ||[s - t]_+||_p (it stays a lower bound, and is exact at once when the top scores are equal). Passes stop
   once f(t) - 1 <= tol (2.2 passes per query block on 16K Gaussian logits at tol 3e-2). Evaluating four
   candidates per pass instead took 3.0 passes of twice the cost (results/attention_tuning.md).
   A tile whose max is <= lo for every row of the block holds only zeros: it costs no matmul (passes loop
   over the range of live tiles, which is a band around the diagonal for ALiBi heads).
3. output pass: p = [s - tau]_+^p (exp2(s - m) for softmax), out = (p @ v) / sum p; when a backward
   will follow, also the Jacobian accumulator o2 = (g @ v) / sum g with g = p^(2-alpha) (softmax: out in
   fp32), so that the backward's delta = dO . o2 needs no extra pass.

Single-tile path (KEYS > 0, n_k <= KEYS_IN_REGISTERS): all keys of the row fit one (BLOCK_M, KEYS) register
tile. K and V are loaded once and q.k computed once; the max, the tile table (the max of each BLOCK_N-wide
sub-tile, the multi-pass path's and the backward's granularity), the same Newton iterations from m - 1 (the
same stopping rule and max_iter; each iteration counts as a pass) and the output p @ v, o2 read the scores
from registers. Both paths write the same outputs with the same meaning.
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.attention_common import (
    causal_key_end,
    cdiv,
    dot_split,
    entmax_power,
    entmax_slope,
    full_tiles,
    live_range,
    load_tile,
    logit_constants,
    newton_step,
    next_power_of_2,
    row_multiplier,
    tile_logits,
)


@triton.jit
def _max_tiles(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k, tiles, m,
               top, kb_lo, kb_hi, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr,
               EVEN_D: tl.constexpr, TOPK: tl.constexpr):
    """Max pass over key tiles [kb_lo, kb_hi): running row max m, each tile's max into the tile table, and
    (TOPK > 0) the TOPK largest per-tile row maxima of each row in top (BLOCK_M, TOPK)."""
    for kb in range(kb_lo, kb_hi):
        offs_n = kb * BLOCK_N + offs_n0
        kt = load_tile(k_base, offs_n, skn, offs_d, n_k, d_in, True, MASKED, EVEN_D)
        s = tile_logits(q, kt, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                        DOT_PRECISION, MASKED)
        row_max = tl.max(s, 1)
        tl.store(tiles + kb, tl.max(tl.where(row_in, row_max, float("-inf")), 0))
        m = tl.maximum(m, row_max)
        if TOPK > 0:  # replace the (first) smallest kept value when this tile's max is larger
            cols = tl.arange(0, TOPK)[None, :]
            low = tl.min(top, 1)
            first_low = tl.min(tl.where(top == low[:, None], cols, TOPK), 1)
            top = tl.where((cols == first_low[:, None]) & (row_max > low)[:, None], row_max[:, None], top)
    return m, top


@triton.jit
def _top_lower_bound(top, m, row_ok, inv_am1, two_minus_alpha, MODE: tl.constexpr, ITERS: tl.constexpr):
    """A lower bound of tau from kept scores top (BLOCK_M, K), distinct keys of the row: f(t) >= the same sum
    over them, so Newton steps from m - 1 on that smaller sum stay below its root, hence below tau."""
    t = m - 1.0
    for _ in tl.static_range(ITERS):
        u = tl.maximum(top - t[:, None], 0.0)
        f = tl.sum(entmax_power(u, inv_am1, MODE), 1)
        t = newton_step(t, f, tl.sum(entmax_slope(u, inv_am1, MODE), 1), m, row_ok, two_minus_alpha, MODE)
    return t


@triton.jit
def _add_tile_sums(s, t, inv_am1, f, g, MODE: tl.constexpr):
    """The running row sums f, g plus the threshold statistics of one score tile s at the row thresholds t:
    sum_j u^p and sum_j u^(p-1), u = [s - t]_+ (the latter is the slope of the former up to the factor p)."""
    u = tl.maximum(s - t[:, None], 0.0)
    f += tl.sum(entmax_power(u, inv_am1, MODE), 1)
    g += tl.sum(entmax_slope(u, inv_am1, MODE), 1)
    return f, g


@triton.jit
def _stats_tiles(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, t, inv_am1, f, g,
                 kb_lo, kb_hi,
                 BLOCK_N: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
                 HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr,
                 EVEN_D: tl.constexpr):
    """_add_tile_sums over key tiles [kb_lo, kb_hi)."""
    for kb in range(kb_lo, kb_hi):
        offs_n = kb * BLOCK_N + offs_n0
        kt = load_tile(k_base, offs_n, skn, offs_d, n_k, d_in, True, MASKED, EVEN_D)
        s = tile_logits(q, kt, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                        DOT_PRECISION, MASKED)
        f, g = _add_tile_sums(s, t, inv_am1, f, g, MODE)
    return f, g


@triton.jit
def _newton_update(t, hi_t, f, g, row_ok, two_minus_alpha, MODE: tl.constexpr):
    """Given f = f(t) and its slope sum g at the lower bound t: the upper bound hi_t tightened where f < 1,
    a Newton step from t clipped to it, and the stopping criterion max over the rows of f(t) - 1.
    Returns (t, hi_t, error)."""
    hi_t = tl.where(f < 1.0, t, hi_t)
    excess = tl.where(row_ok, f - 1.0, 0.0)
    t = newton_step(t, f, g, hi_t, row_ok, two_minus_alpha, MODE)
    return t, hi_t, tl.max(excess, 0)


@triton.jit
def _threshold_pass(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, tiles, n_vis,
                    n_full, t, hi_t, row_ok, inv_am1, two_minus_alpha,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr,
                    HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    EVEN_D: tl.constexpr, SCAN: tl.constexpr):
    """One pass over the live key tiles: f(t) and its slope, then _newton_update. Returns (t, hi_t, error)."""
    t_min = tl.min(tl.where(row_ok, t, float("inf")), 0)
    kb_lo, kb_hi = live_range(tiles, 1, n_vis, t_min, tiles, False, SCAN)
    zero = tl.zeros([BLOCK_M], tl.float32)
    f, g = _stats_tiles(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, t,
                        inv_am1, zero, zero, kb_lo, tl.minimum(kb_hi, n_full), BLOCK_N, MODE, CAUSAL,
                        HAS_ALIBI, HAS_KPM, DOT_PRECISION, False, EVEN_D)
    f, g = _stats_tiles(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, t,
                        inv_am1, f, g, tl.maximum(kb_lo, n_full), kb_hi, BLOCK_N, MODE, CAUSAL, HAS_ALIBI,
                        HAS_KPM, DOT_PRECISION, True, EVEN_D)
    return _newton_update(t, hi_t, f, g, row_ok, two_minus_alpha, MODE)


@triton.jit
def _output_accumulators(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Zeros of (acc, z_sum, support, acc2, g_sum), the sums of _accumulate_output."""
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    z_sum = tl.zeros([BLOCK_M], tl.float32)
    return acc, z_sum, tl.zeros([BLOCK_M], tl.int32), acc, z_sum


@triton.jit
def _accumulate_o2(u, v, inv_am1, acc2, g_sum, DOT_PRECISION: tl.constexpr, MODE: tl.constexpr,
                   SPLIT_O2: tl.constexpr):
    """acc2 += g @ v and g_sum += sum g for the Jacobian weights g = u^(p-1) (proportional to p^(2-alpha)) of
    one tile of u = [s - t]_+ (unnormalised)."""
    g = entmax_slope(u, inv_am1, MODE)
    g_sum += tl.sum(g, 1)
    acc2 += dot_split(g, v, DOT_PRECISION, SPLIT_O2)  # see O2_SPLIT
    return acc2, g_sum


@triton.jit
def _accumulate_output(s, t, v, inv_am1, acc, z_sum, support, acc2, g_sum,
                       MODE: tl.constexpr, DOT_PRECISION: tl.constexpr, WRITE_O2: tl.constexpr,
                       WRITE_SUPPORT: tl.constexpr, SPLIT_O2: tl.constexpr, O2_FIRST: tl.constexpr):
    """One score tile s and its value rows v at the row thresholds t: acc += p @ v, z_sum += sum p (support:
    count of p > 0); with WRITE_O2 (alpha > 1) also _accumulate_o2, before p @ v when O2_FIRST (the order
    changes only the registers the compiler allocates)."""
    if MODE == 0:
        p = tl.exp2(s - t[:, None])
    else:
        u = tl.maximum(s - t[:, None], 0.0)
        p = entmax_power(u, inv_am1, MODE)
    if WRITE_O2 and MODE != 0 and O2_FIRST:
        acc2, g_sum = _accumulate_o2(u, v, inv_am1, acc2, g_sum, DOT_PRECISION, MODE, SPLIT_O2)
    z_sum += tl.sum(p, 1)
    if WRITE_SUPPORT:  # softmax: every visible key (its weight is positive even if exp2 underflows)
        support += tl.sum(((s > float("-inf")) if MODE == 0 else (p > 0)).to(tl.int32), 1)
    acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    if WRITE_O2 and MODE != 0 and not O2_FIRST:
        acc2, g_sum = _accumulate_o2(u, v, inv_am1, acc2, g_sum, DOT_PRECISION, MODE, SPLIT_O2)
    return acc, z_sum, support, acc2, g_sum


@triton.jit
def _output_tiles(q, k_base, v_base, skn, svn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, t,
                  inv_am1, acc, z_sum, support, acc2, g_sum, kb_lo, kb_hi,
                  BLOCK_N: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
                  HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr,
                  EVEN_D: tl.constexpr, WRITE_O2: tl.constexpr, WRITE_SUPPORT: tl.constexpr,
                  SPLIT_O2: tl.constexpr):
    """Output pass over key tiles [kb_lo, kb_hi): _accumulate_output of each."""
    for kb in range(kb_lo, kb_hi):
        offs_n = kb * BLOCK_N + offs_n0
        kt = load_tile(k_base, offs_n, skn, offs_d, n_k, d_in, True, MASKED, EVEN_D)
        v = load_tile(v_base, offs_n, svn, offs_d, n_k, d_in, False, MASKED, EVEN_D)
        s = tile_logits(q, kt, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                        DOT_PRECISION, MASKED)
        acc, z_sum, support, acc2, g_sum = _accumulate_output(s, t, v, inv_am1, acc, z_sum, support, acc2,
                                                              g_sum, MODE, DOT_PRECISION, WRITE_O2,
                                                              WRITE_SUPPORT, SPLIT_O2, False)
    return acc, z_sum, support, acc2, g_sum


@triton.jit
def _streamed_rows(q, k_base, v_base, skn, svn, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k,
                   tiles, n_vis, n_full, inv_am1, two_minus_alpha, tol, max_iter, passes_ptr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MODE: tl.constexpr,
                   CAUSAL: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   EVEN_D: tl.constexpr, TOPK: tl.constexpr, SCAN: tl.constexpr, WRITE_O2: tl.constexpr,
                   WRITE_SUPPORT: tl.constexpr, SPLIT_O2: tl.constexpr):
    """Multi-pass path over the key tiles [0, n_vis) (tiles [0, n_full) need no mask): the max pass with the
    tile table, the threshold passes (their number stored at passes_ptr) and the output pass. Returns (t,
    row_ok, acc, z_sum, support, acc2, g_sum) with t the threshold (softmax: the row max) and row_ok the rows
    with a visible key."""
    offs_n0 = tl.arange(0, BLOCK_N)
    # 1. max pass (+ the tile table)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    top = tl.full([BLOCK_M, max(TOPK, 1)], float("-inf"), tl.float32)
    m, top = _max_tiles(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k,
                        tiles, m, top, 0, n_full, BLOCK_N, CAUSAL, HAS_ALIBI, HAS_KPM, DOT_PRECISION, False,
                        EVEN_D, TOPK)
    m, top = _max_tiles(q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k,
                        tiles, m, top, n_full, n_vis, BLOCK_N, CAUSAL, HAS_ALIBI, HAS_KPM, DOT_PRECISION,
                        True, EVEN_D, TOPK)
    row_ok = row_in & (m > float("-inf"))  # rows outside the sequence or with no visible key are not ok
    m = tl.where(row_ok, m, 0.0)

    # 2. threshold passes: Newton steps from a lower bound t <= tau <= hi_t
    passes = 0
    if MODE == 0:
        t = m
    else:
        t = m - 1.0
        if TOPK > 0:
            t = _top_lower_bound(top, m, row_ok, inv_am1, two_minus_alpha, MODE, 8)
        hi_t = m
        err = tl.full([], float("inf"), tl.float32)
        while (passes < max_iter) & (err > tol):
            t, hi_t, err = _threshold_pass(
                q, k_base, skn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, tiles, n_vis,
                n_full, t, hi_t, row_ok, inv_am1, two_minus_alpha, BLOCK_M, BLOCK_N, MODE, CAUSAL, HAS_ALIBI,
                HAS_KPM, DOT_PRECISION, EVEN_D, SCAN)
            passes += 1
    tl.store(passes_ptr, passes)

    # 3. output pass
    kb_lo = 0
    kb_hi = n_vis
    if MODE != 0:
        kb_lo, kb_hi = live_range(tiles, 1, n_vis, tl.min(tl.where(row_ok, t, float("inf")), 0), tiles, False,
                                  SCAN)
    acc, z_sum, support, acc2, g_sum = _output_accumulators(BLOCK_M, BLOCK_D)
    acc, z_sum, support, acc2, g_sum = _output_tiles(
        q, k_base, v_base, skn, svn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, t, inv_am1,
        acc, z_sum, support, acc2, g_sum, kb_lo, tl.minimum(kb_hi, n_full), BLOCK_N, MODE, CAUSAL, HAS_ALIBI,
        HAS_KPM, DOT_PRECISION, False, EVEN_D, WRITE_O2, WRITE_SUPPORT, SPLIT_O2)
    acc, z_sum, support, acc2, g_sum = _output_tiles(
        q, k_base, v_base, skn, svn, offs_n0, offs_d, d_in, s_mult, pos_m, slope, kpm_ptr, n_k, t, inv_am1,
        acc, z_sum, support, acc2, g_sum, tl.maximum(kb_lo, n_full), kb_hi, BLOCK_N, MODE, CAUSAL, HAS_ALIBI,
        HAS_KPM, DOT_PRECISION, True, EVEN_D, WRITE_O2, WRITE_SUPPORT, SPLIT_O2)
    return t, row_ok, acc, z_sum, support, acc2, g_sum


@triton.jit
def _store_tile_maxima(s, offs_n, row_in, tiles, n_vis, BLOCK_N: tl.constexpr, KEYS: tl.constexpr):
    """Tile table of a register tile s (BLOCK_M, KEYS): for each BLOCK_N-wide sub-tile j < n_vis, the max of
    s over its keys and the rows row_in (what the multi-pass path's max pass writes for key tile j)."""
    for j in tl.static_range(KEYS // BLOCK_N):
        in_sub = row_in[:, None] & ((offs_n // BLOCK_N) == j)[None, :]
        tl.store(tiles + j, tl.max(tl.max(tl.where(in_sub, s, float("-inf")), 1), 0), mask=j < n_vis)


@triton.jit
def _register_tile_rows(q, k_base, v_base, skn, svn, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k,
                        key_end, tiles, n_vis, inv_am1, two_minus_alpha, tol, max_iter, passes_ptr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        KEYS: tl.constexpr, MODE: tl.constexpr, CAUSAL: tl.constexpr,
                        HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        EVEN_D: tl.constexpr, WRITE_O2: tl.constexpr, WRITE_SUPPORT: tl.constexpr,
                        SPLIT_O2: tl.constexpr):
    """Single-tile path: the n_k <= KEYS keys of the row in one (BLOCK_M, KEYS) register tile of scores (keys
    [key_end, KEYS) are hidden from every row and not loaded). Same results as _streamed_rows, with the
    Newton iterations from m - 1 on the resident scores."""
    offs_n = tl.arange(0, KEYS)
    kt = load_tile(k_base, offs_n, skn, offs_d, key_end, d_in, True, True, EVEN_D)
    v = load_tile(v_base, offs_n, svn, offs_d, key_end, d_in, False, True, EVEN_D)
    s = tile_logits(q, kt, s_mult, pos_m, offs_n, slope, kpm_ptr, n_k, CAUSAL, HAS_ALIBI, HAS_KPM,
                    DOT_PRECISION)
    _store_tile_maxima(s, offs_n, row_in, tiles, n_vis, BLOCK_N, KEYS)
    m = tl.max(s, 1)
    row_ok = row_in & (m > float("-inf"))  # rows outside the sequence or with no visible key are not ok
    m = tl.where(row_ok, m, 0.0)
    passes = 0
    t = m
    if MODE != 0:
        t = m - 1.0
        hi_t = m
        err = tl.full([], float("inf"), tl.float32)
        zero = tl.zeros([BLOCK_M], tl.float32)
        while (passes < max_iter) & (err > tol):
            f, g = _add_tile_sums(s, t, inv_am1, zero, zero, MODE)
            t, hi_t, err = _newton_update(t, hi_t, f, g, row_ok, two_minus_alpha, MODE)
            passes += 1
    acc, z_sum, support, acc2, g_sum = _output_accumulators(BLOCK_M, BLOCK_D)
    # o2 before p @ v, and Passes stored last (sm_90, 90 keys, head_dim 32): alpha 1.25 with the o2 split
    # takes 231 registers instead of a spill of 48 bytes, alpha 1.5 without q_scale 128 instead of 168 (4
    # programs an SM instead of 3); ptxas's allocation is that sensitive to the order
    acc, z_sum, support, acc2, g_sum = _accumulate_output(s, t, v, inv_am1, acc, z_sum, support, acc2, g_sum,
                                                          MODE, DOT_PRECISION, WRITE_O2, WRITE_SUPPORT,
                                                          SPLIT_O2, True)
    tl.store(passes_ptr, passes)
    return t, row_ok, acc, z_sum, support, acc2, g_sum


@triton.jit(do_not_specialize=["n_q", "n_k", "n_kb", "max_iter"])
def _entmax_attention_fwd(
    Q, K, V, Out, O2, Tau, InvZ, Support, TileMax, Passes, QScale, Slopes, KPM,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
    n_heads, group, n_q, n_k, n_kb, head_dim, scale, bias_mult, inv_am1, two_minus_alpha, tol, max_iter,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KEYS: tl.constexpr,
    MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_QSCALE: tl.constexpr,
    HAS_KPM: tl.constexpr, WRITE_O2: tl.constexpr, WRITE_SUPPORT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SCAN: tl.constexpr, EVEN_D: tl.constexpr, TOPK: tl.constexpr, SPLIT_O2: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    hk = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_in = offs_m < n_q
    pos_m = offs_m + (n_k - n_q)

    d_in = offs_d < head_dim
    q = load_tile(Q + b * sqb + h * sqh, offs_m, sqm, offs_d, n_q, d_in, False, True, EVEN_D)
    # as z_mult * bias_mult in the backward: the same rounding
    s_mult = row_multiplier(QScale, pid_bh * n_q + offs_m, row_in, scale, BLOCK_M, HAS_QSCALE) * bias_mult
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Slopes + pid_bh) * bias_mult
    kpm_ptr = KPM + b * n_k
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    tiles = TileMax + (pid_bh * tl.num_programs(0) + pid_m) * n_kb
    passes_ptr = Passes + pid_bh * tl.num_programs(0) + pid_m

    # keys [0, key_end) and tiles [0, n_vis) may be visible and have a tile-table entry
    key_end = causal_key_end(pid_m, n_q, n_k, BLOCK_M, CAUSAL)
    n_vis = tl.cdiv(key_end, BLOCK_N)
    if KEYS > 0:
        t, row_ok, acc, z_sum, support, acc2, g_sum = _register_tile_rows(
            q, k_base, v_base, skn, svn, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k, key_end,
            tiles, n_vis, inv_am1, two_minus_alpha, tol, max_iter, passes_ptr, BLOCK_M, BLOCK_N, BLOCK_D,
            KEYS, MODE, CAUSAL, HAS_ALIBI, HAS_KPM, DOT_PRECISION, EVEN_D, WRITE_O2, WRITE_SUPPORT, SPLIT_O2)
    else:
        n_full = full_tiles(pid_m * BLOCK_M + n_k - n_q, n_k, BLOCK_N, CAUSAL)  # tiles [0, n_full): no mask
        t, row_ok, acc, z_sum, support, acc2, g_sum = _streamed_rows(
            q, k_base, v_base, skn, svn, offs_d, d_in, s_mult, pos_m, row_in, slope, kpm_ptr, n_k, tiles,
            n_vis, n_full, inv_am1, two_minus_alpha, tol, max_iter, passes_ptr, BLOCK_M, BLOCK_N, BLOCK_D,
            MODE, CAUSAL, HAS_ALIBI, HAS_KPM, DOT_PRECISION, EVEN_D, TOPK, SCAN, WRITE_O2, WRITE_SUPPORT,
            SPLIT_O2)

    ok = row_ok & (z_sum > 0)
    inv_z = tl.where(ok, 1.0 / z_sum, 0.0)
    out = acc * inv_z[:, None]
    if MODE == 0:
        tau = t + tl.log2(z_sum)
        inv_z = tl.where(ok, 1.0, 0.0)
    else:
        tau = t
    tau = tl.where(ok, tau, float("inf"))
    row_ptr = pid_bh * n_q + offs_m
    tl.store(Tau + row_ptr, tau, mask=row_in)
    tl.store(InvZ + row_ptr, inv_z, mask=row_in)
    if WRITE_SUPPORT:
        tl.store(Support + row_ptr, tl.where(ok, support, 0), mask=row_in)
    o_ptrs = b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :]
    o_mask = row_in[:, None] & d_in[None, :]
    tl.store(Out + o_ptrs, out.to(Out.dtype.element_ty), mask=o_mask)
    if WRITE_O2:  # softmax: o2 = out in fp32, so that delta = dO . o2 carries no rounding of out
        o2 = out if MODE == 0 else acc2 * tl.where(ok & (g_sum > 0), 1.0 / g_sum, 0.0)[:, None]
        tl.store(O2 + (pid_bh * n_q + offs_m[:, None]) * head_dim + offs_d[None, :], o2, mask=o_mask)


# Start of the threshold passes: m - 1 (0), or a lower bound from the START_TOPK largest per-tile row maxima
# of the max pass (_top_lower_bound; a power of two). 16 was the fastest in the sweep over K = 0, 8, 16, 32
# (results/attention_tuning3.md).
START_TOPK = 16
# With 16-bit inputs and q_scale, g enters the o2 accumulator g @ v as a hi + lo pair (dot_split). delta =
# dO . o2 enters dq_scale = scale sum_j dz_j q.k_j, whose terms cancel (sum_j dz_j = 0) around a large mean
# q.k: the bf16 rounding of g left a 0.063 error there (Nq=1, 4096 keys; the bf16 reference's 0.004, with
# the split 0.004). It costs one more matmul in the output pass (timed in results/attention_gpu_notes.md).
O2_SPLIT = True
# Single-tile path: rows of at most KEYS_IN_REGISTERS keys, at head dims up to REGISTER_TILE_MAX_DIM, keep
# their (BLOCK_M, KEYS) fp32 scores in registers (64 a thread at 64 x 128 and 4 warps). On sm_90 its variants
# take 103-240 registers and spill nothing (benchmarks/compile_kernels_sm90.py); 8 warps did not take fewer
# (the 64-row wgmma tile is then held twice).
KEYS_IN_REGISTERS = 128
REGISTER_TILE_MAX_DIM = 64


def register_tile_keys(n_k, head_dim, block_n):
    """KEYS of the forward for n_k keys: the width of the single-tile path's register tile, the smallest
    power of two >= n_k and >= BLOCK_N (at head_dim <= 64: 64 or 128, two compiled variants), or 0 (the
    multi-pass path) beyond KEYS_IN_REGISTERS keys or REGISTER_TILE_MAX_DIM."""
    keys = max(block_n, next_power_of_2(n_k))
    return keys if keys <= KEYS_IN_REGISTERS and head_dim <= REGISTER_TILE_MAX_DIM else 0


def entmax_attention_fwd(q, k, v, *, mode, alpha, scale, causal, slopes, q_scale, kpm, write_o2, tol,
                         max_iter, blocks, write_support=True, single_tile=True):
    """Launch the forward kernel. q (B, H, Nq, D), k/v (B, Hkv, Nk, D) with unit last stride; slopes
    (B, H) fp32 or None; q_scale (B, H, Nq) fp32 contiguous or None; kpm (B, Nk) uint8 or None.
    single_tile=False: the multi-pass path even where register_tile_keys allows the single-tile one (for the
    benchmarks and tests that compare the two).

    Returns out (B, H, Nq, D) q.dtype, o2 (B, H, Nq, D) fp32 or None, tau_s and inv_z (B, H, Nq) fp32
    in s units, support (B, H, Nq) int32 or None (write_support=False), tile_max (B, H, Nq/BLOCK_M,
    Nk/BLOCK_N) fp32 and the number of threshold passes each query block took (B, H, Nq/BLOCK_M) int32 (the
    single-tile path: its Newton iterations).
    """
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    block_m, block_n, num_warps, num_stages = blocks
    n_qb, n_kb = cdiv(n_q, block_m), cdiv(n_k, block_n)
    block_d = max(16, next_power_of_2(dim))
    c, inv_am1 = logit_constants(mode, alpha)
    dev = q.device
    out = torch.empty_like(q)
    o2 = torch.empty(batch, heads, n_q, dim, device=dev, dtype=torch.float32) if write_o2 else None
    tau = torch.empty(batch, heads, n_q, device=dev, dtype=torch.float32)
    inv_z = torch.empty_like(tau)
    support = torch.empty(batch, heads, n_q, device=dev, dtype=torch.int32) if write_support else None
    tile_max = torch.empty(batch, heads, n_qb, n_kb, device=dev, dtype=torch.float32)
    passes = torch.empty(batch, heads, n_qb, device=dev, dtype=torch.int32)
    dummy = tau
    grid = (n_qb, batch * heads)
    keys = register_tile_keys(n_k, dim, block_n) if single_tile else 0
    _entmax_attention_fwd[grid](
        q, k, v, out, o2 if write_o2 else dummy, tau, inv_z, support if write_support else passes, tile_max,
        passes, q_scale if q_scale is not None else dummy, slopes if slopes is not None else dummy,
        kpm if kpm is not None else passes,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        heads, heads // k.shape[1], n_q, n_k, n_kb, dim, scale, c, inv_am1, 2.0 - alpha, tol, max_iter,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, KEYS=keys, MODE=mode,
        CAUSAL=causal, HAS_ALIBI=slopes is not None, HAS_QSCALE=q_scale is not None, HAS_KPM=kpm is not None,
        WRITE_O2=write_o2, WRITE_SUPPORT=write_support, SCAN=512,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", EVEN_D=block_d == dim,
        TOPK=START_TOPK if mode != 0 and not keys else 0,
        SPLIT_O2=O2_SPLIT and q.dtype != torch.float32 and q_scale is not None,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out, o2, tau, inv_z, support, tile_max, passes
