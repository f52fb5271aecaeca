"""MQMTAR's "stretches" layout (asentmax.tasks.mqmtar; the paper's code's placement, results/paper/README.md):
every sample of the host and the device sampler read back by an independent checker written here (pair j
alone in stretch j of S = L // P tokens, blanks elsewhere, queries about the sample's pairs, the target
their values), the offsets of the pairs in their stretches against their exact hypergeometric law and
the device sampler against the host's, and the option carried by the workload, config.json and eval."""

import functools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from asentmax.data import IGNORE_INDEX, PAD_ID, collate, length_buckets
from asentmax.tasks import FIRST_SYMBOL, get_task, make_eval_set
from asentmax.tasks.device_sampling import DeviceBatchSampler
from asentmax.tasks.workload import TaskWorkload
from test_device_sampling import assert_same_law, decode_rows, histogram, synchronisation_free_batches

BLANK, COLON, QUERY = FIRST_SYMBOL, FIRST_SYMBOL + 1, FIRST_SYMBOL + 2


def expected_shape(length, table_size):
    """(P, S): P = floor(0.8 L / 6) in exact arithmetic, capped at the table and at least 1; S = L // P."""
    n_pairs = max(1, min(table_size, math.floor(Fraction(4, 5) * length / 6)))
    return n_pairs, length // n_pairs


@functools.cache
def word_sets(table_size, table_seed):
    """The key table's and the value table's words, as sets of pairs."""
    task = get_task("mqmtar", table_size=table_size, table_seed=table_seed)
    return set(map(tuple, task.keys.tolist())), set(map(tuple, task.values.tolist()))


def read_stretches(task, example, length):
    """Check one example of length L against the layout's definition; returns the offsets b_j of the blocks
    in their stretches, in stretch order."""
    return read_sample(task, example, length)[0]


def read_sample(task, example, length):
    """read_stretches's checks; returns (offsets, the keys in stretch order, the keys asked)."""
    n_pairs, stretch = expected_shape(length, task.table_size)
    source, n_queries = example.source, task.n_queries
    assert len(source) == n_pairs * stretch + 3 * n_queries
    keys, values = word_sets(task.table_size, task.table_seed)
    pairs, offsets = {}, []
    for j in range(n_pairs):
        window = source[j * stretch : (j + 1) * stretch]
        filled = [i for i, token in enumerate(window) if token != BLANK]
        offset = filled[0]
        assert filled == list(range(offset, offset + 5)), f"stretch {j}: {window}"  # one block, blanks around
        assert offset + 5 < stretch  # the block's own trailing blank is inside the stretch
        k1, k2, colon, v1, v2 = window[offset : offset + 5]
        assert colon == COLON and (k1, k2) in keys and (v1, v2) in values and COLON not in (k1, k2, v1, v2)
        assert (k1, k2) not in pairs
        pairs[(k1, k2)] = (v1, v2)
        offsets.append(offset)
    assert len(set(pairs.values())) == n_pairs  # values distinct too
    tail = source[n_pairs * stretch :]
    asked = [tuple(tail[i + 1 : i + 3]) for i in range(0, 3 * n_queries, 3)]
    assert tail[::3] == [QUERY] * n_queries and all(key in pairs for key in asked)
    assert example.target == [token for key in asked for token in (QUERY, *pairs[key])]
    return offsets, list(pairs), asked


def row_length(task, buckets, example):
    """A length L of the buckets whose samples have this example's P and context length (lengths with the
    same P and P S lay out alike, so any of them is the row's)."""
    return next(n for lo, hi in buckets for n in range(lo, hi + 1)
                if expected_shape(n, task.table_size)[0] == example.source.count(COLON)
                and task.source_length(n) == len(example.source))


def offset_law(stretch):
    """Exact law of b: of the 2 S - 4 blank places around a block centred in 2 S + 2 tokens, S - 1 before
    it, a uniformly random S - 6 are kept; b is how many of those are before it."""
    kept, before, after = stretch - 6, stretch - 1, stretch - 3
    total = math.comb(before + after, kept)
    return np.array([math.comb(before, b) * math.comb(after, kept - b) / total for b in range(kept + 1)])


HOST_LENGTHS = [6, 7, 8, 14, 15, 16, 29, 30, *range(32, 65), 111, 130, 4096]


