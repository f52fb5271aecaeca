"""Training batches drawn with torch on the training device (arXiv:2506.16640, section 3 tasks), for
MQMTAR, Copy, Reverse and Sort: a whole batch is a few dozen tensor operations, so the GPU never waits
for Python-level sampling (the per-example numpy path in asentmax.data.training_batch draws about 4-10K
samples/s on one CPU core; the paper's MQMTAR preset needs 40K+).

Same distribution, different stream. Every example has exactly the distribution of the task's own
numpy sampler (`Task.sample`): the same length law (a bucket picked with probability proportional to
its size, lengths uniform inside it, asentmax.data.sample_lengths), uniform i.i.d. symbols for
Copy/Reverse/Sort, and for MQMTAR keys and values as uniformly random ordered draws without
replacement from the tables (Floyd's algorithm, then a random order), block positions as a uniformly
random subset of the items, queries uniform with replacement. The random numbers themselves differ from
numpy's, so this path gives other batches than the CPU path (whose outputs `make demo` pins).

Determinism. The batch of (seed, rank, step) is a pure function of that triple and the device type:
the host generator `asentmax.data.step_generator(seed, rank, step)` picks the bucket and a 63-bit
seed for a torch.Generator on the device, which draws everything else. Resuming at any step therefore
reproduces the batches exactly, with no sampler state in the checkpoint.

Few shapes. Every batch of a bucket is padded on the right to that bucket's width (the encoded length
of its longest sample, minus one), so a run sees only `len(buckets)` input shapes: the trainer's one
compiled graph (sequence length dynamic, asentmax.trainer.compiled_for_training) serves them all, and
where a dimension cannot stay symbolic torch.compile still compiles at most one graph per bucket.

On CUDA, `training_batches` draws each batch one step ahead on a side stream, so these kernels run
beside the previous training step.

Which path a run takes: `training_batches(..., sampling=...)`: "auto" (the default) uses this sampler
on CUDA for the four tasks above and the numpy path elsewhere (so CPU runs and `make demo` keep their
batches); "device" forces it (CPU included, e.g. for tests), "host" forces the numpy path, whose batches
reach the GPU through pinned memory without blocking the host.

Layout (asentmax.tasks.base): tokens = <bos> source <sep> target <eos>, input_ids = tokens[:-1],
labels = tokens[1:] where the next token is a target token or <eos>, IGNORE_INDEX elsewhere; the
pad is PAD, so a row decodes with `Task.encode`'s rules (tests/test_device_sampling.py checks this).
"""

from __future__ import annotations

import torch

from asentmax.data import IGNORE_INDEX, PAD_ID, Batch, pick_bucket, step_generator, training_batch
from asentmax.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, Task
from asentmax.tasks.mqmtar import BLANK, BLOCK_TOKENS, COLON, QUERY, MQMTARTask, pairs_for_length
from asentmax.tasks.sequence import CopyTask, RandomSequenceTask, ReverseTask, SortTask

_SEED_BOUND = 2**63


def _uniform_below(bound: torch.Tensor, shape, generator) -> torch.Tensor:
    """Integers uniform in [0, bound) per row (bound (B,) long >= 1); the modulo bias is < bound / 2**62."""
    draws = torch.randint(0, 2**62, shape, generator=generator, device=bound.device)
    return draws % bound.view(-1, *([1] * (len(shape) - 1)))


def _draws_without_replacement(counts: torch.Tensor, population: int, width: int, generator) -> torch.Tensor:
    """(rows, width) long: row i starts with a uniformly random ordered draw of counts[i] <= width distinct
    items of range(population) (the rest of the row is -1). Floyd's algorithm gives a uniform subset (for
    j = population - count, ..., population - 1: t uniform in [0, j]; take j if t is already taken, else
    t), then a uniformly random permutation orders it: O(width^2) small tensor operations, whatever the
    population."""
    rows, device = counts.shape[0], counts.device
    chosen = torch.full((rows, width), -1, dtype=torch.long, device=device)
    for column in range(width):
        active = column < counts
        top = (population - counts + column).clamp(max=population - 1)  # j of Floyd's algorithm
        t = _uniform_below(top + 1, (rows,), generator)
        taken = (chosen[:, :column] == t.view(-1, 1)).any(dim=1)
        chosen[:, column] = torch.where(active, torch.where(taken, top, t), -1)
    order = torch.rand(rows, width, generator=generator, device=device, dtype=torch.float64)
    order = order.masked_fill(torch.arange(width, device=device) >= counts.view(-1, 1), 2.0).argsort(dim=1)
    return chosen.gather(1, order)


