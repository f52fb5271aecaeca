"""Training batches drawn with torch on the training device (arXiv:2506.16640, section 3 tasks), for
MQMTAR, Copy, Reverse and Sort: a whole batch is 10-30 tensor operations whatever the batch size and
length (none loops over positions, pairs or rows, and none waits for the device), so the GPU never
waits for Python-level sampling (the per-example numpy path in asentmax.data.training_batch draws about
4-10K samples/s on one CPU core; the MQMTAR model trains at 20K samples/s at its preset's batch 128 and at
40K+ at batch 512 on an H200: results/paper/mqmtar.md, results/train_gpu.md).

Same distribution, different stream. Every example has exactly the distribution of the task's own
numpy sampler (`Task.sample`): the same length law (a bucket picked with probability proportional to
its size, lengths uniform inside it, asentmax.data.sample_lengths), uniform i.i.d. symbols for
Copy/Reverse/Sort, and for MQMTAR keys and values as uniformly random ordered draws without
replacement from the tables (then, with MQMTARTask's `lookalikes`, one planted look-alike of a queried key
in that share of the rows, by the same uniform choices), block positions as a uniformly random subset of the
items (layout "random") or each block's offset in its stretch as how many of the S - 6 smallest of 2 S - 4
i.i.d. uniform keys fall among the first S - 1 (layout "stretches", the paper's code's hypergeometric
offsets), queries uniform with replacement. An ordered draw of k of n entries without replacement is the
first k distinct values of c i.i.d. uniform draws, in the order they first appear, with c the fewest draws
that hold k distinct values except with probability < 2**-64 (16 for the preset's 8 of the 10,000 MQMTAR
words), or, where c would exceed sqrt(n) (block places, small tables), the entries with the k smallest
of n i.i.d. uniform float64 keys, smallest first; both are exactly uniformly random ordered k-subsets
(by symmetry), but for those 2**-64 failures and for key ties (probability about k * n / 2**53 per
row). The random numbers themselves differ from numpy's, so this path gives other batches than the CPU
path (whose outputs `make demo` pins).

Determinism. The batch of (seed, rank, step) is a pure function of that triple and the device type:
the host generator `asentmax.data.step_generator(seed, rank, step)` picks the bucket and a 63-bit
seed for a torch.Generator on the device, which draws everything else. Resuming at any step therefore
reproduces the batches exactly, with no sampler state in the checkpoint.

Few shapes. Every batch of a bucket is padded on the right to that bucket's width (the encoded length
of its longest sample, minus one), so a run sees only `len(buckets)` input shapes: the trainer's one
compiled graph (sequence length dynamic, asentmax.trainer.compiled_for_training) serves them all, and
where a dimension cannot stay symbolic torch.compile still compiles at most one graph per bucket.

Layout (asentmax.tasks.base): tokens = <bos> source <sep> target <eos>, input_ids = tokens[:-1],
labels = tokens[1:] where the next token is a target token or <eos>, IGNORE_INDEX elsewhere; the
pad is PAD. A batch starts from its rows' fixed tokens (specials, blanks, query markers, padding,
IGNORE_INDEX where nothing is scored) and scatters its random tokens into place. MQMTAR's fixed tokens
come from `asentmax.data.collate` of one placeholder example of the bucket's shortest length, shifted
by each row's length (all that follows the context moves with L); Copy/Reverse/Sort rows start from
<bos> and padding and scatter <sep> and <eos> with their symbols. Rows decode with `Task.encode`'s
rules (tests/test_device_sampling.py checks every row against collate). The constants kept per bucket
are O(width) (a few KB at the presets).

On CUDA, `training_batches` draws each batch one step ahead on a side stream, so these kernels run
beside the previous training step.

Which path a run takes: `training_batches(..., sampling=...)`: "auto" (the default) uses this sampler
on CUDA for the four tasks above and the numpy path elsewhere (so CPU runs and `make demo` keep their
batches); "device" forces it (CPU included, e.g. for tests), "host" forces the numpy path, whose batches
reach the GPU through pinned memory without blocking the host.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from asentmax.data import IGNORE_INDEX, PAD_ID, Batch, collate, pick_bucket, step_generator, training_batch
from asentmax.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, Example, Task
from asentmax.tasks.mqmtar import (
    ALPHABET_SIZE,
    ALPHABET_START,
    BLANK,
    BLOCK_TOKENS,
    COLON,
    LOOKALIKE_KINDS,
    QUERY,
    MQMTARTask,
    pairs_for_length,
    stretch_for_length,
)
from asentmax.tasks.sequence import CopyTask, RandomSequenceTask, ReverseTask, SortTask

_SEED_BOUND = 2**63


def _uniform_below(bound: torch.Tensor, shape, generator) -> torch.Tensor:
    """Integers uniform in [0, bound) per row (bound (B,) long >= 1); the modulo bias is < bound / 2**62."""
    draws = torch.randint(0, 2**62, shape, generator=generator, device=bound.device)
    return draws % bound.view(-1, *([1] * (len(shape) - 1)))


def _smallest_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k smallest entries along the last dim, smallest first. With i.i.d. uniform keys
    (entries that must not be drawn set to 2.0) the first j of them are a uniformly random ordered draw
    without replacement of j of the other entries, for every j <= their number."""
    return keys.topk(k, dim=-1, largest=False, sorted=True).indices


