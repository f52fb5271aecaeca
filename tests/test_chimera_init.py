"""benchmarks/chimera_init.py: the checkpoint holds the donor seed's initial tensors under the given prefixes
(and its token embedding rows of the given token ids) and the base seed's elsewhere; `asentmax train
--init-from` starts from it (a step at lr 1e-12 moves no weight past 1e-9) and counts no prior samples; a
prefix naming nothing, prefixes taking everything, a token outside the vocabulary, rows of an embedding taken
whole and a call taking nothing are refused on one line."""

import json

import torch

from asentmax.cli import main as asentmax
from asentmax.nn import ModelConfig
from asentmax.trainer import initial_model
from conftest import load_benchmark

chimera = load_benchmark("chimera_init")

TINY_REVERSE = ["--task", "reverse", "--attention", "asentmax", "--min-length", "3", "--max-length", "6",
                "--device", "cpu", "--steps", "1", "--batch-size", "4", "--warmup-steps", "0",
                "--val-every", "0", "--log-every", "1", "--d-model", "32", "--n-layers", "3",
                "--n-heads", "4", "--d-ff", "64", "--asentmax-init", "normal", "--no-progress",
                "--lr", "1e-12"]


def test_a_chimera_starts_a_run_with_the_donors_tensors_where_asked(tmp_path, capsys):
    source = tmp_path / "source"
    assert asentmax(["train", "--run-dir", str(source), "--seed", "0", *TINY_REVERSE]) == 0
    start = tmp_path / "start.pt"
    assert chimera.main([str(source), "--base-seed", "8", "--donor-seed", "1", "--from-donor", "embed.",
                         "blocks.1.", "--out", str(start)]) == 0
    run = tmp_path / "run"
    assert asentmax(["train", "--run-dir", str(run), "--seed", "8", "--init-from", str(start),
                     *TINY_REVERSE]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["prior_samples"] == 0
    model_config = ModelConfig.from_dict(config["model_config"])
    base = initial_model(model_config, 8).state_dict()
    donor = initial_model(model_config, 1).state_dict()
    trained = torch.load(run / "checkpoint.pt", weights_only=False)["model"]
    taken = 0
    for name, weight in trained.items():
        expected = donor if name.startswith(("embed.", "blocks.1.")) else base
        taken += expected is donor
        torch.testing.assert_close(weight, expected[name], rtol=0, atol=1e-9, msg=name)
    assert taken == 1 + sum(name.startswith("blocks.1.") for name in base)
    # where base and donor differ, the two inits are far apart: the comparison above could fail
    assert (base["blocks.1.attn.wq.weight"] - donor["blocks.1.attn.wq.weight"]).abs().max() > 1e-3
    capsys.readouterr()


def test_token_embedding_rows_come_from_the_donor_and_nothing_else(tmp_path, capsys):
    source = tmp_path / "source"
    assert asentmax(["train", "--run-dir", str(source), "--seed", "0", *TINY_REVERSE]) == 0
    start = tmp_path / "start.pt"
    tokens = [2, 3, 7]
    assert chimera.main([str(source), "--base-seed", "1", "--donor-seed", "8", "--donor-embedding-tokens",
                         *map(str, tokens), "--out", str(start)]) == 0
    assert "0 of" in capsys.readouterr().out
    saved = torch.load(start, weights_only=False)
    model_config = ModelConfig.from_dict(saved["model_config"])
    base = initial_model(model_config, 1).state_dict()
    donor = initial_model(model_config, 8).state_dict()
    assert saved["chimera"]["donor_embedding_tokens"] == tokens
    for name, weight in saved["model"].items():
        if name != "embed.weight":
            torch.testing.assert_close(weight, base[name], rtol=0, atol=0, msg=name)
    embedding = saved["model"]["embed.weight"]
    for token in range(embedding.shape[0]):
        expected = (donor if token in tokens else base)["embed.weight"][token]
        torch.testing.assert_close(embedding[token], expected, rtol=0, atol=0, msg=str(token))
    # the two seeds' rows differ, so the comparison above could fail
    assert (base["embed.weight"][tokens] - donor["embed.weight"][tokens]).abs().min() > 0


def test_prefixes_naming_nothing_or_everything_are_refused_on_one_line(tmp_path, capsys):
    source = tmp_path / "source"
    assert asentmax(["train", "--run-dir", str(source), "--seed", "0", *TINY_REVERSE]) == 0
    capsys.readouterr()
    out = str(tmp_path / "x.pt")
    assert chimera.main([str(source), "--base-seed", "8", "--donor-seed", "1", "--from-donor", "emb.",
                         "--out", out]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "'emb.' names no parameter" in error and "embed." in error
    assert chimera.main([str(source), "--base-seed", "8", "--donor-seed", "1", "--from-donor", "embed.",
                         "blocks.", "head.", "norm.", "--out", out]) == 2
    assert "takes every parameter" in capsys.readouterr().err
    assert chimera.main([str(tmp_path / "nowhere"), "--base-seed", "8", "--donor-seed", "1", "--from-donor",
                         "embed.", "--out", out]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    vocab = str(ModelConfig.from_dict(json.loads((source / "config.json").read_text())["model_config"])
                .vocab_size)
    for flags, message in ((["--donor-embedding-tokens", "1", vocab], f"{vocab} is outside the vocabulary"),
                           (["--donor-embedding-tokens", "-1"], "-1 is outside the vocabulary"),
                           (["--from-donor", "embed.", "--donor-embedding-tokens", "1"], "taken whole"),
                           ([], "nothing is taken")):
        assert chimera.main([str(source), "--base-seed", "8", "--donor-seed", "1", *flags, "--out", out]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and message in error, error
    assert not (tmp_path / "x.pt").exists()
