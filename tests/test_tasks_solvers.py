"""Each task's answers checked against an independent solver written here (docs/method.md section 6)."""

from fractions import Fraction

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


def test_mqmtar_table():
    task = get_task("mqmtar")
    assert task.vocab_size == 4 + 3 + 256
    for table in (task.keys, task.values):
        words = {tuple(w) for w in table.tolist()}
        assert len(words) == 10_000  # distinct 2-symbol words
        assert table.min() >= FIRST_SYMBOL + 3 and table.max() < task.vocab_size
    assert (get_task("mqmtar").keys == task.keys).all()  # the table is fixed by its seed
    assert not (get_task("mqmtar", table_seed=1).keys == task.keys).all()


def parse_mqmtar(source, length, n_queries):
    """Independent reading of an MQMTAR source: returns (pairs dict, number of blanks, query keys)."""
    blank, colon, query = FIRST_SYMBOL, FIRST_SYMBOL + 1, FIRST_SYMBOL + 2
    context, tail = source[:length], source[length:]
    pairs, blanks, i = {}, 0, 0
    while i < length:
        if context[i] == blank:
            blanks, i = blanks + 1, i + 1
            continue
        k1, k2, sep, v1, v2 = context[i : i + 5]
        assert sep == colon and blank not in (k1, k2, v1, v2) and colon not in (k1, k2, v1, v2)
        assert (k1, k2) not in pairs  # keys are distinct
        assert i + 5 < length and context[i + 5] == blank  # every pair is followed by a blank
        pairs[(k1, k2)] = (v1, v2)
        i += 6
        blanks += 1
    assert len(tail) == 3 * n_queries
    queries = [tuple(tail[j : j + 3]) for j in range(0, len(tail), 3)]
    assert all(q[0] == query for q in queries)
    return pairs, blanks, [q[1:] for q in queries]


@pytest.mark.parametrize("n_queries", [4, 1, 7])
def test_mqmtar_answers(n_queries):
    lengths = [6, 7, 8, 14, 15, 16, 29, 30, 32, 63, 64, 111, 130, 4096]
    task, examples = draw("mqmtar", lengths=lengths, per_length=3, n_queries=n_queries)
    key_table, value_table = set(map(tuple, task.keys.tolist())), set(map(tuple, task.values.tolist()))
    for length, example in zip([n for n in lengths for _ in range(3)], examples, strict=True):
        assert len(example.source) == length + 3 * n_queries
        pairs, blanks, asked = parse_mqmtar(example.source, length, n_queries)
        expected_pairs = max(1, int(Fraction(4, 5) * length / 6))  # floor(0.8 L / 6)
        assert len(pairs) == expected_pairs and blanks == length - 5 * expected_pairs
        assert set(pairs) <= key_table and set(pairs.values()) <= value_table  # words from the tables
        assert len(set(pairs.values())) == len(pairs)  # values are distinct too
        expected = [tok for key in asked for tok in (FIRST_SYMBOL + 2, *pairs[key])]
        assert example.target == expected


def test_mqmtar_pairing_is_per_sample():
    """Keys and values are paired afresh in every sample, so the answer is not in a fixed table."""
    task = get_task("mqmtar", table_size=50)
    rng = np.random.default_rng(3)
    values_of = {}
    for _ in range(200):
        pairs, _, _ = parse_mqmtar(task.sample(64, rng).source, 64, 4)
        for key, value in pairs.items():
            values_of.setdefault(key, set()).add(value)
    assert len(values_of) == 50 and all(len(v) > 3 for v in values_of.values())
    assert len(set().union(*values_of.values())) == 50  # every value of the table gets used


def test_mqmtar_positions_are_spread():
    """Pairs are scattered: over many samples every context position but the last (always the blank
    after a pair or a background blank) is sometimes covered by a pair."""
    task = get_task("mqmtar")
    rng = np.random.default_rng(5)
    covered = np.zeros(64, dtype=int)
    first_pair_start = []
    for _ in range(300):
        context = np.array(task.sample(64, rng).source[:64])
        covered += context != FIRST_SYMBOL
        first_pair_start.append(int(np.argmax(context != FIRST_SYMBOL)))
    assert (covered[:-1] > 0).all() and covered[-1] == 0
    assert len(set(first_pair_start)) > 5


def test_mqmtar_pair_cap():
    task = get_task("mqmtar", table_size=20)
    example = task.sample(1000, np.random.default_rng(0))  # floor(0.8 * 1000 / 6) = 133 > 20
    pairs, blanks, _ = parse_mqmtar(example.source, 1000, 4)
    assert len(pairs) == 20 and blanks == 1000 - 100


def simulate_flipflop(source):
    """Run the flip-flop machine on a source; checks the format and returns the final read value."""
    w, i, r, b0, b1 = range(FIRST_SYMBOL, FIRST_SYMBOL + 5)
    if len(source) % 2 == 0:  # a leading noise bit
        assert source[0] in (b0, b1)
        source = source[1:]
    assert source[-1] == r and source[0] == w
    memory = None
    for instruction, bit in zip(source[:-1:2], source[1:-1:2], strict=True):
        assert bit in (b0, b1) and instruction in (w, i, r)
        if instruction == w:
            memory = bit
        elif instruction == r:
            assert bit == memory  # a read inside the sequence shows the stored bit
    return memory