def _reversed(source, lengths, position, n_symbols):
    return source.gather(1, (lengths.view(-1, 1) - 1 - position).clamp(min=0))


def _sorted(source, lengths, position, n_symbols):
    past_end = position >= lengths.view(-1, 1)  # pushed past every symbol, so they sort last
    return source.masked_fill(past_end, FIRST_SYMBOL + n_symbols).sort(dim=1).values


_TRANSFORMS = {CopyTask: lambda source, *_: source, ReverseTask: _reversed, SortTask: _sorted}


class _SequenceSampler:
    """Copy / Reverse / Sort: `length` uniform symbols; the target is the task's transform of them."""

    def __init__(self, task: RandomSequenceTask, device: torch.device):
        self.task, self.device = task, device
        self.transform = _TRANSFORMS[type(task)]

    def widths(self, max_length: int) -> tuple[int, int]:
        return max_length, max_length

    def draw(self, lengths: torch.Tensor, max_length: int, generator):
        n_symbols = self.task.n_symbols
        source = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + n_symbols, (lengths.shape[0], max_length),
                               generator=generator, device=self.device)
        position = torch.arange(max_length, device=self.device)
        return source, lengths, self.transform(source, lengths, position, n_symbols), lengths


class _MQMTARSampler:
    """MQMTAR (asentmax.tasks.mqmtar): P = pairs_for_length(L) blocks `k1 k2 : v1 v2 _` at uniformly random
    non-overlapping places in a blank context of L tokens, then n_queries queries `? k1 k2`."""

    def __init__(self, task: MQMTARTask, device: torch.device):
        self.task, self.device = task, device
        self.keys = torch.as_tensor(task.keys, dtype=torch.long).to(device)
        self.values = torch.as_tensor(task.values, dtype=torch.long).to(device)

    def widths(self, max_length: int) -> tuple[int, int]:
        return self.task.source_length(max_length), 3 * self.task.n_queries

    def draw(self, lengths: torch.Tensor, max_length: int, generator):
        task, device = self.task, self.device
        n_rows, n_queries = lengths.shape[0], task.n_queries
        n_pairs = ((2 * lengths) // 15).clamp(1, task.table_size)  # pairs_for_length, per row
        max_pairs = pairs_for_length(max_length, task.table_size)
        pair = torch.arange(max_pairs, device=device)
        used = pair < n_pairs.view(-1, 1)  # (B, max_pairs): the row's first P blocks are real
        # keys and values: independent uniformly random ordered draws without replacement from the tables
        drawn = _draws_without_replacement(n_pairs.repeat(2), task.table_size, max_pairs, generator)
        drawn = drawn.clamp(min=0)  # the unused -1 entries of short rows become any valid (ignored) index
        keys, values = self.keys[drawn[:n_rows]], self.values[drawn[n_rows:]]

        # Block places: a uniformly random P-subset of the (free blanks + P) items, in increasing order;
        # the j-th block starts at its item index + 5 j (as in MQMTARTask._generate).
        n_items = lengths - (BLOCK_TOKENS - 1) * n_pairs
        item_keys = torch.rand(n_rows, max_length, generator=generator, device=device, dtype=torch.float64)
        item_keys = item_keys.masked_fill(torch.arange(max_length, device=device) >= n_items.view(-1, 1), 2.0)
        chosen = item_keys.argsort(dim=1)[:, :max_pairs].masked_fill(~used, max_length)
        starts = chosen.sort(dim=1).values + (BLOCK_TOKENS - 1) * pair
        block = torch.stack([keys[..., 0], keys[..., 1], torch.full_like(keys[..., 0], COLON),
                             values[..., 0], values[..., 1]], dim=-1)  # (B, max_pairs, 5)
        offsets = torch.arange(BLOCK_TOKENS - 1, device=device)
        where = (starts.unsqueeze(-1) + offsets).masked_fill(~used.unsqueeze(-1), max_length)
        source_width = task.source_length(max_length)
        source = torch.full((n_rows, source_width + 1), BLANK, dtype=torch.long, device=device)  # +1: sink
        source.scatter_(1, where.flatten(1), block.flatten(1))

        asked = _uniform_below(n_pairs, (n_rows, n_queries), generator)
        marker = torch.full((n_rows, n_queries, 1), QUERY, dtype=torch.long, device=device)
        queries = torch.cat([marker, keys.gather(1, asked.unsqueeze(-1).expand(-1, -1, 2))], dim=-1)
        target = torch.cat([marker, values.gather(1, asked.unsqueeze(-1).expand(-1, -1, 2))], dim=-1)
        query_places = lengths.view(-1, 1) + torch.arange(3 * n_queries, device=device)
        source.scatter_(1, query_places, queries.flatten(1))
        target_lengths = torch.full_like(lengths, 3 * n_queries)
        return source[:, :source_width], lengths + 3 * n_queries, target.flatten(1), target_lengths


_SAMPLERS = {MQMTARTask: _MQMTARSampler, CopyTask: _SequenceSampler, ReverseTask: _SequenceSampler,
             SortTask: _SequenceSampler}


def has_device_sampler(task: Task) -> bool:
    """True when `task` has a torch batch sampler (MQMTAR, Copy, Reverse, Sort)."""
    return type(task) in _SAMPLERS


def lay_out(source, source_lengths, target, target_lengths, width: int) -> Batch:
    """Next-token batch of `<bos> source <sep> target <eos>` rows padded to `width` input tokens.

    source (B, S) / target (B, T) long hold each row's first source_lengths[i] / target_lengths[i]
    tokens (the rest is ignored); width must be >= max(source_lengths + target_lengths) + 2."""
    position = torch.arange(width + 1, device=source.device)
    s_len, t_len = source_lengths.view(-1, 1), target_lengths.view(-1, 1)
    from_source = source.gather(1, (position - 1).clamp(0, source.shape[1] - 1).expand(source.shape[0], -1))
    target_index = (position - s_len - 2).clamp(0, target.shape[1] - 1)
    from_target = target.gather(1, target_index)
    tokens = torch.full_like(from_source, PAD_ID)
    tokens = torch.where(position == s_len + t_len + 2, EOS, tokens)
    tokens = torch.where((position >= s_len + 2) & (position < s_len + 2 + t_len), from_target, tokens)
    tokens = torch.where(position == s_len + 1, SEP, tokens)
    tokens = torch.where((position >= 1) & (position <= s_len), from_source, tokens)
    tokens = torch.where(position == 0, BOS, tokens)
    scored = (position[:width] >= s_len + 1) & (position[:width] <= s_len + t_len + 1)
    labels = torch.where(scored, tokens[:, 1:], IGNORE_INDEX)
    # <eos> is never an input token (the CPU layout drops it too)
    input_ids = tokens[:, :width].masked_fill(position[:width] == s_len + t_len + 2, PAD_ID)
    return Batch(input_ids, labels)


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
        self.sampler = _SAMPLERS[type(task)](task, self.device)
        self.generator = torch.Generator(device=self.device)

    def width(self, bucket: tuple[int, int]) -> int:
        """Input width of every batch of `bucket`: the encoded length of its longest sample minus one."""
        source_width, target_width = self.sampler.widths(bucket[1])
        return source_width + target_width + 2

    def batch(self, *, seed: int, rank: int, step: int, batch_size: int) -> Batch:
        rng = step_generator(seed, rank, step)
        lo, hi = self.buckets[pick_bucket(rng, self.buckets)]
        self.generator.manual_seed(int(rng.integers(_SEED_BOUND)))
        lengths = torch.randint(lo, hi + 1, (batch_size,), generator=self.generator, device=self.device)
        parts = self.sampler.draw(lengths, hi, self.generator)
        return lay_out(*parts, self.width((lo, hi)))


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
