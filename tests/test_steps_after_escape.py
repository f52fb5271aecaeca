"""`asentmax train --steps-after-escape K`: a run ends K steps after its escape_step (the first log step with
a training loss below the first --stall-loss) with a checkpoint and exit code 0, where --stop-at-step would
end it, whether the escape came in this process or before a resume; a resumed run that already ended there
has nothing to do; a run that never leaves the plateau runs to --steps; a negative K is refused in one
line."""

import csv

import pytest
import torch

from asentmax.cli import main
from asentmax.train import resume_run

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "1", "--val-every", "0", "--log-every", "2", "--checkpoint-every", "0", "--d-model", "32",
        "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--device", "cpu", "--no-progress"]


def logged(run_dir):
    with open(run_dir / "log.csv", newline="") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def saved(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)


def same_weights(a, b):
    return all(torch.equal(a["model"][name], b["model"][name]) for name in a["model"]) and \
        a["model"].keys() == b["model"].keys()


def test_a_run_ends_k_steps_after_its_escape_as_stop_at_step_would_end_it(tmp_path, capsys):
    # every loss is below 1e9: the escape is the first log step, 2, so the run ends at step 2 + 5 = 7
    flags = [*TINY, "--steps", "20", "--stall-loss", "1e9"]
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *flags, "--steps-after-escape", "5"]) == 0
    out = capsys.readouterr().out
    assert "left the loss plateau at step 2 and ended at step 7" in out
    assert saved(run)["step"] == 7 and saved(run)["escape_step"] == 2

    reference = tmp_path / "reference"
    assert main(["train", "--run-dir", str(reference), *flags, "--stop-at-step", "7"]) == 0
    assert same_weights(saved(run), saved(reference))
    assert logged(run) == logged(reference)

    # resumed, it has nothing left to do
    summary = resume_run(run, progress=False)
    assert summary["step"] == 7 and summary["start_step"] == 7 and summary["ended_after_escape"]
    assert saved(run)["step"] == 7
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress"]) == 0
    assert "ended at step 7, --steps-after-escape later; nothing to do" in capsys.readouterr().out


def test_an_escape_before_or_after_a_resume_ends_the_run_at_the_same_step(tmp_path, capsys):
    probe = tmp_path / "probe"
    assert main(["train", "--run-dir", str(probe), *TINY, "--steps", "16"]) == 0
    losses = logged(probe)
    ordered = sorted(loss for _, loss in losses)
    # halfway between two logged losses (log.csv rounds to 6 decimals)
    threshold = (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    assert ordered[len(ordered) // 2] - ordered[len(ordered) // 2 - 1] > 1e-5
    escape = min(step for step, loss in losses if loss < threshold)
    assert escape >= 4  # so that a run can be stopped before it
    flags = [*TINY, "--steps", "16", "--stall-loss", repr(threshold), "--steps-after-escape", "3"]

    whole = tmp_path / "whole"
    assert main(["train", "--run-dir", str(whole), *flags]) == 0
    assert saved(whole)["step"] == escape + 3
    for stop in (escape - 1, escape + 1):  # found after the resume; found before it, ending the resumed run
        run = tmp_path / f"stopped_at_{stop}"
        assert main(["train", "--run-dir", str(run), *flags, "--stop-at-step", str(stop)]) == 0
        summary = resume_run(run, progress=False)
        assert summary["step"] == escape + 3 and summary["escape_step"] == escape
        assert summary["ended_after_escape"]
        assert same_weights(saved(run), saved(whole))
    capsys.readouterr()


@pytest.mark.parametrize("stall_loss, after, escape", [("1e-9", "1", None), ("1e9", "100", 2)])
def test_a_run_that_never_leaves_the_plateau_or_leaves_it_late_runs_to_its_last_step(
        tmp_path, capsys, stall_loss, after, escape):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY, "--steps", "8", "--stall-loss", stall_loss,
                 "--steps-after-escape", after]) == 0
    assert saved(run)["step"] == 8 and saved(run)["escape_step"] == escape
    assert "left the loss plateau" not in capsys.readouterr().out
    assert not resume_run(run, progress=False)["ended_after_escape"]


def test_a_negative_count_is_refused_in_one_line(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "run"), *TINY, "--steps", "8",
                 "--steps-after-escape", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "steps-after-escape must be >= 0, got -1" in err[0]
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
