"""SSMax's inverse temperature q_scale_hi = delta + s_h log(n_i + 1) (arXiv:2506.16640, section 2) as a torch
custom op, `asentmax::ssmax_q_scale`, whose backward (d s, a sum over batch and queries) is a second one,
`asentmax::ssmax_q_scale_bwd`.

Why ops and not plain torch: under torch.compile the gradient of s is then computed by the backward op, an
opaque call, instead of a reduction that Inductor fuses with the attention backward's reduction over head
dimensions. That fused kernel returned a wrong gradient of s on the H200 (torch 2.11, Inductor's Triton
code; aot_eager exact; results/gpu_tests_session4.md). Eager results are those of the plain torch
expression: the same operations in the same order (the forward `delta + s * log(n + 1)`, the backward
the sum autograd's broadcast rule takes), so they agree bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _log_length(n_keys: Tensor, dtype: torch.dtype) -> Tensor:
    """log(n_i + 1) (B, 1, T) in `dtype` from n_keys (B, T); >= log 2 > 0."""
    return torch.log(n_keys.to(dtype) + 1.0)[:, None, :]


@torch.library.custom_op("asentmax::ssmax_q_scale", mutates_args=())
def ssmax_q_scale(s: Tensor, n_keys: Tensor, delta: float) -> Tensor:
    """q_scale (B, m, T) = delta + s_h log(n_i + 1) in s's dtype; s (m,) per head, n_keys (B, T) the keys
    each query sees."""
    return delta + s[None, :, None] * _log_length(n_keys, s.dtype)


@ssmax_q_scale.register_fake
def _(s, n_keys, delta):
    return s.new_empty((n_keys.shape[0], s.shape[0], n_keys.shape[1]))


@torch.library.custom_op("asentmax::ssmax_q_scale_bwd", mutates_args=())
def ssmax_q_scale_bwd(grad: Tensor, n_keys: Tensor) -> Tensor:
    """d s (m,) from grad (B, m, T), the gradient of ssmax_q_scale: sum over b, i of grad * log(n_i + 1)."""
    return _s_gradient(grad, n_keys)


@ssmax_q_scale_bwd.register_fake
def _(grad, n_keys):
    return grad.new_empty(grad.shape[1])


def _s_gradient(grad: Tensor, n_keys: Tensor) -> Tensor:
    return (grad * _log_length(n_keys, grad.dtype)).sum((0, 2))


def _setup_context(ctx, inputs, output):
    _, n_keys, _ = inputs
    ctx.save_for_backward(n_keys)


def _backward(ctx, grad):
    """The backward op; create_graph=True (grad mode on) takes the same sum in differentiable torch."""
    (n_keys,) = ctx.saved_tensors
    d_s = _s_gradient(grad, n_keys) if torch.is_grad_enabled() else ssmax_q_scale_bwd(grad, n_keys)
    return d_s, None, None


ssmax_q_scale.register_autograd(_backward, setup_context=_setup_context)
