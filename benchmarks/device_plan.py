"""Train and evaluate a plan of named runs side by side within a time window, continued by the same command in
the next window: how this project spends a time-limited GPU (at most 10 minutes a call) on issue 15's runs.

    PYTHONPATH=src python benchmarks/device_plan.py PLAN.json --work runs/plan --seconds 560 [--runs A B]

PLAN.json names each run's `asentmax train` flags and its `asentmax eval` flag sets:

    {"runs": {"mqmtar_asentmax_seed0": {"train": "--preset mqmtar --attention asentmax --seed 0",
                                        "evals": ["--samples 100", "--samples 100 --tables fresh"]}}}

Every run of the plan (or of --runs) starts at once, each as a chain of processes: training (its flags the
first time, `--resume` once <work>/<name> holds a checkpoint), then its evaluations in order. `--margin`
seconds before the window closes, training still running gets SIGINT, on which `asentmax train` saves a
checkpoint at the step it reached (an evaluation gets it 5 s before the end and keeps its finished lengths;
both exit 130); the next call continues both. A training that a stall check (--stall-step, --stall-val-step)
stopped (exit 3) ends its chain as "stalled", unevaluated. A run with `"after": OTHER` starts only once OTHER
has trained (its chain waits; in a call without OTHER, OTHER must be trained already): with `{work}` in its
flags, which stands for --work, it can start from OTHER's weights (`--init-from {work}/OTHER`); in an
evaluation's flags `{work}` places a result beside the others (`--amp off --output {work}/NAME/eval_fp32`). A
step that fails (any other exit code) stops its own chain only; its log says why, and the printed line quotes
the log's last line that names an error. `--continuing` refuses (exit 2, nothing started) a call in which a
run would start again from step 0: on a machine that lost --work between calls it saves the window. An
evaluation starts only with at least --min-eval-seconds left. Markers in --work (<name>.trained,
<name>.stalled, <name>.eval<i>.done) record what finished; a call naming a run (or the run it is after) last
written there more than --stale-hours ago, an earlier session's on a machine that kept --work, is refused,
nothing started; <work>/status.json and the printed lines give every run's state and this call's seconds per
step; the exit code is 0 unless a step failed. `--eval-flags` appends flags to every evaluation of a call (a
setting that leaves results as they are, such as `--cuda-graphs on`, without editing the plan).

This module is the one place that runs `asentmax` processes side by side under a deadline: `run_step` (one
command, appended to its log, SIGINT at the deadline; its exit code and seconds), `side_by_side` (functions at
once, a thread each: here the chains) and `run_together` (commands at once, each of which must exit 0 or 130),
which benchmarks/reproduce_paper.py and benchmarks/plateau_study.py import.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from asentmax.runs import STALLED_EXIT  # `asentmax train --stall-step` or `--stall-val-step` stopped the run

COMPILE_CACHE = ".compile_cache"  # under --work: each run's own Inductor cache (run_step)
GRACE_S = 30.0  # after SIGINT, how long a step may take to save and exit before it is killed
# a session's calls come minutes apart; a device machine can keep --work (ignored files) from one session to
# the next, and a run found there from hours before would be resumed, or its old weights evaluated, as if new
STALE_HOURS = 4.0
T = TypeVar("T")


def read_plan(path: Path) -> dict[str, dict]:
    """{name: {"train": [flags], "evals": [[flags], ...]}} from PLAN.json; one-line SystemExit if bad."""
    try:
        plan = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"{path}: not a readable JSON plan ({error})") from None
    runs = plan.get("runs") if isinstance(plan, dict) else None
    if not isinstance(runs, dict) or not runs:
        raise SystemExit(f"{path}: expected {{\"runs\": {{NAME: {{\"train\": FLAGS, \"evals\": "
                         "[FLAGS, ...]}}}}")
    parsed = {}
    for name, run in runs.items():
        if (not name or "/" in name or not isinstance(run, dict) or not isinstance(run.get("train"), str)
                or not isinstance(run.get("evals", []), list)
                or not all(isinstance(e, str) for e in run.get("evals", []))
                or not isinstance(run.get("after", ""), str)
                or set(run) - {"train", "evals", "after"}):
            raise SystemExit(f"{path}: run {name!r} needs \"train\": a string of flags and optionally "
                             "\"evals\": a list of strings of flags and \"after\": a run's name, "
                             "nothing else")
        if run.get("after") is not None and run["after"] not in runs or run.get("after") == name:
            raise SystemExit(f"{path}: run {name!r} is after {run['after']!r}, which is not another run "
                             "of the plan")
        parsed[name] = {"train": shlex.split(run["train"]), "after": run.get("after"),
                        "evals": [shlex.split(flags) for flags in run.get("evals", [])]}
    return parsed


def run_step(args: list[str], log: Path, deadline: float | None) -> tuple[int, float]:
    """Run `python -m asentmax ARGS`, appending to `log` (<work>/<name>.<stage>.log); SIGINT at `deadline`
    (time.time(); None: never), SIGKILL GRACE_S later. Returns (exit code, seconds).

    Each run compiles into an Inductor cache of its own, <work>/.compile_cache/<name>
    (TORCHINDUCTOR_CACHE_DIR; its evaluations share it). Two Sort ASEntmax runs of one model side by side on
    the shared default cache both stopped at their first backward on an Inductor stride assertion (the
    thirty-fourth session), where each seed alone had trained; four such runs, two sharing a cache, did not
    crash in the thirty-sixth session's A/B (results/session36_gpu), so the cause is open and a cache per run
    stays the safe choice."""
    start = time.time()
    with open(log, "a") as out:
        out.write(f"$ asentmax {shlex.join(args)}\n")
        out.flush()
        cache = log.parent / COMPILE_CACHE / log.name.rsplit(".", 2)[0]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        child = subprocess.Popen([sys.executable, "-m", "asentmax", *args], stdout=out,
                                 stderr=subprocess.STDOUT, env=env)
        try:
            child.wait(timeout=None if deadline is None else max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return child.returncode, round(time.time() - start, 1)


def side_by_side(calls: dict[str, Callable[[], T]]) -> dict[str, T]:
    """Call every function at once, each in a thread of its own; {name: its result} once all have returned
    (an exception in one is raised here)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
    return {name: future.result() for name, future in futures.items()}


