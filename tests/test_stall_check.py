"""`asentmax train --stall-step S --stall-loss L`: a run with no logged training loss below L by the first log
step from S on stops there with a checkpoint, one line and exit code 3; a run that got below L goes on; the
step it got below L (escape_step) is the first such line of log.csv, is kept in checkpoints and survives a
resume; a resumed stalled run continues. Several checks (S1 S2 ..., L1 L2 ...) each apply at their own step
with the lowest logged loss so far (kept in checkpoints; a checkpoint from before that resumes without a
wrong stop); configs saved with one check as numbers load as one check; bad values are refused in one line.
`--steps-after-escape K` ends a run K steps after its escape_step with a checkpoint and exit code 0, where
--stop-at-step would end it, whether the escape came in this process or before a resume; a resumed run that
already ended there has nothing to do; a run that leaves the plateau too late, or never, runs to --steps."""

import csv

import pytest
import torch

from asentmax.cli import main
from asentmax.runs import STALLED_EXIT
from asentmax.train import resume_run
from asentmax.trainer import TrainConfig

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "1", "--val-every", "0", "--log-every", "2", "--checkpoint-every", "0", "--d-model", "32",
        "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--device", "cpu", "--no-progress"]


def logged(run_dir):
    with open(run_dir / "log.csv", newline="") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


@pytest.mark.parametrize("stall_step, stop_step", [(6, 6), (5, 6), (1, 2), (11, 12), (12, 12)])
def test_a_run_that_never_gets_below_the_loss_stops_at_the_first_log_step_from_stall_step(
        tmp_path, capsys, stall_step, stop_step):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--run-dir", str(run), *TINY, "--steps", "12", "--stall-step", str(stall_step),
              "--stall-loss", "1e-9"])
    assert exit_info.value.code == STALLED_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stalled:") and f"by step {stop_step} " in err[0]
    assert logged(run)[-1][0] == stop_step
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=False)
    assert checkpoint["step"] == stop_step and checkpoint["escape_step"] is None
    # a check at the last step records the run as stopped too (a device_plan chain then ends there)
    assert (run / "stalled.json").is_file()

    # resumed, the run goes on to its last step: the check is behind it
    summary = resume_run(run, progress=False)
    assert summary["step"] == 12 and summary["stalled"] is None
    assert [step for step, _ in logged(run)] == list(range(2, 13, 2))


def midway_threshold(losses):
    """A loss halfway between the two middle logged `losses` ((step, loss) pairs), and the first log step
    below it: log.csv rounds to 6 decimals, so a threshold equal to a logged loss could sit either side of the
    trainer's unrounded one."""
    ordered = sorted(loss for _, loss in losses)
    low, high = ordered[len(ordered) // 2 - 1], ordered[len(ordered) // 2]
    assert high - low > 1e-5
    threshold = (low + high) / 2
    return threshold, min(step for step, loss in losses if loss < threshold)


def test_a_run_below_the_loss_goes_on_and_its_escape_step_is_the_first_such_log_line(tmp_path, capsys):
    probe = tmp_path / "probe"
    assert main(["train", "--run-dir", str(probe), *TINY, "--steps", "12"]) == 0
    losses = logged(probe)
    threshold, expected = midway_threshold(losses)

    run = tmp_path / "run"
    flags = [*TINY, "--stall-step", "12", "--stall-loss", repr(threshold)]
    assert main(["train", "--run-dir", str(run), *flags, "--steps", "12", "--stop-at-step", "10"]) == 0
    assert logged(run) == losses[:5]  # the check changes nothing in the run it lets through
    assert torch.load(run / "checkpoint.pt", weights_only=False)["escape_step"] == expected
    summary = resume_run(run, progress=False)
    assert summary["stalled"] is None and summary["step"] == 12
    assert summary["escape_step"] == expected  # restored from the checkpoint, not found again after it
    assert logged(run) == losses
    capsys.readouterr()


def test_the_second_check_stops_a_run_the_first_let_through_with_the_lowest_loss_so_far(tmp_path, capsys):
    probe = tmp_path / "probe"
    assert main(["train", "--run-dir", str(probe), *TINY, "--steps", "12"]) == 0
    losses = logged(probe)
    lowest_by = {s: min(loss for step, loss in losses if step <= s) for s, _ in losses}
    first_loss = lowest_by[4] * 1.5  # passed by step 4: some logged loss is below it
    second_loss = lowest_by[8] * (1 - 1e-5)  # not passed by step 8 (log.csv rounds to 6 decimals)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--run-dir", str(run), *TINY, "--steps", "12", "--stall-step", "4", "7",
              "--stall-loss", repr(first_loss), repr(second_loss)])
    assert exit_info.value.code == STALLED_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "below --stall-loss" in err[0] and "by step 8 (--stall-step 7;" in err[0]
    assert f"lowest logged loss {lowest_by[8]:.4f}" in err[0]
    assert logged(run) == losses[:4]  # the checks change nothing in the steps they let through
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=False)
    assert checkpoint["step"] == 8 and checkpoint["lowest_loss"] == pytest.approx(lowest_by[8], rel=1e-5)


