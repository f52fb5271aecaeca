"""Flip-flop language (docs/method.md section 6; Liu et al. 2023, "Exposing Attention Glitches with
Flip-Flop Language Modeling"): remember the last written bit across ignored and read instructions.

Vocabulary (fixed, 9 ids): 4 specials, then `w`=4 (write), `i`=5 (ignore), `r`=6 (read),
`0`=7, `1`=8.

Source (exactly `length` tokens, minimum 3): m = (length - 1) // 2 pairs (instruction, bit), then
a final lone `r` (the query). The first pair is always a write; each later instruction is write with
probability p_write, read with probability p_read, ignore otherwise; bits are uniform. The defaults
are the paper's variant as its code trains it (scripts/generate_data.py `FlipFlop`; the data directory
of synthetic/configs/data/flip_flop.yaml is `10M_wprob-0_1`, though the code's README shows
`--write_prob 0.8`): write / ignore pairs with p_write = 0.1, then the read. p_read > 0 adds reads inside
the sequence as in Liu et al.'s language, each followed by the correct (stored) bit. When
`length` is even, one extra uniform noise bit (no instruction, never read) precedes the pairs, so that
every length is exact. Target: one bit, the last written bit at the final `r`.

Examples: length 7 `w 1 i 0 w 0 r` -> `0`; length 8 (p_read > 0) `0 w 1 i 0 r 1 r` -> `1`.
"""

from __future__ import annotations

import numpy as np

from asentmax.tasks.base import FIRST_SYMBOL, Task

WRITE, IGNORE, READ = FIRST_SYMBOL, FIRST_SYMBOL + 1, FIRST_SYMBOL + 2
BIT0 = FIRST_SYMBOL + 3  # bit b is BIT0 + b


class FlipFlopTask(Task):
    name = "flipflop"
    train_preset = {"lr": 1e-3, "steps": 5000}  # no model preset: the paper gives none
    min_length = 3

    def __init__(self, p_write: float = 0.1, p_read: float = 0.0):
        ok = all(isinstance(p, (int, float)) and 0 <= p <= 1 for p in (p_write, p_read))
        if not ok or p_write + p_read > 1:
            raise ValueError(
                f"task 'flipflop': p_write, p_read must be >= 0 with sum <= 1, got {p_write}, {p_read}"
            )
        super().__init__(["w", "i", "r", "0", "1"])
        self.p_write, self.p_read = float(p_write), float(p_read)

    def _generate(self, length, rng):
        n_pairs = (length - 1) // 2
        probs = [self.p_write, 1.0 - self.p_write - self.p_read, self.p_read]
        instructions = rng.choice(np.array([WRITE, IGNORE, READ]), size=n_pairs, p=probs)
        instructions[0] = WRITE
        bits = rng.integers(2, size=n_pairs)
        # index of the latest write at or before each pair (the first pair is a write)
        position = np.arange(n_pairs)
        last_write = np.maximum.accumulate(np.where(instructions == WRITE, position, 0))
        reads = instructions == READ
        bits[reads] = bits[last_write[reads]]
        answer = bits[last_write[-1]]

        pairs = np.stack([instructions, BIT0 + bits], axis=1).reshape(-1)
        noise = BIT0 + rng.integers(2, size=length - 1 - 2 * n_pairs)
        source = np.concatenate([noise, pairs, [READ]])
        return source, np.array([BIT0 + answer])
