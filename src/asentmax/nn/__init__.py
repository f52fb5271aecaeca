"""Models: decoder-only Transformers with the attention normalisers of nn/normalisers.py (softmax, SSMax,
Top-K, entmax, ASEntmax) and NoPE / ALiBi / RoPE / NAPE positions (arXiv:2506.16640, section 2), KV-cache
decoding and attention statistics."""

from asentmax.nn.cache import KVCache
from asentmax.nn.config import ModelConfig
from asentmax.nn.model import Transformer
from asentmax.nn.presets import copy_model, lm_25m, lm_120m, lm_tiny, mqmtar_model, reverse_model, sort_model
from asentmax.nn.stats import AttentionStats, summarise_stats

__all__ = [
    "ModelConfig",
    "Transformer",
    "KVCache",
    "AttentionStats",
    "summarise_stats",
    "mqmtar_model",
    "copy_model",
    "reverse_model",
    "sort_model",
    "lm_tiny",
    "lm_25m",
    "lm_120m",
]
