"""Transformer invariants: KV-cache decoding == full forward (every normaliser x position, fp64), padding
invariance, n_i while decoding, backend parity, gradients into the temperature parameters (checked by
finite differences), a few optimisation steps reduce the loss, and clear errors for bad inputs."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from asentmax.nn import KVCache, ModelConfig, Transformer
from asentmax.nn import attention as attention_module

NORMALISERS = ("softmax", "ssmax", "topk", "entmax", "asentmax")
POSITIONS = ("nope", "alibi", "rope", "nape")
COMBOS = list(itertools.product(NORMALISERS, POSITIONS))
VOCAB = 13


def make_model(attention, position, seed=0, **overrides) -> Transformer:
    base = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, topk_k=3,
                attention=attention, position=position, attention_backend="chunked")
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**base, **overrides})).double()
    with torch.no_grad():  # non-trivial temperatures (the zero init makes theta constant over tokens)
        for block in model.blocks:
            temperature = block.attn.temperature
            for name, p in ([] if temperature is None else temperature.named_parameters()):
                p.copy_(0.3 * torch.randn_like(p).abs() if name == "s" else 0.5 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("attention,position", COMBOS, ids=lambda v: str(v))
def test_cached_decoding_equals_full_forward(attention, position):
    """Prefill 5 tokens, then a 3-token chunk, then 1 token at a time; also with a left-padded row."""
    model = make_model(attention, position)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    cache = KVCache()
    steps = [model(ids[:, :5], cache=cache), model(ids[:, 5:8], cache=cache)]
    steps += [model(ids[:, t:t + 1], cache=cache) for t in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    assert cache.length == 12 and cache.n_real.tolist() == [12, 12]

    # row 1 left-padded by 4: its real-token logits must equal the unpadded row's
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids[1:, :8]], dim=1)
    mask = torch.tensor([[True] * 12, [False] * 4 + [True] * 8])
    cache = KVCache()
    prefill = model(torch.cat([ids[:1, :12], padded]), attention_mask=mask, cache=cache)
    assert cache.n_real.tolist() == [12, 8]
    torch.testing.assert_close(prefill[1, 4:], model(ids[1:, :8])[0], rtol=1e-10, atol=1e-12)
    step = model(torch.stack([ids[0, :1], ids[1, 8:9]]), cache=cache)
    torch.testing.assert_close(step[1, 0], full[1, 8], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attention,position", [("asentmax", "nape"), ("softmax", "alibi"), ("topk", "rope")],
                         ids=lambda v: str(v))
def test_right_padding_without_cache(attention, position):
    model = make_model(attention, position)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    logits = model(ids, attention_mask=mask)
    torch.testing.assert_close(logits[1, :6], model(ids[1:, :6])[0], rtol=1e-10, atol=1e-12)
    assert torch.isfinite(logits).all()


def test_n_keys_while_decoding():
    model = make_model("asentmax", "nape")
    cache = KVCache()
    mask = torch.tensor([[False, False, True, True, True], [True] * 5])
    _, stats = model(torch.ones(2, 5, dtype=torch.long), attention_mask=mask, cache=cache, return_stats=True)
    assert stats[0].n_keys.tolist() == [[1, 1, 1, 2, 3], [1, 2, 3, 4, 5]]
    _, stats = model(torch.ones(2, 1, dtype=torch.long), cache=cache, return_stats=True)
    assert stats[1].n_keys.tolist() == [[4], [6]]  # real cached tokens + 1
    assert len(stats) == 2 and stats[0].theta.shape == (2, 4, 1)


STAT_NAMES = ("entropy", "normalised_entropy", "support_size", "theta", "n_keys")


@pytest.mark.parametrize("attention,position", [("asentmax", "nape"), ("softmax", "alibi"), ("topk", "rope"),
                                                ("ssmax", "nope")], ids=lambda v: str(v))
@pytest.mark.parametrize("elements", [1, 2 * 2 * 4 * 12], ids=["one_query_a_block", "a_few_queries_a_block"])
def test_stats_in_query_blocks_equal_one_block(attention, position, elements, monkeypatch):
    """Attention._stats over blocks of queries (STATS_CHUNK_ELEMENTS) gives every layer's statistics of one
    dense block, for a left-padded prompt and then a cached chunk (queries at an offset), fp64; and a padded
    row's real queries get the statistics of the row alone."""
    model = make_model(attention, position)
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[True] * 12, [False] * 3 + [True] * 9])

    def stats_of(chunk_elements):
        monkeypatch.setattr(attention_module, "STATS_CHUNK_ELEMENTS", chunk_elements)
        cache = KVCache()
        _, prompt = model(ids[:, :5], attention_mask=mask[:, :5], cache=cache, return_stats=True)
        _, chunk = model(ids[:, 5:], cache=cache, return_stats=True)  # 7 queries after 5 cached slots
        return prompt + chunk

    blocked, whole = stats_of(elements), stats_of(2**40)
    for got, want in zip(blocked, whole, strict=True):
        for name in STAT_NAMES:
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-12, atol=1e-12,
                                       equal_nan=True)
    monkeypatch.setattr(attention_module, "STATS_CHUNK_ELEMENTS", elements)
    _, alone = model(ids[1:, 3:], return_stats=True)
    _, padded = model(ids, attention_mask=mask, return_stats=True)
    for got, want in zip(padded, alone, strict=True):
        for name in STAT_NAMES[:4]:
            torch.testing.assert_close(getattr(got, name)[1:, ..., 3:], getattr(want, name), rtol=1e-10,
                                       atol=1e-10, equal_nan=True)


