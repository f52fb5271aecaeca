"""benchmarks/bench_sampler.py on CPU end to end: a row per task, the op counts the profiler saw (a bound
that the sampler's old per-pair loop broke), and the markdown table written."""

import json

from conftest import load_benchmark


def test_bench_sampler_smoke(tmp_path):
    module = load_benchmark("bench_sampler")
    out = tmp_path / "s"
    rows = module.main(["--device", "cpu", "--batch-size", "4", "--repeats", "2", "--out", str(out)])
    assert [row["task"] for row in rows] == list(module.TASKS)
    # a batch is a few dozen launches at most (the Floyd-loop sampler before issue 14 issued 185 for MQMTAR)
    assert all(row["ms"] > 0 and 5 <= row["host_ops"] <= 40 for row in rows)
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["rows"] == rows and "| mqmtar | 4 |" in (tmp_path / "s.md").read_text()
