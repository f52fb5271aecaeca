"""Device-side batch sampling (asentmax.tasks.device_sampling): rows decode to valid examples whose
target the independent solvers of test_tasks_solvers accept, re-encode to the CPU path's layout,
follow the CPU sampler's distribution (two-sample chi-square tests), and are a pure function of
(seed, rank, step)."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from asentmax.data import (
    IGNORE_INDEX,
    PAD_ID,
    collate,
    length_buckets,
    sample_lengths,
    step_generator,
    training_batch,
)
from asentmax.tasks import SEP, Example, get_task
from asentmax.tasks.device_sampling import (
    DeviceBatchSampler,
    _candidates,
    _DistinctDraws,
    _failure_log2,
    _smallest_keys,
    has_device_sampler,
    training_batches,
)
from asentmax.tasks.mqmtar import COLON, QUERY, pairs_for_length
from test_tasks_solvers import parse_mqmtar

PAPER_TASKS = ("mqmtar", "copy", "reverse", "sort")
BUCKETS = length_buckets(32, 64, 4)


def decode_rows(task, batch):
    """Examples read back from a batch by the layout rules: source up to the first SEP, target after it up
    to the last scored position (which predicts EOS)."""
    examples = []
    for ids, labels in zip(batch.input_ids.tolist(), batch.labels.tolist(), strict=True):
        sep = ids.index(SEP)
        last = max(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        examples.append(Example(source=ids[1:sep], target=ids[sep + 1 : last + 1]))
    return examples


_TABLE_WORDS = {}  # id(task) -> (task, its key words, its value words)


def table_words(task):
    """(set of key words, set of value words) of an MQMTAR task's tables, built once per task object."""
    if id(task) not in _TABLE_WORDS or _TABLE_WORDS[id(task)][0] is not task:
        _TABLE_WORDS[id(task)] = (task, set(map(tuple, task.keys.tolist())),
                                  set(map(tuple, task.values.tolist())))
    return _TABLE_WORDS[id(task)][1:]


def solve(task, example):
    """The target an independent solver gives for the example's source."""
    if task.name == "copy":
        return list(example.source)
    if task.name == "reverse":
        return example.source[::-1]
    if task.name == "sort":
        return sorted(example.source)
    length = len(example.source) - 3 * task.n_queries
    pairs, _, asked = parse_mqmtar(example.source, length, task.n_queries)
    assert len(pairs) == pairs_for_length(length, task.table_size)
    keys, values = table_words(task)
    assert set(pairs) <= keys and set(pairs.values()) <= values and len(set(pairs.values())) == len(pairs)
    return [token for key in asked for token in (QUERY, *pairs[key])]


VARIANTS = [(name, {}, BUCKETS) for name in PAPER_TASKS] + [
    ("mqmtar", dict(table_size=8, n_queries=7), BUCKETS),  # P = 8 at L = 64: every word, in random order
    ("mqmtar", dict(table_size=3, n_queries=1), length_buckets(6, 40, 3)),  # P capped at the table size
    ("sort", dict(n_symbols=3), length_buckets(1, 9, 2)),
]


@pytest.mark.parametrize("name, options, buckets", VARIANTS)
def test_rows_decode_to_valid_examples_in_the_cpu_layout(name, options, buckets):
    task = get_task(name, **options)
    sampler = DeviceBatchSampler(task, buckets, "cpu")
    for step in range(6):
        batch = sampler.batch(seed=1, rank=0, step=step, batch_size=16)
        assert batch.input_ids.is_contiguous() and batch.labels.is_contiguous()
        examples = decode_rows(task, batch)
        for example in examples:
            assert example.target == solve(task, example)
        reference = collate(task, examples)  # the CPU layout, padded to the longest row
        width = reference.input_ids.shape[1]
        assert torch.equal(batch.input_ids[:, :width], reference.input_ids)
        assert torch.equal(batch.labels[:, :width], reference.labels)
        assert (batch.input_ids[:, width:] == PAD_ID).all()
        assert (batch.labels[:, width:] == IGNORE_INDEX).all()


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_one_shape_per_bucket_and_deterministic(name):
    task = get_task(name)
    sampler = DeviceBatchSampler(task, BUCKETS, "cpu")
    shapes = {sampler.batch(seed=0, rank=0, step=s, batch_size=4).input_ids.shape[1] for s in range(40)}
    assert shapes == {sampler.width(bucket) for bucket in BUCKETS}
    first = sampler.batch(seed=3, rank=1, step=7, batch_size=8)
    again = DeviceBatchSampler(task, BUCKETS, "cpu").batch(seed=3, rank=1, step=7, batch_size=8)
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.labels, again.labels)
    for other in (dict(seed=3, rank=1, step=8), dict(seed=3, rank=0, step=7), dict(seed=4, rank=1, step=7)):
        other_batch = sampler.batch(**other, batch_size=8)
        assert not torch.equal(other_batch.input_ids[:, :20], first.input_ids[:, :20])


