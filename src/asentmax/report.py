"""Side-by-side report of evaluated runs (the library behind `asentmax compare` and the demo, below the
drivers): a markdown table with the paper's numbers (arXiv:2506.16640,
its synthetic-task results), an accuracy-vs-length plot (log x axis) and an attention-dispersion plot
(normalised entropy and support size vs length: the paper's attention-dispersion argument) from the
`dispersion` entries `asentmax eval` stores per length.

Writes compare.md, compare.json, accuracy.png and (when dispersion was measured) dispersion.png, after
every eval.json has been read and checked (asentmax.runs.load_evaluation: RunError naming a bad file).
"""

from __future__ import annotations

from pathlib import Path

from asentmax.nn.normalisers import NORMALISERS
from asentmax.runs import format_multiplier, load_evaluation, write_json

# arXiv:2506.16640, exact match % per length multiplier with NAPE positions (MQMTAR, Reverse from the
# paper's tables; Copy and Sort read second-hand from an independent reproduction's notes).
PAPER_RESULTS = {
    "mqmtar": {
        "multipliers": (1, 2, 4, 16, 64, 256, 1024),
        "softmax": (100.0, 100.0, 100.0, 99.5, 97.8, 80.2, 3.0),
        "ssmax": (99.9, 100.0, 99.9, 99.6, 98.3, 90.6, 26.7),
        "entmax": (100.0, 100.0, 100.0, 99.2, 92.7, 66.8, 9.3),
        "asentmax": (100.0, 100.0, 100.0, 99.7, 99.6, 99.0, 95.3),
    },
    "reverse": {
        "multipliers": (1, 1.5, 2, 4, 8),
        "softmax": (100.0, 36.0, 0.0, 0.0, 0.0),
        "entmax": (100.0, 100.0, 93.5, 28.5, 2.5),
        "asentmax": (100.0, 100.0, 99.8, 96.4, 56.7),
    },
    "copy": {
        "multipliers": (1, 2, 4, 8, 16, 32, 64),
        "softmax": (100.0, 100.0, 99.9, 99.9, 99.4, 96.1, 85.5),
        "asentmax": (100.0, 100.0, 99.9, 99.7, 99.4, 96.3, 86.6),
    },
    "sort": {
        "multipliers": (1, 2, 4, 8),
        "softmax": (100.0, 0.0, 0.0, 0.0),
        "entmax": (100.0, 99.3, 57.8, 0.0),
        "asentmax": (100.0, 100.0, 79.7, 0.0),
    },
}
METHOD_NAMES = {n.name: n.label for n in NORMALISERS}


def method_label(result: dict) -> str:
    """Paper name of the attention, with the position scheme when it is not the paper's NAPE."""
    config = result["model_config"]
    name = METHOD_NAMES.get(config["attention"], config["attention"])
    return name if config.get("position", "nape") == "nape" else f"{name} ({config['position']})"


def _multiplier(row: dict, result: dict) -> float:
    return row["length"] / result["id_length"]


def _column_name(m: float) -> str:
    return "ID" if m == 1 else format_multiplier(m)


def comparison_table(results: list[dict]) -> str:
    """Markdown table shaped like the paper's results tables: our runs' exact match % and the paper's."""
    multipliers = sorted({_multiplier(row, r) for r in results for row in r["rows"]})
    header = ["task", "method", "source", *(_column_name(m) for m in multipliers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    paper_rows_done = set()
    for result in results:
        by_m = {_multiplier(row, result): row for row in result["rows"]}
        cells = [f"{100 * by_m[m]['exact_match']:.1f}" if m in by_m else "-" for m in multipliers]
        lines.append(f"| {result['task']} | {method_label(result)} | ours ({Path(result['run_dir']).name}) | "
                     + " | ".join(cells) + " |")
        paper = PAPER_RESULTS.get(result["task"], {})
        key = (result["task"], result["model_config"]["attention"])
        if key[1] in paper and key not in paper_rows_done:
            paper_rows_done.add(key)
            values = dict(zip(paper["multipliers"], paper[key[1]], strict=True))
            cells = [f"{values[m]:.1f}" if m in values else "-" for m in multipliers]
            lines.append(f"| {result['task']} | {METHOD_NAMES[key[1]]} | paper | " + " | ".join(cells) + " |")
    ids = sorted({r["id_length"] for r in results})
    note = (f"\nExact match % of greedy decoding; ID = length {', '.join(map(str, ids))} for our runs, "
            "64 in the paper (arXiv:2506.16640, NAPE; '-' = not measured).\n")
    for result in results:
        if result.get("pending_lengths"):
            note += (f"{Path(result['run_dir']).name}: evaluation unfinished, lengths "
                     f"{', '.join(map(str, result['pending_lengths']))} still to do.\n")
    return "\n".join(lines) + "\n" + note


def _plot_accuracy(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, result in enumerate(results):
        colour = f"C{i % 10}"
        xs = [_multiplier(row, result) for row in result["rows"]]
        ys = [100 * row["exact_match"] for row in result["rows"]]
        low = [100 * row["ci_low"] for row in result["rows"]]
        high = [100 * row["ci_high"] for row in result["rows"]]
        ax.plot(xs, ys, "o-", color=colour, label=f"{method_label(result)} ({Path(result['run_dir']).name})")
        ax.fill_between(xs, low, high, color=colour, alpha=0.15)
        paper = PAPER_RESULTS.get(result["task"], {})
        attention = result["model_config"]["attention"]
        if attention in paper:
            ax.plot(paper["multipliers"], paper[attention], "--", color=colour, alpha=0.6,
                    label=f"{METHOD_NAMES[attention]} (paper)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("test length / training length (ID)")
    ax.set_ylabel("exact match %")
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"length generalisation: {', '.join(sorted({r['task'] for r in results}))}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_dispersion(results: list[dict], path: Path) -> bool:
    """Normalised entropy and support size vs length per method; False when no run measured dispersion."""
    measured = [r for r in results if any("dispersion" in row for row in r["rows"])]
    if not measured:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_entropy, ax_support) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, result in enumerate(measured):
        rows = [row for row in result["rows"] if "dispersion" in row]
        xs = [row["length"] for row in rows]
        label = f"{method_label(result)} ({Path(result['run_dir']).name})"
        ax_entropy.plot(xs, [row["dispersion"]["normalised_entropy"] for row in rows], "o-", color=f"C{i}",
                        label=label)
        ax_support.plot(xs, [row["dispersion"]["support_size"] for row in rows], "o-", color=f"C{i}",
                        label=label)
    ax_entropy.set_ylabel("normalised entropy H(p) / log n")
    ax_support.set_ylabel("support size |{j: p_j > 0}|")
    ax_support.set_yscale("log")
    for ax in (ax_entropy, ax_support):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("test length")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("attention dispersion at the answer positions (mean over layers, heads, answer queries)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def compare_runs(run_dirs, output_dir: Path | str) -> str:
    """Load and check every run's eval.json, then write the table and plots under `output_dir`; returns
    the table."""
    results = [load_evaluation(d) for d in run_dirs]
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table = comparison_table(results)
    _plot_accuracy(results, output_dir / "accuracy.png")
    files = ["accuracy.png"] + (["dispersion.png"] if _plot_dispersion(results, output_dir / "dispersion.png")
                                else [])
    (output_dir / "compare.md").write_text(table + "\nPlots: " + ", ".join(files) + "\n")
    write_json(output_dir / "compare.json", {"runs": [str(d) for d in run_dirs], "results": results})
    return table
