"""benchmarks/bench_train_gpu.py: its FLOP count against torch's FlopCounterMode, and its --smoke run on
CPU end to end (every row written, the numbers consistent with each other)."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from asentmax.nn import Transformer
from asentmax.nn.presets import mqmtar_model
from conftest import load_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_flops_match_the_flop_counter():
    """torch's counter sees the Linear matmuls (the reference attention at one token is elementwise): it
    must equal the benchmark's count without attention; attention_flops counts the visible pairs."""
    bench = load_benchmark("bench_train_gpu")
    config = mqmtar_model(263, attention="softmax", position="nope", d_model=32, n_layers=2, n_heads=4,
                          d_ff=64, attention_backend="reference")
    model = Transformer(config)
    ids = torch.randint(0, 263, (3, 1))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    assert counter.get_total_flops() == bench.step_flops(model, 3, 1) - bench.attention_flops(config, 3, 1)
    width = 7
    pairs = sum(1 for query in range(width) for key in range(width) if key <= query)
    per_pair = 2 * 2 * config.n_heads * config.head_dim  # q.k and p.v, one multiply-add = 2 FLOPs
    assert bench.attention_flops(config, 5, width) == 3 * 5 * config.n_layers * pairs * per_pair


def test_smoke_run_writes_consistent_rows(tmp_path):
    bench = load_benchmark("bench_train_gpu")
    out = tmp_path / "train_gpu"
    assert bench.main(["--smoke", "--normalisers", "softmax,ssmax", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    rows = data["rows"]
    assert [(r["normaliser"], r["batch"]) for r in rows] == [("softmax", 4), ("ssmax", 4)]
    for row in rows:
        assert "error" not in row and "loop_error" not in row, row
        for kind in ("eager", "compiled", "loop"):
            assert row[f"{kind}_ms"] > 0
            assert row[f"{kind}_samples_s"] == pytest.approx(row["batch"] / row[f"{kind}_ms"] * 1e3)
        assert row["loop_vs_bare"] == pytest.approx(row["compiled_ms"] / row["loop_ms"])
        assert 0 < row["data_percent"] and row["graphs"] >= 1 and row["first_step_s"] <= row["all_shapes_s"]
    assert rows[0]["vs_softmax"] == 1.0
    markdown = out.with_suffix(".md").read_text()
    assert markdown.count("\n| softmax | 4 |") == 1 and markdown.count("\n| ssmax | 4 |") == 1
