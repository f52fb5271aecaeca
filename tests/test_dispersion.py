"""The dispersion demonstration (asentmax.dispersion): the properties docs/method.md section 1 predicts."""

import math

import torch

from asentmax.dispersion import (
    DispersionSetup,
    attention_weights,
    dispersion_stats,
    inverse_temperature,
    main,
    run,
)


def test_theta_formula_matches_paper():
    setup = DispersionSetup(delta=1.0, beta=0.5, gamma=2.0)
    assert math.isclose(inverse_temperature(100, setup), 1.0 + 0.5 * math.log(101) ** 2)


def test_softmax_disperses_and_entmax_does_not():
    rows = run([64, 1024, 16384], DispersionSetup(trials=8))
    by = {(r["n"], r["method"]): r for r in rows}
    soft = [by[n, "softmax"]["normalised_entropy"] for n in (64, 1024, 16384)]
    assert soft[0] < soft[1] < soft[2]
    for n in (1024, 16384):
        assert by[n, "entmax"]["relevant_mass"] > by[n, "softmax"]["relevant_mass"]
        assert by[n, "asentmax"]["support"] < n / 100


def test_stats_of_uniform_and_one_hot():
    uniform = torch.full((1, 8), 1 / 8, dtype=torch.float64)
    assert math.isclose(dispersion_stats(uniform, 2)["normalised_entropy"], 1.0)
    one_hot = torch.zeros(1, 8, dtype=torch.float64)
    one_hot[0, 0] = 1
    stats = dispersion_stats(one_hot, 2)
    assert stats["normalised_entropy"] == 0 and stats["support"] == 1 and stats["relevant_mass"] == 1


def test_weights_are_distributions():
    logits = torch.randn(3, 50, dtype=torch.float64)
    for method in ("softmax", "ssmax", "entmax", "asentmax"):
        p = attention_weights(method, logits, DispersionSetup())
        assert torch.allclose(p.sum(-1), torch.ones(3, dtype=torch.float64))


def test_cli_writes_outputs(tmp_path):
    main(["--max-log2-length", "8", "--trials", "2", "--out", str(tmp_path)])
    lines = (tmp_path / "dispersion.md").read_text().splitlines()
    table_rows = [line for line in lines if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in table_rows] == ["| n", "| 64", "| 256"]
    assert (tmp_path / "dispersion.png").stat().st_size > 0
