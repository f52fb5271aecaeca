"""benchmarks/init_probe.py and asentmax.trainer.initial_model: the initial model is the one `asentmax train`
starts from (a step at lr 1e-12 moves no weight past 1e-9) and depends on the seed alone; the AUC agrees with
the rank-sum form of the Mann-Whitney U, ties included; the permutation bound stays below a perfect
separation; an end-to-end run on tiny CPU runs writes one row per seed (a second run of a seed skipped), ranks
the measurements and measures each seed's initial model on its run's validation set; runs of another
recipe, and a validation step val.csv lacks, are refused on one line."""

import json

import pytest
import torch

from asentmax.cli import main as asentmax
from asentmax.data import IGNORE_INDEX, collate
from asentmax.nn import ModelConfig
from asentmax.tasks import get_task, make_eval_set
from asentmax.trainer import initial_model
from conftest import load_benchmark

probe = load_benchmark("init_probe")

TINY_REVERSE = ["--task", "reverse", "--attention", "asentmax", "--min-length", "3", "--max-length", "6",
                "--device", "cpu", "--steps", "1", "--batch-size", "4", "--warmup-steps", "0",
                "--val-every", "1", "--val-multipliers", "1", "2", "--val-samples", "4", "--log-every", "1",
                "--d-model", "32", "--n-layers", "2", "--n-heads", "4", "--d-ff", "64",
                "--asentmax-init", "normal", "--no-progress"]


def tiny_run(path, seed, *extra):
    assert asentmax(["train", "--run-dir", str(path), "--seed", str(seed), "--lr", "1e-12", *TINY_REVERSE,
                     *extra]) == 0
    return path


def test_the_initial_model_is_the_one_train_starts_from(tmp_path):
    run = tiny_run(tmp_path / "run", 5)
    config = json.loads((run / "config.json").read_text())
    trained = torch.load(run / "checkpoint.pt", weights_only=False)["model"]
    model_config = ModelConfig.from_dict(config["model_config"])
    drawn = initial_model(model_config, 5).state_dict()
    assert drawn.keys() == trained.keys()
    for name, weight in trained.items():
        torch.testing.assert_close(drawn[name], weight, rtol=0, atol=1e-9, msg=name)
    other = initial_model(model_config, 6).state_dict()
    assert not torch.equal(other["embed.weight"], drawn["embed.weight"])
    torch.randn(3)  # the generators' state before the draw does not matter
    again = initial_model(model_config, 5).state_dict()
    assert all(torch.equal(again[name], drawn[name]) for name in drawn)


def rank_sum_auc(values, kept):
    """The AUC from the Mann-Whitney U by ranks (average ranks for ties): U = R_kept - n(n + 1)/2."""
    order = sorted(values)
    rank = {v: sum(i + 1 for i, w in enumerate(order) if w == v) / order.count(v) for v in values}
    high = [v for v, k in zip(values, kept, strict=True) if k]
    n_high, n_low = len(high), len(values) - len(high)
    return (sum(rank[v] for v in high) - n_high * (n_high + 1) / 2) / (n_high * n_low)


@pytest.mark.parametrize("values, kept", [
    ([0.3, 0.1, 0.3, 2.0, -1.0, 0.3], [True, False, False, True, False, True]),
    ([1.0, 1.0, 1.0, 1.0], [True, False, True, False]),
    ([5e-9, -3.0, 7.5, 7.5, 1e6, 0.0, 2.0], [False, True, True, False, True, False, False]),
])
def test_auc_agrees_with_the_rank_sum_form(values, kept):
    assert probe.auc(values, kept) == pytest.approx(rank_sum_auc(values, kept), abs=1e-12)


def test_auc_needs_both_kinds_and_orients_by_the_kept_seeds():
    assert probe.auc([1.0, 2.0], [True, True]) is None
    assert probe.auc([3.0, 1.0, 2.0], [True, False, False]) == 1.0
    assert probe.auc([3.0, 1.0, 2.0], [False, True, True]) == 0.0


def test_the_chance_bound_lies_below_a_perfect_separation():
    kept = [True, True, True] + [False] * 9
    features = {"noise": [0.4, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8, 0.3, 0.6, 0.05, 0.95, 0.45]}
    chance = probe.chance_separation(features, kept, 200)
    assert 0 < chance < 0.5  # a perfect separation (|AUC - 0.5| = 0.5) beats what shuffles reach here
    assert probe.chance_separation(features, kept, 200) == chance  # seeded: reproducible
    features["separating"] = [1.0, 1.0, 1.0] + [0.0] * 9
    assert probe.chance_separation(features, kept, 200) >= chance  # more measurements, more chance


