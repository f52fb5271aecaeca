"""Evaluation (asentmax.eval): exact match / token accuracy of hand-built stub models with known answers,
greedy vs teacher-forced agreement, batching budgets, the Wilson interval against a numeric inversion of
the score test, length multipliers, and attention dispersion of a real softmax model (support = n)."""

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from asentmax.eval import (
    answer_accuracy,
    answer_dispersion,
    evaluate,
    greedy_accuracy,
    multiplier_lengths,
    wilson_interval,
)
from asentmax.nn import ModelConfig, Transformer
from asentmax.tasks import BOS, EOS, SEP, get_task, make_eval_set
from asentmax.tasks.scoring import teacher_forced_accuracy, teacher_forced_counts


class StubModel(torch.nn.Module):
    """Knows the answer to every example in `examples`; for sources in `corrupt` it answers
    `corrupt[source]` instead (a list of the same length as target + EOS). Unconditioned on its own
    outputs, so greedy decoding and teacher forcing see the same mistakes. Records batch shapes."""

    def __init__(self, task, examples, corrupt=None):
        super().__init__()
        self.vocab_size = task.vocab_size
        self.answers = {tuple(e.source): [*e.target, EOS] for e in examples}
        self.answers.update(corrupt or {})
        self.shapes = []

    def _sequence(self, row: list[int]) -> list[int]:
        source = tuple(row[1:row.index(SEP)])
        return [BOS, *source, SEP, *self.answers[source]]

    def forward(self, input_ids):
        self.shapes.append(tuple(input_ids.shape))
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        for b, row in enumerate(input_ids.tolist()):
            sequence = self._sequence(row)
            for i in range(min(len(row), len(sequence) - 1)):
                logits[b, i, sequence[i + 1]] = 1.0
        return logits

    def generate(self, input_ids, max_new_tokens, *, temperature=0.0, **unused):
        assert temperature == 0.0
        self.shapes.append(tuple(input_ids.shape))
        rows = [row + self._sequence(row)[len(row):len(row) + max_new_tokens] for row in input_ids.tolist()]
        return torch.tensor(rows)


def _wrong(token: int, task) -> int:
    return 4 + (token - 4 + 1) % (task.vocab_size - 4)


@pytest.fixture
def copy_examples():
    task = get_task("copy")
    rng = np.random.default_rng(0)
    return task, [task.sample(n, rng) for n in (5, 5, 9, 9, 9, 1, 17, 5)]


@pytest.mark.parametrize("scorer", [greedy_accuracy, teacher_forced_accuracy])
def test_always_right_and_always_wrong(copy_examples, scorer):
    task, examples = copy_examples
    right = StubModel(task, examples)
    scores = scorer(right, task, examples, device="cpu")
    assert scores["exact_match"] == 1.0 and scores["token_accuracy"] == 1.0
    everything_wrong = {tuple(e.source): [_wrong(t, task) for t in [*e.target, EOS]] for e in examples}
    wrong = StubModel(task, examples, everything_wrong)
    scores = scorer(wrong, task, examples, device="cpu")
    assert scores["exact_match"] == 0.0 and scores["token_accuracy"] == 0.0


@pytest.mark.parametrize("scorer", [greedy_accuracy, teacher_forced_accuracy])
def test_known_partial_accuracy(copy_examples, scorer):
    task, examples = copy_examples
    corrupt = {}
    for i in (0, 2, 6):  # one wrong token in each of three examples (a target token, EOS, a middle token)
        answer = [*examples[i].target, EOS]
        position = {0: 0, 2: len(answer) - 1, 6: 8}[i]
        answer[position] = _wrong(answer[position], task)
        corrupt[tuple(examples[i].source)] = answer
    model = StubModel(task, examples, corrupt)
    scores = scorer(model, task, examples, device="cpu", batch_size=3, max_batch_tokens=30)
    total = sum(len(e.target) + 1 for e in examples)
    assert scores["exact_match"] == pytest.approx(5 / 8)
    assert scores["token_accuracy"] == pytest.approx((total - 3) / total)
    assert all(b <= 3 and (b == 1 or b * t <= 30) for b, t in model.shapes)  # both batch budgets
    assert max(b for b, _ in model.shapes) > 1
    by_sample = (scores["exact_by_sample"] if scorer is greedy_accuracy else teacher_forced_counts(
        model, task, examples, device="cpu", batch_size=3, max_batch_tokens=30)[0])
    assert by_sample == [int(i not in (0, 2, 6)) for i in range(8)]  # the examples' order, not the batches'


