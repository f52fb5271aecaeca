"""The SSMax inverse-temperature op asentmax::ssmax_q_scale (delta + s_h log(n_i + 1), arXiv:2506.16640,
section 2): values against a Python-float loop, gradients against finite differences (fp64 gradcheck, and
gradgradcheck, which takes the differentiable backward), torch.library.opcheck of both ops (schema, fake
tensors, autograd registration); in eager mode its results are bit for bit those of the plain expression."""

import math

import pytest
import torch

from asentmax.ops.ssmax import ssmax_q_scale

pytestmark = pytest.mark.usefixtures("one_thread")


def inputs(dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    s = (torch.rand(3, generator=generator, dtype=dtype) + 0.1).requires_grad_()
    n_keys = torch.tensor([[1, 2, 3, 4, 5], [1, 1, 2, 3, 3]])  # a second row with padding
    return s, n_keys


@pytest.mark.parametrize("delta", [0.0, 1.0])
def test_values_are_delta_plus_s_log_n_plus_one(delta):
    s, n_keys = inputs()
    q_scale = ssmax_q_scale(s, n_keys, delta)
    assert q_scale.shape == (2, 3, 5) and q_scale.dtype == torch.float64
    for b in range(2):
        for h in range(3):
            for i in range(5):
                want = delta + s[h].item() * math.log(n_keys[b, i].item() + 1)
                assert q_scale[b, h, i].item() == pytest.approx(want, rel=1e-15)


def test_gradients_match_finite_differences():
    s, n_keys = inputs()
    assert torch.autograd.gradcheck(lambda v: ssmax_q_scale(v, n_keys, 1.0), (s,))
    assert torch.autograd.gradgradcheck(lambda v: ssmax_q_scale(v, n_keys, 1.0).square(), (s,))


def test_ops_pass_opcheck():
    s, n_keys = inputs(torch.float32)
    torch.library.opcheck(torch.ops.asentmax.ssmax_q_scale.default, (s, n_keys, 1.0))
    grad = torch.randn(2, 4, 5)[:, 1:]  # a slice, as the model's gradient (its first head has no s)
    torch.library.opcheck(torch.ops.asentmax.ssmax_q_scale_bwd.default, (grad, n_keys))


def test_eager_results_are_the_plain_expressions_bit_for_bit():
    """The op changes nothing in eager mode: forward and gradient equal those of delta + s * log(n + 1)."""
    generator = torch.Generator().manual_seed(1)
    s = torch.rand(8, generator=generator).requires_grad_()
    n_keys = torch.randint(1, 300, (4, 130), generator=generator)
    grad = torch.randn(4, 12, 130, generator=generator)[:, 4:]
    plain = 0.5 + s[None, :, None] * torch.log(n_keys.float() + 1.0)[:, None, :]
    q_scale = ssmax_q_scale(s, n_keys, 0.5)
    assert torch.equal(q_scale, plain)
    assert torch.equal(torch.autograd.grad(q_scale, s, grad)[0], torch.autograd.grad(plain, s, grad)[0])
