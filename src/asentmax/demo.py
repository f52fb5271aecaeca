"""`make demo`: softmax vs ASEntmax length generalisation on a laptop CPU in minutes (the synthetic-task
experiments of arXiv:2506.16640, at a size a CPU trains in minutes).

Trains a small softmax model and a small ASEntmax model (same architecture, same data, NAPE positions)
on 2-back (the paper's appendix task, token classification as in its code: asentmax.tasks.two_back) at
lengths 8-16, evaluates both from 1x to 64x the training length (the paper code's 2-back test range),
prints the comparison table and writes the plots (asentmax.report) under the output directory, by default
runs/demo/ (ignored by git, so a clone stays clean). The two runs go through the `asentmax` CLI in two
child processes with one thread each, so a 2-core machine trains both at once; the training is
deterministic, so every run prints the same numbers. The settings below were picked by measurement
(see results/demo/README.md).

`asentmax demo --publish` (`make demo-results`) then copies the outputs (without checkpoints) to the
committed results/demo/ and rewrites README.md's demo table from them (`readme_demo_block`; the test suite
checks that README's table is the one in results/demo/compare.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEMO_TASK = "two_back"
DEMO_TRAIN = {"min-length": 8, "max-length": 16, "steps": 2000, "batch-size": 32, "lr": 2e-3,
              "warmup-steps": 100, "val-every": 500, "val-samples": 32, "checkpoint-every": 500,
              "log-every": 50, "seed": 0}
DEMO_MODEL = {"d-model": 64, "n-layers": 2, "n-heads": 4, "d-ff": 256, "position": "nape"}
DEMO_METHODS = ("softmax", "asentmax")
DEMO_EVAL = {"multipliers": ("1", "2", "4", "8", "16", "32", "64"), "samples": 200}
DEFAULT_OUTPUT = "runs/demo"
POLL_S = 5.0  # seconds between checks on the train and eval children
PUBLISHED_DIR = "results/demo"  # the committed evidence, relative to the repository root
README_BEGIN = "<!-- demo table: written by `make demo-results`; tests/test_demo.py checks it -->"
README_END = "<!-- end of demo table -->"


def _cores() -> int:
    """CPU cores this process may use (respects taskset / container limits, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _flags(options: dict) -> list[str]:
    out = []
    for name, value in options.items():
        out.append(f"--{name}")
        out.extend(value if isinstance(value, tuple) else (str(value),))
    return out


def _child(args: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "asentmax", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=env)


def _last_step(run_dir: Path) -> str:
    log = run_dir / "log.csv"
    if not log.is_file():
        return "starting"
    lines = log.read_text().strip().splitlines()
    if len(lines) < 2:
        return "starting"
    step, loss = lines[-1].split(",")[:2]
    return f"step {step} loss {float(loss):.3f}"


def _command(publish: bool) -> str:
    return "make demo-results (= asentmax demo --publish)" if publish else "make demo (= asentmax demo)"


def _report(table: str, train_options: dict, total: float, train_seconds: float, publish: bool) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return "\n".join([
        "# `make demo` result", "",
        f"Command: `{_command(publish)}`, run {when} on {_cores()} CPU cores.",
        f"Wall time {total:.0f} s (training done at {train_seconds:.0f} s; the two models in parallel).", "",
        f"Task {DEMO_TASK}, training lengths {train_options['min-length']}-{train_options['max-length']} "
        f"(ID = {train_options['max-length']}), {train_options['steps']} steps of batch "
        f"{train_options['batch-size']}; model flags `{' '.join(_flags(DEMO_MODEL))}`.", "",
        table,
        "Plots: accuracy.png, dispersion.png, training.png; config.json, log.csv, val.csv, eval.json in the "
        "run dirs.",
        ""])


def readme_demo_block(compare: dict, summary: dict) -> str:
    """README.md's demo paragraph and table (between README_BEGIN and README_END) from a demo's
    compare.json and demo.json: exact match % of each method at every evaluated multiplier."""
    from asentmax.report import method_label
    from asentmax.runs import format_multiplier

    results = compare["results"]
    multipliers = sorted({row["length"] / r["id_length"] for r in results for row in r["rows"]})
    lines = [f"Measured on {summary['cpu_count']} CPU cores ({PUBLISHED_DIR}/demo.md): "
             f"{summary['total_seconds']:.0f} s wall, exact match % over {summary['eval']['samples']} "
             "samples per length:", "",
             "| method | " + " | ".join(format_multiplier(m) for m in multipliers) + " |",
             "|---|" + "---|" * len(multipliers)]
    for result in results:
        by_m = {row["length"] / result["id_length"]: row for row in result["rows"]}
        lines.append(f"| {method_label(result)} | " + " | ".join(
            f"{100 * by_m[m]['exact_match']:.1f}" if m in by_m else "-" for m in multipliers) + " |")
    return "\n".join(lines)


def _section_bounds(readme_text: str) -> tuple[int, int]:
    start, end = readme_text.find(README_BEGIN), readme_text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"README.md has no demo table markers ({README_BEGIN} ... {README_END})")
    return start + len(README_BEGIN), end