def run_together(commands: dict[str, list[str]], work: Path, stage: str, deadline: float | None) -> dict:
    """run_step for every command at once, logged to <work>/<name>.<stage>.log; {name: seconds}. One-line
    SystemExit when any exits other than 0 or 130 (stopped at the deadline)."""
    done = side_by_side({name: partial(run_step, args, work / f"{name}.{stage}.log", deadline)
                         for name, args in commands.items()})
    failed = [f"{name} (exit {code})" for name, (code, _) in done.items() if code not in (0, 130)]
    if failed:
        raise SystemExit(f"{stage} failed for {', '.join(failed)}; see {work}/<name>.{stage}.log")
    return {name: seconds for name, (_, seconds) in done.items()}


def run_chain(name: str, run: dict, work: Path, end: float, margin: float, min_eval_s: float,
              finished: dict[str, threading.Event], eval_flags: tuple = ()) -> dict:
    """Train (or resume) run `name`, then its evaluations not done yet (each with `eval_flags` appended),
    within the window ending at `end`; a run after another first waits for that one's chain to finish
    (`finished`: an event per chain)."""
    try:
        return _chain(name, run, work, end, margin, min_eval_s, finished, eval_flags)
    finally:
        finished[name].set()


def _chain(name: str, run: dict, work: Path, end: float, margin: float, min_eval_s: float,
           finished: dict[str, threading.Event], eval_flags: tuple) -> dict:
    run_dir, state = work / name, {"steps": []}
    trained, stalled = work / f"{name}.trained", work / f"{name}.stalled"
    if stalled.exists():  # stays stopped: --resume would carry it past its stall check
        return state
    after = run["after"]
    if after is not None:  # its training, not its evaluations: poll for the marker while its chain runs
        while (not (work / f"{after}.trained").exists() and after in finished and not finished[after].is_set()
               and time.time() < end - margin):
            finished[after].wait(timeout=2.0)
        if not (work / f"{after}.trained").exists():
            return {**state, "waiting_for": after}
    if not trained.exists():
        resume = (run_dir / "checkpoint.pt").exists()
        flags = ["--resume"] if resume else [flag.replace("{work}", str(work)) for flag in run["train"]]
        args = ["train", "--run-dir", str(run_dir), "--no-progress", *flags]
        code, seconds = run_step(args, work / f"{name}.train.log", end - margin)
        state["steps"].append({"step": "train", "resumed": resume, "exit": code, "seconds": seconds})
        if code == 0:
            trained.touch()
        elif code == STALLED_EXIT:
            stalled.touch()
            return state
        elif code != 130:
            return {**state, "failed": "train"}
    if trained.exists():
        for i, flags in enumerate(run["evals"]):
            done = work / f"{name}.eval{i}.done"
            if done.exists():
                continue
            if end - time.time() < min_eval_s:
                break
            flags = [flag.replace("{work}", str(work)) for flag in flags]
            code, seconds = run_step(["eval", str(run_dir), "--no-progress", *flags, *eval_flags],
                                     work / f"{name}.eval.log", end - 5)
            state["steps"].append({"step": f"eval{i}", "exit": code, "seconds": seconds})
            if code == 0:
                done.touch()
            elif code != 130:
                return {**state, "failed": f"eval{i}"}
            else:
                break
    return state


