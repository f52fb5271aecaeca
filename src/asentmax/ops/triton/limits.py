"""Limits of the Triton kernels that the code above them reads without importing triton (the backend's
BackendSupport in __init__.py) as well as the kernels themselves (attention_common.py)."""

MAX_QUERIES = 16  # the decoding kernels (attention_decode.py, attention_decode_short.py) take Nq <= 16
