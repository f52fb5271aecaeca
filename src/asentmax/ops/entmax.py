"""Exact alpha-entmax with autograd for x and alpha (arXiv:2506.16640, section 2: the alpha-entmax map).

    p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1)),   tau such that sum_i p_i = 1.

alpha -> 1+ is softmax, alpha = 1.5 the paper's default, alpha = 2 sparsemax. Public functions:
`entmax(x, alpha, dim, backend)`, `entmax15`, `sparsemax` (differentiable in x and, for tensor alpha, in
alpha) and `entmax_threshold(x, alpha, dim) -> tau`. alpha is a float or a tensor that broadcasts to x
and has size 1 along `dim` (one alpha per row).

Supported range: any alpha in (1, ALPHA_MAX = 10] (the whole range is checked against fp64 and 60-digit
oracles in tests/test_entmax_alpha_range.py); larger alphas raise ValueError. Near alpha = 10 the map
is extremely steep (p = d^(1/9) for an entry a distance d inside the support), so entries at the edge of
the support are as sensitive to rounding of the input as they are in exact arithmetic.

backend: "auto" (the default) sends CUDA tensors with a python-float alpha inside the Triton row
kernel's range (asentmax.ops.triton.entmax_rows.ALPHA_RANGE = [1.01, 2]; fp32/fp16/bf16) to that kernel,
everything else to the torch path; "reference" is the torch path on every device (what the "reference"
and "chunked" attention backends use: pure torch); "triton" insists on the kernel (ValueError where it
cannot run).

How tau is found on the torch path (asentmax.ops._entmax_solver does the root finding):
  * Work relative to the row maximum m: s = (alpha - 1)(z - m) <= 0, so tau - (alpha - 1) m lies in
    [-1, 0) and only entries with z > m - 1/(alpha - 1) can be in the support. No row is sorted.
  * Candidates are compacted into a small (rows, k) fp64 matrix (k = most candidates in a row) when
    they are few; otherwise Newton passes over the full rows raise the lower bound until they are, or
    until a pass removes fewer than a quarter of them. Rows whose candidates are still more than half the
    row are solved over their full length, apart from the rest, which are compacted (attention mixes
    near-uniform heads and sharp ones in one call), each class of rows by candidate count (up to 16, 64,
    256, then the rest) at its own width.
  * The solver finds tau to working precision in fp64 (closed forms on the support for alpha = 1.5 and
    2; for alpha > 2 a correction below tau's resolution, solved in the shifted variable s - tau, keeps
    the digits of entries at the edge of the support); for alphas other than 1.5 and 2, p is divided by
    its row sum, so every row sums to 1 to the output's precision.
  * p is written only at the candidate positions of a zero-filled output.

Backward (u = p^(2 - alpha) on the support, U = sum u, w = u / U, k = the entry of largest u):
    dx_i = u_i ((g_i - g_k) - sum_j w_j (g_j - g_k))
which is u_i (g_i - sum_j w_j g_j) written without the cancellation that loses the largest-u entry when
u spans many orders of magnitude (alpha > 2: u is largest where p is smallest). d p / d alpha is
    (p_i - w_i) / (alpha-1)^2 - (p_i log p_i - w_i sum_j p_j log p_j) / (alpha-1),
computed in fp64 in the form p_i [B (1 - a L_i) - b_i (1 - a H)] / U with a = alpha - 1, L = log p,
H = sum p L, b_i = L_i^2 phi(-a L_i), phi(x) = (e^x - 1 - x) / x^2 (a series for small x), B = sum p b:
the two 1/a^2 terms cancel analytically instead of in floating point (the gradient stays exact as
alpha -> 1). On the torch path the formula runs on each row's support (compacted like the forward's
candidates when it is small). It is made of differentiable torch operations, and with create_graph=True
it is what runs (on the Triton path too), so double backward works.

NaN (or +inf) anywhere in a row gives a NaN row, a NaN gradient for that row's x, and a NaN alpha
gradient for that row; other rows are unaffected. This holds on every path (closed forms, general and
tensor alpha, torch and Triton). A row that is entirely -inf gives zeros (tau = +inf) and zero gradients.

torch.compile: the forward is one custom op, `torch.ops.asentmax.entmax` (torch.library, with a fake
kernel and registered autograd; its data-dependent candidate search stays behind that boundary), the
backward `asentmax::entmax_bwd` (torch) or `asentmax::entmax_rows_bwd` (Triton); under create_graph=True
the backward formula itself is traced. fullgraph=True compiles through `entmax` on both devices, and new
lengths reuse the graph once its dims are dynamic.
Half-precision inputs are computed in fp32 and returned in their dtype; fp64 stays fp64.
"""

