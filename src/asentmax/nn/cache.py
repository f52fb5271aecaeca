"""KV cache for incremental decoding: per-layer keys/values plus the bookkeeping that keeps n_i right.

Slots are appended in order. `key_mask` (B, S) marks real tokens (None while every slot is real) and
`n_real` (B,) counts the real tokens of each row, so a new token sits at position n_real and sees
n_i = n_real + 1 keys (arXiv:2506.16640, section 2: cache length + 1 when nothing is padded).
Keys are stored after RoPE, so cached keys never need re-rotation.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self):
        self.keys: list[torch.Tensor] = []  # per layer, (B, Hkv, S, D)
        self.values: list[torch.Tensor] = []
        self.key_mask: torch.Tensor | None = None  # (B, S) bool, None = all real
        self.n_real: torch.Tensor | None = None  # (B,) long, None while empty
        # True when key_mask was checked contiguous (ALiBi) and each row's last slot is real or the row empty:
        # appending real tokens keeps it contiguous, so a decoding step needs no check (a host sync)
        self.contiguous_to_end = False

    @property
    def length(self) -> int:
        """Number of cached slots S (real and padding)."""
        return 0 if not self.keys else self.keys[0].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new keys/values (B, Hkv, T, D) of `layer`; return all of that layer's keys/values."""
        if layer == len(self.keys):  # contiguous, as torch.cat returns later: one layout for every step
            self.keys.append(k.contiguous())  # (a compiled decoding step is specialised on the strides)
            self.values.append(v.contiguous())
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def commit(self, key_mask: torch.Tensor | None, n_real: torch.Tensor, contiguous_to_end: bool = False):
        """Record the mask of all slots (after this step's tokens), the real-token counts and whether the
        mask is known to be contiguous up to each row's last slot."""
        self.key_mask = key_mask
        self.n_real = n_real
        self.contiguous_to_end = contiguous_to_end
