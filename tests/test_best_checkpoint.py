"""best.pt: the weights of the best validation so far by the workload's selection score (TaskWorkload:
exact match at --keep-best-at x max-length), kept across --resume, and `asentmax eval --checkpoint best`
(the paper's code tests such a checkpoint: results/paper/README.md)."""

import csv
import json

import pytest
import torch

from asentmax.cli import main
from asentmax.nn import ModelConfig
from asentmax.runs import BEST_NAME, CHECKPOINT_NAME, load_checkpoint
from asentmax.tasks import get_task
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

SCORES = {2: 0.25, 4: 0.75, 6: 0.125, 8: 0.5, 10: 0.75, 12: 0.0}  # validation step -> scripted score


class ScriptedScore(TaskWorkload):
    """The copy workload whose selection score at each validation is SCORES[step] (read from the rows'
    step, which the test passes through the validation rows)."""

    def validate(self, model, *, step, **kwargs):
        return [{**row, "step_seen": step} for row in super().validate(model, step=step, **kwargs)]

    def selection_score(self, rows):
        return SCORES[rows[0]["step_seen"]]


def workload(cls=TaskWorkload, **overrides):
    values = dict(task="copy", min_length=3, max_length=6, val_multipliers=(1, 2), val_samples=4, **overrides)
    return cls(**values)


def configs(**overrides):
    task = get_task("copy")
    model = ModelConfig(vocab_size=task.vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                        attention="asentmax", position="nape")
    fields = dict(steps=12, batch_size=8, lr=3e-3, warmup_steps=3, val_every=2, log_every=2,
                  checkpoint_every=4, seed=5)
    return TrainConfig(**{**fields, **overrides}), model


def test_best_pt_holds_the_weights_of_the_first_best_validation(tmp_path):
    """Scores 0.25, 0.75, 0.125, 0.5, 0.75, 0 at steps 2-12: best.pt is step 4's (the tie at step 10 keeps
    the earlier one), and its weights are those a run stopped at step 4 saves."""
    train_config, model = configs()
    train(workload(ScriptedScore), train_config, model, tmp_path / "full", progress=False)
    best = load_checkpoint(tmp_path / "full" / BEST_NAME)
    assert best["step"] == 4 and best["score"] == 0.75
    train(workload(ScriptedScore), train_config, model, tmp_path / "to4", stop_at_step=4, progress=False)
    reference = load_checkpoint(tmp_path / "to4" / CHECKPOINT_NAME)
    assert reference["step"] == 4
    assert best["model"].keys() == reference["model"].keys()
    for name, weight in reference["model"].items():
        assert torch.equal(best["model"][name], weight), name
    assert load_checkpoint(tmp_path / "full" / CHECKPOINT_NAME)["best"] == {"score": 0.75, "step": 4}


@pytest.mark.parametrize("stop", [3, 5, 9])
def test_best_survives_resume(tmp_path, stop):
    """Stopped at `stop` and resumed: the same best.pt as the uninterrupted run (the best so far is in the
    checkpoint, so a resumed run does not replace step 4's with a worse validation after the stop)."""
    train_config, model = configs(checkpoint_every=1)
    train(workload(ScriptedScore), train_config, model, tmp_path / "full", progress=False)
    train(workload(ScriptedScore), train_config, model, tmp_path / "cut", stop_at_step=stop, progress=False)
    saved = load_checkpoint(tmp_path / "cut" / CHECKPOINT_NAME)
    train(workload(ScriptedScore), train_config, model, tmp_path / "cut", checkpoint=saved, progress=False)
    full, cut = (load_checkpoint(tmp_path / d / BEST_NAME) for d in ("full", "cut"))
    assert (cut["step"], cut["score"]) == (full["step"], full["score"]) == (4, 0.75)
    assert all(torch.equal(cut["model"][k], v) for k, v in full["model"].items())


def test_task_selection_score_is_the_exact_match_then_token_accuracy_at_keep_best_at():
    rows = [{"length": 6, "exact_match": 0.5, "token_accuracy": 0.9},
            {"length": 12, "exact_match": 0.25, "token_accuracy": 0.7}]
    assert workload(keep_best_at=2).selection_score(rows) == (0.25, 0.7)
    assert workload(keep_best_at=1).selection_score(rows) == (0.5, 0.9)
    assert workload().selection_score(rows) is None