def _failure_log2(population: int, draws: int, k: int) -> float:
    """log2 of a bound on P(fewer than k distinct values among `draws` i.i.d. uniform draws from
    range(population)): draw i repeats an earlier value with probability < p = (draws - 1) / population
    whatever came before, so the repeats are dominated by Binomial(draws, p), and fewer than k distinct
    values take m = draws - k + 1 repeats: P <= comb(draws, m) p**m."""
    m, p = draws - k + 1, (draws - 1) / population
    if p == 0:
        return -math.inf
    return (math.lgamma(draws + 1) - math.lgamma(m + 1) - math.lgamma(k)) / math.log(2) + m * math.log2(p)


@functools.lru_cache(maxsize=None)
def _candidates(population: int, k: int) -> int:
    """The fewest i.i.d. uniform draws from range(population) that hold k distinct values except with
    probability < 2**-64, or 0 when that takes more than sqrt(population) draws (the k smallest of
    `population` keys are then the cheaper draw)."""
    draws = k
    while draws * draws <= population:
        if _failure_log2(population, draws, k) < -64:
            return draws
        draws += 1
    return 0


class _DistinctDraws:
    """Uniformly random ordered draws of k distinct items of range(population), one per row. Either the
    first k distinct values of c i.i.d. uniform draws, in the order they first appear (exactly uniform
    whenever there are k of them, by symmetry; c = _candidates(population, k) makes that fail with
    probability < 2**-64: 16 draws for 8 of the 10,000 MQMTAR words), or, when c would exceed
    sqrt(population), the entries of the k smallest of `population` i.i.d. float64 keys."""

    def __init__(self, population: int, k: int, device: torch.device):
        self.population, self.k, self.device = population, k, device
        self.candidates = candidates = _candidates(population, k)
        if candidates:
            self.earlier = torch.ones(candidates, candidates, dtype=torch.bool).tril(-1).to(device)  # i < j
            position = torch.arange(candidates, device=device)
            self.first_seen, self.seen_again = position, position + candidates

    def __call__(self, rows: int, generator) -> torch.Tensor:
        if not self.candidates:
            keys = torch.rand(rows, self.population, generator=generator, device=self.device,
                              dtype=torch.float64)
            return _smallest_keys(keys, self.k)
        draws = torch.randint(0, 2**62, (rows, self.candidates), generator=generator, device=self.device)
        draws = draws % self.population  # as _uniform_below: randint over a small range is 32-bit modulo
        repeated = ((draws.unsqueeze(-1) == draws.unsqueeze(-2)) & self.earlier).any(dim=-1)
        first = _smallest_keys(torch.where(repeated, self.seen_again, self.first_seen), self.k)
        return draws.gather(1, first)