@pytest.mark.parametrize("options", [{}, dict(n_queries=1), dict(table_size=20, n_queries=7)])
def test_every_host_sample_is_laid_out_in_stretches(options):
    task = get_task("mqmtar", layout="stretches", **options)
    rng = np.random.default_rng(0)
    for length in HOST_LENGTHS + [1000]:  # 1000 with table_size 20: P capped at 20, stretches of 50
        n_pairs, stretch = expected_shape(length, task.table_size)
        assert task.source_length(length) == n_pairs * stretch + 3 * task.n_queries
        for _ in range(3):
            read_stretches(task, task.sample(length, rng), length)


def test_the_longest_test_length_has_the_papers_61166_token_context():
    task = get_task("mqmtar", layout="stretches")
    example = make_eval_set(task, 65_536, 1, seed=0)[0]
    offsets = read_stretches(task, example, 65_536)
    assert len(offsets) == 8738 and len(example.source) == 61_166 + 12
    assert chisquare(histogram(offsets, 2), 8738 * offset_law(7)).pvalue > 1e-3


@pytest.mark.parametrize("length, table_size", [(4096, 10_000), (64, 10_000), (37, 10_000), (40, 3)])
def test_host_offsets_follow_the_hypergeometric_law(length, table_size):
    """S = 7, 8, 9 and 13 (P = 3 of a 3-word table at L = 40): the offsets of all the blocks of 400 samples
    against their exact law, and two neighbouring blocks' offsets independent (pairs against the product)."""
    task = get_task("mqmtar", layout="stretches", table_size=table_size)
    _, stretch = expected_shape(length, table_size)
    rng = np.random.default_rng(1)
    offsets = np.array([read_stretches(task, task.sample(length, rng), length) for _ in range(400)])
    law = offset_law(stretch)
    assert chisquare(histogram(offsets.reshape(-1), len(law)), offsets.size * law).pvalue > 1e-3
    joint = histogram(offsets[:, 0] * len(law) + offsets[:, 1], len(law) ** 2)
    product = np.outer(law, law).reshape(-1) * len(offsets)
    keep = product > 5
    assert chisquare(joint[keep], product[keep] * joint[keep].sum() / product[keep].sum()).pvalue > 1e-3


DEVICE_VARIANTS = [({}, length_buckets(32, 64, 4)),
                   (dict(table_size=8, n_queries=7), length_buckets(32, 64, 4)),  # every word, random order
                   (dict(table_size=3, n_queries=1), length_buckets(6, 40, 3)),  # P capped: S up to 13
                   (dict(table_size=1, n_queries=2), [(6, 60)]),  # one pair, S = L: contexts of 6 to 60
                   ({}, [(4090, 4100)])]


@pytest.mark.parametrize("options, buckets", DEVICE_VARIANTS)
def test_every_device_row_is_laid_out_in_stretches_in_the_cpu_layout(options, buckets):
    task = get_task("mqmtar", layout="stretches", **options)
    sampler = DeviceBatchSampler(task, buckets, "cpu")
    widths = set()
    for step in range(8):
        batch = sampler.batch(seed=2, rank=0, step=step, batch_size=16)
        widths.add(batch.input_ids.shape[1])
        examples = decode_rows(task, batch)
        for example in examples:
            read_stretches(task, example, row_length(task, buckets, example))
        reference = collate(task, examples)
        width = reference.input_ids.shape[1]
        assert torch.equal(batch.input_ids[:, :width], reference.input_ids)
        assert torch.equal(batch.labels[:, :width], reference.labels)
        assert (batch.input_ids[:, width:] == PAD_ID).all()
        assert (batch.labels[:, width:] == IGNORE_INDEX).all()
    # one width per bucket: its longest sample's encoded length minus one
    expected = {max(task.source_length(n) for n in range(lo, hi + 1)) + 3 * task.n_queries + 2
                for lo, hi in buckets}
    assert widths <= expected and {sampler.width(bucket) for bucket in buckets} == expected


def device_offsets(task, length, n, seed=0):
    sampler = DeviceBatchSampler(task, [(length, length)], "cpu")
    batch = sampler.batch(seed=seed, rank=0, step=0, batch_size=n)
    return np.array([read_stretches(task, example, length) for example in decode_rows(task, batch)])


@pytest.mark.parametrize("length, table_size", [(64, 10_000), (37, 10_000), (60, 10_000), (40, 3)])
def test_device_offsets_follow_the_hypergeometric_law_and_the_host(length, table_size):
    task = get_task("mqmtar", layout="stretches", table_size=table_size)
    _, stretch = expected_shape(length, table_size)
    law = offset_law(stretch)
    device = device_offsets(task, length, 1500)
    rng = np.random.default_rng(2)
    host = np.array([read_stretches(task, task.sample(length, rng), length) for _ in range(1500)])
    for block in (0, device.shape[1] - 1):
        counts = histogram(device[:, block], len(law))
        assert chisquare(counts, len(device) * law).pvalue > 1e-3, f"block {block}"
        assert_same_law(histogram(host[:, block], len(law)), counts, f"block {block} offset")
    assert chisquare(histogram(device.reshape(-1), len(law)), device.size * law).pvalue > 1e-3


