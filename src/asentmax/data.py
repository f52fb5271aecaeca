"""Batching for the synthetic tasks (docs/method.md section 6): encode, pad, and draw length-bucketed batches.

A sequence is `<bos> source <sep> target <eos>`; the model reads tokens[:-1] and is scored on the
next token only where the task's target_mask is True (target tokens and EOS), so the loss is taken on
target tokens only. Batches are padded on the right with PAD; with causal attention a right pad is
never visible to a real token, so training needs no attention mask.

Training batches are a pure function of (seed, rank, step): every step draws from its own
`numpy.random.Generator` seeded with that triple. A run is therefore reproducible, resumes exactly at
any step without saving sampler state, and each data-parallel rank reads its own shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100
PAD_ID = 0


@dataclass
class Batch:
    """input_ids (B, T) long; labels (B, T) long with IGNORE_INDEX where no loss is taken."""

    input_ids: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """On `device`; with non_blocking (from pinned memory) the host does not wait for the copy."""
        return Batch(self.input_ids.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """In page-locked host memory, so that `to(cuda, non_blocking=True)` is asynchronous."""
        return Batch(self.input_ids.pin_memory(), self.labels.pin_memory())

    @property
    def n_target_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def n_tokens(self) -> int:
        return int((self.input_ids != PAD_ID).sum())


def collate(task, examples) -> Batch:
    """Encode `examples` with `task.encode` and pad them into one next-token-prediction batch."""
    if not examples:
        raise ValueError("collate needs at least one example")
    encoded = [task.encode(example) for example in examples]
    width = max(len(tokens) for tokens, _ in encoded) - 1
    input_ids = torch.full((len(encoded), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(encoded), width), IGNORE_INDEX, dtype=torch.long)
    for row, (tokens, target_mask) in enumerate(encoded):
        if len(tokens) != len(target_mask):
            raise ValueError(f"task {task.name!r}: {len(tokens)} tokens but {len(target_mask)} mask entries")
        n = len(tokens) - 1
        tokens_t = torch.tensor(tokens, dtype=torch.long)
        scored = torch.tensor(target_mask[:-1], dtype=torch.bool)
        input_ids[row, :n] = tokens_t[:-1]
        labels[row, :n] = torch.where(scored, tokens_t[1:], torch.full_like(tokens_t[1:], IGNORE_INDEX))
    return Batch(input_ids, labels)


def length_buckets(min_length: int, max_length: int, n_buckets: int) -> list[tuple[int, int]]:
    """Split [min_length, max_length] into at most n_buckets contiguous inclusive ranges of equal-ish size."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    edges = np.linspace(min_length, max_length + 1, min(n_buckets, max_length - min_length + 1) + 1)
    edges = np.round(edges).astype(int)
    return [(int(lo), int(hi) - 1) for lo, hi in zip(edges[:-1], edges[1:], strict=False) if hi > lo]


def step_generator(seed: int, rank: int, step: int) -> np.random.Generator:
    """The generator that draws the batch of `step` on `rank` (independent streams per triple)."""
    return np.random.default_rng([seed, rank, step])


def sample_lengths(rng: np.random.Generator, batch_size: int, buckets: list[tuple[int, int]]) -> np.ndarray:
    """Lengths for one batch: a bucket is picked with probability proportional to its size (so lengths are
    uniform over the whole range across batches) and every length of the batch is uniform inside it."""
    lo, hi = buckets[pick_bucket(rng, buckets)]
    return rng.integers(lo, hi + 1, size=batch_size)


def pick_bucket(rng: np.random.Generator, buckets: list[tuple[int, int]]) -> int:
    """Index of the bucket of one batch, drawn with probability proportional to the bucket's size."""
    sizes = np.array([hi - lo + 1 for lo, hi in buckets], dtype=float)
    return int(rng.choice(len(buckets), p=sizes / sizes.sum()))


def training_batch(task, *, seed: int, rank: int, step: int, batch_size: int,
                   buckets: list[tuple[int, int]]) -> Batch:
    """The (deterministic) training batch of `step` for data-parallel `rank`."""
    rng = step_generator(seed, rank, step)
    lengths = sample_lengths(rng, batch_size, buckets)
    return collate(task, [task.sample(int(length), rng) for length in lengths])
