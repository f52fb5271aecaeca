"""MQMTARTask.query_collisions and benchmarks/mqmtar_collisions.py: the counts of what looks like each queried
key (keys sharing a token, values equal to its word) against a brute-force recount over the context's tokens,
on hand-built samples with known collisions and on drawn ones; each rule's chance of a sample (a repeated key
counted once); the predictions of an evaluation on its own regenerated test samples (train and fresh tables);
the verdict's arithmetic; one-line refusals."""

import json

import numpy as np
import pytest

from asentmax.eval import examples_for_length
from asentmax.runs import RunError
from asentmax.tasks import get_task
from asentmax.tasks.base import Example
from asentmax.tasks.mqmtar import ALPHABET_START, BLANK, COLON, QUERY
from conftest import load_benchmark

collisions = load_benchmark("mqmtar_collisions")


def word(a, b):
    return [ALPHABET_START + a, ALPHABET_START + b]


def handmade(task):
    """Pairs (1,2):(9,9), (1,3):(8,8), (4,2):(1,2), (5,6):(7,7) and queries (1,2), (5,6), (1,2), (4,2): key
    (1,2) shares its first token with (1,3), its second with (4,2), and is the value of (4,2)."""
    pairs = [((1, 2), (9, 9)), ((1, 3), (8, 8)), ((4, 2), (1, 2)), ((5, 6), (7, 7))]
    context = [BLANK]
    for key, value in pairs:
        context += [*word(*key), COLON, *word(*value), BLANK]
    queries = [(1, 2), (5, 6), (1, 2), (4, 2)]
    source = context + [t for key in queries for t in [QUERY, *word(*key)]]
    target = [t for key in queries for t in [QUERY, *word(*dict(pairs)[key])]]
    assert len(queries) == task.n_queries
    return Example(source, target)


def brute_force(task, example):
    """(shares first, shares second, word as value) per query, by scanning every context position."""
    source = list(example.source)
    context = source[:len(source) - 3 * task.n_queries]
    keys = [tuple(context[i - 2:i]) for i, t in enumerate(context) if t == COLON]
    values = [tuple(context[i + 1:i + 3]) for i, t in enumerate(context) if t == COLON]
    out = []
    for j in range(task.n_queries):
        key = tuple(source[len(context) + 3 * j + 1:len(context) + 3 * j + 3])
        out.append((sum(k != key and k[0] == key[0] for k in keys),
                    sum(k != key and k[1] == key[1] for k in keys), sum(v == key for v in values)))
    return out


def test_query_collisions_of_a_handmade_sample():
    task = get_task("mqmtar")
    example = handmade(task)
    assert task.query_collisions(example) == [(1, 1, 1), (0, 0, 0), (1, 1, 1), (0, 1, 0)]
    assert task.query_collisions(example) == brute_force(task, example)
    chances = collisions.sample_chances(task, example)  # keys (1,2), (5,6), (4,2): (1,2) once
    assert chances["first token"] == pytest.approx(1 / 2)
    assert chances["second token"] == pytest.approx(1 / 2 * 1 / 2)
    assert chances["word"] == pytest.approx(1 / 2)
    assert chances["value_collision"] is True


@pytest.mark.parametrize("layout", ["random", "stretches"])
def test_query_collisions_of_drawn_samples(layout):
    """Long samples (546 and 8,738 pairs) have collisions of every kind; the counts equal the brute force."""
    task = get_task("mqmtar", layout=layout)
    rng = np.random.default_rng(3)
    seen = np.zeros(3, dtype=int)
    for length in (64, 4096, 65536):
        for _ in range(4):
            example = task.sample(length, rng)
            counts = task.query_collisions(example)
            assert counts == brute_force(task, example)
            seen += np.array(counts).sum(0)
    assert (seen > 0).all()


