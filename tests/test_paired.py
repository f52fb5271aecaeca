"""asentmax.paired and the digest it matches on: McNemar's exact p against scipy's binomial test over every
split of up to 40 discordant samples; each evaluation is paired with the first of its test set only, where
both rows carry the same test-set digest and keep exact_by_sample, and the discordant counts are the samples'
own; eval_set_digest tells sets
apart by seed, length, size and task tables; `asentmax eval` keeps digest and per-sample results, and
`asentmax compare` of two evaluations of one test set shows the Paired table."""

import json

import numpy as np
import pytest
from scipy.stats import binomtest

from asentmax.cli import main as asentmax
from asentmax.paired import mcnemar_exact_p, paired_rows, paired_table
from asentmax.tasks import get_task, make_eval_set
from asentmax.tasks.eval_sets import eval_set_digest


def test_mcnemar_exact_p_is_the_two_sided_binomial_test_at_one_half():
    for n in range(41):
        for only_first in range(n + 1):
            expected = binomtest(only_first, n, 0.5).pvalue if n else 1.0
            assert mcnemar_exact_p(only_first, n - only_first) == pytest.approx(expected, rel=1e-12, abs=0)
    assert mcnemar_exact_p(0, 5) == 2 / 32 and mcnemar_exact_p(3, 3) == 1.0
    with pytest.raises(ValueError, match="discordant counts must be >= 0"):
        mcnemar_exact_p(-1, 2)


def evaluation(name: str, rows: list[dict]) -> dict:
    """A result as load_evaluation returns it, reduced to what paired_rows reads."""
    return {"run_dir": f"runs/{name}", "eval_config": {"checkpoint": "last", "tables": "train"}, "rows": rows}


def row(length, digest, exact_by_sample):
    out = {"length": length, "exact_match": sum(exact_by_sample) / len(exact_by_sample),
           "exact_by_sample": exact_by_sample}
    return out if digest is None else {**out, "test_set_digest": digest}


def test_pairs_only_rows_of_one_test_set_and_count_their_discordant_samples():
    a = evaluation("a", [row(64, "d64", [1, 1, 0, 0, 1]), row(256, "d256", [1, 0, 0, 0, 0]),
                         row(1024, None, [1, 1, 1, 1, 1])])
    b = evaluation("b", [row(64, "d64", [1, 0, 1, 1, 1]), row(256, "other", [0, 0, 0, 0, 0]),
                         row(1024, None, [0, 0, 0, 0, 0])])
    c = evaluation("c", [row(64, "d64", [1, 1, 0, 0, 1]), row(256, "d256", [0, 0, 0, 0, 1])])
    del c["rows"][0]["exact_by_sample"]  # an evaluation written before the samples were kept
    d = evaluation("d", [row(64, "d64", [0, 0, 0, 0, 0])])
    rows = paired_rows([a, b, c, d])
    assert [(r["first"], r["second"], r["length"]) for r in rows] == [
        ("a", "b", 64), ("a", "c", 256), ("a", "d", 64)]  # each against the first of its test set only
    assert (rows[0]["only_first"], rows[0]["only_second"], rows[0]["n"]) == (1, 2, 5)  # equal-ish rates
    assert (rows[1]["only_first"], rows[1]["only_second"]) == (1, 1)
    assert rows[0]["p"] == mcnemar_exact_p(1, 2) == 1.0
    table = paired_table(rows)
    assert "| a | b | 64 | 5 | 60.0 | 80.0 | 1 | 2 | 1 |" in table
    assert paired_table([]) == ""


def test_eval_set_digest_tells_sets_apart():
    reverse, mqmtar = get_task("reverse"), get_task("mqmtar")
    digest = eval_set_digest(make_eval_set(reverse, 12, 5, 3))
    assert digest == eval_set_digest(make_eval_set(reverse, 12, 5, 3))
    assert len({digest, eval_set_digest(make_eval_set(reverse, 12, 5, 4)),
                eval_set_digest(make_eval_set(reverse, 12, 4, 3)),
                eval_set_digest(make_eval_set(reverse, 13, 5, 3))}) == 4
    fresh = mqmtar.with_fresh_tables(np.random.default_rng(12345))  # new word tables, same stream of samples
    assert eval_set_digest(make_eval_set(mqmtar, 64, 3, 0)) != eval_set_digest(make_eval_set(fresh, 64, 3, 0))


def test_compare_of_two_evaluations_of_one_test_set_shows_the_paired_table(tmp_path, one_thread):
    run = tmp_path / "run"
    assert asentmax(["train", "--run-dir", str(run), "--task", "reverse", "--min-length", "3", "--max-length",
                     "6", "--steps", "2", "--batch-size", "4", "--warmup-steps", "1", "--val-every", "0",
                     "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
                     "--no-progress"]) == 0
    flags = ["--multipliers", "1", "2", "--samples", "4", "--no-progress", "--device", "cpu"]
    assert asentmax(["eval", str(run), *flags]) == 0
    assert asentmax(["eval", str(run), *flags, "--output", str(run / "eval_again")]) == 0
    assert asentmax(["eval", str(run), *flags, "--seed", "7", "--output", str(run / "eval_seed7")]) == 0
    rows = json.loads((run / "eval.json").read_text())["rows"]
    assert [len(r["exact_by_sample"]) for r in rows] == [4, 4]
    assert all(sum(r["exact_by_sample"]) == r["n_exact"] for r in rows)
    assert asentmax(["compare", str(run), str(run / "eval_again.json"), str(run / "eval_seed7.json"),
                     "--output-dir", str(tmp_path / "cmp")]) == 0
    paired = json.loads((tmp_path / "cmp" / "compare.json").read_text())["paired"]
    assert [(p["length"], p["only_first"], p["only_second"], p["p"]) for p in paired] == [
        (6, 0, 0, 1.0), (12, 0, 0, 1.0)]  # eval.json with eval_again.json only: seed 7 drew other samples
    named = (f"run ({run})", f"run ({run / 'eval_again.json'})")  # one run's name: the paths tell them apart
    assert [(p["first"], p["second"]) for p in paired] == [named] * 2
    assert "Paired: each evaluation against the first one given that tested the same samples" in (
        tmp_path / "cmp" / "compare.md").read_text()
