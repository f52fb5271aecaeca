"""Shared types of entmax attention: the backend names, the aux record, argument validation and what a
backend supports. The bottom of ops/: the dispatcher (attention.py) and every backend import it; it imports
no backend.

The attention itself is that of arXiv:2506.16640, section 2 (see asentmax.ops.attention for the formula).
"""

import math
from dataclasses import dataclass
from numbers import Real
from typing import NamedTuple

import torch

from asentmax.ops.entmax import ALPHA_MAX

BACKENDS = ("auto", "reference", "chunked", "triton")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LENGTH_DTYPES = (torch.int32, torch.int64)


class AttentionAux(NamedTuple):
    """Per-row analysis outputs, each (B, H, Nq).

    tau: fp32 threshold with p = [(alpha-1) z - tau]_+^(1/(alpha-1)); for alpha == 1 tau = logsumexp(z)
        and p = exp(z - tau). +inf for rows with no visible key.
    support_size: int32 number of keys with p > 0; for alpha == 1 every visible key (softmax weights are
        positive in exact arithmetic, whatever underflows in floating point).
    """

    tau: torch.Tensor
    support_size: torch.Tensor


@dataclass(frozen=True)
class BackendSupport:
    """What one backend computes: alpha in {1} or (1, max_alpha], head_dim <= max_head_dim, these dtypes.
    The dispatcher (attention.py) reads it to decide a fallback; a backend never falls back by itself."""

    max_alpha: float = math.inf
    max_head_dim: int | None = None
    dtypes: tuple = FLOAT_DTYPES
    lengths_max_queries: int | None = None  # kv_lengths only in calls of at most this many queries without
    # gradients (decoding calls); None: in every call

    def refusal(self, alpha: float, head_dim: int, dtype: torch.dtype) -> str | None:
        """None when the backend computes this call, else the reason it does not."""
        if alpha > self.max_alpha:
            return f"alpha={alpha} > {self.max_alpha}"
        if self.max_head_dim is not None and head_dim > self.max_head_dim:
            return f"head_dim={head_dim} > {self.max_head_dim}"
        if dtype not in self.dtypes:
            return f"dtype {dtype}"
        return None

    def lengths_refusal(self, n_q: int, grad: bool) -> str | None:
        """None when the backend takes kv_lengths in a call of n_q queries that needs gradients (`grad`) or
        not, else why not."""
        if self.lengths_max_queries is not None and (n_q > self.lengths_max_queries or grad):
            return f"kv_lengths only in calls of Nq <= {self.lengths_max_queries} without gradients"
        return None


def needs_grad(q, k, v, q_scale) -> bool:
    """True when autograd records the call: grad mode is on and an input requires a gradient."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
        q_scale is not None and q_scale.requires_grad))


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


def _check_qkv_kinds(q, k, v):
    """Raise the error for the first of q, k, v that is not a 4-D floating tensor, then for mixed dtypes."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be a floating tensor (fp16/bf16/fp32/fp64), got {x.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_lengths(kv_lengths, n_q, n_k):
    """ValueError unless Nq <= kv_lengths[b] <= Nk for every row. A host read: skipped while torch.compile
    traces and while a CUDA graph is captured (there the kernels clamp a length to Nk, and a row whose
    queries sit before the first key sees none and returns 0)."""
    if torch.compiler.is_compiling():
        return
    if kv_lengths.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    low, high = torch.stack([kv_lengths.min(), kv_lengths.max()]).tolist()
    if low < n_q or high > n_k:
        raise ValueError(f"kv_lengths must lie in [Nq, Nk] = [{n_q}, {n_k}] (the filled slots of each row, "
                         f"its queries the last Nq of them), got values in [{low}, {high}]")


def validate_attention_args(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                            backend, return_aux, kv_lengths=None):
    """Check every argument of `entmax_attention`; return (alpha: float, scale: float).

    Raises ValueError (TypeError for non-tensors / non-numbers) naming the offending argument. Written for
    a decoding step, where this runs once per layer and token: the common case (three 4-D tensors of one
    floating dtype, a float alpha) is tested at once, and only a failing call goes through the checks one
    by one (_check_qkv_kinds), so that every error is the one the first failing check gives.
    """
    tensor = torch.Tensor
    if not (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor)):
        _check_qkv_kinds(q, k, v)
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape  # (each .shape builds a torch.Size: read once)
    dtype = q.dtype
    if not (len(q_shape) == 4 and len(k_shape) == 4 and len(v_shape) == 4 and dtype in FLOAT_DTYPES
            and k.dtype == dtype and v.dtype == dtype):
        _check_qkv_kinds(q, k, v)
    device = q.device
    if k.device != device or v.device != device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    batch, heads, n_q, dim = q_shape
    if k_shape != v_shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k_shape)} and {tuple(v_shape)}")
    k_batch, kv_heads, n_k, k_dim = k_shape
    if k_batch != batch:
        raise ValueError(f"batch sizes differ: q has {batch}, k/v have {k_batch}")
    if k_dim != dim:
        raise ValueError(f"head_dim differs: q has {dim}, k/v have {k_dim}")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q heads ({heads}) must be a multiple of k/v heads ({kv_heads}) (GQA)")
    if n_q == 0 or n_k == 0 or dim == 0:
        raise ValueError(f"empty input: Nq={n_q}, Nk={n_k}, head_dim={dim}")
    if n_q > n_k:
        raise ValueError(f"query length ({n_q}) must not exceed key length ({n_k}): queries are the "
                         "last Nq positions of the key sequence")

    if type(alpha) is not float:
        if isinstance(alpha, bool) or not isinstance(alpha, Real):
            raise TypeError(f"alpha must be a real number >= 1, got {type(alpha).__name__}")
        alpha = float(alpha)
    if not (math.isfinite(alpha) and 1.0 <= alpha <= ALPHA_MAX):
        raise ValueError(f"alpha must lie in [1, {ALPHA_MAX:g}] (1 = softmax; the range alpha-entmax "
                         f"supports), got {alpha}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    else:
        if isinstance(scale, bool) or not isinstance(scale, Real):
            raise TypeError(f"scale must be None or a real number, got {type(scale).__name__}")
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")

    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, [(heads,), (batch, heads)], FLOAT_DTYPES, device)
    if q_scale is not None:
        _check_tensor("q_scale", q_scale, [(batch, heads, n_q)], FLOAT_DTYPES, device)
    if key_padding_mask is not None:
        _check_tensor("key_padding_mask", key_padding_mask, [(batch, n_k)], (torch.bool,), device)
    if kv_lengths is not None:
        _check_tensor("kv_lengths", kv_lengths, [(batch,)], LENGTH_DTYPES, device)
        _check_lengths(kv_lengths, n_q, n_k)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if not isinstance(return_aux, bool):
        raise TypeError(f"return_aux must be a bool, got {type(return_aux).__name__}")
    return alpha, scale
