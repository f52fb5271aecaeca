"""asentmax: exact alpha-entmax and ASEntmax sparse attention for long-context generalisation.

Implements "Long-Context Generalization with Sparse Attention" (arXiv:2506.16640).
"""

from asentmax.ops.attention import entmax_attention
from asentmax.ops.entmax import entmax, entmax15, sparsemax

__all__ = ["entmax", "entmax15", "sparsemax", "entmax_attention"]
__version__ = "0.1.0"
