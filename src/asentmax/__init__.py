"""asentmax: exact alpha-entmax and ASEntmax sparse attention for long-context generalisation.

Implements "Long-Context Generalization with Sparse Attention" (arXiv:2506.16640). The top-level
names are imported lazily, so that ``import asentmax.tasks`` (numpy only) does not pull in torch.
"""

import importlib

_LAZY = {
    "entmax": "asentmax.ops.entmax",
    "entmax15": "asentmax.ops.entmax",
    "sparsemax": "asentmax.ops.entmax",
    "entmax_attention": "asentmax.ops.attention",
}

__all__ = list(_LAZY)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asentmax' has no attribute {name!r}")
