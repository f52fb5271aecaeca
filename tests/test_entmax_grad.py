"""Gradients of asentmax.ops.entmax: fp64 gradcheck in x and alpha (arXiv:2506.16640, section 2).

The backward uses u = p^(2 - alpha) on the support: dx = u g - u (sum u g) / sum u, and the derived
d p / d alpha (see the module docstring of asentmax.ops.entmax); gradcheck compares both with finite
differences of the forward, and a second check compares with autograd through a plain bisection.
Issue 13's regressions: fp32 dx at alpha >= 4 (cancellation at the largest-u entry) against the plain fp64
formula, d/dalpha near alpha = 1 in fp32 and fp64 against 60-digit central differences (mpmath), double
backward (gradgradcheck), and NaN rows.
"""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from asentmax.ops.entmax import entmax
from entmax_oracle import implicit_grad, mp_alpha_derivative, oracle_entmax


def logits(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_(True)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 1.75, 2.0, 2.5])
@pytest.mark.parametrize("shape,dim", [((4, 9), -1), ((3, 17), 0), ((2, 3, 11), 1)],
                         ids=["rows", "dim0", "dim1"])
def test_gradcheck_x(alpha, shape, dim):
    x = logits(*shape, seed=1)
    assert gradcheck(lambda x: entmax(x, alpha, dim=dim), (x,))


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_gradcheck_scalar_alpha_tensor(alpha):
    x = logits(5, 13, seed=2)
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, a: entmax(x, a), (x, a))