import math
import os
from typing import Optional

import torch

from asentmax.ops._entmax_solver import power_sums, solve_threshold

ALPHA_MAX = 10.0
BACKENDS = ("auto", "reference", "triton")
# A row is compacted when its candidates fill at most this fraction of the longest row.
_COMPACT_FRACTION = 0.125
# The lower-bound passes go on while a pass leaves fewer than this fraction of the most candidates in a row
# (a pass costs a few fp32 sweeps of the rows; compacting rows to near half their length costs more than the
# sweeps that shrink them further: results/entmax_pass_shrink_cpu.md).
_PASS_SHRINK = 0.75
# Compacted rows are solved in classes by candidate count (at most 16, 64, 256, then the rest), each class at
# its own width: attention mixes heads of a few candidates with broad ones in one call.
_CLASS_WIDTHS = (16, 64, 256)
_CLASS_MIN_SAVING = 1 << 17  # entries of padding a class must save (about 1 ms of solving on one core)


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
        # the values are checked inside the custom op (_check_alpha_values): no host sync while tracing
        if alpha.dim() == 0 and not alpha.requires_grad and not torch.compiler.is_compiling():
            _check_alpha_values(alpha)
            alpha = float(alpha)
    else:
        alpha = float(alpha)
        if not 1 < alpha <= ALPHA_MAX:
            raise ValueError(f"alpha must be in (1, {ALPHA_MAX:g}] (alpha = 1 is softmax), got {alpha}")
    return alpha, dim


def _check_alpha_values(alpha):
    """ValueError unless every entry of the tensor alpha is in (1, ALPHA_MAX]."""
    if not bool(((alpha.detach() > 1) & (alpha.detach() <= ALPHA_MAX)).all()):
        raise ValueError(f"alpha must be in (1, {ALPHA_MAX:g}] everywhere (alpha = 1 is softmax)")


