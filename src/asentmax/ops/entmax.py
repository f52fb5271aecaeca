"""Exact alpha-entmax with autograd for x and alpha (PAPER.md section 2, the alpha-entmax definition).

    p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1)),   tau such that sum_i p_i = 1.

alpha -> 1+ is softmax, alpha = 1.5 the paper's default, alpha = 2 sparsemax. Public functions:
`entmax(x, alpha, dim)`, `entmax15`, `sparsemax` (differentiable in x and, for tensor alpha, in alpha)
and `entmax_threshold(x, alpha, dim) -> tau`. Any alpha > 1; alpha is a float or a tensor that
broadcasts to x and has size 1 along `dim` (one alpha per row).

How tau is found on the CPU (asentmax.ops._entmax_solver does the root finding):
  * Work relative to the row maximum m: s = (alpha - 1)(z - m) <= 0, so tau - (alpha - 1) m lies in
    [-1, 0) and only entries with z > m - 1/(alpha - 1) can be in the support. No row is sorted.
  * Candidates are compacted into a small (rows, k) fp64 matrix (k = most candidates in a row) when
    they are few; otherwise Newton passes over the full rows raise the lower bound until they are.
  * The solver finds tau to working precision (closed forms on the support for alpha = 1.5 and 2).
  * p is written only at the candidate positions of a zero-filled output.
CUDA tensors with a python-float alpha go to the Triton row kernel (asentmax.ops.triton.entmax_rows).

Backward (u = p^(2 - alpha) on the support, U = sum u):
    dx_i = u_i (g_i - sum_j u_j g_j / U)
    d p_i / d alpha = (p_i - u_i/U) / (alpha-1)^2 - (p_i log p_i - (u_i/U) sum_j p_j log p_j) / (alpha-1)
(differentiate sum_i p_i = 1 to get d tau / d alpha, then substitute; see tests/test_entmax_grad.py).
Half-precision inputs are computed in fp32 and returned in their dtype; fp64 stays fp64.
"""

import math

import torch

from asentmax.ops._entmax_solver import power_sums, solve_threshold

# A row is compacted when its candidates fill at most this fraction of the longest row.
_COMPACT_FRACTION = 0.125


def _check_inputs(x, alpha, dim):
    """Validate; return alpha as a python float or a tensor, and the normalised dim."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"entmax expects a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"entmax needs a floating-point input, got dtype {x.dtype}")
    if x.dim() == 0:
        raise ValueError("entmax needs an input with at least one dimension, got a 0-d tensor")
    dim = dim % x.dim() if -x.dim() <= dim < x.dim() else None
    if dim is None:
        raise ValueError(f"dim out of range for an input with {x.dim()} dimensions")
    if isinstance(alpha, torch.Tensor):
        if not alpha.is_floating_point():
            raise ValueError(f"alpha must be a floating-point tensor, got dtype {alpha.dtype}")
        if alpha.dim() > x.dim():
            raise ValueError(f"alpha of shape {tuple(alpha.shape)} has more dims than x {tuple(x.shape)}")
        shape = (1,) * (x.dim() - alpha.dim()) + tuple(alpha.shape)
        for i, (sa, sx) in enumerate(zip(shape, x.shape, strict=True)):
            if sa not in (1, sx) or (i == dim and sa != 1):
                raise ValueError(
                    f"alpha of shape {tuple(alpha.shape)} must broadcast to x of shape {tuple(x.shape)} "
                    f"with size 1 along dim {dim}")
        if not bool(((alpha.detach() > 1) & torch.isfinite(alpha.detach())).all()):
            raise ValueError("alpha must be finite and > 1 everywhere (alpha = 1 is softmax)")
        if alpha.dim() == 0 and not alpha.requires_grad:
            alpha = float(alpha)
    else:
        alpha = float(alpha)
        if not 1 < alpha < math.inf:
            raise ValueError(f"alpha must be finite and > 1 (alpha = 1 is softmax), got {alpha}")
    return alpha, dim


def compute_dtype(dtype):
    """fp64 stays fp64; every other input dtype is computed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _alpha_rows(alpha, x, dim):
    """A tensor alpha as an (R, 1) column matching the rows of x moved to 2D (dim last)."""
    shape = list(x.shape)
    shape[dim] = 1
    a = alpha.to(compute_dtype(x.dtype)).reshape((1,) * (x.dim() - alpha.dim()) + tuple(alpha.shape))
    return a.expand(shape).movedim(dim, -1).reshape(-1, 1)


