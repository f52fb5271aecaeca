"""GPU kernels (Triton) of asentmax. Importing this package needs neither a GPU nor triton.

- `SUPPORT`: what the fused attention kernels compute (read by the dispatcher, asentmax.ops.attention,
  which sends every other call to the chunked backend).
- `is_available()`: triton importable and (CUDA available or TRITON_INTERPRET=1).
- `triton_entmax_attention(...)`: fused entmax attention (attention.py: the torch custom ops
  asentmax::attention_fwd / attention_bwd / attention_decode over the kernels of attention_fwd.py,
  attention_bwd.py and attention_decode.py), the `triton` backend of `entmax_attention`.
- `entmax_rows`: the row-wise entmax kernel (its own module).
"""

import importlib.util
import os

from asentmax.ops.types import BackendSupport

# alpha > 2: the threshold function is not convex there, which the kernels' Newton passes rely on;
# head_dim > 256: the tiles would outgrow shared memory.
SUPPORT = BackendSupport(max_alpha=2.0, max_head_dim=256)


def is_available():
    """True when the triton package is importable and it can run (a CUDA device, or the interpreter)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return torch.cuda.is_available()


def triton_entmax_attention(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                            return_aux):
    """Fused entmax attention; see asentmax.ops.attention.entmax_attention for every argument."""
    from asentmax.ops.triton.attention import triton_entmax_attention as run

    return run(q, k, v, alpha=alpha, causal=causal, scale=scale, alibi_slopes=alibi_slopes, q_scale=q_scale,
               key_padding_mask=key_padding_mask, return_aux=return_aux)