def test_only_the_paper_tasks_have_a_device_sampler():
    assert all(has_device_sampler(get_task(name)) for name in PAPER_TASKS)
    with pytest.raises(ValueError, match="no device sampler"):
        DeviceBatchSampler(get_task("flipflop"), BUCKETS, "cpu")


def assert_same_law(cpu_counts, device_counts, what):
    """Two-sample chi-square test of equal categorical laws (fixed seeds, so deterministic)."""
    table = np.array([cpu_counts, device_counts], dtype=float)
    table = table[:, table.sum(0) > 0]
    p_value = chi2_contingency(table)[1]
    assert p_value > 1e-3, f"{what}: CPU and device samplers differ (chi-square p = {p_value:.2g})"


def cpu_examples(task, n, length, seed=0):
    rng = np.random.default_rng(seed)
    return [task.sample(length, rng) for _ in range(n)]


def device_examples(task, n, length, seed=0):
    sampler = DeviceBatchSampler(task, [(length, length)], "cpu")
    return decode_rows(task, sampler.batch(seed=seed, rank=0, step=0, batch_size=n))


def histogram(values, size):
    return np.bincount(np.asarray(values), minlength=size)


def test_lengths_follow_the_cpu_law():
    task = get_task("copy")
    sampler = DeviceBatchSampler(task, BUCKETS, "cpu")
    device = [len(e.source) for s in range(300) for e in decode_rows(task, sampler.batch(
        seed=0, rank=0, step=s, batch_size=8))]
    cpu = np.concatenate([sample_lengths(step_generator(0, 0, s), 8, BUCKETS) for s in range(300)])
    assert_same_law(histogram(cpu, 65), histogram(device, 65), "lengths")


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_sequence_statistics_follow_the_cpu_law(name):
    task = get_task(name, n_symbols=5)
    cpu, device = cpu_examples(task, 3000, 6), device_examples(task, 3000, 6)
    for position in (0, 5):
        assert_same_law(histogram([e.source[position] for e in cpu], 9),
                        histogram([e.source[position] for e in device], 9), f"source symbol {position}")
    for statistic in (lambda e: len(set(e.source)), lambda e: e.target[0], lambda e: e.target[-1]):
        assert_same_law(histogram([statistic(e) for e in cpu], 9),
                        histogram([statistic(e) for e in device], 9), "target statistic")


def mqmtar_statistics(task, examples, length):
    """Per example: start of the first block, start of the last block, index of the first key in the key
    table, which pair (by block order) the first query asks, and how many distinct pairs are asked."""
    key_index = {tuple(w): i for i, w in enumerate(task.keys.tolist())}
    rows = []
    for example in examples:
        context = np.array(example.source[:length])
        starts = np.flatnonzero(context == COLON) - 2
        pairs, _, asked = parse_mqmtar(example.source, length, task.n_queries)
        keys = list(pairs)
        rows.append((starts[0], starts[-1], key_index[keys[0]] * 20 // task.table_size, keys.index(asked[0]),
                     len(set(asked))))
    return np.array(rows)


