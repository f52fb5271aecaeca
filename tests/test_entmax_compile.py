"""torch.compile through asentmax.ops.entmax.entmax (issue 14, item 1): the forward is the custom op
`asentmax::entmax` (torch.library, with a fake kernel and registered autograd), so fullgraph=True traces a
function calling entmax without graph breaks, and forward and backward equal eager. CPU in CI (inductor);
the Triton row kernel path on the GPU (`gpu` marker) and, under TRITON_INTERPRET=1, with aot_eager.
"""

import os

import pytest
import torch

from asentmax.ops.entmax import entmax


def weighted_loss(x, alpha, backend="auto"):
    weights = torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype, device=x.device)
    return (entmax(x, alpha, backend=backend) * weights).sum()


def _parity(compiled, x, alpha, **kwargs):
    inputs = (x, alpha) if isinstance(alpha, torch.Tensor) else (x,)
    got = compiled(x, alpha, **kwargs)
    got_grads = torch.autograd.grad(got, inputs)
    expected = weighted_loss(x, alpha, **kwargs)
    expected_grads = torch.autograd.grad(expected, inputs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_compile_fullgraph_cpu_matches_eager():
    torch._dynamo.reset()
    x = (torch.randn(6, 40, generator=torch.Generator().manual_seed(0)) * 3).requires_grad_(True)
    _parity(torch.compile(weighted_loss, fullgraph=True), x, 1.5)  # inductor (slow to compile: once)
    traced = torch.compile(weighted_loss, fullgraph=True, backend="aot_eager")
    _parity(traced, x, 4.0)
    _parity(traced, x, torch.full((6, 1), 1.3, requires_grad=True))


def test_compile_refuses_bad_tensor_alpha_inside_the_op():
    compiled = torch.compile(weighted_loss, fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="alpha must be in"):
        compiled(torch.randn(2, 5), torch.tensor([[1.5], [12.0]]))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_compile_triton_path_interpreter():
    pytest.importorskip("triton")
    compiled = torch.compile(weighted_loss, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    _parity(compiled, x, 1.5, backend="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25, 4.0])
def test_compile_fullgraph_cuda(alpha):
    """alpha <= 2: the Triton row kernel inside the graph; 4.0: the torch path behind the custom op."""
    torch._dynamo.reset()
    compiled = torch.compile(weighted_loss, fullgraph=True)
    x = (torch.randn(64, 1000, device="cuda") * 2).requires_grad_(True)
    _parity(compiled, x, alpha)
    explanation = torch._dynamo.explain(weighted_loss)(x, alpha)
    assert explanation.graph_break_count == 0


def test_new_lengths_do_not_recompile_each_time():
    """The fake kernel works with symbolic shapes: after the first recompile (dims marked dynamic) new row
    lengths and row counts reuse the graph."""
    from torch._dynamo.testing import CompileCounter

    def loss(x, weights):
        return (entmax(x, 1.5) * weights).sum()

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(loss, fullgraph=True, backend=counter)
    for rows, n in ((4, 10), (5, 20), (6, 30), (7, 45)):
        x = torch.randn(rows, n, requires_grad=True)
        torch.autograd.grad(compiled(x, torch.randn(rows, n)), (x,))
    assert counter.frame_count <= 2
