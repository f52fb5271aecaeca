"""Batched autoregressive decoding with the KV cache: greedy (temperature 0) or sampling (temperature,
top-k). Padded prompts (left or right) are first realigned so that every row's real tokens end at the
last slot; each new token then sits at position n_real and sees n_i = n_real + 1 keys
(arXiv:2506.16640, section 2). The returned tensor is always cat(input_ids, new_tokens) in the caller's
layout.
"""

from __future__ import annotations

import torch

from asentmax.nn.cache import KVCache


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's padding to the left, keeping the order of its real tokens."""
    order = torch.argsort(attention_mask.to(torch.int32), dim=1, stable=True)  # pads (0) first
    return input_ids.gather(1, order), attention_mask.gather(1, order)


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
               generator: torch.Generator | None) -> torch.Tensor:
    """logits (B, V) -> (B,) long."""
    if temperature == 0.0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *,
             attention_mask: torch.Tensor | None = None, temperature: float = 0.0, top_k: int | None = None,
             eos_token_id: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, T + max_new_tokens) long: the prompt followed by the generated tokens. After a row emits
    eos_token_id it keeps emitting it. Decoding stops early once every row has finished."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if max_new_tokens == 0:
        return input_ids.clone()
    ids, mask = input_ids, attention_mask
    if mask is not None:
        if mask.shape != input_ids.shape or mask.dtype != torch.bool:
            raise ValueError(f"attention_mask must be a bool tensor of shape {tuple(input_ids.shape)}, "
                             f"got {tuple(mask.shape)} {mask.dtype}")
        if not bool(mask.any(1).all()):
            raise ValueError("every row of attention_mask needs at least one real token")
        ids, mask = left_align(ids, mask)

    cache = KVCache(capacity=ids.shape[1] + max_new_tokens - 1)  # the last new token is never fed back
    logits = model(ids, attention_mask=mask, cache=cache)[:, -1]
    batch = ids.shape[0]
    finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    new_tokens = []
    for step in range(max_new_tokens):
        token = next_token(logits, temperature, top_k, generator)
        if eos_token_id is not None:
            token = torch.where(finished, torch.full_like(token, eos_token_id), token)
            finished |= token == eos_token_id
        new_tokens.append(token)
        if step + 1 == max_new_tokens:
            break
        if eos_token_id is not None and bool(finished.all()):
            remaining = max_new_tokens - len(new_tokens)
            new_tokens.extend([torch.full_like(token, eos_token_id)] * remaining)
            break
        logits = model(token[:, None], cache=cache)[:, -1]
    return torch.cat([input_ids, torch.stack(new_tokens, dim=1)], dim=1)