@pytest.mark.parametrize("attention", ["entmax", "asentmax"])
def test_backend_parity_reference_vs_chunked(attention):
    ids = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 17, dtype=torch.bool)
    mask[1, :5] = False
    results = []
    for backend in ("reference", "chunked"):
        model = make_model(attention, "nape", attention_backend=backend)
        logits = model(ids, attention_mask=mask)
        logits[mask].square().sum().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (ref, ref_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked[mask], ref[mask], rtol=1e-10, atol=1e-12)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-8, atol=1e-10, msg=name)


def _loss(model, ids):
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


TEMPERATURE_PARAMETERS = [("asentmax", "beta_proj.bias"), ("asentmax", "gamma_proj.bias"),
                          ("asentmax", "beta_proj.weight"), ("ssmax", "s")]


@pytest.mark.parametrize("attention,parameter", TEMPERATURE_PARAMETERS)
def test_gradients_reach_temperature_parameters(attention, parameter):
    """Autograd gradient of the temperature parameters == central finite difference (fp64)."""
    model = make_model(attention, "nape")
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(4))
    param = model.blocks[0].attn.temperature.get_parameter(parameter)
    _loss(model, ids).backward()
    grad = param.grad.flatten()
    assert grad.abs().max() > 1e-6
    index, eps = int(grad.abs().argmax()), 1e-6
    with torch.no_grad():
        flat = param.view(-1)
        flat[index] += eps
        plus = _loss(model, ids)
        flat[index] -= 2 * eps
        minus = _loss(model, ids)
        flat[index] += eps
    torch.testing.assert_close(grad[index], (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("attention", NORMALISERS)
def test_optimisation_reduces_loss(attention):
    model = make_model(attention, "nape", seed=5).float()
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(4, VOCAB, (4, 16), generator=gen)
    ids[:, 8:] = ids[:, :8]  # second half copies the first: learnable by attention
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        loss = _loss(model, ids)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0], losses


def test_alibi_needs_contiguous_tokens_with_cache():
    model = make_model("entmax", "nape")
    cache = KVCache()
    model(torch.ones(1, 4, dtype=torch.long), attention_mask=torch.tensor([[True, True, False, False]]),
          cache=cache)
    with pytest.raises(ValueError, match="contiguous"):
        model(torch.ones(1, 1, dtype=torch.long), cache=cache)


def test_alibi_contiguity_checked_once_per_padded_prompt(monkeypatch):
    """The check (a host sync) runs on the left-padded prompt and on a step that brings its own mask, not
    on decoding steps that only append real tokens to rows known to end with one."""
    from asentmax.nn import model as model_module

    calls = []
    check = model_module._check_contiguous
    monkeypatch.setattr(model_module, "_check_contiguous",
                        lambda mask: calls.append(mask.shape) or check(mask))
    model = make_model("entmax", "nape")
    cache = KVCache()
    model(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.tensor([[False, True, True, True]] * 2),
          cache=cache)
    for _ in range(3):
        model(torch.ones(2, 1, dtype=torch.long), cache=cache)
    assert calls == [(2, 4)]
    model(torch.ones(2, 1, dtype=torch.long), attention_mask=torch.tensor([[True], [False]]), cache=cache)
    assert calls == [(2, 4), (2, 8)]
    with pytest.raises(ValueError, match="contiguous"):  # row 1 now ends with padding: checked again
        model(torch.ones(2, 1, dtype=torch.long), cache=cache)


def test_bad_forward_inputs():
    model = make_model("softmax", "nope")
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.ones(2, 3))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="no tokens"):
        model(torch.ones(2, 0, dtype=torch.long))
    cache = KVCache()
    model(torch.ones(2, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="cache holds 2 rows"):
        model(torch.ones(3, 1, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("attention,position", [("softmax", "nape"), ("ssmax", "alibi"), ("ssmax", "nope")],
                         ids=lambda v: str(v))
def test_softmax_without_sdpa_mask_matches_sdpa(attention, position, monkeypatch):
    """Above SDPA_MASK_LIMIT, softmax/SSMax run through entmax_attention(alpha=1): same logits and grads."""
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[0, :4] = False
    results = []
    for limit in (2**62, 0):
        monkeypatch.setattr(attention_module, "SDPA_MASK_LIMIT", limit)
        model = make_model(attention, position)
        logits = model(ids, attention_mask=mask)
        logits[mask].square().sum().backward()
        results.append((logits.detach()[mask], [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-10, atol=1e-12)
    for grad_sdpa, grad_chunked in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(grad_chunked, grad_sdpa, rtol=1e-8, atol=1e-10)


def test_gelu_untied_gqa1_variant():
    model = make_model("asentmax", "rope", mlp="gelu", tie_embeddings=False, n_kv_heads=1)
    assert model.head.weight is not model.embed.weight and model.blocks[0].mlp.w_gate is None
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(7))
    cache = KVCache()
    steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), model(ids), rtol=1e-10, atol=1e-12)
    tied = make_model("softmax", "nope")
    assert tied.head.weight is tied.embed.weight
