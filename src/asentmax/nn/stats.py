"""Attention instrumentation for the evaluation plots (arXiv:2506.16640, section 1: dispersion).

Per layer, per head, per query: Shannon entropy H(p), entropy normalised by log n_i (-> 1 means fully
dispersed attention; undefined when n_i = 1), support size |{j : p_j > 0}|, and theta (the inverse
temperature actually used, 1 where there is none). Padding queries are NaN (support -1).
Computed from dense probabilities a block of queries at a time (nn/attention.py, STATS_CHUNK_ELEMENTS), so
memory stays bounded at any length while time is O(T * Nk) per layer: meant for evaluation batches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class AttentionStats(NamedTuple):
    entropy: torch.Tensor  # (B, H, T) float
    normalised_entropy: torch.Tensor  # (B, H, T) float, entropy / log(n_i), NaN where n_i = 1
    support_size: torch.Tensor  # (B, H, T) long
    theta: torch.Tensor  # (B, H, T) float
    n_keys: torch.Tensor  # (B, T) long, n_i


def probability_dispersion(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p (B, H, R, Nk) probabilities of R queries -> each query's entropy H(p) and support size, (B, H, R)."""
    return -torch.special.xlogy(p, p).sum(-1), (p > 0).sum(-1)


def attention_stats(entropy: torch.Tensor, support: torch.Tensor, theta: torch.Tensor | None,
                    n_keys: torch.Tensor, query_mask: torch.Tensor | None) -> AttentionStats:
    """Every query's entropy and support size (B, H, T; probability_dispersion) -> AttentionStats."""
    log_n = torch.log(n_keys.to(entropy.dtype))[:, None, :]
    nan = torch.full_like(entropy, float("nan"))
    normalised = torch.where(log_n > 0, entropy / log_n.clamp_min(1e-30), nan)
    theta = torch.ones_like(entropy) if theta is None else theta.detach().to(entropy.dtype)
    if query_mask is not None:
        pad = ~query_mask[:, None, :]
        entropy = entropy.masked_fill(pad, float("nan"))
        normalised = normalised.masked_fill(pad, float("nan"))
        support = support.masked_fill(pad, -1)
        theta = theta.masked_fill(pad, float("nan"))
    return AttentionStats(entropy, normalised, support, theta, n_keys)


def summarise_stats(stats: list[AttentionStats]) -> dict[str, list[list[float]]]:
    """Means over real queries: {"entropy", "normalised_entropy", "support_size", "theta", "theta_std"}
    -> [layer][head] floats (normalised entropy over queries with n_i > 1)."""
    out: dict[str, list[list[float]]] = {k: [] for k in ("entropy", "normalised_entropy", "support_size",
                                                          "theta", "theta_std")}
    for layer in stats:
        support = layer.support_size.to(layer.entropy.dtype)
        support = support.masked_fill(layer.support_size < 0, float("nan"))
        for name, values in (("entropy", layer.entropy), ("normalised_entropy", layer.normalised_entropy),
                             ("support_size", support), ("theta", layer.theta)):
            out[name].append(_nan_mean_per_head(values))
        theta = layer.theta.transpose(0, 1).reshape(layer.theta.shape[1], -1)
        theta_std = [float(row[~row.isnan()].std()) if (~row.isnan()).sum() > 1 else 0.0 for row in theta]
        out["theta_std"].append(theta_std)
    return out


def _nan_mean_per_head(values: torch.Tensor) -> list[float]:
    per_head = values.transpose(0, 1).reshape(values.shape[1], -1)  # (H, B*T)
    return [float(v) for v in per_head.nanmean(dim=1)]
