"""Entmax attention: the public entry point, argument validation and backend dispatch.

Layout (batch, heads, seq, head_dim), as torch SDPA. Implements the attention of PAPER.md section 2:

    z[b,h,r,j] = q_scale[b,h,r] * scale * (q[b,h,r] . k[b,h//G,j]) - slope[h] * |pos(r) - j|
    p[b,h,r,:] = alpha-entmax(z[b,h,r,:])     (softmax when alpha == 1)
    out[b,h,r] = sum_j p[b,h,r,j] v[b,h//G,j]

with pos(r) = r + Nk - Nq (queries are the last positions, as in cached decoding), G = H / Hkv
(grouped-query attention: query head h reads key/value head h // G, as torch SDPA's enable_gqa), keys
past pos(r) hidden when causal and padded keys always hidden. theta_hi of the paper is `q_scale`, m_h the
ALiBi slope (the paper's m_h (j - i) for j <= i equals -m_h |i - j|). A row with no visible key returns
0, never NaN.

Backends: "reference" (dense oracle, reference.py), "chunked" (memory O(N * block), chunked.py),
"triton" (GPU kernels, asentmax.ops.triton, imported lazily) and "auto" (triton for CUDA tensors when
available, chunked otherwise). All backends share `validate_attention_args`.
"""

import math
from numbers import Real
from typing import NamedTuple

import torch

BACKENDS = ("auto", "reference", "chunked", "triton")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class AttentionAux(NamedTuple):
    """Per-row analysis outputs, each (B, H, Nq).

    tau: fp32 threshold with p = [(alpha-1) z - tau]_+^(1/(alpha-1)); for alpha == 1 tau = logsumexp(z)
        and p = exp(z - tau). +inf for rows with no visible key.
    support_size: int32 number of keys with p > 0; for alpha == 1 every visible key (softmax weights are
        positive in exact arithmetic, whatever underflows in floating point).
    """

    tau: torch.Tensor
    support_size: torch.Tensor


def _check_tensor(name, x, shape_options, dtypes, device):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) not in shape_options:
        wanted = " or ".join(str(s) for s in shape_options)
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but q is on {device}")


def validate_attention_args(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                            backend, return_aux):
    """Check every argument of `entmax_attention`; return (alpha: float, scale: float).

    Raises ValueError (TypeError for non-tensors / non-numbers) naming the offending argument.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
        if x.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be a floating tensor (fp16/bf16/fp32/fp64), got {x.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    batch, heads, n_q, dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q has {batch}, k/v have {k.shape[0]}")
    if k.shape[3] != dim:
        raise ValueError(f"head_dim differs: q has {dim}, k/v have {k.shape[3]}")
    kv_heads, n_k = k.shape[1], k.shape[2]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q heads ({heads}) must be a multiple of k/v heads ({kv_heads}) (GQA)")
    if n_q == 0 or n_k == 0 or dim == 0:
        raise ValueError(f"empty input: Nq={n_q}, Nk={n_k}, head_dim={dim}")
    if n_q > n_k:
        raise ValueError(f"query length ({n_q}) must not exceed key length ({n_k}): queries are the "
                         "last Nq positions of the key sequence")

    if isinstance(alpha, bool) or not isinstance(alpha, Real):
        raise TypeError(f"alpha must be a real number >= 1, got {type(alpha).__name__}")
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha >= 1.0):
        raise ValueError(f"alpha must be a finite number >= 1 (1 = softmax), got {alpha}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    elif isinstance(scale, bool) or not isinstance(scale, Real):
        raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")

    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, [(heads,), (batch, heads)], _FLOAT_DTYPES, q.device)
    if q_scale is not None:
        _check_tensor("q_scale", q_scale, [(batch, heads, n_q)], _FLOAT_DTYPES, q.device)
    if key_padding_mask is not None:
        _check_tensor("key_padding_mask", key_padding_mask, [(batch, n_k)], (torch.bool,), q.device)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if not isinstance(return_aux, bool):
        raise TypeError(f"return_aux must be a bool, got {type(return_aux).__name__}")
    return alpha, scale


def _triton_available():
    try:
        from asentmax.ops import triton as triton_backend
    except ImportError:
        return False
    return triton_backend.is_available()


def entmax_attention(q, k, v, *, alpha=1.5, causal=True, scale=None, alibi_slopes=None, q_scale=None,
                     key_padding_mask=None, backend="auto", return_aux=False):
    """alpha-entmax attention (softmax when alpha == 1), PAPER.md section 2.

    Args:
        q: (B, H, Nq, D) queries; row r sits at absolute position r + Nk - Nq.
        k, v: (B, Hkv, Nk, D) keys and values, H % Hkv == 0; query head h uses kv head h // (H // Hkv).
        alpha: float >= 1; 1 = softmax, 1.5 = entmax-1.5, 2 = sparsemax.
        causal: key j is visible to row r iff j <= r + Nk - Nq.
        scale: multiplies q . k; default 1 / sqrt(D).
        alibi_slopes: None, (H,) or (B, H): bias -slope * |pos(r) - j| (0 = no position bias, NoPE head).
        q_scale: None or (B, H, Nq): per-query inverse temperature theta (ASEntmax / SSMax); multiplies
            q . k only, never the ALiBi bias.
        key_padding_mask: None or bool (B, Nk), True = real key, False = padding (never attended).
        backend: "auto" | "reference" | "chunked" | "triton".
        return_aux: also return AttentionAux(tau, support_size), each (B, H, Nq).

    Returns:
        out (B, H, Nq, D) in q's dtype, or (out, AttentionAux) when return_aux. Differentiable with
        respect to q, k, v and q_scale.
    """
    alpha, scale = validate_attention_args(
        q, k, v, alpha=alpha, causal=causal, scale=scale, alibi_slopes=alibi_slopes, q_scale=q_scale,
        key_padding_mask=key_padding_mask, backend=backend, return_aux=return_aux)
    options = dict(alpha=alpha, causal=causal, scale=scale, alibi_slopes=alibi_slopes, q_scale=q_scale,
                   key_padding_mask=key_padding_mask, return_aux=return_aux)
    if backend == "auto":
        backend = "triton" if q.is_cuda and _triton_available() else "chunked"
    if backend == "reference":
        from asentmax.ops.reference import reference_entmax_attention
        return reference_entmax_attention(q, k, v, **options)
    if backend == "chunked":
        from asentmax.ops.chunked import chunked_entmax_attention
        return chunked_entmax_attention(q, k, v, **options)
    if not _triton_available():
        raise ValueError("backend='triton' needs the triton package and a CUDA device "
                         "(or TRITON_INTERPRET=1)")
    from asentmax.ops.triton import triton_entmax_attention
    return triton_entmax_attention(q, k, v, **options)
