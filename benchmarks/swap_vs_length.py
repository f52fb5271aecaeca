"""After a dense start (`asentmax train --init-from`: softmax's weights, then ASEntmax), what a run's first
steps show against how far it generalises.

For each run directory started from weights (config.json's init_from): the start's steps and attention, the
parameters it drew afresh (--init-fresh), the loss jump at the swap (the highest training loss logged over
steps [--jump-from, --jump-to] of log.csv: how much the new normaliser disturbed the start), the exact match
of its validation (val.csv) at each --val-reads M:S, M x its training length (the workload's max_length) at
step S (the default reads 16x at step 12,800, where `asentmax train --stall-val-at 16 --stall-val-step 12800`
looks, and 256x at step 32,000, when the long-length climb of the dense-start recipe's runs is under way), the
step it ended at (and whether a stall check stopped it: stalled.json), and the exact match of its eval.json at
the --lengths multipliers of the training length (arXiv:2506.16640, section 3: MQMTAR's ID length is 64
tokens). A run without eval.json gets '-' there. Below the table, each of those early quantities against the
exact match at the longest length in one number: Spearman's rho over the runs that have both, with a
permutation p (run_scatter.rank_table). Writes swap.md and swap.png (one panel per quantity against the
exact match, each run labelled with its # in swap.md at the longest length) under --out.

    PYTHONPATH=src python benchmarks/swap_vs_length.py RUN_DIR ... --out results/paper/mqmtar
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from run_scatter import exact_at, rank_table, scatter_panels

from asentmax.runs import (
    CONFIG_NAME,
    STALLED_NAME,
    RunError,
    read_json,
    training_loss,
    validation_exact_match,
)


def val_read(text: str) -> tuple[int, int]:
    """'M:S' -> (M, S): the validation at M x the training length at step S; both >= 1."""
    try:
        multiplier, step = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M:S (a multiplier and a step), got {text!r}") from None
    if multiplier < 1 or step < 1:
        raise argparse.ArgumentTypeError(f"M and S must be >= 1, got {text!r}")
    return multiplier, step


def run_summary(run_dir: Path, jump_steps: tuple[int, int], val_reads: list[tuple[int, int]],
                multipliers: list[int]) -> dict:
    """{name, start_steps, start_attention, fresh (count of fresh parameters), jump (None: no logged step in
    the window), val: {(M, S): % or None (no validation there)}, last_step, stopped, exact: {multiplier: % or
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
    validation = validation_exact_match(run_dir)
    max_length = config["workload"]["max_length"]
    val = {}
    for multiplier, step in val_reads:
        exact_match = validation.get((step, multiplier * max_length))
        val[multiplier, step] = None if exact_match is None else 100.0 * exact_match
    return {"name": run_dir.name, "start_steps": start["step"],
            "start_attention": start.get("attention", "-"),
            "fresh": len(start.get("fresh", ())), "jump": max(window) if window else None,
            "val": val, "last_step": curve[-1][0],
            "stopped": (run_dir / STALLED_NAME).is_file(), "exact": exact_at(run_dir, multipliers)}


def val_label(read: tuple[int, int]) -> str:
    return f"{read[0]}x validation at step {read[1]:,}"


def table(summaries: list[dict], multipliers: list[int], jump_steps: tuple[int, int],
          val_reads: list[tuple[int, int]], command: str) -> str:
    jump_label = f"highest loss, steps {jump_steps[0]:,}-{jump_steps[1]:,}"
    head = (f"| # | run | start: steps, attention | fresh parameters | {jump_label} | "
            + "".join(f"{val_label(read)} | " for read in val_reads) + "ended at step | "
            + " | ".join(f"{m}x" for m in multipliers) + " |")
    lines = [f"Command: `{command}`", "", "#: the run's label in swap.png. Exact match %.", "", head,
             "|" + "---|" * (6 + len(val_reads) + len(multipliers))]
    for number, s in enumerate(summaries, 1):
        jump = "-" if s["jump"] is None else f"{s['jump']:.3f}"
        reads = "".join("- | " if s["val"][r] is None else f"{s['val'][r]:.0f} | " for r in val_reads)
        ended = f"{s['last_step']:,}" + (" (stopped)" if s["stopped"] else "")
        cells = ["-" if s["exact"][m] is None else f"{s['exact'][m]:.0f}" for m in multipliers]
        lines.append(f"| {number} | {s['name']} | {s['start_steps']:,}, {s['start_attention']} | "
                     f"{s['fresh'] or '-'} | {jump} | {reads}{ended} | " + " | ".join(cells) + " |")
    columns = [(jump_label, [s["jump"] for s in summaries])] + [
        (val_label(read), [s["val"][read] for s in summaries]) for read in val_reads]
    longest = multipliers[-1]
    lines += ["", *rank_table(columns, [s["exact"][longest] for s in summaries], longest)]
    return "\n".join(lines) + "\n"


def plot(summaries: list[dict], multipliers: list[int], jump_steps: tuple[int, int],
         val_reads: list[tuple[int, int]], path: Path) -> None:
    flat = [{"exact": s["exact"], "jump": s["jump"], **{val_label(r): s["val"][r] for r in val_reads}}
            for s in summaries]
    scatter_panels(flat, multipliers, [
        ("jump", f"highest training loss over steps {jump_steps[0]:,}-{jump_steps[1]:,} after the swap",
         "the swap's disturbance", True)] + [
        (val_label(read), f"exact match % at {read[0]}x in validation at step {read[1]:,}",
         f"validation at step {read[1]:,}", False) for read in val_reads], path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories started with --init-from")
    parser.add_argument("--out", type=Path, required=True, help="swap.md and swap.png go here")
    parser.add_argument("--jump-from", type=int, default=200, help="first step of the jump's window")
    parser.add_argument("--jump-to", type=int, default=3000, help="last step of the jump's window")
    parser.add_argument("--val-reads", type=val_read, nargs="+", default=[(16, 12800), (256, 32000)],
                        metavar="M:S", help="validations to read: M x the training length at step S")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 256, 1024],
                        help="test lengths as multipliers of the training length")
    args = parser.parse_args()
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        parser.error(f"not a run directory: {', '.join(missing)}")
    if not 0 <= args.jump_from <= args.jump_to:
        parser.error("--jump-from must be >= 0 and at most --jump-to")
    if min(args.lengths) < 1:
        parser.error("--lengths must be >= 1")
    jump_steps = (args.jump_from, args.jump_to)
    try:
        summaries = [run_summary(r, jump_steps, args.val_reads, args.lengths) for r in args.runs]
    except RunError as error:
        parser.exit(2, f"swap_vs_length.py: error: {error}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=src python benchmarks/swap_vs_length.py " + shlex.join(sys.argv[1:])
    (args.out / "swap.md").write_text(table(summaries, args.lengths, jump_steps, args.val_reads, command))
    plot(summaries, args.lengths, jump_steps, args.val_reads, args.out / "swap.png")
    print((args.out / "swap.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
