"""Dense reference entmax attention: materialises the (B, H, Nq, Nk) logits. The oracle of every backend.

Layout (batch, heads, seq, head_dim). Implements arXiv:2506.16640, section 2, as stated in attention.py:
z = q_scale * scale * (q . k) - slope * |pos(r) - j| on the visible keys (causal, key padding, kv_lengths),
then alpha-entmax (asentmax.ops.entmax.entmax; softmax when alpha == 1) and p @ v. Memory O(Nq * Nk): use
it for tests and short sequences only; `chunked` is the long-sequence path.
"""

import torch

from asentmax.ops.entmax import compute_dtype, entmax
from asentmax.ops.types import AttentionAux, BackendSupport

SUPPORT = BackendSupport()  # every alpha >= 1, head_dim and float dtype


def query_positions(n_q, n_k, kv_lengths, device):
    """(B or 1, Nq) long: the position of query row r, r + n - Nq with n = kv_lengths[b] (at most Nk), or
    n = Nk without kv_lengths."""
    rows = torch.arange(n_q, device=device)
    if kv_lengths is None:
        return (rows + (n_k - n_q))[None]
    return kv_lengths.long().clamp(max=n_k)[:, None] - n_q + rows


def visible_keys(pos, n_k, causal, key_padding_mask, kv_lengths):
    """Bool mask (B or 1, 1, Nq, Nk): True where query row r (at position pos[b, r]) may attend key j."""
    keys = torch.arange(n_k, device=pos.device)
    visible = keys <= pos[..., None] if causal else torch.ones(1, 1, n_k, dtype=torch.bool, device=pos.device)
    if kv_lengths is not None:
        visible = visible & (keys < kv_lengths[:, None, None])
    visible = visible[:, None]
    if key_padding_mask is not None:
        visible = visible & key_padding_mask[:, None, None, :]
    return visible


def alibi_bias(alibi_slopes, pos, n_k, dtype):
    """-slope * |pos(r) - j| with shape (B or 1, H, Nq, Nk), pos (B or 1, Nq) the query positions."""
    distance = (pos[:, None, :, None] - torch.arange(n_k, device=pos.device)).abs().to(dtype)
    slopes = alibi_slopes.to(dtype)
    slopes = slopes[None] if slopes.dim() == 1 else slopes
    return -slopes[:, :, None, None] * distance


def reference_logits(q, k, *, causal, scale, alibi_slopes, q_scale, key_padding_mask, kv_lengths=None):
    """Logits z (B, H, Nq, Nk) in q's dtype, -inf on hidden keys, and `empty` (B or 1, 1, Nq, 1): the rows
    with no visible key, where z is 0. k (B, Hkv, Nk, D) is repeated over its GQA group. Differentiable."""
    n_q, n_k = q.shape[2], k.shape[2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Nk, D)
    z_mult = scale if q_scale is None else scale * q_scale.to(q.dtype)[..., None]
    z = z_mult * (q @ k.transpose(-1, -2))
    pos = query_positions(n_q, n_k, kv_lengths, q.device)
    if alibi_slopes is not None:
        z = z + alibi_bias(alibi_slopes, pos, n_k, q.dtype)
    visible = visible_keys(pos, n_k, causal, key_padding_mask, kv_lengths)
    empty = ~visible.any(-1, keepdim=True)
    return z.masked_fill(~visible | empty, float("-inf")).masked_fill(empty, 0.0), empty


def reference_entmax_attention(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                               return_aux, kv_lengths=None):
    """Arguments as `entmax_attention`, already validated, with `scale` a float. Differentiable."""
    dtype = compute_dtype(q.dtype)
    if kv_lengths is not None:  # slots past a row's length may hold anything (NaN too): 0 * NaN is NaN
        past = torch.arange(k.shape[2], device=k.device)[:, None] >= kv_lengths[:, None, None, None]
        k, v = k.masked_fill(past, 0.0), v.masked_fill(past, 0.0)  # past: (B, 1, Nk, 1)
    vc = v.to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Nk, D)
    z, empty = reference_logits(q.to(dtype), k.to(dtype), causal=causal, scale=scale,
                                alibi_slopes=alibi_slopes, q_scale=q_scale, key_padding_mask=key_padding_mask,
                                kv_lengths=kv_lengths)

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