def test_evaluate_rows_per_length_with_interval():
    task = get_task("reverse")
    lengths, n, seed = [4, 8, 12], 10, 7
    examples = [e for length in lengths for e in make_eval_set(task, length, n, seed)]
    # wrong on exactly k examples at length 8 (the first k of its eval set)
    k = 3
    corrupt = {tuple(e.source): [_wrong(t, task) for t in [*e.target, EOS]]
               for e in make_eval_set(task, 8, n, seed)[:k]}
    model = StubModel(task, examples, corrupt)
    rows = evaluate(model, task, lengths, samples=n, seed=seed, device="cpu", batch_size=4)
    assert [r["length"] for r in rows] == lengths
    assert [r["n_exact"] for r in rows] == [n, n - k, n]
    assert rows[1]["exact_match"] == pytest.approx((n - k) / n)
    assert rows[1]["token_accuracy"] == pytest.approx((n - k) / n)
    for row in rows:
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(wilson_interval(row["n_exact"], n))
        assert row["ci_low"] <= row["exact_match"] <= row["ci_high"]


class ExactTagger(torch.nn.Module):
    """The exact answer of a tagging task computed from the input tokens alone (2-back: the token two
    positions back; local count: the run count), with no generate(), so a test that reaches decoding fails.
    Sources in `wrong_at` get a wrong label at the given source index."""

    def __init__(self, task, wrong_at=None):
        super().__init__()
        self.task, self.wrong_at = task, dict(wrong_at or {})

    def labels(self, source):
        if self.task.name == "two_back":
            labels = [source[i - 2] if i >= 2 else 4 for i in range(len(source))]  # 4: NONE
        else:
            labels, count = [], 0
            for i, symbol in enumerate(source):
                count = count + 1 if i and symbol == source[i - 1] else 0
                labels.append(self.task.first_count + count)
        if tuple(source) in self.wrong_at:
            i = self.wrong_at[tuple(source)]
            labels[i] = _wrong(labels[i], self.task)
        return labels

    def forward(self, input_ids):
        self.shapes = [*getattr(self, "shapes", []), tuple(input_ids.shape)]
        logits = torch.zeros(*input_ids.shape, self.task.vocab_size)
        for b, row in enumerate(input_ids.tolist()):
            source = [t for t in row[1:] if t != 0]  # after BOS, before the right padding
            for i, label in enumerate(self.labels(source)):
                logits[b, 1 + i, label] = 1.0
        return logits


@pytest.mark.parametrize("name", ["two_back", "local_count"])
def test_a_tagging_task_is_scored_on_its_labels_without_decoding(name):
    task = get_task(name)
    lengths, n, seed = [17, 64, 300], 6, 5
    rows = evaluate(ExactTagger(task), task, lengths, samples=n, seed=seed, device="cpu", batch_size=4)
    assert [(r["n_exact"], r["token_accuracy"]) for r in rows] == [(n, 1.0)] * 3
    examples = make_eval_set(task, 64, n, seed)
    wrong_at = {tuple(examples[0].source): 0, tuple(examples[3].source): 63}  # first and last token
    scores = answer_accuracy(ExactTagger(task, wrong_at), task, examples, device="cpu", batch_size=4)
    assert scores["n_exact"] == n - 2 and scores["token_accuracy"] == pytest.approx(1 - 2 / (64 * n))
    assert scores == {**teacher_forced_accuracy(ExactTagger(task, wrong_at), task, examples, device="cpu"),
                      "n": n, "n_exact": n - 2, "exact_by_sample": [int(i not in (0, 3)) for i in range(n)]}
    budgeted = ExactTagger(task)  # the token budget counts the input's 65 tokens: two rows fit in 130
    answer_accuracy(budgeted, task, examples, device="cpu", max_batch_tokens=130)
    assert set(budgeted.shapes) == {(2, 65)}


def test_a_real_model_evaluates_a_tagging_task_as_its_validation_scores_it():
    task = get_task("two_back")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=task.vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                                    attention="asentmax", position="nape"))
    model.eval()
    examples = make_eval_set(task, 40, 8, 0)
    scores = answer_accuracy(model, task, examples, device="cpu", batch_size=3)
    assert scores["token_accuracy"] == pytest.approx(
        teacher_forced_accuracy(model, task, examples, device="cpu")["token_accuracy"])
    assert 0 < scores["token_accuracy"] < 1  # an untrained model: some labels right by chance, not all


