"""GPU checks of the models (run on the H200; skipped in CI): the Triton attention backend inside the
Transformer agrees with the chunked torch backend (logits and every gradient, fp32), cached decoding equals
the full forward on CUDA, CUDA-graph decoding over a static cache equals eager decoding, padded generate
equals per-row generate, and bf16 autocast training steps stay finite for every normaliser."""

import pytest
import torch

from asentmax.nn import KVCache, ModelConfig, Transformer, mqmtar_model
from conftest import randomize_temperatures

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
VOCAB = 64


def cuda_model(attention, position, backend="auto", **overrides) -> Transformer:
    base = dict(vocab_size=VOCAB, d_model=128, n_layers=2, n_heads=8, n_kv_heads=4, d_ff=256, topk_k=8,
                attention=attention, position=position, attention_backend=backend)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**base, **overrides})).cuda()
    randomize_temperatures(model)
    return model


@pytest.mark.parametrize("attention", ["entmax", "asentmax"])
@pytest.mark.parametrize("position", ["nape", "rope", "alibi"])
def test_triton_backend_matches_chunked_in_the_model(attention, position):
    ids = torch.randint(0, VOCAB, (3, 130), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    mask = torch.ones(3, 130, dtype=torch.bool, device="cuda")
    mask[1, :17] = False
    out = {}
    for backend in ("chunked", "triton"):
        model = cuda_model(attention, position, backend)
        logits = model(ids, attention_mask=mask)
        (logits[mask].float().square().mean()).backward()
        out[backend] = (logits.detach()[mask], {n: p.grad for n, p in model.named_parameters()})
    ref_logits, ref_grads = out["chunked"]
    logits, grads = out["triton"]
    torch.testing.assert_close(logits, ref_logits, rtol=2e-4, atol=2e-4)
    for name, grad in ref_grads.items():
        scale = grad.abs().max().clamp_min(1e-6)
        assert (grads[name] - grad).abs().max() / scale < 2e-3, name


@pytest.mark.parametrize("attention", ["softmax", "ssmax", "topk", "entmax", "asentmax"])
def test_cached_decoding_on_cuda(attention):
    model = cuda_model(attention, "nape")
    ids = torch.randint(0, VOCAB, (2, 40), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache()
        steps = [model(ids[:, :33], cache=cache)]
        steps += [model(ids[:, t:t + 1], cache=cache) for t in range(33, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention, position", [
    ("asentmax", "nape"), ("entmax", "alibi"), ("softmax", "rope"), ("ssmax", "nape")])
def test_cuda_graph_steps_equal_eager_steps(attention, position):
    """Decoding steps replayed from a CUDA graph over a static cache (CapturedStep) give the logits of eager
    steps over the growing cache, step after step, with a left-padded prompt."""
    from asentmax.nn.generation import CapturedStep

    model = cuda_model(attention, position).eval()
    gen = torch.Generator("cuda").manual_seed(3)
    ids = torch.randint(0, VOCAB, (3, 37), device="cuda", generator=gen)
    mask = torch.ones(3, 37, dtype=torch.bool, device="cuda")
    mask[1, :9] = False
    tokens = torch.randint(0, VOCAB, (12, 3), device="cuda", generator=gen)
    with torch.no_grad():
        eager_cache, static_cache = KVCache(capacity=50), KVCache(capacity=50, static=True)
        model(ids, attention_mask=mask, cache=eager_cache)
        model(ids, attention_mask=mask, cache=static_cache)
        step = CapturedStep(model, static_cache)
        for token in tokens:
            want = model(token[:, None], cache=eager_cache)[:, -1]
            torch.testing.assert_close(step(token).clone(), want, rtol=1e-4, atol=1e-4)
    assert step.graph is not None
    assert static_cache.kv_lengths.tolist() == [37 + 12] * 3


@pytest.mark.parametrize("attention", ["asentmax", "softmax"])
def test_generate_with_cuda_graph(attention):
    """generate(cuda_graph=True) gives generate()'s tokens (the same kernels for the entmax family; softmax
    steps run on SDPA eagerly, so its logits may differ in the last bits: compared where they agree)."""
    model = cuda_model(attention, "nape", init_std=0.2).eval()
    ids = torch.randint(0, VOCAB, (4, 21), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    eager = model.generate(ids, 16)
    graphed = model.generate(ids, 16, cuda_graph=True)
    assert graphed.shape == eager.shape and torch.equal(graphed[:, :21], ids)
    if attention == "asentmax":
        assert torch.equal(graphed, eager)
    else:
        assert (graphed == eager).float().mean().item() > 0.9


def test_padded_generate_on_cuda():
    model = cuda_model("asentmax", "nape").double()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    ids = torch.zeros(3, 6, dtype=torch.long, device="cuda")
    mask = torch.zeros(3, 6, dtype=torch.bool, device="cuda")
    for row, p in enumerate(prompts):
        ids[row, 6 - len(p):] = torch.tensor(p)
        mask[row, 6 - len(p):] = True
    out = model.generate(ids, 8, attention_mask=mask)
    for row, p in enumerate(prompts):
        alone = model.generate(torch.tensor([p], device="cuda"), 8)
        assert out[row, 6:].tolist() == alone[0, len(p):].tolist()


@pytest.mark.parametrize("attention", ["softmax", "ssmax", "topk", "entmax", "asentmax"])
def test_bf16_training_steps_on_the_mqmtar_model(attention):
    torch.manual_seed(0)
    model = Transformer(mqmtar_model(VOCAB, attention=attention)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(4, VOCAB, (16, 256), device="cuda")
    ids[:, 128:] = ids[:, :128]
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
