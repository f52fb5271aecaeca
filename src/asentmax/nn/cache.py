"""KV cache for incremental decoding: per-layer keys/values plus the bookkeeping that keeps n_i right.

Slots are appended in order. `key_mask` (B, S) marks real tokens (None while every slot is real) and
`n_real` (B,) counts the real tokens of each row, so a new token sits at position n_real and sees
n_i = n_real + 1 keys (arXiv:2506.16640, section 2: cache length + 1 when nothing is padded).
Keys are stored after RoPE, so cached keys never need re-rotation.

Each layer's keys and values live in a buffer with room for more slots than are filled: a step writes its
new slots in place and attends to a view of the filled ones (B, Hkv, S, D), so the cost of a step does not
grow with the cache (concatenating copied the whole cache at every step: O(S) memory traffic per token,
twice attention's own read of it). `capacity` is the number of slots to reserve at the first step
(generate() passes the prompt and the new tokens it feeds back, so its buffers never grow); beyond it a
buffer grows by an eighth: filled one token at a time to S slots, a cache copies about 9 S slots in all
(concatenating: S^2 / 2) and holds at most an eighth and ROOM_MULTIPLE slots more than it needs. Buffers
hold a multiple of ROOM_MULTIPLE slots, so that prompts of nearby lengths give a compiled decoding step the
same buffer shape (no recompilation), and always keep a free slot, so that the filled slots keep one
(non-contiguous) layout at every step.

A static cache (`static=True`, with a capacity) never grows, and after its first call (the prompt) keeps
every shape fixed and every count on the device: a step writes its slots at the filled count read on the
device, attends over the whole buffers with `kv_lengths` (entmax_attention: the filled slots of each row),
and updates its counts in place. Nothing in a step depends on a host value, so a step can be recorded as
a CUDA graph and replayed (generate(cuda_graph=True)).
"""

from __future__ import annotations

import torch

ROOM_MULTIPLE = 64  # a buffer's slots are a multiple of this


