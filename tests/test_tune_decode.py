"""benchmarks/tune_decode_gpu.py: its configs (pruning, packs) and its dry run end to end under the Triton
interpreter (compile worker, a failing config, the time budget, the report files)."""

import importlib
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("triton")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs the kernels: TRITON_INTERPRET=1")


@pytest.fixture
def tune(monkeypatch):
    """The benchmark imported by name (it imports bench_decode_gpu, and its compile workers import it)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("tune_decode_gpu")


def test_configs_prune_large_tiles_and_pack_grouped_heads(tune):
    """18 configs a pack (block_n 128, 256, 512 x 2 warps x 3 stages); D = 128 drops block_n 512 at 2-3
    stages (> 227 KB of tiles); the grouped cases sweep pack 1 and heads_per_program's (4 for groups of 4,
    8 for groups of 8), multi-head cases pack 1."""
    configs = {case: tune.case_configs(case, tune.SWEEP) for case in tune.CASES}
    assert len(configs) == 16 and sum(map(len, configs.values())) == 450
    for (_, h, hkv, _, dim, _), case_configs in configs.items():
        pruned = {(c["block_n"], c["num_stages"]) for c in case_configs if "pruned" in c}
        assert pruned == ({(512, 2), (512, 3)} if dim == 128 else set())
        assert {c["pack"] for c in case_configs} == ({1, h // hkv} if h > hkv else {1})
    assert sum("pruned" in c for cs in configs.values() for c in cs) == 60


def test_split_configs_prune_tiles_that_do_not_divide_the_chunk(tune):
    """36 split configs a case (chunks 256, 512, 1024 x block_n 64, 128, 256 x 2 warps x solve or not), all
    with heads_per_program's pack (4 for groups of 4, 8 for groups of 8 and 4 for B = 1's groups of 4,
    1 without groups), and the same 36 again with pack 1 for the B = 1 cases (8 packs: fewer than
    FEW_PACKS programs a chunk); none is pruned (every block_n divides every chunk) until a chunk is smaller
    than a tile."""
    configs = {case: tune.case_configs(case, tune.SPLIT_SWEEP, "split") for case in tune.SPLIT_CASES}
    assert len(configs) == 11
    for (b, h, hkv, _, _, _), case_configs in configs.items():
        packs = {h // hkv, 1} if b == 1 else {h // hkv}
        assert {c["pack"] for c in case_configs} == packs and len(case_configs) == 36 * len(packs)
        assert {c["path"] for c in case_configs} == {"split"} and not any("pruned" in c for c in case_configs)
    small = tune.case_configs((1, 4, 2, 1, 32, 100), dict(chunk=(64,), block_n=(64, 128), num_warps=(4,),
                                                          solve=(True,)), "split")
    assert [("pruned" in c, c["pack"]) for c in small] == [(False, 2), (True, 2), (False, 1), (True, 1)]
    assert small[1]["pruned"] == "block_n 128 does not divide chunk 64"


@interpreter
def test_dry_run_end_to_end(tune, monkeypatch, tmp_path):
    """A grouped case with block_n 8 (refused by the launcher: failed, the sweep goes on) and 32, pack 1
    and 2, one compile worker: the valid configs agree with the default, the best is one of them, and both
    report files are written; with no time budget every config is skipped."""
    monkeypatch.setattr(tune, "DRY_CASES", [(1, 4, 2, 1, 32, 100)])
    monkeypatch.setattr(tune, "DRY_SWEEP", dict(block_n=(8, 32), num_warps=(4,), num_stages=(1,)))
    tune.main(["--dry-run", "--jobs", "1", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "tune_decode.json").read_text())["rows"]
    assert [(c["block_n"], c["pack"]) for c in row["configs"]] == [(8, 1), (32, 1), (8, 2), (32, 2)]
    for config in row["configs"]:
        if config["block_n"] == 8:
            assert config["failed"] == "ValueError: block_n must be a power of two >= 16, not 8"
        else:
            assert config["agrees"] and config["support_equal"] and config["max_abs_diff"] < 1e-5
    assert row["best"]["block_n"] == 32 and row["default_ms"] > 0 and row["sdpa_ms"] > 0
    markdown = (tmp_path / "tune_decode.md").read_text()
    assert "| short 1/4/2/1/32/100 | 8/4/1 pack 2 | - | - | - | - | failed: ValueError: block_n" in markdown
    assert "| 2 / 0 / 2 / 0 / 0 |" in markdown  # ok / differ / failed / pruned / skipped

    tune.main(["--dry-run", "--jobs", "0", "--seconds", "0", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "tune_decode.json").read_text())["rows"]
    assert "default_ms" not in row and all(c["skipped"] == "time budget" for c in row["configs"])
    assert "| 0 / 0 / 0 / 0 / 4 |" in (tmp_path / "tune_decode.md").read_text()


@interpreter
def test_dry_run_split_path(tune, monkeypatch, tmp_path):
    """--paths split: the split launcher's configs on a grouped case, each computing what the library's
    launcher computes (agrees), the threshold launch and the solving output kernel both, with a program per
    pack of the group's heads and (B = 1: few packs) per head, a chunk smaller than its tile pruned; rows
    and labels name the path."""
    monkeypatch.setattr(tune, "DRY_CASES", [(1, 4, 2, 1, 32, 100)])
    monkeypatch.setattr(tune, "DRY_SPLIT_SWEEP", dict(chunk=(32, 64), block_n=(64,), num_warps=(4,),
                                                      solve=(True, False)))
    tune.main(["--dry-run", "--paths", "split", "--jobs", "0", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "tune_decode.json").read_text())["rows"]
    assert row["path"] == "split"
    timed = [c for c in row["configs"] if "ms" in c]
    assert [(c["chunk"], c["solve"], c["pack"]) for c in timed] == [
        (64, True, 2), (64, False, 2), (64, True, 1), (64, False, 1)]
    assert all(c["agrees"] and c["max_abs_diff"] < 1e-5 for c in timed)
    markdown = (tmp_path / "tune_decode.md").read_text()
    assert "| split 1/4/2/1/32/100 | chunk 64 64/4 threshold pack 2 |" in markdown
    assert "pruned: block_n 64 does not divide chunk 32" in markdown
