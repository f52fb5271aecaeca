"""Does a run's early validation tell how far it will generalise? Its validation exact match at one length and
a few early steps (val.csv) beside its test exact match at the end (eval.json), a row per run, sorted by the
validation at the last step given; a run a stall check stopped has no test and shows what it logged. With
--loss-below, also the first step at which its training loss (log.csv) fell below each given value.

On Reverse with the paper code's blocks, every tested ASEntmax run with 6 % or more at 4x (256 tokens) on
validation at step 4,000 of 40,000 reached 85 % or more at 4x on test, and every one with 2 % or less ended at
75 % or less (results/paper/reverse.md, "Fortieth session" to "Forty-second session"): a screen there costs a
tenth of a run.

    PYTHONPATH=src python benchmarks/early_screen.py results/paper/reverse/*paper_blocks* \
        --length 256 --steps 2000 4000 6000 --eval-lengths 256 512 --loss-below 0.1 0.01
"""

from __future__ import annotations

import argparse
from pathlib import Path

from asentmax.runs import (
    EVAL_NAME,
    VAL_NAME,
    RunError,
    load_evaluation,
    training_loss,
    validation_exact_match,
)


def validation_at(run_dir: Path, length: int, steps: list[int]) -> list[float | None]:
    """Validation exact match % at `length` tokens at each of `steps` (None where val.csv has no such row)."""
    found = validation_exact_match(run_dir)
    return [None if (step, length) not in found else 100 * found[step, length] for step in steps]


def test_at(run_dir: Path, lengths: list[int]) -> list[float | None] | None:
    """eval.json's exact match % at each of `lengths` (None for a length it lacks); None without eval.json;
    RunError for one that is not an asentmax evaluation."""
    if not (run_dir / f"{EVAL_NAME}.json").is_file():
        return None
    rows = {row["length"]: 100 * row["exact_match"] for row in load_evaluation(run_dir)["rows"]}
    return [rows.get(length) for length in lengths]


def first_steps_below(run_dir: Path, thresholds: list[float]) -> list[int | None]:
    """The first logged step whose training loss (log.csv) is below each of `thresholds` (None: never)."""
    log = training_loss(run_dir)
    return [next((step for step, loss in log if loss < threshold), None) for threshold in thresholds]


def screen_table(run_dirs: list[Path], length: int, steps: list[int], eval_lengths: list[int],
                 loss_below: list[float] = ()) -> str:
    """The markdown table of the module docstring, with a column per `loss_below` threshold: the first step
    whose training loss fell below it."""
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    rows = []
    for run_dir in run_dirs:
        validation, test = validation_at(run_dir, length, steps), test_at(run_dir, eval_lengths)
        tested = " | ".join(cell(v) for v in test) if test else " | ".join(["not tested"] * len(eval_lengths))
        below = "".join(f"{'-' if s is None else s} | " for s in first_steps_below(run_dir, list(loss_below)))
        line = f"| {run_dir.name} | " + " | ".join(cell(v) for v in validation) + f" | {below}{tested} |"
        rows.append((validation[-1] if validation[-1] is not None else -1.0, line))
    header = ("| run | " + " | ".join(f"validation at {length} tokens, step {s}" for s in steps) + " | "
              + "".join(f"training loss first below {x:g} at step | " for x in loss_below)
              + " | ".join(f"test at {n} tokens" for n in eval_lengths) + " |")
    rule = "|---" * (1 + len(steps) + len(loss_below) + len(eval_lengths)) + "|"
    return "\n".join([header, rule, *(line for _, line in sorted(rows, key=lambda r: -r[0]))]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--length", type=int, required=True, help="validation length in tokens")
    parser.add_argument("--steps", type=int, nargs="+", required=True,
                        help="validation steps; the rows sort by the last")
    parser.add_argument("--eval-lengths", type=int, nargs="+", required=True, help="test lengths in tokens")
    parser.add_argument("--loss-below", type=float, nargs="+", default=[],
                        help="training losses: a column each, the first step (log.csv) below it")
    args = parser.parse_args()
    missing = [str(d) for d in args.run_dirs if not (d / VAL_NAME).is_file()]
    if missing:
        raise SystemExit(f"early_screen: no {VAL_NAME} in {', '.join(missing)}")
    try:
        table = screen_table(args.run_dirs, args.length, args.steps, args.eval_lengths, args.loss_below)
    except RunError as error:
        raise SystemExit(f"early_screen: {error}") from None
    print(table, end="")


if __name__ == "__main__":
    main()