def _score_test_bounds(k, n, confidence):
    """Independent Wilson interval: the p whose score statistic |k/n - p| / sqrt(p(1-p)/n) equals z,
    found by bisection on each side of k/n."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    inside = lambda p: abs(k / n - p) <= z * math.sqrt(p * (1 - p) / n)
    def edge(outside, inner):
        for _ in range(200):
            mid = (outside + inner) / 2
            outside, inner = (outside, mid) if inside(mid) else (mid, inner)
        return inner
    p_hat = k / n
    low = 0.0 if k == 0 else edge(0.0, p_hat)
    high = 1.0 if k == n else edge(1.0, p_hat)
    return low, high


@pytest.mark.parametrize("k,n,confidence", [(0, 10, 0.95), (10, 10, 0.95), (3, 10, 0.95), (50, 100, 0.9),
                                            (999, 1000, 0.99), (1, 1, 0.95), (17, 63, 0.8)])
def test_wilson_interval_inverts_the_score_test(k, n, confidence):
    assert wilson_interval(k, n, confidence) == pytest.approx(_score_test_bounds(k, n, confidence), abs=1e-9)


def test_wilson_interval_rejects_bad_counts():
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            wilson_interval(k, n)


def test_multiplier_lengths():
    task = get_task("reverse")
    assert multiplier_lengths(64, (1, 1.5, 2, 1024), task) == [64, 96, 128, 65536]
    with pytest.raises(ValueError, match="whole number"):
        multiplier_lengths(15, (1.5,), task)
    mqmtar = get_task("mqmtar")
    with pytest.raises(ValueError, match="too small"):
        multiplier_lengths(mqmtar.min_length, (0.5,), mqmtar)


def test_softmax_dispersion_support_is_every_visible_key():
    torch.manual_seed(0)
    task = get_task("copy")
    model = Transformer(ModelConfig(vocab_size=task.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                    attention="softmax", position="nope")).eval()
    rng = np.random.default_rng(1)
    examples = [task.sample(n, rng) for n in (6, 11)]
    stats = answer_dispersion(model, task, examples, device="cpu")
    # answer queries of an example with source length s sit at positions s+1 .. 2s+1 and see i+1 keys
    keys = [i + 1 for e in examples for i in range(len(e.source) + 1, 2 * len(e.source) + 2)]
    assert stats["support_size"] == pytest.approx(sum(keys) / len(keys))
    assert stats["support_size_per_layer"] == pytest.approx([sum(keys) / len(keys)] * 2)
    assert 0.5 < stats["normalised_entropy"] <= 1.0  # a random model attends almost uniformly


def test_dispersion_per_head_theta_is_ssmax_closed_form():
    """Plain SSMax: theta_hi = s_h log(n_i + 1) on the scaled (NoPE) heads, 1 on the ALiBi ones (NAPE); the
    per-head means over the answer queries, computed here from the positions alone."""
    torch.manual_seed(0)
    task = get_task("reverse")
    config = ModelConfig(vocab_size=task.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                         attention="ssmax", ssmax_form="plain", position="nape")
    model = Transformer(config).eval()
    s = torch.tensor([0.7, 1.9], dtype=torch.float64)
    for block in model.blocks:
        block.attn.temperature.s.data.copy_(s)
    rng = np.random.default_rng(3)
    examples = [task.sample(n, rng) for n in (5, 9, 12)]
    stats = answer_dispersion(model, task, examples, device="cpu")
    keys = torch.tensor([i + 1 for e in examples for i in range(len(e.source) + 1, 2 * len(e.source) + 2)],
                        dtype=torch.float64)
    expected = [1.0, 1.0] + (s * torch.log(keys + 1).mean()).tolist()
    assert np.allclose(stats["theta_per_head"], [expected, expected], rtol=1e-5)
    per_head = np.asarray(stats["support_size_per_head"])
    assert per_head.shape == (2, 4) and np.allclose(per_head.mean(1), stats["support_size_per_layer"])
    assert per_head.max() <= keys.max()


def test_entmax_dispersion_is_sparser_than_softmax():
    task = get_task("copy")
    rng = np.random.default_rng(2)
    examples = [task.sample(40, rng) for _ in range(2)]
    support = {}
    for attention in ("softmax", "entmax"):
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=task.vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                             attention=attention, position="nope", init_std=0.5)
        stats = answer_dispersion(Transformer(config).eval(), task, examples, device="cpu")
        support[attention] = stats["support_size"]
        assert 0 < stats["normalised_entropy"] <= 1.0
    assert support["entmax"] < 0.9 * support["softmax"]


# ---- time estimates, CPU defaults ----

def _row(length, seconds, n=10):
    return {"length": length, "seconds": seconds, "n": n}


def test_estimate_seconds_extrapolates_the_measured_growth():
    from asentmax.eval import estimate_seconds

    assert estimate_seconds([], 64, 10) is None
    assert estimate_seconds([_row(128, 5.0)], 64, 10) is None  # nothing shorter measured
    # one row: quadratic growth assumed; per sample 0.1 s at 16 -> 0.1 * 4^2 at 64, for 20 samples
    assert estimate_seconds([_row(16, 1.0)], 64, 20) == pytest.approx(0.1 * 16 * 20)
    # two rows growing with power 1.5 -> that power; the last row is the base
    rows = [_row(16, 1.0), _row(64, 1.0 * 4 ** 1.5)]
    assert estimate_seconds(rows, 256, 10) == pytest.approx(8.0 * 4 ** 1.5)
    # growth below linear (fixed costs) is taken as linear, above quadratic as quadratic
    assert estimate_seconds([_row(16, 1.0), _row(32, 1.0)], 64, 10) == pytest.approx(2.0)
    assert estimate_seconds([_row(16, 1.0), _row(32, 16.0)], 64, 10) == pytest.approx(64.0)


def test_long_lengths_are_announced_with_their_estimate():
    task = get_task("reverse")
    lengths, n, seed = [4, 8, 16], 6, 3
    model = StubModel(task, [e for length in lengths for e in make_eval_set(task, length, n, seed)])
    lines, notes = [], []
    rows = evaluate(model, task, lengths, samples=n, seed=seed, device="cpu", log=lines.append,
                    note=notes.append, estimate_threshold_s=0.0)
    assert [line.split(":")[0] for line in notes] == ["length 8", "length 16"]  # none for the first
    assert all("estimated" in line for line in notes) and not [line for line in lines if "estimated" in line]
    assert [r["length"] for r in rows] == lengths and all(r["seconds"] > 0 for r in rows)
    notes.clear()
    evaluate(model, task, lengths, samples=n, seed=seed, device="cpu", log=lines.append, note=notes.append)
    assert not notes  # these take far less than a minute


def test_progress_bar_counts_the_samples_of_each_length(monkeypatch):
    import tqdm.auto

    bars = []

    class Bar(tqdm.auto.tqdm):
        def __init__(self, **options):
            super().__init__(**options)
            self.updates = []
            bars.append(self)

        def update(self, n=1):
            self.updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    task = get_task("reverse")
    examples = [e for length in (8, 12) for e in make_eval_set(task, length, 7, 0)]
    evaluate(StubModel(task, examples), task, [8, 12], samples=7, seed=0, device="cpu", batch_size=3,
             progress=True, log=lambda line: None)
    assert [(bar.desc, bar.total, bar.updates) for bar in bars] == [
        ("length 8", 7, [3, 3, 1]), ("length 12", 7, [3, 3, 1])]


def test_cpu_default_multipliers_stop_at_cpu_max_length():
    from asentmax.eval import EvalConfig, resolve_multipliers

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    paper = get_task("mqmtar").eval_multipliers
    assert paper == (1, 2, 4, 16, 64, 256, 1024)
    assert resolve_multipliers(EvalConfig(), 64, cpu, paper) == ((1, 2, 4, 16, 64), [256, 1024])
    assert resolve_multipliers(EvalConfig(), 64, cuda, paper) == (paper, [])
    assert resolve_multipliers(EvalConfig(cpu_max_length=0), 64, cpu, paper) == (paper, [])
    assert resolve_multipliers(EvalConfig(cpu_max_length=10), 64, cpu, paper) == ((1,), list(paper[1:]))
    assert resolve_multipliers(EvalConfig(multipliers=(1, 1024)), 64, cpu, paper) == ((1, 1024), [])
    reverse = (1, 1.5, 2, 4, 8)
    assert resolve_multipliers(EvalConfig(cpu_max_length=200), 64, cpu, reverse) == ((1, 1.5, 2), [4, 8])


def test_each_paper_task_defaults_to_the_columns_of_its_table():
    from asentmax.report import PAPER_RESULTS

    expected = {"mqmtar": (1, 2, 4, 16, 64, 256, 1024), "reverse": (1, 1.5, 2, 4, 8), "sort": (1, 2, 4, 8),
                "copy": (1, 2, 4, 8, 16, 32, 64)}
    assert {name: get_task(name).eval_multipliers for name in expected} == expected
    for name, table in PAPER_RESULTS.items():  # every row of the paper's table: one cell per default length
        assert all(len(row) == len(expected[name]) for row in table.values()), name


# ---- eval.json written after every length; a re-run continues ----

TINY_RUN = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--steps", "4",
            "--batch-size", "4", "--warmup-steps", "1", "--val-every", "4", "--val-samples", "2",
            "--log-every", "2",
            "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]
EVAL_ARGS = ["--multipliers", "1", "2", "4", "--samples", "5", "--dispersion-samples", "2", "--no-progress"]


@pytest.fixture
def tiny_run(tmp_path, one_thread):
    from asentmax.cli import main

    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY_RUN]) == 0
    return run


def _counting_scorer(monkeypatch, stop_at_length=None):
    """Wrap eval.greedy_accuracy: record the prompt length of each call; Ctrl-C at `stop_at_length`."""
    import asentmax.eval as eval_module

    calls, real = [], eval_module.greedy_accuracy

    def scorer(model, task, examples, **options):
        length = len(examples[0].source)
        if length == stop_at_length:
            raise KeyboardInterrupt
        calls.append(length)
        return real(model, task, examples, **options)

    monkeypatch.setattr(eval_module, "greedy_accuracy", scorer)
    return calls


def test_eval_of_a_reverse_run_tests_the_reverse_table_lengths_by_default(tiny_run):
    import json

    from asentmax.cli import main

    assert main(["eval", str(tiny_run), "--samples", "2", "--dispersion-samples", "0", "--no-progress"]) == 0
    result = json.loads((tiny_run / "eval.json").read_text())
    assert [row["length"] for row in result["rows"]] == [6, 9, 12, 24, 48]  # 1x 1.5x 2x 4x 8x of 6 tokens
    assert result["eval_config"]["multipliers"] == [1, 1.5, 2, 4, 8]


def test_interrupted_eval_keeps_finished_lengths_and_a_rerun_continues(tiny_run, monkeypatch, capsys):
    import json

    from asentmax.cli import main

    reference = tiny_run.parent / "reference"
    assert main(["eval", str(tiny_run), *EVAL_ARGS, "--output", str(reference)]) == 0
    expected = json.loads(reference.with_suffix(".json").read_text())["rows"]
    capsys.readouterr()

    calls = _counting_scorer(monkeypatch, stop_at_length=24)
    assert main(["eval", str(tiny_run), *EVAL_ARGS]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "Traceback" not in err, err
    partial = json.loads((tiny_run / "eval.json").read_text())
    assert [row["length"] for row in partial["rows"]] == [6, 12] and partial["pending_lengths"] == [24]
    text = (tiny_run / "eval.md").read_text()
    assert "Not evaluated yet: lengths 24" in text
    assert text.splitlines()[0] == "### reverse, asentmax (run)"  # the default layout is not named
    assert calls == [6, 12]

    monkeypatch.undo()
    calls = _counting_scorer(monkeypatch)
    assert main(["eval", str(tiny_run), *EVAL_ARGS, "--batch-size", "2"]) == 0  # batch sizes may change
    assert calls == [24]  # only the missing length is computed
    assert "lengths 6, 12 are done" in capsys.readouterr().err
    final = json.loads((tiny_run / "eval.json").read_text())
    assert final["pending_lengths"] == []
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]
    assert strip(final["rows"]) == strip(expected)  # the same numbers as one uninterrupted evaluation


def test_rerun_with_other_settings_is_refused_unless_fresh(tiny_run, capsys):
    from asentmax.cli import main

    assert main(["eval", str(tiny_run), *EVAL_ARGS]) == 0
    before = (tiny_run / "eval.json").read_bytes()
    capsys.readouterr()
    assert main(["eval", str(tiny_run), *EVAL_ARGS, "--samples", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "samples 5 -> 3" in err and "--fresh" in err, err
    assert (tiny_run / "eval.json").read_bytes() == before
    assert main(["eval", str(tiny_run), *EVAL_ARGS, "--samples", "3", "--fresh"]) == 0
    import json

    assert [row["n"] for row in json.loads((tiny_run / "eval.json").read_text())["rows"]] == [3, 3, 3]


def test_rerun_after_more_training_starts_afresh(tiny_run, monkeypatch, capsys):
    import json

    from asentmax.cli import main
    from asentmax.runs import load_checkpoint, save_checkpoint

    assert main(["eval", str(tiny_run), *EVAL_ARGS]) == 0
    state = load_checkpoint(tiny_run / "checkpoint.pt")
    state["step"] += 1  # another checkpoint of the same run
    save_checkpoint(tiny_run / "checkpoint.pt", state)
    calls = _counting_scorer(monkeypatch)
    assert main(["eval", str(tiny_run), *EVAL_ARGS]) == 0
    assert "earlier checkpoint" in capsys.readouterr().err and calls == [6, 12, 24]
    assert json.loads((tiny_run / "eval.json").read_text())["train_step"] == state["step"]


def test_a_first_length_above_1x_says_it_has_no_estimate(tiny_run, capsys):
    from asentmax.cli import main

    notice = "length 24 (4x) is the first length: no time estimate"
    args = ["eval", str(tiny_run), "--samples", "2", "--dispersion-samples", "0", "--no-progress", "--output"]
    assert main([*args, str(tiny_run / "a"), "--multipliers", "4", "8"]) == 0
    out, err = capsys.readouterr()
    assert notice in err and notice not in out
    assert main([*args, str(tiny_run / "b"), "--multipliers", "1", "4"]) == 0
    assert "no time estimate" not in capsys.readouterr().err  # 4x extrapolates from the 1x just measured


@pytest.mark.parametrize("problem,data", [
    ("no rows", {"task": "copy", "run_dir": "r", "id_length": 4, "model_config": {"attention": "softmax"}}),
    ("no positive id_length", {"task": "copy", "run_dir": "r", "id_length": 0, "rows": [],
                               "model_config": {"attention": "softmax"}}),
    ("a row without", {"task": "copy", "run_dir": "r", "id_length": 4, "rows": [{"length": 4}],
                       "model_config": {"attention": "softmax"}}),
    *[("exact_by_sample at length 4 that is not", {
        "task": "copy", "run_dir": "r", "id_length": 4, "model_config": {"attention": "softmax"},
        "rows": [{"length": 4, "n": 3, "n_exact": 2, "exact_match": 2 / 3, "token_accuracy": 0.9,
                  "ci_low": 0.2, "ci_high": 0.9, "exact_by_sample": by_sample}]})
      for by_sample in ([1, 1], [1, 1, 2], [1, 1, 1], "110")],  # short, not 0/1, not n_exact, not a list
    ("test_set_digest at length 4 that is not a string", {
        "task": "copy", "run_dir": "r", "id_length": 4, "model_config": {"attention": "softmax"},
        "rows": [{"length": 4, "n": 3, "n_exact": 2, "exact_match": 2 / 3, "token_accuracy": 0.9,
                  "ci_low": 0.2, "ci_high": 0.9, "exact_by_sample": [1, 0, 1], "test_set_digest": 7}]}),
])
def test_load_evaluation_rejects_what_eval_does_not_write(problem, data, tmp_path):
    import json

    from asentmax.runs import RunError, load_evaluation

    path = tmp_path / "eval.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RunError, match=problem) as info:
        load_evaluation(tmp_path)
    assert str(path) in str(info.value)


def test_a_run_cut_short_is_marked_in_eval_and_compare(tmp_path, one_thread, capsys):
    """A run stopped before its planned steps (here --stop-at-step; Ctrl-C or a time limit alike): eval warns
    and compare labels it, for its last checkpoint and for best.pt; once trained to the end, neither does,
    though best.pt's own step stays below the planned ones."""
    import json

    from asentmax.cli import main

    run, out = tmp_path / "run", tmp_path / "compare"
    train = ["train", "--run-dir", str(run), *TINY_RUN, "--val-every", "2", "--keep-best-at", "1"]
    assert main([*train, "--stop-at-step", "2"]) == 0
    eval_best = ["eval", str(run), *EVAL_ARGS, "--checkpoint", "best"]
    compare = ["compare", str(run), str(run / "eval_best.json"), "--output-dir", str(out)]
    capsys.readouterr()
    assert main(["eval", str(run), *EVAL_ARGS]) == 0 and main(eval_best) == 0
    stdout, printed = capsys.readouterr()
    assert "warning" not in stdout  # warnings go to stderr, as train's do; the results to stdout
    assert "length 6: exact match" in stdout and "length 6: exact match" not in printed
    assert printed.count(f"warning: run {run} stopped at step 2 of 4 planned; evaluating ") == 2, printed
    assert "evaluating the checkpoint of step 2" in printed and "evaluating best.pt, of step 2" in printed
    result = json.loads((run / "eval.json").read_text())
    assert (result["train_step"], result["train_config"]["steps"]) == (2, 4)
    assert json.loads((run / "eval_best.json").read_text())["last_checkpoint"] == {"step": 2, "steps": 4}
    assert main(compare) == 0
    table = (out / "compare.md").read_text()
    assert "ours (run, cut at 2 of 4 steps)" in table and "ours (run, best.pt, cut at 2 of 4 steps)" in table

    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), *EVAL_ARGS]) == 0 and main(eval_best) == 0
    assert "warning" not in capsys.readouterr().err
    assert json.loads((run / "eval_best.json").read_text())["train_step"] < 4  # ties keep the earlier best
    assert main(compare) == 0
    assert "cut at" not in (out / "compare.md").read_text()
    (run / "checkpoint.pt").write_bytes(b"damaged")  # best.pt is still evaluated; its run: not known
    assert main(eval_best) == 0 and "last_checkpoint" not in json.loads((run / "eval_best.json").read_text())


