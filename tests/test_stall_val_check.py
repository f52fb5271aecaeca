"""`asentmax train --stall-val-step S --stall-val-score X`: a run whose stall score (TaskWorkload: the exact
match at --stall-val-at, else at --keep-best-at) at its first validation from step S on is below X stops
there with a checkpoint, one line and exit code 3; a run at or above X goes on, and later validations are not
checked; a resumed stopped run continues. Several checks (steps S1 < S2 ..., one score each or one for all,
one --stall-val-at each or one for all) each read their own length at their own step. A run without a stall
score (neither flag, language modelling), without validations, with a score of 0 or less, with counts that do
not pair up, or with --stall-val-at not among the validation lengths is refused in one line before it starts;
configs saved when the check was one number load as one check."""

import csv

import pytest
import torch

from asentmax.cli import main
from asentmax.nn import ModelConfig
from asentmax.runs import STALLED_EXIT
from asentmax.tasks import get_task
from asentmax.tasks.workload import TaskWorkload
from asentmax.train import resume_run
from asentmax.trainer import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "1", "--val-every", "2", "--val-samples", "4", "--val-multipliers", "1", "2", "--log-every", "2",
        "--checkpoint-every", "0", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
        "--device", "cpu", "--no-progress"]

EXACT = {2: 0.25, 4: 0.625, 6: 0.125, 8: 0.75, 10: 0.5, 12: 0.0}  # validation step -> scripted exact match


class ScriptedExactMatch(TaskWorkload):
    """The copy workload whose validation rows say exact match EXACT[step] at every length; its selection
    score is TaskWorkload's own."""

    def validate(self, model, *, step, **kwargs):
        return [{**row, "exact_match": EXACT[step]} for row in super().validate(model, step=step, **kwargs)]


def configs(**overrides):
    """12 steps of a tiny copy model, validated every 2."""
    model = ModelConfig(vocab_size=get_task("copy").vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                        attention="asentmax", position="nape")
    fields = dict(steps=12, batch_size=8, lr=3e-3, warmup_steps=3, val_every=2, log_every=2,
                  checkpoint_every=4, seed=5)
    return TrainConfig(**{**fields, **overrides}), model


def scripted(**overrides):
    values = dict(task="copy", min_length=3, max_length=6, val_multipliers=(1, 2), val_samples=4,
                  keep_best_at=2)
    return ScriptedExactMatch(**{**values, **overrides})


def val_steps(run_dir):
    with open(run_dir / "val.csv", newline="") as f:
        return sorted({int(r["step"]) for r in csv.DictReader(f)})


@pytest.mark.parametrize("stall_val_step, stop_step", [(3, 4), (5, 6), (6, 6), (11, 12)])
def test_a_score_below_stops_the_run_at_the_first_validation_from_the_step(tmp_path, stall_val_step,
                                                                            stop_step):
    """Threshold 0.6: the first validation from S on is at stop_step; it stops the run there where EXACT is
    below 0.6 (at the last step too: the run is recorded as stopped), else the run goes to step 12."""
    train_config, model = configs(stall_val_step=(stall_val_step,), stall_val_score=(0.6,))
    summary = train(scripted(), train_config, model, tmp_path / "run", progress=False)
    stops = EXACT[stop_step] < 0.6
    assert summary["step"] == (stop_step if stops else 12)
    if stops:
        assert summary["stalled"] == {"step": stop_step, "score": EXACT[stop_step],
                                      "stall_val_step": stall_val_step, "stall_val_score": 0.6}
        assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["step"] == stop_step
        assert val_steps(tmp_path / "run")[-1] == stop_step
    else:
        assert summary["stalled"] is None  # step 6's and 12's scores are below 0.6, and were not checked
        assert not (tmp_path / "run" / "stalled.json").exists()


class LengthDependentExactMatch(TaskWorkload):
    """The copy workload whose validation rows say exact match 0.9 at 1x and 0.1 at 2x at every step."""

    def validate(self, model, **kwargs):
        return [{**row, "exact_match": 0.9 if row["length"] == self.max_length else 0.1}
                for row in super().validate(model, **kwargs)]


