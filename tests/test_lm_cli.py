"""`asentmax lm prepare | train | eval | compare` end to end on the CPU: the shipped sample corpus, a tiny
model, a few steps (arXiv:2506.16640, section 5 at toy scale), then an exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asentmax.cli import main
from asentmax.lm.cli import _load_model

pytest.importorskip("tokenizers")

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "asentmax" / "lm" / "sample"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The sample corpus prepared at vocabulary 400 and context 16 (2 test documents, 1 valid one)."""
    data = tmp_path_factory.mktemp("lm") / "data"
    assert main(["lm", "prepare", "--text-folder", str(SAMPLE), "--out", str(data), "--vocab-size",
                 "400", "--context", "16", "--test-docs", "2", "--valid-docs", "1"]) == 0
    return data


def tiny_train(data: Path, run: Path) -> list[str]:
    """`asentmax lm train` of an lm_tiny model on `data` on the CPU (add --steps)."""
    return ["lm", "train", "--run-dir", str(run), "--data", str(data), "--size", "lm_tiny",
            "--context", "16", "--batch-size", "4", "--warmup-steps", "2", "--val-every", "3",
            "--log-every", "3", "--checkpoint-every", "3", "--device", "cpu", "--no-progress",
            "--retrieval-share", "0"]


def test_lm_prepare_train_eval_compare(data, tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "results"
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["splits"]["test"]["documents"] == 2 and manifest["vocab_size"] == 400
    train = tiny_train(data, run)
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
    assert result["retrieval"]["niah_1"]["16"]["samples"] == 1 and result["train_step"] == 8
    assert result["model_config"] == config["model_config"]  # the results file names the model it scored
    assert result["retrieval"]["passkey"]["1"]["accuracy"] is None  # 16 tokens hold no passkey prompt
    assert set(result["dispersion"]) == {"1", "4"}
    assert set(result["seconds"]) == {"perplexity", "retrieval", "dispersion"}
    assert result["cuda_graph"] is False and result["settings"]["cuda_graphs"] == "auto"  # auto: off on a CPU
    for name in ("lm_eval.md", "perplexity.png", "retrieval.png"):
        assert (run / name).is_file()
    capsys.readouterr()
    assert main(["lm", "eval", str(run), "--device", "cpu", "--cuda-graphs", "on"]) == 2
    refusal = "--cuda-graphs on: cuda_graph=True needs the model and input_ids on a CUDA device\n"
    assert capsys.readouterr().err.endswith(refusal)
    assert main(["lm", "compare", str(run), "--out", str(out)]) == 0
    assert "paper ASEntmax" in (out / "compare.md").read_text()
    # a second run of the same preset and size keeps its own row (the first one's label was overwritten)
    import shutil

    shutil.copytree(run, tmp_path / "seed2")
    assert main(["lm", "compare", str(run), str(tmp_path / "seed2"), "--out", str(out)]) == 0
    table = (out / "compare.md").read_text()
    label = f"{config['workload']['preset']} ({config['workload']['size']})"
    assert f"| {label} |" in table and f"| {label} [seed2] |" in table
    capsys.readouterr()
    assert main(["lm", "compare", str(run), f"{run}/", "--out", str(out)]) == 2
    assert "a run is given twice" in capsys.readouterr().err
    row = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
    assert row.split(" | ")[2] == "8"  # the steps column: the evaluated checkpoint's train_step
    # an lm_eval.json from before the field's name was train_step: one line, not a KeyError
    old_file = tmp_path / "seed2" / "lm_eval.json"
    old_file.write_text(old_file.read_text().replace('"train_step"', '"step"'))
    assert main(["lm", "compare", str(run), str(tmp_path / "seed2"), "--out", str(out)]) == 2
    assert "has no train_step: run `asentmax lm eval` on it again" in capsys.readouterr().err


def test_lm_errors_are_one_line(tmp_path, capsys):
    assert main(["lm", "train", "--run-dir", str(tmp_path / "r"), "--data", str(tmp_path / "none")]) == 2
    assert "asentmax lm prepare" in capsys.readouterr().err
    assert main(["lm", "eval", str(tmp_path / "missing")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_lm_block_options(data, tmp_path, capsys):
    """The block flags of `asentmax train` build the LM (saved in its config, so resume and eval rebuild
    it); the other block options keep the size preset's values."""
    run = tmp_path / "run"
    assert main(tiny_train(data, run) + ["--steps", "3", "--norm-placement", "sandwich", "--mlp", "geglu",
                                         "--norm-eps", "1e-6"]) == 0
    saved = json.loads((run / "config.json").read_text())["model_config"]
    assert (saved["norm_placement"], saved["mlp"], saved["norm_eps"]) == ("sandwich", "geglu", 1e-6)
    assert saved["tie_embeddings"] is False and saved["scale_embeddings"] is False  # lm_tiny's, ModelConfig's
    assert main(["lm", "train", "--run-dir", str(run), "--resume", "--steps", "4", "--no-progress"]) == 0
    model, _, trained = _load_model(run, "cpu")  # eval's loader: the saved config, weights loaded strictly
    assert trained["train_step"] == 4 and model.config.to_dict() == saved
    assert all(block.mlp.kind == "geglu" and None not in (block.attn_post_norm, block.mlp_post_norm)
               for block in model.blocks)
    capsys.readouterr()
    assert main(["lm", "train", "--run-dir", str(run), "--resume", "--steps", "5", "--mlp", "gelu"]) == 2
    assert "drop --mlp" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--mlp", "relu"], "argument --mlp: invalid choice: 'relu'"),
    (["--norm-eps", "0"], "norm_eps must be > 0"),
    (["--scale-embeddings", "maybe"], "expected true or false"),
    (["--val-every", "1", "--stall-val-step", "1", "--stall-val-score", "0.5"], "keeps none"),  # no score
])
def test_lm_bad_block_option_is_one_line(data, tmp_path, capsys, flags, message):
    run = tmp_path / "run"
    assert main(tiny_train(data, run) + ["--steps", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not run.exists()


def test_lm_train_ends_a_stalled_run_as_asentmax_train_does(data, tmp_path, capsys):
    """A stall check that ends the run: its one line on stderr naming the lm resume command, exit code 3
    (runs.STALLED_EXIT), the checkpoint at the stop and lm_train.json written; resumed, it runs to its end."""
    from asentmax.runs import STALLED_EXIT

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_train(data, run) + ["--steps", "9", "--stall-step", "3", "--stall-loss", "1e-9"])
    assert exit_info.value.code == STALLED_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("stalled: no training loss below --stall-loss 1e-09 by step 3 ")
    assert err[-1].endswith(f"asentmax lm train --run-dir {run} --resume")
    assert json.loads((run / "lm_train.json").read_text())["stalled"]["step"] == 3
    assert main(["lm", "train", "--run-dir", str(run), "--resume", "--no-progress"]) == 0
    assert json.loads((run / "lm_train.json").read_text())["step"] == 9
    capsys.readouterr()


def test_a_run_cut_short_is_evaluated_with_a_warning_and_compared_as_cut(data, tmp_path, capsys):
    from asentmax.train import resume_run

    run, out = tmp_path / "run", tmp_path / "results"
    assert main(tiny_train(data, run) + ["--steps", "3"]) == 0
    resume_run(run, steps=9, stop_at_step=6, progress=False)  # planned 9 steps, stopped at 6
    capsys.readouterr()
    assert main(["lm", "eval", str(run), "--multipliers", "1", "--samples", "1", "--batch-size", "1",
                 "--stats-max-length", "16", "--stats-windows", "1", "--tasks", "niah_1", "--device",
                 "cpu"]) == 0
    err = capsys.readouterr().err
    assert "stopped training at step 6 of 9 (cut short)" in err
    assert json.loads((run / "lm_eval.json").read_text())["train_config"]["steps"] == 9
    assert main(["lm", "compare", str(run), "--out", str(out)]) == 0
    assert ", cut at 6 of 9 steps |" in (out / "compare.md").read_text()
    resume_run(run, progress=False)  # trained to its 9 steps: no longer cut
    assert main(["lm", "eval", str(run), "--multipliers", "1", "--samples", "1", "--batch-size", "1",
                 "--stats-max-length", "16", "--stats-windows", "1", "--tasks", "niah_1", "--device",
                 "cpu"]) == 0
    assert "cut short" not in capsys.readouterr().err
    assert main(["lm", "compare", str(run), "--out", str(out)]) == 0
    assert "cut at" not in (out / "compare.md").read_text()


def test_a_run_ended_after_its_escape_is_not_evaluated_or_compared_as_cut(data, tmp_path, capsys):
    """--steps-after-escape 2 with every loss below --stall-loss: the escape at the first log step (3) ends
    the run at step 5 of its 9: finished, so lm eval does not warn and lm compare does not label it."""
    run, out = tmp_path / "run", tmp_path / "results"
    flags = ["--steps", "9", "--stall-loss", "1e9", "--steps-after-escape", "2"]
    assert main(tiny_train(data, run) + flags) == 0
    capsys.readouterr()
    assert main(["lm", "eval", str(run), "--multipliers", "1", "--samples", "1", "--batch-size", "1",
                 "--stats-max-length", "16", "--stats-windows", "1", "--tasks", "niah_1", "--device",
                 "cpu"]) == 0
    assert "cut short" not in capsys.readouterr().err
    result = json.loads((run / "lm_eval.json").read_text())
    assert (result["train_step"], result["escape_step"], result["train_config"]["steps"]) == (5, 3, 9)
    assert main(["lm", "compare", str(run), "--out", str(out)]) == 0
    assert "cut at" not in (out / "compare.md").read_text()
