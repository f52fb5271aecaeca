"""benchmarks/head_temperatures.py: capping the key count gives theta = delta + beta log(min(n, N) + 1)^gamma
in fp64 and is undone on leaving, and so does scaling it (log(F n + 1)); dropping heads equals zeroing their
columns of the output projection, and is undone on leaving; the per-head statistics agree with `asentmax
eval`'s dispersion at the answer queries and with theta's minimum and maximum over every query; an end-to-end
run on a tiny CPU run agrees with `asentmax eval`'s exact match (a cap above the longest sequence or a key
factor of 1 changes nothing); bad input is refused on one line."""

import json

import pytest
import torch

from asentmax.cli import main as asentmax
from asentmax.data import IGNORE_INDEX, collate
from asentmax.nn import ModelConfig, Transformer
from asentmax.tasks import get_task, make_eval_set
from conftest import load_benchmark

heads = load_benchmark("head_temperatures")

TINY_REVERSE = ["--task", "reverse", "--attention", "asentmax", "--min-length", "3", "--max-length", "6",
                "--device", "cpu", "--steps", "3", "--batch-size", "4", "--warmup-steps", "1",
                "--val-every", "0", "--log-every", "1", "--d-model", "32", "--n-layers", "2",
                "--n-heads", "4", "--d-ff", "64", "--asentmax-init", "normal", "--init-std", "0.5",
                "--seed", "3", "--no-progress"]


def tiny_model(attention="asentmax") -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=get_task("reverse").vocab_size, d_model=32, n_layers=2, n_heads=4,
                         d_ff=64, attention=attention, asentmax_init="normal", init_std=0.5)
    return Transformer(config).double().eval()


def reverse_batch(length=9, n=3):
    task = get_task("reverse")
    return task, make_eval_set(task, length, n, 7)


# (the probe's context manager, the key counts it should give theta): caps and factors
KEY_COUNT_CHANGES = {
    "cap 1": (lambda model: heads.capped_key_counts(model, 1), lambda n: n.clamp(max=1)),
    "cap 4": (lambda model: heads.capped_key_counts(model, 4), lambda n: n.clamp(max=4)),
    "factor 0.5": (lambda model: heads.scaled_key_counts(model, 0.5), lambda n: 0.5 * n),
    "factor 4": (lambda model: heads.scaled_key_counts(model, 4.0), lambda n: 4.0 * n),
}


