"""Tests of the row-wise Triton alpha-entmax (asentmax.ops.triton.entmax_rows) against fp64 torch oracles.

The oracles are written here, independently of the kernel: sort-based closed forms for alpha = 1.5 and 2
(Peters et al. 2019), fp64 bisection for other alphas; gradients by fp64 autograd through the closed form
on the (fixed) support, or by the implicit-function formula for general alpha (arXiv:2506.16640,
section 2). The kernel supports alpha in [1.01, 2] (ALPHA_RANGE); asentmax.ops.entmax sends other alphas
to its torch path (tests/test_entmax_alpha_range.py).
CPU runs need TRITON_INTERPRET=1 (as `make test` sets); GPU-sized cases carry the `gpu` marker.
"""

import math
import os

import pytest
import torch

pytest.importorskip("triton")

from asentmax.ops.triton import entmax_rows as er  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
needs_runner = pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                  reason="needs TRITON_INTERPRET=1 or a CUDA device")
gpu = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU")


# ----------------------------------------------------------------------------- fp64 oracles


def _tau_row(s, alpha):
    """fp64 tau of one row s = (alpha - 1) z restricted to finite entries (1D, at least one finite)."""
    srt = torch.sort(s, descending=True).values
    k = torch.arange(1, srt.numel() + 1, dtype=s.dtype, device=s.device)
    if alpha == 2.0:
        taus = (srt.cumsum(0) - 1) / k
        size = int((srt > taus).sum())
        return taus[size - 1]
    if alpha == 1.5:
        mean = srt.cumsum(0) / k
        mean_sq = (srt * srt).cumsum(0) / k
        delta = (1 - k * (mean_sq - mean * mean)) / k
        taus = mean - torch.sqrt(torch.clamp(delta, min=0))
        size = int((taus <= srt).sum())
        return taus[size - 1]
    q = 1.0 / (alpha - 1.0)
    lo, hi = srt[0] - 1, srt[0]
    for _ in range(200):
        mid = (lo + hi) / 2
        if torch.clamp(srt - mid, min=0).pow(q).sum() >= 1:
            lo = mid
        else:
            hi = mid
    return lo


def reference_tau(x, alpha):
    """fp64 tau per row (R,), +inf for all -inf rows, NaN for rows with a NaN."""
    s = (alpha - 1.0) * x.double()
    out = torch.empty(s.shape[0], dtype=torch.float64, device=x.device)
    for r in range(s.shape[0]):
        row = s[r]
        if torch.isnan(row).any():
            out[r] = float("nan")
        elif torch.isinf(row).all():
            out[r] = float("inf")
        else:
            out[r] = _tau_row(row[torch.isfinite(row)], alpha)
    return out


def reference_entmax(x, alpha):
    s = (alpha - 1.0) * x.double()
    tau = reference_tau(x, alpha)[:, None]
    p = torch.clamp(s - tau, min=0).pow(1.0 / (alpha - 1.0))
    p = torch.where(torch.isinf(tau), torch.zeros_like(p), p)
    return torch.where(torch.isnan(tau), torch.full_like(p, float("nan")), p)


def reference_grad(x, alpha, dp):
    """fp64 dL/dx for L = sum(p * dp).

    alpha in {1.5, 2}: autograd through the closed-form tau on the fixed support; else implicit function.
    """
    p_ref = reference_entmax(x, alpha)
    support = p_ref > 0
    xd = x.double().clone().requires_grad_(True)
    s = (alpha - 1.0) * xd
    k = support.sum(-1, keepdim=True).double()
    s_on = torch.where(support, s, torch.zeros_like(s))
    if alpha == 2.0:
        tau = (s_on.sum(-1, keepdim=True) - 1) / k
    elif alpha == 1.5:
        mean = s_on.sum(-1, keepdim=True) / k
        var = (s_on * s_on).sum(-1, keepdim=True) / k - mean * mean
        tau = mean - torch.sqrt(torch.clamp((1 - k * var) / k, min=0))
    else:
        g = torch.where(support, p_ref.pow(2.0 - alpha), torch.zeros_like(p_ref))
        dpd = dp.double()
        return g * dpd - g * (g * dpd).sum(-1, keepdim=True) / g.sum(-1, keepdim=True)
    p = torch.where(support, torch.clamp(s - tau, min=0).pow(1.0 / (alpha - 1.0)), torch.zeros_like(s))
    (p * dp.double()).sum().backward()
    return xd.grad


