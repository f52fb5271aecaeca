"""benchmarks/early_screen.py: a run's validation at early steps beside its test at the end, sorted by the
validation at the last step given; a run without a test (stopped by a stall check) says so, a step val.csv
lacks is '-', and a directory without val.csv is refused in one line."""

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
    if test is not None:
        rows = [{"length": length, "exact_match": value} for length, value in test.items()]
        (path / "eval.json").write_text(json.dumps({"rows": rows}))
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