def _compact_solve(x, m, marks, alpha, t_lower):
    """Solve on the candidates (marks != 0) gathered into a (R, k) fp64 matrix padded with -inf.

    Returns tau - (alpha - 1) m (R, 1), the flat indices of the candidates, and p at them (x's dtype).
    A row without candidates (NaN or all -inf) gets a single 0 entry; its result is overwritten."""
    n_rows, n = x.shape
    flat_index = marks.view(-1).bool().nonzero().squeeze(1)  # a bool scan reads 4x fewer bytes
    rows = torch.div(flat_index, n, rounding_mode="floor")
    counts = torch.bincount(rows, minlength=n_rows)
    k = max(int(counts.max()), 1)
    # the i-th candidate (row-major) goes to slot i - (candidates before its row) of its row
    shift = torch.arange(n_rows, device=x.device) * k - (torch.cumsum(counts, 0) - counts)
    slots = shift.index_select(0, rows).add_(torch.arange(flat_index.numel(), device=x.device))
    s = torch.full((n_rows, k), float("-inf"), dtype=torch.float64, device=x.device)
    s.view(-1).index_copy_(0, slots, x.view(-1).index_select(0, flat_index).double())
    s[:, 0].masked_fill_(counts == 0, 0.0)
    s.sub_(m.double()).mul_(alpha - 1.0)
    t = solve_threshold(s, alpha, t_lower.double())
    p = _probs_from(s, t, alpha).view(-1).index_select(0, slots).to(x.dtype)
    return t, flat_index, p


def _probs_from(s, tau, alpha):
    """p = [s - tau]_+ ^ (1/(alpha-1)), computed in place in s (integer powers <= 8 by multiplication)."""
    d = s.sub_(tau).clamp_(min=0)
    q = 1.0 / (alpha - 1.0)
    if isinstance(q, torch.Tensor) or not q.is_integer() or q > 8:
        return d.pow_(q)
    if q in (1.0, 2.0, 4.0, 8.0):  # repeated squaring in place
        for _ in range(int(q).bit_length() - 1):
            d.mul_(d)
        return d
    p = d.clone()
    for _ in range(int(q) - 1):
        p.mul_(d)
    return p


def _below(threshold):
    """The next representable value below: a candidate cut that rounding cannot have moved up."""
    return torch.nextafter(threshold, torch.full_like(threshold, -math.inf))


def _raise_lower_bound(x, m, alpha, marks):
    """Newton passes over the full rows that raise a lower bound t of tau - (alpha-1) m (fp32 is fine).

    Starts at t = -1. Since 0 <= d = [s - t]_+ <= 1, F_q(t) = sum d^q >= sum d^k for the integer
    k = ceil(q), so the root of the surrogate sum d^k = 1 is a lower bound of tau; Newton on its
    phi = (sum d^k)^(1/k) - 1 from below stays below it and needs multiplications only (k = q itself,
    with pow, when ceil(q) > 4). The passes work on x directly: d = (alpha - 1) [x - m - t/(alpha-1)]_+.
    Stops when the candidates {s > t} are few enough to compact, or a pass fails to halve them.
    Returns t (R, 1), the largest candidate count, and marks (R, n) = 1.0 at the candidates."""
    n = x.shape[1]
    a = alpha - 1.0
    t = torch.full_like(m, -1.0)
    torch.gt(x, _below(m - 1.0 / a), out=marks)
    kmax = float(marks.sum(1).max())
    q = 1.0 / a
    k = math.ceil(float(q.max()) if isinstance(q, torch.Tensor) else q)
    k = k if k <= 4 else q  # beyond k = 4, pow is cheaper than the multiplications
    scratch = None  # a second (R, n) buffer, allocated (page faults) only where power_sums needs one
    previous = math.inf  # the candidate count before the last pass
    while kmax > _COMPACT_FRACTION * n and kmax < 0.5 * previous:
        d = torch.sub(x, m + t / a, out=marks).clamp_(min=0)  # [s - t]_+ / (alpha - 1)
        if isinstance(k, int) and k == 4:
            # F exactly, and D = sum d^3 <= |d| |d^2| (Cauchy-Schwarz): two norms instead of two
            # products; the larger D only shortens the step, which stays below the root. d^2 in place.
            norm_d = torch.linalg.vector_norm(d, 2, dim=1, keepdim=True)
            f = torch.linalg.vector_norm(d.mul_(d), 2, dim=1, keepdim=True).square()
            df = norm_d * f.sqrt()
        else:
            if scratch is None and not (isinstance(k, int) and k == 2):
                scratch = torch.empty_like(x)
            f, df = power_sums(d, k, scratch)
        f, df = f * a**k, df * a ** (k - 1)
        t_new = t + (f - f.pow(1.0 - 1.0 / k)) / df
        # a hair below the iterate, against fp32 rounding (|t| <= 1)
        t = torch.where(t_new > t, t_new - 1e-4 * (t_new - t) - 1e-6, t)
        torch.gt(x, _below(m + t / a), out=marks)
        previous, kmax = kmax, float(marks.sum(1).max())
    return t, kmax