def test_best_pt_with_the_last_weights_takes_the_last_evaluation(tmp_path, one_thread, capsys, monkeypatch):
    """A run whose best validation was its last step (one validation, at the end): best.pt holds
    checkpoint.pt's weights, so `eval --checkpoint best` takes the lengths of eval.json made with the same
    settings instead of decoding them again, says so, and records where from; not from an eval.json of
    other settings (here fewer samples) or of an earlier checkpoint.pt (the run trained again: other
    weights at the same step), nor for a best.pt whose weights differ."""
    import json

    from asentmax.cli import main
    from asentmax.runs import load_checkpoint, save_checkpoint

    run = tmp_path / "run"
    train = ["train", "--run-dir", str(run), *TINY_RUN, "--keep-best-at", "1"]
    assert main(train) == 0
    eval_best = ["eval", str(run), *EVAL_ARGS, "--checkpoint", "best"]
    assert main(["eval", str(run), *EVAL_ARGS]) == 0
    last = json.loads((run / "eval.json").read_text())
    calls = _counting_scorer(monkeypatch)
    capsys.readouterr()
    assert main(eval_best) == 0 and calls == []
    best = json.loads((run / "eval_best.json").read_text())
    assert best["rows"] == last["rows"] and best["rows_from"] == str(run / "eval.json")
    assert best["eval_config"]["checkpoint"] == "best" and best["train_step"] == last["train_step"] == 4
    printed = capsys.readouterr().err
    assert (f"best.pt holds the weights of checkpoint.pt (step 4): lengths 6, 12, 24 are taken from "
            f"{run / 'eval.json'}") in printed and "continuing" not in printed
    assert main(eval_best) == 0 and calls == []  # its own file now, which keeps saying where from
    assert json.loads((run / "eval_best.json").read_text())["rows_from"] == str(run / "eval.json")
    assert "continuing" in capsys.readouterr().err

    fewer = [*eval_best, "--samples", "4", "--output", str(tmp_path / "fewer")]
    assert main(fewer) == 0 and len(calls) == 3
    assert "rows_from" not in json.loads((tmp_path / "fewer.json").read_text())
    kept = (run / "eval.json").read_text()
    assert main([*train, "--overwrite", "--seed", "2"]) == 0  # new best.pt and checkpoint.pt at step 4
    (run / "eval.json").write_text(kept)  # the earlier checkpoint.pt's evaluation, left in place
    assert main([*eval_best, "--fresh"]) == 0 and len(calls) == 6
    assert "rows_from" not in json.loads((run / "eval_best.json").read_text())
    assert main(["eval", str(run), *EVAL_ARGS, "--fresh"]) == 0 and len(calls) == 9
    assert main([*eval_best, "--fresh"]) == 0 and len(calls) == 9  # taken again
    saved = load_checkpoint(run / "best.pt")  # one weight changed at the same step: decoded again
    name = next(iter(saved["model"]))
    saved["model"][name] = saved["model"][name] + 1
    save_checkpoint(run / "best.pt", saved)
    assert main([*eval_best, "--fresh"]) == 0 and len(calls) == 12