def room_for(slots: int) -> int:
    """`slots` rounded up to a multiple of ROOM_MULTIPLE."""
    return -(-slots // ROOM_MULTIPLE) * ROOM_MULTIPLE


def grown_room(filled: int) -> int:
    """Slots of a buffer grown to hold `filled`: an eighth more, and at least one more."""
    return room_for(filled + filled // 8 + 1)


class KVCache:
    def __init__(self, capacity: int | None = None, static: bool = False):
        if capacity is not None and (type(capacity) is not int or capacity < 1):
            raise ValueError(f"capacity must be None or an int >= 1 (slots to reserve), got {capacity!r}")
        if type(static) is not bool:
            raise ValueError(f"static must be a bool, got {static!r}")
        if static and capacity is None:
            raise ValueError("a static cache needs a capacity (it never grows)")
        self.capacity = capacity
        self.static = static
        self.keys: list[torch.Tensor] = []  # per layer, the filled slots (B, Hkv, S, D): views of _buffers
        self.values: list[torch.Tensor] = []
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer, (B, Hkv, room, D) each
        self.key_mask: torch.Tensor | None = None  # (B, S) bool, None = all real
        self.n_real: torch.Tensor | None = None  # (B,) long, None while empty
        # True when key_mask was checked contiguous (ALiBi) and each row's last slot is real or the row empty:
        # appending real tokens keeps it contiguous, so a decoding step needs no check (a host sync)
        self.contiguous_to_end = False
        # static cache after its first call: the filled slots of each row, (B,) int32 on the device (every row
        # the same count), which attention reads as kv_lengths; the slots this step writes, (T,) long
        self.kv_lengths: torch.Tensor | None = None
        self.step_slots: torch.Tensor | None = None
        self._slots_taken = 0  # static steps: the host's count of filled slots

    @property
    def holds_prompt(self) -> bool:
        """True for a static cache that holds its prompt: its next call is a step
        (Transformer._static_step_context)."""
        return self.static and self.length > 0

    @property
    def steps_in_place(self) -> bool:
        """True for a static cache past its first call: steps then attend over whole buffers with
        kv_lengths."""
        return self.kv_lengths is not None

    @property
    def room(self) -> int:
        """Slots of each buffer (0 while empty)."""
        return 0 if not self._buffers else self._buffers[0][0].shape[2]

    @property
    def length(self) -> int:
        """Number of cached slots S (real and padding); a static cache's steps count on the device only
        (kv_lengths), so there: the slots of its first call."""
        return 0 if not self.keys else self.keys[0].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new keys/values (B, Hkv, T, D) of `layer`; return all of that layer's keys/values
        (views of its buffers, with the buffers' strides), or in a static cache's steps the whole buffers
        (the slots past kv_lengths are not filled)."""
        if self.steps_in_place:
            key_buffer, value_buffer = self._buffers[layer]
            key_buffer.index_copy_(2, self.step_slots, k)
            value_buffer.index_copy_(2, self.step_slots, v)
            return key_buffer, value_buffer
        if layer == len(self.keys):
            filled, end = 0, k.shape[2]
            reserved = self.capacity is not None and self.capacity >= end
            if self.static and not reserved:
                raise ValueError(f"a static cache of capacity {self.capacity} cannot hold {end} slots")
            room = room_for(self.capacity + 1) if reserved else grown_room(end)
            self._buffers.append((k.new_empty(*k.shape[:2], room, k.shape[3]),
                                  v.new_empty(*v.shape[:2], room, v.shape[3])))
            self.keys.append(k)  # placeholders: the views of the buffers replace them below
            self.values.append(v)
        else:
            filled = self.keys[layer].shape[2]
            end = filled + k.shape[2]
        key_buffer, value_buffer = self._buffers[layer]
        if end >= key_buffer.shape[2]:  # a full buffer's filled slots would be contiguous: keep one free
            room = grown_room(end)
            key_buffer, value_buffer = (self._grown(key_buffer, filled, room),
                                        self._grown(value_buffer, filled, room))
            self._buffers[layer] = key_buffer, value_buffer
        key_buffer[:, :, filled:end] = k
        value_buffer[:, :, filled:end] = v
        self.keys[layer], self.values[layer] = key_buffer[:, :, :end], value_buffer[:, :, :end]
        return self.keys[layer], self.values[layer]

    @staticmethod
    def _grown(buffer: torch.Tensor, filled: int, room: int) -> torch.Tensor:
        """A buffer of `room` slots holding the first `filled` slots of `buffer`."""
        grown = buffer.new_empty(*buffer.shape[:2], room, buffer.shape[3])
        grown[:, :, :filled] = buffer[:, :, :filled]
        return grown

    def commit(self, key_mask: torch.Tensor | None, n_real: torch.Tensor, contiguous_to_end: bool = False):
        """Record the mask of all slots (after this step's tokens), the real-token counts and whether the
        mask is known to be contiguous up to each row's last slot."""
        self.key_mask = key_mask
        self.n_real = n_real
        self.contiguous_to_end = contiguous_to_end

    def begin_steps(self):
        """A static cache's first step, before its layers run (host work, once): the device counts of the
        prompt's slots and, where the prompt is padded, a mask of every slot (the free ones marked real: no
        step reads them before it fills them)."""
        filled, room = self.length, self.room
        batch, device = self.n_real.shape[0], self.n_real.device
        self.kv_lengths = torch.full((batch,), filled, dtype=torch.int32, device=device)
        if self.key_mask is not None:
            mask = torch.ones(batch, room, dtype=torch.bool, device=device)
            mask[:, :filled] = self.key_mask
            self.key_mask = mask
        self._slots_taken = filled

    def advance(self, n_new: int):
        """A static cache's step of n_new real tokens, before its layers run: the slots they fill, and the
        counts moved past them, in place on the device. An eager step counts the slots on the host too and
        refuses to overflow the buffers (a compiled step or a replayed CUDA graph does not: its caller
        reserves them, as generate() does)."""
        if not torch.compiler.is_compiling():  # a compiled step keeps no host count (a guard per value)
            self._slots_taken += n_new
            if self._slots_taken > self.room:
                raise ValueError(f"a static cache of {self.room} slots (capacity {self.capacity}) cannot "
                                 f"hold {self._slots_taken}")
        self.step_slots = self.kv_lengths[:1].long() + torch.arange(n_new, device=self.kv_lengths.device)
        self.kv_lengths.add_(n_new)
        self.n_real.add_(n_new)
        if self.key_mask is not None:
            self.key_mask.index_fill_(1, self.step_slots, True)
