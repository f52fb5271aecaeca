"""asentmax.ops.entmax over its whole alpha range (1, 10] against fp64 and 60-digit oracles (issue 13).

The map is that of arXiv:2506.16640, section 2. Regression tests first (each failed before the fix that
named it: the unguarded last Newton step for alpha > 2, mixed per-row alphas sharing one surrogate power
and one tolerance), then seeded property loops over alpha in (1, 10], per-row alpha mixtures, lengths,
scales and dtypes, and the NaN contract. The oracles live in tests/entmax_oracle.py.
"""

import math

import pytest
import torch

from asentmax.ops.entmax import ALPHA_MAX, entmax, entmax_threshold
from entmax_oracle import mp_entmax, oracle_entmax

# ---- regressions --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("z,alpha", [([0.0, -0.09375], 10.0), ([0.3, 0.05010590854342942], 5.0)])
def test_alpha_above_3_last_step_stays_in_the_bracket(z, alpha, dtype):
    """Both entries sit within a few fp64 units of the support's edge: the old last Newton step left the
    bracket ([1.0, 0.8136] at alpha 10), and fp64 alone cannot resolve the small entry's distance d."""
    x = torch.tensor([z], dtype=dtype)
    expected = torch.tensor([mp_entmax(x[0].tolist(), alpha)], dtype=torch.float64)
    p = entmax(x, alpha)
    atol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(p.double(), expected, rtol=0, atol=atol)
    assert abs(p.double().sum().item() - 1) <= atol
    tau = entmax_threshold(x, alpha)  # the same threshold, to the input's resolution
    from_tau = torch.clamp((alpha - 1) * x.double() - tau.double(), min=0) ** (1 / (alpha - 1))
    assert abs(from_tau.sum().item() - 1) < 0.05  # p = d^(1/9): tau's last digit moves p by percents


