"""Triton backend of `entmax_attention` as torch custom ops (arXiv:2506.16640, section 2).

Layout (batch, heads, seq, head_dim). Semantics exactly as asentmax.ops.attention.entmax_attention, whose
validation and backend choice have already run (the dispatcher sends only calls inside SUPPORT of
asentmax.ops.triton: 1 <= alpha <= 2, head_dim <= 256). Computed with fp32 thresholds and accumulators;
fp64 inputs are computed in fp32 (use the reference or chunked backend for fp64 accuracy), returned as fp64.

The kernels are wrapped as three custom ops of the `asentmax` namespace, so that torch.compile treats each
as one opaque call (shapes from its fake implementation) instead of tracing the launchers:
  asentmax::attention_fwd     fused forward (attention_fwd.py), with the tensors the backward needs;
  asentmax::attention_bwd     fused backward (attention_bwd.py), the autograd formula of attention_fwd;
  asentmax::attention_decode  forward only, for Nq <= 16: one launch at short caches
                              (attention_decode_short.py), split over the keys beyond (attention_decode.py).
"""

import math

import torch
from torch import Tensor

from asentmax.ops.triton.attention_bwd import entmax_attention_bwd
from asentmax.ops.triton.attention_common import MAX_QUERIES, cdiv, forward_blocks, kernel_blocks, mode_of
from asentmax.ops.triton.attention_decode import entmax_attention_decode
from asentmax.ops.triton.attention_fwd import entmax_attention_fwd
from asentmax.ops.types import AttentionAux, needs_grad

# Threshold passes stop once sum_j p_j at the best lower bound of tau is within tol of 1; one more Newton
# step is then taken for free, so the weights' error is about tol^2 (relative 1e-4 at tol 3e-2).
_TOL = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 3e-2}
_MAX_NEWTON_PASSES = 40


