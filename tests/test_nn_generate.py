"""generate(): batched greedy decoding with left or right padding equals unpadded per-row decoding,
greedy tokens are the argmax of a full forward over the generated sequence, eos handling, sampling."""

import pytest
import torch

from asentmax.nn import ModelConfig, Transformer
from asentmax.nn.normalisers import NORMALISERS
from conftest import randomize_temperatures

VOCAB = 17
CASES = [("asentmax", "nape"), ("entmax", "alibi"), ("softmax", "nape"), ("ssmax", "nope"), ("topk", "rope")]


def make_model(attention, position) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=48, topk_k=4,
                      attention=attention, position=position, init_std=0.2)
    model = Transformer(cfg).double()
    randomize_temperatures(model)
    return model


PROMPTS = [[5, 6, 7, 8, 9, 10, 4], [11, 4, 12], [13, 14, 15, 16, 5]]


def padded(side: str):
    width = max(len(p) for p in PROMPTS)
    ids = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    mask = torch.zeros(len(PROMPTS), width, dtype=torch.bool)
    for row, prompt in enumerate(PROMPTS):
        cols = slice(width - len(prompt), width) if side == "left" else slice(0, len(prompt))
        ids[row, cols] = torch.tensor(prompt)
        mask[row, cols] = True
    return ids, mask


# every normaliser with left padding; right padding (realigned to the left) for the two sparse ones
PADDED_CASES = [("left", a, p) for a, p in CASES] + [("right", a, p) for a, p in CASES[:2]]


@pytest.mark.parametrize("side,attention,position", PADDED_CASES, ids=lambda v: str(v))
def test_padded_batch_equals_per_row(side, attention, position):
    model = make_model(attention, position)
    ids, mask = padded(side)
    out = model.generate(ids, 6, attention_mask=mask)
    assert out.shape == (3, ids.shape[1] + 6) and torch.equal(out[:, : ids.shape[1]], ids)
    for row, prompt in enumerate(PROMPTS):
        alone = model.generate(torch.tensor([prompt]), 6)
        assert out[row, ids.shape[1]:].tolist() == alone[0, len(prompt):].tolist()
        # greedy tokens are the argmax of the full (uncached) forward over prompt + generated tokens
        full = model(alone)[0, len(prompt) - 1: -1].argmax(-1)
        assert full.tolist() == alone[0, len(prompt):].tolist()


def test_eos_row_keeps_emitting_eos():
    model = make_model("asentmax", "nape")
    ids, mask = padded("left")
    free = model.generate(ids, 5, attention_mask=mask)
    eos = int(free[0, ids.shape[1]])  # row 0's first generated token becomes the eos id
    out = model.generate(ids, 5, attention_mask=mask, eos_token_id=eos)
    assert out[0, ids.shape[1]:].eq(eos).all()
    for row in (1, 2):
        gen = out[row, ids.shape[1]:].tolist()
        if eos in gen:
            first = gen.index(eos)
            assert all(t == eos for t in gen[first:])
            assert gen[:first] == free[row, ids.shape[1]:][:first].tolist()
        else:
            assert gen == free[row, ids.shape[1]:].tolist()


def test_all_finished_fills_with_eos():
    model = make_model("softmax", "nope")
    prompt = torch.tensor([[5, 6, 7]])
    eos = int(model.generate(prompt, 1)[0, -1])
    assert model.generate(prompt, 4, eos_token_id=eos)[0, 3:].tolist() == [eos] * 4


def test_sampling():
    model = make_model("entmax", "nape")
    ids, mask = padded("left")
    a, b = (model.generate(ids, 6, attention_mask=mask, temperature=1.0,
                           generator=torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(a, b) and a.min() >= 0 and a.max() < VOCAB
    greedy = model.generate(ids, 6, attention_mask=mask)
    top1 = model.generate(ids, 6, attention_mask=mask, temperature=0.7, top_k=1)
    assert torch.equal(top1, greedy)


def test_bad_generate_arguments():
    model = make_model("softmax", "nope")
    ids = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(ids, -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(ids, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(ids, 2, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="at least one real token"):
        model.generate(ids, 2, attention_mask=torch.tensor([[False, False]]))
    assert torch.equal(model.generate(ids, 0), ids)


@pytest.mark.parametrize("attention", [n.name for n in NORMALISERS if n.sdpa])
def test_decoding_builds_no_mask_per_step(attention, monkeypatch):
    """SDPA softmax with ALiBi heads needs an explicit (B, H, T, Nk) mask; a KV-cache decoding step would
    rebuild it for every new token (the cause of softmax decoding being slower than entmax decoding).
    Decoding steps go to the fused entmax_attention(alpha=1) path instead, and give the same tokens as a
    full uncached forward over the generated sequence."""
    from asentmax.nn import attention as attention_module

    model = make_model(attention, "nape")
    built = []
    original = attention_module.AttentionContext.additive

    def recording(ctx, dtype, device):
        built.append(ctx.offset)
        return original(ctx, dtype, device)

    monkeypatch.setattr(attention_module.AttentionContext, "additive", recording)
    prompt = torch.tensor([PROMPTS[0]])
    out = model.generate(prompt, 6)
    assert built and all(offset == 0 for offset in built), built  # the prefill only
    full = model(out)[0, prompt.shape[1] - 1: -1].argmax(-1)
    assert full.tolist() == out[0, prompt.shape[1]:].tolist()
