"""The `asentmax` command line (asentmax.cli): --help everywhere, train -> eval -> compare end to end on
a tiny config (with stop and --resume), and argument errors: one line on stderr, exit 2, nothing written."""

import json
import subprocess
import sys

import pytest
import torch

from asentmax.cli import main

TINY = ["--task", "copy", "--min-length", "3", "--max-length", "6", "--steps", "8", "--batch-size", "4",
        "--warmup-steps", "2", "--val-every", "4", "--val-samples", "2", "--log-every", "2",
        "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["compare"], ["demo"]])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: asentmax")
    if command == ["train"]:
        for flag in ("--preset", "--attention", "--position", "--max-length", "--lr", "--resume",
                     "--overwrite"):
            assert flag in out
        assert "peak learning rate" in out  # help text from the dataclass field


def test_eval_help_lists_the_values_of_fixed_choice_options(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    for shown in ("--checkpoint {last,best}", "--tables {train,fresh}", "--device {auto,cpu,cuda}",
                  "--amp {auto,bf16,off}", "--attention-backend {auto,"):
        assert shown in usage, usage
    assert main(["eval", "run", "--checkpoint", "newest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'newest' (choose from 'last', 'best')" in err, err


def test_python_dash_m_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "asentmax", "eval", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "--multipliers" in result.stdout


def test_ctrl_c_while_starting_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C that lands before the training loop handles it (importing torch, building the model) ends
    with one line and exit 130, where a KeyboardInterrupt traceback came out. In process: a signal sent to a
    child at a chosen moment was order-dependent in the full suite."""
    import asentmax.trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(asentmax.trainer, "train", interrupted)
    assert main(["train", "--run-dir", str(tmp_path / "run"), *TINY]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "asentmax train: interrupted"


def test_train_eval_compare_end_to_end(tmp_path, capsys):
    runs = {}
    for attention in ("softmax", "asentmax"):
        run = runs[attention] = tmp_path / attention
        assert main(["train", "--run-dir", str(run), *TINY, "--attention", attention,
                     "--stop-at-step", "5"]) == 0
        assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 5
        assert main(["train", "--run-dir", str(run), "--resume", "--no-progress"]) == 0
        saved = json.loads((run / "config.json").read_text())
        assert saved["model_config"]["attention"] == attention and saved["train_config"]["steps"] == 8
        assert saved["git_commit"] and saved["device"].startswith("cpu")
        assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 8
        assert main(["eval", str(run), "--multipliers", "1", "2", "--samples", "3",
                     "--dispersion-samples", "2"]) == 0
        result = json.loads((run / "eval.json").read_text())
        assert [row["length"] for row in result["rows"]] == [6, 12]
        for row in result["rows"]:
            assert row["n"] == 3 and 0 <= row["exact_match"] <= 1 and "dispersion" in row
        assert result["train_step"] == 8 and (run / "eval.md").is_file()
    out_dir = tmp_path / "report"
    assert main(["compare", str(runs["softmax"]), str(runs["asentmax"]), "--output-dir", str(out_dir)]) == 0
    table = (out_dir / "compare.md").read_text()
    # 8 steps x batch 4; 3 test samples; the copy preset is built from the paper code's blocks
    assert "| copy | Softmax (paper-code blocks) | ours (softmax) | 32 | 3 |" in table
    assert "| copy | ASEntmax | paper | 20M | 1,000 | 100.0 | 100.0 |" in table
    for name in ("accuracy.png", "dispersion.png", "compare.json"):
        assert (out_dir / name).stat().st_size > 0
    assert "| task | method | source | samples | test n | ID | 2x |" in capsys.readouterr().out


def _existing_run(tmp_path):
    run = tmp_path / "existing"
    run.mkdir()
    (run / "config.json").write_text("keep me")
    return run


@pytest.mark.parametrize("case", [
    "unknown-task", "min-above-max", "too-short-for-task", "bad-model", "existing-run-dir", "resume-missing",
    "resume-with-flags", "eval-missing-checkpoint", "eval-fractional-length", "compare-not-evaluated",
    "unknown-command", "bad-multiplier", "alpha-above-range", "negative-seed"])
def test_argument_errors_exit_2_with_one_line(case, tmp_path, capsys):
    existing = _existing_run(tmp_path)
    new = str(tmp_path / "new")
    argv = {
        "unknown-task": ["train", "--run-dir", new, "--task", "juggle"],
        "min-above-max": ["train", "--run-dir", new, "--min-length", "40", "--max-length", "20"],
        "too-short-for-task": ["train", "--run-dir", new, "--task", "mqmtar", "--min-length", "1"],
        "bad-model": ["train", "--run-dir", new, "--d-model", "30", "--n-heads", "4"],
        "existing-run-dir": ["train", "--run-dir", str(existing), *TINY],
        "resume-missing": ["train", "--run-dir", new, "--resume"],
        "resume-with-flags": ["train", "--run-dir", str(existing), "--resume", "--lr", "0.1"],
        "eval-missing-checkpoint": ["eval", str(existing)],
        "eval-fractional-length": ["eval", str(existing), "--multipliers", "1.5", "--id-length", "5"],
        "compare-not-evaluated": ["compare", str(existing), "--output-dir", new],
        "unknown-command": ["fly"],
        "bad-multiplier": ["eval", str(existing), "--multipliers", "0"],
        "alpha-above-range": ["train", "--run-dir", new, *TINY, "--alpha", "11"],
        "negative-seed": ["train", "--run-dir", new, *TINY, "--seed", "-1"],
    }[case]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("asentmax") and "error:" in err and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in existing.iterdir()) == ["config.json"]
    assert (existing / "config.json").read_text() == "keep me"


def test_overwrite_replaces_a_run(tmp_path):
    existing = _existing_run(tmp_path)
    assert main(["train", "--run-dir", str(existing), *TINY, "--steps", "2", "--overwrite"]) == 0
    assert json.loads((existing / "config.json").read_text())["train_config"]["steps"] == 2


# ---- the top level ----

def test_bare_asentmax_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("usage: asentmax") and "train" in captured.err and "eval" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_version(capsys):
    from asentmax import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"asentmax {__version__}"


# ---- damaged run directories: one line naming the file, exit 2, nothing written ----

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny trained and evaluated run (copied by the tests that damage it)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    torch.set_num_threads(1)
    assert main(["train", "--run-dir", str(run), *TINY]) == 0
    assert main(["eval", str(run), "--multipliers", "1", "--samples", "2"]) == 0
    return run


@pytest.mark.parametrize("case", ["repeated-multiplier", "compare-twice"])
def test_a_repeated_argument_is_one_line(trained_run, tmp_path, capsys, case):
    out = str(tmp_path / "x")
    argv, message = {
        "repeated-multiplier": (["eval", str(trained_run), "--multipliers", "1", "2", "1", "--output", out],
                                "multipliers must differ from each other, got 1.0 2.0 1.0"),
        "compare-twice": (["compare", str(trained_run), f"{trained_run}/", "--output-dir", out],
                          "a run is given twice"),
    }[case]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.json").exists()


def _damaged_copy(trained_run, tmp_path, name, content):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / name).write_bytes(content)
    return run


class _Planted:
    """Unpickling this runs os.system: a loader that executes code creates the marker file."""

    marker = None

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def _snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["truncated-checkpoint", "malicious-checkpoint", "garbage-checkpoint",
                                  "garbage-config", "config-not-an-object", "config-without-workload",
                                  "garbage-eval-json-on-rerun"])
def test_eval_of_a_damaged_run_dir_is_one_line_naming_the_file(case, trained_run, tmp_path, capsys):
    checkpoint = (trained_run / "checkpoint.pt").read_bytes()
    marker = tmp_path / "code-ran"
    if case == "malicious-checkpoint":
        _Planted.marker = marker
        torch.save({"model": _Planted(), "step": 1}, tmp_path / "planted.pt")
    name, content = {
        "truncated-checkpoint": ("checkpoint.pt", checkpoint[: len(checkpoint) // 2]),
        "malicious-checkpoint": ("checkpoint.pt", (tmp_path / "planted.pt").read_bytes()
                                 if case == "malicious-checkpoint" else b""),
        "garbage-checkpoint": ("checkpoint.pt", bytes(range(256)) * 10),
        "garbage-config": ("config.json", b"{not json"),
        "config-not-an-object": ("config.json", b"[1, 2]"),
        "config-without-workload": ("config.json", b'{"model_config": {}}'),
        "garbage-eval-json-on-rerun": ("eval.json", b"\x00\xff garbage"),
    }[case]
    run = _damaged_copy(trained_run, tmp_path, name, content)
    before = _snapshot(tmp_path)
    assert main(["eval", str(run), "--multipliers", "1", "--samples", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(run / name) in err, err
    assert not marker.exists()
    why = {"truncated-checkpoint": "truncated", "garbage-checkpoint": "not a torch checkpoint",
           "malicious-checkpoint": "nothing in it ran"}.get(case, "")
    assert why in err, err
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("content", [b"{truncated", b'{"rows": "x"}', b'[]', b'{"task": "copy"}'])
def test_compare_with_a_corrupt_eval_json_names_it(content, trained_run, tmp_path, capsys):
    run = _damaged_copy(trained_run, tmp_path, "eval.json", content)
    out = tmp_path / "report"
    assert main(["compare", str(trained_run), str(run), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(run / "eval.json") in err, err
    assert not out.exists()


def test_eval_on_cuda_without_a_gpu_is_one_line(trained_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = _snapshot(trained_run)
    assert main(["eval", str(trained_run), "--device", "cuda", "--output", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda" in err and "CUDA" in err, err
    assert _snapshot(trained_run) == before and not list(tmp_path.iterdir())


def test_compare_names_a_copied_run_by_where_it_is_now(trained_run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copied_elsewhere"
    shutil.copytree(trained_run, copy)
    assert main(["compare", str(trained_run), str(copy), "--output-dir", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "compare.md").read_text()
    assert f"ours ({trained_run.name})" in table and "ours (copied_elsewhere)" in table, table


def test_compare_plots_the_training_curves(trained_run, tmp_path):
    """training.png from log.csv / val.csv: every logged step and every validation step of every validation
    length, at step x batch size samples (TINY: logs every 2 of 8 steps at batch 4, validates every 4)."""
    from asentmax.report import training_curves
    from asentmax.runs import load_evaluation

    out = tmp_path / "report"
    assert main(["compare", str(trained_run), "--output-dir", str(out)]) == 0
    assert (out / "training.png").stat().st_size > 0 and "training.png" in (out / "compare.md").read_text()
    config = json.loads((trained_run / "config.json").read_text())
    train, workload = config["train_config"], config["workload"]
    batch, every, steps = train["batch_size"], train["log_every"], train["steps"]
    curves = training_curves(load_evaluation(trained_run))
    assert curves["samples"] == [step * batch for step in range(every, steps + 1, every)]
    assert len(curves["loss"]) == len(curves["samples"]) and all(loss > 0 for loss in curves["loss"])
    lengths = {round(m * workload["max_length"]) for m in workload["val_multipliers"]}
    val_steps = range(train["val_every"], steps + 1, train["val_every"])
    assert curves["validation"].keys() == lengths
    for samples, matches in curves["validation"].values():
        assert samples == [step * batch for step in val_steps] and all(0 <= m <= 1 for m in matches)


def test_the_training_plot_shows_the_gradient_norm_beside_adams_floor(trained_run, tmp_path, monkeypatch):
    """log.csv's grad_norm per logged step (a nan window, whose norm a resume lost, left out) in a panel
    between the loss and the validation, with ADAM_EPS x sqrt(parameters) of the model the run trained
    (counted here from the model itself, each tied tensor once) as a dashed line; a log without the column
    keeps the two panels."""
    import csv
    import shutil

    import matplotlib.figure

    from asentmax.nn import ModelConfig, Transformer
    from asentmax.report import _plot_training, training_curves
    from asentmax.runs import load_evaluation

    config = json.loads((trained_run / "config.json").read_text())
    batch = config["train_config"]["batch_size"]
    rows = list(csv.DictReader(open(trained_run / "log.csv")))
    curves = training_curves(load_evaluation(trained_run))
    assert curves["grad_norm"] == ([int(r["step"]) * batch for r in rows],
                                   [float(r["grad_norm"]) for r in rows])
    assert all(norm > 0 for norm in curves["grad_norm"][1])
    model = Transformer(ModelConfig(**config["model_config"]))
    assert curves["adam_floor"] == pytest.approx(1e-8 * sum(p.numel() for p in model.parameters()) ** 0.5,
                                                 rel=1e-12)

    run = tmp_path / "resumed"
    shutil.copytree(trained_run, run)
    text = (run / "log.csv").read_text().splitlines()
    header, first = text[0].split(","), text[1].split(",")
    first[header.index("grad_norm")] = "nan"
    (run / "log.csv").write_text("\n".join([text[0], ",".join(first), *text[2:]]) + "\n")
    assert training_curves(load_evaluation(run))["grad_norm"][0] == curves["grad_norm"][0][1:]

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    assert _plot_training([load_evaluation(run)], tmp_path / "plot.png")
    loss_ax, norm_ax, val_ax = figures[-1].axes
    (line,) = norm_ax.get_lines()[:1]
    assert list(line.get_ydata()) == curves["grad_norm"][1][1:]
    assert [ln.get_ydata()[0] for ln in norm_ax.get_lines()[1:]] == [curves["adam_floor"]]
    assert norm_ax.get_yscale() == "log" and val_ax.get_legend() is not None

    columns = [name for name in header if name != "grad_norm"]
    kept = [[row.split(",")[header.index(name)] for name in columns] for row in text]
    (run / "log.csv").write_text("\n".join(",".join(row) for row in kept) + "\n")
    assert training_curves(load_evaluation(run))["grad_norm"] == ([], [])
    assert _plot_training([load_evaluation(run)], tmp_path / "plot.png") and len(figures[-1].axes) == 2


def test_an_evaluation_file_inside_a_run_names_that_run(trained_run, tmp_path):
    """An evaluation file given by path beside a run's config.json (eval_best.json, eval_fresh.json) is that
    run's, wherever the run was copied: its name in the table and its training curves; a file outside any run
    (`eval --output`) keeps the run_dir it recorded."""
    import shutil

    from asentmax.runs import load_evaluation

    run = tmp_path / "copied_run"
    shutil.copytree(trained_run, run)
    shutil.copy(run / "eval.json", run / "eval_fresh.json")
    assert load_evaluation(run / "eval_fresh.json")["run_dir"] == str(run)
    out = tmp_path / "report"
    assert main(["compare", str(run / "eval_fresh.json"), "--output-dir", str(out)]) == 0
    assert "ours (copied_run)" in (out / "compare.md").read_text()
    assert (out / "training.png").is_file()
    elsewhere = tmp_path / "elsewhere.json"
    shutil.copy(run / "eval.json", elsewhere)
    assert load_evaluation(elsewhere)["run_dir"] == json.loads(elsewhere.read_text())["run_dir"] != str(run)


@pytest.mark.parametrize("log", [None, b"not,a\nlog", b"step,loss\n2,nan?\n"],
                         ids=["missing", "other", "bad"])
def test_compare_without_usable_training_logs_skips_that_plot(log, trained_run, tmp_path):
    """A run whose log.csv is missing or not the trainer's still compares; training.png needs one usable
    log."""
    import shutil

    from asentmax.report import training_curves
    from asentmax.runs import load_evaluation

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    if log is None:
        (run / "log.csv").unlink()
    else:
        (run / "log.csv").write_bytes(log)
    assert training_curves(load_evaluation(run)) is None
    assert main(["compare", str(run), "--output-dir", str(tmp_path / "alone")]) == 0
    assert not (tmp_path / "alone" / "training.png").exists()
    assert main(["compare", str(run), str(trained_run), "--output-dir", str(tmp_path / "both")]) == 0
    assert (tmp_path / "both" / "training.png").is_file()
