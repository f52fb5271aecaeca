"""Record device_plan runs as evidence under results/paper/<task>/: their files, logs and a runs.json entry.

A device call's plan runs come back as a tarball of `--work` without weights (benchmarks/device_calls.sh).
For each PLAN_RUN=NAME this copies <work>/PLAN_RUN's config.json, log.csv, val.csv, stalled.json and
evaluations (eval.json, eval_best, eval_fresh, eval_best_fresh and any other eval_*.json an evaluation's
--output named, each with its .md) to <out>/NAME/, with <work>/PLAN_RUN.train.log and .eval.log as train.log
and eval.log, and the lines of the --logs (device_plan.py's printed states) that name the run as
device_plan.log. A run that a stall check stopped keeps an evaluation of its last checkpoint (and its log) as
eval_at_stall.json/.md/.log, so that `asentmax compare` still counts it as stopped. Then it appends NAME to
<out>/runs.json, in the format of its existing entries: the train and eval commands (the logs' `$ ` lines),
seed, planned and reached steps, batch size, samples seen (runs.samples_trained), device, --git, the training
and evaluation seconds of the --logs, and --call.

    python benchmarks/record_runs.py --work /tmp/plan/runs/plan --out results/paper/reverse \\
        --logs /tmp/call1/device_plan.log --git "11eb149" --call "thirty-seventh session, first call, ..." \\
        reverse_asentmax_b128_paper_blocks_zero_init_seed3_screen=asentmax_b128_paper_blocks_zero_init_seed3

It refuses, in one line with exit code 2 and before writing anything, a run that is missing, a NAME already in
<out> or runs.json, a pair that is not PLAN_RUN=NAME and a log that is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from asentmax.runs import (
    CONFIG_NAME,
    EVAL_NAME,
    LOG_NAME,
    STALLED_NAME,
    VAL_NAME,
    evaluation_name,
    read_json,
    samples_trained,
)

# a run's files besides its weights and evaluations
RECORDED_FILES = (CONFIG_NAME, LOG_NAME, VAL_NAME, STALLED_NAME)
EVALUATIONS = tuple(evaluation_name(c, t) for c in ("last", "best") for t in ("train", "fresh"))
AT_STALL_NAME = "eval_at_stall"  # a stopped run's EVAL_NAME: `asentmax compare` counts it as stopped


def command_lines(log: Path) -> list[str]:
    """The commands a step log holds (device_plan writes each as `$ asentmax ...` before its output)."""
    if not log.is_file():
        return []
    return [line[2:] for line in log.read_text().splitlines() if line.startswith("$ ")]


def plan_lines(log_lines: list[str], plan_run: str) -> list[str]:
    """The lines of device_plan's printed states that are about `plan_run`."""
    return [line for line in log_lines if line.startswith(f"{plan_run}:")]


def seconds(lines: list[str], step: str) -> float:
    """Seconds of every `<step> exit C in S s` of `lines` (step "train", or r"eval\\d+" for evaluations)."""
    pattern = rf"\b{step} exit -?\d+ in ([\d.]+) s"
    return round(sum(float(s) for line in lines for s in re.findall(pattern, line)), 1)


def reached_step(train_log: Path, stalled: dict | None) -> int | None:
    """The last validated or finished step of a training log (`step N:` lines, `at step N after`)."""
    if stalled is not None:
        return stalled["step"]
    text = train_log.read_text() if train_log.is_file() else ""
    steps = [int(s) for s in re.findall(r"^(?:step |at step )(\d+)\b", text, re.M)]
    return steps[-1] if steps else None


def entry(work: Path, plan_run: str, lines: list[str], git: str, call: str) -> dict:
    """runs.json's record of one plan run (`lines`: device_plan's lines about it)."""
    src = work / plan_run
    config = read_json(src / CONFIG_NAME, "run config")
    train_config = config.get("train_config") or {}
    stalled = read_json(src / STALLED_NAME, "stall record") if (src / STALLED_NAME).is_file() else None
    step = reached_step(work / f"{plan_run}.train.log", stalled)
    trains = command_lines(work / f"{plan_run}.train.log")
    evals = command_lines(work / f"{plan_run}.eval.log")
    return {"train_command": trains[0] if trains else "not in the logs",
            "eval_command": "; ".join(evals) if evals else "not evaluated in the plan",
            "seed": train_config.get("seed"), "steps_planned": train_config.get("steps"),
            "steps_reached": step,
            "batch_size": train_config.get("batch_size"),
            "samples_seen": samples_trained(step, train_config, config.get("prior_samples") or 0),
            "device": config.get("device"), "git_commit": git, "train_wall_s": seconds(lines, "train"),
            "eval_wall_s": seconds(lines, r"eval\d+"), "call": call}