def _laid_out(rows: torch.Tensor, width: int, positions, tokens) -> Batch:
    """The batch whose rows (B, columns) hold input ids in columns [0, width), labels in [width, 2 width)
    and a sink after them, once tokens[i] (B, n_i) are scattered at the columns positions[i] (B, n_i)."""
    for where, what in zip(positions, tokens, strict=True):
        rows.scatter_(1, where, what)
    return Batch(rows[:, :width].contiguous(), rows[:, width : 2 * width].contiguous())


class _SequenceBucket:
    """Copy / Reverse / Sort constants of one bucket. A row of length L = lo + l has <bos> in input
    column 0 and PAD / IGNORE_INDEX everywhere else, and then its scattered slots: source symbol i at
    input column 1 + i, target symbol i at input column L + 2 + i and label column L + 1 + i (for Reverse
    source symbol i goes to target place L - 1 - i instead), <sep> at input column L + 1, <eos> at label
    column 2 L + 1. Slot k lands on column base[k] + slope[k] * l, or, when first_unused[k] >= l (symbol
    i >= L), on the sink column 2 width, whose content is dropped."""

    def __init__(self, task: RandomSequenceTask, bucket: tuple[int, int], device: torch.device):
        lo, hi = bucket
        self.hi, self.n_lengths = hi, hi - lo + 1
        width = self.width = 2 * hi + 2
        sink = 2 * width
        symbol = np.arange(hi)
        if isinstance(task, ReverseTask):  # 2 L + 1 - i
            target, target_slope = 2 * lo + 1 - symbol, np.full(hi, 2)
        else:  # L + 2 + i
            target, target_slope = lo + 2 + symbol, np.ones(hi, dtype=np.int64)
        base = np.concatenate([1 + symbol, target, width - 1 + target, [lo + 1, width + 2 * lo + 1]])
        slope = np.concatenate([np.zeros(hi, dtype=np.int64), target_slope, target_slope, [1, 2]])
        first_unused = np.concatenate([np.tile(symbol - lo, 3), [-1, -1]])
        self.base, self.slope, self.first_unused = (torch.as_tensor(a).to(device)
                                                    for a in (base, slope, first_unused))
        self.sink = torch.tensor(sink, device=device)
        self.specials = torch.tensor([[SEP, EOS]], device=device)
        background = torch.cat([torch.full((width,), PAD_ID), torch.full((width,), IGNORE_INDEX),
                                torch.full((1,), PAD_ID)])
        background[0] = BOS
        self.background = background.view(1, -1).to(device)
        self.past_end_symbol = FIRST_SYMBOL + task.n_symbols


class _SequenceSampler:
    """Copy / Reverse / Sort: `length` uniform symbols; the target is the task's transform of them."""

    def __init__(self, task: RandomSequenceTask, buckets: list[tuple[int, int]], device: torch.device):
        self.task, self.device = task, device
        self.buckets = [_SequenceBucket(task, bucket, device) for bucket in buckets]

    def width(self, index: int) -> int:
        return self.buckets[index].width

    def batch(self, index: int, batch_size: int, generator) -> Batch:
        bucket, task = self.buckets[index], self.task
        row = torch.randint(0, bucket.n_lengths, (batch_size, 1), generator=generator, device=self.device)
        source = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + task.n_symbols, (batch_size, bucket.hi),
                               generator=generator, device=self.device)
        unused = bucket.first_unused >= row  # (B, slots)
        target = source
        if isinstance(task, SortTask):  # symbols past the end pushed past every symbol, so they sort last
            target = source.masked_fill(unused[:, : bucket.hi], bucket.past_end_symbol).sort(dim=1).values
        tokens = torch.cat([source, target, target, bucket.specials.expand(batch_size, -1)], dim=1)
        positions = torch.where(unused, bucket.sink, torch.addcmul(bucket.base, row, bucket.slope))
        return _laid_out(bucket.background.repeat(batch_size, 1), bucket.width, [positions], [tokens])


