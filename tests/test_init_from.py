"""`asentmax train --init-from CHECKPOINT`: a new run starts from another run's weights (its run directory's
checkpoint.pt, or a file such as best.pt) with a fresh optimizer and schedule, and config.json records where
they came from; a different architecture, a missing checkpoint or --resume is refused in one line before
anything is written."""

import json

import pytest
import torch

from asentmax.cli import main

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "0", "--val-every", "0", "--log-every", "1", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
        "--d-ff", "64", "--device", "cpu", "--no-progress"]


def weights(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


@pytest.fixture
def first(tmp_path, capsys):
    run = tmp_path / "first"
    assert main(["train", "--run-dir", str(run), *TINY, "--steps", "5"]) == 0
    capsys.readouterr()
    return run


@pytest.mark.parametrize("source", ["run-dir", "file"])
def test_a_new_run_starts_from_the_weights_with_a_fresh_schedule(tmp_path, capsys, first, source):
    path = first if source == "run-dir" else first / "checkpoint.pt"
    # lr 1e-9: one AdamW step moves each weight by about 1e-9, so the run's weights are the source's
    second = tmp_path / "second"
    assert main(["train", "--run-dir", str(second), *TINY, "--steps", "1", "--lr", "1e-9",
                 "--init-from", str(path)]) == 0
    fresh = tmp_path / "fresh"
    assert main(["train", "--run-dir", str(fresh), *TINY, "--steps", "1", "--lr", "1e-9", "--seed", "7"]) == 0
    capsys.readouterr()
    source_weights, started, drawn = weights(first), weights(second), weights(fresh)
    gap = max((started[name].float() - w.float()).abs().max().item() for name, w in source_weights.items())
    drawn_gap = max((drawn[name].float() - w.float()).abs().max().item()
                    for name, w in source_weights.items())
    assert gap < 1e-7 and drawn_gap > 1e-2
    checkpoint = torch.load(second / "checkpoint.pt", weights_only=False)
    assert checkpoint["step"] == 1  # its own step count, from 0
    assert checkpoint["optimizer"]["state"][0]["step"].item() == 1  # a fresh optimizer: one step of state
    record = json.loads((second / "config.json").read_text())["init_from"]
    assert record["path"] == str(first / "checkpoint.pt") and record["step"] == 5
    assert "init_from" not in json.loads((fresh / "config.json").read_text())


@pytest.mark.parametrize("flags, message", [
    (["--d-model", "64"], "its model differs in d_model (32 there, 64 here)"),
    (["--init-from", "MISSING"], "no checkpoint at"),
    (["--resume"], "--init-from starts a new run"),
])
def test_misuse_is_one_line_and_writes_nothing(tmp_path, capsys, first, flags, message):
    run = tmp_path / "new"
    given = ["--init-from", str(first)] if "--init-from" not in flags else []
    flags = [str(tmp_path / "missing") if f == "MISSING" else f for f in flags]
    tiny = list(TINY)
    if "--d-model" in flags:  # the new run's own --d-model replaces TINY's
        i = tiny.index("--d-model")
        del tiny[i:i + 2]
    assert main(["train", "--run-dir", str(run), *tiny, "--steps", "2", *given, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run.exists()


def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path, capsys):
    bogus = tmp_path / "bogus.pt"
    bogus.write_text("not a checkpoint")
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, "--steps", "2", "--init-from",
                 str(bogus)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--init-from" in err[0] and str(bogus) in err[0]


def run_with(tmp_path, name, *flags):
    run = tmp_path / name
    assert main(["train", "--run-dir", str(run), *TINY, *flags]) == 0
    return run


@pytest.mark.parametrize("source, target", [
    ("softmax", "asentmax"), ("ssmax", "softmax"), ("entmax", "ssmax")])
def test_another_normalisers_weights_start_the_shared_parameters(tmp_path, capsys, source, target):
    """A dense start: e.g. softmax's weights for an ASEntmax run. The parameters both models have come from
    the source; the new normaliser's temperature parameters are those a fresh run of the same seed draws
    (reference init: random, so an init other than the fresh one shows); the source's own temperature
    parameters are left out."""
    first = run_with(tmp_path, "first", "--attention", source, "--steps", "3", "--seed", "3")
    target_flags = ["--attention", target, "--steps", "1", "--lr", "1e-9", "--seed", "7"]
    if target == "asentmax":
        target_flags += ["--asentmax-init", "reference"]
    started = run_with(tmp_path, "started", *target_flags, "--init-from", str(first))
    fresh = run_with(tmp_path, "fresh", *target_flags)
    capsys.readouterr()
    source_weights, started_weights, fresh_weights = weights(first), weights(started), weights(fresh)
    temperature = [name for name in started_weights if ".attn.temperature." in name]
    assert (target == "softmax") == (not temperature)
    assert set(started_weights) == set(fresh_weights)
    def gap(a, b):
        return (a.float() - b.float()).abs().max().item()

    for name, value in started_weights.items():
        assert gap(value, fresh_weights[name] if name in temperature else source_weights[name]) < 1e-7, name
    # the source's weights, not a fresh draw (a fresh draw differs from them: the test can fail)
    assert max(gap(fresh_weights[name], source_weights[name]) for name in started_weights
               if name not in temperature) > 1e-2
    if target == "asentmax":  # the reference init's random weights: not all zero, so not a default
        assert any(started_weights[name].abs().max().item() > 1e-3 for name in temperature)
    record = json.loads((started / "config.json").read_text())["init_from"]
    assert record["attention"] == source
    assert record.get("kept_initial", []) == temperature


@pytest.mark.parametrize("source, flags, message", [
    ("softmax", ["--attention", "asentmax", "--d-model", "64"],
     "its model differs in d_model (32 there, 64 here)"),
    ("entmax", ["--attention", "entmax", "--alpha", "1.3"],
     "its model differs in alpha (1.5 there, 1.3 here)"),
])
def test_only_the_normalisers_own_fields_may_differ(tmp_path, capsys, source, flags, message):
    first = run_with(tmp_path, "first", "--attention", source, "--steps", "2")
    capsys.readouterr()
    tiny = list(TINY)
    if "--d-model" in flags:
        i = tiny.index("--d-model")
        del tiny[i:i + 2]
    run = tmp_path / "new"
    assert main(["train", "--run-dir", str(run), *tiny, "--steps", "2", *flags,
                 "--init-from", str(first)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run.exists()


def test_load_initial_weights_refuses_weights_of_another_shape_of_model():
    from asentmax.nn import ModelConfig, Transformer
    from asentmax.trainer import load_initial_weights

    def tiny(attention, n_layers=1):
        return Transformer(ModelConfig(vocab_size=10, d_model=32, n_layers=n_layers, n_heads=2, d_ff=64,
                                       attention=attention))

    model, deeper = tiny("asentmax"), tiny("softmax", n_layers=2)
    with pytest.raises(ValueError, match=r"initial weights do not fit the model: blocks\.1\."):
        load_initial_weights(model, deeper.state_dict())
    softmax = tiny("softmax")
    kept = load_initial_weights(model, softmax.state_dict())
    assert kept == [name for name in model.state_dict() if ".attn.temperature." in name] and kept
    for name, value in softmax.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_samples_count_the_whole_init_from_chain(tmp_path, capsys, first):
    """first (5 steps) -> second (3 steps) -> third (2 steps), batch 4: compare's samples for third are
    (5 + 3 + 2) x 4, not its own 2 x 4; a run trained from scratch has no prior samples."""
    second, third = tmp_path / "second", tmp_path / "third"
    assert main(["train", "--run-dir", str(second), *TINY, "--steps", "3", "--init-from", str(first)]) == 0
    assert main(["train", "--run-dir", str(third), *TINY, "--steps", "2", "--init-from", str(second)]) == 0
    assert json.loads((third / "config.json").read_text())["init_from"]["samples"] == 8 * 4
    for run in (first, third):
        assert main(["eval", str(run), "--multipliers", "1", "--samples", "4", "--device",
                     "cpu", "--no-progress"]) == 0
    assert main(["compare", str(first / "eval.json"), str(third / "eval.json"), "--output-dir",
                 str(tmp_path / "out")]) == 0
    capsys.readouterr()
    table = (tmp_path / "out" / "compare.md").read_text()
    counts = [line.split(" | ")[3] for line in table.splitlines() if "| ours (" in line]
    assert counts == ["20", "40"]


def test_runs_from_starts_of_one_recipe_are_repeats_whatever_their_length(tmp_path, capsys):
    """A start's length may vary by seed (--steps-after-escape ends it at its own escape step): runs started
    from two starts of one recipe that stopped at different steps are repeats of one recipe in `asentmax
    compare`, while a start with another learning rate makes another recipe. Each run keeps its start's
    configs as prior_recipe (config.json, checkpoints, eval.json; not repeated in init_from), nested along a
    chain, and a resumed run keeps it."""
    from asentmax.runs import load_checkpoint

    starts = {"short": ["--seed", "1", "--stop-at-step", "3"], "long": ["--seed", "2"],
              "other": ["--seed", "3", "--lr", "1e-3"]}
    for name, flags in starts.items():
        assert main(["train", "--run-dir", str(tmp_path / name), *TINY, "--steps", "6", *flags]) == 0
        run = tmp_path / f"from_{name}"
        assert main(["train", "--run-dir", str(run), *TINY, "--steps", "2", "--seed", "5", "--init-from",
                     str(tmp_path / name)]) == 0
        assert main(["eval", str(run), "--multipliers", "1", "--samples", "4", "--device", "cpu",
                     "--no-progress", "--dispersion-samples", "0"]) == 0
    config = json.loads((tmp_path / "from_short" / "config.json").read_text())
    start = json.loads((tmp_path / "short" / "config.json").read_text())
    assert config["prior_recipe"] == {key: start[key] for key in ("train_config", "workload", "model_config",
                                                                  "prior_samples")}
    assert "recipe" not in config["init_from"] and config["init_from"]["step"] == 3
    long_config = json.loads((tmp_path / "from_long" / "config.json").read_text())
    assert (config["prior_samples"], long_config["prior_samples"]) == (3 * 4, 6 * 4)  # two lengths
    evaluation = json.loads((tmp_path / "from_short" / "eval.json").read_text())
    assert evaluation["prior_recipe"] == config["prior_recipe"]
    assert main(["compare", *(str(tmp_path / f"from_{name}") for name in starts), "--output-dir",
                 str(tmp_path / "cmp")]) == 0
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [group["runs"] for group in saved["repeat_groups"]] == [["from_short", "from_long"]]

    chained = tmp_path / "chained"  # from_short's weights: its prior_recipe nests short's
    assert main(["train", "--run-dir", str(chained), *TINY, "--steps", "4", "--stop-at-step", "2",
                 "--init-from", str(tmp_path / "from_short")]) == 0
    assert main(["train", "--run-dir", str(chained), "--resume", "--no-progress"]) == 0
    capsys.readouterr()
    resumed = load_checkpoint(chained / "checkpoint.pt")
    assert resumed["step"] == 4
    def as_saved(record):  # a checkpoint holds tuples where config.json has lists
        return json.loads(json.dumps(record))

    assert as_saved(resumed["prior_recipe"]["prior_recipe"]) == config["prior_recipe"]
    assert as_saved(resumed["prior_recipe"]["train_config"]) == config["train_config"]
