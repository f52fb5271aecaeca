"""Side-by-side scatter panels of one per-run quantity each against the runs' exact match at several test
lengths (exact_at reads them from eval.json), every run labelled with its row number in the table beside the
plot (escape_vs_length.py, swap_vs_length.py), and the rank correlation such a panel shows: Spearman's rho
(the Pearson correlation of the two ranks, ties given their mean rank) with a two-sided permutation p."""

from __future__ import annotations

import math
import random
from pathlib import Path

from asentmax.runs import EVAL_NAME, load_evaluation


def exact_at(run_dir: Path, multipliers: list[int]) -> dict[int, float | None]:
    """{multiplier: exact match % of the run's eval.json at multiplier x its ID length, or None where it has
    no such row or no eval.json}."""
    exact = dict.fromkeys(multipliers)
    if (run_dir / f"{EVAL_NAME}.json").is_file():
        evaluation = load_evaluation(run_dir)
        by_length = {row["length"]: row for row in evaluation["rows"]}
        for m in multipliers:
            row = by_length.get(m * evaluation["id_length"])
            exact[m] = None if row is None else 100.0 * row["exact_match"]
    return exact


def mean_ranks(values: list[float]) -> list[float]:
    """1-based ranks of `values`, each run of equal values given the mean of the ranks it spans."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _pearson(xs: list[float], ys: list[float]) -> float | None:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    dx, dy = [x - mean_x for x in xs], [y - mean_y for y in ys]
    spread = math.sqrt(sum(d * d for d in dx) * sum(d * d for d in dy))
    return None if spread == 0 else sum(a * b for a, b in zip(dx, dy, strict=True)) / spread


def rank_correlation(xs: list[float], ys: list[float], shuffles: int = 20000,
                     seed: int = 0) -> tuple[float, float] | None:
    """(Spearman's rho of the pairs, two-sided permutation p: the share of `shuffles` random pairings of the
    ys with |rho| at least the observed one, counting the observed pairing, (k + 1) / (shuffles + 1)); None
    for fewer than 3 pairs or when the xs or the ys are all equal (no ranking to correlate)."""
    if len(xs) != len(ys):
        raise ValueError(f"need as many xs as ys, got {len(xs)} and {len(ys)}")
    if len(xs) < 3:
        return None
    rank_x, rank_y = mean_ranks(xs), mean_ranks(ys)
    rho = _pearson(rank_x, rank_y)
    if rho is None:
        return None
    generator, shuffled, as_far = random.Random(seed), list(rank_y), 0
    for _ in range(shuffles):
        generator.shuffle(shuffled)
        as_far += abs(_pearson(rank_x, shuffled)) >= abs(rho) - 1e-12
    return rho, (as_far + 1) / (shuffles + 1)


def rank_table(columns: list[tuple[str, list[float | None]]], exact: list[float | None], multiplier: int,
               shuffles: int = 20000) -> list[str]:
    """Markdown lines: a sentence and a table with, per (label, one value per run) of `columns`, the runs that
    have both that value and an exact match in `exact` (None: missing) and their rank_correlation, against
    the exact match at `multiplier` x the training length."""
    lines = [f"Each quantity against the exact match at {multiplier}x: Spearman's rho over the runs with "
             f"both, and its two-sided permutation p ({shuffles:,} shuffles; benchmarks/run_scatter.py).", "",
             "| quantity | runs | rho | p |", "|---|---|---|---|"]
    for label, values in columns:
        pairs = [(x, y) for x, y in zip(values, exact, strict=True) if x is not None and y is not None]
        result = rank_correlation([x for x, _ in pairs], [y for _, y in pairs], shuffles)
        rho, p = ("-", "-") if result is None else (f"{result[0]:.2f}", f"{result[1]:.2g}")
        lines.append(f"| {label} | {len(pairs)} | {rho} | {p} |")
    return lines


def scatter_panels(summaries: list[dict], multipliers: list[int], panels: list[tuple[str, str, str, bool]],
                   path: Path) -> None:
    """One panel per (key, x label, title, log x) of `panels`: each summary's value at key (skipped when
    None) against its exact[multiplier] % for each multiplier, labelled with its 1-based number at the last
    multiplier's point; saved to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), sharey=True, squeeze=False)
    for ax, (key, xlabel, title, log_x) in zip(axes[0], panels, strict=True):
        for m, marker in zip(multipliers, "osD^v" * len(multipliers), strict=False):
            points = [(s[key], s["exact"][m]) for s in summaries
                      if s[key] is not None and s["exact"][m] is not None]
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, label=f"{m}x", s=40)
        for number, s in enumerate(summaries, 1):
            if s[key] is not None and s["exact"][multipliers[-1]] is not None:
                ax.annotate(str(number), (s[key], s["exact"][multipliers[-1]]), fontsize=8, xytext=(4, 4),
                            textcoords="offset points")
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if log_x:
            ax.set_xscale("log")
    axes[0][0].set_ylabel("exact match % (greedy decoding)")
    axes[0][0].set_ylim(-3, 103)
    axes[0][0].legend(title="test length")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
