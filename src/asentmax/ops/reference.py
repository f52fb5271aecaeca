"""Dense reference entmax attention: materialises the (B, H, Nq, Nk) logits. The oracle of every backend.

Layout (batch, heads, seq, head_dim). Implements arXiv:2506.16640, section 2, as stated in attention.py:
z = q_scale * scale * (q . k) - slope * |pos(r) - j| on the visible keys (causal, key padding), then
alpha-entmax (asentmax.ops.entmax.entmax; softmax when alpha == 1) and p @ v. Memory O(Nq * Nk): use it
for tests and short sequences only; `chunked` is the long-sequence path.
"""

import torch

from asentmax.ops.entmax import compute_dtype, entmax
from asentmax.ops.types import AttentionAux, BackendSupport

SUPPORT = BackendSupport()  # every alpha >= 1, head_dim and float dtype


def visible_keys(n_q, n_k, causal, key_padding_mask, device):
    """Bool mask (B or 1, 1, Nq, Nk): True where query row r may attend key j."""
    visible = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        pos = torch.arange(n_q, device=device) + (n_k - n_q)
        visible = torch.arange(n_k, device=device)[None, :] <= pos[:, None]
    visible = visible[None, None]
    if key_padding_mask is not None:
        visible = visible & key_padding_mask[:, None, None, :]
    return visible


def alibi_bias(alibi_slopes, n_q, n_k, dtype):
    """-slope * |pos(r) - j| with shape (B or 1, H, Nq, Nk)."""
    device = alibi_slopes.device
    pos = torch.arange(n_q, device=device, dtype=dtype) + (n_k - n_q)
    distance = (pos[:, None] - torch.arange(n_k, device=device, dtype=dtype)[None, :]).abs()
    slopes = alibi_slopes.to(dtype)
    slopes = slopes[None] if slopes.dim() == 1 else slopes
    return -slopes[:, :, None, None] * distance


def reference_logits(q, k, *, causal, scale, alibi_slopes, q_scale, key_padding_mask):
    """Logits z (B, H, Nq, Nk) in q's dtype, -inf on hidden keys, and `empty` (B or 1, 1, Nq, 1): the rows
    with no visible key, where z is 0. k (B, Hkv, Nk, D) is repeated over its GQA group. Differentiable."""
    n_q, n_k = q.shape[2], k.shape[2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Nk, D)
    z_mult = scale if q_scale is None else scale * q_scale.to(q.dtype)[..., None]
    z = z_mult * (q @ k.transpose(-1, -2))
    if alibi_slopes is not None:
        z = z + alibi_bias(alibi_slopes, n_q, n_k, q.dtype)
    visible = visible_keys(n_q, n_k, causal, key_padding_mask, q.device)
    empty = ~visible.any(-1, keepdim=True)
    return z.masked_fill(~visible | empty, float("-inf")).masked_fill(empty, 0.0), empty


def reference_entmax_attention(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                               return_aux):
    """Arguments as `entmax_attention`, already validated, with `scale` a float. Differentiable."""
    dtype = compute_dtype(q.dtype)
    vc = v.to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Nk, D)
    z, empty = reference_logits(q.to(dtype), k.to(dtype), causal=causal, scale=scale,
                                alibi_slopes=alibi_slopes, q_scale=q_scale, key_padding_mask=key_padding_mask)

    if alpha == 1.0:
        p = torch.softmax(z, dim=-1)
    else:
        p = entmax(z, alpha=alpha, dim=-1, backend="reference")
    p = p.masked_fill(empty, 0.0)
    out = (p @ vc).to(q.dtype)
    if not return_aux:
        return out

    with torch.no_grad():
        if alpha == 1.0:
            tau = torch.logsumexp(z, dim=-1)
        else:
            # p is increasing in z: at the largest logit, p_max^(alpha-1) = (alpha-1) z_max - tau.
            tau = (alpha - 1) * z.amax(-1) - p.amax(-1) ** (alpha - 1)
        tau = tau.masked_fill(empty[..., 0], float("inf")).float()
        # softmax weights are all positive on visible keys (even where exp underflows in floating point)
        live = ((z > float("-inf")) & ~empty) if alpha == 1.0 else (p > 0)
        support = live.sum(-1, dtype=torch.int32)
    return out, AttentionAux(tau, support)
