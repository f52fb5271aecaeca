"""When a run leaves the MQMTAR loss plateau against how far it generalises: a table and a scatter plot.

For each run directory: the first logged step whose training loss is below --escape-loss (plateau_study's
steps_to_escape over log.csv; the plateau sits near 0.6 nats per target token), the step of the last log
line, and the exact match of its eval.json at the --lengths multipliers of the training length
(arXiv:2506.16640, section 3: ID = 64 tokens). A run without eval.json (cut, or still on the plateau) gets
a row without accuracies. Writes escape.md and escape.png under --out.

    PYTHONPATH=src python benchmarks/escape_vs_length.py RUN_DIR ... --out results/paper/mqmtar
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from plateau_study import read_curve, steps_to_escape

from asentmax.runs import load_evaluation


def run_summary(run_dir: Path, escape_loss: float, multipliers: list[int]) -> dict:
    """{name, escape_step (None: never), last_step, exact: {multiplier: % or None}} of one run directory."""
    curve = read_curve(run_dir)
    if not curve:
        raise SystemExit(f"{run_dir}: no log.csv with training rows")
    exact = dict.fromkeys(multipliers)
    eval_path = run_dir / "eval.json"
    if eval_path.is_file():
        evaluation = load_evaluation(eval_path)
        by_length = {row["length"]: row for row in evaluation["rows"]}
        for m in multipliers:
            row = by_length.get(m * evaluation["id_length"])
            exact[m] = None if row is None else 100.0 * row["exact_match"]
    return {"name": run_dir.name, "escape_step": steps_to_escape(curve, escape_loss),
            "last_step": curve[-1][0], "exact": exact}


def table(summaries: list[dict], multipliers: list[int], escape_loss: float, command: str) -> str:
    head = "| run | escape step (loss < %g) | last step | " % escape_loss + " | ".join(
        f"{m}x" for m in multipliers) + " |"
    lines = [f"Command: `{command}`", "", head, "|" + "---|" * (3 + len(multipliers))]
    for s in summaries:
        escape = "never" if s["escape_step"] is None else f"{s['escape_step']:,}"
        cells = ["-" if s["exact"][m] is None else f"{s['exact'][m]:.0f}" for m in multipliers]
        lines.append(f"| {s['name']} | {escape} | {s['last_step']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(summaries: list[dict], multipliers: list[int], escape_loss: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, marker in zip(multipliers, "osD^v" * len(multipliers), strict=False):
        points = [(s["escape_step"], s["exact"][m]) for s in summaries
                  if s["escape_step"] is not None and s["exact"][m] is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, label=f"{m}x", s=40)
    for s in summaries:
        if s["escape_step"] is not None and s["exact"][multipliers[-1]] is not None:
            ax.annotate(s["name"], (s["escape_step"], s["exact"][multipliers[-1]]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel(f"step at which the training loss first fell below {escape_loss:g} (off the plateau)")
    ax.set_ylabel("exact match % (greedy decoding)")
    ax.set_title("leaving the loss plateau later, generalising less far")
    ax.set_ylim(-3, 103)
    ax.legend(title="test length")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (log.csv, optional eval.json)")
    parser.add_argument("--out", type=Path, required=True, help="escape.md and escape.png go here")
    parser.add_argument("--escape-loss", type=float, default=0.3, help="loss below which a run has escaped")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024],
                        help="test lengths as multipliers of the training length")
    args = parser.parse_args()
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        raise SystemExit(f"not a run directory: {', '.join(missing)}")
    summaries = [run_summary(r, args.escape_loss, args.lengths) for r in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=src python benchmarks/escape_vs_length.py " + shlex.join(sys.argv[1:])
    (args.out / "escape.md").write_text(table(summaries, args.lengths, args.escape_loss, command))
    plot(summaries, args.lengths, args.escape_loss, args.out / "escape.png")
    print((args.out / "escape.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