@pytest.mark.parametrize("keep_best_at, stall_val_at, stops", [
    (2, (), True), (2, (1,), False), (1, (2,), True), (0, (2,), True), (0, (1,), False)])
def test_stall_val_at_picks_the_length_the_check_reads(tmp_path, keep_best_at, stall_val_at, stops):
    """Threshold 0.5 at step 4: 1x (0.9) passes, 2x (0.1) stops; --stall-val-at overrides --keep-best-at's
    length, works without it, and leaves the length best.pt is kept by alone."""
    train_config, model = configs(stall_val_step=(4,), stall_val_score=(0.5,))
    workload = LengthDependentExactMatch(task="copy", min_length=3, max_length=6, val_multipliers=(1, 2),
                                         val_samples=4, keep_best_at=keep_best_at, stall_val_at=stall_val_at)
    summary = train(workload, train_config, model, tmp_path / "run", progress=False)
    assert summary["step"] == (4 if stops else 12)
    assert (summary["stalled"] or {}).get("score") == (0.1 if stops else None)
    rows = [{"length": 6, "exact_match": 0.9, "token_accuracy": 0.95},
            {"length": 12, "exact_match": 0.1, "token_accuracy": 0.5}]
    assert workload.selection_score(rows) == {0: None, 1: (0.9, 0.95), 2: (0.1, 0.5)}[keep_best_at]


def test_the_cli_stops_with_one_line_and_exit_3_and_resume_continues(tmp_path, capsys):
    """No exact match reaches 1.5: the validation at step 4 (the first from step 3) stops the run."""
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--run-dir", str(run), *TINY, "--steps", "8", "--keep-best-at", "2",
              "--stall-val-step", "3", "--stall-val-score", "1.5"])
    assert exit_info.value.code == STALLED_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stalled: validation score ")
    assert "at step 4, below --stall-val-step 3 --stall-val-score 1.5" in err[0] and "--resume" in err[0]
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 4
    summary = resume_run(run, progress=False)  # the check is behind it
    assert summary["step"] == 8 and summary["stalled"] is None
    assert val_steps(run) == [2, 4, 6, 8]


KEEP = ["--keep-best-at", "2"]


@pytest.mark.parametrize("flags, message", [
    (["--stall-val-step", "4", "--stall-val-score", "0.5"], "--keep-best-at"),
    ([*KEEP, "--stall-val-step", "4"], "stall-val-score must be > 0"),
    ([*KEEP, "--stall-val-step", "4", "--stall-val-score", "-1"], "stall-val-score must be > 0"),
    ([*KEEP, "--stall-val-step", "-4", "--stall-val-score", "0.5"], "stall-val-step must be steps >= 1"),
    ([*KEEP, "--stall-val-step", "4", "2", "--stall-val-score", "0.5"], "in increasing order, got 4 2"),
    ([*KEEP, "--stall-val-step", "2", "4", "--stall-val-score", "0.5", "0.4", "0.3"],
     "stall-val-score needs one value or one per --stall-val-step (2), got 3"),
    (["--stall-val-at", "1", "2", "1", "--stall-val-step", "2", "4", "--stall-val-score", "0.5"],
     "stall-val-at needs one value or one per --stall-val-step (2), got 3"),
    ([*KEEP, "--stall-val-step", "4", "--stall-val-score", "0.5", "--val-every", "0"], "--val-every"),
    ([*KEEP, "--stall-val-step", "5", "--stall-val-score", "0.5"], "stall-val-step 5 is after the last"),
    (["--stall-val-at", "4", "--stall-val-step", "4", "--stall-val-score", "0.5"],
     "stall-val-at must be 0 or one of the val-multipliers (1 2), got 4")])