@pytest.mark.parametrize("tables", ["train", "fresh"])
def test_evaluation_rows_predict_on_the_evaluations_own_samples(tables):
    """Each rule's prediction is the mean over the regenerated samples of the product over distinct keys of
    1 / (1 + collisions), recounted by brute force; the observed cells are eval.json's."""
    task = get_task("mqmtar")
    evaluation = {"run_dir": "r", "workload": {"task": "mqmtar", "layout": "random"}, "id_length": 64,
                  "eval_config": {"seed": 11, "tables": tables},
                  "rows": [{"length": length, "n": 6, "exact_match": 0.5, "ci_low": 0.2, "ci_high": 0.8}
                           for length in (64, 2048)]}
    rows = collisions.evaluation_rows(evaluation)
    for row in rows:
        _, examples = examples_for_length(task, row["length"], 6, 11, tables)
        expected = {rule: 0.0 for rule in collisions.RULES}
        for example in examples:
            counts = dict(zip(map(tuple, np.asarray(example.source[-12:]).reshape(4, 3)[:, 1:].tolist()),
                              brute_force(task, example), strict=False))
            expected["first token"] += np.prod([1 / (1 + c[0]) for c in counts.values()]) / 6
            expected["second token"] += np.prod([1 / (1 + c[1]) for c in counts.values()]) / 6
            expected["word"] += np.prod([1 / (1 + c[2]) for c in counts.values()]) / 6
        for rule in collisions.RULES:
            assert row[rule] == pytest.approx(100 * expected[rule])
        assert (row["observed"], row["ci_low"], row["ci_high"]) == (50.0, 20.0, 80.0)
        assert row["multiplier"] == row["length"] / 64
    assert rows[1]["first token"] < 100  # 273 pairs: some key shares a token


def test_exact_samples_are_split_by_value_collision():
    """With exact_by_sample kept, the exact samples are counted among those whose queried word is also some
    pair's value (recounted by brute force) and among the others; the table shows both, or "-" for a row
    without it; a list of the wrong size is refused in one line."""
    task = get_task("mqmtar")
    n, length = 12, 65536  # 8,738 pairs: a queried word is a value in about 4 samples of 10
    _, examples = examples_for_length(task, length, n, 5, "train")
    collided = [any(c[2] for c in brute_force(task, example)) for example in examples]
    assert 0 < sum(collided) < n
    first = collided.index(True)  # exact: every sample without a collision and the first one with it
    exact = [int(not c or i == first) for i, c in enumerate(collided)]
    base = {"n": n, "exact_match": sum(exact) / n, "ci_low": 0.3, "ci_high": 0.9}
    evaluation = {"run_dir": "r", "workload": {"task": "mqmtar", "layout": "random"}, "id_length": 64,
                  "eval_config": {"seed": 5, "tables": "train"},
                  "rows": [{"length": length, **base, "exact_by_sample": exact}, {"length": 64, **base}]}
    (kept, missing) = sorted(collisions.evaluation_rows(evaluation), key=lambda r: -r["length"])
    assert kept["value_collisions"] == sum(collided)
    assert (kept["exact_with_collision"], kept["exact_without_collision"]) == (1, n - sum(collided))
    assert "exact_with_collision" not in missing
    table = collisions.markdown([("r", [missing, kept])], "cmd")
    assert (f"| {kept['value_collisions']} of {n} | {kept['exact_with_collision']} of {sum(collided)} / "
            f"{kept['exact_without_collision']} of {n - sum(collided)} |") in table
    assert f"| {missing['value_collisions']} of {n} | - |" in table
    evaluation["rows"] = [{"length": length, **base, "exact_by_sample": exact[:-1]}]
    with pytest.raises(RunError, match=f"r: length {length} has {n - 1} entries in exact_by_sample for {n} "
                                       "test samples"):
        collisions.evaluation_rows(evaluation)


def test_verdict_needs_every_length_and_a_telling_prediction():
    rows = [{"ci_low": 90.0, "ci_high": 100.0, "first token": 95.0, "second token": 80.0, "word": 100.0},
            {"ci_low": 30.0, "ci_high": 50.0, "first token": 40.0, "second token": 50.5, "word": 100.0}]
    assert collisions.miss(rows[1], "word") == 50.0 and collisions.miss(rows[0], "second token") == 10.0
    assert collisions.fitting_rules(rows[1]) == ["first token", "second token"]  # 50.5: within 1 point
    assert collisions.verdict(rows) == "first token"
    perfect = [{"ci_low": 96.3, "ci_high": 100.0, "first token": 50.0, "second token": 50.0, "word": 100.0}]
    assert collisions.verdict(perfect) == "none of the three"  # word fits, but so would a perfect model


def test_refusals(tmp_path, capsys):
    evaluation = {"run_dir": "r", "workload": {"task": "copy"}, "eval_config": {"seed": 1}, "id_length": 64,
                  "rows": []}
    with pytest.raises(RunError, match="a 'copy' evaluation, not an MQMTAR one"):
        collisions.evaluation_rows(evaluation)
    assert collisions.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"mqmtar_collisions: error: {tmp_path}: none of eval.json, "
                                               "eval_fresh.json")


