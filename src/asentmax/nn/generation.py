"""Batched autoregressive decoding with the KV cache: greedy (temperature 0) or sampling (temperature,
top-k). Padded prompts (left or right) are first realigned so that every row's real tokens end at the
last slot; each new token then sits at position n_real and sees n_i = n_real + 1 keys
(arXiv:2506.16640, section 2). The returned tensor is always cat(input_ids, new_tokens) in the caller's
layout.

cuda_graph=True decodes with a static cache (nn/cache.py) and replays one CUDA graph per step from the
second step on (CapturedStep): a step then costs the GPU's time for its kernels, not the host's for
launching about a hundred of them (at short caches, most of an eager step).
"""

from __future__ import annotations

import torch

from asentmax.nn.attention import cuda_graph_refusal, static_cache_refusal
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


class CapturedStep:
    """model(token[:, None], cache)[:, -1] over a static cache (B, V logits), as a CUDA graph. The first call
    runs eagerly on a side stream (Triton compiles its kernels, the allocator warms up), the second records
    the step and replays it, every later call replays it: the token is copied into the graph's input and
    the returned logits are the graph's output, overwritten by the next call. Under autocast the graph reads
    the weight casts autocast cached in the first call: use a CapturedStep only inside the autocast region
    that recorded it (generate() and asentmax eval do)."""

    def __init__(self, model, cache: KVCache):
        self.model, self.cache = model, cache
        self.token: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        if self.token is None:
            self.token = token.clone()
            side = torch.cuda.Stream(device=token.device)
            side.wait_stream(torch.cuda.current_stream(token.device))
            with torch.cuda.stream(side):
                logits = self.model(self.token[:, None], cache=self.cache)[:, -1]
            torch.cuda.current_stream(token.device).wait_stream(side)
            return logits
        self.token.copy_(token)
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self.model(self.token[:, None], cache=self.cache)[:, -1]
        self.graph.replay()
        return self.logits


def cuda_graph_decoding_refusal(config, device_type: str, dropout_active: bool = False) -> str | None:
    """None when generate(cuda_graph=True) can decode with a model of ModelConfig `config` on a `device_type`
    ("cpu" / "cuda") device, with its dropout active or not, else why not (one line)."""
    if device_type != "cuda":
        return "cuda_graph=True needs the model and input_ids on a CUDA device"
    refusal = static_cache_refusal(config)
    if refusal is not None:
        return f"cuda_graph=True: {refusal}"
    if dropout_active:
        return "cuda_graph=True needs dropout off: call model.eval() first"
    return cuda_graph_refusal(config)


CUDA_GRAPH_SETTINGS = ("auto", "on", "off")  # the cuda-graphs setting of every evaluation that decodes


def decodes_with_cuda_graph(setting: str, config, device_type: str, name: str = "--cuda-graphs") -> bool:
    """Whether an evaluation decodes with generate(cuda_graph=True) under a cuda-graphs `setting` (one of
    CUDA_GRAPH_SETTINGS) for a model of ModelConfig `config` in eval mode on a `device_type` device: "off"
    never; "on" always (where it cannot: ValueError, one line beginning with the setting's `name`); "auto"
    exactly where cuda_graph_decoding_refusal has no objection (on CUDA, not top-k attention)."""
    if setting not in CUDA_GRAPH_SETTINGS:
        raise ValueError(f"{name} {setting}: must be one of {', '.join(CUDA_GRAPH_SETTINGS)}")
    refusal = cuda_graph_decoding_refusal(config, device_type)
    if setting == "on" and refusal is not None:
        raise ValueError(f"{name} on: {refusal}")
    return setting == "on" or (setting == "auto" and refusal is None)


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *,
             attention_mask: torch.Tensor | None = None, temperature: float = 0.0, top_k: int | None = None,
             eos_token_id: int | None = None, generator: torch.Generator | None = None,
             cuda_graph: bool = False) -> torch.Tensor:
    """(B, T + max_new_tokens) long: the prompt followed by the generated tokens. After a row emits
    eos_token_id it keeps emitting it. Decoding stops early once every row has finished. cuda_graph=True:
    the steps replay a CUDA graph (CapturedStep; CUDA only, not top-k attention)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if type(cuda_graph) is not bool:
        raise ValueError(f"cuda_graph must be a bool, got {cuda_graph!r}")
    if cuda_graph:
        dropout_active = model.training and model.config.dropout > 0
        reason = cuda_graph_decoding_refusal(model.config, input_ids.device.type, dropout_active)
        if reason is not None:
            raise ValueError(reason)
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

    # the last new token is never fed back
    cache = KVCache(capacity=ids.shape[1] + max_new_tokens - 1, static=cuda_graph)
    logits = model(ids, attention_mask=mask, cache=cache)[:, -1]
    if cuda_graph:
        decoding_step = CapturedStep(model, cache)
    else:
        def decoding_step(token):
            return model(token[:, None], cache=cache)[:, -1]

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
        logits = decoding_step(token)
    return torch.cat([input_ids, torch.stack(new_tokens, dim=1)], dim=1)