class _MQMTARBucket:
    """MQMTAR constants of one bucket (lengths L = lo + l, contexts of C = task.context_length(L) tokens
    from C_lo to C_hi, P = pairs_for_length(L) <= K blocks). A row's fixed tokens are
    template[max(column_base - shift, column_floor)] with shift = C - C_lo: the template holds <bos>, a
    blank, then everything collate puts after a context of C_lo tokens (query markers, <sep>, the target's
    markers, padding), then that row's labels from column C_lo on, so that they shift with C. Scattered:
    block j at item index i_j (its context index minus 5 j) holds `k1 k2 :` then `v1 v2 _` from input
    column i_j + 5 j + 1 on; query q's key `k1 k2` is at input column C + 2 + 3 q, the target's `v1 v2` at
    C + 3 Q + 3 + 3 q and their labels one column earlier; the unused tokens go to distinct sink columns
    from 2 width on. Layout "random": a row has L - 5 P <= M items; "stretches": block j starts b_j
    tokens into stretch j of S = L // P, so i_j = (S - 5) j + b_j, and b_j counts how many of the S - 6
    smallest of 2 S - 4 <= N keys fall among the first S - 1."""

    def __init__(self, task: MQMTARTask, bucket: tuple[int, int], device: torch.device):
        lo, hi = bucket
        n_queries, n_lengths = task.n_queries, hi - lo + 1
        length = np.arange(lo, hi + 1)
        pairs = np.array([pairs_for_length(int(n), task.table_size) for n in length])
        context = np.array([task.context_length(int(n)) for n in length])
        c_lo, c_hi = int(context.min()), int(context.max())
        self.n_lengths, self.n_pairs = n_lengths, int(pairs.max())
        self.shift = torch.as_tensor(context - c_lo).to(device)
        marked = [QUERY, BLANK, BLANK] * n_queries  # BLANK: where the key / value tokens are scattered
        shortest = collate(task, [Example([BLANK] * c_lo + marked, marked)])
        width = self.width = c_hi + 6 * n_queries + 2
        # sink columns: 2 width + r Q + q (+ shift) for the query rows' third tokens, then 6 j from
        # `unused_start`
        self.unused_start = 2 * width + 3 * n_queries + c_hi - c_lo + 1
        columns = self.unused_start + 6 * self.n_pairs + 1
        padding = c_hi - c_lo
        inputs = [BOS, BLANK, *shortest.input_ids[0, c_lo + 1 :].tolist(), *[PAD_ID] * padding]
        labels = [IGNORE_INDEX, *shortest.labels[0, c_lo:].tolist(), *[IGNORE_INDEX] * padding]
        self.template = torch.tensor(inputs + labels + [PAD_ID], device=device)
        column = np.arange(width)
        base = np.concatenate([column + 1 - c_lo, len(inputs) + column + 1 - c_lo,
                               np.zeros(columns - 2 * width)])
        floor = np.concatenate([np.minimum(column, 1), np.full(width, len(inputs)),
                                np.full(columns - 2 * width, len(inputs) + len(labels))])
        self.column_base, self.column_floor = (torch.as_tensor(a, dtype=torch.long).to(device)
                                               for a in (base, floor))
        self.pairs = torch.as_tensor(pairs).to(device)
        self.draw_words = _DistinctDraws(task.table_size, self.n_pairs, device)  # keys, values
        self.unused = torch.as_tensor(np.arange(self.n_pairs) >= pairs.reshape(-1, 1)).to(device)
        pair = np.arange(self.n_pairs)
        self.unused_starts = torch.as_tensor(self.unused_start + pair).to(device)  # sorted + 5 j: 6 j apart
        if task.layout == "stretches":
            stretch = np.array([stretch_for_length(int(n), task.table_size) for n in length]).reshape(-1, 1)
            self.n_places = int(2 * stretch.max() - 4)
            place = np.arange(self.n_places)
            masked, kept = place >= 2 * stretch - 4, place < stretch - BLOCK_TOKENS
            self.masked_places, self.kept = (torch.as_tensor(a).view(n_lengths, 1, -1).to(device)
                                             for a in (masked, kept))
            self.places_before = torch.as_tensor(stretch - 1).view(-1, 1, 1).to(device)
            self.stretch_items = torch.as_tensor((stretch - (BLOCK_TOKENS - 1)) * pair).to(device)
        else:
            items = length - (BLOCK_TOKENS - 1) * pairs
            self.n_items = int(items.max())
            self.masked_items = torch.as_tensor(np.arange(self.n_items) >= items.reshape(-1, 1)).to(device)
        offset, part = np.arange(3), np.arange(2).reshape(-1, 1, 1)
        block = (BLOCK_TOKENS - 1) * pair.reshape(-1, 1) + 1 + 3 * part + offset  # (2, K, 3)
        self.block_offsets = torch.as_tensor(block[None]).to(device)
        query, part = np.arange(n_queries).reshape(-1, 1), np.arange(3).reshape(-1, 1, 1)
        first = np.array([2, 3 * n_queries + 3, width + 3 * n_queries + 2]).reshape(-1, 1, 1)
        queries = np.where(offset < 2, c_lo + first + 3 * query + offset,
                           2 * width + n_queries * part + query)
        self.query_offsets = torch.as_tensor(queries[None]).to(device)  # (1, 3, Q, 3), plus shift