def test_a_run_ended_after_its_escape_is_not_marked_cut(tmp_path, one_thread, capsys):
    """A run that --steps-after-escape ended (here 1 step after the escape at the first log step, 2, of 4
    planned) is finished: eval does not warn and compare does not label it, for its last checkpoint and for
    best.pt; stopped before that end (--stop-at-step 2, then 3 once the escape is known), it is cut."""
    import json

    from asentmax.cli import main

    run, out = tmp_path / "run", tmp_path / "compare"
    flags = [*TINY_RUN, "--val-every", "2", "--keep-best-at", "1", "--stall-loss", "1e9"]
    assert main(["train", "--run-dir", str(run), *flags, "--steps-after-escape", "1"]) == 0
    eval_best = ["eval", str(run), *EVAL_ARGS, "--checkpoint", "best"]
    compare = ["compare", str(run), str(run / "eval_best.json"), "--output-dir", str(out)]
    capsys.readouterr()
    assert main(["eval", str(run), *EVAL_ARGS]) == 0 and main(eval_best) == 0
    assert "warning" not in capsys.readouterr().err
    result = json.loads((run / "eval.json").read_text())
    assert (result["train_step"], result["escape_step"], result["train_config"]["steps"]) == (3, 2, 4)
    assert json.loads((run / "eval_best.json").read_text())["last_checkpoint"] == {"step": 3, "steps": 3}
    assert main(compare) == 0
    assert "cut at" not in (out / "compare.md").read_text()

    cut = tmp_path / "cut"
    assert main(["train", "--run-dir", str(cut), *flags, "--steps-after-escape", "2",
                 "--stop-at-step", "3"]) == 0
    capsys.readouterr()
    assert main(["eval", str(cut), *EVAL_ARGS]) == 0
    assert f"warning: run {cut} stopped at step 3 of 4 planned" in capsys.readouterr().err


