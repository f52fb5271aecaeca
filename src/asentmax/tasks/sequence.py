"""Copy, Reverse and Sort (docs/method.md section 6): a random sequence over 32 symbols; the target is the
same sequence, the sequence reversed, or the sequence sorted (ascending symbol id).

Source: `length` symbols drawn uniformly with replacement. Target: `length` symbols.
Vocabulary: 4 specials + `n_symbols` (default 32) symbols named s0, s1, ...
"""

from __future__ import annotations

import numpy as np

from asentmax.nn.presets import copy_model, reverse_model, sort_model
from asentmax.tasks.base import FIRST_SYMBOL, Task


class RandomSequenceTask(Task):
    """Shared generator of copy / reverse / sort; subclasses define `transform`."""

    min_length = 1

    def __init__(self, n_symbols: int = 32):
        if not isinstance(n_symbols, int) or n_symbols < 2:
            raise ValueError(f"task {self.name!r}: n_symbols must be an int >= 2, got {n_symbols!r}")
        super().__init__([f"s{i}" for i in range(n_symbols)])
        self.n_symbols = n_symbols

    def _generate(self, length, rng):
        source = rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + self.n_symbols, size=length)
        return source, self.transform(source)

    def transform(self, source: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class CopyTask(RandomSequenceTask):
    """Target = the source unchanged."""

    name = "copy"
    # the paper's lr and batch 128 (arXiv:2506.16640, section 4) with the paper code's cosine to 0 after a 5 %
    # warm-up, on 80,000 steps = 10.2M samples, and seed 1: with the model preset's blocks, the thirty-fourth
    # session's run (results/paper/copy.md: ASEntmax 95.3 / 69.7 % at 32x / 64x; 92.7 / 70.0 with 40,000
    # steps, 64.0 / 9.7 at batch 512 with 3.1M samples and our blocks); 7.5 min alone on one H100
    train_preset = {"lr": 1e-3, "steps": 80000, "warmup_steps": 4000, "min_lr_ratio": 0.0, "batch_size": 128,
                    "seed": 1, "val_every": 2000, "checkpoint_every": 2000}
    model_preset = staticmethod(copy_model)
    eval_multipliers = (1, 2, 4, 8, 16, 32, 64)

    def transform(self, source):
        return source

    def answer_sources(self, example):
        return list(range(len(example.target)))


class ReverseTask(RandomSequenceTask):
    """Target = the source reversed."""

    name = "reverse"
    # the paper's lr and batch 128 (arXiv:2506.16640, section 4) with the paper code's cosine to 0 after a 5 %
    # warm-up, on 40,000 steps = 5.1M samples (since the twelfth session), and seed 1: with the model
    # preset's blocks, the twenty-ninth and thirtieth sessions' runs (results/paper/reverse.md: ASEntmax
    # 98.3 / 91.0 % at 4x / 8x, the paper's row; 78.3 / 2.3 in our default blocks, where softmax gave the
    # paper's 0 % at 2x); 5-7 min on one H200
    train_preset = {"lr": 4e-4, "steps": 40000, "warmup_steps": 2000, "min_lr_ratio": 0.0, "batch_size": 128,
                    "seed": 1, "val_every": 2000, "checkpoint_every": 2000}
    model_preset = staticmethod(reverse_model)
    eval_multipliers = (1, 1.5, 2, 4, 8)

    def transform(self, source):
        return source[::-1]

    def answer_sources(self, example):
        return list(range(len(example.source) - 1, -1, -1))


class SortTask(RandomSequenceTask):
    """Target = the source sorted by symbol id (ascending, duplicates kept)."""

    name = "sort"
    # Reverse's recipe (the paper's lr, batch 128, cosine to 0 after a 5 % warm-up, seed 1) on 120,000 steps =
    # 15.4M samples: with the model preset's blocks, the thirty-fourth session's run (results/paper/sort.md:
    # ASEntmax 100 / 93.0 % at 2x / 4x, the paper's 100 / 79.7; 47.0 and 58.3 % at 4x with 40,000 and 80,000
    # steps, 0 in our blocks); 13 min alone on one H100
    train_preset = {"lr": 4e-4, "steps": 120000, "warmup_steps": 6000, "min_lr_ratio": 0.0, "batch_size": 128,
                    "seed": 1, "val_every": 4000, "checkpoint_every": 2000}
    model_preset = staticmethod(sort_model)
    eval_multipliers = (1, 2, 4, 8)

    def transform(self, source):
        return np.sort(source)
