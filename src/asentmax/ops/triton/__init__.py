"""GPU kernels (Triton) of asentmax. Importing this package needs neither a GPU nor triton.

- `SUPPORT`: what the fused attention kernels compute (read by the dispatcher, asentmax.ops.attention,
  which sends every other call to the chunked backend).
- `is_available()`: triton importable and (CUDA available or TRITON_INTERPRET=1).
- `triton_entmax_attention(...)`: fused entmax attention (attention.py: the torch custom ops
  asentmax::attention_fwd / attention_bwd / attention_decode over the kernels of attention_fwd.py,
  attention_bwd.py and attention_decode.py), the `triton` backend of `entmax_attention`; imported on
  first use.
- `entmax_rows`: the row-wise entmax kernel (its own module).
"""

import functools
import importlib.util
import os

from asentmax.ops.triton.limits import MAX_QUERIES
from asentmax.ops.types import BackendSupport

# alpha > 2: the threshold function is not convex there, which the kernels' Newton passes rely on;
# head_dim > 256: the tiles would outgrow shared memory; kv_lengths: the decoding kernels (forward only, Nq
# <= MAX_QUERIES) read them, the fused training kernels do not.
SUPPORT = BackendSupport(max_alpha=2.0, max_head_dim=256, lengths_max_queries=MAX_QUERIES)


@functools.cache
def is_available():
    """True when the triton package is importable and it can run (a CUDA device, or the interpreter).
    Decided once per process: triton itself reads TRITON_INTERPRET when the kernels are defined."""
    if importlib.util.find_spec("triton") is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return torch.cuda.is_available()


def __getattr__(name):
    """`triton_entmax_attention`, imported from attention.py on first use (it needs triton) and then kept
    as this package's attribute, so that later calls (one per layer and token when decoding) pay no import
    and no extra call."""
    if name != "triton_entmax_attention":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from asentmax.ops.triton.attention import triton_entmax_attention

    globals()[name] = triton_entmax_attention
    return triton_entmax_attention
