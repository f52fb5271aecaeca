"""benchmarks/carry_checkpoint.py: a finished run's checkpoint without its resume state, in parts small enough
for the device machine's returned files, joined again and checked by its hash; the joined checkpoint evaluates
as the original and starts --init-from runs with the same weights, and refuses --resume in one line."""

import json
import shutil

import pytest
import torch

from asentmax.cli import main as asentmax
from asentmax.nn import ModelConfig, Transformer
from conftest import load_benchmark
from test_init_from import TINY as TINY_MODEL

carry = load_benchmark("carry_checkpoint")
TINY = [*TINY_MODEL, "--attention", "asentmax"]


@pytest.fixture
def finished(tmp_path, capsys):
    run = tmp_path / "run"
    assert asentmax(["train", "--run-dir", str(run), *TINY, "--steps", "4"]) == 0
    capsys.readouterr()
    return run


def carried_copy(finished, tmp_path, part_mb=0.02, bf16_linear=False):
    parts = tmp_path / "out"
    written = carry.pack(finished, parts, part_mb, bf16_linear)
    assert len(written) >= 3 and all(p.stat().st_size <= part_mb * 1e6 for p in written)
    copy = tmp_path / "copy" / finished.name
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("*.pt"))
    carry.unpack(parts, copy)
    return copy


def test_the_joined_checkpoint_has_the_weights_without_the_resume_state(tmp_path, finished):
    copy = carried_copy(finished, tmp_path)
    original = torch.load(finished / "checkpoint.pt", weights_only=True)
    joined = torch.load(copy / "checkpoint.pt", weights_only=True)
    assert set(joined) == set(original) - set(carry.DROPPED)
    assert joined["model"].keys() == original["model"].keys()
    assert all(torch.equal(joined["model"][k], v) for k, v in original["model"].items())
    assert joined["step"] == original["step"] == 4


def test_it_evaluates_as_the_original_and_starts_init_from_runs(tmp_path, capsys, finished):
    copy = carried_copy(finished, tmp_path)
    flags = ["--multipliers", "1", "2", "--samples", "8", "--no-progress", "--device", "cpu"]
    assert asentmax(["eval", str(finished), *flags]) == 0
    assert asentmax(["eval", str(copy), *flags]) == 0
    capsys.readouterr()
    def untimed_rows(run):  # every result of each length but its wall time
        return [{k: v for k, v in row.items() if "second" not in k}
                for row in json.loads((run / "eval.json").read_text())["rows"]]

    assert untimed_rows(finished) == untimed_rows(copy) and len(untimed_rows(copy)) == 2
    new = tmp_path / "new"
    assert asentmax(["train", "--run-dir", str(new), *TINY, "--steps", "1", "--lr", "1e-9",
                     "--init-from", str(copy)]) == 0
    started = torch.load(new / "checkpoint.pt", weights_only=True)["model"]
    source = torch.load(finished / "checkpoint.pt", weights_only=True)["model"]
    assert max((started[k] - v).abs().max().item() for k, v in source.items()) < 1e-7
    assert asentmax(["train", "--run-dir", str(copy), "--resume", "--steps", "6", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no optimizer state" in err[0], err


def test_misuse_is_one_line(tmp_path, capsys, finished):
    parts = tmp_path / "out"
    carry.pack(finished, parts, 0.02)
    first = sorted(parts.glob("*.part*"))[0]
    first.write_bytes(first.read_bytes()[:-1])  # a part cut short
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "run").mkdir()
    assert carry.main(["unpack", str(parts), str(copy / "run")]) == 2
    assert "do not match its sha256" in capsys.readouterr().err
    assert carry.main(["unpack", str(tmp_path / "nothing"), str(copy / "run")]) == 2
    assert "from pack" in capsys.readouterr().err
    unfinished = tmp_path / "unfinished"
    assert asentmax(["train", "--run-dir", str(unfinished), *TINY, "--steps", "6",
                     "--stop-at-step", "2"]) == 0
    capsys.readouterr()
    assert carry.main(["pack", str(unfinished), str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at step 2 of 6: not finished" in err[0], err
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("tied", [True, False])
def test_bf16_linear_is_exact_under_bf16_autocast(tmp_path, capsys, tied):
    """--bf16-linear stores the nn.Linear weights in bf16 and nothing else (a tied head keeps the embedding's
    fp32): under bf16 autocast the model computes the same logits as the original, bit for bit."""
    run = tmp_path / "run"
    assert asentmax(["train", "--run-dir", str(run), *TINY, "--steps", "4",
                     "--tie-embeddings", str(tied).lower()]) == 0
    capsys.readouterr()
    copy = carried_copy(run, tmp_path, part_mb=0.01, bf16_linear=True)
    original = torch.load(run / "checkpoint.pt", weights_only=True)
    joined = torch.load(copy / "checkpoint.pt", weights_only=True)
    names = carry.linear_weight_names(original["model_config"])
    assert names and ("head.weight" in names) != tied
    for key, value in original["model"].items():
        if key in names:
            assert joined["model"][key].dtype == torch.bfloat16 and value.dtype == torch.float32, key
            assert torch.equal(joined["model"][key], value.to(torch.bfloat16)), key
        else:
            assert torch.equal(joined["model"][key], value), key

    def logits(state, ids):
        model = Transformer(ModelConfig.from_dict(original["model_config"]))
        model.load_state_dict(state)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model.eval()(ids).float()

    vocab = original["model_config"]["vocab_size"]
    ids = torch.randint(0, vocab, (3, 40), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(original["model"], ids), logits(joined["model"], ids))
    assert carry.main(["pack", str(run), str(tmp_path / "cli"), "--bf16-linear"]) == 0
    assert (tmp_path / "cli" / "run.sha256").read_text() == (tmp_path / "out" / "run.sha256").read_text()