TIED = {2: 0.5, 4: 0.625, 6: 0.75, 8: 0.5, 10: 0.75, 12: 0.25}  # validation step -> token accuracy


class TiedExactMatch(TaskWorkload):
    """The copy workload whose validation rows say exact match 0 at every length (a run that never gets a
    long sample right) and token accuracy TIED[step]; its selection score is TaskWorkload's own."""

    def validate(self, model, *, step, **kwargs):
        return [{**row, "exact_match": 0.0, "token_accuracy": TIED[step]}
                for row in super().validate(model, step=step, **kwargs)]


def test_token_accuracy_breaks_ties_of_exact_match(tmp_path):
    """best.pt is the first validation of the highest token accuracy (step 6), not the first validation."""
    train_config, model = configs()
    train(workload(TiedExactMatch, keep_best_at=2), train_config, model, tmp_path / "run", progress=False)
    best = load_checkpoint(tmp_path / "run" / BEST_NAME)
    assert (best["step"], best["score"]) == (6, (0.0, 0.75))


@pytest.mark.parametrize("stop", [3, 7])
def test_a_checkpoint_with_a_number_for_its_best_resumes_with_tuples(tmp_path, stop):
    """A checkpoint saved when scores were numbers (best {"score": 0.0}) resumes under tuple scores: a later
    validation with exact match 0 and any token accuracy ranks above it, a lower exact match never."""
    train_config, model = configs(checkpoint_every=1)
    tied = workload(TiedExactMatch, keep_best_at=2)
    train(tied, train_config, model, tmp_path / "cut", stop_at_step=stop, progress=False)
    saved = load_checkpoint(tmp_path / "cut" / CHECKPOINT_NAME)
    saved["best"] = {"score": 0.0, "step": 2}
    train(tied, train_config, model, tmp_path / "cut", checkpoint=saved, progress=False)
    best = load_checkpoint(tmp_path / "cut" / BEST_NAME)
    later = {s: v for s, v in TIED.items() if s > stop}
    top = max(later.values())
    assert (best["step"], best["score"]) == (min(s for s, v in later.items() if v == top), (0.0, top))


def test_no_best_pt_without_keep_best_at(tmp_path):
    train_config, model = configs()
    train(workload(), train_config, model, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / BEST_NAME).exists()
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)["best"] is None


TINY = ["--task", "copy", "--min-length", "3", "--max-length", "6", "--steps", "8", "--batch-size", "4",
        "--warmup-steps", "2", "--val-every", "2", "--val-samples", "4", "--val-multipliers", "1", "2",
        "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]


def test_cli_keeps_and_evaluates_the_best_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY, "--keep-best-at", "2"]) == 0
    best = load_checkpoint(run / BEST_NAME)
    with open(run / "val.csv") as handle:
        at_12 = [(int(r["step"]), (float(r["exact_match"]), float(r["token_accuracy"])))
                 for r in csv.DictReader(handle) if r["length"] == "12"]
    top = max(score for _, score in at_12)
    assert (best["step"], best["score"]) == next((s, score) for s, score in at_12 if score == top)
    assert main(["eval", str(run), "--checkpoint", "best", "--multipliers", "1", "--samples", "2"]) == 0
    result = json.loads((run / "eval_best.json").read_text())
    assert result["train_step"] == best["step"] and result["eval_config"]["checkpoint"] == "best"
    assert not (run / "eval.json").exists()
    assert main(["compare", str(run / "eval_best.json"), "--output-dir", str(tmp_path / "report")]) == 0
    assert "ours (run, best.pt)" in (tmp_path / "report" / "compare.md").read_text()
    capsys.readouterr()


@pytest.mark.parametrize("case", ["not-a-val-multiplier", "eval-without-best"])
def test_best_checkpoint_misuse_is_one_line(tmp_path, capsys, case):
    run = tmp_path / "run"
    if case == "not-a-val-multiplier":
        assert main(["train", "--run-dir", str(run), *TINY, "--keep-best-at", "4"]) == 2
        expected = "keep-best-at must be 0 or one of the val-multipliers (1 2), got 4"
        assert not run.exists()
    else:
        assert main(["train", "--run-dir", str(run), *TINY]) == 0
        capsys.readouterr()
        assert main(["eval", str(run), "--checkpoint", "best"]) == 2
        expected = f"no {BEST_NAME} in {run}: only a run trained with --keep-best-at keeps one"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err