def test_bad_validation_stall_settings_are_refused_in_one_line(tmp_path, capsys, flags, message):
    assert main(["train", "--run-dir", str(tmp_path / "run"), *TINY, "--steps", "4", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_the_trainer_refuses_a_workload_without_a_selection_score_before_it_starts(tmp_path):
    train_config, model = configs(stall_val_step=(4,), stall_val_score=(0.5,))
    with pytest.raises(ValueError, match="keep-best-at"):
        train(scripted(keep_best_at=0), train_config, model, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_the_validation_stall_check_defaults_to_off_and_old_configs_load():
    config = TrainConfig.from_dict({key: value for key, value in TrainConfig().__dict__.items()
                                    if not key.startswith("stall_val")})
    assert (config.stall_val_step, config.stall_val_score) == ((), ())
    config.validate()
    old = {**TrainConfig().__dict__, "steps": 30000, "val_every": 100}
    none = TrainConfig.from_dict({**old, "stall_val_step": 0, "stall_val_score": 0.0})
    assert none.stall_val_checks() == []
    loaded = TrainConfig.from_dict({**old, "stall_val_step": 25600, "stall_val_score": 0.4})
    assert loaded.stall_val_checks() == [(25600, 0.4)]
    assert TrainConfig.from_dict({**old, "stall_val_step": [100, 200], "stall_val_score": [0.5, 0.1]}
                                 ).stall_val_checks() == [(100, 0.5), (200, 0.1)]  # JSON lists
    saved = scripted(keep_best_at=0, stall_val_at=2).to_dict()  # one length, as saved before: a number
    assert TaskWorkload.from_dict(saved).stall_val_at == (2,)
    assert TaskWorkload.from_dict({**saved, "stall_val_at": 0}).stall_val_at == ()


@pytest.mark.parametrize("scores, stop_step, stopped_by", [
    ((0.2, 0.6), 10, (9, 0.6)), ((0.7, 0.6), 4, (3, 0.7)), ((0.2, 0.4), 12, None)])
def test_several_checks_each_read_their_own_step_and_score(tmp_path, scores, stop_step, stopped_by):
    """Checks from steps 3 and 9: the first reads step 4's validation (0.625), the second step 10's (0.5),
    each against its own score; the first to fall below stops the run and is the one recorded."""
    train_config, model = configs(stall_val_step=(3, 9), stall_val_score=scores)
    summary = train(scripted(), train_config, model, tmp_path / "run", progress=False)
    assert summary["step"] == stop_step
    if stopped_by is None:
        assert summary["stalled"] is None
    else:
        assert summary["stalled"] == {"step": stop_step, "score": EXACT[stop_step],
                                      "stall_val_step": stopped_by[0], "stall_val_score": stopped_by[1]}


@pytest.mark.parametrize("stall_val_at, stop_step", [((1, 2), 8), ((2, 1), 4), ((1,), 12)])
def test_several_checks_each_read_their_own_length(tmp_path, stall_val_at, stop_step):
    """Checks at steps 4 and 8 with score 0.5 for both: 1x reads 0.9 (passes), 2x 0.1 (stops); one
    --stall-val-at value is every check's length."""
    train_config, model = configs(stall_val_step=(4, 8), stall_val_score=(0.5,))
    workload = LengthDependentExactMatch(task="copy", min_length=3, max_length=6, val_multipliers=(1, 2),
                                         val_samples=4, keep_best_at=0, stall_val_at=stall_val_at)
    summary = train(workload, train_config, model, tmp_path / "run", progress=False)
    assert summary["step"] == stop_step
    assert (summary["stalled"] or {}).get("stall_val_step") == {8: 8, 4: 4, 12: None}[stop_step]


def test_two_checks_at_one_validation_record_the_first_that_stops(tmp_path):
    """Checks from steps 3 and 4 both read step 4's validation (0.625), below both scores: the first check
    stops the run and its record is kept, not overwritten by the second's."""
    train_config, model = configs(stall_val_step=(3, 4), stall_val_score=(0.7, 0.9))
    summary = train(scripted(), train_config, model, tmp_path / "run", progress=False)
    assert summary["stalled"] == {"step": 4, "score": EXACT[4], "stall_val_step": 3, "stall_val_score": 0.7}
