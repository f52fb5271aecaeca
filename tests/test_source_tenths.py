"""Answers scored by where their source sits (Task.answer_sources, eval's source_tenth_accuracy): every
task's source indices point at the token the answer copies (MQMTAR: the value after the queried key's colon,
in both layouts and on fresh tables), and the per-tenth accuracy of greedy decoding equals a brute-force
count over stub models that get chosen answer tokens wrong."""

import numpy as np
import pytest

from asentmax.eval import SOURCE_PARTS, evaluate, greedy_accuracy, markdown_table
from asentmax.tasks import EOS, get_task, make_eval_set
from asentmax.tasks.mqmtar import COLON, QUERY
from test_eval import StubModel, _wrong


@pytest.mark.parametrize("name, lengths", [("copy", [1, 7, 64]), ("reverse", [1, 2, 33, 512]),
                                           ("mqmtar", [6, 13, 64, 1024])])
def test_answer_sources_point_at_the_copied_token(name, lengths):
    task = get_task(name)
    rng = np.random.default_rng(3)
    for length in lengths:
        for _ in range(20):
            example = task.sample(length, rng)
            sources = task.answer_sources(example)
            assert len(sources) == len(example.target)
            for i, (position, token) in enumerate(zip(sources, example.target, strict=True)):
                if name == "mqmtar" and i % 3 == 0:
                    assert position is None and token == QUERY
                    continue
                assert 0 <= position < len(example.source) and example.source[position] == token
    assert get_task("sort").answer_sources(get_task("sort").sample(9, rng)) is None


@pytest.mark.parametrize("layout, fresh", [("random", False), ("stretches", False), ("random", True)])
def test_mqmtar_sources_follow_the_queried_key(layout, fresh):
    task = get_task("mqmtar", layout=layout)
    if fresh:
        task = task.with_fresh_tables(np.random.default_rng(11))
    rng = np.random.default_rng(5)
    for length in (64, 300, 2048):
        example = task.sample(length, rng)
        source = example.source
        queries = np.asarray(source[len(source) - 3 * task.n_queries:]).reshape(task.n_queries, 3)
        sources = task.answer_sources(example)
        for j, query in enumerate(queries):
            value = sources[3 * j + 1]
            assert sources[3 * j + 2] == value + 1
            assert source[value - 1] == COLON and source[value - 3:value - 1] == list(query[1:])
            assert value + 1 < len(source) - 3 * task.n_queries  # inside the context, not the queries


def _brute_force_tenths(task, examples, answers):
    """Per tenth of the source: (hits, answer tokens) counted one token at a time."""
    hits, totals = [0] * SOURCE_PARTS, [0] * SOURCE_PARTS
    for example in examples:
        answer = answers.get(tuple(example.source), [*example.target, EOS])
        sources = task.answer_sources(example)
        for position, expected, got in zip(sources, example.target, answer[:-1], strict=True):
            if position is None:
                continue
            part = int(SOURCE_PARTS * position / len(example.source))
            hits[part] += int(expected == got)
            totals[part] += 1
    return [h / t if t else None for h, t in zip(hits, totals, strict=True)]


@pytest.mark.parametrize("name, lengths", [("reverse", [3, 10, 27]), ("copy", [40]), ("mqmtar", [64, 200])])
def test_source_tenth_accuracy_equals_a_brute_force_count(name, lengths):
    task = get_task(name)
    examples = [e for length in lengths for e in make_eval_set(task, length, 12, seed=2)]
    rng = np.random.default_rng(0)
    corrupt = {}
    for example in examples[::2]:  # every other example: a random third of its answer tokens wrong
        answer = [*example.target, EOS]
        for i in np.flatnonzero(rng.random(len(answer)) < 1 / 3):
            answer[i] = _wrong(answer[i], task)
        corrupt[tuple(example.source)] = answer
    scores = greedy_accuracy(StubModel(task, examples, corrupt), task, examples, device="cpu", batch_size=5)
    expected = _brute_force_tenths(task, examples, corrupt)
    assert len(scores["source_tenth_accuracy"]) == SOURCE_PARTS
    for got, want in zip(scores["source_tenth_accuracy"], expected, strict=True):
        assert (got is None and want is None) or got == pytest.approx(want)
    assert any(value is not None and value < 1 for value in scores["source_tenth_accuracy"])


def test_reverse_errors_on_the_first_tenth_land_in_the_first_column():
    task = get_task("reverse")
    examples = make_eval_set(task, 50, 8, seed=1)
    # reverse: target index i copies source index 49 - i: the last 5 target tokens come from the first tenth
    corrupt = {tuple(e.source): [*e.target[:45], *(_wrong(t, task) for t in e.target[45:]), EOS]
               for e in examples}
    scores = greedy_accuracy(StubModel(task, examples, corrupt), task, examples, device="cpu")
    assert scores["source_tenth_accuracy"] == [0.0] + [1.0] * (SOURCE_PARTS - 1)
    assert scores["token_accuracy"] == pytest.approx(46 / 51)  # 45 + EOS right of 51


def test_sort_has_no_source_tenths_and_the_table_shows_them_only_when_measured():
    task = get_task("sort")
    examples = make_eval_set(task, 12, 6, seed=0)
    scores = greedy_accuracy(StubModel(task, examples), task, examples, device="cpu")
    assert "source_tenth_accuracy" not in scores
    reverse = get_task("reverse")
    known = [e for n in (10, 20) for e in make_eval_set(reverse, n, 4, seed=9)]
    printed = []
    rows = evaluate(StubModel(reverse, known), reverse, [10, 20], samples=4, seed=9, device="cpu",
                    log=printed.append)
    assert sum("by the tenth of the source" in line for line in printed) == 2
    assert all(row["source_tenth_accuracy"] == [1.0] * SOURCE_PARTS for row in rows)
    text = markdown_table(rows, 10, "reverse")
    assert "by where in the source" in text
    assert "| 20 | " + " | ".join(["100.0"] * SOURCE_PARTS) + " |" in text
    old_row = {key: value for key, value in rows[0].items() if key != "source_tenth_accuracy"}
    assert "by where in the source" not in markdown_table([old_row], 10, "reverse")
