"""benchmarks/bench_generate.py on a tiny run: both caches decode the same tokens (the script exits
otherwise), and the table and json hold one row per normaliser and prompt with positive timings."""

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_generate.py"


@pytest.mark.usefixtures("one_thread")
def test_bench_generate_writes_both_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--device", "cpu", "--prompts", "9", "70", "--new", "3",
                                      "--repeats", "1", "--normalisers", "asentmax", "softmax",
                                      "--out", str(tmp_path)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    rows = json.loads((tmp_path / "generate_cpu.json").read_text())["rows"]
    assert [(r["normaliser"], r["prompt"]) for r in rows] == [
        ("asentmax", 9), ("asentmax", 70), ("softmax", 9), ("softmax", 70)]
    assert all(r["concatenating_ms_per_token"] > 0 and r["buffered_ms_per_token"] > 0 for r in rows)
    table = (tmp_path / "generate_cpu.md").read_text()
    assert table.count("\n| asentmax |") == 2 and "--prompts 9 70 --new 3" in table


def test_bench_generate_refuses_cuda_graph_on_the_cpu(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--device", "cpu", "--cuda-graph"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exit_info.value.code == 2 and "--cuda-graph needs --device cuda" in capsys.readouterr().err