def readme_demo_section(readme_text: str) -> str:
    """The text between README_BEGIN and README_END; ValueError when the markers are missing."""
    start, end = _section_bounds(readme_text)
    return readme_text[start:end].strip("\n")


def check_publish_target(root: Path) -> None:
    """ValueError (one line) unless `root` is a checkout that --publish can write to."""
    readme_demo_section((root / "README.md").read_text() if (root / "README.md").is_file() else "")
    if not (root / PUBLISHED_DIR).is_dir():
        raise ValueError(f"--publish: no {PUBLISHED_DIR}/ under {root}; run it from the repository root")


def publish(output_dir: Path, root: Path) -> None:
    """Copy a finished demo (without checkpoints) to root/results/demo and rewrite README.md's table."""
    target = root / PUBLISHED_DIR
    shutil.copytree(output_dir, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.pt", "*.tmp*", "tensorboard"))
    compare = json.loads((target / "compare.json").read_text())
    summary = json.loads((target / "demo.json").read_text())
    readme = root / "README.md"
    text = readme.read_text()
    start, end = _section_bounds(text)
    readme.write_text(f"{text[:start]}\n{readme_demo_block(compare, summary)}\n{text[end:]}")


def run_demo(output_dir: Path | str = DEFAULT_OUTPUT, steps: int | None = None,
             publish_root: Path | None = None) -> str:
    """Train, evaluate and compare the demo runs under `output_dir`; returns the markdown table. With
    `publish_root` (a checkout), then publish() the results there."""
    from asentmax.report import compare_runs

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    train_options = {**DEMO_TRAIN, **({"steps": steps} if steps else {})}
    start = time.perf_counter()
    runs = {method: output_dir / f"{DEMO_TASK}_{method}" for method in DEMO_METHODS}
    # each method: a train child, then (as soon as it ends) an eval child; the two methods run side by side
    stages = {method: "train" for method in DEMO_METHODS}
    children, seconds = {}, {}
    for method, run_dir in runs.items():
        run_dir.mkdir(parents=True, exist_ok=True)
        args = ["train", "--run-dir", str(run_dir), "--overwrite", "--no-progress", "--task", DEMO_TASK,
                *_flags(train_options), *_flags(DEMO_MODEL), "--attention", method]
        children[method] = _child(args, output_dir / f"{method}.train.log")
    print(f"training {', '.join(DEMO_METHODS)} on {DEMO_TASK} (lengths {train_options['min-length']}-"
          f"{train_options['max-length']}, {train_options['steps']} steps) in parallel, then evaluating "
          f"each at {', '.join(DEMO_EVAL['multipliers'])}x; logs in {output_dir}", flush=True)
    while any(stage != "done" for stage in stages.values()):
        time.sleep(POLL_S)
        for method, child in children.items():
            if stages[method] == "done" or child.poll() is None:
                continue
            if child.returncode:
                raise RuntimeError(f"{stages[method]} of {method} failed; see "
                                   f"{output_dir / f'{method}.{stages[method]}.log'}")
            seconds[f"{method}_{stages[method]}"] = round(time.perf_counter() - start, 1)
            if stages[method] == "train":
                stages[method] = "eval"
                children[method] = _child(["eval", str(runs[method]), "--no-progress", *_flags(DEMO_EVAL)],
                                          output_dir / f"{method}.eval.log")
            else:
                stages[method] = "done"
        if (time.perf_counter() - start) % 30 < POLL_S:  # about every 30 s
            status = "; ".join(f"{m}: {_last_step(runs[m]) if stages[m] == 'train' else stages[m]}"
                               for m in DEMO_METHODS)
            print(f"  [{time.perf_counter() - start:5.0f}s] {status}", flush=True)
    train_seconds = max(seconds[f"{method}_train"] for method in DEMO_METHODS)
    table = compare_runs(list(runs.values()), output_dir)
    total = time.perf_counter() - start
    summary = {"task": DEMO_TASK, "train": train_options, "model": DEMO_MODEL, "eval": DEMO_EVAL,
               "train_seconds": round(train_seconds, 1), "total_seconds": round(total, 1),
               "finished_at_s": seconds,
               "command": _command(publish_root is not None), "cpu_count": _cores()}
    (output_dir / "demo.json").write_text(json.dumps(summary, indent=2) + "\n")
    (output_dir / "demo.md").write_text(_report(table, train_options, total, train_seconds,
                                                publish_root is not None))
    print(table)
    print(f"demo finished in {total:.0f}s (training {train_seconds:.0f}s); outputs in {output_dir}")
    if publish_root is not None:
        publish(output_dir, publish_root)
        print(f"copied to {publish_root / PUBLISHED_DIR} and rewrote README.md's demo table")
    return table
