"""`make demo` end to end on a tiny budget: both runs train, evaluate and are compared (asentmax.demo)."""

import json

from asentmax import demo


def test_demo_pipeline_writes_table_plots_and_summary(tmp_path, monkeypatch):
    monkeypatch.setitem(demo.DEMO_EVAL, "multipliers", ("1", "1.5"))
    monkeypatch.setitem(demo.DEMO_EVAL, "samples", 4)
    table = demo.run_demo(tmp_path, steps=10)
    methods = [line.split(" | ")[1] for line in table.splitlines() if "| ours" in line]
    assert methods == ["Softmax", "ASEntmax"]
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["train"]["steps"] == 10 and summary["eval"]["samples"] == 4
    for name in ("demo.md", "compare.md", "accuracy.png"):
        assert (tmp_path / name).stat().st_size > 0
    for method in demo.DEMO_METHODS:
        evaluation = json.loads((tmp_path / f"sort_{method}" / "eval.json").read_text())
        assert [row["length"] for row in evaluation["rows"]] == [16, 24]
