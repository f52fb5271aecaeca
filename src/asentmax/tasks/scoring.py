"""Scoring a model on task examples: batches of equal shapes, and teacher-forced accuracy
(docs/method.md section 7: exact match on the target tokens and EOS).

`teacher_forced_accuracy` takes one forward pass per batch and scores the argmax next token at every
position the training loss covers (target tokens and EOS). Its exact match equals that of greedy
decoding (greedy decoding is right at every step iff every teacher-forced argmax is right), so training
validates with it. `asentmax.eval` decodes greedily with the KV cache and shares `shape_batches` with
this file; a tagging task (Task.tagging) has nothing to decode, so its test is `teacher_forced_counts` too.
Both autocast as asentmax/precision.py says.
"""

from __future__ import annotations

import torch

from asentmax.data import IGNORE_INDEX, collate
from asentmax.precision import autocast


def shape_batches(examples, key, max_batch: int, max_tokens: int):
    """Indices of `examples` grouped by `key` (equal prompt shapes), cut into batches of at most
    `max_batch` rows and about `max_tokens` tokens (key()[0] tokens per row)."""
    by_key: dict = {}
    for i, example in enumerate(examples):
        by_key.setdefault(key(example), []).append(i)
    for shape, indices in by_key.items():
        rows = max(1, min(max_batch, max_tokens // max(1, shape[0])))
        for start in range(0, len(indices), rows):
            yield indices[start:start + rows]


@torch.no_grad()
def teacher_forced_counts(model, task, examples, *, device, autocast_dtype=None, batch_size: int = 64,
                          max_batch_tokens: int = 32768, on_batch=None) -> tuple[list[int], int, int]:
    """(exact_by_sample: 1 for each example right at every scored position, 0 otherwise, in the order of
    `examples`; scored positions right; scored positions) of the argmax at every position the loss covers
    (Task.inputs_and_labels). `on_batch(n)` (optional) is called after each batch with the number of
    examples it held."""
    exact_by_sample, correct, total = [0] * len(examples), 0, 0
    key = lambda e: (len(e.source) + (1 if task.tagging else len(e.target) + 2),)  # ~ the input width
    for indices in shape_batches(examples, key, batch_size, max_batch_tokens):
        batch = collate(task, [examples[i] for i in indices]).to(device)
        with autocast(device, autocast_dtype):
            logits = model(batch.input_ids)
        scored = batch.labels != IGNORE_INDEX
        hits = (logits.argmax(-1) == batch.labels) & scored
        for i, right in zip(indices, (hits.sum(1) == scored.sum(1)).tolist(), strict=True):
            exact_by_sample[i] = int(right)
        correct += int(hits.sum())
        total += int(scored.sum())
        if on_batch is not None:
            on_batch(len(indices))
    return exact_by_sample, correct, total


def teacher_forced_accuracy(model, task, examples, **options) -> dict:
    """Exact match and per-token accuracy of the argmax at every scored position (target + EOS; a tagging
    task's labels); options as teacher_forced_counts."""
    exact_by_sample, correct, total = teacher_forced_counts(model, task, examples, **options)
    return {"exact_match": sum(exact_by_sample) / len(examples), "token_accuracy": correct / total}