def _inputs(rows, n, dtype=torch.float32, scale=2.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, n, generator=gen, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------- CPU (interpreter) tests

ALPHAS = [1.01, 1.25, 1.5, 1.75, 2.0]


@needs_runner
@pytest.mark.parametrize("alpha", ALPHAS, ids=lambda a: f"a{a}")
@pytest.mark.parametrize("n", [1, 17, 100, 1000])
def test_forward_matches_fp64(n, alpha):
    x = _inputs(5, n, seed=n)
    p = er.entmax_rows(x, alpha)
    ref = reference_entmax(x, alpha)
    assert p.dtype == x.dtype and p.shape == x.shape
    assert torch.allclose(p.double(), ref, atol=2e-6, rtol=0)
    assert (p.double().sum(-1) - 1).abs().max() <= 1e-6
    assert torch.equal(p == 0, ref == 0)  # exact zeros off the support
    tau = er.entmax_rows_threshold(x, alpha)
    ref_tau = reference_tau(x, alpha)
    assert tau.dtype == torch.float32
    assert torch.allclose(tau.double(), ref_tau, atol=1e-5, rtol=1e-6)


@needs_runner
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25], ids=lambda a: f"a{a}")
def test_half_inputs(dtype, alpha):
    x = _inputs(6, 130, dtype=dtype, seed=3)
    p = er.entmax_rows(x, alpha)
    ref = reference_entmax(x, alpha)  # of the rounded inputs: only the output rounding differs
    eps = torch.finfo(dtype).eps
    assert p.dtype == dtype
    assert ((p.double() - ref).abs() <= eps * ref + 1e-6).all()


@needs_runner
@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0], ids=lambda a: f"a{a}")
@pytest.mark.parametrize("n", [17, 100])
def test_gradients_match_fp64(n, alpha):
    x = _inputs(4, n, seed=10 + n).requires_grad_(True)
    dp = _inputs(4, n, scale=1.0, seed=20 + n)
    p = er.entmax_rows(x, alpha)
    (dx,) = torch.autograd.grad(p, x, dp)
    ref = reference_grad(x.detach(), alpha, dp)
    assert torch.allclose(dx.double(), ref, atol=2e-5, rtol=1e-4)


@needs_runner
def test_gradient_bf16_relative_to_rounding():
    x = _inputs(4, 63, dtype=torch.bfloat16, seed=5).requires_grad_(True)
    dp = _inputs(4, 63, dtype=torch.bfloat16, scale=1.0, seed=6)
    (dx,) = torch.autograd.grad(er.entmax_rows(x, 1.5), x, dp)
    ref = reference_grad(x.detach(), 1.5, dp)
    assert dx.dtype == torch.bfloat16
    err = (dx.double() - ref).norm() / ref.norm()
    assert err < 1e-2  # bf16 output rounding (eps 7.8e-3) and g from the bf16 probabilities


@needs_runner
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25], ids=lambda a: f"a{a}")
def test_long_rows_loop_over_chunks(alpha):
    """Force the chunk-looping kernels with a small register limit; compare with the fp64 oracle."""
    x = _inputs(3, 1000, seed=7)
    p, tau = er._forward(x, alpha, max_block_n=256)
    assert torch.allclose(p.double(), reference_entmax(x, alpha), atol=2e-6, rtol=0)
    assert torch.allclose(tau.double(), reference_tau(x, alpha), atol=1e-5, rtol=1e-6)
    dp = _inputs(3, 1000, scale=1.0, seed=8)
    dx = er._backward(p, dp, alpha, max_block_n=256)
    assert torch.allclose(dx.double(), reference_grad(x, alpha, dp), atol=2e-5, rtol=1e-4)


@needs_runner
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25], ids=lambda a: f"a{a}")
@pytest.mark.parametrize("max_block_n", [er.MAX_BLOCK_N, 64], ids=["registers", "chunks"])
def test_special_rows(max_block_n, alpha):
    x = _inputs(7, 150, seed=9)
    x[0, :140] = float("-inf")  # a few finite entries
    x[1] = float("-inf")  # nothing visible
    x[2, 17] = float("nan")
    x[3] *= 1e4  # large magnitudes
    x[4, ::2] = float("-inf")
    x[6, 30] = float("inf")  # +inf: a NaN row, as in the torch path
    p, tau = er._forward(x, alpha, max_block_n=max_block_n)
    ref = reference_entmax(x, alpha)
    ok = [0, 3, 4, 5]
    assert torch.allclose(p[ok].double(), ref[ok], atol=2e-6, rtol=0)
    assert (p[ok][torch.isinf(x[ok])] == 0).all()
    assert (p[1] == 0).all() and tau[1] == float("inf")
    for bad in (2, 6):
        assert torch.isnan(p[bad]).all() and torch.isnan(tau[bad])
    assert not torch.isnan(p[ok]).any()
    dp = _inputs(7, 150, scale=1.0, seed=4)
    dx = er._backward(p, dp, alpha, max_block_n=max_block_n)
    assert (dx[1] == 0).all()
    assert torch.isnan(dx[[2, 6]]).all()
    assert not torch.isnan(dx[ok]).any()