@pytest.mark.parametrize("length", [64, 30])
def test_mqmtar_statistics_follow_the_cpu_law(length):
    task = get_task("mqmtar")
    cpu = mqmtar_statistics(task, cpu_examples(task, 2000, length), length)
    device = mqmtar_statistics(task, device_examples(task, 2000, length), length)
    for column, what in enumerate(("first block start", "last block start", "first key's table bin",
                                   "asked pair")):
        assert_same_law(histogram(cpu[:, column], length), histogram(device[:, column], length), what)
    # queries with replacement: the number of distinct pairs asked against its exact law (every tuple of
    # asked pairs equally likely); this sample of the CPU sampler happens to sit in the tail (p ~ 2e-4)
    n_pairs, n_queries = pairs_for_length(length, task.table_size), task.n_queries
    exact = np.bincount([len(set(asked)) for asked in itertools.product(range(n_pairs), repeat=n_queries)],
                        minlength=n_queries + 1)[1:]
    observed = histogram(device[:, 4], n_queries + 1)[1:]
    assert chisquare(observed, exact * len(device) / exact.sum()).pvalue > 1e-3


def synchronisation_free_batches(task, buckets, batch_size):
    """Four CUDA batches of `task` drawn under sync debug mode "error" (any host-device synchronisation
    raises) after a warm-up batch, checked to be a function of (seed, rank, step): a fresh sampler draws the
    last one again equal."""
    sampler = DeviceBatchSampler(task, buckets, "cuda")
    sampler.batch(seed=0, rank=0, step=0, batch_size=8)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = [sampler.batch(seed=0, rank=0, step=s, batch_size=batch_size) for s in range(4)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    again = DeviceBatchSampler(task, buckets, "cuda").batch(seed=0, rank=0, step=3, batch_size=batch_size)
    assert torch.equal(again.input_ids, batches[3].input_ids) and torch.equal(again.labels, batches[3].labels)
    return batches


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", PAPER_TASKS)
def test_cuda_batches_are_valid_deterministic_and_never_wait_for_the_device(name):
    task = get_task(name)
    batches = synchronisation_free_batches(task, BUCKETS, 64)
    for batch in batches:
        cpu_batch = batch.to("cpu")
        examples = decode_rows(task, cpu_batch)
        assert all(example.target == solve(task, example) for example in examples)
        reference = collate(task, examples)
        assert torch.equal(cpu_batch.input_ids[:, : reference.input_ids.shape[1]], reference.input_ids)


def test_training_batches_pick_the_path_and_resume_at_any_step():
    task = get_task("sort")
    common = dict(seed=2, rank=0, local_batch_size=4, device="cpu")
    host = training_batches(task, BUCKETS, start_step=5, sampling="auto", **common)  # CPU: the numpy path
    expected = training_batch(task, seed=2, rank=0, step=5, batch_size=4, buckets=BUCKETS)
    assert torch.equal(next(host).input_ids, expected.input_ids)
    device = training_batches(task, BUCKETS, start_step=0, sampling="device", **common)
    resumed = training_batches(task, BUCKETS, start_step=3, sampling="device", **common)
    fourth = [next(device) for _ in range(4)][3]
    assert torch.equal(next(resumed).input_ids, fourth.input_ids)
    flipflop = get_task("flipflop")
    with pytest.raises(ValueError, match="no device sampler"):
        next(training_batches(flipflop, [(8, 8)], start_step=0, sampling="device", **common))
    with pytest.raises(ValueError, match="sampling must be one of"):
        next(training_batches(task, BUCKETS, start_step=0, sampling="gpu", **common))
    next(training_batches(flipflop, [(8, 8)], start_step=0, sampling="auto", **common))


def test_task_workload_sampling_setting():
    from asentmax.tasks.workload import TaskWorkload

    workload = TaskWorkload(task="mqmtar", sampling="device")
    batches = workload.batches(seed=0, start_step=2, rank=0, world_size=1, local_batch_size=3, device="cpu")
    sampler = DeviceBatchSampler(get_task("mqmtar"), BUCKETS, "cpu")
    batch, expected = next(batches), sampler.batch(seed=0, rank=0, step=2, batch_size=3)
    assert torch.equal(batch.input_ids, expected.input_ids)
    saved = workload.to_dict()
    assert TaskWorkload.from_dict(saved) == workload
    del saved["sampling"]  # a run saved before the setting existed drew its batches with numpy
    assert TaskWorkload.from_dict(saved).sampling == "host"
    with pytest.raises(ValueError, match="no device sampler"):
        TaskWorkload(task="two_back", sampling="device")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_training_batches_drawn_ahead_on_a_side_stream_are_the_steps_batches():
    task = get_task("mqmtar")
    batches = training_batches(task, BUCKETS, seed=1, start_step=4, rank=0, local_batch_size=32,
                               device="cuda", sampling="auto")
    drawn = []
    for _ in range(5):
        batch = next(batches)
        drawn.append((batch.input_ids * 1).sum(1))  # consumed on the main stream, as training does
    sampler = DeviceBatchSampler(task, BUCKETS, "cuda")
    for step, sums in enumerate(drawn, start=4):
        assert torch.equal(sums, sampler.batch(seed=1, rank=0, step=step, batch_size=32).input_ids.sum(1))


def test_smallest_keys_are_uniform_ordered_draws_without_replacement():
    """Small population, so every ordered draw can be counted: with the entries past a row's count masked
    (key 2.0, as the sampler masks the items a row does not have), the row's first `count` indices are
    distinct allowed entries, and over 30000 rows of mixed counts the first two are uniform over the
    count * (count - 1) ordered pairs, the last of a full draw uniform (chi-square against uniform)."""
    generator = torch.Generator().manual_seed(0)
    counts = torch.tensor([2, 3, 6] * 10000)
    keys = torch.rand(counts.shape[0], 6, generator=generator, dtype=torch.float64)
    keys = keys.masked_fill(torch.arange(6) >= counts.view(-1, 1), 2.0)
    drawn = _smallest_keys(keys, 6)
    for count in (2, 3, 6):
        rows = drawn[counts == count]
        assert (rows[:, :count] < count).all()
        assert all(len(set(row[:count])) == count for row in rows.tolist())
        pair_index = rows[:, 0] * count + rows[:, 1]
        observed = torch.bincount(pair_index, minlength=count * count).numpy()
        assert (observed[[i * (count + 1) for i in range(count)]] == 0).all()  # never the same item twice
        assert chisquare(observed[observed > 0]).pvalue > 1e-3
    last = torch.bincount(drawn[counts == 6][:, 5], minlength=6).numpy()
    assert chisquare(last).pvalue > 1e-3


def fewer_distinct_probability(population, draws, k):
    """Exact P(fewer than k distinct values among `draws` i.i.d. uniform draws from range(population)),
    from the chain of the number of distinct values seen so far."""
    seen = np.zeros(draws + 1)
    seen[0] = 1.0
    for _ in range(draws):
        seen = seen * np.arange(draws + 1) / population + np.roll(seen * (population - np.arange(draws + 1))
                                                                     / population, 1)
    return seen[:k].sum()


@pytest.mark.parametrize("population", [12, 50, 400])
def test_failure_bound_bounds_the_exact_probability(population):
    for k in (1, 2, 3, 5, 8):
        for draws in range(k, 3 * k + 6):
            exact = fewer_distinct_probability(population, draws, k)
            assert exact <= 2 ** _failure_log2(population, draws, k) * (1 + 1e-9), (k, draws)


@pytest.mark.parametrize("population, k", [(10_000, 8), (10_000, 1), (65_536, 30), (400, 2)])
def test_candidates_are_the_fewest_draws_that_meet_the_bound(population, k):
    draws = _candidates(population, k)
    assert k <= draws <= population**0.5 and _failure_log2(population, draws, k) < -64
    assert draws == k or _failure_log2(population, draws - 1, k) >= -64


def test_distinct_draws_from_candidates_are_uniform_ordered_pairs():
    """Population 400, k = 2: the first two distinct values of 16 i.i.d. draws (candidates path). Over 20000
    rows: always distinct, the first uniform (40 bins), the second before or after it equally often, their
    difference modulo 400 uniform over 1..399 (21 bins), chi-square against uniform."""
    draw = _DistinctDraws(400, 2, torch.device("cpu"))
    assert draw.candidates == 16
    drawn = draw(20000, torch.Generator().manual_seed(0)).numpy()
    assert drawn.shape == (20000, 2) and (drawn[:, 0] != drawn[:, 1]).all()
    assert chisquare(histogram(drawn[:, 0] // 10, 40)).pvalue > 1e-3
    before = int((drawn[:, 1] < drawn[:, 0]).sum())
    assert chisquare([before, 20000 - before]).pvalue > 1e-3
    assert chisquare(histogram(((drawn[:, 1] - drawn[:, 0]) % 400 - 1) // 19, 21)).pvalue > 1e-3
    assert _DistinctDraws(10, 8, torch.device("cpu")).candidates == 0  # small tables: keys over them all


def mqmtar_tables(task, examples, length):
    """(examples, P) key-table and value-table indices of each example's pairs, in context order."""
    key_index = {tuple(w): i for i, w in enumerate(task.keys.tolist())}
    value_index = {tuple(w): i for i, w in enumerate(task.values.tolist())}
    rows = [parse_mqmtar(example.source, length, task.n_queries)[0] for example in examples]
    return (np.array([[key_index[key] for key in pairs] for pairs in rows]),
            np.array([[value_index[value] for value in pairs.values()] for pairs in rows]))


def test_mqmtar_keys_and_values_are_uniform_ordered_draws_from_small_tables():
    """Table of 10 words, L = 64 so P = 8 pairs: each block's key (and value) is uniform over the table,
    the two words a sample leaves out are uniform over the 45 pairs, and a block's key and value are
    independent (chi-square against uniform; duplicates would fail parse_mqmtar and the distinctness
    check)."""
    task = get_task("mqmtar", table_size=10)
    keys, values = mqmtar_tables(task, device_examples(task, 4000, 64), 64)
    for drawn in (keys, values):
        assert all(len(set(row)) == 8 for row in drawn.tolist())
        for block in range(8):
            assert chisquare(histogram(drawn[:, block], 10)).pvalue > 1e-3, f"block {block}"
        left_out = [sum(2**i for i in set(range(10)) - set(row)) for row in drawn.tolist()]
        counts = np.unique(left_out, return_counts=True)[1]
        assert len(counts) == 45 and chisquare(counts).pvalue > 1e-3
    assert chisquare(histogram(keys[:, 3] * 10 + values[:, 3], 100)).pvalue > 1e-3


def test_mqmtar_draws_the_whole_key_and_value_tables_uniformly():
    """Every key and value of 2000 samples (16000 draws each) binned by table index into 50 bins of 200
    entries: uniform (chi-square); a draw that favoured a part of the 10,000-entry tables would fail."""
    task = get_task("mqmtar")
    keys, values = mqmtar_tables(task, device_examples(task, 2000, 64), 64)
    for drawn in (keys, values):
        assert chisquare(histogram(drawn.reshape(-1) // 200, 50)).pvalue > 1e-3


@pytest.mark.parametrize("length, n_pairs, n_items", [(23, 3, 8), (15, 2, 5)])
def test_mqmtar_block_places_are_a_uniform_subset_of_the_items(length, n_pairs, n_items):
    """The blocks' item indices (start - 5 j) are a uniformly random n_pairs-subset of the n_items items
    (chi-square of the subset counts against uniform over all C(n_items, n_pairs) subsets)."""
    task = get_task("mqmtar", table_size=10)  # small tables: the places do not depend on them
    subsets = []
    for example in device_examples(task, 6000, length):
        starts = np.flatnonzero(np.array(example.source[:length]) == COLON) - 2
        assert len(starts) == n_pairs
        subsets.append(tuple(starts - (6 - 1) * np.arange(n_pairs)))
    names, counts = np.unique(np.array(subsets), axis=0, return_counts=True)
    assert len(counts) == math.comb(n_items, n_pairs) and (names >= 0).all() and (names < n_items).all()
    assert chisquare(counts).pvalue > 1e-3
