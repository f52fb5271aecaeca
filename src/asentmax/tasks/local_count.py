"""Local count (PAPER.md section 3): for every position, the 0-based count of that position within
the current run of equal symbols.

Vocabulary (fixed): 4 specials, `n_symbols` (4) input symbols named s0.., then `max_count` (32)
count tokens named c0..c{max_count-1}. Source: `length` symbols drawn uniformly with replacement.
Target: `length` count tokens, target[i] = c_k with k = the number of positions j < i in the run
that contains i. Counts saturate: a count >= max_count - 1 is written as c{max_count-1}, which keeps
the vocabulary fixed at every length (with 4 uniform symbols a run of 32 has probability about
4^-31 per position, so the cap is effectively never reached; lower n_symbols or max_count to test it).

Example: `s1 s1 s0 s0 s0 s3` -> `c0 c1 c0 c1 c2 c0`.
"""

from __future__ import annotations

import numpy as np

from asentmax.tasks.base import FIRST_SYMBOL, Task


class LocalCountTask(Task):
    name = "local_count"
    min_length = 1

    def __init__(self, n_symbols: int = 4, max_count: int = 32):
        if not isinstance(n_symbols, int) or n_symbols < 2:
            raise ValueError(f"task 'local_count': n_symbols must be an int >= 2, got {n_symbols!r}")
        if not isinstance(max_count, int) or max_count < 2:
            raise ValueError(f"task 'local_count': max_count must be an int >= 2, got {max_count!r}")
        super().__init__([f"s{i}" for i in range(n_symbols)] + [f"c{k}" for k in range(max_count)])
        self.n_symbols, self.max_count = n_symbols, max_count
        self.first_count = FIRST_SYMBOL + n_symbols

    def _generate(self, length, rng):
        source = rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + self.n_symbols, size=length)
        position = np.arange(length)
        run_starts = np.ones(length, dtype=bool)
        run_starts[1:] = source[1:] != source[:-1]
        run_start = np.maximum.accumulate(np.where(run_starts, position, 0))
        counts = np.minimum(position - run_start, self.max_count - 1)
        return source, self.first_count + counts
