"""Triton backend of `entmax_attention`: autograd.Function over the fused kernels (PAPER.md section 2).

Layout (batch, heads, seq, head_dim). Semantics exactly as asentmax.ops.attention.entmax_attention, whose
validation has already run. Inputs are computed with fp32 thresholds and accumulators; fp64 inputs are
computed in fp32 (use the reference or chunked backend for fp64 accuracy) and returned as fp64.
"""

import math

import torch

from asentmax.ops.attention import AttentionAux
from asentmax.ops.triton.attention_bwd import entmax_attention_bwd
from asentmax.ops.triton.attention_common import block_config, mode_of
from asentmax.ops.triton.attention_decode import MAX_QUERIES, entmax_attention_decode
from asentmax.ops.triton.attention_fwd import entmax_attention_fwd

# Threshold passes stop once sum_j p_j at the best lower bound of tau is within tol of 1; one more Newton
# step is then taken for free, so the weights' error is about tol^2 (relative 1e-4 at tol 3e-2).
_TOL = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 3e-2}
_MAX_NEWTON_PASSES = 40
MAX_HEAD_DIM = 256


class _EntmaxAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_scale, alpha, causal, scale, slopes, kpm, return_aux):
        mode = mode_of(alpha)
        blocks = block_config(q.shape[-1], q.shape[2])
        needs_grad = any(ctx.needs_input_grad[:4])
        out, o2, tau, inv_z, support, tile_max, _ = entmax_attention_fwd(
            q, k, v, mode=mode, alpha=alpha, scale=scale, causal=causal, slopes=slopes, q_scale=q_scale,
            kpm=kpm, write_o2=needs_grad, tol=_TOL[q.dtype], max_iter=_MAX_NEWTON_PASSES,
            blocks=blocks, write_support=return_aux)
        ctx.save_for_backward(q, k, v, o2, tau, inv_z, tile_max, q_scale, slopes, kpm)
        ctx.options = dict(mode=mode, alpha=alpha, scale=scale, causal=causal, blocks=blocks)
        ctx.mark_non_differentiable(tau, *([support] if return_aux else []))
        return out, tau, support

    @staticmethod
    def backward(ctx, d_out, _d_tau, _d_support):
        q, k, v, o2, tau, inv_z, tile_max, q_scale, slopes, kpm = ctx.saved_tensors
        dq, dk, dv, dq_scale = entmax_attention_bwd(
            d_out, q, k, v, o2, tau, inv_z, tile_max, slopes=slopes, q_scale=q_scale, kpm=kpm,
            **ctx.options)
        return dq, dk, dv, dq_scale, None, None, None, None, None, None


def _unit_last_stride(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def triton_entmax_attention(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                            return_aux):
    """Fused entmax attention; arguments and result as `asentmax.ops.attention.entmax_attention`.

    The kernels cover alpha == 1 and 1 < alpha <= 2 (PAPER.md's range) and head dims up to MAX_HEAD_DIM;
    alpha > 2 (its threshold function is not convex there, which the kernels' passes rely on) and larger head
    dims (tiles that outgrow shared memory) are computed by the chunked torch backend.
    """
    if alpha > 2.0 or q.shape[-1] > MAX_HEAD_DIM:
        from asentmax.ops.chunked import chunked_entmax_attention

        return chunked_entmax_attention(q, k, v, alpha=alpha, causal=causal, scale=scale,
                                        alibi_slopes=alibi_slopes, q_scale=q_scale,
                                        key_padding_mask=key_padding_mask, return_aux=return_aux)
    in_dtype = q.dtype
    if in_dtype == torch.float64:
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    batch, heads = q.shape[:2]
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.detach().float().expand(batch, heads).contiguous()
    qs = None
    if q_scale is not None:
        qs = q_scale.float().contiguous()
    kpm = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    needs_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, q_scale))
    if q.shape[2] <= MAX_QUERIES and not needs_grad:  # decoding: split over the keys, forward only
        out, tau, support = entmax_attention_decode(
            q, k, v, mode=mode_of(alpha), alpha=float(alpha), scale=float(scale), causal=causal,
            slopes=slopes, q_scale=qs, kpm=kpm, tol=_TOL[q.dtype], max_iter=_MAX_NEWTON_PASSES)
    else:
        out, tau, support = _EntmaxAttention.apply(q, k, v, qs, float(alpha), causal, float(scale), slopes,
                                                   kpm, return_aux)
    out = out.to(in_dtype)
    if not return_aux:
        return out
    if alpha == 1.0:
        tau = tau * math.log(2.0)  # the kernel works in log2 units
    return out, AttentionAux(tau, support)