def _forward_2d(x, alpha, out):
    """x (R, n) fp32/fp64 contiguous; alpha float or (R, 1); out an (R, n) buffer of x's dtype.

    Returns p (in out), tau (R, 1) in absolute units (p = [(alpha - 1) x - tau]_+^(1/(alpha-1))), and
    the flat indices of the candidates (a superset of the support) when the compact solve ran, else None."""
    n = x.shape[1]
    if x.numel() == 0:  # no rows, or rows of length 0 (empty: tau = +inf)
        return out, torch.full((x.shape[0], 1), float("inf"), dtype=x.dtype, device=x.device), None
    a = alpha - 1.0
    m = x.amax(dim=1, keepdim=True)
    nan_rows = torch.isnan(m) | (m == float("inf"))  # NaN in gives NaN out (as softmax does for +inf)
    empty_rows = m == float("-inf")  # fully masked: p = 0, tau = +inf
    bad = nan_rows | empty_rows
    any_bad = bool(bad.any())
    if any_bad:
        x = x.masked_fill(bad, 0.0)
        m = m.masked_fill(bad, 0.0)
    t_lower, kmax = _raise_lower_bound(x, m.masked_fill(bad, float("inf")) if any_bad else m, alpha, out)
    alpha64 = alpha if isinstance(alpha, float) else alpha.double()
    flat_index = None
    if kmax <= 0.5 * n:  # out holds the candidate marks
        t, flat_index, p = _compact_solve(x, m, out, alpha64, t_lower)
        out.zero_().view(-1).index_copy_(0, flat_index, p)
    else:
        s = x.to(torch.float64, copy=True).sub_(m.double()).mul_(alpha64 - 1.0)
        t = solve_threshold(s, alpha64, t_lower.double())
        out.copy_(_probs_from(s, t, alpha64))
    tau = t.to(x.dtype) + a * m
    if any_bad:
        out.masked_fill_(empty_rows, 0.0).masked_fill_(nan_rows, float("nan"))
        tau = tau.masked_fill(empty_rows, float("inf")).masked_fill(nan_rows, float("nan"))
    return out, tau, flat_index


def _move_to_rows(x, dim):
    """x with dim moved last, as a contiguous (R, n) tensor in the compute dtype."""
    return x.movedim(dim, -1).to(compute_dtype(x.dtype)).reshape(_n_rows(x, dim), x.shape[dim]).contiguous()


def _n_rows(x, dim):
    return math.prod(x.shape[:dim] + x.shape[dim + 1:])


def _from_rows(p2d, x, dim):
    shape = list(x.movedim(dim, -1).shape)
    return p2d.reshape(shape).movedim(-1, dim)


def _gate(p, alpha):
    """u = p^(2 - alpha) on the support, 0 elsewhere (the entmax Jacobian weight)."""
    if isinstance(alpha, float) and alpha == 2.0:
        return torch.sign(p)
    if isinstance(alpha, float) and alpha == 1.5:
        return p.sqrt()
    return torch.where(p > 0, p, 1.0).pow_(2.0 - alpha).masked_fill_(p <= 0, 0.0)


def _vjp(p, grad, alpha, row_sum, per_entry, need_alpha):
    """Vector-Jacobian products for x and alpha on entries p (all of them, or the support only).

    row_sum(v) sums entries per row into (R, 1); per_entry(r) spreads an (R, 1) row value over the
    entries; alpha is a float or (R, 1). Returns dx at the entries and dalpha (R, 1) or None."""
    alpha_e = alpha if isinstance(alpha, float) else per_entry(alpha)
    u = _gate(p, alpha_e)
    total = row_sum(u)
    total = torch.where(total > 0, total, 1.0)  # all -inf rows: u = 0 and the gradient is 0
    ug = u * grad
    dx = ug.sub_(u * per_entry(row_sum(ug) / total))
    if not need_alpha:
        return dx, None
    a = alpha_e - 1.0
    plogp = torch.xlogy(p, p)
    skew = u / per_entry(total)
    dp_da = (p - skew) / (a * a) - (plogp - skew * per_entry(row_sum(plogp))) / a
    return dx, row_sum(grad * dp_da)


