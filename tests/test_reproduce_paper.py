"""benchmarks/reproduce_paper.py on the CPU with a tiny model: its methods train and evaluate side by side
through benchmarks/device_plan.py's runner, which stops them at --train-seconds with a checkpoint; a run
stopped before its planned steps is not evaluated, `--resume` continues it from its checkpoint to the planned
steps in a later call, and the table and runs.json then account for every call; wrong uses of --resume and
--tables fresh for a task without tables, and --train-flags that a method's train command would refuse, are
one-line errors. The resume test runs the script in a subprocess; the others call its main() in this process
(the training and evaluation still run in children)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from asentmax.tasks import get_task
from asentmax.tasks.registry import fresh_tables_refusal
from conftest import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "reproduce_paper.py"
TINY = ("--min-length 3 --max-length 6 --batch-size 4 --warmup-steps 2 --val-every 0 --val-samples 2 "
        "--log-every 2 --d-model 16 --n-layers 1 --n-heads 2 --d-ff 32")


def command(tmp_path, *args):
    return [str(SCRIPT), "--task", "copy", "--methods", "softmax", "--samples", "2", "--multipliers", "1 2",
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *args]


def reproduce(tmp_path, *args):
    """The script in a subprocess, as it is run (the resume test; the others call main in process)."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    return subprocess.run([sys.executable, *command(tmp_path, *args)], capture_output=True, text=True,
                          env=env)


@pytest.fixture
def reproduce_here(monkeypatch, capsys):
    """reproduce, by reproduce_paper.main() in this process (its train and eval children are subprocesses
    all the same): returncode (main's return value or the SystemExit code), stdout, stderr."""
    monkeypatch.setenv("PYTHONPATH", str(SCRIPT.parents[1] / "src"))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its `from device_plan import ...`
    script = load_benchmark("reproduce_paper")

    def run(tmp_path, *args):
        monkeypatch.setattr(sys, "argv", command(tmp_path, *args))
        capsys.readouterr()
        try:
            code = script.main()
        except SystemExit as stop:
            code = stop.code
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def test_a_stopped_run_is_resumed_then_evaluated(tmp_path):
    first = reproduce(tmp_path, "--train-flags", f"{TINY} --steps 12 --stop-at-step 6")
    assert first.returncode == 0, first.stderr
    assert "softmax at step 6 of 12" in first.stdout and "--resume" in first.stdout
    run = tmp_path / "work" / "copy" / "softmax"
    assert not (run / "eval.json").exists() and not (tmp_path / "out" / "copy.md").exists()
    second = reproduce(tmp_path, "--resume")
    assert second.returncode == 0, second.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 12
    assert json.loads((run / "eval.json").read_text())["train_step"] == 12
    provenance = json.loads((tmp_path / "out" / "copy" / "runs.json").read_text())["softmax"]
    calls = provenance["train_calls"]
    assert [(c["from_step"], c["to_step"]) for c in calls] == [(0, 6), (6, 12)]
    assert provenance["train_wall_s"] == pytest.approx(sum(c["train_s"] for c in calls), abs=0.1)
    assert provenance["steps_reached"] == provenance["steps_planned"] == 12
    assert provenance["samples_seen"] == 12 * 4
    seed = get_task("copy").train_preset["seed"]  # the preset's: the run was given none
    assert provenance["seed"] == seed
    assert f"| softmax | {seed} | 12 (12) | 48 |" in (tmp_path / "out" / "copy.md").read_text()


def test_eval_unfinished_evaluates_a_stopped_run(tmp_path, reproduce_here):
    done = reproduce_here(tmp_path, "--train-flags", f"{TINY} --steps 12 --stop-at-step 4",
                          "--eval-unfinished")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "work" / "copy" / "softmax" / "eval.json").read_text())
    assert result["train_step"] == 4
    assert json.loads((tmp_path / "out" / "copy" / "runs.json").read_text())["softmax"]["steps_reached"] == 4


