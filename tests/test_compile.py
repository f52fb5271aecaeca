"""torch.compile(model, fullgraph=True) on CPU equals eager for every normaliser: training (forward and
backward), padded batches and KV-cache decoding, with a bounded number of compiled graphs across lengths.

The attention kernels are torch custom ops (asentmax::chunked_attention on CPU, asentmax::attention_* for
Triton, run here by the interpreter), so a compiled model holds them as single opaque calls: fullgraph=True
fails on any graph break. The "aot_eager" backend runs dynamo and AOT autograd (the fake kernels, the
autograd registrations) without Inductor's C++ code generation, which would take minutes per model here;
the GPU file tests/test_compile_gpu.py compiles with Inductor.
"""

import logging
from contextlib import contextmanager

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from asentmax.nn import ModelConfig, Transformer
from asentmax.nn.generation import generate
from asentmax.nn.normalisers import NAMES
from asentmax.ops import triton as triton_backend
from conftest import randomize_temperatures

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 13


def make_model(attention, position, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=48, topk_k=4, init_std=0.2,
                      attention=attention, position=position, **overrides)
    model = Transformer(cfg)
    randomize_temperatures(model)
    return model


def compiled(model, backend="aot_eager"):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    return torch.compile(model, fullgraph=True, backend=counter), counter


