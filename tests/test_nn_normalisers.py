"""The normaliser registry (nn/normalisers.py) is the one table every consumer reads: config validation and
CLI choices, the attention layer's kernel and alpha, the temperature module, dispersion, report labels,
which of alpha and topk_k each reads; and the dispatcher alone picks the attention backend's fallback
(backends never import it)."""

import ast
from pathlib import Path

import pytest
import torch

from asentmax import dispersion, report
from asentmax.nn import ModelConfig, Transformer, config
from asentmax.nn.normalisers import NAMES, NORMALISERS, PARAMETERS, get_normaliser
from asentmax.nn.temperature import TEMPERATURES
from asentmax.ops import attention as dispatcher
from asentmax.ops import triton as triton_backend
from asentmax.ops.types import BACKENDS

OPS = Path(__file__).resolve().parents[1] / "src" / "asentmax" / "ops"


def test_every_consumer_reads_the_registry():
    assert config.ATTENTIONS == NAMES
    assert set(report.METHOD_NAMES) == set(NAMES)
    assert set(dispersion.METHODS) == {n.name for n in NORMALISERS if n.family != "topk"}
    assert config.BACKENDS == BACKENDS


@pytest.mark.parametrize("normaliser", NORMALISERS, ids=lambda n: n.name)
def test_model_follows_the_entry(normaliser):
    cfg = ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=16, attention=normaliser.name)
    attn = Transformer(cfg).blocks[0].attn
    assert attn.normaliser is normaliser
    if normaliser.temperature is None:
        assert attn.temperature is None
    else:
        assert isinstance(attn.temperature, TEMPERATURES[normaliser.temperature])
    if normaliser.family != "entmax":
        assert normaliser.alpha(1.7) == 1.0
    else:
        assert normaliser.alpha(1.7) == (1.7 if normaliser.takes_config_alpha else normaliser.fixed_alpha)


# two values of each parameter, and settings under which they differ in effect (the ASEntmax projections
# drawn at random: at their zero init gamma is 0 and gamma_range changes nothing)
PARAMETER_VALUES = [("alpha", (1.5, 1.8), {}), ("topk_k", (2, 5), {}), ("theta_delta", (1.0, 0.5), {}),
                    ("gamma_range", (1.0, 2.0), {"asentmax_init": "normal"}),
                    ("asentmax_beta_init", (None, 2.0), {}), ("asentmax_gamma_init", (0.0, 1.0), {}),
                    ("ssmax_form", ("delta", "plain"), {}),
                    ("ssmax_s_init", (0.5, 1.0), {})]


def test_every_parameter_is_tested():
    assert sorted(p for p, _, _ in PARAMETER_VALUES) == sorted(PARAMETERS)
    with pytest.raises(ValueError, match="not one of"):
        NORMALISERS[0].reads("d_model")


@pytest.mark.parametrize("parameter,values,settings", PARAMETER_VALUES,
                         ids=[p for p, _, _ in PARAMETER_VALUES])
@pytest.mark.parametrize("normaliser", NORMALISERS, ids=lambda n: n.name)
def test_reads_says_whether_the_parameter_changes_the_model(normaliser, parameter, values, settings):
    tokens = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(0))
    outputs = []
    for value in values:
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=16,
                          attention=normaliser.name, **{**settings, parameter: value})
        with torch.no_grad():
            outputs.append(Transformer(cfg)(tokens))
    assert normaliser.reads(parameter) == (not torch.equal(*outputs))


def test_probabilities_against_hand_values():
    z = torch.tensor([[2.0, 1.0, 0.0, float("-inf")]], dtype=torch.float64)
    soft = torch.tensor([2.0, 1.0, 0.0]).exp()
    torch.testing.assert_close(get_normaliser("softmax").probabilities(z, 1.0, 4)[0, :3],
                               (soft / soft.sum()).double())
    # entmax-1.5 of (2, 1, 0): p = [z/2 - t]_+^2 with t = (3 - sqrt 7) / 4 > 0, so the logit 0 gets exactly 0
    sparse = get_normaliser("entmax").probabilities(z, 1.5, 4)
    t = (3 - 7**0.5) / 4
    want = torch.tensor([(1 - t) ** 2, (0.5 - t) ** 2, 0, 0], dtype=torch.float64)
    torch.testing.assert_close(sparse[0], want)
    top2 = get_normaliser("topk").probabilities(z, 1.0, 2)
    torch.testing.assert_close(top2[0], torch.tensor([soft[0], soft[1], 0, 0], dtype=torch.float64)
                               / (soft[0] + soft[1]))


def test_unknown_normaliser_is_one_line_error():
    with pytest.raises(ValueError, match="unknown attention normaliser 'softermax'"):
        get_normaliser("softermax")


def test_backends_never_import_the_dispatcher():
    for path in [OPS / "reference.py", OPS / "chunked.py", *sorted((OPS / "triton").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "asentmax.ops.attention", path
                names = {a.name for a in node.names}
                assert not (node.module == "asentmax.ops" and "attention" in names), path


def test_dispatcher_decides_the_fallback():
    q = torch.zeros(1, 1, 4, 8)
    assert dispatcher.choose_backend("auto", q, 1.5) == "chunked"  # CPU tensor
    assert dispatcher.choose_backend("reference", q, 3.0) == "reference"
    if triton_backend.is_available():
        assert dispatcher.choose_backend("triton", q, 1.5) == "triton"
        assert dispatcher.choose_backend("triton", q, 2.5) == "chunked"  # alpha outside the kernels' range
        wide = torch.zeros(1, 1, 4, triton_backend.SUPPORT.max_head_dim + 8)
        assert dispatcher.choose_backend("triton", wide, 1.5) == "chunked"