def test_per_row_alpha_mixing_small_and_large_keeps_the_support():
    z = torch.randn(2, 1000, generator=torch.Generator().manual_seed(19)).double()
    alpha = torch.tensor([[1.2], [5.0]], dtype=torch.float64)
    got = entmax(z, alpha)
    for r in range(2):
        ref, _ = oracle_entmax(z[r : r + 1], float(alpha[r]))
        torch.testing.assert_close(got[r : r + 1], ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(got[r : r + 1], entmax(z[r : r + 1], float(alpha[r])), rtol=0, atol=1e-13)


def test_per_row_alpha_rows_equal_their_float_alpha_calls():
    """Rows of alpha 1.01 (q = 100) beside rows of alpha 7: each row solved with its own surrogate power,
    tolerance and step count gives what the float-alpha call on that row alone gives (old code: 5e-3 off)."""
    z = torch.randn(64, 300, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    alpha = torch.tensor([1.01, 7.0] * 32, dtype=torch.float64)[:, None]
    got = entmax(z, alpha)
    for a, rows in ((1.01, slice(0, None, 2)), (7.0, slice(1, None, 2))):
        torch.testing.assert_close(got[rows], entmax(z[rows], a), rtol=0, atol=1e-12)
        ref, d_min = oracle_entmax(z[rows], a)
        torch.testing.assert_close(got[rows][d_min > 1e-7], ref[d_min > 1e-7], rtol=0, atol=1e-9)


# ---- properties ---------------------------------------------------------------------------------------


def _random_case(g):
    """(z (R, n) fp64, alpha (R, 1) fp64 in (1, 10]) with random length, rows, scale and alphas."""
    n = int(torch.randint(1, 400, (1,), generator=g))
    n_rows = int(torch.randint(1, 6, (1,), generator=g))
    scale = 10 ** float(torch.rand(1, generator=g) * 4 - 2)  # 0.01 .. 100
    z = torch.randn(n_rows, n, generator=g, dtype=torch.float64) * scale
    alpha = 1 + 9 * torch.rand(n_rows, 1, generator=g, dtype=torch.float64) ** 2  # dense near 1
    return z, alpha.clamp(min=1.001, max=ALPHA_MAX)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_random_rows_and_alpha_mixtures_match_the_oracle(dtype):
    """200 random cases; rows whose smallest support gap d is below 1e-7 (fp64 cannot pin p = d^q
    there for alpha > 2, in the oracle either) are checked for the simplex only."""
    g = torch.Generator().manual_seed(0 if dtype == torch.float64 else 1)
    atol = 1e-9 if dtype == torch.float64 else 2e-6
    for _ in range(100):
        z, alpha = _random_case(g)
        x = z.to(dtype)
        ref, d_min = oracle_entmax(x.double(), alpha)
        well_posed = d_min > 1e-7
        for got in (entmax(x, alpha.to(dtype)), entmax(x[:1], float(alpha[0]))):
            rows = got.shape[0]
            assert got.dtype == dtype and (got >= 0).all()
            assert (got.double().sum(-1) - 1).abs().max() <= (1e-12 if dtype == torch.float64 else 1e-6)
            err = (got.double() - ref[:rows]).abs().amax(-1)
            assert (err[well_posed[:rows]] <= atol).all(), (err, alpha.flatten())


@pytest.mark.parametrize("alpha", [2.5, 4.0, 7.0, 10.0])
def test_random_rows_at_large_alpha(alpha):
    """The float-alpha paths (dense rows and compacted candidates) at large alpha, many rows at once."""
    g = torch.Generator().manual_seed(int(alpha * 10))
    for scale in (0.01, 1.0, 30.0):
        z = torch.randn(64, 257, generator=g, dtype=torch.float64) * scale
        ref, d_min = oracle_entmax(z, alpha)
        p = entmax(z, alpha)
        assert (p.sum(-1) - 1).abs().max() <= 1e-12
        torch.testing.assert_close(p[d_min > 1e-7], ref[d_min > 1e-7], rtol=0, atol=1e-9)
        p32 = entmax(z.float(), alpha).double()
        ref32, d_min32 = oracle_entmax(z.float().double(), alpha)
        assert (p32.sum(-1) - 1).abs().max() <= 1e-6
        torch.testing.assert_close(p32[d_min32 > 1e-7], ref32[d_min32 > 1e-7], rtol=0, atol=2e-6)


def test_alpha_outside_the_range_is_refused():
    z = torch.randn(2, 5)
    for alpha in (ALPHA_MAX * 1.01, 50.0, torch.tensor([[1.5], [11.0]])):
        with pytest.raises(ValueError, match=r"alpha must be in \(1, 10\]"):
            entmax(z, alpha)


# ---- NaN: the row, and only the row, on every path ------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3, 4.0, "tensor"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("n", [6, 400])  # dense rows, compacted candidates
def test_nan_or_inf_poisons_only_its_row(alpha, bad, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(4, n, generator=g, dtype=torch.float64) * (0.1 if n == 6 else 5)
    x[1, 2] = bad
    x[3] = -math.inf
    a = alpha
    if alpha == "tensor":
        a = torch.tensor([[1.2], [1.7], [3.0], [2.0]], dtype=torch.float64, requires_grad=True)
    x.requires_grad_(True)
    p = entmax(x, a)
    assert torch.isnan(p[1]).all() and not torch.isnan(p[[0, 2, 3]]).any()
    assert torch.equal(p[3], torch.zeros_like(p[3]))
    grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
    inputs = (x, a) if alpha == "tensor" else (x,)
    grads = torch.autograd.grad((p * grad).sum(), inputs)
    assert torch.isnan(grads[0][1]).all() and torch.isfinite(grads[0][[0, 2, 3]]).all()
    assert torch.equal(grads[0][3], torch.zeros_like(grads[0][3]))
    if alpha == "tensor":
        assert torch.isnan(grads[1][1]).all() and torch.isfinite(grads[1][[0, 2, 3]]).all()
