"""Row-wise alpha-entmax in Triton, forward and backward (arXiv:2506.16640, section 2: the alpha-entmax map).

For each row z of a contiguous 2D tensor (R, N) and s = (alpha - 1) z, the forward finds tau with
    p_i = [s_i - tau]_+ ^ q,   q = 1 / (alpha - 1),   sum_i p_i = 1,
and the backward returns dx = u*grad - u * sum(u*grad) / sum(u) with u = p^(2 - alpha) on the support.

Supported: alpha in ALPHA_RANGE = [1.01, 2] (python float), fp32/fp16/bf16, computed in fp32; checked
against an fp64 oracle to fp32 resolution (tests/test_triton_entmax_rows.py). Outside it fp32 thresholds
lose digits: beyond alpha = 2, p = d^(1/(alpha-1)) is steep at the edge of the support (alpha 3: 6e-5,
10: 3e-4 off under the interpreter); towards alpha = 1, p = d^q with q = 1/(alpha-1) large multiplies the
relative error of d by q (alpha 1.001: 1.3e-5). asentmax.ops.entmax.entmax computes those alphas on its
torch path (fp64 inside) and `entmax_rows` refuses them.

How tau is found (all math in fp32, one read of x and one write of p when the row fits on chip):
  1. one reduction gives max(s), and the sum and count of the finite entries. Two lower bounds for tau
     (F(t) = sum_i [s_i - t]_+^q >= 1 at both): max(s) - 1, and, by Jensen (q >= 1),
     mean_finite(s) - n_finite^(1 - alpha). The start t is the larger one.
  2. Newton steps on phi(t) = F(t)^(1/q) - 1 (phi is convex and decreasing for q >= 1, so the steps
     approach tau from below, safely, and converge faster than Newton on F). Fast paths:
     alpha = 2 (q = 1): the support S = {s > t} gives the closed form tau = (sum_S s - 1) / |S|;
     alpha = 1.5 (q = 2): tau is the smaller root of sum_S (s - tau)^2 = 1.
     The closed form is exact as soon as it does not cut into S (tau <= min_S s): then we stop.
     General alpha: Newton on phi until the step is below fp32 resolution, each step safeguarded by a
     bisection bracket (against fp32 rounding).
Rows of up to MAX_BLOCK_N entries are held in registers (several short rows per program); longer rows
are processed chunk by chunk (each Newton step re-reads the row, mostly from L2).
Rows that are entirely -inf give p = 0 and tau = +inf; a row containing NaN or +inf gives a NaN row and a
NaN gradient row. Kernel modes are attention_common's (MODE_ENTMAX15, MODE_SPARSEMAX, MODE_GENERAL, mode_of).

Public: `entmax_rows(x2d, alpha)` (autograd), `entmax_rows_forward` / `entmax_rows_backward` (the
launchers, which asentmax.ops.entmax wraps as torch custom ops) and `entmax_rows_threshold(x2d, alpha)`.
Importing this module needs no GPU; the kernels also run under TRITON_INTERPRET=1.
"""

import torch
import triton
import triton.language as tl

from asentmax.ops.triton.attention_common import MODE_ENTMAX15, MODE_GENERAL, MODE_SPARSEMAX, mode_of

# jit functions may read a global only as a tl.constexpr: the same numbers, rebound under the same names
MODE_ENTMAX15, MODE_SPARSEMAX = tl.constexpr(MODE_ENTMAX15), tl.constexpr(MODE_SPARSEMAX)

MAX_BLOCK_N = 32768  # longest row (power of two) kept in registers; longer rows loop over chunks
LONG_CHUNK = 4096  # chunk length of the looping kernels
MAX_ITERS_FAST = 32  # alpha in {1.5, 2}: typically 2-7 steps
MAX_ITERS_GENERAL = 60

ALPHA_RANGE = (1.01, 2.0)  # low <= alpha <= high
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- jit helpers


@triton.jit
def _combine_first(m1, s1, c1, m2, s2, c2):
    return tl.maximum(m1, m2), s1 + s2, c1 + c2


@triton.jit
def _combine_stats(k1, a1, b1, c1, k2, a2, b2, c2):
    return k1 + k2, a1 + a2, b1 + b2, tl.minimum(c1, c2)


