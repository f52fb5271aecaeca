"""`asentmax lm prepare | train | eval | compare` end to end on the CPU: the shipped sample corpus, a tiny
model, a few steps (arXiv:2506.16640, section 5 at toy scale), then an exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asentmax.cli import main

pytest.importorskip("tokenizers")

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "asentmax" / "lm" / "sample"


def test_lm_prepare_train_eval_compare(tmp_path, capsys):
    data, run, out = tmp_path / "data", tmp_path / "run", tmp_path / "results"
    assert main(["lm", "prepare", "--text-folder", str(SAMPLE), "--out", str(data), "--vocab-size",
                 "400", "--context", "16", "--test-docs", "2", "--valid-docs", "1"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["splits"]["test"]["documents"] == 2 and manifest["vocab_size"] == 400
    train = ["lm", "train", "--run-dir", str(run), "--data", str(data), "--size", "lm_tiny",
             "--context", "16", "--batch-size", "4", "--warmup-steps", "2", "--val-every", "3",
             "--log-every", "3",
             "--checkpoint-every", "3", "--device", "cpu", "--no-progress", "--retrieval-share", "0"]
    assert main(train + ["--steps", "6"]) == 0
    report = json.loads((run / "lm_train.json").read_text())
    assert report["step"] == 6 and report["windows_seen"] == 24 and report["token_slots_seen"] == 24 * 16
    assert report["epochs"] == pytest.approx(24 / report["train_windows"])
    config = json.loads((run / "config.json").read_text())
    assert config["workload"]["name"] == "lm" and config["model_config"]["vocab_size"] == 400
    assert main(["lm", "train", "--run-dir", str(run), "--resume", "--steps", "8", "--no-progress"]) == 0
    assert main(["lm", "eval", str(run), "--multipliers", "1", "4", "16", "--samples", "1",
                 "--batch-size", "1", "--stats-max-length", "64", "--stats-windows", "1",
                 "--device", "cpu"]) == 0
    result = json.loads((run / "lm_eval.json").read_text())
    assert set(result["perplexity"]) == {"1", "4", "16"}
    assert all(v["tokens"] == 2 * 256 for v in result["perplexity"].values())  # same targets at every length
    assert result["retrieval"]["niah_1"]["16"]["samples"] == 1 and result["step"] == 8
    assert result["retrieval"]["passkey"]["1"]["accuracy"] is None  # 16 tokens hold no passkey prompt
    assert set(result["dispersion"]) == {"1", "4"}
    assert set(result["seconds"]) == {"perplexity", "retrieval", "dispersion"}
    for name in ("lm_eval.md", "perplexity.png", "retrieval.png"):
        assert (run / name).is_file()
    assert main(["lm", "compare", str(run), "--out", str(out)]) == 0
    assert "paper ASEntmax" in (out / "compare.md").read_text()


def test_lm_errors_are_one_line(tmp_path, capsys):
    assert main(["lm", "train", "--run-dir", str(tmp_path / "r"), "--data", str(tmp_path / "none")]) == 2
    assert "asentmax lm prepare" in capsys.readouterr().err
    assert main(["lm", "eval", str(tmp_path / "missing")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