class _MQMTARSampler:
    """MQMTAR (asentmax.tasks.mqmtar): P = pairs_for_length(L) blocks `k1 k2 : v1 v2 _` in a blank context,
    at uniformly random non-overlapping places of L tokens (layout "random") or one in each of P
    stretches of L // P tokens (layout "stretches"), then n_queries queries `? k1 k2`."""

    def __init__(self, task: MQMTARTask, buckets: list[tuple[int, int]], device: torch.device):
        self.task, self.device = task, device
        words = [np.concatenate([table, np.full((task.table_size, 1), last)], axis=1)
                 for table, last in ((task.keys, COLON), (task.values, BLANK))]
        self.words = torch.as_tensor(np.stack(words)).to(device)  # (2, table_size, 3): `k1 k2 :`, `v1 v2 _`
        self.table = torch.arange(2, device=device).view(1, 2, 1)
        self.query_tables = torch.tensor([0, 1, 1], device=device).view(1, 3, 1)  # keys, values, labels
        # the look-alike kinds planted, as indices into LOOKALIKE_KINDS (MQMTARTask._plant_lookalike's kind)
        self.lookalike_kinds = torch.tensor([LOOKALIKE_KINDS.index(kind) for kind in task.lookalike_kinds],
                                            device=device)
        self.buckets = [_MQMTARBucket(task, bucket, device) for bucket in buckets]
        self.block_items = self._stretch_items if task.layout == "stretches" else self._random_items

    def width(self, index: int) -> int:
        return self.buckets[index].width

    def _random_items(self, bucket: _MQMTARBucket, row: torch.Tensor, generator) -> torch.Tensor:
        """(B, K) item indices of the blocks, increasing: a uniformly random P-subset of the L - 5 P items,
        the j-th block starting at its item index + 5 j (as in MQMTARTask._generate)."""
        items = torch.rand(row.shape[0], bucket.n_items, generator=generator, device=self.device,
                           dtype=torch.float64)
        items = items.masked_fill_(bucket.masked_items[row], 2.0)
        items = torch.where(bucket.unused[row], bucket.unused_starts, _smallest_keys(items, bucket.n_pairs))
        return items.sort(dim=1).values

    def _stretch_items(self, bucket: _MQMTARBucket, row: torch.Tensor, generator) -> torch.Tensor:
        """(B, K) item indices of the blocks, increasing: block j at (S - 5) j + b_j, b_j the number of the
        stretch's S - 6 kept blanks (the smallest of 2 S - 4 i.i.d. keys) among the S - 1 places before its
        block: hypergeometric, as MQMTARTask._generate draws it."""
        keys = torch.rand(row.shape[0], bucket.n_pairs, bucket.n_places, generator=generator,
                          device=self.device, dtype=torch.float64)
        order = keys.masked_fill_(bucket.masked_places[row], 2.0).argsort(dim=-1)
        before = ((order < bucket.places_before[row]) & bucket.kept[row]).sum(dim=-1)
        return torch.where(bucket.unused[row], bucket.unused_starts, bucket.stretch_items[row] + before)

    def _plant_lookalikes(self, bucket: _MQMTARBucket, row: torch.Tensor, words: torch.Tensor,
                          asked: torch.Tensor, generator) -> None:
        """MQMTARTask._plant_lookalike in every row with probability task.lookalikes (rows of one pair
        excepted), in place on words (B, 2, K, 3) before the queries are read from it: each row makes every
        draw (the query, the other pair, the kind, the redrawn symbol) and the planting is masked."""
        batch_size, device = words.shape[0], self.device
        rows = torch.arange(batch_size, device=device)
        n_pairs = bucket.pairs[row]
        plant = (torch.rand(batch_size, generator=generator, device=device, dtype=torch.float64)
                 < self.task.lookalikes) & (n_pairs > 1)
        query = torch.randint(0, self.task.n_queries, (batch_size, 1), generator=generator, device=device)
        i = asked.gather(1, query).squeeze(1)
        j = _uniform_below((n_pairs - 1).clamp(min=1), (batch_size,), generator)
        j = j + (j >= i)
        kinds = self.lookalike_kinds
        kind = kinds[torch.randint(0, len(kinds), (batch_size,), generator=generator, device=device)]
        symbol = torch.randint(0, ALPHABET_SIZE - 1, (batch_size,), generator=generator, device=device)
        key = words[rows, 0, i, :2]  # (B, 2) token ids of the queried key
        other = (1 - kind).clamp(min=0)[:, None]  # the redrawn token (kinds 0 and 1)
        redrawn = key.gather(1, other).squeeze(1) - ALPHABET_START
        word = key.scatter(1, other, (ALPHABET_START + symbol + (symbol >= redrawn))[:, None])
        pair = torch.arange(bucket.n_pairs, device=device)
        clash = ((words[:, 0, :, :2] == word[:, None, :]).all(-1) & (pair != j[:, None])
                 & (pair < n_pairs[:, None])).any(1)
        new_key, new_value = plant & (kind < 2) & ~clash, plant & (kind == 2)
        words[rows, 0, j, :2] = torch.where(new_key[:, None], word, words[rows, 0, j, :2])
        words[rows, 1, j, :2] = torch.where(new_value[:, None], key, words[rows, 1, j, :2])

    def batch(self, index: int, batch_size: int, generator) -> Batch:
        bucket, device = self.buckets[index], self.device
        n_pairs = bucket.n_pairs
        row = torch.randint(0, bucket.n_lengths, (batch_size,), generator=generator, device=device)
        # keys and values: independent uniformly random ordered draws without replacement from the tables
        drawn = bucket.draw_words(2 * batch_size, generator).view(batch_size, 2, n_pairs)
        words = self.words[self.table, drawn]  # (B, 2, K, 3); a row uses its first P pairs
        starts = self.block_items(bucket, row, generator).view(batch_size, 1, n_pairs, 1)
        asked = _uniform_below(bucket.pairs[row], (batch_size, 1, self.task.n_queries), generator)
        if self.task.lookalikes:
            self._plant_lookalikes(bucket, row, words, asked.view(batch_size, -1), generator)
        batch_rows = torch.arange(batch_size, device=device).view(-1, 1, 1)
        asked_words = words[batch_rows, self.query_tables, asked]  # (B, 3, Q, 3)
        shift = bucket.shift[row]
        positions = [(starts + bucket.block_offsets).flatten(1), (shift.view(-1, 1, 1, 1) +
                                                                 bucket.query_offsets).flatten(1)]
        rows = bucket.template[(bucket.column_base - shift.view(-1, 1)).clamp(min=bucket.column_floor)]
        return _laid_out(rows, bucket.width, positions, [words.flatten(1), asked_words.flatten(1)])


