"""After a dense start (`asentmax train --init-from`: softmax's weights, then ASEntmax), what a run's first
steps show against how far it generalises.

For each run directory started from weights (config.json's init_from): the start's steps and attention, the
parameters it drew afresh (--init-fresh), the loss jump at the swap (the highest training loss logged over
steps [--jump-from, --jump-to] of log.csv: how much the new normaliser disturbed the start), the exact match
of its validation (val.csv) at --val-at x its training length (the workload's max_length) at step --val-step
(what `asentmax train --stall-val-at M --stall-val-step S` reads), the step it ended at (and whether a stall
check stopped it: stalled.json), and the exact match of its eval.json at the --lengths multipliers of the
training length (arXiv:2506.16640, section 3: MQMTAR's ID length is 64 tokens). A run without eval.json gets
'-' there. Writes swap.md and swap.png (jump and early validation against the exact match, each run
labelled with its # in swap.md at the longest length) under --out.

    PYTHONPATH=src python benchmarks/swap_vs_length.py RUN_DIR ... --out results/paper/mqmtar
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from run_scatter import scatter_panels

from asentmax.runs import (
    CONFIG_NAME,
    EVAL_NAME,
    STALLED_NAME,
    RunError,
    load_evaluation,
    read_json,
    training_loss,
    validation_exact_match,
)


def run_summary(run_dir: Path, jump_steps: tuple[int, int], val_at: int, val_step: int,
                multipliers: list[int]) -> dict:
    """{name, start_steps, start_attention, fresh (count of fresh parameters), jump (None: no logged step in
    the window), early_val (% or None: no validation there), last_step, stopped, exact: {multiplier: % or
    None}} of one run directory; RunError (one line) for a run not started from weights or without log.csv."""
    config = read_json(run_dir / CONFIG_NAME, "run config")
    start = config.get("init_from")
    if not start:
        raise RunError(f"{run_dir}: not started from another run's weights (its {CONFIG_NAME} has no "
                       "init_from); this table is for runs of `asentmax train --init-from`")
    curve = training_loss(run_dir)
    if not curve:
        raise RunError(f"{run_dir}: no log.csv with training rows")
    window = [loss for step, loss in curve if jump_steps[0] <= step <= jump_steps[1]]
    early = validation_exact_match(run_dir).get((val_step, val_at * config["workload"]["max_length"]))
    exact = dict.fromkeys(multipliers)
    if (run_dir / f"{EVAL_NAME}.json").is_file():
        evaluation = load_evaluation(run_dir)
        by_length = {row["length"]: row for row in evaluation["rows"]}
        for m in multipliers:
            row = by_length.get(m * evaluation["id_length"])
            exact[m] = None if row is None else 100.0 * row["exact_match"]
    return {"name": run_dir.name, "start_steps": start["step"],
            "start_attention": start.get("attention", "-"),
            "fresh": len(start.get("fresh", ())), "jump": max(window) if window else None,
            "early_val": None if early is None else 100.0 * early, "last_step": curve[-1][0],
            "stopped": (run_dir / STALLED_NAME).is_file(), "exact": exact}


def table(summaries: list[dict], multipliers: list[int], jump_steps: tuple[int, int], val_at: int,
          val_step: int, command: str) -> str:
    head = (f"| # | run | start: steps, attention | fresh parameters | highest loss, steps {jump_steps[0]:,}-"
            f"{jump_steps[1]:,} | {val_at}x validation at step {val_step:,} | ended at step | "
            + " | ".join(f"{m}x" for m in multipliers) + " |")
    lines = [f"Command: `{command}`", "", "#: the run's label in swap.png. Exact match %.", "", head,
             "|" + "---|" * (7 + len(multipliers))]
    for number, s in enumerate(summaries, 1):
        jump = "-" if s["jump"] is None else f"{s['jump']:.3f}"
        early = "-" if s["early_val"] is None else f"{s['early_val']:.0f}"
        ended = f"{s['last_step']:,}" + (" (stopped)" if s["stopped"] else "")
        cells = ["-" if s["exact"][m] is None else f"{s['exact'][m]:.0f}" for m in multipliers]
        lines.append(f"| {number} | {s['name']} | {s['start_steps']:,}, {s['start_attention']} | "
                     f"{s['fresh'] or '-'} | {jump} | {early} | {ended} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(summaries: list[dict], multipliers: list[int], jump_steps: tuple[int, int], val_at: int,
         val_step: int, path: Path) -> None:
    scatter_panels(summaries, multipliers, [
        ("jump", f"highest training loss over steps {jump_steps[0]:,}-{jump_steps[1]:,} after the swap",
         "the swap's disturbance", True),
        ("early_val", f"exact match % at {val_at}x in validation at step {val_step:,}",
         "the early validation", False)], path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories started with --init-from")
    parser.add_argument("--out", type=Path, required=True, help="swap.md and swap.png go here")
    parser.add_argument("--jump-from", type=int, default=200, help="first step of the jump's window")
    parser.add_argument("--jump-to", type=int, default=3000, help="last step of the jump's window")
    parser.add_argument("--val-at", type=int, default=16, help="validation length, x the training length")
    parser.add_argument("--val-step", type=int, default=12800, help="the validation step to read")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 256, 1024],
                        help="test lengths as multipliers of the training length")
    args = parser.parse_args()
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        parser.error(f"not a run directory: {', '.join(missing)}")
    if not 0 <= args.jump_from <= args.jump_to:
        parser.error("--jump-from must be >= 0 and at most --jump-to")
    if args.val_at < 1 or args.val_step < 1 or min(args.lengths) < 1:
        parser.error("--val-at, --val-step and --lengths must be >= 1")
    jump_steps = (args.jump_from, args.jump_to)
    try:
        summaries = [run_summary(r, jump_steps, args.val_at, args.val_step, args.lengths) for r in args.runs]
    except RunError as error:
        parser.exit(2, f"swap_vs_length.py: error: {error}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=src python benchmarks/swap_vs_length.py " + shlex.join(sys.argv[1:])
    (args.out / "swap.md").write_text(table(summaries, args.lengths, jump_steps, args.val_at, args.val_step,
                                            command))
    plot(summaries, args.lengths, jump_steps, args.val_at, args.val_step, args.out / "swap.png")
    print((args.out / "swap.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
