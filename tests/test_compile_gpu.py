"""GPU checks of torch.compile (run on the H200; skipped elsewhere): with Inductor and the Triton kernels
as custom ops, torch.compile(model, fullgraph=True) equals eager for every normaliser and position, in
training (forward and every gradient, fp32) and in KV-cache greedy decoding; the number of compiled graphs
across three lengths stays bounded; and a decoding step makes no host synchronisation. SSMax trains
through the fused kernel's softmax mode: through SDPA, Inductor's CUDA code gave the gradient of its s wrong
(torch 2.11; results/gpu_tests_session4.md, results/gpu_tests_session8.md).

Run: PYTHONPATH=src python -m pytest -q -m gpu tests/test_compile_gpu.py
"""

import pytest
import torch

from asentmax.nn import KVCache, ModelConfig, Transformer
from asentmax.nn.generation import generate
from asentmax.nn.normalisers import NAMES
from asentmax.nn.presets import PAPER_CODE_BLOCKS
from conftest import randomize_temperatures
from test_compile import assert_same_gradients, compiled, loss_and_grads, recompile_reasons

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
VOCAB = 64
POSITIONS = ("nope", "alibi", "rope", "nape")


def cuda_model(attention, position, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, d_model=128, n_layers=2, n_heads=8, d_ff=256, topk_k=8,
                      attention=attention, position=position, **overrides)
    model = Transformer(cfg).cuda()
    randomize_temperatures(model)
    return model


def ids_of(batch, length, seed=1):
    return torch.randint(0, VOCAB, (batch, length), device="cuda",
                         generator=torch.Generator("cuda").manual_seed(seed))


def assert_same_training(model, call, ids):
    eager_logits, eager_grads = loss_and_grads(model, model, ids)
    logits, grads = loss_and_grads(model, call, ids)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-3, atol=1e-3)
    assert_same_gradients(grads, eager_grads, 1e-2)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", NAMES)
def test_compiled_training_equals_eager(attention, position):
    model = cuda_model(attention, position)
    call, counter = compiled(model, "inductor")
    assert_same_training(model, call, ids_of(4, 130))
    assert counter.frame_count == 1


@pytest.mark.parametrize("attention", ["softmax", "asentmax"])
def test_compiled_paper_code_blocks_equal_eager(attention):
    """The Gemma-2 blocks of the paper's code (nn/presets.py PAPER_CODE_BLOCKS, a frozen zero embedding)."""
    model = cuda_model(attention, "nape", **PAPER_CODE_BLOCKS, zero_embedding_id=4)
    call, counter = compiled(model, "inductor")
    assert_same_training(model, call, ids_of(4, 130))
    assert counter.frame_count == 1


@pytest.mark.parametrize("attention", NAMES)
def test_recompiles_across_lengths_are_bounded(attention):
    model = cuda_model(attention, "nape")
    call, counter = compiled(model, "inductor")
    for length in (80, 120, 200):
        assert_same_training(model, call, ids_of(4, length))
    assert counter.frame_count <= 2


@pytest.mark.parametrize("attention", NAMES)
def test_compiled_decoding_equals_eager(attention):
    model = cuda_model(attention, "nape").eval()
    call, counter = compiled(model, "inductor")
    counts = []
    with recompile_reasons() as reasons:
        for length in (20, 33, 47):
            ids = ids_of(3, length, seed=length)
            assert torch.equal(generate(call, ids, 12), generate(model, ids, 12))
            counts.append(counter.frame_count)
    assert counts[-1] == counts[-2] and counts[-1] <= 4, (counts, reasons)


@pytest.mark.parametrize("attention", NAMES)
def test_decoding_step_does_not_synchronise(attention):
    """A host sync per step serialises CPU launches and GPU work (decoding once copied the ALiBi slopes,
    and for softmax a -inf scalar, to the device at every step)."""
    model = cuda_model(attention, "nape").eval()
    cache = KVCache()
    with torch.no_grad():
        logits = model(ids_of(8, 40), cache=cache)[:, -1]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(4):
                logits = model(logits.argmax(-1)[:, None], cache=cache)[:, -1]
        finally:
            torch.cuda.set_sync_debug_mode("default")
