"""A static KV cache (KVCache(static=True), nn/cache.py): after the prompt, its steps attend over whole
buffers with kv_lengths and count on the device. Checked in fp64 against the uncached forward of the whole
sequence (the oracle that needs no cache), for every normaliser that decodes with it and every position
scheme, with left-padded prompts and grouped-query heads, over steps of 1 to 3 tokens; its step shapes
never change (one compiled graph for every step after the first); bad uses are refused in one line. The
CUDA graph that generate(cuda_graph=True) records is tested on a GPU (test_nn_gpu.py).
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import asentmax.ops.attention as dispatcher
from asentmax.nn import KVCache, ModelConfig, Transformer
from asentmax.nn.generation import decodes_with_cuda_graph, generate
from conftest import randomize_temperatures

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 23
STEPS = [1, 2, 1, 3, 1, 1]


def make_model(attention, position, **overrides):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                         init_std=0.2, attention=attention, position=position, **overrides)
    model = Transformer(config).double().eval()
    randomize_temperatures(model)
    return model


def prompt(padded):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 6), generator=gen)
    if not padded:
        return ids, None
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, :2] = False  # left padding: real tokens end at the last slot of every row
    mask[2, :5] = False
    return ids, mask


@pytest.mark.parametrize("attention, position", [
    ("asentmax", "nape"), ("entmax", "alibi"), ("softmax", "rope"), ("ssmax", "nope"), ("softmax", "nape"),
    ("entmax", "rope"),
])
@pytest.mark.parametrize("padded", [False, True])
def test_static_steps_equal_uncached_forward(attention, position, padded):
    model = make_model(attention, position, alpha=1.3 if attention == "entmax" else 1.5)
    ids, mask = prompt(padded)
    cache = KVCache(capacity=ids.shape[1] + sum(STEPS), static=True)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        logits = [model(ids, attention_mask=mask, cache=cache)]
        tokens = ids
        for t in STEPS:
            new = torch.randint(1, VOCAB, (3, t), generator=gen)
            logits.append(model(new, cache=cache))
            tokens = torch.cat([tokens, new], dim=1)
            assert cache.kv_lengths.tolist() == [tokens.shape[1]] * 3
        if mask is not None:
            full_mask = torch.cat([mask, torch.ones_like(tokens[:, 6:], dtype=torch.bool)], dim=1)
        else:
            full_mask = None
        want = model(tokens, attention_mask=full_mask)
    got = torch.cat(logits, dim=1)
    real = slice(None) if mask is None else full_mask
    torch.testing.assert_close(got[real], want[real], rtol=1e-9, atol=1e-10)


def test_static_step_compiles_once():
    """Every step after the first has the same shapes and reads no host value: one graph serves them all
    (graphs: prompt, first step with its set-up, the steps), and the tokens equal eager decoding."""
    model = make_model("asentmax", "nape")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    call = torch.compile(model, fullgraph=True, backend=counter)
    ids, mask = prompt(padded=True)
    caches = KVCache(capacity=20, static=True), KVCache(capacity=20, static=True)
    counts = []
    with torch.no_grad():
        eager, compiled = (m(ids, attention_mask=mask, cache=c)[:, -1] for m, c in zip((model, call), caches,
                                                                                      strict=True))
        for _ in range(8):
            token = eager.argmax(-1)
            assert torch.equal(token, compiled.argmax(-1))
            eager = model(token[:, None], cache=caches[0])[:, -1]
            compiled = call(token[:, None], cache=caches[1])[:, -1]
            torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-10)
            counts.append(counter.frame_count)
    assert counts[1:] == [3] * 7, counts


def test_static_cache_refusals():
    with pytest.raises(ValueError, match="a static cache needs a capacity"):
        KVCache(static=True)
    with pytest.raises(ValueError, match="static must be a bool"):
        KVCache(capacity=4, static=1)
    model = make_model("asentmax", "nape")
    ids, mask = prompt(padded=False)
    with torch.no_grad():
        with pytest.raises(ValueError, match="a static cache of capacity 4 cannot hold 6 slots"):
            model(ids, cache=KVCache(capacity=4, static=True))
        cache = KVCache(capacity=6, static=True)  # buffers of 64 slots
        model(ids, cache=cache)
        with pytest.raises(ValueError, match="take no attention_mask"):
            model(ids[:, :1], attention_mask=torch.ones(3, 1, dtype=torch.bool), cache=cache)
        with pytest.raises(ValueError, match="return_stats is not available"):
            model(ids[:, :1], cache=cache, return_stats=True)
        for _ in range(58):
            model(ids[:, :1], cache=cache)
        with pytest.raises(ValueError, match="a static cache of 64 slots .* cannot hold 65"):
            model(ids[:, :1], cache=cache)
        right_padded = torch.ones(3, 6, dtype=torch.bool)
        right_padded[1, 4:] = False
        cache = KVCache(capacity=8, static=True)
        model(ids, attention_mask=right_padded, cache=cache)
        with pytest.raises(ValueError, match="padded on the left"):
            model(ids[:, :1], cache=cache)
        topk = make_model("topk", "nape", topk_k=3)
        cache = KVCache(capacity=8, static=True)
        topk(ids, cache=cache)
        with pytest.raises(ValueError, match="does not serve top-k"):
            topk(ids[:, :1], cache=cache)


def test_generate_cuda_graph_refusals():
    model = make_model("asentmax", "nape")
    ids, _ = prompt(padded=False)
    with pytest.raises(ValueError, match="cuda_graph must be a bool"):
        generate(model, ids, 3, cuda_graph="yes")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs the model and input_ids on a CUDA device"):
            generate(model, ids, 3, cuda_graph=True)


def test_evaluations_decode_with_cuda_graphs_where_they_can(monkeypatch):
    """decodes_with_cuda_graph: auto is on exactly where a graph can record the step (a CUDA device, not
    top-k attention, no backend that reads the device), off never, on everywhere it can and refused in one
    line naming the setting elsewhere. As on a CUDA machine, the dispatcher finds the Triton kernels."""
    monkeypatch.setattr(dispatcher, "_triton_available", lambda: True)
    asentmax, topk = make_model("asentmax", "nape").config, make_model("topk", "nope").config
    assert decodes_with_cuda_graph("auto", asentmax, "cuda") is True
    assert decodes_with_cuda_graph("on", asentmax, "cuda") is True
    assert decodes_with_cuda_graph("off", asentmax, "cuda") is False
    assert decodes_with_cuda_graph("auto", asentmax, "cpu") is False
    assert decodes_with_cuda_graph("auto", topk, "cuda") is False
    chunked = make_model("asentmax", "nape", attention_backend="chunked").config  # reads the device in a call
    assert decodes_with_cuda_graph("auto", chunked, "cuda") is False
    assert decodes_with_cuda_graph("off", topk, "cpu") is False
    with pytest.raises(ValueError, match="^--cuda-graphs on: cuda_graph=True needs the model and input_ids "
                                         "on a CUDA device$"):
        decodes_with_cuda_graph("on", asentmax, "cpu")
    with pytest.raises(ValueError, match="^graphs on: .*top-k"):
        decodes_with_cuda_graph("on", topk, "cuda", name="graphs")
    with pytest.raises(ValueError, match="^--cuda-graphs yes: must be one of auto, on, off$"):
        decodes_with_cuda_graph("yes", asentmax, "cuda")
