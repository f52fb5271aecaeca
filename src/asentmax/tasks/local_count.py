"""Local count (docs/method.md section 6): for every position, the 0-based count of that position within
the current run of equal symbols.

Vocabulary (fixed): 4 specials, `n_symbols` (16) input symbols named s0.., then `max_run` (48)
count tokens named c0..c{max_run-1}. Source: exactly `length` symbols made of runs whose lengths
are uniform in [min_run, max_run] = [2, 48], each run's symbol uniform among those different from the
previous run's symbol (so neighbouring runs never merge); the last run is cut at `length`. The defaults
are the paper code's (scripts/generate_data.py `LocalCount`; its configs read `10M-tr-64-128_V-16_reps-48`,
its README runs `--vocab_size 16 --max_reps 48`), which draws whole runs and so lets a sample's length
vary around the one asked for; the code trains at lengths 64-128 (`--seq_len 96 --vary_len 32`):
`asentmax train --task local_count --min-length 64 --max-length 128`.
Target: `length` count tokens, target[i] = c_k with k = the number of positions before i in the run
that contains i. Counts never exceed max_run - 1, so the vocabulary is the same at every length.
A tagging task (Task.tagging), as the paper's code trains it (synthetic/configs/data/local_count.yaml:
token classification): the model reads `<bos> source` and predicts target[i] at source token i.

Example: `s1 s1 s0 s0 s0 s3 s3` -> `c0 c1 c0 c1 c2 c0 c1`.
"""

from __future__ import annotations

import numpy as np

from asentmax.tasks.base import FIRST_SYMBOL, Task


class LocalCountTask(Task):
    name = "local_count"
    train_preset = {"lr": 1e-3, "steps": 5000}  # no model preset: the paper gives none
    tagging = True  # the paper's code trains it as token classification (TokenClassificationFromFiles)
    min_length = 1

    def __init__(self, n_symbols: int = 16, min_run: int = 2, max_run: int = 48):
        if not isinstance(n_symbols, int) or n_symbols < 2:
            raise ValueError(f"task 'local_count': n_symbols must be an int >= 2, got {n_symbols!r}")
        if not (isinstance(min_run, int) and isinstance(max_run, int) and 1 <= min_run <= max_run):
            raise ValueError(
                f"task 'local_count': need ints 1 <= min_run <= max_run, got {min_run!r}, {max_run!r}"
            )
        super().__init__([f"s{i}" for i in range(n_symbols)] + [f"c{k}" for k in range(max_run)])
        self.n_symbols, self.min_run, self.max_run = n_symbols, min_run, max_run
        self.first_count = FIRST_SYMBOL + n_symbols

    def _generate(self, length, rng):
        n_runs = length // self.min_run + 1  # enough runs to cover `length` even if all are shortest
        run_lengths = rng.integers(self.min_run, self.max_run + 1, size=n_runs)
        # symbol of run j = previous symbol + a nonzero shift (mod n_symbols): never equal to it
        shifts = rng.integers(1, self.n_symbols, size=n_runs)
        shifts[0] = rng.integers(self.n_symbols)
        symbols = np.cumsum(shifts) % self.n_symbols
        run_of_position = np.repeat(np.arange(n_runs), run_lengths)[:length]
        run_starts = np.concatenate([[0], np.cumsum(run_lengths)[:-1]])
        counts = np.arange(length) - run_starts[run_of_position]
        return FIRST_SYMBOL + symbols[run_of_position], self.first_count + counts