def test_device_keys_and_queries_follow_the_host():
    """The first block's key (table index, 20 bins) and which block the first query asks: the device
    sampler's law is the host's (two-sample chi-square)."""
    task = get_task("mqmtar", layout="stretches")
    key_index = {tuple(w): i for i, w in enumerate(task.keys.tolist())}
    rng = np.random.default_rng(3)
    host = [task.sample(64, rng) for _ in range(2000)]
    device = decode_rows(task, DeviceBatchSampler(task, [(64, 64)], "cpu").batch(seed=3, rank=0, step=0,
                                                                                batch_size=2000))
    statistics = []
    for examples in (host, device):
        read = [read_sample(task, example, 64) for example in examples]
        statistics.append(([key_index[keys[0]] * 20 // task.table_size for _, keys, _ in read],
                           [keys.index(asked[0]) for _, keys, asked in read]))
    for column, what in enumerate(("first key's table bin", "asked block")):
        assert_same_law(histogram(statistics[0][column], 20), histogram(statistics[1][column], 20), what)


def test_random_stays_the_default_and_unknown_layouts_are_refused():
    assert get_task("mqmtar").layout == "random"
    assert get_task("mqmtar").source_length(38) == 38 + 12
    assert get_task("mqmtar", layout="stretches").source_length(38) == 35 + 12  # P = 5, S = 7
    with pytest.raises(ValueError, match="layout must be one of random, stretches"):
        get_task("mqmtar", layout="grid")
    with pytest.raises(ValueError, match="task 'copy' has no option layout"):
        get_task("copy", layout="stretches")


def test_the_workload_carries_the_layout_and_old_runs_load_as_random(tmp_path):
    workload = TaskWorkload(task="mqmtar", layout="stretches", val_multipliers=(1, 2), val_samples=3)
    assert workload.task_object.layout == "stretches"
    saved = workload.to_dict()
    assert saved["layout"] == "stretches" and TaskWorkload.from_dict(saved) == workload
    batch = next(workload.batches(seed=0, start_step=0, rank=0, world_size=1, local_batch_size=8,
                                  device="cpu"))  # the numpy path on the CPU
    for example in decode_rows(workload.task_object, batch):
        read_stretches(workload.task_object, example,
                       row_length(workload.task_object, length_buckets(32, 64, 4), example))
    device = TaskWorkload(task="mqmtar", layout="stretches", sampling="device")  # resumes exactly
    common = dict(seed=5, rank=1, world_size=2, local_batch_size=4, device="cpu")
    from_start = device.batches(start_step=0, **common)
    fourth = [next(from_start) for _ in range(4)][3]
    assert torch.equal(next(device.batches(start_step=3, **common)).input_ids, fourth.input_ids)
    old = dict(saved)
    del old["layout"]  # a run saved before the option existed
    assert TaskWorkload.from_dict(old).task_object.layout == "random"
    with pytest.raises(ValueError, match="task 'copy' lays out its samples one way only"):
        TaskWorkload(task="copy", layout="stretches")
    assert TaskWorkload(task="copy", layout="random").task_object.name == "copy"


def test_validation_sets_use_the_layout(monkeypatch):
    import asentmax.tasks.workload as workload_module

    seen = {}

    def record(model, task, examples, **options):
        seen[len(examples[0].source)] = (task, examples)
        return {"exact_match": 0.0, "token_accuracy": 0.0}

    monkeypatch.setattr(workload_module, "teacher_forced_accuracy", record)
    workload = TaskWorkload(task="mqmtar", layout="stretches", val_multipliers=(1, 4), val_samples=2)
    workload.validate(None, seed=0, step=0, device="cpu", autocast_dtype=None)
    for length in (64, 256):
        task, examples = seen[workload.task_object.source_length(length)]
        assert task.layout == "stretches"
        for example in examples:
            read_stretches(task, example, length)


TINY_MQMTAR = ["--preset", "mqmtar", "--attention", "asentmax", "--seed", "1", "--steps", "3",
               "--device", "cpu", "--batch-size", "4", "--warmup-steps", "1", "--val-every", "3",
               "--val-samples", "2", "--val-multipliers", "1", "--log-every", "1", "--d-model", "32",
               "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]


def test_cli_run_saves_the_layout_and_eval_tests_with_it(tmp_path, one_thread):
    from asentmax.cli import main
    from asentmax.eval import EvalConfig, plan_evaluation
    from asentmax.runs import RunError

    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY_MQMTAR, "--layout", "stretches"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["workload"]["layout"] == "stretches"
    plan = plan_evaluation(run, EvalConfig(multipliers=(1, 2), samples=3, device="cpu"))
    assert plan.task.layout == "stretches"
    for length in plan.lengths:
        for example in make_eval_set(plan.task, length, 3, seed=0):
            read_stretches(plan.task, example, length)
    assert main(["eval", str(run), "--multipliers", "1", "--samples", "2", "--device", "cpu"]) == 0
    assert (run / "eval.md").read_text().splitlines()[0] == "### mqmtar (stretches layout), asentmax (run)"
    # a run saved before the option existed (no layout in config.json or the checkpoint): random
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
    for record in (config["workload"], checkpoint["workload"]):
        del record["layout"]
    (run / "config.json").write_text(json.dumps(config))
    torch.save(checkpoint, run / "checkpoint.pt")
    assert plan_evaluation(run, EvalConfig(multipliers=(1,), samples=3, device="cpu")).task.layout == "random"
    config["workload"]["layout"] = "stretches"  # config.json and the checkpoint disagree
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunError, match="is not the checkpoint of the mqmtar run"):
        plan_evaluation(run, EvalConfig(multipliers=(1,), samples=3, device="cpu"))


def test_compare_labels_a_run_by_its_layout():
    from asentmax.report import method_label

    result = {"model_config": {"attention": "asentmax", "position": "nape"}, "workload": {"task": "mqmtar"}}
    assert method_label(result) == "ASEntmax"  # saved before layouts existed
    result["workload"]["layout"] = "stretches"
    assert method_label(result) == "ASEntmax (stretches layout)"
    result["model_config"]["position"] = "rope"
    assert method_label(result) == "ASEntmax (rope, stretches layout)"


@pytest.mark.parametrize("attention", ["softmax", "asentmax"])
def test_compare_labels_a_run_by_its_block_options(attention):
    """A run in the paper code's setup is labelled by its blocks as well as its layout; a run with only some
    block options changed names those; a config saved before the options existed has default blocks."""
    from dataclasses import asdict

    from asentmax.nn.presets import PAPER_CODE_BLOCKS, mqmtar_model
    from asentmax.report import method_label

    name = {"softmax": "Softmax", "asentmax": "ASEntmax"}[attention]
    paper = asdict(mqmtar_model(263, attention=attention, zero_embedding_id=4, **PAPER_CODE_BLOCKS))
    result = {"model_config": paper, "workload": {"task": "mqmtar", "layout": "stretches"}}
    assert method_label(result) == f"{name} (paper-code blocks, stretches layout)"
    default = asdict(mqmtar_model(263, attention=attention))
    result = {"model_config": default, "workload": {"task": "mqmtar"}}
    assert method_label(result) == name
    old = {key: default[key] for key in ("attention", "position")}  # saved before the block options
    assert method_label({"model_config": old, "workload": {}}) == name
    some = asdict(mqmtar_model(263, attention=attention, norm_placement="sandwich", mlp="geglu"))
    assert method_label({"model_config": some}) == f"{name} (norm_placement sandwich, mlp geglu)"
    zero_init = {**PAPER_CODE_BLOCKS, "asentmax_init": "zero"}
    other_init = asdict(mqmtar_model(263, attention=attention, **zero_init))
    if attention == "asentmax":  # the bundle's init matters to ASEntmax only: named beside the bundle
        assert method_label({"model_config": other_init}) == f"{name} (paper-code blocks, asentmax_init zero)"
        other_init["norm_eps"] = 1e-5  # two options off the bundle: each option off the defaults, by name
        assert method_label({"model_config": other_init}) == (
            f"{name} (norm_placement sandwich, mlp geglu, scale_embeddings True, scaled_residual_init False, "
            "tie_embeddings False)")
    else:
        assert method_label({"model_config": other_init}) == f"{name} (paper-code blocks)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_stretches_batches_are_laid_out_deterministic_and_never_wait_for_the_device():
    task = get_task("mqmtar", layout="stretches")
    buckets = length_buckets(32, 64, 4)
    for batch in synchronisation_free_batches(task, buckets, 512):
        examples = decode_rows(task, batch.to("cpu"))
        for example in examples:
            read_stretches(task, example, row_length(task, buckets, example))
        reference = collate(task, examples)
        assert torch.equal(batch.input_ids[:, : reference.input_ids.shape[1]].cpu(), reference.input_ids)