@needs_runner
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25], ids=lambda a: f"a{a}")
def test_public_entmax_on_the_kernel_matches_the_torch_path(alpha):
    """entmax(..., backend="triton"): forward, backward, double backward (create_graph=True takes the
    torch formula on the kernel's p) and NaN rows equal the torch path's."""
    from asentmax.ops.entmax import entmax

    x = _inputs(4, 60, seed=13)
    x[2, 5] = float("nan")
    dp = _inputs(4, 60, scale=1.0, seed=14)
    results = []
    for backend in ("triton", "reference"):
        xr = x.clone().requires_grad_(True)
        p = entmax(xr, alpha, backend=backend)
        (dx,) = torch.autograd.grad((p * dp).sum(), xr, create_graph=True)
        if alpha == 2.0:  # sparsemax: dx is piecewise constant in x (no graph to differentiate)
            assert not dx.requires_grad
            ddx = torch.zeros_like(x)
        else:
            (ddx,) = torch.autograd.grad((dx[[0, 1, 3]] ** 2).sum(), xr)
        results.append((p.detach(), dx.detach(), ddx))
    for got, expected in zip(results[0], results[1], strict=True):
        assert torch.equal(torch.isnan(got), torch.isnan(expected))
        torch.testing.assert_close(got.nan_to_num(), expected.nan_to_num(), rtol=1e-4, atol=2e-5)
    assert torch.isnan(results[0][0][2]).all() and torch.isnan(results[0][1][2]).all()


@needs_runner
@pytest.mark.parametrize("alpha", [1.5, 2.0], ids=lambda a: f"a{a}")
def test_fused_reductions(alpha):
    """The opt-in multi-operand reductions (the interpreter runs them slowly: small shapes)."""
    x = _inputs(3, 24, seed=11)
    x[1, :20] = float("-inf")
    dp = _inputs(3, 24, scale=1.0, seed=12)
    ref_p, ref_dx = reference_entmax(x, alpha), reference_grad(x, alpha, dp)
    for max_block_n in (er.MAX_BLOCK_N, 8):
        p, tau = er._forward(x, alpha, max_block_n=max_block_n, fused=True)
        assert torch.allclose(p.double(), ref_p, atol=2e-6, rtol=0)
        assert torch.allclose(tau.double(), reference_tau(x, alpha), atol=1e-5, rtol=1e-6)
        dx = er._backward(p, dp, alpha, max_block_n=max_block_n, fused=True)
        assert torch.allclose(dx.double(), ref_dx, atol=2e-5, rtol=1e-4)


@needs_runner
def test_single_entry_and_empty_rows():
    x = _inputs(3, 1, seed=1)
    assert torch.equal(er.entmax_rows(x, 1.5), torch.ones_like(x))
    empty = torch.empty(0, 8, device=DEVICE)
    assert er.entmax_rows(empty, 1.5).shape == (0, 8)


@needs_runner
def test_every_output_is_written(monkeypatch):
    """Poison the buffers the launchers allocate: every element of p, tau and dx must be overwritten."""
    real_empty, real_empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(er.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(er.torch, "empty_like", lambda *a, **k: real_empty_like(*a, **k).fill_(float("nan")))
    for max_block_n in (er.MAX_BLOCK_N, 64):
        x = _inputs(7, 111, seed=2)
        p, tau = er._forward(x, 2.0, max_block_n=max_block_n)
        dx = er._backward(p, torch.ones_like(x), 2.0, max_block_n=max_block_n)
        assert not torch.isnan(p).any() and not torch.isnan(tau).any() and not torch.isnan(dx).any()


def test_bad_inputs_raise():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="2D"):
        er.entmax_rows(torch.randn(2, 3, 4), 1.5)
    with pytest.raises(ValueError, match="alpha"):
        er.entmax_rows(x, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        er.entmax_rows(x, math.nan)
    for alpha in (2.5, 1.001):
        with pytest.raises(ValueError, match=r"alpha in \[1.01, 2\]"):
            er.entmax_rows(x, alpha)
    with pytest.raises(TypeError, match="float64"):
        er.entmax_rows(x.double(), 1.5)
    with pytest.raises(TypeError, match="alpha"):
        er.entmax_rows(x, torch.tensor(1.5))


# ----------------------------------------------------------------------------- GPU sizes


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25], ids=lambda a: f"a{a}")
@pytest.mark.parametrize("shape", [(4096, 1024), (64, 32768), (4, 100_000), (3000, 77)], ids=str)
def test_gpu_large(shape, alpha):
    rows, n = shape
    gen = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, n, device="cuda", generator=gen) * 2
    x[0, : n // 2] = float("-inf")
    x = x.requires_grad_(True)
    p = er.entmax_rows(x, alpha)
    check = torch.arange(0, rows, max(1, rows // 32), device="cuda")  # the fp64 oracle loops over rows
    ref = reference_entmax(x.detach()[check], alpha)
    assert torch.allclose(p.detach()[check].double(), ref, atol=2e-6, rtol=0)
    assert (p.detach().double().sum(-1) - 1).abs().max() <= 1e-5
    dp = torch.randn(rows, n, device="cuda", generator=gen)
    (dx,) = torch.autograd.grad(p, x, dp)
    ref_dx = reference_grad(x.detach()[check], alpha, dp[check])
    assert torch.allclose(dx[check].double(), ref_dx, atol=2e-5, rtol=1e-4)
    xb = x.detach().to(torch.bfloat16)
    pb = er.entmax_rows(xb, alpha)
    refb = reference_entmax(xb[check], alpha)
    assert ((pb[check].double() - refb).abs() <= torch.finfo(torch.bfloat16).eps * refb + 1e-6).all()
