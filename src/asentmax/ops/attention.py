"""Entmax attention: the public entry point and the one place that picks a backend (and its fallback).

Layout (batch, heads, seq, head_dim), as torch SDPA. Implements the attention of arXiv:2506.16640,
section 2:

    z[b,h,r,j] = q_scale[b,h,r] * scale * (q[b,h,r] . k[b,h//G,j]) - slope[h] * |pos(r) - j|
    p[b,h,r,:] = alpha-entmax(z[b,h,r,:])     (softmax when alpha == 1)
    out[b,h,r] = sum_j p[b,h,r,j] v[b,h//G,j]

with pos(r) = r + Nk - Nq (queries are the last positions, as in cached decoding), G = H / Hkv
(grouped-query attention: query head h reads key/value head h // G, as torch SDPA's enable_gqa), keys
past pos(r) hidden when causal and padded keys always hidden. `q_scale` is the paper's per-query inverse
temperature theta, the slope its ALiBi m_h (the paper's m_h (j - i) for j <= i equals -m_h |i - j|). A row
with no visible key returns 0, never NaN.

Backends (names in asentmax.ops.types.BACKENDS): "reference" (dense oracle, reference.py), "chunked"
(memory O(N * block), chunked.py), "triton" (GPU kernels, asentmax.ops.triton, imported lazily) and
"auto" (triton for CUDA tensors when available, chunked otherwise). Each backend declares a
BackendSupport; a call outside it (triton: alpha > 2, head_dim > 256, kv_lengths outside a decoding call)
is computed by "chunked", decided here and nowhere else. The chunked and triton computations are torch
custom ops (asentmax::chunked_attention, asentmax::attention_fwd / attention_bwd / attention_decode): the one
boundary torch.compile sees, so that a compiled model traces this function and the argument checks but none
of the block loops or kernel launches.
"""

import os

import torch

from asentmax.ops import chunked, reference
from asentmax.ops import triton as triton_backend
from asentmax.ops.types import BACKENDS, AttentionAux, needs_grad, validate_attention_args

__all__ = ["BACKENDS", "AttentionAux", "backend_refusal", "choose_backend", "entmax_attention",
           "resolve_backend"]


_SUPPORT = {"reference": reference.SUPPORT, "chunked": chunked.SUPPORT, "triton": triton_backend.SUPPORT}
assert chunked.SUPPORT.refusal(float("inf"), 1 << 30, torch.float64) is None  # the fallback takes every call


@torch.compiler.assume_constant_result
def _triton_available() -> bool:
    return triton_backend.is_available()


def choose_backend(backend: str, q: torch.Tensor, alpha: float) -> str:
    """The backend that computes a call with queries `q`: resolve_backend of q's device, head_dim, dtype."""
    return resolve_backend(backend, q.is_cuda, alpha, q.shape[-1], q.dtype)


def resolve_backend(backend: str, on_cuda: bool, alpha: float, head_dim: int, dtype: torch.dtype) -> str:
    """The backend that computes a call: "auto" resolved (triton for CUDA tensors when available), then
    "chunked" for a call outside the chosen backend's BackendSupport. ValueError when "triton" is asked
    for and cannot run. Also asked without a tensor (the trainer, before it captures CUDA graphs)."""
    if backend == "auto":
        backend = "triton" if on_cuda and _triton_available() else "chunked"
    elif backend == "triton" and not _triton_available():
        raise ValueError("backend='triton' needs the triton package and a CUDA device "
                         "(or TRITON_INTERPRET=1)")
    if _SUPPORT[backend].refusal(alpha, head_dim, dtype) is not None:
        return "chunked"
    return backend


def backend_refusal(backend: str, device_type: str) -> str | None:
    """None when `backend` can compute attention on a `device_type` ("cpu" / "cuda") device, else why not,
    on one line: "triton" where its kernels cannot run (no triton package, or the CPU without
    TRITON_INTERPRET=1). "auto" and the torch backends run everywhere. For checks before any tensor
    exists (training and evaluation settings)."""
    if backend != "triton":
        return None
    if not _triton_available() or (device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1"):
        return ("triton needs the triton package and a CUDA device (or TRITON_INTERPRET=1); use chunked "
                "on the CPU")
    return None


def entmax_attention(q, k, v, *, alpha=1.5, causal=True, scale=None, alibi_slopes=None, q_scale=None,
                     key_padding_mask=None, kv_lengths=None, backend="auto", return_aux=False):
    """alpha-entmax attention (softmax when alpha == 1), arXiv:2506.16640, section 2.

    Args:
        q: (B, H, Nq, D) queries; row r sits at absolute position r + Nk - Nq.
        k, v: (B, Hkv, Nk, D) keys and values, H % Hkv == 0; query head h uses kv head h // (H // Hkv).
        alpha: float >= 1; 1 = softmax, 1.5 = entmax-1.5, 2 = sparsemax.
        causal: key j is visible to row r iff j <= r + Nk - Nq.
        scale: multiplies q . k; default 1 / sqrt(D).
        alibi_slopes: None, (H,) or (B, H): bias -slope * |pos(r) - j| (0 = no position bias, NoPE head).
        q_scale: None or (B, H, Nq): per-query inverse temperature (the paper's theta; ASEntmax / SSMax);
            multiplies q . k only, never the ALiBi bias.
        key_padding_mask: None or bool (B, Nk), True = real key, False = padding (never attended).
        kv_lengths: None or int (B,), Nq <= kv_lengths[b] <= Nk: row b holds only its first kv_lengths[b]
            keys (the filled slots of a fixed-size cache buffer; later slots are never read, whatever they
            hold) and its queries sit at positions r + kv_lengths[b] - Nq. The same as slicing k, v and
            key_padding_mask of row b to kv_lengths[b] slots, with shapes that do not change as a cache
            fills (what a CUDA graph of a decoding step needs). Checked on the host, except under
            torch.compile and CUDA graph capture. The triton backend takes it in decoding calls (Nq <= 16,
            no gradient); other calls with it go to chunked.
        backend: "auto" | "reference" | "chunked" | "triton".
        return_aux: also return AttentionAux(tau, support_size), each (B, H, Nq).

    Returns:
        out (B, H, Nq, D) in q's dtype, or (out, AttentionAux) when return_aux. Differentiable with
        respect to q, k, v and q_scale.
    """
    alpha, scale = validate_attention_args(
        q, k, v, alpha=alpha, causal=causal, scale=scale, alibi_slopes=alibi_slopes, q_scale=q_scale,
        key_padding_mask=key_padding_mask, backend=backend, return_aux=return_aux, kv_lengths=kv_lengths)
    backend = choose_backend(backend, q, alpha)
    if kv_lengths is not None and _SUPPORT[backend].lengths_refusal(
            q.shape[2], needs_grad(q, k, v, q_scale)) is not None:
        backend = "chunked"
    if backend == "triton":
        run = triton_backend.triton_entmax_attention
    elif backend == "chunked":
        run = chunked.chunked_entmax_attention
    else:
        run = reference.reference_entmax_attention
    return run(q, k, v, alpha=alpha, causal=causal, scale=scale, alibi_slopes=alibi_slopes, q_scale=q_scale,
               key_padding_mask=key_padding_mask, kv_lengths=kv_lengths, return_aux=return_aux)