class _EntmaxFunction(torch.autograd.Function):
    """Autograd on (R, n) rows; alpha is a float or an (R, 1) tensor."""

    @staticmethod
    def forward(ctx, x2d, alpha_rows, alpha_float):
        alpha = alpha_float if alpha_rows is None else alpha_rows
        p, _, flat_index = _forward_2d(x2d, alpha, torch.empty_like(x2d))
        ctx.alpha = alpha
        ctx.save_for_backward(p, flat_index)
        return p

    @staticmethod
    def backward(ctx, grad):
        p, flat_index = ctx.saved_tensors
        need_alpha = ctx.needs_input_grad[1]
        if flat_index is None:  # dense rows
            dx, dalpha = _vjp(p, grad, ctx.alpha, lambda v: v.sum(1, keepdim=True), lambda r: r,
                              need_alpha)
            return dx, dalpha, None
        # only the candidates (a superset of the support) can have a nonzero gradient
        n_rows, n = p.shape
        rows = torch.div(flat_index, n, rounding_mode="floor")
        p_e = p.view(-1).index_select(0, flat_index)
        grad_e = grad.reshape(-1).index_select(0, flat_index)

        def row_sum(v):
            return torch.zeros(n_rows, dtype=v.dtype, device=v.device).index_add_(0, rows, v).unsqueeze(1)

        def per_entry(r):
            return r.reshape(-1).index_select(0, rows)

        dx_e, dalpha = _vjp(p_e, grad_e, ctx.alpha, row_sum, per_entry, need_alpha)
        dx = torch.zeros_like(p)
        dx.view(-1).index_copy_(0, flat_index, dx_e)
        return dx, dalpha, None


def _triton_rows(x, alpha, dim):
    """CUDA fast path: the Triton row kernel (owner: ops/triton/entmax_rows.py), or None if unusable."""
    if not (x.is_cuda and isinstance(alpha, float) and x.dtype != torch.float64):  # the kernel is fp32 inside
        return None
    try:
        from asentmax.ops.triton.entmax_rows import entmax_rows
    except ImportError:
        return None
    x2d = x.movedim(dim, -1).reshape(_n_rows(x, dim), x.shape[dim]).contiguous()
    return _from_rows(entmax_rows(x2d, alpha), x, dim)


def entmax(x, alpha=1.5, dim=-1):
    """alpha-entmax of x along dim, differentiable in x and (tensor alpha) in alpha.

    Args:
        x: floating tensor, any shape; -inf entries get exactly 0, an all -inf row gives zeros.
        alpha: float > 1, or tensor > 1 broadcastable to x with size 1 along dim (e.g. per row).
        dim: the dimension that sums to 1.
    Returns p with x's shape and dtype (fp16/bf16 computed in fp32).
    """
    alpha, dim = _check_inputs(x, alpha, dim)
    out = _triton_rows(x, alpha, dim)
    if out is not None:
        return out
    x2d = _move_to_rows(x, dim)
    if isinstance(alpha, torch.Tensor):
        p2d = _EntmaxFunction.apply(x2d, _alpha_rows(alpha, x, dim), None)
    else:
        p2d = _EntmaxFunction.apply(x2d, None, alpha)
    return _from_rows(p2d, x, dim).to(x.dtype)


def entmax15(x, dim=-1):
    """1.5-entmax (the paper's default) along dim."""
    return entmax(x, 1.5, dim)


def sparsemax(x, dim=-1):
    """sparsemax (2-entmax) along dim."""
    return entmax(x, 2.0, dim)


def entmax_threshold(x, alpha=1.5, dim=-1):
    """tau with p = clamp((alpha-1) x - tau, min=0) ** (1/(alpha-1)) summing to 1 along dim.

    keepdim shape; fp64 for fp64 x, fp32 otherwise; +inf for all -inf rows, NaN for rows with NaN.
    Not differentiable."""
    alpha, dim = _check_inputs(x, alpha, dim)
    with torch.no_grad():
        x2d = _move_to_rows(x, dim)
        rows_alpha = _alpha_rows(alpha, x, dim) if isinstance(alpha, torch.Tensor) else alpha
        _, tau, _ = _forward_2d(x2d, rows_alpha, torch.empty_like(x2d))
    shape = list(x.movedim(dim, -1).shape)
    shape[-1] = 1
    return tau.reshape(shape).movedim(-1, dim)