@torch.library.custom_op("asentmax::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor | None, slopes: Tensor | None,
                  kpm: Tensor | None, alpha: float, scale: float, causal: bool, write_o2: bool,
                  write_support: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(out, o2, tau, inv_z, support, tile_max) of the fused forward; o2 / support are empty when not
    written. q_scale, slopes fp32, kpm uint8, all contiguous; q, k, v with unit last stride."""
    out, o2, tau, inv_z, support, tile_max, _ = entmax_attention_fwd(
        q, k, v, mode=mode_of(alpha), alpha=alpha, scale=scale, causal=causal, slopes=slopes,
        q_scale=q_scale, kpm=kpm, write_o2=write_o2, tol=_TOL[q.dtype], max_iter=_MAX_NEWTON_PASSES,
        blocks=forward_blocks(q.shape[-1], q.shape[2]), write_support=write_support)
    empty = q.new_empty(0, dtype=torch.float32)
    return (out, empty if o2 is None else o2, tau, inv_z,
            empty.to(torch.int32) if support is None else support, tile_max)


@attention_fwd.register_fake
def _(q, k, v, q_scale, slopes, kpm, alpha, scale, causal, write_o2, write_support):
    batch, heads, n_q, dim = q.shape
    block_m, block_n, _, _ = forward_blocks(dim, n_q)
    rows = (batch, heads, n_q)
    f32 = dict(dtype=torch.float32, device=q.device)
    return (torch.empty_like(q), q.new_empty((*rows, dim) if write_o2 else (0,), **f32),
            q.new_empty(rows, **f32), q.new_empty(rows, **f32),
            q.new_empty(rows if write_support else (0,), dtype=torch.int32),
            q.new_empty((*rows[:2], cdiv(n_q, block_m), cdiv(k.shape[2], block_n)), **f32))


@torch.library.custom_op("asentmax::attention_bwd", mutates_args=())
def attention_bwd(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, o2: Tensor, tau: Tensor, inv_z: Tensor,
                  tile_max: Tensor, q_scale: Tensor | None, slopes: Tensor | None, kpm: Tensor | None,
                  alpha: float, scale: float, causal: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dq_scale) of attention_fwd; dq_scale is empty without q_scale."""
    fwd_blocks, *backward_blocks = kernel_blocks(q.shape[-1], q.shape[2])
    dq, dk, dv, dq_scale = entmax_attention_bwd(
        d_out, q, k, v, o2, tau, inv_z, tile_max, mode=mode_of(alpha), alpha=alpha, scale=scale,
        causal=causal, slopes=slopes, q_scale=q_scale, kpm=kpm, blocks=fwd_blocks,
        backward_blocks=backward_blocks)
    return dq, dk, dv, q.new_empty(0, dtype=torch.float32) if dq_scale is None else dq_scale


@attention_bwd.register_fake
def _(d_out, q, k, v, o2, tau, inv_z, tile_max, q_scale, slopes, kpm, alpha, scale, causal):
    dq_scale = torch.empty_like(tau) if q_scale is not None else tau.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dq_scale


def _setup_context(ctx, inputs, output):
    q, k, v, q_scale, slopes, kpm, alpha, scale, causal, _, _ = inputs
    _, o2, tau, inv_z, _, tile_max = output
    ctx.save_for_backward(q, k, v, q_scale, slopes, kpm, o2, tau, inv_z, tile_max)
    ctx.options = (alpha, scale, causal)


def _backward(ctx, d_out, *_):
    q, k, v, q_scale, slopes, kpm, o2, tau, inv_z, tile_max = ctx.saved_tensors
    dq, dk, dv, dq_scale = attention_bwd(d_out, q, k, v, o2, tau, inv_z, tile_max, q_scale, slopes, kpm,
                                         *ctx.options)
    return dq, dk, dv, (dq_scale if q_scale is not None else None), None, None, None, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _decode(q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor | None, slopes: Tensor | None,
            kpm: Tensor | None, lengths: Tensor | None, alpha: float, scale: float,
            causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(out, tau, support) for Nq <= MAX_QUERIES, forward only; arguments as attention_fwd, and `lengths`
    the kv_lengths of entmax_attention (int32 or int64) or None."""
    return entmax_attention_decode(q, k, v, mode=mode_of(alpha), alpha=alpha, scale=scale, causal=causal,
                                   slopes=slopes, q_scale=q_scale, kpm=kpm, tol=_TOL[q.dtype],
                                   max_iter=_MAX_NEWTON_PASSES, lengths=lengths)


# Eager decoding calls _decode itself: at short caches the custom op's dispatch (about 15 us of host time a
# call) would be a large part of a step. torch.compile sees the op.
attention_decode = torch.library.custom_op("asentmax::attention_decode", _decode, mutates_args=())


@attention_decode.register_fake
def _(q, k, v, q_scale, slopes, kpm, lengths, alpha, scale, causal):
    rows = q.shape[:3]
    return (q.new_empty(q.shape), q.new_empty(rows, dtype=torch.float32),
            q.new_empty(rows, dtype=torch.int32))


def _unit_last_stride(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def triton_entmax_attention(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                            return_aux, kv_lengths=None):
    """Fused entmax attention; arguments and result as `asentmax.ops.attention.entmax_attention`
    (kv_lengths only in decoding calls: the dispatcher sends the others to chunked, SUPPORT's
    lengths_refusal).

    Host work is kept to what a call needs (decoding runs this once per layer and token): conversions and
    copies only where an argument is not already in the kernels' form, the mask reinterpreted as uint8 in
    place (a view: bool is one byte of 0 or 1), no `.to` of a result already in q's dtype."""
    in_dtype = q.dtype
    if in_dtype == torch.float64:
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    batch, heads, n_q, _ = q.shape
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.detach()
        if slopes.dim() == 1 or slopes.dtype != torch.float32 or not slopes.is_contiguous():
            slopes = slopes.float().expand(batch, heads).contiguous()
    grad = needs_grad(q, k, v, q_scale)
    if q_scale is not None and (q_scale.dtype != torch.float32 or not q_scale.is_contiguous()):
        q_scale = q_scale.float().contiguous()
    kpm = None if key_padding_mask is None else key_padding_mask.contiguous().view(torch.uint8)
    if kv_lengths is not None and not kv_lengths.is_contiguous():  # the kernels read Lengths[b]
        kv_lengths = kv_lengths.contiguous()
    if n_q <= MAX_QUERIES and not grad:  # decoding kernels, forward only
        decode = attention_decode if torch.compiler.is_compiling() else _decode
        out, tau, support = decode(q, k, v, q_scale, slopes, kpm, kv_lengths, alpha, scale, causal)
    else:
        out, _, tau, _, support, _ = attention_fwd(q, k, v, q_scale, slopes, kpm, alpha, scale, causal, grad,
                                                   return_aux)
    if out.dtype != in_dtype:
        out = out.to(in_dtype)
    if not return_aux:
        return out
    tau = tau.detach()
    if alpha == 1.0:
        tau = tau * math.log(2.0)  # the kernel works in log2 units
    return out, AttentionAux(tau, support)
