"""Causal self-attention with one normaliser chosen by the config (arXiv:2506.16640, section 2).

Logits z_hij = q_scale_hi * scale * (q_hi . k_hj) + m_h (j - i), j <= i, over real keys only, with q_scale
the paper's inverse temperature theta (nn/temperature.py; none = 1). The normaliser (nn/normalisers.py)
decides the kernel:
  sdpa (softmax, ssmax) -> torch scaled_dot_product_attention, q_scale * scale folded into q, ALiBi as an
                     additive float mask (the fastest path a user of plain torch would get); except where
                     SDPA would need an explicit mask and either it would exceed SDPA_MASK_LIMIT elements
                     (long-context evaluation) or keys are cached (KV-cache decoding, where a mask would be
                     rebuilt at every step): there the same softmax runs through entmax_attention(alpha=1)
                     (on CUDA the fused decoding kernels of the entmax models), which never builds it;
  topk family       -> dense logits, softmax over each query's k largest;
  entmax family     -> asentmax.ops.attention.entmax_attention(alpha, q_scale, alibi_slopes, ...).
Layout inside: (batch, heads, seq, head_dim). Slots: with a cache of S slots and T new tokens, new query r
sits at slot S + r and sees slots j <= S + r whose key is real (AttentionContext holds that bookkeeping).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from asentmax.nn.cache import KVCache
from asentmax.nn.config import ModelConfig
from asentmax.nn.normalisers import get_normaliser
from asentmax.nn.positions import apply_rotary
from asentmax.nn.stats import AttentionStats, attention_stats, probability_dispersion
from asentmax.nn.temperature import log_key_counts, make_temperature
from asentmax.ops.attention import entmax_attention, resolve_backend
from asentmax.ops.entmax import compute_dtype

# Largest explicit SDPA mask (elements) before softmax/SSMax switch to entmax_attention(alpha=1):
# 2^27 fp32 elements = 512 MiB.
SDPA_MASK_LIMIT = 2**27
# Most logits Attention._stats holds at once (B * H * queries * Nk): it computes the dense probabilities a
# block of queries at a time, 2^24 fp32 elements = 64 MiB per block, so statistics of a 65,536-token
# evaluation sample need no T x Nk tensor (16 heads would take 256 GiB).
STATS_CHUNK_ELEMENTS = 2**24

# entmax_attention backends that read the device inside a call (whether a row is empty picks a branch; a
# row's support size sets a shape): CUDA stream capture refuses such reads.
DEVICE_READING_BACKENDS = ("chunked", "reference")


def cuda_graph_refusal(config: ModelConfig) -> str | None:
    """None when the attention of `config` in training on CUDA can be captured in a CUDA graph, else why
    not: its entmax_attention calls (the entmax family's, and softmax's beside SDPA for masks over
    SDPA_MASK_LIMIT) would run on a backend in DEVICE_READING_BACKENDS, chosen or as the fused kernels'
    fallback (alpha > 2, head_dim > 256). SDPA, top-k and the fused Triton kernels never read the device."""
    normaliser = get_normaliser(config.attention)
    if normaliser.family == "topk":
        return None
    alpha = normaliser.alpha(config.alpha)
    backend = resolve_backend(config.attention_backend, True, alpha, config.head_dim, torch.float32)
    if backend not in DEVICE_READING_BACKENDS:
        return None
    return (f"{config.attention} attention (alpha {alpha:g}, head_dim {config.head_dim}, --attention-backend "
            f"{config.attention_backend}) runs on the {backend} backend, which reads the device inside its "
            "calls: no CUDA graph can capture them")


def static_cache_refusal(config: ModelConfig) -> str | None:
    """None when the attention of `config` can attend over a static cache's buffers (nn/cache.py: kv_lengths
    instead of masks), else why not."""
    if get_normaliser(config.attention).family == "topk":
        return "a static cache does not serve top-k attention (its steps would need dense masks)"
    return None


@dataclass
class AttentionContext:
    """What every layer of one forward call shares: positions, n_i, masks, RoPE angles, ALiBi slopes."""

    positions: torch.Tensor  # (B, T) long: position of each new token counted over the row's real tokens
    n_keys: torch.Tensor  # (B, T) long: keys visible to each query, n_i = position + 1 (rows equal unpadded)
    query_mask: torch.Tensor | None  # (B, T) bool: real queries (None = all real)
    key_padding_mask: torch.Tensor | None  # (B, Nk) bool: real keys of cache + new tokens (None = all)
    n_total: int  # Nk = cached slots + new tokens
    slopes: torch.Tensor | None  # (H,) float64 ALiBi slope per head (0 = NoPE head), None = no bias
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin (B, 1, T, D) when RoPE
    # a static cache's step (nn/cache.py): (B,) int32 filled slots of each row; then Nk = n_total is the
    # buffers' size, offset and the dense masks below do not apply, and attention is entmax_attention's
    kv_lengths: torch.Tensor | None = None
    _additive: dict = field(default_factory=dict)
    _kernel_slopes: dict = field(default_factory=dict)
    _log_n_keys: dict = field(default_factory=dict)

    @property
    def n_new(self) -> int:
        return self.positions.shape[1]

    @property
    def offset(self) -> int:
        """Slot of the first new query."""
        return self.n_total - self.n_new

    def _slots(self, device, rows: slice | None) -> torch.Tensor:
        """(R, 1) long: the slot of each new query in `rows` (None: all T)."""
        slots = torch.arange(self.n_new, device=device)
        return (slots if rows is None else slots[rows])[:, None] + self.offset

    def visible(self, device, rows: slice | None = None) -> torch.Tensor:
        """(B|1, 1, R, Nk) bool for the new queries `rows` (None: all T): causal and real key. A padding
        query also sees its own slot, so that no row is empty (its output is never used, but must stay
        finite)."""
        rows = self._slots(device, rows)
        cols = torch.arange(self.n_total, device=device)[None, :]
        causal = cols <= rows
        if self.key_padding_mask is None:
            return causal[None, None]
        return ((causal & self.key_padding_mask[:, None, None, :]) | (cols == rows))

    def additive(self, dtype: torch.dtype, device, rows: slice | None = None) -> torch.Tensor:
        """(B|1, H|1, R, Nk) float for the new queries `rows` (None: all T, kept for the call's other
        layers): ALiBi bias m_h (j - i) on visible entries, -inf elsewhere."""
        if rows is not None:
            return self._additive_rows(dtype, device, rows)
        if dtype not in self._additive:
            self._additive[dtype] = self._additive_rows(dtype, device, rows)
        return self._additive[dtype]

    def _additive_rows(self, dtype: torch.dtype, device, rows: slice | None) -> torch.Tensor:
        visible = self.visible(device, rows)
        if self.slopes is None:
            bias = torch.zeros((), dtype=dtype, device=device)
        else:
            cols = torch.arange(self.n_total, device=device)[None, :]
            distance = (cols - self._slots(device, rows)).to(torch.float64)  # j - i <= 0 on visible entries
            bias = (self.slopes.to(device)[:, None, None] * distance)[None].to(dtype)  # (1, H, R, Nk)
        return torch.where(visible, bias, float("-inf"))  # a scalar: no host copy

    def log_n_keys(self, dtype: torch.dtype) -> torch.Tensor:
        """temperature.log_key_counts(n_keys, dtype), (B|1, 1, T), computed once per forward call for every
        layer's temperature module. (1, 1, T) when no key is padded: n_i is then the same in every row
        (training batches), so one row serves the batch."""
        if dtype not in self._log_n_keys:
            n_keys = self.n_keys if self.key_padding_mask is not None else self.n_keys[:1]
            self._log_n_keys[dtype] = log_key_counts(n_keys, dtype)
        return self._log_n_keys[dtype]

    def kernel_slopes(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The slopes as entmax_attention's kernels read them, (B, H) contiguous in `dtype`, made once per
        forward call for every layer (a decoding step would otherwise convert and expand them per layer)."""
        if self.slopes is None:
            return None
        if dtype not in self._kernel_slopes:
            batch = self.positions.shape[0]
            self._kernel_slopes[dtype] = self.slopes.to(dtype).expand(batch, -1).contiguous()
        return self._kernel_slopes[dtype]

    def sdpa_mask_elements(self, n_heads: int) -> int:
        """Size of the explicit mask sdpa_mask would build (0 when SDPA needs none)."""
        batch = 1 if self.key_padding_mask is None else self.key_padding_mask.shape[0]
        if self.slopes is not None:
            return batch * n_heads * self.n_new * self.n_total
        if self.key_padding_mask is None and (self.offset == 0 or self.n_new == 1):
            return 0
        return batch * self.n_new * self.n_total

    def sdpa_suits(self, n_heads: int) -> bool:
        """True when softmax goes through SDPA: it needs no explicit mask, or a mask of at most
        SDPA_MASK_LIMIT elements for a call without cached keys (a decoding step would rebuild it). Never in a
        static cache's steps (SDPA takes no kv_lengths)."""
        if self.kv_lengths is not None:
            return False
        elements = self.sdpa_mask_elements(n_heads)
        return elements == 0 or (self.offset == 0 and elements <= SDPA_MASK_LIMIT)

    def sdpa_mask(self, dtype: torch.dtype, device) -> tuple[torch.Tensor | None, bool]:
        """(attn_mask, is_causal) for torch SDPA, using its fast causal path where nothing else is needed."""
        if self.slopes is not None:
            return self.additive(dtype, device), False
        if self.key_padding_mask is None:
            if self.offset == 0:
                return None, True
            if self.n_new == 1:
                return None, False
        return self.visible(device), False


