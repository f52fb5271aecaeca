"""benchmarks/tune_attention_gpu.py's per-kernel sweep (--kernels): its candidate list, its choice of the
winner, and a run end to end under the Triton interpreter on small CPU inputs with a fake clock (every
candidate row measured and checked against the current configuration, the op table for the winner)."""

import os

import pytest
import torch

from conftest import load_benchmark

pytest.importorskip("triton")

CURRENT = ((64, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 3))


def test_candidates_replace_one_kernel_each():
    tune = load_benchmark("tune_attention_gpu")
    candidates = dict(fwd=("64/64/4/3", "32/32/4/2", "128/32/8/2"), dq=(), dkdv=("128/64/8/2",))
    configs = tune.candidate_configs(CURRENT, candidates)
    assert configs == [("current", CURRENT),  # then the first of each kernel, the second... (not current)
                       ("dkdv 128/64/8/2", CURRENT[:2] + ((128, 64, 8, 2),)),
                       ("fwd 32/32/4/2", ((32, 32, 4, 2),) + CURRENT[1:]),
                       ("fwd 128/32/8/2", ((128, 32, 8, 2),) + CURRENT[1:])]
    with pytest.raises(ValueError, match="BLOCK_M/BLOCK_N/num_warps/num_stages"):
        tune.parse_block("64/32/4")


def test_default_candidates_are_new_shapes():
    """Every default candidate is a valid tile shape other than its kernel's current one."""
    from asentmax.ops.triton.attention_common import KERNEL_BLOCKS

    tune = load_benchmark("tune_attention_gpu")
    for dim, candidates in tune.DEFAULT_CANDIDATES.items():
        configs = tune.candidate_configs(KERNEL_BLOCKS[dim], candidates)
        assert len(configs) == 1 + sum(len(c) for c in candidates.values())


def test_winner_takes_the_fastest_close_candidate_per_kernel():
    tune = load_benchmark("tune_attention_gpu")

    def row(config, kernel, fwd, bwd, diff=0.0, index=None):
        blocks = list(map(tune.spelled, CURRENT))
        if index is not None:
            blocks[index] = config.split()[1]
        return dict(config=config, kernel=kernel, blocks=blocks, fwd_ms=fwd, bwd_ms=bwd, max_rel_diff=diff)

    rows = [row("current", None, 10.0, 20.0),
            row("fwd 32/32/4/2", "fwd", 9.0, 30.0, index=0),  # faster forward (its backward does not count)
            row("fwd 128/32/8/2", "fwd", 8.0, 20.0, diff=0.5, index=0),  # fastest but wrong: not taken
            row("dq 128/32/8/2", "dq", 10.0, 21.0, index=1),  # slower than current: not taken
            row("dkdv 128/64/8/2", "dkdv", 12.0, 19.0, index=2),
            dict(config="dkdv 64/32/8/2", kernel="dkdv", blocks=[], error="skipped: time budget")]
    assert tune.winner(CURRENT, rows, 2e-2) == ((32, 32, 4, 2), CURRENT[1], (128, 64, 8, 2))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernels: TRITON_INTERPRET=1")
def test_kernel_sweep_runs_end_to_end(monkeypatch, tmp_path):
    """The sweep at head dim 64 on 150 fp32 keys, one candidate per kernel, each a different tile shape from
    the current one; the fake clock makes every later measurement faster, so each candidate wins and the op
    table has the current and the winner's rows for both inputs."""
    from asentmax.ops.triton import attention_bwd, attention_common

    tune = load_benchmark("tune_attention_gpu")
    clock = iter(range(1000, 0, -1))
    monkeypatch.setattr(tune, "bench", lambda fn, grad_to_none=None: (fn(), float(next(clock)))[1])
    monkeypatch.setattr(tune, "sdpa_pair", lambda q, k, v: (1.0, 2.0))
    gaussian = tune.inputs
    monkeypatch.setattr(tune, "inputs", lambda n, dim, kind: gaussian(n, dim, kind, batch=1, heads=2,
                                                                      device="cpu", dtype=torch.float32))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setitem(attention_common.KERNEL_BLOCKS, 64, CURRENT)
    args = tune.parse_args(["--kernels", "64", "--n", "150", "--fwd", "32/32/4/2", "--dq", "32/64/4/2",
                            "--dkdv", "64/32/4/2", "--out", str(tmp_path / "t")])
    report = dict(rows=[], command="test", gpu="cpu", torch="-", triton="-")
    tune.run_kernels(args, report, lambda: None)
    rows = report["kernel_rows"]
    assert [r["config"] for r in rows] == ["current", "fwd 32/32/4/2", "dq 32/64/4/2", "dkdv 64/32/4/2"]
    for r in rows:
        assert "error" not in r, r
        assert r["passes_max"] >= 1 and r["first_call_s"] > 0
        assert r["dkdv_ms"] == r["bwd_ms"] - r["dq_ms"] and "pass_ms" in r
    assert rows[0]["max_rel_diff"] == 0.0
    assert all(r["max_rel_diff"] < 1e-3 for r in rows[1:])  # another tiling: rounding, not errors
    assert report["winner"] == ["32/32/4/2", "32/64/4/2", "64/32/4/2"]
    assert [(r["config"], r["inputs"]) for r in report["op_rows"]] == [
        ("current", "random"), ("winner", "random"), ("current", "nape"), ("winner", "nape")]
    assert all(r["max_rel_diff"] < 1e-3 for r in report["op_rows"])
    assert attention_common.KERNEL_BLOCKS[64] == CURRENT  # restored, as the skipped dk/dv kernel
    assert not isinstance(attention_bwd._entmax_attention_bwd_dkdv, tune._Skipped)
    markdown = tune.markdown(report)
    assert "| dkdv 64/32/4/2 |" in markdown
    assert "| winner 32/32/4/2 + 32/64/4/2 + 64/32/4/2 | nape |" in markdown
    assert "`64: ((32, 32, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2)),`" in markdown