def compute_dtype(dtype):
    """fp64 stays fp64; every other input dtype is computed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _alpha_rows(alpha, x, dim):
    """A tensor alpha as an (R, 1) column matching the rows of x moved to 2D (dim last)."""
    shape = list(x.shape)
    shape[dim] = 1
    a = alpha.to(compute_dtype(x.dtype)).reshape((1,) * (x.dim() - alpha.dim()) + tuple(alpha.shape))
    return a.expand(shape).movedim(dim, -1).reshape(-1, 1)


def _normalise(p, alpha):
    """Divide each row by its sum for general alpha (a closed-form tau is exact: those rows stay)."""
    if isinstance(alpha, float) and alpha in (1.5, 2.0):
        return p
    total = p.sum(1, keepdim=True)
    return p.div_(torch.where(total > 0, total, 1.0))


def _marked(flat_marks, n_rows, n):
    """The marked entries of an (n_rows, n) matrix, row-major: (flat_index: their positions, rows: their
    rows, counts: marks per row, first: where each row's marks start in flat_index)."""
    flat_index = flat_marks.nonzero().squeeze(1)
    rows = torch.div(flat_index, n, rounding_mode="floor")
    counts = torch.bincount(rows, minlength=n_rows)
    return flat_index, rows, counts, torch.cumsum(counts, 0) - counts


def _compaction(flat_marks, n_rows, n):
    """Where the marked entries of an (n_rows, n) matrix go in an (n_rows, k) one, k = most marks in a row.

    Returns (flat_index: their positions, slots: their positions in the compact matrix, counts per row, k)."""
    flat_index, rows, counts, first = _marked(flat_marks, n_rows, n)
    k = max(int(counts.max()), 1) if n_rows else 1
    # the i-th mark (row-major) goes to slot i - (marks before its row) of its row
    shift = torch.arange(n_rows, device=flat_marks.device) * k - first
    slots = shift.index_select(0, rows).add_(torch.arange(flat_index.numel(), device=flat_marks.device))
    return flat_index, slots, counts, k


def _compact_classes(counts):
    """[(members, width)]: the positions in `counts` (candidates per row) of each class of rows solved
    together, and the width of its compact matrix (its largest count, at least 1). Classes: counts up to each
    of _CLASS_WIDTHS, then the rest, so that a row of a few candidates is not padded to the width of a broad
    one; a class whose padding to the next width would cost fewer than _CLASS_MIN_SAVING entries joins it
    (each class costs a solve of its own)."""
    bucket = torch.bucketize(counts, torch.tensor(_CLASS_WIDTHS, device=counts.device))
    classes, pending = [], None
    for index in torch.unique(bucket).tolist():  # ascending widths
        members = (bucket == index).nonzero().squeeze(1)
        width = max(int(counts.index_select(0, members).max()), 1)
        if pending is not None:
            if pending[0].numel() * (width - pending[1]) < _CLASS_MIN_SAVING:
                members = torch.cat([pending[0], members])
            else:
                classes.append(pending)
        pending = (members, width)
    return classes + [pending]


def _compact_solve(x, m, marks, alpha, t_lower, rows):
    """Solve rows `rows` of x on their candidates (marks != 0; every other row's marks are 0), each class of
    _compact_classes gathered into a (class rows, width) fp64 matrix padded with -inf.

    Returns tau - (alpha - 1) m (len(rows), 1), the flat indices of the candidates in x (row-major) and p at
    them (x's dtype). A row without candidates (NaN or all -inf) gets a single 0 entry; its result is
    overwritten."""
    n_rows, n = x.shape
    flat_index, _, counts, first = _marked(marks.view(-1).bool(), n_rows, n)  # bool: 4x fewer bytes
    row_counts = counts.index_select(0, rows)
    t = torch.empty((rows.numel(), 1), dtype=torch.float64, device=x.device)
    p = torch.empty(flat_index.numel(), dtype=x.dtype, device=x.device)
    for members, width in _compact_classes(row_counts):
        class_rows, c = rows.index_select(0, members), row_counts.index_select(0, members)
        total = int(c.sum())
        # each candidate's row in the class, and its place among that row's candidates
        owner = torch.repeat_interleave(torch.arange(members.numel(), device=x.device), c, output_size=total)
        offset = torch.arange(total, device=x.device) - (torch.cumsum(c, 0) - c).index_select(0, owner)
        which = first.index_select(0, class_rows).index_select(0, owner) + offset
        slots = owner * width + offset
        s = torch.full((members.numel(), width), float("-inf"), dtype=torch.float64, device=x.device)
        values = x.view(-1).index_select(0, flat_index.index_select(0, which))
        s.view(-1).index_copy_(0, slots, values.double())
        s[:, 0].masked_fill_(c == 0, 0.0)
        a = alpha if isinstance(alpha, float) else alpha.index_select(0, class_rows)
        s.sub_(m.index_select(0, class_rows).double()).mul_(a - 1.0)
        t_class, delta = solve_threshold(s, a, t_lower.index_select(0, class_rows).double())
        p_class = _normalise(_probs_from(s, t_class, delta, a), a).view(-1).index_select(0, slots)
        p.index_copy_(0, which, p_class.to(x.dtype))
        t.index_copy_(0, members, t_class + delta)
    return t, flat_index, p


def _probs_from(s, t, delta, alpha):
    """p = [(s - t) - delta]_+ ^ (1/(alpha-1)), in place in s (integer powers <= 8 by multiplication)."""
    d = s.sub_(t).sub_(delta).clamp_(min=0)
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


def _surrogate_power(q):
    """The power k of the lower-bound surrogate sum d^k = 1: k = ceil(q) (k >= q and 0 <= d <= 1 give
    sum d^k <= sum d^q, and Newton on the convex (sum d^k)^(1/k) - 1 from below stays below its root),
    except k = q itself (pow) when ceil(q) > 4. Per row for a tensor alpha."""
    if isinstance(q, torch.Tensor):
        return torch.where(q > 4, q, torch.ceil(q))
    k = math.ceil(q)
    return k if k <= 4 else q


def _raise_lower_bound(x, m, alpha, marks):
    """Newton passes over the full rows that raise a lower bound t of tau - (alpha-1) m (fp32 is fine).

    Starts at t = -1. Since 0 <= d = [s - t]_+ <= 1, F_q(t) = sum d^q >= sum d^k for k >= q, so the
    root of the surrogate sum d^k = 1 (k from _surrogate_power) is a lower bound of tau; Newton on its
    phi = (sum d^k)^(1/k) - 1 from below stays below it and needs multiplications only for integer k.
    The passes work on x directly: d = (alpha - 1) [x - m - t/(alpha-1)]_+.
    Stops when the candidates {s > t} are few enough to compact, or a pass leaves more than _PASS_SHRINK
    of them.
    Returns t (R, 1) and the candidate count of each row (R,), and marks (R, n) = 1.0 at the candidates."""
    n = x.shape[1]
    a = alpha - 1.0
    t = torch.full_like(m, -1.0)
    torch.gt(x, _below(m - 1.0 / a), out=marks)
    counts = marks.sum(1)
    kmax = float(counts.max())
    k = _surrogate_power(1.0 / a)
    scratch = None  # a second (R, n) buffer, allocated (page faults) only where power_sums needs one
    previous = math.inf  # the candidate count before the last pass
    while kmax > _COMPACT_FRACTION * n and kmax < _PASS_SHRINK * previous:
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
        counts = marks.sum(1)
        previous, kmax = kmax, float(counts.max())
    return t, counts


def _solve_full_rows(x, m, alpha64, t_lower):
    """Rows with many candidates, solved over their whole length: tau - (alpha - 1) m and p (fp64)."""
    s = x.to(torch.float64, copy=True).sub_(m.double()).mul_(alpha64 - 1.0)
    t, delta = solve_threshold(s, alpha64, t_lower.double())
    return t + delta, _normalise(_probs_from(s, t, delta, alpha64), alpha64)


def _forward_2d(x, alpha, out):
    """x (R, n) fp32/fp64 contiguous; alpha float or (R, 1); out an (R, n) buffer of x's dtype.

    Returns p (in out) and tau (R, 1) in absolute units (p = [(alpha - 1) x - tau]_+^(1/(alpha-1)))."""
    n_rows, n = x.shape
    if x.numel() == 0:  # no rows, or rows of length 0 (empty: tau = +inf)
        return out, torch.full((n_rows, 1), float("inf"), dtype=x.dtype, device=x.device)
    a = alpha - 1.0
    m = x.amax(dim=1, keepdim=True)
    nan_rows = torch.isnan(m) | (m == float("inf"))  # NaN in gives NaN out (as softmax does for +inf)
    empty_rows = m == float("-inf")  # fully masked: p = 0, tau = +inf
    bad = nan_rows | empty_rows
    any_bad = bool(bad.any())
    if any_bad:
        x = x.masked_fill(bad, 0.0)
        m = m.masked_fill(bad, 0.0)
    t_lower, counts = _raise_lower_bound(x, m.masked_fill(bad, float("inf")) if any_bad else m, alpha, out)
    alpha64 = alpha if isinstance(alpha, float) else alpha.double()
    dense = counts > 0.5 * n  # out holds the candidate marks
    n_dense = int(dense.sum())
    if n_dense == n_rows:
        t, p = _solve_full_rows(x, m, alpha64, t_lower)
        out.copy_(p)
    else:  # rows with more candidates than half their length over their whole length, the rest compacted
        t = torch.empty(m.shape, dtype=torch.float64, device=x.device)
        dense_rows = dense.nonzero().squeeze(1)
        out.index_fill_(0, dense_rows, 0.0)  # their marks: only the other rows are compacted
        sparse_rows = (~dense).nonzero().squeeze(1)
        t_sparse, flat_index, p = _compact_solve(x, m, out, alpha64, t_lower, sparse_rows)
        t.index_copy_(0, sparse_rows, t_sparse)
        out.zero_().view(-1).index_copy_(0, flat_index, p)
        if n_dense:
            alpha_dense = alpha64 if isinstance(alpha64, float) else alpha64.index_select(0, dense_rows)
            t_dense, p_dense = _solve_full_rows(x.index_select(0, dense_rows), m.index_select(0, dense_rows),
                                                alpha_dense, t_lower.index_select(0, dense_rows))
            t.index_copy_(0, dense_rows, t_dense)
            out.index_copy_(0, dense_rows, p_dense.to(out.dtype))
    tau = t.to(x.dtype) + a * m
    if any_bad:
        out.masked_fill_(empty_rows, 0.0).masked_fill_(nan_rows, float("nan"))
        tau = tau.masked_fill(empty_rows, float("inf")).masked_fill(nan_rows, float("nan"))
    return out, tau


def _move_to_rows(x, dim, dtype):
    """x with dim moved last, as a contiguous (R, n) tensor of dtype."""
    return x.movedim(dim, -1).to(dtype).reshape(_n_rows(x, dim), x.shape[dim]).contiguous()


def _n_rows(x, dim):
    return math.prod(x.shape[:dim] + x.shape[dim + 1:])


def _from_rows(p2d, x, dim):
    shape = list(x.movedim(dim, -1).shape)
    return p2d.reshape(shape).movedim(-1, dim)


def _gate(p, alpha):
    """u = p^(2 - alpha) on the support, 0 elsewhere (the entmax Jacobian weight). Out of place."""
    if isinstance(alpha, float) and alpha == 2.0:
        return (p > 0).to(p.dtype)
    on = p > 0
    p_on = torch.where(on, p, 1.0)  # no infinite derivative at p = 0 (double backward)
    u = p_on.sqrt() if isinstance(alpha, float) and alpha == 1.5 else p_on.pow(2.0 - alpha)
    return torch.where(on, u, 0.0)


def _phi(x):
    """(e^x - 1 - x) / x^2 for x >= 0 without cancellation (Taylor series below 0.25, 9 terms)."""
    small = x < 0.25
    xs = torch.where(small, x, 0.0)
    series = torch.zeros_like(x)
    for n in range(10, 1, -1):  # 1/2! + x/3! + ... + x^8/10!, by Horner
        series = series * xs + 1.0 / math.factorial(n)
    xl = torch.where(small, 1.0, x)
    return torch.where(small, series, (torch.expm1(xl) - xl) / (xl * xl))


def _dp_dalpha(p, alpha):
    """d p / d alpha (R, n) in fp64, in the cancellation-free form of the module docstring."""
    p = p.double()
    a = (alpha if isinstance(alpha, float) else alpha.double()) - 1.0
    log_p = torch.where(p > 0, p, 1.0).log()  # 0 off the support (where p = 0 anyway)
    x = -a * log_p
    b = log_p * log_p * _phi(x)
    total_u = 1.0 + (p * torch.expm1(x)).sum(1, keepdim=True)  # U = sum p^(1 - a) = 1 + sum p (p^-a - 1)
    entropy_term = (p * log_p).sum(1, keepdim=True)
    big_b = (p * b).sum(1, keepdim=True)
    return p * (big_b * (1.0 - a * log_p) - b * (1.0 - a * entropy_term)) / total_u


def entmax_vjp(p, grad, alpha, need_alpha):
    """Vector-Jacobian products on (R, n) rows: dx (R, n) and dalpha (R, 1) (None unless need_alpha).

    alpha is a float or (R, 1). Differentiable (out-of-place operations only): double backward works."""
    if p.numel() == 0:
        return torch.zeros_like(p), (torch.zeros_like(p[:, :1]) if need_alpha else None)
    u = _gate(p, alpha)
    top = u.argmax(1, keepdim=True)
    dev = grad - grad.gather(1, top)  # g - g_k: the largest-u entry's own term is exactly 0
    total = u.sum(1, keepdim=True)
    w = u / torch.where(total > 0, total, 1.0)  # all -inf rows: u = 0 and the gradient is 0
    dx = u * (dev - (w * dev).sum(1, keepdim=True))
    nan_rows = torch.isnan(p).any(1, keepdim=True)
    dx = torch.where(nan_rows, float("nan"), dx)
    if not need_alpha:
        return dx, None
    # the shifted gradient is allowed: sum_i dp_i/dalpha = 0
    dalpha = (dev.double() * _dp_dalpha(p, alpha)).sum(1, keepdim=True)
    return dx, torch.where(nan_rows, float("nan"), dalpha).to(grad.dtype)


# ----------------------------------------------------------------------------- custom ops


@torch.library.custom_op("asentmax::entmax", mutates_args=())
def _entmax_op(x2d: torch.Tensor, alpha_rows: Optional[torch.Tensor], alpha: float,
               triton: bool) -> torch.Tensor:
    """p (R, n) of x2d's dtype: the Triton row kernel (triton=True) or the torch solve; alpha_rows (R, 1)
    replaces the float alpha when given (torch path only)."""
    if triton:
        from asentmax.ops.triton.entmax_rows import entmax_rows_forward

        return entmax_rows_forward(x2d, alpha)
    if alpha_rows is not None:
        _check_alpha_values(alpha_rows)
    return _forward_2d(x2d, alpha if alpha_rows is None else alpha_rows, torch.empty_like(x2d))[0]


@_entmax_op.register_fake
def _(x2d, alpha_rows, alpha, triton):
    return torch.empty_like(x2d)


@torch.library.custom_op("asentmax::entmax_rows_bwd", mutates_args=())
def _triton_backward_op(p: torch.Tensor, grad: torch.Tensor, alpha: float) -> torch.Tensor:
    """dx of the Triton row kernel's backward (not differentiable itself; see _backward)."""
    from asentmax.ops.triton.entmax_rows import entmax_rows_backward

    return entmax_rows_backward(p, grad, alpha)


@_triton_backward_op.register_fake
def _(p, grad, alpha):
    return torch.empty_like(p)


@torch.library.custom_op("asentmax::entmax_bwd", mutates_args=())
def _torch_backward_op(p: torch.Tensor, grad: torch.Tensor, alpha_rows: Optional[torch.Tensor], alpha: float,
                       need_alpha: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dalpha (R, 1), zeros unless need_alpha) of the torch path: entmax_vjp on the support of each row
    (NaN counts as support), compacted into an (R, k) matrix when k (the largest support) is at most
    _COMPACT_FRACTION of a row, as the forward compacts its candidates; where only some rows have supports
    that large, those rows and the others each take their own path."""
    alpha = alpha if alpha_rows is None else alpha_rows
    n_rows, n = p.shape
    support = p != 0
    dense = support.sum(1) > _COMPACT_FRACTION * n if p.numel() else None
    if dense is None or bool(dense.all()) or not bool(dense.any()):
        return _vjp_rows(p, grad, alpha, need_alpha, support)
    dx = torch.empty_like(p)
    dalpha = torch.zeros_like(p[:, :1])
    for rows in (dense.nonzero().squeeze(1), (~dense).nonzero().squeeze(1)):
        alpha_part = alpha if isinstance(alpha, float) else alpha.index_select(0, rows)
        dx[rows], dalpha[rows] = _vjp_rows(p.index_select(0, rows), grad.index_select(0, rows), alpha_part,
                                           need_alpha, support.index_select(0, rows))
    return dx, dalpha


def _vjp_rows(p, grad, alpha, need_alpha, support):
    """_torch_backward_op's (dx, dalpha) for rows that all take one path, compacted or full length; support
    (R, n) bool is p != 0."""
    n_rows, n = p.shape
    flat_index, slots, _, k = (_compaction(support.view(-1), n_rows, n) if p.numel()
                               else (None, None, None, n))
    if p.numel() == 0 or k > _COMPACT_FRACTION * n:  # gathering costs more than it saves
        dx, dalpha = entmax_vjp(p, grad, alpha, need_alpha)
    else:
        def compact(v):
            return v.new_zeros(n_rows * k).index_copy_(0, slots, v.view(-1).index_select(0, flat_index))

        dx_c, dalpha = entmax_vjp(compact(p).view(n_rows, k), compact(grad).view(n_rows, k), alpha,
                                  need_alpha)
        dx = torch.zeros_like(p)
        dx.view(-1).index_copy_(0, flat_index, dx_c.view(-1).index_select(0, slots))
        dx.masked_fill_(torch.isnan(dx_c).any(1, keepdim=True), float("nan"))  # the whole NaN row
    return dx, (dalpha if need_alpha else torch.zeros_like(p[:, :1]))


@_torch_backward_op.register_fake
def _(p, grad, alpha_rows, alpha, need_alpha):
    return torch.empty_like(p), p.new_empty((p.shape[0], 1))


def _setup_context(ctx, inputs, output):
    _, alpha_rows, alpha, triton = inputs
    ctx.save_for_backward(output, alpha_rows)
    ctx.alpha, ctx.triton = alpha, triton


def _backward(ctx, grad):
    """The custom backward ops; create_graph=True (grad mode on) takes entmax_vjp itself (differentiable)."""
    p, alpha_rows = ctx.saved_tensors
    grad = grad.to(p.dtype)
    need_alpha = ctx.needs_input_grad[1]
    if torch.is_grad_enabled():  # fp16/bf16 p (the Triton path keeps x's dtype) in fp32
        work = compute_dtype(p.dtype)
        dx, dalpha = entmax_vjp(p.to(work), grad.to(work), ctx.alpha if alpha_rows is None else alpha_rows,
                          need_alpha)
        dx = dx.to(p.dtype)
    elif ctx.triton:
        dx, dalpha = _triton_backward_op(p, grad, ctx.alpha), None
    else:
        dx, dalpha = _torch_backward_op(p, grad, alpha_rows, ctx.alpha, need_alpha)
    return dx, (dalpha if need_alpha else None), None, None


_entmax_op.register_autograd(_backward, setup_context=_setup_context)


def _use_triton(x, alpha, backend):
    """Whether this call runs the Triton row kernel; ValueError for backend="triton" where it cannot."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return False
    reason = None
    if not isinstance(alpha, float):
        reason = "a tensor alpha"
    elif x.dtype == torch.float64:
        reason = "float64 input"
    elif not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        reason = "a CPU tensor (without TRITON_INTERPRET=1)"
    if reason is None:
        try:
            from asentmax.ops.triton.entmax_rows import ALPHA_RANGE
        except ImportError:
            reason = "no triton installation"
        else:
            if not ALPHA_RANGE[0] <= alpha <= ALPHA_RANGE[1]:
                low, high = ALPHA_RANGE
                reason = f"alpha {alpha} outside the kernel's range [{low:g}, {high:g}]"
    if backend == "triton" and reason is not None:
        raise ValueError(f"entmax backend='triton' cannot run on {reason}; use backend='auto' or 'reference'")
    return reason is None and (backend == "triton" or x.is_cuda)


def entmax(x, alpha=1.5, dim=-1, backend="auto"):
    """alpha-entmax of x along dim, differentiable in x and (tensor alpha) in alpha.

    Args:
        x: floating tensor, any shape; -inf entries get exactly 0, an all -inf row gives zeros; a row
            holding NaN or +inf gives a NaN row (and NaN gradients for that row only).
        alpha: float in (1, 10], or a tensor in (1, 10] broadcastable to x with size 1 along dim.
        dim: the dimension that sums to 1.
        backend: "auto" (Triton row kernel for CUDA tensors it supports, else torch), "reference" (pure
            torch on every device) or "triton" (the kernel or a ValueError).
    Returns p with x's shape and dtype (fp16/bf16 computed in fp32).
    """
    alpha, dim = _check_inputs(x, alpha, dim)
    triton = _use_triton(x, alpha, backend)
    x2d = _move_to_rows(x, dim, x.dtype if triton else compute_dtype(x.dtype))
    if isinstance(alpha, torch.Tensor):
        p2d = _entmax_op(x2d, _alpha_rows(alpha, x, dim), 1.5, False)  # the float is unused
    else:
        p2d = _entmax_op(x2d, None, alpha, triton)
    return _from_rows(p2d, x, dim).to(x.dtype)


def entmax15(x, dim=-1, backend="auto"):
    """1.5-entmax (the paper's default) along dim."""
    return entmax(x, 1.5, dim, backend)


def sparsemax(x, dim=-1, backend="auto"):
    """sparsemax (2-entmax) along dim."""
    return entmax(x, 2.0, dim, backend)


def entmax_threshold(x, alpha=1.5, dim=-1):
    """tau with p = clamp((alpha-1) x - tau, min=0) ** (1/(alpha-1)) summing to 1 along dim (torch path).

    keepdim shape; fp64 for fp64 x, fp32 otherwise; +inf for all -inf rows, NaN for rows with NaN.
    Not differentiable."""
    alpha, dim = _check_inputs(x, alpha, dim)
    with torch.no_grad():
        x2d = _move_to_rows(x, dim, compute_dtype(x.dtype))
        rows_alpha = alpha
        if isinstance(alpha, torch.Tensor):
            rows_alpha = _alpha_rows(alpha, x, dim)
            _check_alpha_values(rows_alpha)
        _, tau = _forward_2d(x2d, rows_alpha, torch.empty_like(x2d))
    shape = list(x.movedim(dim, -1).shape)
    shape[-1] = 1
    return tau.reshape(shape).movedim(-1, dim)
