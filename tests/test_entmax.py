"""Forward tests of asentmax.ops.entmax against independent fp64 computations (arXiv:2506.16640, section 2).

Oracles written here, independently of the library: sparsemax and 1.5-entmax by sorting the whole row
(the classic support-size search), and general alpha by 200 bisection steps on tau in fp64.
"""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asentmax.ops.entmax import entmax, entmax15, entmax_threshold, sparsemax


def sorted_closed_form(z, alpha):
    """fp64 sparsemax (alpha=2) or 1.5-entmax by sorting: the largest k whose threshold is below z_(k)."""
    s = (alpha - 1) * (z.double() - z.double().amax(-1, keepdim=True))  # shifted: no cancellation
    srt, _ = torch.sort(s, dim=-1, descending=True)
    k = torch.arange(1, s.shape[-1] + 1, dtype=torch.float64)
    c1 = torch.cumsum(srt, -1)
    if alpha == 2.0:
        tau_k = (c1 - 1) / k
    else:
        mean = c1 / k
        var = torch.cumsum(srt * srt, -1) / k - mean * mean
        tau_k = mean - torch.sqrt(torch.clamp((1 - k * var) / k, min=0))
    support = (tau_k < srt).sum(-1, keepdim=True)
    tau = tau_k.gather(-1, support - 1)
    return torch.clamp(s - tau, min=0) ** (1 / (alpha - 1))


def bisection(z, alpha, steps=200):
    """fp64 alpha-entmax by plain bisection on tau (slow, obviously correct)."""
    s = (alpha - 1) * z.double()
    hi = s.amax(-1, keepdim=True)
    lo = hi - 1
    for _ in range(steps):
        mid = (lo + hi) / 2
        big = (torch.clamp(s - mid, min=0) ** (1 / (alpha - 1))).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
    return torch.clamp(s - lo, min=0) ** (1 / (alpha - 1))


def rows(n_rows, n, scale, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_rows, n, generator=g, dtype=dtype) * scale


# scales pick the internal path: tiny logits give dense supports, large ones a few candidates
SHAPES = [(1, 1), (5, 2), (7, 17), (3, 63), (4, 130), (6, 1111), (3, 3000)]
SCALES = [0.05, 1.0, 8.0]


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_closed_form_alphas_match_sorting(shape, scale, alpha):
    z = rows(*shape, scale)
    expected = sorted_closed_form(z, alpha)
    torch.testing.assert_close(entmax(z, alpha), expected, rtol=0, atol=1e-13)
    got32 = entmax(z.float(), alpha).double()
    torch.testing.assert_close(got32, sorted_closed_form(z.float(), alpha), rtol=0, atol=2e-6)


def test_named_functions():
    z = rows(4, 50, 1.0)
    torch.testing.assert_close(sparsemax(z), sorted_closed_form(z, 2.0), rtol=0, atol=1e-13)
    torch.testing.assert_close(entmax15(z), sorted_closed_form(z, 1.5), rtol=0, atol=1e-13)


