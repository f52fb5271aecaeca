"""`asentmax train --stall-step S --stall-loss L`: a run with no logged training loss below L by the first log
step from S on stops there with a checkpoint, one line and exit code 3; a run that got below L goes on; the
step it got below L (escape_step) is the first such line of log.csv, is kept in checkpoints and survives a
resume; a resumed stalled run continues; bad values are refused in one line."""

import csv

import pytest
import torch

from asentmax.cli import STALLED_EXIT, main
from asentmax.train import resume_run
from asentmax.trainer import TrainConfig

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "1", "--val-every", "0", "--log-every", "2", "--checkpoint-every", "0", "--d-model", "32",
        "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--device", "cpu", "--no-progress"]


def logged(run_dir):
    with open(run_dir / "log.csv", newline="") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


@pytest.mark.parametrize("stall_step, stop_step", [(6, 6), (5, 6), (1, 2)])
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

    # resumed, the run goes on to its last step: the check is behind it
    summary = resume_run(run, progress=False)
    assert summary["step"] == 12 and summary["stalled"] is None
    assert [step for step, _ in logged(run)] == list(range(2, 13, 2))


def test_a_run_below_the_loss_goes_on_and_its_escape_step_is_the_first_such_log_line(tmp_path, capsys):
    probe = tmp_path / "probe"
    assert main(["train", "--run-dir", str(probe), *TINY, "--steps", "12"]) == 0
    losses = logged(probe)
    threshold = sorted(loss for _, loss in losses)[len(losses) // 2]
    expected = min(step for step, loss in losses if loss < threshold)

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


@pytest.mark.parametrize("flag, value",
                         [("--stall-step", "-1"), ("--stall-loss", "0"), ("--stall-loss", "nan")])
def test_bad_stall_values_are_refused_in_one_line(tmp_path, capsys, flag, value):
    assert main(["train", "--run-dir", str(tmp_path / "run"), *TINY, "--steps", "4", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag.lstrip("-") in err[0]
    assert not (tmp_path / "run").exists()


def test_stall_settings_default_to_off():
    config = TrainConfig()
    assert config.stall_step == 0
    config.validate()
