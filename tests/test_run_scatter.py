"""benchmarks/run_scatter.py's rank correlation: rho against scipy's Spearman over ties and awkward orders,
the permutation p against the exact p from every permutation of a small sample, and the rank table that
pairs each quantity with the exact match where both are known."""

import itertools
import random
from pathlib import Path

import pytest
from scipy.stats import spearmanr

from conftest import load_benchmark


@pytest.fixture
def scatter(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return load_benchmark("run_scatter")


def test_mean_ranks_give_ties_their_mean_rank(scatter):
    assert scatter.mean_ranks([30.0, 10.0, 20.0, 10.0, 30.0, 30.0]) == [5.0, 1.5, 3.0, 1.5, 5.0, 5.0]
    assert scatter.mean_ranks([2.0]) == [1.0]


@pytest.mark.parametrize("case", range(12))
def test_rho_matches_scipy_with_ties_and_mixed_orders(scatter, case):
    generator = random.Random(case)
    n = generator.randint(3, 14)
    # few distinct values so ties are common; a leading constant offset and negative values as well
    xs = [float(generator.choice([-3, 0, 1, 1, 2, 7])) + 100 * (case % 2) for _ in range(n)]
    ys = [float(generator.randint(-2, 3)) for _ in range(n)]
    if len(set(xs)) == 1 or len(set(ys)) == 1:
        assert scatter.rank_correlation(xs, ys, shuffles=10) is None
        return
    rho, p = scatter.rank_correlation(xs, ys, shuffles=200)
    assert rho == pytest.approx(spearmanr(xs, ys).statistic, abs=1e-12)
    assert 0 < p <= 1


def test_permutation_p_agrees_with_the_exact_p(scatter):
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    ys = [2.0, 1.0, 4.0, 3.0, 7.0, 5.0, 6.0]
    rho, p = scatter.rank_correlation(xs, ys, shuffles=20000, seed=3)
    observed = abs(spearmanr(xs, ys).statistic)
    exact = sum(abs(spearmanr(xs, order).statistic) >= observed - 1e-12
                for order in itertools.permutations(ys)) / 5040
    assert exact < 0.1 and p == pytest.approx(exact, abs=0.006)  # two-sided: a one-sided p would be half
    flipped_rho, flipped_p = scatter.rank_correlation(xs, [-y for y in ys], shuffles=20000, seed=3)
    assert flipped_rho == pytest.approx(-rho) and flipped_p == pytest.approx(p, abs=0.006)
    perfect_rho, perfect_p = scatter.rank_correlation(xs, xs, shuffles=2000)
    assert perfect_rho == pytest.approx(1.0) and perfect_p < 0.01
    # the observed pairing counts as one of the pairings: no shuffle leaves p at 1, never 0 or undefined
    assert scatter.rank_correlation(xs, ys, shuffles=0) == (pytest.approx(rho), 1.0)
    assert perfect_p >= 1 / 2001


def test_too_few_or_mismatched_pairs(scatter):
    assert scatter.rank_correlation([1.0, 2.0], [2.0, 1.0]) is None
    with pytest.raises(ValueError, match="as many xs as ys"):
        scatter.rank_correlation([1.0, 2.0, 3.0], [1.0, 2.0])


def test_rank_table_pairs_only_runs_with_both_values(scatter):
    exact = [20.0, 50.0, 35.0, 5.0, None, 10.0, 60.0]
    early = [10.0, 30.0, None, 15.0, 40.0, 5.0, 33.0]
    sparse = [1.0, None, None, None, 2.0, None, 3.0]  # two pairs with an exact match: no rho
    lines = scatter.rank_table([("early", early), ("sparse", sparse)], exact, 1024, shuffles=500)
    assert "exact match at 1024x" in lines[0] and "500 shuffles" in lines[0]
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:] for line in lines[4:]}
    pairs = [(x, y) for x, y in zip(early, exact, strict=True) if x is not None and y is not None]
    rho, p = scatter.rank_correlation([x for x, _ in pairs], [y for _, y in pairs], shuffles=500)
    assert rows["early"] == ["5", f"{rho:.2f}", f"{p:.2g}"]
    assert rows["sparse"] == ["2", "-", "-"]
    with pytest.raises(ValueError):  # one value per run in every column
        scatter.rank_table([("short", early[:3])], exact, 1024)