def test_cuda_graph_eval_is_refused_without_cuda(tiny_run, capsys):
    """--cuda-graphs on, on the CPU: one line naming the flag, exit code 2 (the CUDA graph itself is tested on
    a GPU: test_nn_gpu.py); auto, the default, decodes without graphs there."""
    import json

    from asentmax.cli import main
    from asentmax.eval import EvalConfig

    assert main(["eval", str(tiny_run), "--device", "cpu", "--cuda-graphs", "on", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--cuda-graphs on: cuda_graph=True needs the model and input_ids on a CUDA device" in err
    assert len(err.strip().splitlines()) == 1
    assert EvalConfig().cuda_graphs == "auto"  # the default since graphs were timed on a GPU (results/)
    out = tiny_run / "eval_auto.json"
    assert main(["eval", str(tiny_run), "--device", "cpu", "--multipliers", "1", "--samples", "2",
                 "--dispersion-samples", "0", "--no-progress", "--output", str(out.with_suffix(""))]) == 0
    assert json.loads(out.read_text())["cuda_graph"] is False


@pytest.mark.parametrize("now", [99, 20])
def test_a_run_whose_task_vocabulary_changed_is_refused_in_one_line(tiny_run, capsys, monkeypatch, now):
    """A task whose vocabulary changed after the run trained is refused in one line, exit code 2: one that
    grew (local count's did when it took the paper code's runs of up to 48) would index past the model's
    embedding; one that shrank (2-back's, 37 to 20 ids, when it became token tagging) means samples the
    model never saw, which would be scored without an error."""
    from asentmax.cli import main
    from asentmax.tasks.sequence import ReverseTask

    monkeypatch.setattr(ReverseTask, "vocab_size", property(lambda task: now, lambda task, value: None),
                        raising=False)  # a data descriptor: Task.__init__ cannot set it
    assert main(["eval", str(tiny_run), "--samples", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"its model reads 36 token ids, task 'reverse' has {now} now" in err and len(err.splitlines()) == 1
