"""ModelConfig validation (clear ValueErrors), presets (the paper's shapes, LM parameter counts), ALiBi
slope schedules (harmonic / Press et al. geometric), config round trip, statistics summary."""

import math
import re

import pytest
import torch

from asentmax.nn import (
    ModelConfig,
    Transformer,
    copy_model,
    lm_25m,
    lm_120m,
    lm_tiny,
    mqmtar_model,
    reverse_model,
    sort_model,
    summarise_stats,
)
from asentmax.nn.positions import geometric_slopes, harmonic_slopes, head_slopes, scaled_head_count

BAD = [
    (dict(d_model=30, n_heads=4), "n_heads=4 does not divide d_model=30"),
    (dict(n_kv_heads=3), "n_kv_heads=3 does not divide n_heads=8"),
    (dict(attention="sparsemax"), "unknown attention 'sparsemax'"),
    (dict(position="learned"), "unknown position 'learned'"),
    (dict(mlp="relu"), "unknown mlp 'relu'"),
    (dict(attention_backend="cuda"), "unknown attention_backend 'cuda'"),
    (dict(asentmax_init="xavier"), "unknown asentmax_init 'xavier'"),
    (dict(ssmax_form="log"), "unknown ssmax_form 'log'"),
    (dict(alibi_slopes="linear"), "unknown alibi_slopes 'linear'"),
    (dict(attention="entmax", alpha=1.0), "alpha must be > 1 for attention='entmax'"),
    (dict(attention="asentmax", alpha=0.5), "alpha must be > 1 for attention='asentmax'"),
    (dict(attention="asentmax", alpha=float("nan")), "alpha must be > 1"),
    (dict(attention="entmax", alpha=11.0), "alpha must be <= 10 for attention='entmax'"),
    (dict(position="nape", n_heads=1, d_model=32), "n_heads must be even"),
    (dict(position="rope", d_model=24, n_heads=8), "even head_dim"),
    (dict(vocab_size=0), "vocab_size must be a positive int"),
    (dict(n_layers=2.0), "n_layers must be a positive int"),
    (dict(topk_k=0), "topk_k must be a positive int"),
    (dict(dropout=1.0), "dropout must be in"),
    (dict(gamma_range=0.0), "gamma_range must be > 0"),
    (dict(attention="ssmax", ssmax_form="plain", ssmax_s_init=0.0),
     "plain-form SSMax needs ssmax_s_init > 0"),
    (dict(asentmax_beta_init=0.0), "asentmax_beta_init must be in (0, 100]"),
    (dict(asentmax_beta_init=-1.0), "asentmax_beta_init must be in (0, 100]"),
    (dict(asentmax_beta_init=float("nan")), "asentmax_beta_init must be in (0, 100]"),
    (dict(asentmax_beta_init=1000.0), "asentmax_beta_init must be in (0, 100]"),
    (dict(asentmax_gamma_init=2.0),
     "asentmax_gamma_init must be inside (-gamma_range, gamma_range) = (-2, 2)"),
    (dict(asentmax_gamma_init=-1.5, gamma_range=1.0),
     "asentmax_gamma_init must be inside (-gamma_range, gamma_range) = (-1, 1)"),
    (dict(asentmax_gamma_init=float("nan")), "asentmax_gamma_init must be inside"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[m for _, m in BAD])
def test_bad_config_raises_clear_value_error(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        ModelConfig(**{"vocab_size": 10, **overrides})
    assert str(error.value).startswith("ModelConfig: ")


def test_transformer_needs_a_config():
    with pytest.raises(TypeError, match="ModelConfig"):
        Transformer({"vocab_size": 10})


def test_presets_have_the_papers_shapes():
    m = mqmtar_model(300)
    assert (m.n_layers, m.d_model, m.n_heads, m.head_dim, m.d_ff) == (4, 512, 16, 32, 1024)
    assert (reverse_model(40).n_layers, reverse_model(40).d_model, reverse_model(40).n_heads) == (6, 256, 8)
    assert (sort_model(40).n_layers, sort_model(40).d_model, sort_model(40).n_heads) == (2, 256, 8)
    assert (copy_model(40).n_layers, copy_model(40).d_model, copy_model(40).n_heads) == (2, 256, 16)
    overridden = sort_model(40, attention="topk", topk_k=32, position="alibi")
    assert (overridden.attention, overridden.topk_k, overridden.position, overridden.n_layers) == \
        ("topk", 32, "alibi", 2)
    with pytest.raises(ValueError, match="unknown attention"):
        copy_model(40, attention="nope")


def test_the_sequence_task_presets_are_the_paper_codes_blocks_and_mqmtars_ours():
    """Copy, Reverse and Sort in the paper code's blocks (with them ASEntmax reached or neared the paper's
    rows, results/paper), the ASEntmax init only for ASEntmax (no other normaliser reads it); MQMTAR in ours
    (in theirs it stayed on the loss plateau); an override still wins."""
    from asentmax.nn.presets import PAPER_CODE_BLOCKS

    defaults = ModelConfig(vocab_size=40)
    for preset in (copy_model, reverse_model, sort_model):
        model = preset(40)
        assert {name: getattr(model, name) for name in PAPER_CODE_BLOCKS} == PAPER_CODE_BLOCKS
        softmax = preset(40, attention="softmax")
        assert softmax.asentmax_init == defaults.asentmax_init and softmax.norm_placement == "sandwich"
    mqmtar = mqmtar_model(300)
    assert all(getattr(mqmtar, name) == getattr(defaults, name) for name in PAPER_CODE_BLOCKS)
    assert sort_model(40, norm_placement="pre", mlp="swiglu").norm_placement == "pre"


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
@pytest.mark.parametrize("attention", ["asentmax", "softmax"])
def test_a_sequence_preset_is_the_model_of_its_committed_paper_blocks_run(task, attention):
    """`asentmax train --preset T --attention A` builds the model of results/paper/T/A_b128_paper_blocks,
    which was trained with the blocks' flags given one by one."""
    import json
    from pathlib import Path

    from asentmax.tasks import get_task

    run = Path(__file__).parents[1] / "results" / "paper" / task / f"{attention}_b128_paper_blocks"
    saved = run / "config.json"
    recorded = ModelConfig.from_dict(json.loads(saved.read_text())["model_config"])
    assert get_task(task).model_preset(get_task(task).vocab_size, attention=attention) == recorded


@pytest.mark.parametrize("task, run", [("copy", "asentmax_b128_paper_blocks_80k"),
                                       ("reverse", "asentmax_b128_paper_blocks"),
                                       ("sort", "asentmax_b128_paper_blocks_120k")])
def test_a_sequence_training_preset_is_the_recipe_of_its_best_committed_run(task, run):
    """`asentmax train --preset T` alone trains as the run of results/paper/T whose ASEntmax row the preset
    stands for (README: the presets retrain those rows)."""
    import json
    from pathlib import Path

    from asentmax.tasks import get_task

    saved = Path(__file__).parents[1] / "results" / "paper" / task / run / "config.json"
    recorded = json.loads(saved.read_text())["train_config"]
    preset = get_task(task).train_preset
    assert {name: recorded[name] for name in preset} == preset


def test_lm_preset_sizes():
    with torch.device("meta"):
        small = Transformer(lm_25m(32000)).num_parameters()
        large = Transformer(lm_120m(32000)).num_parameters()
    assert 20e6 < small < 30e6, small
    assert 100e6 < large < 140e6, large
    tiny = Transformer(lm_tiny(50))
    assert tiny.num_parameters() < 50_000
    assert tiny(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 50)


def test_config_round_trip():
    cfg = mqmtar_model(300, attention="ssmax", ssmax_form="plain")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown fields"):
        ModelConfig.from_dict({**cfg.to_dict(), "heads": 3})


def test_slope_schedules():
    assert harmonic_slopes(4) == [1.0, 0.5, 1 / 3, 0.25]
    assert geometric_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    assert geometric_slopes(4) == [2.0 ** -(2 * (i + 1)) for i in range(4)]
    # Press et al. for 6 heads: the 4-head slopes, then every other 8-head slope
    assert geometric_slopes(6) == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    nape = ModelConfig(vocab_size=5, d_model=48, n_heads=6, position="nape")
    assert head_slopes(nape).tolist() == [1.0, 0.5, 1 / 3, 0.0, 0.0, 0.0]
    assert scaled_head_count(nape) == 3
    alibi = ModelConfig(vocab_size=5, d_model=48, n_heads=6, position="alibi", alibi_slopes="geometric")
    assert head_slopes(alibi).tolist() == geometric_slopes(6) and scaled_head_count(alibi) == 6
    assert head_slopes(ModelConfig(vocab_size=5, position="rope")) is None


def test_initialisation_choices():
    small = dict(vocab_size=5, d_model=16, n_heads=2)
    zero = Transformer(ModelConfig(**small, position="nope", asentmax_init="zero"))
    ref = Transformer(ModelConfig(**small, asentmax_init="reference"))
    t_zero, t_ref = zero.blocks[0].attn.temperature, ref.blocks[0].attn.temperature
    assert t_zero.beta_proj.weight.eq(0).all() and t_zero.gamma_proj.weight.eq(0).all()
    assert t_ref.beta_proj.weight.abs().max() > 0 and t_ref.beta_proj.bias.eq(0).all()
    theta = t_zero(torch.randn(1, 3, 16), torch.tensor([[1, 2, 3]]))  # 1 + log 2 * log(n+1)^0
    torch.testing.assert_close(theta, torch.full_like(theta, 1 + math.log(2)))
    assert t_zero.beta_proj.bias.eq(0).all() and t_zero.gamma_proj.bias.eq(0).all()  # the default: exactly 0
    ssmax = Transformer(ModelConfig(**small, attention="ssmax", ssmax_form="plain"))
    assert ssmax.blocks[0].attn.temperature.s.tolist() == pytest.approx([1 / math.log(65)])  # 1 NoPE head


@pytest.mark.parametrize("beta_init, gamma_init, gamma_range", [(1.0, 1.0, 2.0), (0.05, -0.7, 1.0),
                                                                (30.0, 1.9, 2.0), (None, 0.4, 0.5)])
@pytest.mark.parametrize("init", ["zero", "normal"])
def test_initial_beta_and_gamma_set_the_biases(beta_init, gamma_init, gamma_range, init, request):
    """beta = softplus(w.x + b_beta) and gamma = gamma_range tanh(w.x + b_gamma) start at the configured
    values where w.x = 0: with zero weights theta = 1 + beta_init log(n+1)^gamma_init at every query (fp64
    closed form); normal weights keep their draw and only the biases move."""
    config = ModelConfig(vocab_size=5, d_model=16, n_heads=4, asentmax_init=init, gamma_range=gamma_range,
                         asentmax_beta_init=beta_init, asentmax_gamma_init=gamma_init)
    torch.set_default_dtype(torch.float64)  # parameters made in fp64: the biases as set, not fp32-rounded
    request.addfinalizer(lambda: torch.set_default_dtype(torch.float32))
    torch.manual_seed(0)
    temperature = Transformer(config).blocks[0].attn.temperature
    assert temperature.beta_proj.bias.dtype == torch.float64
    beta = torch.nn.functional.softplus(temperature.beta_proj.bias)
    gamma = gamma_range * torch.tanh(temperature.gamma_proj.bias)
    expected_beta = math.log(2) if beta_init is None else beta_init
    torch.testing.assert_close(beta, torch.full_like(beta, expected_beta), rtol=1e-12, atol=0)
    torch.testing.assert_close(gamma, torch.full_like(gamma, gamma_init), rtol=1e-12, atol=1e-15)
    n_keys = torch.tensor([[1, 2, 5, 64, 4096]])
    theta = temperature(torch.zeros(1, 5, 16, dtype=torch.float64), n_keys)  # w.x = 0 whatever the weights
    closed = 1 + expected_beta * torch.log(n_keys.double() + 1) ** gamma_init
    torch.testing.assert_close(theta[:, 2:], closed[:, None].expand(1, 2, 5), rtol=1e-12, atol=0)
    assert theta[:, :2].eq(1).all()  # the ALiBi heads of NAPE
    if init == "normal":
        torch.manual_seed(0)
        default = Transformer(ModelConfig(vocab_size=5, d_model=16, n_heads=4, asentmax_init=init,
                                          gamma_range=gamma_range)).blocks[0].attn.temperature
        assert torch.equal(temperature.beta_proj.weight, default.beta_proj.weight)


def test_summarise_stats():
    model = Transformer(ModelConfig(vocab_size=7, d_model=16, n_heads=2, n_layers=2, attention="softmax",
                                    position="nope"))
    mask = torch.tensor([[False, True, True, True]])
    _, stats = model(torch.ones(1, 4, dtype=torch.long), attention_mask=mask, return_stats=True)
    summary = summarise_stats(stats)
    assert set(summary) == {"entropy", "normalised_entropy", "support_size", "theta", "theta_std"}
    assert len(summary["support_size"]) == 2 and len(summary["support_size"][0]) == 2
    # softmax with identical tokens: uniform over the n_i real keys -> support (1 + 2 + 3) / 3, H/log n = 1
    assert summary["support_size"][0][0] == pytest.approx(2.0)
    assert summary["normalised_entropy"][1][1] == pytest.approx(1.0)
    assert summary["theta"][0] == [1.0, 1.0] and summary["theta_std"][0] == [0.0, 0.0]
