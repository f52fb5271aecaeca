"""One command per table of arXiv:2506.16640, section 4 (synthetic length generalisation) on one GPU.

For a task (mqmtar, reverse, sort, copy) it trains one model per method (softmax, ssmax, entmax,
asentmax by default; the task's preset, NAPE positions) side by side on one device, evaluates each at
the task's length multipliers, and writes the `asentmax compare` table (ours beside the paper's) with
the accuracy and dispersion plots, plus the commands, seeds, samples seen and wall time of every run:

    <out>/<task>.md            the table and the provenance of every number in it
    <out>/<task>/compare.md, accuracy.png, dispersion.png, training.png, compare.json, runs.json

The processes run through benchmarks/device_plan.py (`run_together`: its `run_step`, of which a plan's runs
are made, for every method at once): first every method's training, then every method's evaluation, each
logged to <work>/<task>/<method>.train.log or .eval.log (appended to, after its command line, on every call).
It is not a plan of its own, since its runs count as finished at their planned steps rather than at exit 0,
and none is evaluated before all are (the table compares finished runs): that is what `--resume` chains.
`--train-seconds` sends every training run SIGINT at that wall time (the run saves a checkpoint at the step
it reached). A run stopped before its planned steps is not evaluated (its cosine has not decayed): the
command says so and exits 0, and the same command with `--resume` continues every run from its checkpoint
in --work (another `--train-seconds` window), until all have finished; then they are evaluated and the
table written, with every call's training seconds and steps in runs.json. So a run longer than one call of
a time-limited machine is a chain of identical calls. `--eval-unfinished` evaluates stopped runs anyway
(their samples seen are then reported as reached, not as planned). `--checkpoint best` tests each run's
best.pt instead of its last step (train with `--keep-best-at M` in --train-flags: the weights of the best
validation exact match at M x the training length, as the paper's code picks the checkpoint it tests).
--train-flags go to every method's `asentmax train`: its parser reads them before any run starts, and a flag
that one of the methods does not read (--alpha for softmax, --topk-k for all but topk) is refused up front, in
one line (run that method separately).

    PYTHONPATH=src python benchmarks/reproduce_paper.py --task mqmtar --out results/paper
    PYTHONPATH=src python benchmarks/reproduce_paper.py --task mqmtar --methods asentmax --train-seconds 540 \
        --train-flags "--steps 390625 --warmup-steps 20000"   # the paper's 50M samples at batch 128; then:
    PYTHONPATH=src python benchmarks/reproduce_paper.py --task mqmtar --methods asentmax --train-seconds 540 \
        --resume
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from device_plan import run_together

from asentmax.cli import UsageError, build_parser, check_normaliser_flags
from asentmax.nn.normalisers import NAMES
from asentmax.report import PAPER_RESULTS, samples_seen
from asentmax.runs import evaluation_name
from asentmax.tasks.registry import eval_multipliers, fresh_tables_refusal

METHODS = ("softmax", "ssmax", "entmax", "asentmax")


def progress(run_dir: Path) -> tuple[int, int]:
    """(step of the run's checkpoint, planned steps) of a run directory the trainer wrote."""
    from asentmax.runs import load_checkpoint

    planned = json.loads((run_dir / "config.json").read_text())["train_config"]["steps"]
    return load_checkpoint(run_dir / "checkpoint.pt")["step"], planned


def recorded_calls(work: Path, method: str, seconds: float, steps: tuple[int, int], resume: bool) -> list:
    """The training calls of `method`'s run so far (earlier ones from <work>/<method>.calls.json when
    resuming), this one appended: [{"train_s", "from_step", "to_step"}]; written back."""
    path = work / f"{method}.calls.json"
    calls = json.loads(path.read_text()) if resume and path.is_file() else []
    calls.append({"train_s": seconds, "from_step": steps[0], "to_step": steps[1]})
    path.write_text(json.dumps(calls) + "\n")
    return calls


def check_train_flags(train_flags: list[str], methods: list[str]) -> None:
    """UsageError unless `asentmax train` takes `train_flags` for every method: flags it parses, and none that
    one of the methods does not read (--alpha with softmax: asentmax.cli.check_normaliser_flags), and no
    --help (which would print the training help and end the command with code 0, running nothing)."""
    if any(flag in ("-h", "--help") for flag in train_flags):
        raise UsageError("--help is not a training flag; `asentmax train --help` lists them")
    given = vars(build_parser().parse_args(["train", "--run-dir", "unused", *train_flags]))
    for method in methods:
        check_normaliser_flags(method, given)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(PAPER_RESULTS), required=True)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=NAMES)
    parser.add_argument("--out", type=Path, default=Path("results/paper"))
    parser.add_argument("--work", type=Path, default=Path("runs/paper"), help="run directories")
    parser.add_argument("--train-seconds", type=float, help="stop training at this wall time")
    parser.add_argument("--samples", type=int, default=1000, help="test samples per length (paper: 1000)")
    parser.add_argument("--multipliers", help="lengths to test (default: the paper's for the task)")
    parser.add_argument("--train-flags", default="", help="extra `asentmax train` flags for every method")
    parser.add_argument("--eval-flags", default="", help="extra `asentmax eval` flags for every method "
                        "(e.g. --max-batch-tokens 262144 on a large GPU)")
    parser.add_argument("--resume", action="store_true",
                        help="continue every method's run in --work from its checkpoint (no --train-flags)")
    parser.add_argument("--eval-unfinished", action="store_true",
                        help="evaluate runs that --train-seconds stopped before their planned steps")
    parser.add_argument("--checkpoint", choices=("last", "best"), default="last",
                        help="which weights to test: the last step, or best.pt (train with --keep-best-at, "
                        "as the paper's code selects its checkpoint)")
    parser.add_argument("--tables", choices=("train", "fresh"), default="train",
                        help="MQMTAR's test words: the run's tables, or new ones for every length as the "
                        "paper's code draws its test sets")
    args = parser.parse_args()
    refusal = fresh_tables_refusal(args.task) if args.tables == "fresh" else None
    if refusal is not None:
        parser.error(refusal)
    train_flags = shlex.split(args.train_flags)
    try:
        check_train_flags(train_flags, args.methods)
    except UsageError as error:
        parser.error(f"--train-flags: {error}")
    work = args.work / args.task
    runs = {m: work / m for m in args.methods}
    if args.resume:
        if args.train_flags:
            parser.error("--resume continues each run with its saved settings: drop --train-flags")
        missing = [str(d) for d in runs.values() if not (d / "checkpoint.pt").is_file()]
        if missing:
            parser.error(f"--resume: no checkpoint in {', '.join(missing)} (start the runs without --resume)")
    work.mkdir(parents=True, exist_ok=True)
    out = args.out / args.task
    out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        train = {m: ["train", "--run-dir", str(d), "--resume", "--no-progress"] for m, d in runs.items()}
        before = {m: progress(d)[0] for m, d in runs.items()}
    else:
        train = {m: ["train", "--preset", args.task, "--attention", m, "--run-dir", str(d), "--overwrite",
                     "--no-progress", *train_flags] for m, d in runs.items()}
        before = dict.fromkeys(runs, 0)
    deadline = None if args.train_seconds is None else time.time() + args.train_seconds
    train_s = run_together(train, work, "train", deadline)
    reached = {m: progress(d) for m, d in runs.items()}
    calls = {m: recorded_calls(work, m, train_s[m], (before[m], reached[m][0]), args.resume) for m in runs}
    unfinished = {m: r for m, r in reached.items() if r[0] < r[1]}
    if unfinished and not args.eval_unfinished:
        print("not evaluated, still training: " + ", ".join(f"{m} at step {r[0]:,} of {r[1]:,}"
                                                            for m, r in unfinished.items())
              + "; run the same command with --resume (and no --train-flags) to continue, or add "
              "--eval-unfinished to evaluate them as they are")
        return 0
    multipliers = (args.multipliers.split() if args.multipliers
                   else [f"{m:g}" for m in eval_multipliers(args.task)])
    evals = {m: ["eval", str(d), "--no-progress", "--multipliers", *multipliers, "--samples",
                 str(args.samples), "--checkpoint", args.checkpoint, "--tables", args.tables,
                 *shlex.split(args.eval_flags)]
             for m, d in runs.items()}
    eval_s = run_together(evals, work, "eval", None)
    result_name = evaluation_name(args.checkpoint, args.tables) + ".json"
    compare = subprocess.run([sys.executable, "-m", "asentmax", "compare",
                              *(str(d / result_name) for d in runs.values()),
                              "--output-dir", str(out)], capture_output=True, text=True, check=True)
    provenance = {}
    for method, run_dir in runs.items():
        config = json.loads((run_dir / "config.json").read_text())
        result = json.loads((run_dir / result_name).read_text())
        train_config = config["train_config"]
        step = result.get("train_step")
        provenance[method] = {
            "train_command": "asentmax " + " ".join(train[method]), "eval_command": "asentmax " +
            " ".join(evals[method]), "seed": train_config.get("seed"), "steps_reached": step,
            "steps_planned": train_config.get("steps"), "batch_size": train_config.get("batch_size"),
            "samples_seen": samples_seen(result),
            "train_wall_s": round(sum(c["train_s"] for c in calls[method]), 1), "train_calls": calls[method],
            "eval_wall_s": eval_s[method],
            "device": config.get("device"), "git_commit": config.get("git_commit")}
    (out / "runs.json").write_text(json.dumps(provenance, indent=2) + "\n")
    command = "PYTHONPATH=src python benchmarks/reproduce_paper.py " + shlex.join(sys.argv[1:])
    lines = [f"# {args.task}: our runs beside arXiv:2506.16640's table", "", f"Command: `{command}`", "",
             f"All methods trained side by side on one device ({provenance[args.methods[0]]['device']}), "
             f"then evaluated with {args.samples} test samples per length. Exact match %:", "",
             compare.stdout.strip(), "", "| method | seed | steps (planned) | samples seen | train wall s | "
             "training calls | eval wall s |", "|---|---|---|---|---|---|---|"]
    for method, p in provenance.items():
        lines.append(f"| {method} | {p['seed']} | {p['steps_reached']} ({p['steps_planned']}) | "
                     f"{p['samples_seen']:,} | {p['train_wall_s']} | {len(p['train_calls'])} | "
                     f"{p['eval_wall_s']} |")
    lines += ["", f"Plots: [{args.task}/accuracy.png]({args.task}/accuracy.png), "
              f"[{args.task}/dispersion.png]({args.task}/dispersion.png), "
              f"[{args.task}/training.png]({args.task}/training.png); exact commands in "
              f"{args.task}/runs.json.", ""]
    (args.out / f"{args.task}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
