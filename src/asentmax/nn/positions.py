"""Position schemes of arXiv:2506.16640, section 2: ALiBi slopes (all heads, or the first H/2 under NAPE)
and RoPE.

ALiBi adds m_h (j - i) to the logit of query i and key j (j <= i), never scaled by theta.
NAPE: heads 0 .. H/2-1 are ALiBi heads, heads H/2 .. H-1 are NoPE heads (slope 0); the ASEntmax/SSMax
temperature applies only to the NoPE heads. RoPE rotates q and k by their (real-token) positions.
"""

from __future__ import annotations

import math

import torch

from asentmax.nn.config import ModelConfig


def harmonic_slopes(m: int) -> list[float]:
    """1, 1/2, ..., 1/m: the slopes of the paper's reference code under NAPE."""
    return [1.0 / (h + 1) for h in range(m)]


def geometric_slopes(m: int) -> list[float]:
    """Press et al.'s ALiBi slopes 2^(-8 i / m), i = 1..m; for m not a power of two, the slopes of the
    nearest lower power of two p followed by every other slope of 2p (as in the ALiBi paper)."""

    def power_of_two(p: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]

    p = 2 ** int(math.floor(math.log2(m)))
    if p == m:
        return power_of_two(m)
    return power_of_two(p) + power_of_two(2 * p)[0::2][: m - p]


def alibi_head_count(config: ModelConfig) -> int:
    """Number of heads with an ALiBi bias (they come first)."""
    return {"alibi": config.n_heads, "nape": config.n_heads // 2}.get(config.position, 0)


def head_slopes(config: ModelConfig) -> torch.Tensor | None:
    """ALiBi slope per query head, shape (H,), 0 on NoPE heads; None when no head has a bias."""
    m = alibi_head_count(config)
    if m == 0:
        return None
    slopes = harmonic_slopes(m) if config.alibi_slopes == "harmonic" else geometric_slopes(m)
    return torch.tensor(slopes + [0.0] * (config.n_heads - m), dtype=torch.float64)


def scaled_head_count(config: ModelConfig) -> int:
    """Heads whose logits ASEntmax/SSMax scale: the NoPE heads under NAPE (the last H/2), else all."""
    return config.n_heads - alibi_head_count(config) if config.position == "nape" else config.n_heads


class Rotary:
    """Rotary position embedding (rotate-half convention) evaluated at arbitrary integer positions."""

    def __init__(self, head_dim: int, base: float):
        self.head_dim = head_dim
        self.base = base

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, T) long -> cos, sin of shape (B, 1, T, head_dim), computed in fp64 and returned in
        `dtype` (computed on the fly: a float buffer would be rounded by model.to(bfloat16))."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=positions.device)
        inv_freq = self.base ** (-exponents / self.head_dim)
        angles = positions.to(torch.float64)[..., None] * inv_freq  # (B, T, D/2)
        angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, D)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) rotated by the angles of cos/sin (B, 1, T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