def test_methods_run_side_by_side_and_train_seconds_stops_each_with_a_checkpoint(tmp_path, reproduce_here):
    done = reproduce_here(tmp_path, "--methods", "softmax", "asentmax", "--train-seconds", "8",
                     "--eval-unfinished", "--train-flags", f"{TINY} --steps 1000000")
    assert done.returncode == 0, done.stderr
    work = tmp_path / "work" / "copy"
    provenance = json.loads((tmp_path / "out" / "copy" / "runs.json").read_text())
    assert list(provenance) == ["softmax", "asentmax"]
    for method in ("softmax", "asentmax"):  # both still training at the deadline, both stopped there
        step = torch.load(work / method / "checkpoint.pt", weights_only=False)["step"]
        assert 0 < step < 1000000 and provenance[method]["steps_reached"] == step
        assert json.loads((work / method / "eval.json").read_text())["train_step"] == step
        [call] = provenance[method]["train_calls"]
        assert 7 < call["train_s"] < 38 and (call["from_step"], call["to_step"]) == (0, step)
        for stage in ("train", "eval"):  # device_plan.run_step's log: the command line, then the output
            assert (work / f"{method}.{stage}.log").read_text().startswith(f"$ asentmax {stage} ")
    assert "| softmax |" in (tmp_path / "out" / "copy.md").read_text()


@pytest.mark.parametrize("case", ["no-checkpoint", "with-flags", "fresh-tables-mqmtar"])
def test_misuse_is_one_line(tmp_path, case, reproduce_here):
    extra = {"no-checkpoint": ["--resume"], "with-flags": ["--resume", "--train-flags", TINY],
             "fresh-tables-mqmtar": ["--task", "mqmtar", "--tables", "fresh", "--resume"]}[case]
    result = reproduce_here(tmp_path, *extra)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    expected = {"no-checkpoint": "no checkpoint", "with-flags": "drop --train-flags",
                "fresh-tables-mqmtar": "no checkpoint"}[case]  # mqmtar has tables: on to the next check
    last = result.stderr.strip().splitlines()[-1]  # argparse's usage, then the one error line
    assert last.startswith("reproduce_paper.py: error: ") and expected in last
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("methods,flags,expected", [
    (["softmax", "asentmax"], "--alpha 1.5", "--alpha has no effect with --attention softmax"),
    (["entmax", "asentmax"], "--topk-k=4", "--topk-k has no effect with --attention entmax"),
    (["topk", "ssmax"], "--topk-k 4", "--topk-k has no effect with --attention ssmax"),
    (["softmax"], "--no-such-flag 1", "unrecognized arguments: --no-such-flag 1"),
    (["softmax"], "--help", "--help is not a training flag"), (["softmax"], "--steps 3 -h", "--help is not"),
])
def test_train_flags_a_method_would_refuse_are_refused_before_any_run(tmp_path, monkeypatch, capsys, methods,
                                                                     flags, expected):
    last = refused_in_process(tmp_path, monkeypatch, capsys, "--methods", *methods, "--train-flags",
                              f"{TINY} {flags}")
    assert last.startswith(f"reproduce_paper.py: error: --train-flags: {expected}"), last


def test_fresh_tables_for_a_task_without_tables_is_eval_s_refusal(tmp_path, monkeypatch, capsys):
    last = refused_in_process(tmp_path, monkeypatch, capsys, "--tables", "fresh")
    assert last == f"reproduce_paper.py: error: {fresh_tables_refusal('copy')}"


def refused_in_process(tmp_path, monkeypatch, capsys, *args) -> str:
    """The last stderr line of reproduce_paper.main() on the copy task with `args`, which must exit 2 before
    it writes anything."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import reproduce_paper

    monkeypatch.setattr(sys, "argv", [SCRIPT.name, "--task", "copy", "--work", str(tmp_path / "work"),
                                      "--out", str(tmp_path / "out"), *args])
    with pytest.raises(SystemExit) as exit_info:
        reproduce_paper.main()
    assert exit_info.value.code == 2
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_checkpoint_best_tests_each_runs_best_pt(tmp_path, reproduce_here):
    flags = f"{TINY} --steps 8 --val-every 2 --keep-best-at 1".replace("--val-every 0 ", "")
    done = reproduce_here(tmp_path, "--train-flags", flags, "--checkpoint", "best")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "work" / "copy" / "softmax"
    best = torch.load(run / "best.pt", weights_only=False)
    result = json.loads((run / "eval_best.json").read_text())
    assert result["train_step"] == best["step"] and not (run / "eval.json").exists()
    assert "ours (softmax, best.pt)" in (tmp_path / "out" / "copy.md").read_text()
