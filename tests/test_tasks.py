"""Tests of the task protocol (asentmax.tasks, docs/method.md section 6) common to every task:
formats, lengths, determinism, vocabulary bounds, encode layout, eval sets, JSONL, bad arguments."""

import json

import numpy as np
import pytest

from asentmax.tasks import (
    BOS,
    EOS,
    FIRST_SYMBOL,
    PAD,
    SEP,
    TASK_NAMES,
    Example,
    Task,
    get_task,
    load_jsonl,
    make_eval_set,
    save_jsonl,
)

LENGTHS = [1, 2, 3, 5, 6, 7, 17, 32, 63, 64, 111, 130]


def lengths_for(task):
    return [n for n in LENGTHS if n >= task.min_length] + [task.min_length, 1000]


@pytest.mark.parametrize("name", TASK_NAMES)
def test_format_lengths_and_vocab(name):
    task = get_task(name)
    assert task.name == name and isinstance(task, Task)
    rng = np.random.default_rng(0)
    for length in lengths_for(task):
        for _ in range(3):
            example = task.sample(length, rng)
            assert isinstance(example, Example)
            assert len(example.source) == task.source_length(length)
            assert len(example.target) >= 1
            for token in example.source + example.target:
                assert type(token) is int
                assert FIRST_SYMBOL <= token < task.vocab_size  # no specials inside source/target


@pytest.mark.parametrize("name", TASK_NAMES)
def test_vocab_size_independent_of_length(name):
    task = get_task(name)
    rng = np.random.default_rng(1)
    long = task.sample(5000, rng)
    assert max(long.source + long.target) < task.vocab_size == get_task(name).vocab_size


SEQUENCE_TASKS = [name for name in TASK_NAMES if not get_task(name).tagging]
TAGGING_TASKS = [name for name in TASK_NAMES if get_task(name).tagging]


def test_the_paper_codes_token_classification_tasks_are_the_tagging_ones():
    """Local count and 2-back are token classification in the paper's code (TokenClassificationFromFiles in
    synthetic/configs/data/local_count.yaml and nback.yaml); every other task is source -> target."""
    assert sorted(TAGGING_TASKS) == ["local_count", "two_back"]


@pytest.mark.parametrize("name", TAGGING_TASKS)
def test_tagging_layout(name):
    task = get_task(name)
    example = task.sample(17, np.random.default_rng(2))
    inputs, labels = task.inputs_and_labels(example)
    assert inputs == [BOS, *example.source]  # no <sep>, no target tokens among the inputs
    assert labels == [-100, *example.target]  # source token i is labelled with target[i] at its own position
    with pytest.raises(ValueError, match="labels its source tokens one by one"):
        task.encode(example)
    with pytest.raises(ValueError, match="one target token per source token"):
        task.inputs_and_labels(Example(source=example.source, target=example.target[:-1]))


@pytest.mark.parametrize("name", SEQUENCE_TASKS)
def test_inputs_and_labels_of_a_sequence_task_are_the_next_tokens_of_encode(name):
    task = get_task(name)
    example = task.sample(max(17, task.min_length), np.random.default_rng(3))
    tokens, mask = task.encode(example)
    inputs, labels = task.inputs_and_labels(example)
    assert inputs == tokens[:-1]
    assert labels == [tokens[i + 1] if mask[i] else -100 for i in range(len(tokens) - 1)]


@pytest.mark.parametrize("name", SEQUENCE_TASKS)
def test_encode_layout_and_mask(name):
    task = get_task(name)
    example = task.sample(max(17, task.min_length), np.random.default_rng(2))
    tokens, mask = task.encode(example)
    n_src, n_tgt = len(example.source), len(example.target)
    assert tokens == [BOS] + example.source + [SEP] + example.target + [EOS]
    assert len(mask) == len(tokens)
    # the loss is taken exactly where the next token is a target token or EOS
    predicted = [tokens[i + 1] for i in range(len(tokens) - 1) if mask[i]]
    assert predicted == example.target + [EOS]
    assert sum(mask) == n_tgt + 1 and not mask[-1] and mask[n_src + 1] and not mask[n_src]
    assert PAD not in tokens
    assert task.decode_tokens(tokens).split()[0] == "<bos>"
    assert len(task.decode_tokens(tokens).split()) == len(tokens)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_determinism_and_seeds_differ(name):
    task = get_task(name)
    length = max(64, task.min_length)
    a = make_eval_set(task, length, 8, seed=3)
    b = make_eval_set(name, length, 8, seed=3)
    c = make_eval_set(task, length, 8, seed=4)
    assert a == b
    assert a != c
    assert make_eval_set(task, length, 3, seed=3) == a[:3]  # prefix property
    rng1, rng2 = np.random.default_rng(9), np.random.default_rng(9)
    assert task.sample(length, rng1) == task.sample(length, rng2)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_jsonl_round_trip(tmp_path, name):
    task = get_task(name)
    examples = make_eval_set(task, max(33, task.min_length), 5, seed=0)
    path = tmp_path / f"{name}.jsonl"
    save_jsonl(path, examples)
    lines = path.read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0]) == examples[0].to_dict()
    assert load_jsonl(path) == examples
    save_jsonl(path, [])
    assert load_jsonl(path) == []


def test_load_jsonl_rejects_malformed(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"source": [4, 5], "target": [4]}\n{"source": [4], "target": "x"}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_jsonl(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="line 1"):
        load_jsonl(path)


def test_unknown_task_name():
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task("nope")
    with pytest.raises(ValueError, match="unknown task"):
        make_eval_set("nope", 64, 1, 0)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_bad_lengths_and_counts(name):
    task = get_task(name)
    rng = np.random.default_rng(0)
    for bad in (task.min_length - 1, -5):
        with pytest.raises(ValueError, match="too small"):
            task.sample(bad, rng)
        with pytest.raises(ValueError, match="too small"):
            make_eval_set(task, bad, 1, 0)
    with pytest.raises(ValueError, match="must be an int"):
        task.sample(64.0, rng)
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        make_eval_set(task, 64, -1, 0)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        make_eval_set(task, 64, 1, -1)
    with pytest.raises(ValueError, match="Generator"):
        task.sample(64, 0)
    assert make_eval_set(task, 64, 0, 0) == []


@pytest.mark.parametrize("name", TASK_NAMES)
def test_decode_rejects_out_of_range(name):
    task = get_task(name)
    with pytest.raises(ValueError, match="outside"):
        task.decode_tokens([task.vocab_size])


def test_package_docstring_table_is_true():
    """The vocab / source-length table in asentmax.tasks' docstring matches the tasks."""
    import asentmax.tasks

    rows = [line.split("|")[1:-1] for line in asentmax.tasks.__doc__.splitlines() if line.startswith("| ")]
    rows = {cells[0].strip(): cells for cells in rows[1:]}
    assert set(rows) == set(TASK_NAMES)
    for name, (_, vocab, source_length, *_) in rows.items():
        task = get_task(name)
        assert int(vocab) == task.vocab_size
        for length in (64, 1000):
            expected = eval(source_length.strip(), {"length": length})  # e.g. "length + 12"
            drawn = task.sample(length, np.random.default_rng(0))
            assert task.source_length(length) == expected == len(drawn.source)
