"""fp64 oracles of alpha-entmax for the tests, independent of asentmax.ops (arXiv:2506.16640, section 2).

`bisection_tau` halves the bracket [max s - 1, max s] of tau 200 times on s = (alpha - 1) z, rows holding
their own alpha; `oracle_entmax` returns p from it together with each row's smallest support gap d_min =
min over the support of s_i - tau (p = d^(1/(alpha-1)) is ill-conditioned at d -> 0 when alpha > 2, so a
comparison needs d_min well above fp64 resolution). `mp_entmax` solves one row in 60-digit arithmetic
(mpmath) for the adversarial reproducers where even fp64 cannot resolve d; `mp_alpha_derivative` is the
alpha-gradient of one row by central differences at that precision; `implicit_grad` the plain fp64 dx.
"""

import mpmath
import torch


def bisection_tau(z, alpha, steps=200):
    """tau (R, 1) for z (R, n) fp64 and alpha a float or an (R, 1) fp64 tensor; rows need a finite entry."""
    s = (alpha - 1) * z
    hi = s.amax(-1, keepdim=True)
    lo = hi - 1
    q = 1 / (alpha - 1)
    for _ in range(steps):
        mid = (lo + hi) / 2
        big = (torch.clamp(s - mid, min=0) ** q).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
    return lo


def oracle_entmax(z, alpha):
    """(p, d_min): fp64 alpha-entmax of the rows of z (R, n) and each row's smallest support gap (R,)."""
    z = z.double()
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.double()
    tau = bisection_tau(z, alpha)
    d = (alpha - 1) * z - tau
    p = torch.clamp(d, min=0) ** (1 / (alpha - 1))
    p = p / p.sum(-1, keepdim=True)
    d_min = torch.where(d > 0, d, torch.inf).amin(-1)
    return p, d_min


def mp_entmax(z_row, alpha, digits=60):
    """One row (a list of floats) in `digits`-digit arithmetic: p as a list of floats."""
    with mpmath.workdps(digits):
        return [float(v) for v in _mp_probs(z_row, mpmath.mpf(alpha), digits)]


def mp_alpha_derivative(z_row, g_row, alpha, digits=60, h=1e-25):
    """d/dalpha of sum_i g_i p_i(alpha) for one row, by a central difference in `digits`-digit arithmetic."""
    with mpmath.workdps(digits):
        def loss(a):
            return sum(mpmath.mpf(g) * p for g, p in zip(g_row, _mp_probs(z_row, a, digits), strict=True))
        step = mpmath.mpf(h)
        return float((loss(mpmath.mpf(alpha) + step) - loss(mpmath.mpf(alpha) - step)) / (2 * step))


def _mp_probs(z_row, alpha, digits):
    a = alpha - 1
    s = [a * mpmath.mpf(v) for v in z_row]
    hi = max(s)
    lo = hi - 1
    for _ in range(4 * digits):
        mid = (lo + hi) / 2
        if sum(max(v - mid, 0) ** (1 / a) for v in s) >= 1:
            lo = mid
        else:
            hi = mid
    return [max(v - lo, 0) ** (1 / a) for v in s]


def implicit_grad(p, g, alpha):
    """fp64 dL/dz for L = sum g p by the implicit-function formula u (g - sum u g / sum u), u = p^(2-alpha)
    on the support, written plainly (fine in fp64 while u spans fewer than ~1e8)."""
    p, g = p.double(), g.double()
    u = torch.where(p > 0, p.clamp(min=1e-300) ** (2 - alpha), 0)
    return u * (g - (u * g).sum(-1, keepdim=True) / u.sum(-1, keepdim=True))
