"""attn_implementation="entmax": alpha-entmax attention (arXiv:2506.16640, section 2) for any transformers
decoder that dispatches through transformers' AttentionInterface (Llama, Mistral, Qwen2, ...).

    from asentmax.integrations import hf
    hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="entmax")   # or from_pretrained

alpha is `config.entmax_alpha` (default 1.5; 1 = softmax) and the backend `config.entmax_backend`
(default "auto": the Triton kernels on CUDA, the chunked torch backend elsewhere).

How the masks reach our kernels. transformers builds its masks through AttentionMaskInterface; the mask
function registered here returns, instead of a dense (B, 1, Nq, Nk) mask, only the (B, Nk) key-padding
mask (True = real key) or None when nothing is padded, and `entmax_attention` applies causality itself with
query r at key slot r + Nk - Nq. That is exactly transformers' causal mask whenever the queries are the last
Nq slots of the keys: a forward without a cache and a DynamicCache (prefill and decoding, left padding
included: padded slots stay masked, and the real tokens' positions come from position_ids as usual).
Masks this cannot express (sliding windows, packed sequences, static caches whose keys run past the
queries, custom 4-D masks) raise a ValueError instead of being silently dropped.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
)

from asentmax.ops.attention import entmax_attention

ATTN_IMPLEMENTATION = "entmax"
DEFAULT_ALPHA = 1.5
DEFAULT_BACKEND = "auto"


def entmax_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                mask_function=causal_mask_function, attention_mask: torch.Tensor | None = None, **kwargs):
    """AttentionMaskInterface function: the (B, kv_length) bool key-padding mask, or None when all keys are
    real. Causality is left to entmax_attention (queries are the last q_length key slots)."""
    if mask_function is causal_mask_function:
        if int(q_offset) + q_length != int(kv_offset) + kv_length:
            raise ValueError(
                "attn_implementation='entmax' needs the queries to be the last key slots (a DynamicCache "
                f"or no cache); got queries at {int(q_offset)}..{int(q_offset) + q_length - 1} and keys at "
                f"{int(kv_offset)}..{int(kv_offset) + kv_length - 1} (a static cache?)")
    elif mask_function is not bidirectional_mask_function:
        raise ValueError("attn_implementation='entmax' supports causal (or bidirectional) attention with "
                         "padding only; this model asked for another mask (sliding window, chunked or packed "
                         "sequences)")
    padding = prepare_padding_mask(attention_mask, kv_length, int(kv_offset))
    if padding is None:
        return None
    padding = padding[:, int(kv_offset):int(kv_offset) + kv_length].to(torch.bool)
    return None if bool(padding.all()) else padding


def entmax_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None, scaling=None,
                             dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """AttentionInterface function. query (B, H, Nq, D), key/value (B, Hkv, Nk, D) (grouped-query heads are
    not repeated: entmax_attention reads them directly) -> (attention output (B, Nq, H, D), None)."""
    if dropout:
        raise ValueError(f"attn_implementation='entmax' has no attention dropout; got dropout={dropout} "
                         "(set config.attention_dropout = 0)")
    for name in ("softcap", "sliding_window"):
        if kwargs.get(name) is not None:
            raise ValueError(f"attn_implementation='entmax' does not support {name} (got {kwargs[name]!r})")
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype != torch.bool):
        raise ValueError("attn_implementation='entmax' takes the key-padding mask built by its own mask "
                         f"function, got a {attention_mask.dim()}-D {attention_mask.dtype} mask (a custom "
                         "4-D mask cannot be expressed as causal + padding)")
    config = getattr(module, "config", None)
    alpha = getattr(config, "entmax_alpha", DEFAULT_ALPHA)
    backend = getattr(config, "entmax_backend", DEFAULT_BACKEND)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    out = entmax_attention(query, key, value, alpha=alpha, causal=bool(is_causal), scale=scaling,
                           key_padding_mask=attention_mask, backend=backend)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register attn_implementation "entmax" (attention and mask functions) and the package's own model
    (model_type "asentmax") with transformers' Auto classes. Idempotent."""
    from asentmax.integrations.hf_model import register_auto_classes

    AttentionInterface.register(ATTN_IMPLEMENTATION, entmax_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, entmax_mask)
    register_auto_classes()
