"""attn_implementation="entmax" under transformers (asentmax.integrations.hf) on a tiny random Llama:
every layer's attention equals an fp64 entmax_attention on the same q, k, v; causality; left padding;
generate() with and without the cache; alpha = 1 equals transformers' own softmax attention."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from asentmax import entmax_attention  # noqa: E402
from asentmax.integrations import hf  # noqa: E402
from conftest import left_padded  # noqa: E402

VOCAB = 61


def tiny_llama(attn_implementation="entmax", alpha=1.5, seed=0, **overrides):
    hf.register()
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.4, pad_token_id=0,
        bos_token_id=None, eos_token_id=None, entmax_alpha=alpha, **overrides)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()


def rotate(x, cos, sin):
    """RoPE as Llama applies it (rotate_half convention), written out for the oracle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_every_layer_equals_entmax_attention_on_the_same_qkv(alpha):
    model = tiny_llama(alpha=alpha)
    ids, mask, positions = left_padded([9, 5, 7], 9, VOCAB)
    captured = []

    def attention_inputs(module, args, kwargs):
        captured.append({"module": module, "hidden": kwargs["hidden_states"],
                         "cos_sin": kwargs["position_embeddings"]})

    def attention_output(module, args):
        captured[-1]["out"] = args[0]  # o_proj's input: the attention output (B, T, H * D)

    handles = []
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_pre_hook(attention_inputs, with_kwargs=True))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(attention_output))
    with torch.no_grad():
        model(ids, attention_mask=mask, position_ids=positions)
    for handle in handles:
        handle.remove()

    assert len(captured) == 2
    heads, dim = 4, 8
    for layer in captured:
        attn, x = layer["module"], layer["hidden"]
        b, t, _ = x.shape
        cos, sin = (c.double() for c in layer["cos_sin"])
        q = attn.q_proj(x).view(b, t, heads, dim).transpose(1, 2).double()
        k = attn.k_proj(x).view(b, t, 2, dim).transpose(1, 2).double()
        v = attn.v_proj(x).view(b, t, 2, dim).transpose(1, 2).double()
        expected = entmax_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, alpha=alpha, causal=True,
                                    key_padding_mask=mask.bool(), backend="reference")
        got = layer["out"].view(b, t, heads, dim).transpose(1, 2)
        torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=1e-5)


def test_output_at_t_ignores_later_tokens():
    model = tiny_llama()
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=1e-6, rtol=0)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3  # the later positions do see the change


def test_left_padded_batch_equals_unpadded_sequences():
    model = tiny_llama()
    lengths = [10, 4, 7]
    ids, mask, positions = left_padded(lengths, 10, VOCAB)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions).logits
        # without position_ids Llama counts the pads too: RoPE scores depend on distances only
        shifted = model(ids, attention_mask=mask).logits
        for row, n in enumerate(lengths):
            alone = model(ids[row:row + 1, 10 - n:]).logits[0]
            torch.testing.assert_close(batch[row, 10 - n:], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(shifted[row, 10 - n:], alone, atol=1e-4, rtol=1e-4)


def test_generate_with_cache_equals_generate_without():
    model = tiny_llama()
    ids, mask, _ = left_padded([8, 3, 6], 8, VOCAB, seed=5)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with_cache = model.generate(ids, use_cache=True, **kwargs)
    without = model.generate(ids, use_cache=False, **kwargs)
    assert with_cache.shape == (3, 14)
    assert torch.equal(with_cache, without)
    for row, n in enumerate([8, 3, 6]):  # and each row as if it were alone
        alone = model.generate(ids[row:row + 1, 8 - n:], max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(alone[0, n:], with_cache[row, 8:])


def test_alpha_one_equals_transformers_softmax_attention():
    entmax_model = tiny_llama(alpha=1.0)
    sdpa_model = tiny_llama("sdpa")
    ids, mask, positions = left_padded([9, 6], 9, VOCAB, seed=6)
    with torch.no_grad():
        ours = entmax_model(ids, attention_mask=mask, position_ids=positions).logits
        theirs = sdpa_model(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)
    sparse = tiny_llama(alpha=1.5)
    with torch.no_grad():
        other = sparse(ids, attention_mask=mask, position_ids=positions).logits
    assert (other[real] - theirs[real]).abs().max() > 1e-3  # alpha is read from the config


def test_unsupported_masks_are_refused():
    model = tiny_llama()
    ids = torch.randint(1, VOCAB, (1, 6))
    with pytest.raises(ValueError, match="last key slots"):
        model.generate(ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]])  # two sequences packed in one row
    with pytest.raises(ValueError, match="another mask"):
        model(ids, position_ids=packed, use_cache=False)