@pytest.mark.parametrize("alpha", [1.05, 1.125, 1.25, 1.33, 1.75, 2.5, 4.0])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("shape", [(3, 17), (4, 130), (3, 2000)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_general_alpha_matches_bisection(shape, scale, alpha):
    z = rows(*shape, scale, seed=1)
    torch.testing.assert_close(entmax(z, alpha), bisection(z, alpha), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_input_is_left_unchanged(alpha, scale, dtype):
    z = rows(5, 130, scale, seed=7, dtype=dtype)
    before = z.clone()
    entmax(z, alpha)
    entmax_threshold(z, alpha)
    assert torch.equal(z, before)


def _near_uniform_and_peaked_rows(seed):
    """Rows of 400: every third near-uniform (for alpha <= 2 nearly every entry in the support, so it stays
    denser than half its length however far the lower bound rises), the others peaked (a few)."""
    z = rows(12, 400, 10.0, seed=seed)
    z[::3] *= 1e-4
    return z


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25, "per row"])
def test_rows_too_dense_to_compact_are_solved_apart_from_the_rest(alpha, monkeypatch):
    """One call with near-uniform and peaked rows: the dense rows alone take the full-length solve (the others
    are compacted), and every row still matches the fp64 oracles, in fp64 and in fp32."""
    import asentmax.ops.entmax as entmax_module

    z = _near_uniform_and_peaked_rows(seed=4)
    alphas = torch.tensor([1.1, 1.25, 1.5, 1.75, 2.0, 3.0] * 2, dtype=torch.float64)[:, None]
    full_rows, real = [], entmax_module._solve_full_rows
    monkeypatch.setattr(entmax_module, "_solve_full_rows",
                        lambda x, *args: full_rows.extend(x.tolist()) or real(x, *args))
    got = entmax(z, alphas if alpha == "per row" else alpha)
    solved_in_full = {i for i in range(z.shape[0]) if z[i].tolist() in full_rows}
    assert solved_in_full and solved_in_full <= {0, 3, 6, 9}  # near-uniform rows only, never all rows
    for i in range(z.shape[0]):
        a = alphas[i, 0].item() if alpha == "per row" else alpha
        expected = sorted_closed_form(z[i : i + 1], a) if a in (1.5, 2.0) else bisection(z[i : i + 1], a)
        torch.testing.assert_close(got[i : i + 1], expected, rtol=0, atol=1e-12)
        if alpha != "per row":
            torch.testing.assert_close(entmax(z.float(), a)[i : i + 1].double(), expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("alpha, scale", [(1.5, 0.3), (1.5, 0.1), (2.0, 0.1)])
def test_lower_bound_passes_go_on_while_they_shrink_the_candidates(alpha, scale):
    """Rows of moderate spread at 1,020 entries, where the first pass leaves half to three quarters of the row
    as candidates (530-752 of 1,020), several times the true support. The passes go on while each removes a
    quarter, so the rows compact near their support (or below the compaction fraction), not at half their
    length."""
    import asentmax.ops.entmax as entmax_module

    x = rows(64, 1020, scale, seed=5).float()
    m = x.amax(dim=1, keepdim=True)
    t, counts = entmax_module._raise_lower_bound(x, m, alpha, torch.empty_like(x))
    support = (entmax(x.double(), alpha) > 0).sum(1)
    assert (counts >= support).all()  # still a lower bound: every support entry is a candidate
    assert counts.max() <= max(1.25 * support.max(), entmax_module._COMPACT_FRACTION * x.shape[1])


def _rows_of_spread_candidates(seed):
    """Rows of 1,000 whose candidate counts spread over every compaction class: each row scaled by its own
    10^u (u from -1.5 to 1): a few candidates up to about half the row."""
    z = rows(40, 1000, 1.0, seed=seed)
    return z * 10.0 ** torch.linspace(-1.5, 1.0, 40, dtype=torch.float64)[:, None]


@pytest.mark.parametrize("alpha", [1.5, 1.25, 3.0, "per row"])
def test_rows_of_every_candidate_count_match_the_oracles(alpha, monkeypatch):
    """Compacted rows are solved in classes by candidate count (_CLASS_WIDTHS), each at its own width; with
    the merge threshold lowered every class here is solved apart, and every row still matches the fp64
    oracles (the classes' results land in their own rows)."""
    import asentmax.ops.entmax as entmax_module

    monkeypatch.setattr(entmax_module, "_CLASS_MIN_SAVING", 0)
    widths, real = [], entmax_module.solve_threshold
    monkeypatch.setattr(entmax_module, "solve_threshold",
                        lambda s, *args: widths.append(s.shape[1]) or real(s, *args))
    z = _rows_of_spread_candidates(seed=5)
    alphas = torch.tensor([1.1, 1.25, 1.5, 1.75, 2.0, 3.0, 1.3, 1.6] * 5, dtype=torch.float64)[:, None]
    got = entmax(z, alphas if alpha == "per row" else alpha)
    assert len(widths) >= 3 and len(set(widths)) == len(widths), widths  # several classes, one solve each
    for i in range(z.shape[0]):
        a = alphas[i, 0].item() if alpha == "per row" else alpha
        expected = sorted_closed_form(z[i : i + 1], a) if a in (1.5, 2.0) else bisection(z[i : i + 1], a)
        torch.testing.assert_close(got[i : i + 1], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("counts, n_classes", [([3] * 10000 + [500] * 10, 2), ([3] * 10 + [500] * 10, 1),
                                               ([3] * 2000 + [40] * 2000 + [200] * 2000 + [900], 3),
                                               ([7], 1)])
def test_compaction_classes_split_only_where_padding_costs(counts, n_classes):
    """A class joins the next wider one when padding it there costs fewer than _CLASS_MIN_SAVING entries:
    10,000 rows of 3 candidates are not padded to 500, 10 rows are; 2,000 rows of 3 join those of 40 (74K
    entries of padding), which stay apart from those of 200 (640K)."""
    from asentmax.ops.entmax import _compact_classes

    counts = torch.tensor(counts)
    classes = _compact_classes(counts)
    assert len(classes) == n_classes
    members = torch.cat([m for m, _ in classes])
    assert sorted(members.tolist()) == list(range(counts.numel()))  # every row in exactly one class
    for m, width in classes:
        assert width == int(counts[m].max())


def test_per_row_alpha_equals_rowwise_calls():
    z = rows(6, 300, 1.0, seed=2)
    alphas = torch.tensor([1.1, 1.25, 1.5, 1.75, 2.0, 3.0], dtype=torch.float64)
    got = entmax(z, alphas[:, None])
    for i, a in enumerate(alphas.tolist()):
        torch.testing.assert_close(got[i], bisection(z[i : i + 1], a)[0], rtol=0, atol=1e-12)


def test_alpha_tensor_broadcasts_over_leading_dims():
    z = rows(2 * 3 * 5, 40, 1.0, seed=3).view(2, 3, 5, 40)
    alpha = torch.tensor([1.2, 1.5, 2.0], dtype=torch.float64).view(3, 1, 1)
    got = entmax(z, alpha)
    for h, a in enumerate([1.2, 1.5, 2.0]):
        torch.testing.assert_close(got[:, h], bisection(z[:, h], a), rtol=0, atol=1e-12)


def test_alpha_to_one_approaches_softmax():
    z = rows(4, 200, 2.0, seed=4)
    errors = [(entmax(z, 1 + eps) - torch.softmax(z, -1)).abs().max().item() for eps in (1e-2, 1e-3, 1e-4)]
    assert errors[0] > 5 * errors[1] > 25 * errors[2] and errors[2] < 1e-3  # O(alpha - 1)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_two_element_closed_form(alpha):
    z = rows(200, 2, 1.5, seed=5)
    p = entmax(z, alpha)
    a = alpha - 1
    gap = (z[:, 0] - z[:, 1]) * a
    both = gap.abs() < 1  # both in the support iff |a (z1 - z2)| < 1
    # both in the support: p1^(a) - p2^(a) = a (z1 - z2) and p1 + p2 = 1
    torch.testing.assert_close(p[both, 0] ** a - p[both, 1] ** a, gap[both], rtol=0, atol=1e-12)
    top = torch.where(gap >= 0, 0, 1)
    winners = p[~both].gather(1, top[~both, None]).squeeze(1)
    assert torch.equal(winners, torch.ones_like(winners))
    if alpha == 2.0:
        torch.testing.assert_close(p[:, 0], torch.clamp((gap + 1) / 2, 0, 1), rtol=0, atol=1e-15)


def mass(z, tau, alpha):
    """sum_i [(alpha-1) z_i - tau]_+^(1/(alpha-1)) in fp64."""
    return (torch.clamp((alpha - 1) * z.double() - tau.double(), min=0) ** (1 / (alpha - 1))).sum(-1)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 2.5])
def test_threshold_sums_to_one_independently(alpha):
    z = rows(8, 777, 1.0, seed=6)
    z[0, :700] = float("-inf")
    tau = entmax_threshold(z, alpha)
    assert tau.shape == (8, 1) and tau.dtype == torch.float64
    torch.testing.assert_close(mass(z, tau, alpha), torch.ones(8, dtype=torch.float64), rtol=0, atol=1e-13)
    from_tau = torch.clamp((alpha - 1) * z - tau, min=0) ** (1 / (alpha - 1))
    torch.testing.assert_close(entmax(z, alpha), from_tau, rtol=0, atol=1e-13)
    # fp32: tau is the root to within 2 units in the last place (the mass brackets 1 around it)
    z32 = z.float()
    tau32 = entmax_threshold(z32, alpha)
    assert tau32.dtype == torch.float32
    below, above = tau32, tau32
    for _ in range(2):
        below, above = torch.nextafter(below, below - 1), torch.nextafter(above, above + 1)
    assert (mass(z32, below, alpha) >= 1).all() and (mass(z32, above, alpha) <= 1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_sums_to_one_fp32_big_rows(alpha, dtype):
    z = rows(64, 4096, 1.0, seed=7, dtype=dtype)
    p = entmax(z, alpha)
    assert (p.double().sum(-1) - 1).abs().max() <= (1e-6 if dtype == torch.float32 else 1e-13)


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_other_dims(dim):
    z = rows(5 * 7, 9, 1.0, seed=8).view(5, 7, 9)
    moved = z.movedim(dim, -1)
    expected = sorted_closed_form(moved, 1.5).movedim(-1, dim)
    torch.testing.assert_close(entmax(z, 1.5, dim=dim), expected, rtol=0, atol=1e-13)
    tau = entmax_threshold(z, 1.5, dim=dim)
    assert tau.shape[dim % 3] == 1 and tau.numel() == z.numel() // z.shape[dim]


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_against_entmax_package(alpha):
    entmax_pkg = pytest.importorskip("entmax")
    z = rows(16, 500, 1.0, seed=9)
    if alpha == 1.5:
        expected = entmax_pkg.entmax15(z, dim=-1)
    elif alpha == 2.0:
        expected = entmax_pkg.sparsemax(z, dim=-1)
    else:
        expected = entmax_pkg.entmax_bisect(z, alpha, dim=-1, n_iter=100)
    torch.testing.assert_close(entmax(z, alpha), expected, rtol=0, atol=1e-12)


# ---- robustness -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_fp32(dtype):
    z = rows(8, 333, 2.0, seed=10).to(dtype)
    p = entmax(z, 1.5)
    assert p.dtype == dtype
    expected = sorted_closed_form(z.double(), 1.5).to(dtype)
    torch.testing.assert_close(p, expected, rtol=0, atol=torch.finfo(dtype).eps)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_minus_inf_entries_and_empty_rows(alpha):
    z = rows(4, 300, 1.0, seed=11)
    z[0] = float("-inf")
    z[1, ::2] = float("-inf")
    z[2, 1:] = float("-inf")
    p = entmax(z, alpha)
    assert torch.equal(p[0], torch.zeros(300, dtype=p.dtype))
    assert torch.equal(p[1, ::2], torch.zeros(150, dtype=p.dtype))
    assert p[2, 0] == 1 and torch.equal(p[2, 1:], torch.zeros(299, dtype=p.dtype))
    finite = z[1, 1::2]
    torch.testing.assert_close(p[1, 1::2], bisection(finite[None], alpha)[0], rtol=0, atol=1e-12)
    tau = entmax_threshold(z, alpha)
    assert tau[0].item() == math.inf and torch.isfinite(tau[1:]).all()


def test_nan_stays_in_its_row():
    z = rows(3, 50, 1.0, seed=12)
    z[1, 7] = float("nan")
    p = entmax(z, 1.5)
    assert torch.isnan(p[1]).all() and torch.isfinite(p[[0, 2]]).all()
    torch.testing.assert_close(p[[0, 2]], sorted_closed_form(z[[0, 2]], 1.5), rtol=0, atol=1e-13)


@pytest.mark.parametrize("alpha", [1.5, 1.75, 2.0])
def test_large_magnitude_inputs(alpha):
    z = rows(4, 400, 1.0, seed=13) + 1e4
    z32 = z.float()
    p = entmax(z32, alpha)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.double(), bisection(z32.double(), alpha), rtol=0, atol=1e-5)
    assert (p.double().sum(-1) - 1).abs().max() < 1e-6


def test_bad_inputs_raise():
    z = torch.randn(3, 4)
    for alpha in (1.0, 0.5, -2.0, float("nan"), float("inf"), 10.5):
        with pytest.raises(ValueError, match="alpha"):
            entmax(z, alpha)
    with pytest.raises(ValueError, match="alpha"):
        entmax(z, torch.tensor([[1.5], [1.0], [2.0]]))
    with pytest.raises(ValueError, match="alpha"):
        entmax(z, torch.tensor([[1.5], [float("inf")], [2.0]]))
    with pytest.raises(ValueError, match="floating"):
        entmax(torch.arange(6).view(2, 3), 1.5)
    with pytest.raises(ValueError, match="size 1 along dim"):
        entmax(z, torch.full((3, 4), 1.5))
    with pytest.raises(ValueError, match="dim"):
        entmax(z, 1.5, dim=2)
    with pytest.raises(ValueError, match="floating"):
        entmax_threshold(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="backend"):
        entmax(z, 1.5, backend="chunked")


# ---- the backend switch --------------------------------------------------------------------------------


def test_reference_backend_is_the_default_on_cpu():
    z = rows(4, 300, 2.0, seed=15)
    torch.testing.assert_close(entmax(z, 1.5, backend="reference"), entmax(z, 1.5), rtol=0, atol=0)


def test_triton_backend_refuses_what_the_kernel_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    z = torch.randn(3, 8)
    with pytest.raises(ValueError, match="backend='triton' cannot run on a CPU tensor"):
        entmax(z, 1.5, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for alpha, why in ((torch.full((3, 1), 1.5), "tensor alpha"), (3.0, "outside the kernel's range"),
                       (1.001, "outside the kernel's range")):
        with pytest.raises(ValueError, match=why):
            entmax(z, alpha, backend="triton")
    with pytest.raises(ValueError, match="float64"):
        entmax(z.double(), 1.5, backend="triton")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 (make test)")
def test_reference_backend_never_launches_the_kernel(monkeypatch):
    """Under the interpreter "triton" runs the row kernel; "reference" must not touch it."""
    er = pytest.importorskip("asentmax.ops.triton.entmax_rows")
    calls = []
    real = er.entmax_rows_forward
    monkeypatch.setattr(er, "entmax_rows_forward", lambda x, a: calls.append(a) or real(x, a))
    z = rows(3, 20, 1.0, seed=16).float()
    p_ref = entmax(z, 1.5, backend="reference")
    assert calls == []
    p_kernel = entmax(z, 1.5, backend="triton")
    assert calls == [1.5]
    torch.testing.assert_close(p_kernel, p_ref, rtol=0, atol=2e-6)


# ---- properties (hypothesis) ------------------------------------------------------------------

finite_rows = st.lists(st.floats(-30, 30, allow_nan=False, width=64), min_size=1, max_size=40)
alphas = st.sampled_from([1.1, 1.5, 1.7, 2.0, 2.6])


@settings(max_examples=60, deadline=None)
@given(values=finite_rows, alpha=alphas)
def test_simplex_and_exact_zeros(values, alpha):
    """p sums to 1, is exactly 0 where (alpha - 1) z <= tau and positive where it is above. The solve works
    on (alpha - 1)(z - max z) and tau comes back in absolute units, each rounded to its own precision, so an
    entry within 2 units of the last place of the larger of |tau| and (alpha - 1) max |z| may fall on either
    side: [29, 30 - 4e-15] at alpha 2 has p = 1.8e-15 at 29, where tau rounds to 29.0; [1, 1e-91] at alpha 2
    has p = 0 at 1e-91 (exactly 5e-92), since 1e-91 - 1 rounds to -1."""
    z = torch.tensor([values], dtype=torch.float64)
    p = entmax(z, alpha)
    assert (p >= 0).all()
    assert abs(p.sum().item() - 1) < 1e-12
    tau = entmax_threshold(z, alpha)
    resolution = 2 * torch.finfo(torch.float64).eps * torch.maximum(tau.abs(), (alpha - 1) * z.abs().max())
    assert (p[(alpha - 1) * z <= tau - resolution] == 0).all()
    assert (p[(alpha - 1) * z > tau + resolution] > 0).all()


@settings(max_examples=40, deadline=None)
@given(values=finite_rows, alpha=alphas, seed=st.integers(0, 10_000), shift=st.floats(-50, 50))
def test_permutation_equivariance_and_shift_invariance(values, alpha, seed, shift):
    z = torch.tensor([values], dtype=torch.float64)
    p = entmax(z, alpha)
    perm = torch.randperm(z.shape[1], generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(entmax(z[:, perm], alpha), p[:, perm], rtol=0, atol=1e-12)
    torch.testing.assert_close(entmax(z + shift, alpha), p, rtol=0, atol=1e-9)


def test_empty_inputs():
    assert entmax(torch.randn(0, 5)).shape == (0, 5)
    assert entmax(torch.randn(3, 0)).shape == (3, 0)
    assert torch.equal(entmax_threshold(torch.randn(3, 0)), torch.full((3, 1), math.inf))
    x = torch.randn(2, 0, 4, requires_grad=True)
    entmax(x, 1.5, dim=1).sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_reference_backend_stays_in_torch(monkeypatch):
    er = pytest.importorskip("asentmax.ops.triton.entmax_rows")
    calls = []
    real = er.entmax_rows_forward
    monkeypatch.setattr(er, "entmax_rows_forward", lambda x, a: calls.append(a) or real(x, a))
    z = torch.randn(8, 500, device="cuda")
    p_ref = entmax(z, 1.5, backend="reference")
    assert calls == []
    torch.testing.assert_close(entmax(z, 1.5), p_ref, rtol=0, atol=2e-6)
    assert calls == [1.5]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3, 5.0])
def test_cuda_matches_cpu(alpha):
    """float alpha <= 2: the Triton row kernel (if importable); alpha 5 and tensor alpha: the torch path."""
    z = rows(64, 1000, 2.0, seed=14)
    z[3] = float("-inf")
    z[5, ::2] = float("-inf")
    expected = bisection(z, alpha).float()
    expected[3] = 0
    zc = z.float().cuda().requires_grad_(True)
    for a in (alpha, torch.full((64, 1), alpha, device="cuda")):
        p = entmax(zc, a)
        torch.testing.assert_close(p.cpu(), expected, rtol=0, atol=2e-6)
        (grad,) = torch.autograd.grad((p * p).sum(), zc)
        assert torch.isfinite(grad).all()
