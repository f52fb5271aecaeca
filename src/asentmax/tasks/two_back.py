"""2-back (docs/method.md section 6): for every position, the token two steps earlier.

Vocabulary (fixed): 4 specials, NONE=4 (named `-`), then `n_symbols` (15) symbols named s0..
Source: `length` symbols drawn uniformly with replacement. Target: `length` tokens,
target[i] = source[i - 2] for i >= 2 and NONE for the first two positions (nothing two steps
earlier); NONE never occurs in the source. The default is the paper code's 16-token vocabulary
(scripts/generate_data.py `NBack`; its configs read `n2_v16_tr-32-64_t-64-4096`: 15 symbols and
the 0 its targets start with); the code also puts a 0 before each source, which this task does not.
A tagging task (Task.tagging), as the paper's code trains it (synthetic/configs/data/nback.yaml: token
classification): the model reads `<bos> source` and predicts target[i] at source token i.

Example: `s3 s1 s4 s1` -> `- - s3 s1`.
"""

from __future__ import annotations

import numpy as np

from asentmax.tasks.base import FIRST_SYMBOL, Task

NONE = FIRST_SYMBOL


class TwoBackTask(Task):
    name = "two_back"
    train_preset = {"lr": 1e-3, "steps": 5000}  # no model preset: the paper gives none
    tagging = True  # the paper's code trains it as token classification (TokenClassificationFromFiles)
    eval_multipliers = (1, 2, 4, 8, 16, 32, 64)  # its code's test sets: lengths 64-4096 for training at 32-64
    min_length = 1

    def __init__(self, n_symbols: int = 15):
        if not isinstance(n_symbols, int) or n_symbols < 2:
            raise ValueError(f"task 'two_back': n_symbols must be an int >= 2, got {n_symbols!r}")
        super().__init__(["-"] + [f"s{i}" for i in range(n_symbols)])
        self.n_symbols = n_symbols

    def _generate(self, length, rng):
        source = rng.integers(NONE + 1, NONE + 1 + self.n_symbols, size=length)
        target = np.concatenate([np.full(min(2, length), NONE), source[:-2]])
        return source, target
