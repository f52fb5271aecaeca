"""Side-by-side scatter panels of one per-run quantity each against the runs' exact match at several test
lengths, every run labelled with its row number in the table beside the plot (escape_vs_length.py,
swap_vs_length.py)."""

from __future__ import annotations

from pathlib import Path


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
