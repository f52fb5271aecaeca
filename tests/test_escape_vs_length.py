"""benchmarks/escape_vs_length.py: per run, the first step below the escape loss (read back from log.csv by a
brute-force scan), the mean loss over a window of steps, the last step, and the exact match of eval.json at
each multiplier of the training length; a run without eval.json, or a multiplier it did not test, gets '-'; a
run that never escaped says so, and a window the run did not reach gives no mean."""

import csv
import json
import sys
from pathlib import Path

from asentmax.cli import main as asentmax
from conftest import load_benchmark

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "1", "--val-every", "0", "--log-every", "1", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
        "--d-ff", "64", "--device", "cpu", "--steps", "6", "--no-progress"]


def test_table_joins_escape_steps_with_the_tested_lengths(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # its plateau_study
    escape = load_benchmark("escape_vs_length")
    evaluated, untested = tmp_path / "evaluated", tmp_path / "untested"
    for run in (evaluated, untested):
        assert asentmax(["train", "--run-dir", str(run), *TINY]) == 0
    evaluate = ["eval", str(evaluated), "--multipliers", "1", "2", "--samples", "3", "--no-progress"]
    assert asentmax(evaluate) == 0
    with open(evaluated / "log.csv", newline="") as f:
        losses = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]
    threshold = sorted(loss for _, loss in losses)[len(losses) // 2]  # half the logged steps are below it
    expected_escape = min(step for step, loss in losses if loss < threshold)
    rows = {r["length"]: r for r in json.loads((evaluated / "eval.json").read_text())["rows"]}
    id_length = json.loads((evaluated / "eval.json").read_text())["id_length"]

    s = escape.run_summary(evaluated, threshold, [1, 2, 4], 2, 3)
    window = [loss for step, loss in losses if 2 <= step <= 4]
    assert len(window) == 3 and abs(s["settled_loss"] - sum(window) / 3) <= 1e-12
    assert s["escape_step"] == expected_escape
    assert s["last_step"] == losses[-1][0]
    assert s["exact"] == {1: 100 * rows[id_length]["exact_match"],
                          2: 100 * rows[2 * id_length]["exact_match"], 4: None}
    never = escape.run_summary(untested, -1.0, [1, 2, 4], 100, 10)
    assert never["escape_step"] is None and never["exact"] == {1: None, 2: None, 4: None}
    assert never["settled_loss"] is None

    text = escape.table([s, never], [1, 2, 4], threshold, (2, 3), "cmd")
    assert "| mean loss, steps 2-4 |" in text
    assert f"| 1 | evaluated | {expected_escape:,} | {s['settled_loss']:.4f} | {losses[-1][0]:,} | " in text
    untested_row = next(line for line in text.splitlines() if line.startswith("| 2 | untested"))
    assert untested_row.startswith("| 2 | untested | never | - |") and untested_row.endswith("- | - | - |")
    # the rank table below: at 4x no run has an exact match, so no pairs and no rho for either quantity
    assert f"| escape step (loss < {threshold:g}) | 0 | - | - |" in text
    assert "| mean loss, steps 2-4 | 0 | - | - |" in text

    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["escape_vs_length.py", str(evaluated), str(untested), "--out", str(out),
                                      "--escape-loss", str(threshold), "--lengths", "1", "2",
                                      "--settle-step", "2", "--settle-window", "3"])
    assert escape.main() == 0
    assert (out / "escape.png").stat().st_size > 0 and "| untested | " in (out / "escape.md").read_text()
    capsys.readouterr()
