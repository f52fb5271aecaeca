"""Fixed evaluation sets (docs/method.md section 7: 1,000 test samples per length) and their JSONL form.

`make_eval_set(task, length, n, seed)` is deterministic: the examples depend only on the task
(and its constructor arguments, e.g. MQMTAR's layout), `length`, `n` and `seed`; the set for n is a
prefix of the set for n' > n. Each length draws from its own stream,
`numpy.random.default_rng([seed, length])`.

`eval_set_digest(examples)` fingerprints a set, so that two evaluations can tell they tested the same samples.

JSONL: one example per line, `{"source": [ids...], "target": [ids...]}`. numpy keeps a seeded
Generator's stream stable in practice but does not promise it across releases, so to compare results
exactly across machines share the JSONL files rather than the seed.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from asentmax.tasks.base import Example, Task
from asentmax.tasks.registry import get_task


def make_eval_set(task: Task | str, length: int, n: int, seed: int) -> list[Example]:
    """`n` examples of source length `length` (see Task.source_length), deterministic for `seed`."""
    if isinstance(task, str):
        task = get_task(task)
    if not isinstance(task, Task):
        raise ValueError(f"task must be a Task or a task name, got {type(task).__name__}")
    for label, value in (("n", n), ("seed", seed)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{label} must be a non-negative int, got {value!r}")
    task.check_length(length)
    rng = np.random.default_rng([int(seed), int(length)])
    return [task.sample(length, rng) for _ in range(n)]


def eval_set_digest(examples: list[Example]) -> str:
    """SHA-256 (hex) of the examples' token ids in order, each source and target with its length: equal
    digests mean the same test samples, whatever seed, tables or layout drew them (asentmax.paired)."""
    digest = hashlib.sha256()
    for example in examples:
        for ids in (example.source, example.target):
            digest.update(np.asarray([len(ids), *ids], dtype=np.int64).tobytes())
    return digest.hexdigest()


def save_jsonl(path: str | os.PathLike, examples: list[Example]) -> None:
    """Write examples one JSON object per line (written to a temp file, then renamed into place)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for example in examples:
            if not isinstance(example, Example):
                raise ValueError(f"save_jsonl expects Example objects, got {type(example).__name__}")
            f.write(json.dumps(example.to_dict(), separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def load_jsonl(path: str | os.PathLike) -> list[Example]:
    """Read examples written by `save_jsonl`; a malformed line raises ValueError naming the line."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                examples.append(Example.from_dict(json.loads(line)))
            except (json.JSONDecodeError, ValueError) as err:
                raise ValueError(f"{os.fspath(path)} line {number}: {err}") from None
    return examples