@pytest.mark.parametrize("p_read", [0.0, 0.1])
def test_flipflop_answers(p_read):
    lengths = [3, 4, 5, 6, 17, 63, 64, 111, 130, 4096]
    task, examples = draw("flipflop", lengths=lengths, per_length=20, p_read=p_read)
    n_reads = 0
    for example in examples:
        assert example.target == [simulate_flipflop(example.source)]
        n_reads += example.source[:-1].count(FIRST_SYMBOL + 2)
    assert (n_reads > 0) == (p_read > 0)  # the default (paper) variant reads only at the end
    answers = [e.target[0] for e in examples]
    assert 0.3 < answers.count(FIRST_SYMBOL + 3) / len(answers) < 0.7


def test_flipflop_instruction_rates():
    task = get_task("flipflop", p_write=0.3, p_read=0.2)
    source = task.sample(20001, np.random.default_rng(0)).source
    instructions = source[2:-1:2]  # after the first (forced) write
    n = len(instructions)
    for token, p in ((FIRST_SYMBOL, 0.3), (FIRST_SYMBOL + 1, 0.5), (FIRST_SYMBOL + 2, 0.2)):
        assert abs(instructions.count(token) / n - p) < 0.02
    assert simulate_flipflop(source) == task.sample(20001, np.random.default_rng(0)).target[0]


def runs(source):
    """Lengths of the maximal runs of equal symbols."""
    lengths = [1]
    for previous, symbol in zip(source, source[1:]):  # noqa: B905 (source[1:] is one shorter)
        if symbol == previous:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return lengths


@pytest.mark.parametrize("n_symbols,min_run,max_run", [(32, 2, 12), (2, 1, 3), (5, 4, 4)])
def test_local_count_answers(n_symbols, min_run, max_run):
    task, examples = draw("local_count", n_symbols=n_symbols, min_run=min_run, max_run=max_run)
    first_count = FIRST_SYMBOL + n_symbols
    assert task.vocab_size == first_count + max_run
    for example in examples:
        source = example.source
        assert all(FIRST_SYMBOL <= s < first_count for s in source)
        expected = [0]
        for i in range(1, len(source)):
            expected.append(expected[-1] + 1 if source[i] == source[i - 1] else 0)
        assert [t - first_count for t in example.target] == expected
        lengths = runs(source)
        assert all(min_run <= n <= max_run for n in lengths[:-1]) and lengths[-1] <= max_run


def test_local_count_defaults_are_the_paper_codes():
    """The paper code's LocalCount as its README runs it (--vocab_size 16 --max_reps 48): 16 symbols, every
    run length in 2..48, counts up to 47."""
    task = get_task("local_count")
    example = task.sample(20000, np.random.default_rng(0))
    assert len(set(example.source)) == 16
    assert set(runs(example.source)[:-1]) == set(range(2, 49))
    assert max(example.target) - task.first_count == 47


def test_two_back_default_vocabulary_is_the_paper_codes():
    """The paper code's NBack with --vocab_size 16: 15 symbols in the sources, plus the none token."""
    task = get_task("two_back")
    example = task.sample(5000, np.random.default_rng(0))
    assert len(set(example.source)) == 15 and task.vocab_size == FIRST_SYMBOL + 16


def test_flipflop_default_write_rate_is_the_paper_codes():
    """The paper code's FlipFlop as its configs train it (data `10M_wprob-0_1`): writes and ignores only."""
    source = get_task("flipflop").sample(20001, np.random.default_rng(0)).source
    instructions = source[2:-1:2]  # after the first (forced) write
    assert abs(instructions.count(FIRST_SYMBOL) / len(instructions) - 0.1) < 0.01
    assert instructions.count(FIRST_SYMBOL + 2) == 0


def test_two_back_answers():
    task, examples = draw("two_back")
    none = FIRST_SYMBOL
    for example in examples:
        source = example.source
        assert none not in source
        expected = [source[i - 2] if i >= 2 else none for i in range(len(source))]
        assert example.target == expected


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("copy", {"n_symbols": 1}),
        ("two_back", {"n_symbols": 0}),
        ("mqmtar", {"n_queries": 0}),
        ("mqmtar", {"table_size": 70_000}),
        ("mqmtar", {"layout": "grid"}),
        ("flipflop", {"p_write": 0.7, "p_read": 0.5}),
        ("local_count", {"min_run": 3, "max_run": 2}),
    ],
)
def test_bad_task_arguments(name, kwargs):
    with pytest.raises(ValueError, match=name):
        get_task(name, **kwargs)
    with pytest.raises(ValueError, match=f"task '{name}' has no option no_such_argument"):
        get_task(name, no_such_argument=1)