def dense_logits(q: torch.Tensor, k: torch.Tensor, q_scale: torch.Tensor | None, ctx: AttentionContext,
                 dtype: torch.dtype, rows: slice | None = None) -> torch.Tensor:
    """z (B, H, R, Nk) in `dtype` for the new queries `rows` (None: all T): q_scale * scale * q.k + ALiBi,
    -inf where not visible (k: H or Hkv)."""
    k = _expand_kv(k, q.shape[1])
    factor = 1.0 / math.sqrt(q.shape[-1])
    if rows is not None:
        q, q_scale = q[:, :, rows], None if q_scale is None else q_scale[..., rows]
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * factor
    if q_scale is not None:
        scores = scores * q_scale.to(dtype)[..., None]
    return scores + ctx.additive(dtype, q.device, rows)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.config = config
        self.layer = layer
        h, hkv, d = config.n_heads, config.kv_heads, config.head_dim
        self.wq = nn.Linear(config.d_model, h * d, bias=False)
        self.wk = nn.Linear(config.d_model, hkv * d, bias=False)
        self.wv = nn.Linear(config.d_model, hkv * d, bias=False)
        self.wo = nn.Linear(h * d, config.d_model, bias=False)
        self.normaliser = get_normaliser(config.attention)
        self.temperature = make_temperature(config)

    def forward(self, x: torch.Tensor, ctx: AttentionContext, cache: KVCache | None = None,
                want_stats: bool = False) -> tuple[torch.Tensor, AttentionStats | None]:
        """x (B, T, d_model) normed input -> (B, T, d_model), and the layer's statistics if asked."""
        cfg = self.config
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        if ctx.rotary is not None:
            cos, sin = (t.to(q.dtype) for t in ctx.rotary)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, Hkv, Nk, D)
        q_scale = None if self.temperature is None else self.temperature(
            x, ctx.n_keys, ctx.log_n_keys(compute_dtype(x.dtype)))  # (B, H, T)

        norm = self.normaliser
        if norm.family == "topk":
            z = dense_logits(q, k, q_scale, ctx, compute_dtype(q.dtype))
            p = norm.probabilities(z, 1.0, cfg.topk_k)
            out = torch.matmul(p.to(v.dtype), _expand_kv(v, cfg.n_heads))
        elif norm.sdpa and ctx.sdpa_suits(cfg.n_heads):
            out = self._sdpa(q, k, v, q_scale, ctx)
        else:
            out = entmax_attention(q, k, v, alpha=norm.alpha(cfg.alpha), causal=True,
                                   alibi_slopes=ctx.kernel_slopes(compute_dtype(q.dtype)),
                                   q_scale=q_scale, key_padding_mask=ctx.key_padding_mask,
                                   kv_lengths=ctx.kv_lengths, backend=cfg.attention_backend)

        y = self.wo(out.transpose(1, 2).reshape(b, t, cfg.n_heads * cfg.head_dim))
        stats = self._stats(q, k, q_scale, ctx) if want_stats else None
        return y, stats

    def _sdpa(self, q, k, v, q_scale, ctx: AttentionContext) -> torch.Tensor:
        mask, is_causal = ctx.sdpa_mask(q.dtype, q.device)
        scale = None
        if q_scale is not None:  # fold q_scale * 1/sqrt(D) into q; SDPA then uses scale 1
            q = q * (q_scale * (1.0 / math.sqrt(q.shape[-1]))).to(q.dtype)[..., None]
            scale = 1.0
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=gqa)

    @torch.no_grad()
    def _stats(self, q, k, q_scale, ctx: AttentionContext) -> AttentionStats:
        """The layer's statistics (nn/stats.py) from its dense probabilities, computed for blocks of at most
        STATS_CHUNK_ELEMENTS logits."""
        cfg = self.config
        b, h, t, _ = q.shape
        dtype = compute_dtype(q.dtype)
        k = _expand_kv(k, h).to(dtype)  # once for every block: dense_logits would repeat and convert it
        block = max(1, STATS_CHUNK_ELEMENTS // (b * h * ctx.n_total))
        entropy, support = [], []
        for start in range(0, t, block):
            z = dense_logits(q, k, q_scale, ctx, dtype, slice(start, start + block))
            p = self.normaliser.probabilities(z, self.normaliser.alpha(cfg.alpha), cfg.topk_k,
                                              cfg.attention_backend)
            block_entropy, block_support = probability_dispersion(p)
            entropy.append(block_entropy)
            support.append(block_support)
        return attention_stats(torch.cat(entropy, -1), torch.cat(support, -1), q_scale, ctx.n_keys,
                               ctx.query_mask)


def _expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    group = n_heads // x.shape[1]
    return x.repeat_interleave(group, dim=1) if group > 1 else x
