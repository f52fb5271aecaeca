"""When a run leaves the MQMTAR loss plateau and where it settles, against how far it generalises.

For each run directory: the first logged step whose training loss is below --escape-loss (plateau_study's
steps_to_escape over log.csv; the plateau sits near 0.6 nats per target token), the mean training loss of the
logged steps in [--settle-step, --settle-step + --settle-window) (where a run that escaped settles: the runs
stuck on the second plateau at 92-98 % ID are far above the others there, results/paper/mqmtar.md), the step
of the last log line, and the exact match of its eval.json at the --lengths multipliers of the training
length (arXiv:2506.16640, section 3: ID = 64 tokens). A run without eval.json (cut, or still on the plateau)
gets a row without accuracies. Below the table, the escape step and the settled loss each against the exact
match at the longest length in one number: Spearman's rho over the runs with both, with a permutation p
(run_scatter.rank_table; a run that never escaped has no escape step there). Writes escape.md and escape.png
(escape step and settled loss against the exact match, each run labelled with its # in escape.md) under
--out.

    PYTHONPATH=src python benchmarks/escape_vs_length.py RUN_DIR ... --out results/paper/mqmtar
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from plateau_study import read_curve, steps_to_escape
from run_scatter import exact_at, rank_table, scatter_panels


def settled_loss(curve, start: int, window: int) -> float | None:
    """Mean training loss of the logged steps in [start, start + window) (None: the run logged none there)."""
    losses = [loss for step, loss, _ in curve if start <= step < start + window]
    return sum(losses) / len(losses) if losses else None


def run_summary(run_dir: Path, escape_loss: float, multipliers: list[int], settle_step: int = 19200,
                settle_window: int = 1600) -> dict:
    """{name, escape_step (None: never), settled_loss (settled_loss's; None: not reached), last_step,
    exact: {multiplier: % or None}} of one run directory."""
    curve = read_curve(run_dir)
    if not curve:
        raise SystemExit(f"{run_dir}: no log.csv with training rows")
    return {"name": run_dir.name, "escape_step": steps_to_escape(curve, escape_loss),
            "settled_loss": settled_loss(curve, settle_step, settle_window), "last_step": curve[-1][0],
            "exact": exact_at(run_dir, multipliers)}


def table(summaries: list[dict], multipliers: list[int], escape_loss: float, settle: tuple[int, int],
          command: str) -> str:
    settle_label = f"mean loss, steps {settle[0]:,}-{settle[0] + settle[1] - 1:,}"
    head = f"| # | run | escape step (loss < {escape_loss:g}) | {settle_label} | last step | " + " | ".join(
        f"{m}x" for m in multipliers) + " |"
    lines = [f"Command: `{command}`", "", "#: the run's label in escape.png.", "", head,
             "|" + "---|" * (5 + len(multipliers))]
    for number, s in enumerate(summaries, 1):
        escape = "never" if s["escape_step"] is None else f"{s['escape_step']:,}"
        settled = "-" if s["settled_loss"] is None else f"{s['settled_loss']:.4f}"
        cells = ["-" if s["exact"][m] is None else f"{s['exact'][m]:.0f}" for m in multipliers]
        lines.append(f"| {number} | {s['name']} | {escape} | {settled} | {s['last_step']:,} | "
                     + " | ".join(cells) + " |")
    columns = [(f"escape step (loss < {escape_loss:g})", [s["escape_step"] for s in summaries]),
               (settle_label, [s["settled_loss"] for s in summaries])]
    longest = multipliers[-1]
    lines += ["", *rank_table(columns, [s["exact"][longest] for s in summaries], longest)]
    return "\n".join(lines) + "\n"


def plot(summaries: list[dict], multipliers: list[int], escape_loss: float, settle: tuple[int, int],
         path: Path) -> None:
    scatter_panels(summaries, multipliers, [
        ("escape_step", f"step at which the training loss first fell below {escape_loss:g} (off the plateau)",
         "leaving the loss plateau later, generalising less far", False),
        ("settled_loss", f"mean training loss over steps {settle[0]:,}-{settle[0] + settle[1] - 1:,}",
         "settling higher (the second plateau), generalising less far", True)], path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (log.csv, optional eval.json)")
    parser.add_argument("--out", type=Path, required=True, help="escape.md and escape.png go here")
    parser.add_argument("--escape-loss", type=float, default=0.3, help="loss below which a run has escaped")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024],
                        help="test lengths as multipliers of the training length")
    parser.add_argument("--settle-step", type=int, default=19200,
                        help="first step of the window whose mean training loss is the settled loss")
    parser.add_argument("--settle-window", type=int, default=1600, help="steps in that window")
    args = parser.parse_args()
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        raise SystemExit(f"not a run directory: {', '.join(missing)}")
    if args.settle_step < 0 or args.settle_window < 1:
        parser.error("--settle-step must be >= 0 and --settle-window >= 1")
    settle = (args.settle_step, args.settle_window)
    summaries = [run_summary(r, args.escape_loss, args.lengths, *settle) for r in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=src python benchmarks/escape_vs_length.py " + shlex.join(sys.argv[1:])
    (args.out / "escape.md").write_text(table(summaries, args.lengths, args.escape_loss, settle, command))
    plot(summaries, args.lengths, args.escape_loss, settle, args.out / "escape.png")
    print((args.out / "escape.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
