"""MQMTAR's planted look-alikes (MQMTARTask `lookalikes`, `asentmax train --lookalikes`): with share r, one
look-alike of a queried key per sample in that share of the training samples (a key sharing its first or its
second token, or its word as another pair's value), found back by query_collisions against a brute force; the
answers stay right and the keys distinct; off (0) the sample stream is the paper's, unchanged; the device
sampler plants the same law (two-sample chi-square tests); the training workload plants them in its
batches only, never in validation or `asentmax eval`; other tasks and shares outside [0, 1] are refused in
one line."""

import json

import numpy as np
import pytest
import torch

from asentmax.tasks import get_task, make_eval_set
from asentmax.tasks.device_sampling import DeviceBatchSampler
from asentmax.tasks.mqmtar import COLON, QUERY, MQMTARTask
from asentmax.tasks.workload import TaskWorkload
from test_device_sampling import assert_same_law, decode_rows
from test_mqmtar_collisions import brute_force
from test_tasks_solvers import parse_mqmtar


def kind_of(task, example):
    """0-7: which look-alikes the sample holds (bit 0: a key sharing a queried key's first token, bit 1: its
    second, bit 2: a queried word as a value), from query_collisions, checked against the brute force."""
    counts = task.query_collisions(example)
    assert counts == brute_force(task, example)
    first, second, value = (any(c[k] for c in counts) for k in range(3))
    return first + 2 * second + 4 * value


def check_answers(task, example):
    """Keys distinct, and the target is what the context says each queried key maps to."""
    length = len(example.source) - 3 * task.n_queries
    pairs, _, asked = parse_mqmtar(example.source, length, task.n_queries)
    context = np.asarray(example.source[:length])
    assert len(pairs) == int((context == COLON).sum())  # no key repeats (a dict would drop one)
    assert example.target == [t for key in asked for t in (QUERY, *pairs[key])]


@pytest.mark.parametrize("layout", ["random", "stretches"])
def test_planted_lookalikes_follow_the_share_and_keep_the_answers(layout):
    plain, planted = get_task("mqmtar", layout=layout), get_task("mqmtar", layout=layout, lookalikes=0.6)
    rng = np.random.default_rng(0)
    kinds = np.bincount([kind_of(planted, planted.sample(64, rng)) for _ in range(3000)], minlength=8)
    natural = np.bincount([kind_of(plain, plain.sample(64, rng)) for _ in range(3000)], minlength=8)
    share, natural_share = kinds / kinds.sum(), natural / natural.sum()
    assert natural_share[0] > 0.8  # the paper's samples rarely hold one at 8 pairs
    # none planted: a sample without the planting (1 - r) that holds none by chance (a clash skips ~1e-4)
    assert abs(share[0] - 0.4 * natural_share[0]) < 0.04
    for bit in (1, 2, 4):  # each kind planted in a third of the planted samples, or there by chance
        held, by_chance = (sum(s[k] for k in range(8) if k & bit) for s in (share, natural_share))
        assert abs(held - (1 - (1 - 0.6 / 3) * (1 - by_chance))) < 0.04, (bit, held, by_chance)
    for _ in range(200):
        check_answers(planted, planted.sample(int(rng.integers(32, 65)), rng))


@pytest.mark.parametrize("kinds", [("value",), ("first", "second")])
def test_only_the_chosen_kinds_are_planted(kinds):
    task = get_task("mqmtar", lookalikes=0.6, lookalike_kinds=kinds)
    plain = get_task("mqmtar")
    rng = np.random.default_rng(2)
    share = np.bincount([kind_of(task, task.sample(64, rng)) for _ in range(3000)], minlength=8) / 3000
    natural = np.bincount([kind_of(plain, plain.sample(64, rng)) for _ in range(3000)], minlength=8) / 3000
    for bit, kind in ((1, "first"), (2, "second"), (4, "value")):
        held, by_chance = (sum(s[k] for k in range(8) if k & bit) for s in (share, natural))
        planted = 0.6 / len(kinds) if kind in kinds else 0.0
        assert abs(held - (1 - (1 - planted) * (1 - by_chance))) < 0.04, (kind, held, by_chance)
    for _ in range(100):
        check_answers(task, task.sample(int(rng.integers(32, 65)), rng))


def test_the_kinds_have_one_order():
    """Every kind (the default) draws the stream the option drew before it had kinds; the kinds' order does
    not change the samples."""
    streams = [make_eval_set(get_task("mqmtar", lookalikes=0.5, **options), 64, 30, 4)
               for options in ({}, {"lookalike_kinds": ("value", "first", "second")})]
    assert [(e.source, e.target) for e in streams[0]] == [(e.source, e.target) for e in streams[1]]
    assert get_task("mqmtar", lookalike_kinds=["value", "first"]).lookalike_kinds == ("first", "value")


def test_off_the_stream_is_the_papers():
    """lookalikes=0 draws nothing more: the same samples as the task without the option (committed test
    sets depend on it); at 1 every sample holds a look-alike."""
    for layout in ("random", "stretches"):
        plain = make_eval_set(get_task("mqmtar", layout=layout), 256, 20, 3)
        again = make_eval_set(get_task("mqmtar", layout=layout, lookalikes=0.0), 256, 20, 3)
        assert [(e.source, e.target) for e in plain] == [(e.source, e.target) for e in again]
    always = make_eval_set(get_task("mqmtar", lookalikes=1.0), 64, 50, 3)
    task = get_task("mqmtar")
    assert sum(kind_of(task, e) != 0 for e in always) >= 45  # every sample planted (a clash skips one)


