"""benchmarks/early_screen.py: a run's validation at early steps beside its test at the end, sorted by the
validation at the last step given; a run without a test (stopped by a stall check) says so, a step val.csv
lacks is '-', and a directory without val.csv, or with an eval.json that is not an evaluation, is refused in
one line; --loss-below adds the first step whose training loss fell below each value."""

import json
import sys

import pytest

from conftest import load_benchmark


def make_run(path, validation: dict, test: dict | None = None):
    """A run directory: val.csv rows {(step, length): exact match}, eval.json rows {length: exact match}."""
    path.mkdir()
    lines = ["step,length,exact_match,token_accuracy"]
    lines += [f"{step},{length},{value},0.5" for (step, length), value in validation.items()]
    (path / "val.csv").write_text("\n".join(lines) + "\n")
    if test is not None:  # shaped like what `asentmax eval` writes (runs.load_evaluation checks it)
        rows = [{"length": length, "n": 300, "n_exact": round(300 * value), "exact_match": value,
                 "token_accuracy": value, "ci_low": 0.0, "ci_high": 1.0} for length, value in test.items()]
        (path / "eval.json").write_text(json.dumps({"task": "reverse", "run_dir": str(path), "id_length": 64,
                                                    "model_config": {"attention": "asentmax"}, "rows": rows}))
    return path


def test_runs_sort_by_the_last_screening_step(tmp_path):
    screen = load_benchmark("early_screen")
    failing = make_run(tmp_path / "failing", {(2000, 256): 0.0, (4000, 256): 0.01, (4000, 128): 0.9},
                       {256: 0.187, 512: 0.0})
    passing = make_run(tmp_path / "passing", {(2000, 256): 0.016, (4000, 256): 0.297},
                       {256: 0.983, 512: 0.91})
    stopped = make_run(tmp_path / "stopped", {(4000, 256): 0.0})
    lines = screen.screen_table([failing, stopped, passing], 256, [2000, 4000], [256, 512]).splitlines()
    assert lines[0] == ("| run | validation at 256 tokens, step 2000 | validation at 256 tokens, step 4000 | "
                        "test at 256 tokens | test at 512 tokens |")
    assert lines[1] == "|---|---|---|---|---|"
    assert lines[2:] == ["| passing | 1.6 | 29.7 | 98.3 | 91.0 |",
                         "| failing | 0.0 | 1.0 | 18.7 | 0.0 |",
                         "| stopped | - | 0.0 | not tested | not tested |"]


def test_a_directory_without_validation_is_refused_in_one_line(tmp_path, monkeypatch):
    screen = load_benchmark("early_screen")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(sys, "argv", ["early_screen.py", str(tmp_path / "empty"), "--length", "256",
                                      "--steps", "4000", "--eval-lengths", "256"])
    with pytest.raises(SystemExit, match="early_screen: no val.csv in .*empty"):
        screen.main()


def test_an_eval_json_that_is_not_an_evaluation_is_refused_in_one_line(tmp_path, monkeypatch):
    screen = load_benchmark("early_screen")
    run = make_run(tmp_path / "run", {(4000, 256): 0.3}, {256: 0.9})
    (run / "eval.json").write_text(json.dumps({"rows": [{"length": 256, "exact_match": 0.9}]}))
    monkeypatch.setattr(sys, "argv", ["early_screen.py", str(run), "--length", "256", "--steps", "4000",
                                      "--eval-lengths", "256"])
    with pytest.raises(SystemExit, match=r"^early_screen: .*eval\.json is not an asentmax evaluation"):
        screen.main()


def test_loss_columns_give_the_first_step_strictly_below_each_value(tmp_path):
    screen = load_benchmark("early_screen")
    run = make_run(tmp_path / "run", {(4000, 256): 0.3}, {256: 0.9})
    (run / "log.csv").write_text("step,loss,lr\n20,3.6,1e-6\n40,0.1,1e-6\n60,0.05,1e-6\n80,0.2,1e-6\n"
                                 "100,0.009,1e-6\n")
    unlogged = make_run(tmp_path / "unlogged", {(4000, 256): 0.0})
    assert screen.first_steps_below(run, [0.1, 0.01, 1e-4]) == [60, 100, None]  # 0.1 at step 40 is not below
    lines = screen.screen_table([unlogged, run], 256, [4000], [256], loss_below=[0.1, 1e-4]).splitlines()
    assert lines[0] == ("| run | validation at 256 tokens, step 4000 | "
                        "training loss first below 0.1 at step | "
                        "training loss first below 0.0001 at step | test at 256 tokens |")
    assert lines[1] == "|---|---|---|---|---|"
    assert lines[2:] == ["| run | 30.0 | 60 | - | 90.0 |", "| unlogged | 0.0 | - | - | not tested |"]
