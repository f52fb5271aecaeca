"""Each task's answers checked against an independent solver written here (PAPER.md section 3)."""

import numpy as np
import pytest

from asentmax.tasks import FIRST_SYMBOL, get_task

LENGTHS = [1, 2, 17, 63, 64, 111, 130, 4096]


def draw(name, lengths=LENGTHS, per_length=4, seed=0, **kwargs):
    task = get_task(name, **kwargs)
    rng = np.random.default_rng(seed)
    return task, [task.sample(n, rng) for n in lengths if n >= task.min_length for _ in range(per_length)]


@pytest.mark.parametrize("n_symbols", [32, 5])
def test_copy_reverse_sort(n_symbols):
    for name, solve in (("copy", list), ("reverse", lambda s: s[::-1]), ("sort", sorted)):
        task, examples = draw(name, n_symbols=n_symbols)
        assert task.vocab_size == FIRST_SYMBOL + n_symbols
        seen = set()
        for example in examples:
            assert example.target == solve(example.source)
            seen.update(example.source)
        assert seen == set(range(FIRST_SYMBOL, FIRST_SYMBOL + n_symbols))  # every symbol is used
