"""`asentmax train --init-from CHECKPOINT --init-fresh PATTERN...`: the parameters of the start's weights
whose names match a pattern are not loaded but keep the run's own draw from --seed (e.g. an ASEntmax run from
softmax's weights that learns its own queries and keys); config.json's init_from lists them as "fresh", and
the run's prior_recipe keeps them as "fresh_parameters", so `asentmax compare` counts such a run in a recipe
of its own. Misuse is one line, exit 2, before anything is written."""

import json
from dataclasses import asdict

import pytest
import torch

from asentmax import report, trainer
from asentmax.cli import main
from asentmax.nn import ModelConfig
from asentmax.runs import load_checkpoint
from asentmax.tasks.workload import TaskWorkload

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "0", "--val-every", "0", "--log-every", "1", "--d-model", "32", "--n-layers", "2", "--n-heads", "2",
        "--d-ff", "64", "--device", "cpu", "--no-progress"]
QUERIES = ["blocks.0.attn.wq.weight", "blocks.1.attn.wq.weight"]


@pytest.fixture
def first(tmp_path, capsys):
    """A softmax run of seed 3, 3 steps: the start."""
    run = tmp_path / "first"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", "softmax", "--steps", "3",
                 "--seed", "3"]) == 0
    capsys.readouterr()
    return run


@pytest.fixture
def step0(monkeypatch):
    """The weights each run of the test starts from: the model's state right after load_initial_weights
    (step 0 of the run, before any update), in order."""
    seen = []
    load = trainer.load_initial_weights

    def spy(model, weights, fresh=()):
        kept = load(model, weights, fresh)
        seen.append({name: value.detach().clone() for name, value in model.state_dict().items()})
        return kept

    monkeypatch.setattr(trainer, "load_initial_weights", spy)
    return seen


def started(tmp_path, name, first, *flags):
    """A 2-step ASEntmax run of seed 7 from `first`'s weights, and its config.json."""
    run = tmp_path / name
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", "asentmax", "--steps", "2",
                 "--seed", "7", "--init-from", str(first), *flags]) == 0
    return run, json.loads((run / "config.json").read_text())


def test_matched_parameters_keep_the_runs_own_draw_and_the_rest_come_from_the_start(tmp_path, capsys, first,
                                                                                     step0):
    run, config = started(tmp_path, "fresh", first, "--init-fresh", "*.attn.wq.*")
    capsys.readouterr()
    source = load_checkpoint(first / "checkpoint.pt")["model"]
    drawn = trainer.initial_model(ModelConfig.from_dict(config["model_config"]), 7).state_dict()
    (weights,) = step0
    temperature = [name for name in weights if ".attn.temperature." in name]
    assert temperature and set(weights) == set(source) | set(temperature)
    for name, value in weights.items():
        expected = drawn[name] if name in QUERIES or name in temperature else source[name]
        assert torch.equal(value, expected), name
    # the draw differs from the start's weights, so a query projection loaded anyway shows
    assert all(not torch.equal(drawn[name], source[name]) for name in QUERIES)
    record = config["init_from"]
    assert record["fresh"] == QUERIES and record["kept_initial"] == temperature
    assert config["prior_recipe"]["fresh_parameters"] == QUERIES
    assert load_checkpoint(run / "checkpoint.pt")["prior_recipe"]["fresh_parameters"] == QUERIES


@pytest.fixture
def tied(tmp_path, capsys):
    """A softmax run of seed 3, 3 steps, whose head shares the embedding's tensor."""
    run = tmp_path / "tied"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", "softmax", "--steps", "3",
                 "--seed", "3", "--tie-embeddings", "true"]) == 0
    capsys.readouterr()
    return run


def test_a_tied_head_is_taken_fresh_with_the_embedding(tmp_path, capsys, tied, step0):
    _, config = started(tmp_path, "fresh", tied, "--tie-embeddings", "true", "--init-fresh", "embed.*",
                        "*.attn.wk.*")
    capsys.readouterr()
    drawn = trainer.initial_model(ModelConfig.from_dict(config["model_config"]), 7).state_dict()
    fresh = ["blocks.0.attn.wk.weight", "blocks.1.attn.wk.weight", "embed.weight", "head.weight"]
    assert config["init_from"]["fresh"] == fresh
    assert all(torch.equal(step0[0][name], drawn[name]) for name in fresh)


def test_load_initial_weights_refuses_to_load_a_tensor_tied_to_a_fresh_one(first, tied):
    source = load_checkpoint(tied / "checkpoint.pt")
    model = trainer.initial_model(ModelConfig.from_dict(source["model_config"]), 7)
    with pytest.raises(ValueError, match="head.weight shares its tensor with a fresh parameter"):
        trainer.load_initial_weights(model, source["model"], ["embed.weight"])
    source = load_checkpoint(first / "checkpoint.pt")
    model = trainer.initial_model(ModelConfig.from_dict(source["model_config"]), 7)
    # a fresh name the weights lack is no error; any other missing name still is
    weights = {name: value for name, value in source["model"].items() if name not in QUERIES}
    assert trainer.load_initial_weights(model, weights, QUERIES) == []
    with pytest.raises(ValueError, match="do not fit the model: blocks.0.attn.wq.weight"):
        trainer.load_initial_weights(model, weights, QUERIES[1:])