def test_end_to_end_on_a_tiny_run(tmp_path):
    """A tiny CPU MQMTAR run evaluated by `asentmax eval`: the files are written, the summary names it, and
    the observed cells are its eval.json's."""
    from asentmax.cli import main as asentmax

    run = tmp_path / "tiny"
    train = ["train", "--run-dir", str(run), "--task", "mqmtar", "--preset", "mqmtar", "--attention",
             "asentmax", "--device", "cpu", "--steps", "2", "--batch-size", "2", "--warmup-steps", "1",
             "--val-every", "0", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
             "--no-progress"]
    assert asentmax(train) == 0
    assert asentmax(["eval", str(run), "--multipliers", "1", "2", "--samples", "3", "--no-progress"]) == 0
    out = ["--out", str(tmp_path / "out"), "--train-samples", "400", "--train-lookalikes", "0", "1",
           "1:value", "1:first,second"]
    assert collisions.main([str(run), *out]) == 0
    result = json.loads((tmp_path / "out" / "collisions.json").read_text())
    without, planted, value, one_token = result["training_losses"]["rows"]
    assert (without["lookalikes"], planted["lookalikes"]) == (0, 1)
    assert (planted["lookalike_kinds"], value["lookalike_kinds"]) == ([], ["value"])
    assert planted["word"] > 100 * without["word"]
    # value look-alikes cost the word rule alone, one-token look-alikes every rule but the word's
    assert value["word"] > 2 * planted["word"] and value["first token"] < 2 * without["first token"]
    assert one_token["word"] < 2 * without["word"] + 1e-4
    assert one_token["first token"] > planted["first token"]
    (evaluation,) = result["evaluations"]
    observed = [100 * row["exact_match"] for row in json.loads((run / "eval.json").read_text())["rows"]]
    assert [row["observed"] for row in evaluation["rows"]] == observed
    table = (tmp_path / "out" / "collisions.md").read_text()
    assert "| tiny |" in table and "\n| 0 | " in table and "\n| 1 | " in table and "\n| 1 (value) | " in table
    assert (tmp_path / "out" / "collisions.png").stat().st_size > 0
    for bad in ("1.5", "x", "0.1:word", "0.1:value,value", "0:value"):
        with pytest.raises(SystemExit):
            collisions.main([str(run), "--out", str(tmp_path / "out"), "--train-lookalikes", bad])


@pytest.mark.parametrize("lookalikes", [0.0, 1.0])
def test_rule_losses_of_fixed_length_samples(lookalikes):
    """At one length the value-copy loss is log P per query over 13 scored tokens; the look-alike rules'
    losses equal the mean of log(1 + count) over queries recounted by brute force, and the rules tell
    apart. With a planted look-alike in every sample (a third of them a value equal to a queried key's
    word) the word rule costs at least log 2 / 13 nats on those samples."""
    task = get_task("mqmtar", lookalikes=lookalikes)
    losses = collisions.rule_losses(task, 300, seed=4, lengths=(64, 64))
    assert losses["value copy"] == pytest.approx(4 * np.log(8) / 13)  # P = 8 pairs at length 64
    rng = np.random.default_rng(4)
    expected = np.zeros(3)
    for _ in range(300):
        rng.integers(64, 65)  # the length draw rule_losses makes
        counts = brute_force(task, task.sample(64, rng))
        expected += np.log1p(np.array(counts)).sum(0)
    for rule, value in zip(collisions.RULES, expected / (300 * 13), strict=True):
        assert losses[rule] == pytest.approx(value)
    assert losses["word"] < losses["first token"] < losses["value copy"]
    assert (losses["word"] > 0.8 * np.log(2) / (3 * 13)) == (lookalikes == 1.0)


def test_a_test_set_digest_that_differs_is_refused():
    """An evaluation row whose test_set_digest is not the regenerated samples' (the sampling changed since)
    is refused in one line; the right digest passes and is kept."""
    from asentmax.tasks.eval_sets import eval_set_digest

    _, examples = examples_for_length(get_task("mqmtar"), 256, 4, 3, "fresh")
    row = {"length": 256, "n": 4, "exact_match": 0.5, "ci_low": 0.1, "ci_high": 0.9,
           "exact_by_sample": [1, 0, 1, 0], "test_set_digest": eval_set_digest(examples)}
    evaluation = {"run_dir": "r", "workload": {"task": "mqmtar", "layout": "random"}, "id_length": 64,
                  "eval_config": {"seed": 3, "tables": "fresh"}, "rows": [row]}
    (kept,) = collisions.evaluation_rows(evaluation)
    assert kept["test_set_digest"] == row["test_set_digest"] and kept["tables"] == "fresh"
    assert kept["exact_by_sample"] == [1, 0, 1, 0] and len(kept["collided_by_sample"]) == 4
    row["test_set_digest"] = "0" * 64
    with pytest.raises(RunError, match="r: length 256: the regenerated test samples are not the evaluated"):
        collisions.evaluation_rows(evaluation)