def test_a_single_pair_has_nothing_to_plant():
    task = get_task("mqmtar", lookalikes=1.0, n_queries=1)
    rng = np.random.default_rng(1)
    for _ in range(20):
        example = task.sample(6, rng)  # one block
        assert task.query_collisions(example) == [(0, 0, 0)]


def test_the_device_sampler_plants_the_same_law():
    task = get_task("mqmtar", lookalikes=0.6)
    rng = np.random.default_rng(0)
    cpu = [kind_of(task, task.sample(64, rng)) for _ in range(2500)]
    sampler = DeviceBatchSampler(task, [(64, 64)], "cpu")
    device_rows = [e for step in range(5) for e in decode_rows(task, sampler.batch(seed=0, rank=0, step=step,
                                                                                   batch_size=500))]
    for example in device_rows[:300]:
        check_answers(task, example)
    device = [kind_of(task, e) for e in device_rows]
    assert_same_law(np.bincount(cpu, minlength=8), np.bincount(device, minlength=8), "planted look-alikes")


def test_the_device_sampler_plants_the_chosen_kinds_by_the_same_law():
    task = get_task("mqmtar", lookalikes=0.6, lookalike_kinds=("second", "value"))
    rng = np.random.default_rng(3)
    cpu = [kind_of(task, task.sample(64, rng)) for _ in range(2500)]
    sampler = DeviceBatchSampler(task, [(64, 64)], "cpu")
    device = [kind_of(task, e) for step in range(5) for e in decode_rows(
        task, sampler.batch(seed=1, rank=0, step=step, batch_size=500))]
    assert_same_law(np.bincount(cpu, minlength=8), np.bincount(device, minlength=8), "chosen kinds")


def test_the_workload_plants_in_training_batches_only(tmp_path):
    workload = TaskWorkload(task="mqmtar", lookalikes=1.0, val_multipliers=(1,), val_samples=40)
    batches = workload.batches(seed=0, start_step=0, rank=0, world_size=1, local_batch_size=64,
                               device=torch.device("cpu"))
    trained = decode_rows(workload.task_object, next(batches))
    task = get_task("mqmtar")
    assert sum(kind_of(task, e) != 0 for e in trained) >= 55
    assert workload.task_object.lookalikes == 0.0  # what validate draws from (and eval builds the same)
    validation = make_eval_set(workload.task_object, 64, 40, seed=1)
    assert [e.source for e in validation] == [e.source for e in make_eval_set(task, 64, 40, seed=1)]
    assert workload.to_dict()["lookalikes"] == 1.0
    assert TaskWorkload.from_dict({k: v for k, v in workload.to_dict().items()
                                   if k not in ("lookalikes", "lookalike_kinds")}
                                  ).lookalikes == 0.0  # runs saved before the option: none planted
    value_only = TaskWorkload(task="mqmtar", lookalikes=0.5, lookalike_kinds=("value",))
    saved = json.loads(json.dumps(value_only.to_dict()))  # as config.json holds it
    assert TaskWorkload.from_dict(saved).training_task.lookalike_kinds == ("value",)
    assert workload.training_task.lookalike_kinds == ("first", "second", "value")  # none given: every kind
    assert MQMTARTask(lookalikes=0.1, lookalike_kinds=()).lookalike_kinds == ("first", "second", "value")


@pytest.mark.parametrize("options, message", [
    (dict(task="copy", lookalikes=0.5), "--lookalikes: task 'copy' has no keys to plant look-alikes of"),
    (dict(task="mqmtar", lookalikes=1.5), "lookalikes must be a share in [0, 1], got 1.5"),
    (dict(task="mqmtar", lookalikes=-0.1), "lookalikes must be a share in [0, 1], got -0.1"),
    (dict(task="mqmtar", lookalike_kinds=("value",)),
     "--lookalike-kinds: only with --lookalikes (a share of samples above 0)"),
    (dict(task="mqmtar", lookalikes=0.1, lookalike_kinds=("word",)),
     "lookalike_kinds must be distinct kinds among first, second, value, got ('word',)"),
    (dict(task="mqmtar", lookalikes=0.1, lookalike_kinds=("value", "value")),
     "lookalike_kinds must be distinct kinds among first, second, value, got ('value', 'value')"),
])
def test_refusals(options, message):
    with pytest.raises(ValueError) as error:
        TaskWorkload(**options)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_compare_names_the_share():
    from asentmax.report import method_label

    result = {"model_config": {"attention": "asentmax", "position": "nape"},
              "workload": {"task": "mqmtar", "layout": "stretches", "lookalikes": 0.25}}
    assert method_label(result) == "ASEntmax (stretches layout, look-alikes 0.25)"
    result["workload"]["lookalike_kinds"] = ["value"]
    assert method_label(result) == "ASEntmax (stretches layout, value look-alikes 0.25)"
    result["workload"] = {"task": "mqmtar"}  # saved before the option, or 0
    assert method_label(result) == "ASEntmax"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_planting_never_waits_for_the_device():
    from test_device_sampling import BUCKETS, synchronisation_free_batches

    task = get_task("mqmtar", lookalikes=0.5)
    for batch in synchronisation_free_batches(task, BUCKETS, 64):
        for example in decode_rows(task, batch.to("cpu")):
            check_answers(task, example)
