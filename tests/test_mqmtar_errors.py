"""benchmarks/mqmtar_errors.py: each MQMTAR answer is classed correct / other_value (another key's value pair,
with the shared key tokens and the distance to it) / half / other, with its query index, key tenth, repeated
key and earlier-error flags, all checked against what the example itself says; an end-to-end run on a tiny
CPU run agrees with a re-scoring of the same greedy answers and with `asentmax eval`; planted look-alikes and
`--tables fresh` change the test sets it decodes; a run that is not an MQMTAR run, or no run at all, is
refused on one line with exit code 2."""

import json

import numpy as np
import pytest
import torch

from asentmax.cli import main as asentmax
from asentmax.tasks import EOS, get_task
from asentmax.tasks.mqmtar import BLANK, COLON
from conftest import load_benchmark
from test_eval import StubModel

errors = load_benchmark("mqmtar_errors")

TINY = ["--device", "cpu", "--steps", "3", "--batch-size", "4", "--warmup-steps", "1", "--val-every", "0",
        "--log-every", "1", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
        "--no-progress"]
TINY_MQMTAR = ["--task", "mqmtar", "--preset", "mqmtar", "--attention", "asentmax", "--seed", "1", *TINY]


def blocks(example, task):
    """{key: (key start, value)} of the example's context, read by finding its colons."""
    context = example.source[:len(example.source) - 3 * task.n_queries]
    colons = [i for i, token in enumerate(context) if token == COLON]
    return {tuple(context[c - 2:c]): (c - 2, tuple(context[c + 1:c + 3])) for c in colons}


def queried_keys(example, task):
    queries = example.source[len(example.source) - 3 * task.n_queries:]
    return [tuple(queries[3 * j + 1:3 * j + 3]) for j in range(task.n_queries)]


def answer(example):
    return [*example.target, EOS]