def test_fresh_parameters_make_a_recipe_of_their_own(tmp_path, capsys, first):
    """Runs of one seed from one start, with and without --init-fresh, get different recipe keys; the run
    without it keeps the key of a record without fresh parameters (as before --init-fresh existed), and so
    does a record that keeps fresh_parameters without naming any."""
    plain_dir, plain = started(tmp_path, "plain", first)
    fresh_dir, fresh = started(tmp_path, "fresh", first, "--init-fresh", "*.attn.wq.*")
    assert main(["eval", str(fresh_dir), "--multipliers", "1", "--samples", "4", "--device", "cpu",
                 "--no-progress", "--dispersion-samples", "0"]) == 0
    capsys.readouterr()
    assert "fresh" not in plain["init_from"] and "fresh_parameters" not in plain["prior_recipe"]
    assert json.loads((fresh_dir / "eval.json").read_text())["prior_recipe"] == fresh["prior_recipe"]

    def record(config):
        return {"task": "reverse", **config}

    plain_key, fresh_key = report._recipe(record(plain)), report._recipe(record(fresh))
    assert plain_key is not None and fresh_key is not None and plain_key != fresh_key
    # the key built by hand, as _recipe built it before fresh parameters existed
    train_config = {name: value for name, value in plain["train_config"].items()
                    if name not in report.NOT_RECIPE["train_config"]}
    workload = {name: value for name, value in asdict(TaskWorkload.from_dict(plain["workload"])).items()
                if name not in report.NOT_RECIPE["workload"]}
    start = report._recipe({"task": "reverse", **plain["prior_recipe"]})
    model = asdict(ModelConfig.from_dict(plain["model_config"]))
    assert plain_key == json.dumps(["reverse", model, workload, train_config, start], sort_keys=True,
                                   default=str)
    assert json.loads(fresh_key) == json.loads(plain_key) + [QUERIES]
    unnamed = {**fresh, "prior_recipe": {**fresh["prior_recipe"], "fresh_parameters": []}}
    assert report._recipe(record(unnamed)) == plain_key


@pytest.mark.parametrize("flags, message", [
    (["--init-fresh", "*.attn.wq.*"], "--init-fresh names parameters of the --init-from weights; give "
     "--init-from too"),
    (["--init-from", "FIRST", "--init-fresh", "*.attn.wq.*", "*.attn.query.*"],
     "--init-fresh '*.attn.query.*' matches no parameter of FIRST/checkpoint.pt (its names are like "
     "embed.weight, blocks.0.attn_norm.weight, blocks.0.attn.wq.weight)"),
    (["--init-from", "FIRST", "--init-fresh", "*.weight"],
     "--init-fresh *.weight takes every parameter of FIRST/checkpoint.pt; train without --init-from "
     "instead"),
    (["--init-from", "FIRST", "--init-fresh", "blocks.*", "embed.*", "norm.*", "head.*"],
     "takes every parameter of FIRST/checkpoint.pt"),
    # an SSMax start for an ASEntmax run: its s is never loaded, so taking the rest takes all
    (["--init-from", "SSMAX", "--init-fresh", "embed.*", "head.*", "norm.*", "*.wq.*", "*.wk.*", "*.wv.*",
      "*.wo.*", "*_norm.*", "*.mlp.*"], "takes every parameter of SSMAX/checkpoint.pt"),
])
def test_misuse_is_one_line_and_writes_nothing(tmp_path, capsys, first, flags, message):
    run, ssmax = tmp_path / "new", tmp_path / "ssmax"
    if "SSMAX" in flags:
        assert main(["train", "--run-dir", str(ssmax), *TINY, "--attention", "ssmax", "--steps", "1"]) == 0
        capsys.readouterr()
    flags = [{"FIRST": str(first), "SSMAX": str(ssmax)}.get(flag, flag) for flag in flags]
    command = ["train", "--run-dir", str(run), *TINY, "--attention", "asentmax", "--steps", "2", *flags]
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.replace("FIRST", str(first)).replace("SSMAX", str(ssmax)) in err[0], err
    assert "Traceback" not in err[0] and not run.exists()


def test_compare_labels_a_fresh_start_and_a_run_started_from_it_keeps_the_names(tmp_path, capsys, first):
    """method_label names the fresh parameters without their block prefix (the plain run's label has no such
    note), and a run started from the fresh run's weights nests its fresh_parameters in its own prior_recipe,
    so its recipe key differs from that of a run started from the plain run's weights."""
    plain_dir, plain = started(tmp_path, "plain", first)
    fresh_dir, fresh = started(tmp_path, "fresh", first, "--init-fresh", "*.attn.wq.*", "*.attn.wk.*")
    assert report.method_label(plain) == "ASEntmax (paper-code blocks)"  # the reverse preset's blocks
    assert report.method_label(fresh) == "ASEntmax (paper-code blocks, fresh attn.wk.weight/attn.wq.weight)"
    after_plain = started(tmp_path, "after_plain", plain_dir)[1]
    after_fresh = started(tmp_path, "after_fresh", fresh_dir)[1]
    assert after_fresh["prior_recipe"]["prior_recipe"]["fresh_parameters"] == sorted(
        [*QUERIES, "blocks.0.attn.wk.weight", "blocks.1.attn.wk.weight"])
    assert "fresh" not in report.method_label(after_fresh)  # it drew nothing afresh itself
    keys = [report._recipe({"task": "reverse", **config}) for config in (after_plain, after_fresh)]
    assert None not in keys and keys[0] != keys[1]
