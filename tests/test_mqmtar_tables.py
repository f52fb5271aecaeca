"""MQMTAR's fresh word tables (tasks/mqmtar.py `with_fresh_tables`) and `asentmax eval --tables fresh`, which
tests on new key and value tables for every length as the paper's code draws every test set
(results/paper/README.md)."""

import json

import numpy as np
import pytest

from asentmax.tasks import TASK_NAMES, get_task, make_eval_set
from asentmax.tasks.mqmtar import COLON, MQMTARTask
from asentmax.tasks.registry import fresh_tables_refusal, has_fresh_tables
from test_mqmtar_layout import TINY_MQMTAR


def words(table):
    return set(map(tuple, table.tolist()))


def context_words(example):
    """(keys, values) in an example's context (`k1 k2 : v1 v2` around every colon), as sets of words."""
    source = example.source
    colons = [i for i, token in enumerate(source) if token == COLON]
    assert colons
    return ({tuple(source[i - 2:i]) for i in colons}, {tuple(source[i + 1:i + 3]) for i in colons})


@pytest.mark.parametrize("options", [{}, {"layout": "stretches", "table_size": 300, "n_queries": 2}])
def test_fresh_tables_are_new_distinct_words_and_the_task_is_otherwise_the_same(options):
    task = get_task("mqmtar", **options)
    keys, values = task.keys.copy(), task.values.copy()
    fresh = task.with_fresh_tables(np.random.default_rng(5))
    again = task.with_fresh_tables(np.random.default_rng(5))
    other = task.with_fresh_tables(np.random.default_rng(6))
    assert np.array_equal(task.keys, keys) and np.array_equal(task.values, values)  # the task is untouched
    for table, train in ((fresh.keys, keys), (fresh.values, values)):
        assert table.shape == (task.table_size, 2) and len(words(table)) == task.table_size
        assert words(table) != words(train)
        assert table.min() >= 7 and table.max() <= 262  # the alphabet's ids
    assert np.array_equal(again.keys, fresh.keys) and np.array_equal(again.values, fresh.values)
    assert not np.array_equal(other.keys, fresh.keys)
    assert (fresh.layout, fresh.n_queries, fresh.table_size, fresh.vocab_size) == (
        task.layout, task.n_queries, task.table_size, task.vocab_size)
    for example in make_eval_set(fresh, 128, 20, seed=3):  # every word comes from the fresh tables
        sample_keys, sample_values = context_words(example)
        assert sample_keys <= words(fresh.keys) and sample_values <= words(fresh.values)


def test_tasks_without_tables_refuse_fresh_ones():
    with pytest.raises(ValueError, match="has no key and value tables"):
        get_task("reverse").with_fresh_tables(np.random.default_rng(0))
    with pytest.raises(ValueError, match="numpy.random.Generator"):
        get_task("mqmtar").with_fresh_tables(0)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_registry_says_which_tasks_draw_fresh_tables(name):
    assert has_fresh_tables(name) == (name == "mqmtar")
    refusal = fresh_tables_refusal(name)
    assert (refusal is None) == has_fresh_tables(name)
    assert refusal is None or (refusal.startswith("--tables fresh: ") and repr(name) in refusal)
    task = get_task(name)
    if has_fresh_tables(name):
        assert type(task.with_fresh_tables(np.random.default_rng(0))) is type(task)
    else:
        with pytest.raises(ValueError, match="has no key and value tables"):
            task.with_fresh_tables(np.random.default_rng(0))


def test_the_registry_query_refuses_an_unknown_task():
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        has_fresh_tables("nope")


@pytest.fixture
def tiny_mqmtar(tmp_path, one_thread):
    from asentmax.cli import main

    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY_MQMTAR]) == 0
    return run


def test_eval_with_fresh_tables_tests_each_length_on_its_own_tables(tiny_mqmtar, monkeypatch):
    import asentmax.eval as eval_module
    from asentmax.cli import main

    seen = {}
    real = eval_module.greedy_accuracy

    def recording(model, task, examples, **options):
        seen[len(examples[0].source)] = examples
        return real(model, task, examples, **options)

    monkeypatch.setattr(eval_module, "greedy_accuracy", recording)
    args = ["eval", str(tiny_mqmtar), "--multipliers", "1", "2", "--samples", "3", "--seed", "9",
            "--no-progress"]
    assert main([*args, "--tables", "fresh"]) == 0
    result = json.loads((tiny_mqmtar / "eval_fresh.json").read_text())
    assert result["eval_config"]["tables"] == "fresh" and not (tiny_mqmtar / "eval.json").exists()
    assert (tiny_mqmtar / "eval_fresh.md").read_text().splitlines()[0].endswith("(run, fresh tables)")
    task = get_task("mqmtar")
    for row in result["rows"]:
        length = row["length"]
        fresh = task.with_fresh_tables(np.random.default_rng([9, length, eval_module.TABLES_STREAM]))
        examples = seen[task.source_length(length)]
        assert examples == make_eval_set(fresh, length, 3, seed=9)
        assert examples != make_eval_set(task, length, 3, seed=9)
    fresh_rows = result["rows"]
    seen.clear()
    assert main(args) == 0  # the run's tables: eval.json, other examples
    assert json.loads((tiny_mqmtar / "eval.json").read_text())["eval_config"]["tables"] == "train"
    assert seen[task.source_length(64)] == make_eval_set(task, 64, 3, seed=9)
    # a re-run continues its own file: nothing is decoded again
    seen.clear()
    assert main([*args, "--tables", "fresh"]) == 0
    assert seen == {} and json.loads((tiny_mqmtar / "eval_fresh.json").read_text())["rows"] == fresh_rows


def test_planning_an_evaluation_on_fresh_tables_draws_none(tiny_mqmtar, monkeypatch):
    from asentmax.eval import EvalConfig, plan_evaluation

    def refuse(self, rng):
        raise AssertionError("plan_evaluation drew tables")

    monkeypatch.setattr(MQMTARTask, "with_fresh_tables", refuse)  # still MQMTAR's own: it has tables
    plan = plan_evaluation(tiny_mqmtar, EvalConfig(multipliers=(1,), samples=2, tables="fresh"))
    assert plan.output.name == "eval_fresh"


def test_an_eval_file_from_before_the_option_continues_as_the_runs_tables(tiny_mqmtar):
    from asentmax.cli import main

    args = ["eval", str(tiny_mqmtar), "--multipliers", "1", "--samples", "2", "--no-progress"]
    assert main(args) == 0
    path = tiny_mqmtar / "eval.json"
    old = json.loads(path.read_text())
    del old["protocol"]["tables"], old["eval_config"]["tables"]
    path.write_text(json.dumps(old))
    assert main([*args, "--multipliers", "1", "2"]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [row["length"] for row in rows] == [64, 128] and rows[0] == old["rows"][0]  # 1x kept, 2x added


def test_fresh_tables_for_a_task_without_tables_is_a_one_line_error(tmp_path, one_thread, capsys):
    from asentmax.cli import main
    from test_eval import TINY_RUN

    run = tmp_path / "reverse"
    assert main(["train", "--run-dir", str(run), *TINY_RUN]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--tables", "fresh", "--samples", "2", "--no-progress"]) != 0
    error = capsys.readouterr().err.strip()
    assert error == f"asentmax eval: error: {fresh_tables_refusal('reverse')}"  # reproduce_paper's too
    assert main(["eval", str(run), "--tables", "new", "--samples", "2", "--no-progress"]) != 0
    assert "invalid choice: 'new' (choose from 'train', 'fresh')" in capsys.readouterr().err
