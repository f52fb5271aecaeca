"""alpha-entmax (PAPER.md section 2): p_i = [(alpha-1) z_i - tau]_+^(1/(alpha-1)), sum_i p_i = 1.

PLACEHOLDER (bisection, correct but slow): replaced by the exact fast implementation.
"""

import torch


class _EntmaxBisect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, dim):
        xf = x.float().transpose(dim, -1)
        s = (alpha - 1) * xf
        m = s.amax(-1, keepdim=True)
        lo, hi = m - 1, m
        for _ in range(60):
            mid = (lo + hi) / 2
            p = torch.clamp(s - mid, min=0) ** (1 / (alpha - 1))
            big = p.sum(-1, keepdim=True) >= 1
            lo = torch.where(big, mid, lo)
            hi = torch.where(big, hi, mid)
        p = torch.clamp(s - lo, min=0) ** (1 / (alpha - 1))
        p = p / p.sum(-1, keepdim=True)
        p = p.transpose(dim, -1).to(x.dtype)
        ctx.save_for_backward(p)
        ctx.alpha, ctx.dim = alpha, dim
        return p

    @staticmethod
    def backward(ctx, dp):
        (p,) = ctx.saved_tensors
        g = torch.where(p > 0, p ** (2 - ctx.alpha), torch.zeros_like(p))
        gd = g * dp
        dx = gd - g * gd.sum(ctx.dim, keepdim=True) / g.sum(ctx.dim, keepdim=True)
        return dx, None, None


def entmax(x, alpha=1.5, dim=-1):
    return _EntmaxBisect.apply(x, float(alpha), dim)


def entmax15(x, dim=-1):
    return entmax(x, 1.5, dim)


def sparsemax(x, dim=-1):
    return entmax(x, 2.0, dim)