def test_the_shuffled_p_of_a_perfect_separation_is_its_share_of_labelings():
    # two kept of six: only the two labelings putting the kept at either end separate perfectly, 2 of C(6, 2)
    values, kept = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [False, False, False, False, True, True]
    assert probe.shuffled_p(values, kept, 3000) == pytest.approx(2 / 15, abs=0.025)
    assert probe.shuffled_p([1.0] * 6, kept, 50) == 1.0  # AUC 0.5: every shuffle is as far


def write_validation(run, step, value_at_12):
    """Replace val.csv by one row at (step, 12 tokens) of exact match value_at_12."""
    (run / "val.csv").write_text(f"step,length,exact_match,token_accuracy\n{step},12,{value_at_12},0.5\n")


def test_end_to_end_one_row_per_seed_and_the_measurements_ranked(tmp_path, capsys):
    runs = []
    for seed, score in ((0, 0.0), (1, 0.5), (2, 0.0), (3, 0.25)):
        run = tiny_run(tmp_path / f"seed{seed}", seed)
        write_validation(run, 1, score)
        runs.append(run)
    again = tiny_run(tmp_path / "seed1_again", 1)
    write_validation(again, 1, 0.0)  # a second run of seed 1: skipped, its label unused
    out = tmp_path / "probe"
    options = ["--label-step", "1", "--label-length", "12", "--multipliers", "1", "2", "--samples", "2",
               "--held-out-from", "2", "--permutations", "20", "--out", str(out)]
    assert probe.main([str(r) for r in [*runs, again]] + options) == 0
    text = (out / "init_probe.md").read_text()
    data = json.loads((out / "init_probe.json").read_text())
    assert [s["seed"] for s in data["seeds"]] == [0, 1, 2, 3]
    assert [s["kept"] for s in data["seeds"]] == [False, True, False, True]
    assert "| 1 | seed1 | 50.0 | yes | not tested |" in text
    assert "| seed1_again |" not in text and text.count("| 1 | seed1") == 1
    measured = data["seeds"][0]["measurements"]
    assert {"support L1H3 2x", "theta L0H0 1x", "loss 2x", "grad norm embed.weight"} <= measured.keys()
    assert measured["theta L0H0 1x"] == 1.0  # NAPE: the first half of the heads are ALiBi, no temperature
    assert measured["theta L0H3 1x"] != 1.0
    supports = [measured[f"support L{layer}H{head} 2x"] for layer in range(2) for head in range(4)]
    assert measured["support mean 2x"] == pytest.approx(sum(supports) / 8, rel=1e-12)
    model_wide = {row["measurement"] for row in data["model_wide"]}
    assert model_wide == {"loss 1x", "loss 2x", "support mean 1x", "support mean 2x", "theta mean 1x",
                          "theta mean 2x"}
    assert "| support mean 2x |" in text
    first = [a["first"] for a in data["auc"]]  # on seeds 0 and 1 only: 0 or 1, sorted by |AUC - 0.5|
    assert set(first) <= {0.0, 0.5, 1.0} and first == sorted(first, key=lambda a: -abs(a - 0.5))
    # the loss is that of the seed's initial model on the run's own validation set (TaskWorkload.validate's)
    config = ModelConfig.from_dict(json.loads((runs[2] / "config.json").read_text())["model_config"])
    task = get_task("reverse")
    batch = collate(task, make_eval_set(task, 6, 2, seed=2 + 1))
    with torch.no_grad():
        logits = initial_model(config, 2).eval()(batch.input_ids)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                                             ignore_index=IGNORE_INDEX)
    assert data["seeds"][2]["measurements"]["loss 1x"] == pytest.approx(float(loss), rel=1e-6)
    assert data["seeds"][3]["measurements"]["loss 1x"] != pytest.approx(float(loss), rel=1e-6)
    capsys.readouterr()


def test_another_recipe_and_a_missing_step_are_refused_on_one_line(tmp_path, capsys):
    first = tiny_run(tmp_path / "a", 0)
    wider = tiny_run(tmp_path / "b", 1, "--alpha", "1.3")
    assert probe.main([str(first), str(wider), "--label-step", "1", "--label-length", "12",
                       "--out", str(tmp_path / "p")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "another model or workload" in error
    assert probe.main([str(first), "--label-step", "7", "--out", str(tmp_path / "p")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "no validation at step 7" in error
    assert probe.main([str(tmp_path), "--out", str(tmp_path / "p")]) == 2
    assert "not a run directory" in capsys.readouterr().err