def test_gradcheck_per_row_alpha():
    x = logits(6, 21, seed=3)
    a = torch.tensor([[1.1], [1.3], [1.5], [1.8], [2.0], [2.7]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, a: entmax(x, a), (x, a))


def test_gradcheck_alpha_broadcast_over_heads():
    x = logits(2, 3, 4, 7, seed=4)
    a = torch.tensor([1.2, 1.5, 1.9], dtype=torch.float64).view(3, 1, 1).requires_grad_(True)
    assert gradcheck(lambda x, a: entmax(x, a), (x, a))


def bisection_entmax(x, alpha, steps=120):
    """Differentiable-through-the-formula oracle: tau from bisection (no grad), then p re-derived so that
    autograd sees the implicit dependence via one exact Newton correction on the fixed support."""
    a = alpha - 1
    s = a * x
    with torch.no_grad():
        hi = s.amax(-1, keepdim=True)
        lo = hi - 1
        for _ in range(steps):
            mid = (lo + hi) / 2
            big = (torch.clamp(s - mid, min=0) ** (1 / a)).sum(-1, keepdim=True) >= 1
            lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
        support = s > lo
    # tau(s, alpha) on the fixed support: F(tau) = 1, one Newton step carries the first-order dependence
    d = torch.where(support, s - lo, torch.ones_like(s))  # 1 off the support: no inf in any branch
    f = torch.where(support, d ** (1 / a), 0).sum(-1, keepdim=True)
    df = torch.where(support, (1 / a) * d ** (1 / a - 1), 0).sum(-1, keepdim=True)
    tau = lo + (f - 1) / df
    return torch.where(support, torch.where(support, s - tau, 1) ** (1 / a), 0)


# small logits: dense rows (every entry a candidate); large logits: the compact (sparse) path
@pytest.mark.parametrize("scale", [0.05, 3.0])
@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, 2.2])
def test_grads_match_autograd_through_newton_oracle(alpha, scale):
    x = logits(7, 300, seed=5, scale=scale)
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    g = torch.randn(7, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    dx, da = torch.autograd.grad((entmax(x, a) * g).sum(), (x, a))
    dx_ref, da_ref = torch.autograd.grad((bisection_entmax(x, a) * g).sum(), (x, a))
    torch.testing.assert_close(dx, dx_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(da, da_ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0, "per row"])
def test_grads_of_near_uniform_and_peaked_rows_in_one_call(alpha, monkeypatch):
    """Rows with large supports (every third: near-uniform) and small ones in one call: each kind takes its
    own backward path (full length, compacted), and dx and dalpha match autograd through the oracle."""
    import asentmax.ops.entmax as entmax_module

    x = logits(9, 300, seed=8, scale=3.0).detach()
    x[::3] *= 0.002
    x.requires_grad_(True)
    alphas = [1.3, 1.5, 2.0] * 3
    a = (torch.tensor(alphas, dtype=torch.float64)[:, None] if alpha == "per row"
         else torch.tensor(alpha, dtype=torch.float64)).requires_grad_(True)
    g = torch.randn(9, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    calls, real = [], entmax_module._vjp_rows
    monkeypatch.setattr(entmax_module, "_vjp_rows",
                        lambda p, *args: calls.append(p.shape[0]) or real(p, *args))
    dx, da = torch.autograd.grad((entmax(x, a) * g).sum(), (x, a))
    assert sorted(calls) == [3, 6]  # the three near-uniform rows, then the six peaked ones
    rows_alpha = a if alpha == "per row" else a.expand(9, 1)
    dx_ref, da_ref = torch.autograd.grad((bisection_entmax(x, rows_alpha) * g).sum(), (x, a))
    torch.testing.assert_close(dx, dx_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(da, da_ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("scale", [0.05, 3.0])
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_gradients_finite_with_masked_entries_and_rows(alpha, scale):
    x = logits(4, 30, seed=7, scale=scale).detach()
    x[0] = float("-inf")
    x[1, ::3] = float("-inf")
    x[2, 1:] = float("-inf")
    x.requires_grad_(True)
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    p = entmax(x, a)
    g = torch.randn_like(p)
    dx, da = torch.autograd.grad((p * g).sum(), (x, a))
    assert torch.isfinite(dx).all() and torch.isfinite(da)
    assert torch.equal(dx[0], torch.zeros_like(dx[0]))
    assert torch.equal(dx[1, ::3], torch.zeros_like(dx[1, ::3]))
    # the finite part of row 1 has the gradient of entmax on its finite entries alone
    keep = torch.isfinite(x.detach()[1])
    xf = x.detach()[1, keep].clone().requires_grad_(True)
    (dxf,) = torch.autograd.grad((entmax(xf, alpha) * g[1, keep]).sum(), (xf,))
    torch.testing.assert_close(dx[1, keep], dxf, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_backward_matches_fp64(dtype):
    x = logits(5, 64, seed=8, scale=2.0).detach()
    g = torch.randn(5, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    x64 = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad((entmax(x64, 1.5) * g).sum(), (x64,))
    xl = x.to(dtype).requires_grad_(True)
    (got,) = torch.autograd.grad((entmax(xl, 1.5) * g.to(dtype)).sum(), (xl,))
    assert got.dtype == dtype
    # against the fp64 gradient at the same (rounded) input
    x64r = x.to(dtype).double().requires_grad_(True)
    (ref_r,) = torch.autograd.grad((entmax(x64r, 1.5) * g.to(dtype).double()).sum(), (x64r,))
    torch.testing.assert_close(got.double(), ref_r, rtol=0, atol=8 * torch.finfo(dtype).eps)
    assert ref.shape == got.shape


# ---- issue 13: large alpha, alpha near 1, double backward ----------------------------------------------


def test_alpha5_fp32_backward_keeps_the_small_entry():
    """u = p^(-3) spans 1e8 here: the old fp32 formula lost dx of the small entry ([2.0018, 0])."""
    x = torch.tensor([[0.0, -0.2497]], requires_grad=True)
    g = torch.tensor([[1.0, -1.0]])
    (dx,) = torch.autograd.grad((entmax(x, 5.0) * g).sum(), (x,))
    p_ref, _ = oracle_entmax(x.detach().double(), 5.0)
    expected = implicit_grad(p_ref, g, 5.0)
    torch.testing.assert_close(dx.double(), expected, rtol=1e-5, atol=1e-6)
    assert abs(expected[0, 1].item() + 2.0018) < 1e-3


@pytest.mark.parametrize("alpha", [4.0, 6.0, 10.0])
def test_large_alpha_fp32_gradients_match_fp64(alpha):
    g = torch.Generator().manual_seed(int(alpha))
    z = (torch.randn(48, 12, generator=g, dtype=torch.float64) * 0.4).float()
    grad = torch.randn(48, 12, generator=g, dtype=torch.float64)
    p_ref, d_min = oracle_entmax(z.double(), alpha)
    ok = d_min > 1e-6  # u <= 1/d: the plain fp64 oracle keeps ~10 digits there
    x = z.clone().requires_grad_(True)
    a = torch.full((48, 1), alpha, requires_grad=True)
    dx, da = torch.autograd.grad((entmax(x, a) * grad.float()).sum(), (x, a))
    expected = implicit_grad(p_ref, grad, alpha)
    scale = expected.abs().amax(-1, keepdim=True) + 1e-12  # |dx| spans orders of magnitude across rows
    err = ((dx.double() - expected).abs() / scale).amax(-1)
    assert ok.sum() > 24 and (err[ok] < 1e-4).all(), err[ok].max()
    for r in torch.nonzero(ok).flatten()[:3].tolist():
        truth = mp_alpha_derivative(z[r].tolist(), grad[r].tolist(), alpha)
        assert abs(da[r].item() - truth) <= 1e-4 * max(1.0, abs(truth)), (da[r].item(), truth)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.0001, 1.001, 1.01])
def test_alpha_gradient_near_one(alpha, dtype):
    """The two (alpha-1)^-2 terms cancel analytically in the implemented form (old fp32: 1.12 for 0.19)."""
    g = torch.Generator().manual_seed(5)
    z = (torch.randn(3, 8, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    grad = torch.randn(3, 8, generator=g, dtype=torch.float64).to(dtype)
    a = torch.full((3, 1), alpha, dtype=dtype, requires_grad=True)
    (da,) = torch.autograd.grad((entmax(z, a) * grad).sum(), (a,))
    a_exact = float(a.detach()[0])  # the alpha the dtype holds
    for r in range(3):
        truth = mp_alpha_derivative(z[r].tolist(), grad[r].tolist(), a_exact)
        tol = 2e-4 if dtype == torch.float32 else 1e-9
        assert abs(da[r].item() - truth) <= tol * max(1.0, abs(truth)), (r, da[r].item(), truth)


@pytest.mark.parametrize("alpha,scale", [(1.5, 2.0), (2.0, 2.0), (1.3, 0.1), (3.0, 1.0)])
def test_double_backward(alpha, scale):
    x = logits(3, 9, seed=11, scale=scale)
    assert gradgradcheck(lambda x: entmax(x, alpha), (x,))


def test_double_backward_tensor_alpha():
    x = logits(3, 7, seed=12, scale=0.5)
    a = torch.tensor([[1.3], [1.6], [2.4]], dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda x, a: entmax(x, a), (x, a))