def test_a_checkpoint_without_the_lowest_loss_resumes_without_a_wrong_stop(tmp_path, capsys):
    """A run that had escaped the plateau (escape_step set) before lowest_loss was kept passes later
    checks."""
    run = tmp_path / "run"
    flags = [*TINY, "--steps", "12", "--stall-loss", "1e9"]  # every log line is below: escape_step = 2
    assert main(["train", "--run-dir", str(run), *flags, "--stop-at-step", "4"]) == 0
    path = run / "checkpoint.pt"
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["escape_step"] == 2
    del checkpoint["lowest_loss"]
    checkpoint["train_config"].update(stall_step=[6], stall_loss=[1e-9])  # a check no run could pass
    torch.save(checkpoint, path)
    summary = resume_run(run, progress=False)
    assert summary["stalled"] is None and summary["step"] == 12
    capsys.readouterr()


@pytest.mark.parametrize("flags, message", [
    (["--stall-step", "-1"], "stall-step"), (["--stall-step", "0"], "stall-step"),
    (["--stall-step", "9", "5"], "increasing"), (["--stall-step", "5", "5"], "increasing"),
    (["--stall-loss", "0"], "stall-loss"), (["--stall-loss", "nan"], "stall-loss"),
    (["--stall-step", "2", "4", "--stall-loss", "0.3", "0.1", "0.01"], "one per --stall-step (2)"),
    (["--stall-step", "2", "5"], "stall-step 5 is after the last step (--steps 4)"),
    (["--steps-after-escape", "-1"], "steps-after-escape must be >= 0, got -1")])
def test_bad_stall_values_are_refused_in_one_line(tmp_path, capsys, flags, message):
    assert main(["train", "--run-dir", str(tmp_path / "run"), *TINY, "--steps", "4", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "run").exists()


def test_stall_settings_default_to_off():
    config = TrainConfig()
    assert config.stall_step == () and config.stall_checks() == []
    config.validate()


@pytest.mark.parametrize("saved, checks", [
    (dict(stall_step=0, stall_loss=0.3), []), (dict(stall_step=7000, stall_loss=0.3), [(7000, 0.3)]),
    (dict(stall_step=[7000, 19200], stall_loss=[0.3, 0.004]), [(7000, 0.3), (19200, 0.004)]),
    (dict(stall_step=[5, 9], stall_loss=[0.5]), [(5, 0.5), (9, 0.5)])])
def test_saved_stall_settings_load_as_checks(saved, checks):
    """config.json of runs from before several checks held one step (0: none) and one loss as numbers."""
    config = TrainConfig.from_dict({**TrainConfig().__dict__, **saved})
    assert config.stall_checks() == checks


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
    assert "left the loss plateau at step 2 and ended 5 steps later (--steps-after-escape)" in out
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
    out = capsys.readouterr().out
    assert "at step 2 and ended 5 steps later (--steps-after-escape); nothing to do" in out


def test_an_escape_before_or_after_a_resume_ends_the_run_at_the_same_step(tmp_path, capsys):
    probe = tmp_path / "probe"
    assert main(["train", "--run-dir", str(probe), *TINY, "--steps", "16"]) == 0
    threshold, escape = midway_threshold(logged(probe))
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