def loss_and_grads(model, call, ids, mask=None):
    """Logits of call(ids) and the gradient of every parameter (by name) of mean(logits^2)."""
    model.zero_grad()
    logits = call(ids, attention_mask=mask)
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_training(model, call, ids, mask=None):
    eager_logits, eager_grads = loss_and_grads(model, model, ids, mask)
    logits, grads = loss_and_grads(model, call, ids, mask)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    for name, want in eager_grads.items():
        torch.testing.assert_close(grads[name], want, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def assert_same_gradients(grads, eager_grads, limit):
    """Every gradient within `limit` of eager, relative: max |g - g_eager| / max |g_eager| < limit."""
    assert grads.keys() == eager_grads.keys()
    for name, want in eager_grads.items():
        error = ((grads[name] - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        assert error < limit, f"{name}: compiled gradient off eager by {error:.2e} relative (limit {limit:g})"


CASES = [(name, "nape") for name in NAMES] + [("asentmax", p) for p in ("nope", "alibi", "rope")]


@pytest.mark.parametrize("attention,position", CASES, ids=lambda v: str(v))
def test_compiled_training_equals_eager(attention, position):
    model = make_model(attention, position)
    call, counter = compiled(model)
    ids = torch.randint(0, VOCAB, (2, 11))
    assert_same_training(model, call, ids)
    assert counter.frame_count == 1  # one graph, no break


def test_compiled_padded_batch_equals_eager():
    model = make_model("asentmax", "nape")
    call, counter = compiled(model)
    ids = torch.randint(0, VOCAB, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :4] = False  # left padding
    mask[1, :1] = False
    assert_same_training(model, call, ids, mask)
    assert counter.frame_count == 1


@pytest.mark.parametrize("attention", ["asentmax", "softmax"])
def test_recompiles_across_lengths_are_bounded(attention):
    """Three sequence lengths: the first compiles a static graph, the second a dynamic one that serves
    every later length."""
    model = make_model(attention, "nape")
    call, counter = compiled(model)
    for length in (9, 14, 21):
        assert_same_training(model, call, torch.randint(0, VOCAB, (2, length)))
    assert counter.frame_count <= 2


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("position,backend", [("nope", "aot_eager"), ("nape", "inductor")])
def test_compiled_ssmax_gradients_equal_eager(position, backend):
    """SSMax's s: every gradient of the compiled model within 2e-5 of eager (fp32, relative), over awkward
    lengths sharing one graph with a dynamic sequence dimension (as the trainer compiles), Inductor included
    (its C++ code here; on the GPU its Triton code gets s wrong: tests/test_compile_gpu.py)."""
    model = make_model("ssmax", position)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    call = torch.compile(model, fullgraph=True, backend=counter)
    for length in (13, 130, 67):
        ids = torch.randint(0, VOCAB, (3, length), generator=torch.Generator().manual_seed(length))
        eager_logits, eager_grads = loss_and_grads(model, model, ids)
        torch._dynamo.maybe_mark_dynamic(ids, 1)
        logits, grads = loss_and_grads(model, call, ids)
        torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-5)
        assert sum(name.endswith("temperature.s") for name in grads) == 2
        assert_same_gradients(grads, eager_grads, 2e-5)
    assert counter.frame_count == 1


@contextmanager
def recompile_reasons():
    """Collects dynamo's recompilation messages (the guard that failed, with the user's line), so that a
    graph-count assertion can say why each extra graph was compiled."""
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    torch._logging.set_logs(recompiles=True)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()


def test_recompile_reasons_are_collected():
    model = make_model("softmax", "nape").eval()
    call, _ = compiled(model)
    with recompile_reasons() as reasons:
        generate(call, torch.randint(0, VOCAB, (2, 5)), 3)
    assert any("cache" in reason for reason in reasons), reasons


@pytest.mark.parametrize("attention", ["asentmax", "ssmax"])
def test_compiled_decoding_equals_eager(attention):
    """KV-cache greedy decoding through the compiled model gives the eager tokens; the graphs (prefill and
    decoding step, each static then dynamic: 4) stop growing after the second prompt length."""
    model = make_model(attention, "nape").eval()
    call, counter = compiled(model)
    counts = []
    for length in (5, 8, 12):
        ids = torch.randint(0, VOCAB, (2, length))
        assert torch.equal(generate(call, ids, 6), generate(model, ids, 6))
        counts.append(counter.frame_count)
    assert counts[-1] == counts[-2] and counts[-1] <= 4, counts


def test_inductor_decoding_compiles_four_graphs():
    """The same bound through Inductor, which aot_eager cannot show: Inductor returned the prefill's n_real
    (B,) as a stride-0 broadcast of the prompt length (previous + counts[:, -1] with counts an expanded
    arange), so the first decoding step after a second prompt length failed the stride guard of the
    dynamic step and compiled a fifth graph (softmax, entmax and topk on the H200: [3, 5, 5])."""
    model = make_model("softmax", "nape").eval()
    call, counter = compiled(model, "inductor")
    counts = []
    with recompile_reasons() as reasons:
        for length in (5, 8, 12):
            ids = torch.randint(0, VOCAB, (2, length))
            assert torch.equal(generate(call, ids, 3), generate(model, ids, 3))
            counts.append(counter.frame_count)
    assert counts == [3, 4, 4], (counts, reasons)


@pytest.mark.skipif(not triton_backend.is_available(), reason="needs triton (TRITON_INTERPRET=1 on CPU)")
def test_compiled_triton_custom_ops_equal_eager():
    """The Triton kernels' custom ops (fused forward + backward, decoding) compile into one graph."""
    model = make_model("asentmax", "nape", attention_backend="triton")
    call, counter = compiled(model)
    assert_same_training(model, call, torch.randint(0, VOCAB, (2, 17)))  # > 16 rows: the fused kernels
    assert counter.frame_count == 1
    model.eval()
    ids = torch.randint(0, VOCAB, (2, 5))
    assert torch.equal(generate(call, ids, 2), generate(model, ids, 2))


def attention_inputs(n_q=20, n_k=20, dim=16):
    torch.manual_seed(0)
    q = torch.randn(2, 4, n_q, dim, requires_grad=True)
    k, v = (torch.randn(2, 2, n_k, dim, requires_grad=True) for _ in range(2))
    q_scale = (torch.rand(2, n_q, 4) + 0.5).transpose(1, 2).requires_grad_()  # strided, as the model's
    slopes = torch.tensor([[1.0, 0.5, 0.0, 0.0]] * 2)
    kpm = torch.ones(2, n_k, dtype=torch.bool)
    kpm[1, :3] = False
    return q, k, v, q_scale, slopes, kpm


def test_chunked_custom_op_passes_opcheck():
    """Schema, fake (shapes and strides) and autograd registration of asentmax::chunked_attention."""
    q, k, v, q_scale, slopes, kpm = attention_inputs(n_q=12)
    lengths = torch.tensor([k.shape[2], 12] + [k.shape[2] - 1] * (k.shape[0] - 2))
    for with_support, kv_lengths in ((False, None), (True, None), (True, lengths)):
        torch.library.opcheck(torch.ops.asentmax.chunked_attention.default,
                              (q, k, v, q_scale, slopes, kpm, kv_lengths, 1.5, True, 0.25, 5, with_support))


@pytest.mark.skipif(not triton_backend.is_available(), reason="needs triton (TRITON_INTERPRET=1 on CPU)")
def test_triton_custom_ops_pass_opcheck():
    from asentmax.ops.triton import attention as triton_attention  # noqa: F401  (registers the ops)

    q, k, v, q_scale, slopes, kpm = attention_inputs()
    slopes4, kpm8 = slopes.contiguous(), kpm.to(torch.uint8)
    q_scale = q_scale.detach().contiguous().requires_grad_()
    torch.library.opcheck(torch.ops.asentmax.attention_fwd.default,
                          (q, k, v, q_scale, slopes4, kpm8, 1.5, True, 0.25, True, True))
    lengths = torch.full((k.shape[0],), k.shape[2] - 3, dtype=torch.int32)
    with torch.no_grad():
        for kv_lengths in (None, lengths):
            torch.library.opcheck(torch.ops.asentmax.attention_decode.default,
                                  (q[:, :, -2:], k, v, q_scale[:, :, -2:].contiguous(), slopes4, kpm8,
                                   kv_lengths, 1.5, True, 0.25),
                                  test_utils=("test_schema", "test_faketensor"))