@pytest.mark.parametrize("change", KEY_COUNT_CHANGES)
def test_changed_key_counts_give_the_closed_form_theta_and_are_undone(change):
    probe, counts = KEY_COUNT_CHANGES[change]
    model = tiny_model()
    task, examples = reverse_batch()
    ids = collate(task, examples).input_ids
    _, trained = model(ids, return_stats=True)
    x = torch.randn(2, ids.shape[1], 32, dtype=torch.float64)
    n_keys = torch.arange(1, ids.shape[1] + 1)[None].expand(2, -1)
    for block in model.blocks:
        temperature = block.attn.temperature
        with probe(model):
            theta = temperature(x, n_keys)
        beta, gamma = temperature.beta_gamma(x)
        expected = temperature.delta + beta * torch.log(counts(n_keys).double() + 1)[:, None] ** gamma
        m = beta.shape[1]
        torch.testing.assert_close(theta[:, -m:], expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(theta[:, :-m], torch.ones_like(theta[:, :-m]))  # the ALiBi heads: no temperature
        assert not torch.allclose(theta[:, -m:], temperature(x, n_keys)[:, -m:])  # it changed theta
    _, after = model(ids, return_stats=True)
    for before_layer, after_layer in zip(trained, after, strict=True):  # the trained forward is back
        torch.testing.assert_close(before_layer.theta, after_layer.theta, rtol=0, atol=0, equal_nan=True)


def test_dropped_heads_equal_a_model_without_their_output_columns_and_are_undone():
    model = tiny_model()
    task, examples = reverse_batch()
    ids = collate(task, examples).input_ids
    trained = model(ids)
    heads_to_drop = [(0, 1), (0, 3), (1, 2)]
    with heads.dropped_heads(model, heads_to_drop):
        dropped = model(ids)
    oracle = tiny_model()
    width = oracle.config.head_dim
    with torch.no_grad():
        for layer, head in heads_to_drop:
            oracle.blocks[layer].attn.wo.weight[:, head * width:(head + 1) * width] = 0
    torch.testing.assert_close(dropped, oracle(ids), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(dropped, trained)
    torch.testing.assert_close(model(ids), trained, rtol=0, atol=0)  # the hooks are gone


def test_head_specs_are_parsed_and_checked_against_the_model():
    assert heads.parse_heads(["0.4", "1.7"], 2, 8) == [(0, 4), (1, 7)]
    for bad in ("2.0", "0.8", "0", "a.b", "-1.2"):
        with pytest.raises(ValueError, match="is not LAYER.HEAD of this model"):
            heads.parse_heads([bad], 2, 8)


@pytest.mark.parametrize("attention", ["asentmax", "ssmax"])
def test_head_statistics_agree_with_the_evaluations_dispersion(attention):
    from asentmax.eval import answer_dispersion

    model = tiny_model(attention)
    task, examples = reverse_batch(length=11, n=4)
    layers = heads.head_statistics(model, task, examples, torch.device("cpu"))
    dispersion = answer_dispersion(model, task, examples, device=torch.device("cpu"))
    assert len(layers) == 2
    per_head = zip(layers, dispersion["theta_per_head"], dispersion["support_size_per_head"], strict=True)
    for layer, theta, support in per_head:  # both average fp32 values, in another order: fp32's precision
        assert layer["theta_at_answers"] == pytest.approx(theta, rel=1e-6)
        assert layer["support_at_answers"] == pytest.approx(support, rel=1e-6)
        for low, mean, high in zip(layer["theta_min"], layer["theta_mean"], layer["theta_max"], strict=True):
            assert low <= mean <= high
    batch = collate(task, examples)
    _, stats = model(batch.input_ids, return_stats=True)
    real = batch.input_ids.shape[1]  # no padded query: every query counts
    assert batch.labels.ne(IGNORE_INDEX).sum() < batch.labels.numel() == real * len(examples)
    for layer, layer_stats in zip(layers, stats, strict=True):
        theta = layer_stats.theta.transpose(1, 2).reshape(-1, 4)
        assert layer["theta_max"] == pytest.approx(theta.max(0).values.tolist(), rel=1e-6)
        assert layer["theta_min"] == pytest.approx(theta.min(0).values.tolist(), rel=1e-6)


def test_end_to_end_agrees_with_asentmax_eval(tmp_path, capsys, one_thread):
    run, out = tmp_path / "run", tmp_path / "out"
    assert asentmax(["train", "--run-dir", str(run), *TINY_REVERSE]) == 0
    assert asentmax(["eval", str(run), "--multipliers", "1", "2", "--samples", "6", "--device", "cpu",
                     "--no-progress"]) == 0
    evaluated = {row["length"]: row for row in json.loads((run / "eval.json").read_text())["rows"]}
    assert heads.main([str(run), "--multipliers", "1", "2", "--samples", "6", "--stats-samples", "3",
                       "--cap", "1000", "--key-factor", "1", "--drop-heads", "1.0", "--device", "cpu",
                       "--out", str(out)]) == 0
    result = json.loads((out / "head_temperatures.json").read_text())
    assert result["command"].startswith("PYTHONPATH=src python benchmarks/head_temperatures.py ")
    assert result["checkpoint_step"] == 3 and result["cap"] == 1000 and result["dropped_heads"] == ["1.0"]
    assert result["key_factor"] == 1
    assert [row["length"] for row in result["rows"]] == sorted(evaluated)
    for row in result["rows"]:
        assert row["exact_match"] == evaluated[row["length"]]["exact_match"] == row["exact_match_capped"] \
            == row["exact_match_scaled"]  # neither a cap above every n_i nor a factor of 1 changes anything
        assert 0 <= row["exact_match_dropped"] <= 1
        assert len(row["layers"]) == 2 and all(len(layer["theta_mean"]) == 4 for layer in row["layers"])
        assert row["exact_match_capped_changed"] == row["exact_match_scaled_changed"] == 0
        moved = round(abs(row["exact_match_dropped"] - row["exact_match"]) * 6)  # of the 6 samples
        assert moved <= row["exact_match_dropped_changed"] <= 6
    text = (out / "head_temperatures.md").read_text()
    assert ("| length | exact match % | theta from at most 1000 keys | theta from 1 x n keys | heads 1.0 "
            "dropped |") in text
    capsys.readouterr()


@pytest.mark.parametrize("conditions, header", [
    ([], "| length | exact match % |"),
    (["--cap", "3"], "| length | exact match % | theta from at most 3 keys |"),
    (["--key-factor", "2"], "| length | exact match % | theta from 2 x n keys |"),
    (["--drop-heads", "0.1", "1.2"], "| length | exact match % | heads 0.1 1.2 dropped |")])
def test_any_subset_of_the_conditions_is_reported(tmp_path, capsys, conditions, header):
    run, out = tmp_path / "run", tmp_path / "out"
    assert asentmax(["train", "--run-dir", str(run), *TINY_REVERSE]) == 0
    assert heads.main([str(run), "--multipliers", "1", "--samples", "2", "--stats-samples", "1", "--device",
                       "cpu", *conditions, "--out", str(out)]) == 0
    assert f"\n{header}\n|---|---|{'---|' * (header.count('|') - 3)}\n" in (
        out / "head_temperatures.md").read_text()
    named = header.split("|")[3:-1]  # the condition's column, none without one
    assert all(f", {name.strip()} 0.0 % (0 changed)" in capsys.readouterr().err for name in named)


def test_each_condition_counts_the_samples_whose_answer_changed(tmp_path, capsys, monkeypatch):
    """Equal exact match with different samples right is counted as changed: the counts compare
    exact_by_sample with the run's as trained, sample by sample."""
    run, out = tmp_path / "run", tmp_path / "out"
    assert asentmax(["train", "--run-dir", str(run), *TINY_REVERSE]) == 0
    # as trained, capped, scaled, heads dropped
    by_condition = iter([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]])

    def decoded(*args, **kwargs):
        exact = next(by_condition)
        return {"exact_match": sum(exact) / len(exact), "exact_by_sample": exact}

    monkeypatch.setattr(heads, "greedy_accuracy", decoded)
    assert heads.main([str(run), "--multipliers", "1", "--samples", "4", "--cap", "2", "--key-factor", "2",
                       "--drop-heads", "0.0", "--device", "cpu", "--out", str(out)]) == 0
    [row] = json.loads((out / "head_temperatures.json").read_text())["rows"]
    assert (row["exact_match"], row["exact_match_capped"], row["exact_match_scaled"]) == (0.5, 0.5, 0.5)
    assert (row["exact_match_capped_changed"], row["exact_match_scaled_changed"],
            row["exact_match_dropped_changed"]) == (2, 0, 3)
    assert "| 50.0 | 50.0 (2 changed) | 50.0 (0 changed) | 25.0 (3 changed) |" in (
        out / "head_temperatures.md").read_text()
    assert "theta from at most 2 keys 50.0 % (2 changed)" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [(["--cap", "0"], "--cap must be"),
                                            (["--stats-samples", "0"], "--stats-samples must be"),
                                            (["--key-factor", "0"], "--key-factor must be"),
                                            (["--key-factor", "nan"], "--key-factor must be"),
                                            (["--drop-heads", "2.0"], "is not LAYER.HEAD"),
                                            ([], "does not exist")])
def test_bad_input_is_refused_on_one_line(tmp_path, capsys, flags, message):
    run = tmp_path / ("run" if flags else "missing")
    if flags:
        assert asentmax(["train", "--run-dir", str(run), *TINY_REVERSE]) == 0
        capsys.readouterr()
    assert heads.main([str(run), "--device", "cpu", *flags, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("head_temperatures: error: ")
    assert message in err
    assert not (tmp_path / "out").exists()