def test_the_true_target_is_all_correct_with_each_querys_place():
    task = get_task("mqmtar")
    rng = np.random.default_rng(0)
    for length in (64, 300):
        for _ in range(10):
            example = task.sample(length, rng)
            records = errors.classify_answers(task, example, answer(example))
            keys, pairs = queried_keys(example, task), blocks(example, task)
            context_length = len(example.source) - 3 * task.n_queries
            assert [r["class"] for r in records] == ["correct"] * task.n_queries
            assert [r["query_index"] for r in records] == list(range(task.n_queries))
            assert [r["key_tenth"] for r in records] == [10 * pairs[k][0] // context_length for k in keys]
            assert [r["repeated_key"] for r in records] == [keys.count(k) > 1 for k in keys]
            assert not any(r["earlier_wrong"] for r in records)
            lookalike = [any(o != k and (o[0] == k[0] or o[1] == k[1]) for o in pairs) for k in keys]
            assert [r["key_has_lookalike"] for r in records] == lookalike


def test_a_key_also_written_as_a_value_is_flagged():
    """At 1,024x (8,738 pairs) about 4 in 10 samples ask a key whose word is another pair's value; the flag
    says so for exactly those queries, read back by scanning the context's values."""
    task = get_task("mqmtar")
    rng = np.random.default_rng(5)
    flagged = 0
    for _ in range(6):
        example = task.sample(65536, rng)
        values = {value for _, value in blocks(example, task).values()}
        records = errors.classify_answers(task, example, answer(example))
        assert [r["key_is_a_value"] for r in records] == [k in values for k in queried_keys(example, task)]
        flagged += sum(r["key_is_a_value"] for r in records)
    assert flagged > 0  # both ways
    summary = errors.summarise(records)
    assert [group["value"] for group in summary["by"]["key_is_a_value"]] == sorted(
        {r["key_is_a_value"] for r in records})


def test_another_keys_value_pair_is_other_value_with_its_key_tokens_and_distance():
    task = get_task("mqmtar")
    rng = np.random.default_rng(1)
    shared_seen = 0
    for _ in range(30):
        example = task.sample(300, rng)  # 40 pairs
        pairs = blocks(example, task)
        key = queried_keys(example, task)[0]
        right_start = pairs[key][0]
        starts = sorted(start for start, _ in pairs.values())
        for other, (start, value) in pairs.items():
            if other == key:
                continue
            predicted = answer(example)
            predicted[1:3] = value
            first, *rest = errors.classify_answers(task, example, predicted)
            assert first["class"] == "other_value"
            assert first["shares_first"] == (other[0] == key[0])
            assert first["shares_second"] == (other[1] == key[1])
            assert first["distance"] == start - right_start
            assert first["pair_offset"] == starts.index(start) - starts.index(right_start)
            assert all(r["class"] == "correct" and r["earlier_wrong"] for r in rest)
            shared_seen += first["shares_first"] or first["shares_second"]
    assert shared_seen > 0  # the flags were tested both ways


def test_one_value_token_wrong_is_half_and_garbage_is_other():
    task = get_task("mqmtar")
    example = task.sample(64, np.random.default_rng(2))
    for position in (1, 2):  # the first query's first, then second value token
        predicted = answer(example)
        predicted[position] = BLANK  # never a value token: no pair holds it
        classes = [r["class"] for r in errors.classify_answers(task, example, predicted)]
        assert classes == ["half"] + ["correct"] * (task.n_queries - 1)
    garbage = [BLANK] * len(answer(example))
    assert [r["class"] for r in errors.classify_answers(task, example, garbage)] == ["other"] * task.n_queries
    wrong_marker = answer(example)
    wrong_marker[0] = BLANK  # the values right, the query marker not
    records = errors.classify_answers(task, example, wrong_marker)
    assert records[0]["class"] == "other" and not records[0]["marker_right"]
    assert all(r["marker_right"] for r in records[1:])


def test_an_earlier_wrong_answer_flags_only_the_later_queries():
    task = get_task("mqmtar")
    example = task.sample(64, np.random.default_rng(3))
    predicted = answer(example)
    predicted[3:6] = [BLANK] * 3  # the second query's answer
    records = errors.classify_answers(task, example, predicted)
    assert [r["class"] for r in records] == ["correct", "other", "correct", "correct"]
    assert [r["earlier_wrong"] for r in records] == [False, False, True, True]


def test_greedy_answers_come_back_in_the_order_of_the_examples():
    from asentmax.tasks import make_eval_set

    task = get_task("mqmtar")
    examples = make_eval_set(task, 64, 5, seed=0) + make_eval_set(task, 128, 4, seed=0)  # two prompt shapes
    corrupt = {tuple(e.source): [BLANK] * len(answer(e)) for e in examples[1::3]}
    model = StubModel(task, examples, corrupt)
    got = errors.greedy_answers(model, examples, device="cpu", autocast_dtype=None, batch_size=2,
                                max_batch_tokens=10**6)
    assert got == [corrupt.get(tuple(e.source), answer(e)) for e in examples]
    assert len(model.shapes) == 5  # batches of at most 2, per prompt shape: 3 + 2


def rescored(plan, length, samples):
    """(samples exactly right with EOS, {class: count}) of the same greedy answers, decoded
    here in one batch per length and scored token by token."""
    from asentmax.nn import Transformer
    from asentmax.tasks import make_eval_set
    from asentmax.tasks.base import BOS, SEP

    model = Transformer(plan.model_config)
    model.load_state_dict(plan.model_state)
    model.eval()
    examples = make_eval_set(plan.task, length, samples, plan.config.seed)
    prompts = torch.tensor([[BOS, *e.source, SEP] for e in examples])
    with torch.no_grad():
        out = model.generate(prompts, len(examples[0].target) + 1, temperature=0.0)[:, prompts.shape[1]:]
    counts = dict.fromkeys(errors.CLASSES, 0)
    exact = 0
    for example, row in zip(examples, out.tolist(), strict=True):
        values = {value for _, value in blocks(example, plan.task).values()}
        right = []
        for j in range(plan.task.n_queries):
            got, want = row[3 * j:3 * j + 3], example.target[3 * j:3 * j + 3]
            right.append(got == want)
            if got == want:
                counts["correct"] += 1
            elif tuple(got[1:]) in values and got[1:] != want[1:]:
                counts["other_value"] += 1
            elif (got[1] == want[1]) != (got[2] == want[2]):
                counts["half"] += 1
            else:
                counts["other"] += 1
        exact += all(right) and row[-1] == EOS
    return exact, counts


def test_end_to_end_counts_add_up_and_agree_with_a_rescoring(tmp_path, capsys, one_thread):
    from asentmax.eval import EvalConfig

    run, out = tmp_path / "run", tmp_path / "out"
    assert asentmax(["train", "--run-dir", str(run), *TINY_MQMTAR]) == 0
    assert errors.main([str(run), "--multipliers", "1", "2", "--samples", "6", "--device", "cpu",
                        "--out", str(out)]) == 0
    result = json.loads((out / "mqmtar_errors.json").read_text())
    assert result["run_dir"] == str(run) and result["checkpoint_step"] == 3
    assert result["command"].startswith("PYTHONPATH=src python benchmarks/mqmtar_errors.py ")
    assert [row["length"] for row in result["rows"]] == [64, 128]
    assert asentmax(["eval", str(run), "--multipliers", "1", "2", "--samples", "6", "--device", "cpu",
                     "--no-progress"]) == 0
    evaluated = {row["length"]: row for row in json.loads((run / "eval.json").read_text())["rows"]}
    plan = errors.plan_analysis(run, EvalConfig(multipliers=(1, 2), samples=6, device="cpu"), out)
    for row in result["rows"]:
        counts = row["classes"]
        assert counts["n"] == 6 * 4 == sum(counts[name] for name in errors.CLASSES)
        for field in errors.GROUPINGS:
            assert sum(group["n"] for group in row["by"][field]) == 6 * 4
        exact, rescored_counts = rescored(plan, row["length"], 6)
        assert {name: counts[name] for name in errors.CLASSES} == rescored_counts
        assert evaluated[row["length"]]["n_exact"] == exact
    text = (out / "mqmtar_errors.md").read_text()
    assert "### length 64 (1x): 6 samples, 24 answers" in text and "| correct |" in text
    capsys.readouterr()


@pytest.mark.parametrize("case", ["reverse run", "missing run"])
def test_a_run_that_is_not_mqmtar_or_missing_is_refused_on_one_line(tmp_path, capsys, case, one_thread):
    run = tmp_path / "run"
    if case == "reverse run":
        assert asentmax(["train", "--run-dir", str(run), "--task", "reverse", "--min-length", "3",
                         "--max-length", "6", *TINY]) == 0
        capsys.readouterr()
    assert errors.main([str(run), "--samples", "2", "--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("mqmtar_errors: error: ")
    assert ("not an MQMTAR run" if case == "reverse run" else "does not exist") in err
    assert not (tmp_path / "out").exists()


def test_lookalike_probe_draws_planted_test_sets(tmp_path, capsys, one_thread):
    """--lookalikes 1: every sample of the probe holds a planted look-alike (the groupings see them), the
    result and its markdown say so; a share outside [0, 1] is refused on one line before any decoding."""
    run, out = tmp_path / "run", tmp_path / "out"
    assert asentmax(["train", "--run-dir", str(run), *TINY_MQMTAR]) == 0
    assert errors.main([str(run), "--samples", "8", "--device", "cpu", "--lookalikes", "1",
                        "--out", str(out)]) == 0
    result = json.loads((out / "mqmtar_errors.json").read_text())
    (row,) = result["rows"]
    assert result["lookalikes"] == 1.0
    flagged = {field: sum(g["n"] for g in row["by"][field] if g["value"])
               for field in ("key_has_lookalike", "key_is_a_value")}
    assert flagged["key_has_lookalike"] + flagged["key_is_a_value"] >= 8  # each sample's query, at least
    assert "planted look-alikes (first, second, value) in 100 % of the samples" in (
        out / "mqmtar_errors.md").read_text()
    assert errors.main([str(run), "--samples", "8", "--device", "cpu", "--lookalikes", "1",
                        "--lookalike-kinds", "value", "--out", str(out)]) == 0
    result = json.loads((out / "mqmtar_errors.json").read_text())
    assert result["lookalike_kinds"] == ["value"]
    (row,) = result["rows"]
    assert sum(g["n"] for g in row["by"]["key_is_a_value"] if g["value"]) >= 8  # each sample's, at least
    assert "planted look-alikes (value) in 100 %" in (out / "mqmtar_errors.md").read_text()
    capsys.readouterr()
    assert errors.main([str(run), "--samples", "2", "--device", "cpu", "--lookalikes", "2",
                        "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "mqmtar_errors: error: --lookalikes must be a share in [0, 1], got 2.0"
    for flags, message in ((["--lookalike-kinds", "value"], "--lookalike-kinds: only with --lookalikes"),
                           (["--lookalikes", "1", "--lookalike-kinds", "word"], "lookalike_kinds must be")):
        assert errors.main([str(run), "--samples", "2", "--device", "cpu", *flags,
                            "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err


def test_fresh_tables_decode_test_sets_of_new_words(tmp_path, capsys, one_thread, monkeypatch):
    """--tables fresh: every length's test set is drawn with new key and value tables (its queried keys are
    mostly not among the run's 10,000 keys, where --tables train asks only those), planted look-alikes too;
    the result and its markdown say so."""
    run, out = tmp_path / "run", tmp_path / "out"
    assert asentmax(["train", "--run-dir", str(run), *TINY_MQMTAR]) == 0
    decoded = []

    def oracle(model, examples, **options):  # the true answers: every class is correct
        decoded.append(examples)
        return [answer(example) for example in examples]

    monkeypatch.setattr(errors, "greedy_answers", oracle)
    for tables in ("train", "fresh"):
        assert errors.main([str(run), "--multipliers", "1", "2", "--samples", "6", "--device", "cpu",
                            "--tables", tables, "--lookalikes", "1", "--lookalike-kinds", "value",
                            "--out", str(out / tables)]) == 0
    task = get_task("mqmtar")  # the run's tables (table seed 0)
    run_keys = {tuple(key) for key in task.keys.tolist()}
    for examples, tables in zip(decoded, ("train", "train", "fresh", "fresh"), strict=True):
        asked = [key for example in examples for key in queried_keys(example, task)]
        share = sum(key in run_keys for key in asked) / len(asked)
        assert share == 1.0 if tables == "train" else share < 0.5
    result = json.loads((out / "fresh" / "mqmtar_errors.json").read_text())
    assert result["tables"] == "fresh" and [row["length"] for row in result["rows"]] == [64, 128]
    for row in result["rows"]:
        assert row["classes"]["correct"] == row["classes"]["n"] == 6 * 4
        assert sum(g["n"] for g in row["by"]["key_is_a_value"] if g["value"]) >= 6  # planted in each sample
    assert "drawn with new key and value tables" in (out / "fresh" / "mqmtar_errors.md").read_text()
    assert "new key and value tables" not in (out / "train" / "mqmtar_errors.md").read_text()
    capsys.readouterr()