def copy_run(work: Path, plan_run: str, dst: Path, lines: list[str]) -> None:
    """The run's files, logs and device_plan lines (`lines`) into `dst`."""
    src = work / plan_run
    dst.mkdir(parents=True)
    stalled = (src / STALLED_NAME).is_file()
    for name in RECORDED_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    others = sorted({path.stem for path in src.glob("eval_*.json")} - set(EVALUATIONS))  # e.g. --output
    for name in (*EVALUATIONS, *others):
        target = AT_STALL_NAME if stalled and name == EVAL_NAME else name
        for suffix in (".json", ".md"):
            if (src / f"{name}{suffix}").is_file():
                shutil.copy(src / f"{name}{suffix}", dst / f"{target}{suffix}")
    for step, target in (("train", "train"), ("eval", AT_STALL_NAME if stalled else EVAL_NAME)):
        if (work / f"{plan_run}.{step}.log").is_file():
            shutil.copy(work / f"{plan_run}.{step}.log", dst / f"{target}.log")
    (dst / "device_plan.log").write_text("".join(f"{line}\n" for line in lines))


def json_layout(text: str, recorded: dict) -> tuple[int, bool]:
    """(indent, whether each entry's keys are sorted) of an existing runs.json (its text and its parsed
    entries), so that new entries keep its format ((1, True) for a new one)."""
    match = re.match(r"\{\n( +)\"", text)
    if not match:
        return 1, True
    inner = [list(value) for value in recorded.values() if isinstance(value, dict)]
    return len(match.group(1)), all(keys == sorted(keys) for keys in inner)


def parse_pairs(pairs: list[str], work: Path, out: Path, recorded: dict) -> list[tuple[str, str]]:
    """[(plan run, result name)]; ValueError (one line) for a bad pair, a missing run or a taken name."""
    parsed = []
    for pair in pairs:
        plan_run, sep, name = pair.partition("=")
        if not (sep and plan_run and name) or "/" in name:
            raise ValueError(f"{pair!r} is not PLAN_RUN=NAME")
        if not (work / plan_run / CONFIG_NAME).is_file():
            raise ValueError(f"{work / plan_run} holds no {CONFIG_NAME}: not a run of the plan")
        if (out / name).exists() or name in recorded or name in (n for _, n in parsed):
            raise ValueError(f"{name} is already recorded in {out}")
        parsed.append((plan_run, name))
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", metavar="PLAN_RUN=NAME")
    parser.add_argument("--work", type=Path, required=True, help="the plan's --work as it came back")
    parser.add_argument("--out", type=Path, required=True, help="results/paper/<task>")
    parser.add_argument("--logs", type=Path, nargs="+", required=True, help="device_plan's printed states")
    parser.add_argument("--git", required=True, help="the commit the device ran")
    parser.add_argument("--call", required=True, help="which call of which session, with its command")
    args = parser.parse_args(argv)
    runs_json = args.out / "runs.json"
    try:
        text = runs_json.read_text() if runs_json.is_file() else "{}"
        recorded = json.loads(text)
        missing = [log for log in args.logs if not log.is_file()]
        if missing:
            raise ValueError(f"{missing[0]} does not exist")
        pairs = parse_pairs(args.pairs, args.work, args.out, recorded)
        log_lines = [line for log in args.logs for line in log.read_text().splitlines()]
    except (ValueError, OSError) as error:  # json.JSONDecodeError is a ValueError
        print(f"record_runs: error: {error}", file=sys.stderr)
        return 2
    indent, sort_keys = json_layout(text, recorded)
    for plan_run, name in pairs:
        lines = plan_lines(log_lines, plan_run)
        copy_run(args.work, plan_run, args.out / name, lines)
        record = entry(args.work, plan_run, lines, args.git, args.call)
        recorded[name] = dict(sorted(record.items())) if sort_keys else record  # appended: the order kept
        print(f"{plan_run} -> {args.out / name}: {record['steps_reached']} steps")
    runs_json.write_text(json.dumps(recorded, indent=indent) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