_SAMPLERS = {MQMTARTask: _MQMTARSampler, CopyTask: _SequenceSampler, ReverseTask: _SequenceSampler,
             SortTask: _SequenceSampler}


def has_device_sampler(task: Task) -> bool:
    """True when `task` has a torch batch sampler (MQMTAR, Copy, Reverse, Sort)."""
    return type(task) in _SAMPLERS


class DeviceBatchSampler:
    """Training batches of `task` drawn on `device` (see the module docstring); `batch(...)` is a pure
    function of (seed, rank, step) on a given device type."""

    def __init__(self, task: Task, buckets: list[tuple[int, int]], device: torch.device | str):
        if not has_device_sampler(task):
            raise ValueError(f"task {task.name!r} has no device sampler (those with one: mqmtar, copy, "
                             "reverse, sort); use the CPU path")
        for lo, _ in buckets:
            task.check_length(lo)
        self.task, self.buckets, self.device = task, list(buckets), torch.device(device)
        self.sampler = _SAMPLERS[type(task)](task, self.buckets, self.device)
        self.generator = torch.Generator(device=self.device)

    def width(self, bucket: tuple[int, int]) -> int:
        """Input width of every batch of `bucket`: the encoded length of its longest sample minus one."""
        return self.sampler.width(self.buckets.index(bucket))

    def batch(self, *, seed: int, rank: int, step: int, batch_size: int) -> Batch:
        rng = step_generator(seed, rank, step)
        index = pick_bucket(rng, self.buckets)
        self.generator.manual_seed(int(rng.integers(_SEED_BOUND)))
        return self.sampler.batch(index, batch_size, self.generator)