@triton.jit
def _combine_sums(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _first_stats(s, FUSED: tl.constexpr):
    """(BLOCK_R, BLOCK_N) tile -> per row: max, the sum of the entries other than -inf (NaN or +inf when the
    row holds one: _start reads that as a NaN row) and the count of entries other than -inf.

    FUSED: one multi-operand reduction (one exchange through shared memory instead of one per value).
    Off by default: the GPU-measured configuration (results/entmax_gpu.md) uses separate reductions; the
    fused variant is tested (interpreter) and in the benchmark's launch sweep, but not yet timed on a GPU.
    (The interpreter also runs a multi-operand reduction element by element in Python: slow.)"""
    finite = s > float("-inf")
    total = tl.where(s == float("-inf"), 0.0, s)
    count = finite.to(tl.float32)
    if FUSED:
        return tl.reduce((s, total, count), 1, _combine_first)
    return tl.max(s, 1), tl.sum(total, 1), tl.sum(count, 1)


@triton.jit
def _start(m, total, count, alpha, MODE: tl.constexpr):
    """The iteration's starting state from the first statistics: (t, lo, hi, norm, done, valid, nan_row), with
    t = lo a lower bound for tau, hi = the row max; invalid = all -inf row (done at once); nan_row = the row
    holds a NaN or a +inf (its p and tau are NaN)."""
    nan_row = (total != total) | (total == float("inf"))
    valid = (m > float("-inf")) & (~nan_row)
    t = m - 1.0
    if MODE == MODE_ENTMAX15:
        jensen = total / count - tl.math.rsqrt(count)
        t = tl.maximum(t, jensen)
    elif MODE == MODE_SPARSEMAX:
        t = tl.maximum(t, (total - 1.0) / count)
    else:
        jensen = total / count - tl.exp2((1.0 - alpha) * tl.log2(count))
        t = tl.maximum(t, jensen)
    t = tl.where(valid, t, 0.0)
    return t, t, tl.where(valid, m, 0.0), tl.zeros_like(t) + 1.0, ~valid, valid, nan_row


@triton.jit
def _iter_stats(s, t, q, MODE: tl.constexpr, FUSED: tl.constexpr):
    """Per row, at threshold t: |S|, and sums over S = {s > t} of d = s - t:
    MODE 1.5: (sum d, sum d^2); MODE 2: (sum d, sum d); general: (sum d^(q-1), sum d^q); plus min_S d."""
    d = s - t[:, None]
    pos = d > 0.0
    d_pos = tl.maximum(d, 0.0)
    if MODE == MODE_ENTMAX15:
        f1 = d_pos
        f2 = d_pos * d_pos
    elif MODE == MODE_SPARSEMAX:
        f1 = d_pos
        f2 = d_pos
    else:
        f2 = tl.where(pos, tl.exp2(q * tl.log2(tl.where(pos, d, 1.0))), 0.0)
        f1 = tl.where(pos, f2 / tl.where(pos, d, 1.0), 0.0)
    k = pos.to(tl.float32)
    mn = tl.where(pos, d, float("inf"))
    if FUSED:
        return tl.reduce((k, f1, f2, mn), 1, _combine_stats)
    return tl.sum(k, 1), tl.sum(f1, 1), tl.sum(f2, 1), tl.min(mn, 1)


@triton.jit
def _step(t, lo, hi, norm, done, k, f1, f2, mn, q, MODE: tl.constexpr):
    """One update of tau per row from the statistics at t; rows already done keep their t.

    General alpha also keeps a bisection bracket [lo, hi] and norm = F(t) at the final t (p is divided
    by it, so that the row sums to 1 to fp32 resolution)."""
    if MODE == MODE_ENTMAX15:
        # F(t) = f2, F'(t) = -2 f1; closed form on S: smaller root u of k u^2 - 2 f1 u + f2 - 1 = 0
        disc = f1 * f1 - k * (f2 - 1.0)
        u_exact = (f2 - 1.0) / (f1 + tl.sqrt(tl.maximum(disc, 0.0)))
        exact = (disc >= 0.0) & (u_exact <= mn)
        u_newton = (f2 - tl.sqrt(f2)) / f1
        u = tl.where(exact, u_exact, u_newton)
        move = ~done
    elif MODE == MODE_SPARSEMAX:
        u = (f1 - 1.0) / k
        exact = u <= mn
        move = ~done
    else:
        # Newton on phi = F^(1/q) - 1: u = (F - F^(1 - 1/q)) / sum d^(q-1); bisection if it leaves (lo, hi)
        big = f2 >= 1.0
        lo = tl.where(big & ~done, t, lo)
        hi = tl.where(big | done, hi, t)
        u = (f2 - tl.exp2((1.0 - 1.0 / q) * tl.log2(f2))) / f1
        exact = tl.abs(u) <= 1e-7 * tl.maximum(tl.abs(t), 1.0)
        inside = (t + u > lo) & (t + u < hi)
        u = tl.where(inside, u, 0.5 * (lo + hi) - t)
        norm = tl.where(done, norm, f2)
        move = ~done & ~exact
    stuck = k == 0.0  # cannot happen for t below tau; guard against dividing by zero
    t = tl.where(move & ~stuck, t + u, t)
    return t, lo, hi, norm, done | exact | stuck


@triton.jit
def _probs(s, t, norm, q, MODE: tl.constexpr):
    d = tl.maximum(s - t[:, None], 0.0)
    if MODE == MODE_ENTMAX15:
        p = d * d
    elif MODE == MODE_SPARSEMAX:
        p = d
    else:
        p = tl.where(d > 0.0, tl.exp2(q * tl.log2(tl.where(d > 0.0, d, 1.0))), 0.0) / norm[:, None]
    return p


@triton.jit
def _finish(p, valid, nan_row):
    p = tl.where(valid[:, None], p, 0.0)
    return tl.where(nan_row[:, None], float("nan"), p)


@triton.jit
def _tau_out(t, valid, nan_row):
    t = tl.where(valid, t, float("inf"))
    return tl.where(nan_row, float("nan"), t)


# ----------------------------------------------------------------------------- forward kernels


@triton.jit
def _fwd_rows_kernel(x_ptr, p_ptr, tau_ptr, R, N, alpha, q, MAX_ITERS,
                     MODE: tl.constexpr, WRITE_P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                     FUSED: tl.constexpr):
    """BLOCK_R whole rows per program, held in registers: one read of x, one write of p."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < R) & (cols[None, :] < N)
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
    s = x * (alpha - 1.0)

    m, total, count = _first_stats(s, FUSED)
    t, lo, hi, norm, done, valid, nan_row = _start(m, total, count, alpha, MODE)
    it = 0
    while (it < MAX_ITERS) & (tl.min(done.to(tl.int32), 0) == 0):
        k, f1, f2, mn = _iter_stats(s, t, q, MODE, FUSED)
        t, lo, hi, norm, done = _step(t, lo, hi, norm, done, k, f1, f2, mn, q, MODE)
        it += 1

    tl.store(tau_ptr + rows, _tau_out(t, valid, nan_row), mask=rows < R)
    if WRITE_P:
        p = _finish(_probs(s, t, norm, q, MODE), valid, nan_row)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_long_kernel(x_ptr, p_ptr, tau_ptr, N, alpha, q, MAX_ITERS,
                     MODE: tl.constexpr, WRITE_P: tl.constexpr, CHUNK: tl.constexpr, FUSED: tl.constexpr):
    """One long row per program; every pass loops over chunks of the row."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * N
    cols = tl.arange(0, CHUNK)[None, :]
    zero = tl.zeros([1], tl.float32)

    m, total, count = zero + float("-inf"), zero, zero
    for start in range(0, N, CHUNK):
        x = tl.load(base + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
        cm, ct, cc = _first_stats(x * (alpha - 1.0), FUSED)
        m, total, count = tl.maximum(m, cm), total + ct, count + cc
    t, lo, hi, norm, done, valid, nan_row = _start(m, total, count, alpha, MODE)
    it = 0
    while (it < MAX_ITERS) & (tl.min(done.to(tl.int32), 0) == 0):
        k, f1, f2, mn = zero, zero, zero, zero + float("inf")
        for start in range(0, N, CHUNK):
            x = tl.load(base + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
            ck, c1, c2, cmn = _iter_stats(x * (alpha - 1.0), t, q, MODE, FUSED)
            k, f1, f2, mn = k + ck, f1 + c1, f2 + c2, tl.minimum(mn, cmn)
        t, lo, hi, norm, done = _step(t, lo, hi, norm, done, k, f1, f2, mn, q, MODE)
        it += 1

    tl.store(tau_ptr + row + tl.arange(0, 1), _tau_out(t, valid, nan_row))
    if WRITE_P:
        for start in range(0, N, CHUNK):
            x = tl.load(base + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
            p = _finish(_probs(x * (alpha - 1.0), t, norm, q, MODE), valid, nan_row)
            tl.store(p_ptr + row * N + start + cols, p.to(p_ptr.dtype.element_ty), mask=start + cols < N)


# ----------------------------------------------------------------------------- backward kernels


@triton.jit
def _gate(p, alpha, MODE: tl.constexpr):
    """u = p^(2 - alpha) on the support (NaN kept so that a NaN row stays NaN)."""
    keep = (p > 0.0) | (p != p)
    if MODE == MODE_ENTMAX15:
        u = tl.sqrt(p)
    elif MODE == MODE_SPARSEMAX:
        u = tl.where(p != p, p, 1.0)
    else:
        u = tl.exp2((2.0 - alpha) * tl.log2(tl.where(keep, p, 1.0)))
    return tl.where(keep, u, 0.0)


@triton.jit
def _bwd_rows_kernel(p_ptr, grad_ptr, dx_ptr, R, N, alpha,
                     MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, FUSED: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < R) & (cols[None, :] < N)
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    grad = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = _gate(p, alpha, MODE)
    ug = u * grad
    if FUSED:
        sum_u, sum_ug = tl.reduce((u, ug), 1, _combine_sums)
    else:
        sum_u, sum_ug = tl.sum(u, 1), tl.sum(ug, 1)
    coef = tl.where(sum_u > 0.0, sum_ug / sum_u, 0.0)
    dx = ug - u * coef[:, None]
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_long_kernel(p_ptr, grad_ptr, dx_ptr, N, alpha, MODE: tl.constexpr, CHUNK: tl.constexpr,
                     FUSED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, CHUNK)
    sum_u = tl.zeros([CHUNK], tl.float32)
    sum_ug = tl.zeros([CHUNK], tl.float32)
    for start in range(0, N, CHUNK):
        mask = start + cols < N
        p = tl.load(p_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
        grad = tl.load(grad_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
        u = _gate(p, alpha, MODE)
        sum_u += u
        sum_ug += u * grad
    if FUSED:
        total_u, total_ug = tl.reduce((sum_u, sum_ug), 0, _combine_sums)
    else:
        total_u, total_ug = tl.sum(sum_u, 0), tl.sum(sum_ug, 0)
    coef = tl.where(total_u > 0.0, total_ug / total_u, 0.0)
    for start in range(0, N, CHUNK):
        mask = start + cols < N
        p = tl.load(p_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
        grad = tl.load(grad_ptr + row * N + start + cols, mask=mask, other=0.0).to(tl.float32)
        u = _gate(p, alpha, MODE)
        dx = u * grad - u * coef
        tl.store(dx_ptr + row * N + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launchers


def _check(x2d: torch.Tensor, alpha) -> float:
    if not isinstance(x2d, torch.Tensor) or x2d.dim() != 2:
        raise ValueError(f"entmax_rows expects a 2D tensor (rows, n), got {getattr(x2d, 'shape', type(x2d))}")
    if x2d.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"entmax_rows supports float32, float16 and bfloat16, got {x2d.dtype}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"entmax_rows expects alpha as a python float, got {type(alpha).__name__}")
    alpha = float(alpha)
    if not ALPHA_RANGE[0] <= alpha <= ALPHA_RANGE[1]:
        low, high = ALPHA_RANGE
        raise ValueError(f"entmax_rows supports alpha in [{low:g}, {high:g}], got {alpha} "
                         "(asentmax.ops.entmax.entmax computes other alphas on its torch path)")
    return alpha


def _row_config(n: int, num_warps=None, elems_per_program=None):
    """(BLOCK_R, BLOCK_N, num_warps) for the in-register kernels: about 16 fp32 values per thread
    (32 for the longest rows): the fastest of the launch sweep in results/entmax_gpu.md (8192 x 1024:
    one row and 2 warps per program; 1024 x 32768: 32 warps), free of register spills (ptxas, sm_90)."""
    block_n = triton.next_power_of_2(max(n, 1))
    block_r = max(1, min(64, (elems_per_program or 1024) // block_n))
    if num_warps is None:
        num_warps = min(32, max(1, triton.next_power_of_2(block_r * block_n // 512)))
    return block_r, block_n, num_warps


def _forward(x2d, alpha, *, write_p=True, max_block_n=MAX_BLOCK_N, num_warps=None, elems_per_program=None,
             fused=False):
    """Launch the forward; returns (p or None, tau fp32 (R,)). Keyword arguments tune/test the launch."""
    x2d = x2d.contiguous()
    R, N = x2d.shape
    mode = mode_of(alpha)
    q = 1.0 / (alpha - 1.0)
    max_iters = MAX_ITERS_GENERAL if mode == MODE_GENERAL else MAX_ITERS_FAST
    tau = torch.empty(R, device=x2d.device, dtype=torch.float32)
    p = torch.empty_like(x2d) if write_p else None
    if R == 0 or N == 0:
        return p, tau.fill_(float("inf"))
    out = p if write_p else x2d  # never written when WRITE_P is False
    if triton.next_power_of_2(N) <= max_block_n:
        block_r, block_n, warps = _row_config(N, num_warps, elems_per_program)
        _fwd_rows_kernel[(triton.cdiv(R, block_r),)](
            x2d, out, tau, R, N, alpha, q, max_iters,
            MODE=mode, WRITE_P=write_p, BLOCK_R=block_r, BLOCK_N=block_n, FUSED=fused, num_warps=warps)
    else:
        chunk = min(LONG_CHUNK, max_block_n)
        _fwd_long_kernel[(R,)](x2d, out, tau, N, alpha, q, max_iters,
                               MODE=mode, WRITE_P=write_p, CHUNK=chunk, FUSED=fused, num_warps=num_warps or 8)
    return p, tau


def _backward(p, grad, alpha, *, max_block_n=MAX_BLOCK_N, num_warps=None, elems_per_program=None,
              fused=False):
    """Launch the backward: dx = u*grad - u*sum(u*grad)/sum(u), u = p^(2-alpha) on the support."""
    grad = grad.contiguous()
    R, N = p.shape
    dx = torch.empty_like(p)
    if R == 0 or N == 0:
        return dx
    mode = mode_of(alpha)
    if triton.next_power_of_2(N) <= max_block_n:
        block_r, block_n, warps = _row_config(N, num_warps, elems_per_program)
        _bwd_rows_kernel[(triton.cdiv(R, block_r),)](p, grad, dx, R, N, alpha, MODE=mode, BLOCK_R=block_r,
                                                     BLOCK_N=block_n, FUSED=fused, num_warps=warps)
    else:
        chunk = min(LONG_CHUNK, max_block_n)
        _bwd_long_kernel[(R,)](p, grad, dx, N, alpha, MODE=mode, CHUNK=chunk, FUSED=fused,
                               num_warps=num_warps or 8)
    return dx


def entmax_rows_forward(x2d: torch.Tensor, alpha: float) -> torch.Tensor:
    """p (R, N) of x2d's dtype, no autograd (the launch asentmax.ops.entmax's custom op makes)."""
    return _forward(x2d, _check(x2d, alpha))[0]


def entmax_rows_backward(p: torch.Tensor, grad: torch.Tensor, alpha: float) -> torch.Tensor:
    """dx (R, N) of p's dtype for the incoming gradient `grad` of p = entmax_rows_forward(x2d, alpha)."""
    return _backward(p, grad.to(p.dtype), _check(p, alpha))


class _EntmaxRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, alpha):
        p = entmax_rows_forward(x2d, alpha)
        ctx.save_for_backward(p)
        ctx.alpha = alpha
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return entmax_rows_backward(p, grad, ctx.alpha), None


def entmax_rows(x2d: torch.Tensor, alpha: float = 1.5) -> torch.Tensor:
    """alpha-entmax over the last dim of a 2D tensor, with autograd for x2d (first order only:
    asentmax.ops.entmax.entmax(..., backend="triton") also differentiates twice).

    Args:
        x2d: (R, N) float32 / float16 / bfloat16 tensor on a CUDA device (or CPU under TRITON_INTERPRET=1).
        alpha: python float in ALPHA_RANGE = [1.01, 2] (1.5 and 2.0 take exact closed-form fast paths).
    Returns:
        p: (R, N), x2d's dtype, rows summing to 1 (all -inf rows: zeros; rows with a NaN or +inf: NaN).
    """
    return _EntmaxRows.apply(x2d, _check(x2d, alpha))


def entmax_rows_threshold(x2d: torch.Tensor, alpha: float = 1.5) -> torch.Tensor:
    """tau (R,) float32 with p = clamp((alpha - 1) * x - tau, min=0) ** (1 / (alpha - 1)).

    Rows that are entirely -inf give +inf, rows with a NaN give NaN. No autograd.
    """
    alpha = _check(x2d, alpha)
    return _forward(x2d.detach(), alpha, write_p=False)[1]