def error_line(log: Path) -> str:
    """The last line of a failed step's log that names an error ("AssertionError: ...", "asentmax train:
    error: ..."), else its last line: the printed state says why without the log."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "Error:" in line or "error:" in line]
    return (named or lines or [f"nothing in {log.name}"])[-1]


def last_written(work: Path, name: str) -> float | None:
    """When run `name` last wrote anything under `work` (its directory, logs and markers), as time.time();
    None when it has nothing there."""
    paths = [*work.glob(f"{name}.*"), *((work / name).rglob("*") if (work / name).is_dir() else ())]
    return max((path.stat().st_mtime for path in paths), default=None)


def summary(name: str, run: dict, work: Path, state: dict) -> dict:
    """A run's state after this call: trained or not, evaluations done, this call's steps."""
    evals = [(work / f"{name}.eval{i}.done").exists() for i in range(len(run["evals"]))]
    return {"trained": (work / f"{name}.trained").exists(), "evals_done": sum(evals), "evals": len(evals),
            "stalled": (work / f"{name}.stalled").exists(), **state}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path, help="PLAN.json")
    parser.add_argument("--work", type=Path, required=True, help="run directories, logs and markers")
    parser.add_argument("--seconds", type=float, required=True, help="length of this call's window")
    parser.add_argument("--runs", nargs="+", help="only these runs of the plan (default: all)")
    parser.add_argument("--margin", type=float, default=25.0,
                        help="seconds before the window closes when training is stopped (with a checkpoint)")
    parser.add_argument("--min-eval-seconds", type=float, default=20.0,
                        help="an evaluation starts only with this much of the window left")
    parser.add_argument("--eval-flags", default="", help="flags appended to every evaluation of this call, "
                        "e.g. \"--cuda-graphs on\" (settings that leave the results as they are)")
    parser.add_argument("--continuing", action="store_true",
                        help="this call continues an earlier window: start nothing if a run would begin "
                             "again from step 0 (a fresh machine has lost --work)")
    parser.add_argument("--stale-hours", type=float, default=STALE_HOURS,
                        help="start nothing if a named run (or the run it is after) was last written under "
                             "--work longer ago than this: a machine that kept an earlier session's files "
                             f"(default {STALE_HOURS:g})")
    args = parser.parse_args()
    plan = read_plan(args.plan)
    unknown = sorted(set(args.runs or ()) - set(plan))
    if unknown:
        parser.error(f"--runs {' '.join(unknown)}: not in {args.plan} (it has {', '.join(plan)})")
    if args.seconds <= args.margin:
        parser.error(f"--seconds {args.seconds:g} leaves no time before --margin {args.margin:g}")
    names = args.runs or list(plan)
    waiting = [f"{n} (after {plan[n]['after']})" for n in names if plan[n]["after"] not in (None, *names)
               and not (args.work / f"{plan[n]['after']}.trained").exists()]
    if waiting:
        parser.error(f"{', '.join(waiting)}: that run is neither trained under {args.work} nor in --runs")
    now = time.time()
    stale = [f"{n} ({(now - written) / 3600:.1f} h ago)" for n in dict.fromkeys(
        [*names, *(plan[n]["after"] for n in names if plan[n]["after"] is not None)])
        if (written := last_written(args.work, n)) is not None and now - written > args.stale_hours * 3600]
    if stale:
        parser.error(f"{', '.join(stale)}: last written under {args.work} longer ago than --stale-hours "
                     f"{args.stale_hours:g}, by an earlier session; remove them to start afresh (or raise "
                     "--stale-hours to continue them); nothing started")
    if args.continuing:  # a run after another may not have started yet; its prerequisite is checked instead
        fresh = [n for n in names if plan[n]["after"] is None and not (args.work / f"{n}.trained").exists()
                 and not (args.work / n / "checkpoint.pt").exists()]
        if fresh:
            parser.error(f"--continuing: {', '.join(fresh)} would start again from step 0 (no checkpoint or "
                         f"marker under {args.work}: a fresh machine?); nothing started")
    args.work.mkdir(parents=True, exist_ok=True)
    end = time.time() + args.seconds
    finished = {name: threading.Event() for name in names}
    eval_flags = tuple(shlex.split(args.eval_flags))
    states = side_by_side({name: partial(run_chain, name, plan[name], args.work, end, args.margin,
                                         args.min_eval_seconds, finished, eval_flags) for name in names})
    status = {name: summary(name, plan[name], args.work, states[name]) for name in names}
    (args.work / "status.json").write_text(json.dumps(status, indent=2) + "\n")
    for name, s in status.items():
        steps = ", ".join(f"{step['step']} exit {step['exit']} in {step['seconds']:g} s"
                          for step in s["steps"])
        failed = ""
        if "failed" in s:
            stage = "train" if s["failed"] == "train" else "eval"
            failed = f"; FAILED at {s['failed']}: {error_line(args.work / f'{name}.{stage}.log')}"
        if s["stalled"]:
            failed += "; stopped by a stall check (--stall-step, --stall-val-step), not evaluated"
        failed += f"; waiting for {s['waiting_for']} to train" if "waiting_for" in s else ""
        print(f"{name}: {'trained' if s['trained'] else 'training'}, evaluations "
              f"{s['evals_done']}/{s['evals']}{failed} ({steps or 'nothing to do'})")
    return 1 if any("failed" in s for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