SAMPLING_MODES = ("auto", "device", "host")


def uses_device_sampler(task: Task, device: torch.device | str, sampling: str) -> bool:
    """Whether training batches come from DeviceBatchSampler: `sampling` "device" (on any device), "host"
    (never: the numpy path of asentmax.data.training_batch), "auto" (on CUDA, for the tasks that have one;
    the CPU keeps the numpy path, whose batches `make demo` pins)."""
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLING_MODES)}, got {sampling!r}")
    if sampling == "device" and not has_device_sampler(task):
        raise ValueError(f"sampling 'device': task {task.name!r} has no device sampler (mqmtar, copy, "
                         "reverse and sort have one); use --sampling auto or host")
    return sampling == "device" or (sampling == "auto" and torch.device(device).type == "cuda"
                                    and has_device_sampler(task))


def training_batches(task: Task, buckets: list[tuple[int, int]], *, seed: int, start_step: int, rank: int,
                     local_batch_size: int, device: torch.device | str, sampling: str = "auto"):
    """The training batches of steps start_step, start_step + 1, ... of `rank`, on `device` (see
    uses_device_sampler). Device batches are drawn one step ahead on a side CUDA stream; host batches
    travel through pinned memory without the host waiting for the copy."""
    device = torch.device(device)
    step = start_step
    if uses_device_sampler(task, device, sampling):
        sampler = DeviceBatchSampler(task, buckets, device)
        yield from _drawn_ahead(lambda s: sampler.batch(seed=seed, rank=rank, step=s,
                                                         batch_size=local_batch_size), step, device)
    pinned = device.type == "cuda"
    while True:
        batch = training_batch(task, seed=seed, rank=rank, step=step, batch_size=local_batch_size,
                               buckets=buckets)
        yield (batch.pin_memory() if pinned else batch).to(device, non_blocking=pinned)
        step += 1


def _drawn_ahead(draw, step: int, device: torch.device):
    """draw(step), draw(step + 1), ...; on CUDA every batch is drawn on a side stream one step ahead, so
    its kernels run beside the previous training step instead of queuing in front of the next one."""
    if device.type != "cuda":
        while True:
            yield draw(step)
            step += 1
    main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    side.wait_stream(main)  # the sampler's tables were copied to the device on the main stream
    with torch.cuda.stream(side):
        ahead = draw(step)
    while True:
        main.wait_stream(side)  # the training step waits for its batch, not for the one drawn next
        batch = ahead
        for tensor in (batch.input_ids, batch.labels):
            tensor.record_stream(main)  # made on the side stream, used and freed on the main one
        step += 1
        with torch.cuda.stream(side):
            ahead = draw(step)
        yield batch
