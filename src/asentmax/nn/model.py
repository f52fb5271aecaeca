"""Decoder-only Transformer whose attention normaliser and position scheme come from ModelConfig
(arXiv:2506.16640, section 2), with optional GQA. Blocks are Llama-style by default (pre-norm RMSNorm,
SwiGLU MLP, tied head, GPT-2 residual init); the ModelConfig fields norm_placement="sandwich", mlp="geglu",
scale_embeddings, scaled_residual_init=False and zero_embedding_id give the Gemma-2 blocks of the paper's
code (arXiv:2506.16640, section 4 and its code; results/paper/README.md):
  h = sqrt(d_model) * embed(ids);  h = h + norm(attn(norm(h)));  h = h + norm(mlp(norm(h)));
  logits = head(norm(h)),  mlp(x) = down(gelu_tanh(gate x) * up x).

forward(input_ids (B, T), attention_mask=None (B, T) bool True = real token, cache=None) -> logits (B, T, V).
Positions and n_i count the real tokens of each row only, so left padding changes nothing for the real
tokens; right padding is fine without a cache. With ALiBi/NAPE the real tokens of a row must be
contiguous in the (cache + new) slots, which generate() guarantees by moving padding to the left.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from asentmax.nn.attention import Attention, AttentionContext, static_cache_refusal
from asentmax.nn.cache import KVCache
from asentmax.nn.config import ModelConfig
from asentmax.nn.positions import Rotary, head_slopes
from asentmax.nn.stats import AttentionStats
from asentmax.ops.entmax import compute_dtype


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, normalised in fp32 for half inputs; weight starts at 1 (the same
    function as Gemma-2's (1 + weight) with weight 0)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class MLP(nn.Module):
    """swiglu: down(silu(gate x) * up x); geglu: down(gelu_tanh(gate x) * up x) (Gemma-2's
    gelu_pytorch_tanh); gelu: down(gelu(up x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.kind = config.mlp
        self.w_up = nn.Linear(config.d_model, config.d_ff, bias=False)
        gated = self.kind in ("swiglu", "geglu")
        self.w_gate = nn.Linear(config.d_model, config.d_ff, bias=False) if gated else None
        self.w_down = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        if self.kind == "geglu":
            return self.w_down(F.gelu(self.w_gate(x), approximate="tanh") * self.w_up(x))
        return self.w_down(F.gelu(self.w_up(x)))


class Block(nn.Module):
    """pre: x + f(norm(x)); sandwich: x + norm(f(norm(x))) (the *_post_norm modules), for f the attention,
    then the MLP. The attention's temperature reads the normed input norm(x) in both."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        sandwich = config.norm_placement == "sandwich"
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config, layer)
        self.attn_post_norm = RMSNorm(config.d_model, config.norm_eps) if sandwich else None
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)
        self.mlp_post_norm = RMSNorm(config.d_model, config.norm_eps) if sandwich else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, ctx, cache, want_stats):
        attended, stats = self.attn(self.attn_norm(x), ctx, cache, want_stats)
        if self.attn_post_norm is not None:
            attended = self.attn_post_norm(attended)
        x = x + self.dropout(attended)
        transformed = self.mlp(self.mlp_norm(x))
        if self.mlp_post_norm is not None:
            transformed = self.mlp_post_norm(transformed)
        x = x + self.dropout(transformed)
        return x, stats


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"Transformer expects a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.zero_embedding_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embeddings else None
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        self.rotary = Rotary(config.head_dim, config.rope_base) if config.position == "rope" else None
        # (H,) float64 or None; a plain attribute, not a buffer, so that model.to(dtype) never rounds it
        self.alibi_slopes = head_slopes(config)
        self._slopes_on: dict[torch.device, torch.Tensor] = {}  # alibi_slopes copied once per device
        self.reset_parameters()

    def reset_parameters(self):
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])
        if self.config.scaled_residual_init:  # residual-branch outputs scaled as in GPT-2
            for block in self.blocks:
                nn.init.normal_(block.attn.wo.weight, std=std / math.sqrt(2 * self.config.n_layers))
                nn.init.normal_(block.mlp.w_down.weight, std=std / math.sqrt(2 * self.config.n_layers))
        for block in self.blocks:
            if block.attn.temperature is not None:
                block.attn.temperature.reset_parameters()

    def temperature_parameters(self):
        """The parameters of the length-aware temperatures (ASEntmax, SSMax); none for other normalisers."""
        for block in self.blocks:
            if block.attn.temperature is not None:
                yield from block.attn.temperature.parameters()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, return_stats: bool = False):
        """Logits (B, T, V); with return_stats=True, (logits, [AttentionStats per layer]).
        With a cache, input_ids are the new tokens: their keys/values are appended to it."""
        if return_stats and cache is not None and cache.holds_prompt:
            raise ValueError("return_stats is not available in a static cache's steps")
        ctx = self._context(input_ids, attention_mask, cache)
        x = self.embed(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = self.dropout(x)
        stats: list[AttentionStats] = []
        for block in self.blocks:
            x, layer_stats = block(x, ctx, cache, return_stats)
            stats.append(layer_stats)
        logits = self.head(self.norm(x))
        return (logits, stats) if return_stats else logits

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *,
                 attention_mask: torch.Tensor | None = None, temperature: float = 0.0,
                 top_k: int | None = None, eos_token_id: int | None = None,
                 generator: torch.Generator | None = None, cuda_graph: bool = False) -> torch.Tensor:
        """(B, T + max_new_tokens): input_ids followed by the new tokens (see asentmax.nn.generation)."""
        from asentmax.nn.generation import generate

        return generate(self, input_ids, max_new_tokens, attention_mask=attention_mask,
                        temperature=temperature, top_k=top_k, eos_token_id=eos_token_id, generator=generator,
                        cuda_graph=cuda_graph)

    def _context(self, input_ids, attention_mask, cache: KVCache | None) -> AttentionContext:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
            got = f"{getattr(input_ids, 'shape', None)} {getattr(input_ids, 'dtype', type(input_ids))}"
            raise ValueError(f"input_ids must be a (batch, seq) torch.long tensor, got {got}")
        b, t = input_ids.shape
        if t == 0:
            raise ValueError("input_ids has no tokens (seq length 0)")
        device = input_ids.device
        if cache is not None and cache.holds_prompt:
            return self._static_step_context(input_ids, attention_mask, cache)
        if attention_mask is not None:
            if attention_mask.shape != (b, t) or attention_mask.dtype != torch.bool:
                got = f"{tuple(attention_mask.shape)} {attention_mask.dtype}"
                raise ValueError(f"attention_mask must be a bool tensor of shape {(b, t)} "
                                 f"(True = real token), got {got}")
            counts = attention_mask.long().cumsum(1)
        else:
            counts = torch.arange(1, t + 1, device=device).expand(b, t)
        past_slots = 0 if cache is None else cache.length
        if cache is not None and cache.n_real is not None:
            if cache.n_real.shape[0] != b:
                raise ValueError(f"cache holds {cache.n_real.shape[0]} rows, input_ids has {b}")
            previous = cache.n_real
        else:
            previous = torch.zeros(b, dtype=torch.long, device=device)
        positions = (previous[:, None] + counts - 1).clamp_min(0)  # (B, T)

        past_mask = None if cache is None else cache.key_mask
        if attention_mask is None and past_mask is None:
            key_mask = None
        else:
            past = past_mask if past_mask is not None else torch.ones(b, past_slots, dtype=torch.bool,
                                                                      device=device)
            new = attention_mask if attention_mask is not None else torch.ones(b, t, dtype=torch.bool,
                                                                               device=device)
            key_mask = torch.cat([past, new], dim=1)
        slopes = self._slopes(device)
        contiguous_to_end = False
        if slopes is not None and key_mask is not None and not torch.compiler.is_compiling():
            if attention_mask is None and cache is not None and cache.contiguous_to_end:
                contiguous_to_end = True  # real tokens appended to rows that were: nothing to check
            else:
                contiguous_to_end = _check_contiguous(key_mask)  # a host sync: checked in eager mode only
        if cache is not None:  # not previous + counts[:, -1]: with previous zeros Inductor returned that
            # column of counts itself (stride 0 when expanded, t when a cumsum), and the next decoding step's
            # stride guard compiled one graph more for each
            real = t if attention_mask is None else attention_mask.sum(1)
            cache.commit(key_mask, previous + real, contiguous_to_end)
        rotary = None
        if self.rotary is not None:
            rotary = self.rotary.cos_sin(positions, compute_dtype(self.embed.weight.dtype))
        return AttentionContext(positions=positions, n_keys=positions + 1, query_mask=attention_mask,
                                key_padding_mask=key_mask, n_total=past_slots + t, slopes=slopes,
                                rotary=rotary)

    def _static_step_context(self, input_ids, attention_mask, cache: KVCache) -> AttentionContext:
        """A step of a static cache (nn/cache.py) past its first call: no host value is read, every shape
        is the buffers', positions and n_i come from the device counts, attention reads kv_lengths."""
        b, t = input_ids.shape
        if attention_mask is not None:
            raise ValueError("a static cache's steps take no attention_mask (pad the prompt, its first call)")
        refusal = static_cache_refusal(self.config)
        if refusal is not None:
            raise ValueError(f"{refusal}: use KVCache(static=False)")
        if cache.n_real.shape[0] != b:
            raise ValueError(f"cache holds {cache.n_real.shape[0]} rows, input_ids has {b}")
        slopes = self._slopes(input_ids.device)
        if not cache.steps_in_place:
            # ALiBi distances in slots need each row's real tokens to end at the prompt's last slot (what the
            # dynamic path checks at every step); checked in eager mode only, as there
            if (slopes is not None and cache.key_mask is not None and not cache.contiguous_to_end
                    and not torch.compiler.is_compiling() and not _check_contiguous(cache.key_mask)):
                raise ValueError("with ALiBi/NAPE positions a static cache needs a prompt padded on the left "
                                 "(as generate() aligns it)")
            cache.begin_steps()
        positions = cache.n_real[:, None] + torch.arange(t, device=input_ids.device)  # before advance
        cache.advance(t)
        rotary = None
        if self.rotary is not None:
            rotary = self.rotary.cos_sin(positions, compute_dtype(self.embed.weight.dtype))
        return AttentionContext(positions=positions, n_keys=positions + 1, query_mask=None,
                                key_padding_mask=cache.key_mask, n_total=cache.room, slopes=slopes,
                                rotary=rotary, kv_lengths=cache.kv_lengths)

    def _slopes(self, device) -> torch.Tensor | None:
        """The ALiBi slopes on `device` (None without ALiBi), copied once per device: a host-to-device copy
        synchronises."""
        if self.alibi_slopes is None:
            return None
        if device not in self._slopes_on:
            self._slopes_on[device] = self.alibi_slopes.to(device)
        return self._slopes_on[device]


def _check_contiguous(key_mask: torch.Tensor) -> bool:
    """ALiBi uses slot distances: they equal token distances only if each row's real tokens are contiguous.
    ValueError when they are not; else True when every row with real tokens ends with one (its last slot),
    as after left padding, which the next steps' real tokens then extend."""
    n = key_mask.shape[1]
    slots = torch.arange(n, device=key_mask.device)
    first = torch.where(key_mask, slots, n).amin(1)
    last = torch.where(key_mask, slots, -1).amax(1)
    count = key_mask.sum(1)
    real = count > 0
    gapped, open_end = torch.stack([((last - first + 1 != count) & real).any(),
                                    ((last != n - 1) & real).any()]).tolist()  # one host sync for both
    if gapped:
        raise ValueError("with ALiBi/NAPE positions the real tokens of each row must be contiguous across "
                         "the cache and the new tokens (pad on the left before decoding, as generate() does)")
    return not open_end
