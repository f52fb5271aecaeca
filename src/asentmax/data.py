"""Batching for the synthetic tasks (docs/method.md section 6): encode, pad, and draw length-bucketed batches.

A sequence is `<bos> source <sep> target <eos>`; the model reads tokens[:-1] and is scored on the
next token only where the task's target_mask is True (target tokens and EOS), so the loss is taken on
target tokens only (a tagging task's `<bos> source` is scored at each source token on its label:
Task.inputs_and_labels). Batches are padded on the right with PAD; with causal attention a right pad is
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
    def n_tokens(self) -> int:
        return int((self.input_ids != PAD_ID).sum())


def collate(task, examples) -> Batch:
    """Lay `examples` out with `task.inputs_and_labels` (model inputs, the label of each input position) and
    pad them on the right into one batch."""
    if not examples:
        raise ValueError("collate needs at least one example")
    laid_out = [task.inputs_and_labels(example) for example in examples]
    width = max(len(inputs) for inputs, _ in laid_out)
    input_ids = torch.full((len(laid_out), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(laid_out), width), IGNORE_INDEX, dtype=torch.long)
    for row, (inputs, row_labels) in enumerate(laid_out):
        input_ids[row, :len(inputs)] = torch.tensor(inputs, dtype=torch.long)
        labels[row, :len(inputs)] = torch.tensor(row_labels, dtype=torch.long)
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