def pool_row(exact, collided, digest="d", length=65536, second_phase=False):
    return {"length": length, "multiplier": length / 64, "tables": "fresh", "n": len(exact),
            "exact_by_sample": exact, "collided_by_sample": collided, "test_set_digest": digest,
            "second_phase": second_phase}


def exact_permutation_p(counts, n_collided):
    """Two-sided p of the difference of means over every assignment of the collisions to the samples."""
    from itertools import combinations

    collided = np.arange(len(counts)) < n_collided
    observed = counts[~collided].mean() - counts[collided].mean()
    differences = [np.delete(counts, list(c)).mean() - counts[list(c)].mean()
                   for c in combinations(range(len(counts)), n_collided)]
    return np.mean(np.abs(differences) >= abs(observed) - 1e-12)


STRONG = [[0, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1],
          [1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1]]  # exact p 0.0013
WEAK = [[0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 1], [1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 1]]  # exact p 0.20, one-sided 0.10


@pytest.mark.parametrize("runs", [STRONG, WEAK])
def test_pooled_rows_against_an_exact_permutation_test(runs):
    """Evaluations of one test set are pooled per sample; the means with and without a collision are theirs,
    and the permutation p agrees with the exact two-sided p over all C(12, 5) assignments of the collisions
    (within 4 binomial standard errors); evaluations of another test set, with no exact sample, or alone,
    and test sets with too few samples on a side, give no row; nor does a second phase."""
    collided = [1] * 5 + [0] * 7
    results = [(f"run{i}", [pool_row(exact, collided)]) for i, exact in enumerate(runs)]
    results.append(("zero", [pool_row([0] * 12, collided)]))  # decodes nothing: not pooled
    results.append(("other set", [pool_row(runs[0], collided, digest="e")]))  # alone on its set
    results.append(("phase", [pool_row(runs[1], collided, second_phase=True)]))  # its base's weights again
    (row,) = collisions.pooled_rows(results, permutations=4000)
    assert row["evaluations"] == ["run0", "run1", "run2"] and row["value_collisions"] == 5
    counts = np.sum(runs, axis=0)
    assert row["mean_exact_with_collision"] == pytest.approx(counts[:5].mean())
    assert row["mean_exact_without_collision"] == pytest.approx(counts[5:].mean())
    exact_p = exact_permutation_p(counts, 5)
    assert abs(row["p"] - exact_p) < 4 * np.sqrt(exact_p * (1 - exact_p) / 4000)
    assert collisions.pooled_rows(results, permutations=100, min_samples=6) == []  # 5 collided samples
    table = collisions.markdown([], "cmd", None, [row])
    assert (f"| 65536 (1024x) | fresh | 3: run0, run1, run2 | 5 of 12 | {counts[:5].mean():.2f} / "
            f"{counts[5:].mean():.2f} | {row['p']:.4f} |") in table


@pytest.mark.parametrize("prior, own, expected", [
    (None, "asentmax", False),  # from scratch
    ("softmax", "asentmax", False),  # a dense start swapped to ASEntmax: a model of its own
    ("asentmax", "asentmax", True),  # a second phase of an ASEntmax run
])
def test_a_second_phase_is_told_by_its_prior_recipe(prior, own, expected):
    """evaluation_rows marks the rows of a run initialised from a trained model of its own attention
    (eval.json's prior_recipe), which pooled_rows leaves out."""
    n, length = 12, 65536
    _, examples = examples_for_length(get_task("mqmtar"), length, n, 5, "train")
    evaluation = {"run_dir": "r", "workload": {"task": "mqmtar", "layout": "random"}, "id_length": 64,
                  "eval_config": {"seed": 5, "tables": "train"}, "model_config": {"attention": own},
                  "rows": [{"length": length, "n": n, "exact_match": 0.5, "ci_low": 0.2, "ci_high": 0.8,
                            "exact_by_sample": [1, 0] * 6}]}
    if prior:
        evaluation["prior_recipe"] = {"model_config": {"attention": prior}}
    (row,) = collisions.evaluation_rows(evaluation)
    assert row["second_phase"] is expected
