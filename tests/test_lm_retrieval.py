"""Retrieval exercises in LM training windows (asentmax.lm.retrieval, LMConfig.retrieval_share; issue 16,
the needle tasks of arXiv:2506.16640, section 5): the question's answer is the value its key was stated
with (checked by parsing the decoded text with the wordings, not by the builder's bookkeeping), the
window's corpus text is kept in order, the share is what is asked, batches are deterministic per step and
rank, share 0 gives the plain windows, and bad settings are one-line errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from asentmax.cli import main
from asentmax.data import IGNORE_INDEX, PAD_ID
from asentmax.lm.corpus import deduplicate, read_text_folder
from asentmax.lm.dataset import prepare
from asentmax.lm.needles import ADJECTIVES, NOUNS
from asentmax.lm.retrieval import WORDINGS
from asentmax.lm.tokenizer import DOC_ID
from asentmax.lm.workload import LMConfig, LMWorkload

pytest.importorskip("tokenizers")

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "asentmax" / "lm" / "sample"
CONTEXT = 128
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    prepare(deduplicate(read_text_folder(SAMPLE)), out, vocab_size=400, context=16, n_test=2, n_valid=1,
            sources=[])
    return out


def _workload(data, share=0.05, context=CONTEXT) -> LMWorkload:
    return LMWorkload(LMConfig(data=str(data), size="lm_tiny", context=context, retrieval_share=share))


def _pattern(template: str) -> str:
    key, value = r"(?P<key>[a-z]+-[a-z]+)", r"(?P<value>\d+)"
    return re.escape(template).replace(r"\{key\}", key, 1).replace(r"\{key\}", r"(?P=key)").replace(
        r"\{value\}", value, 1).replace(r"\{value\}", r"(?P=value)")


def _parse(inserted: str) -> tuple[dict[str, list[str]], str, str]:
    """({key: [values stated]}, asked key, the value after the question) of an exercise's inserted text;
    keyless wordings use the key ''."""
    for statement, question in WORDINGS:
        asked = list(re.finditer(_pattern(question) + r" (?P<answer>\d+)\.", inserted))
        if len(asked) != 1:
            continue
        stated: dict[str, list[str]] = {}
        for m in re.finditer(_pattern(statement), inserted[:asked[0].start()]):
            stated.setdefault(m.groupdict().get("key", ""), []).append(m["value"])
        return stated, asked[0].groupdict().get("key", ""), asked[0]["answer"]
    raise AssertionError(f"no single question in {inserted!r}")


def test_the_question_asks_a_stated_value_inside_the_windows_text(data):
    workload = _workload(data)
    exercises, tokenizer = workload.exercises, workload.exercises.tokenizer
    w, tokens = workload.train_windows, workload.train_split.tokens
    wordings, digits = set(), set()
    for i in range(200):
        lo = int(w.starts[i % len(w)])
        window = tokens[lo:min(lo + CONTEXT + 1, int(w.ends[i % len(w)]))].astype(np.int64)
        ex = exercises.compose(window, np.random.default_rng(i))
        n_text = int(ex.text.sum())
        assert len(ex.tokens) <= CONTEXT + 1
        assert len(ex.tokens) == CONTEXT + 1 or n_text == len(window)  # the text is only cut to make room
        assert (ex.tokens[ex.text] == window[:n_text]).all()  # the window's own text, in order
        assert (ex.tokens == DOC_ID).sum() == (window[:n_text] == DOC_ID).sum() <= 1
        if window[0] == DOC_ID:
            assert ex.tokens[0] == DOC_ID
        stated, key, answer = _parse(tokenizer.decode(ex.tokens[~ex.text].tolist()))
        assert stated[key] == [answer] == [ex.value]  # stated once, before the question, with this value
        assert tokenizer.decode(ex.tokens[ex.answer_start:].tolist()).startswith(f" {ex.value}.")
        assert not set(key.split("-")) & (set(ADJECTIVES) | set(NOUNS))  # not the evaluation's keys
        wordings.add(next(q for _, q in WORDINGS if re.search(_pattern(q), tokenizer.decode(
            ex.tokens[:ex.answer_start].tolist()))))
        digits.add(len(ex.value))
    assert len(wordings) == len(WORDINGS) and digits == set(range(2, 10))


@pytest.mark.parametrize("context", [CONTEXT, 1024])  # at 1024 every window is a padded short document
def test_the_share_is_what_is_asked_and_only_those_rows_change(data, context):
    share, batch, steps = 0.05, 64, 300
    workload, plain = _workload(data, share, context), _workload(data, 0.0, context)
    rows = [workload.exercise_rows(7, step, 0, 1, batch) for step in range(steps)]
    n, expected = sum(len(r) for r in rows), share * batch * steps
    assert abs(n - expected) < 4 * math.sqrt(expected * (1 - share))
    assert len(_workload(data, 1.0).exercise_rows(7, 0, 0, 1, batch)) == batch
    batches = workload.batches(seed=7, start_step=0, rank=0, world_size=1, local_batch_size=batch, device=CPU)
    old = plain.batches(seed=7, start_step=0, rank=0, world_size=1, local_batch_size=batch, device=CPU)
    for step in range(5):
        new, before = next(batches), next(old)
        changed = (new.input_ids != before.input_ids).any(1).numpy()
        assert np.flatnonzero(changed).tolist() == rows[step].tolist()
        assert torch.equal(new.labels[~changed], before.labels[~changed])
        for inputs, labels in zip(new.input_ids[changed].numpy(), new.labels[changed].numpy(), strict=True):
            n_real = int((inputs != PAD_ID).sum())
            assert (inputs[:n_real] != PAD_ID).all() and (labels[:n_real] != IGNORE_INDEX).all()
            assert (labels[n_real:] == IGNORE_INDEX).all()  # nothing of the plain window is left behind
            assert (labels[:n_real - 1] == inputs[1:n_real]).all()
            text = workload.exercises.tokenizer.decode([*inputs[:n_real], labels[n_real - 1]])
            stated, key, answer = _parse(text)
            assert stated[key] == [answer]


def test_batches_are_deterministic_per_step_and_shard_the_global_batch(data):
    def batch(workload, step, rank=0, world_size=1, local=8):
        return next(workload.batches(seed=3, start_step=step, rank=rank, world_size=world_size,
                                     local_batch_size=local, device=CPU))

    one, again = _workload(data, 0.5), _workload(data, 0.5)
    stream = one.batches(seed=3, start_step=0, rank=0, world_size=1, local_batch_size=8, device=CPU)
    for step in range(4):
        from_start = next(stream)
        resumed = batch(again, step)
        sharded = [batch(again, step, rank, 2, 4) for rank in range(2)]
        for name in ("input_ids", "labels"):
            assert torch.equal(getattr(from_start, name), getattr(resumed, name))
            assert torch.equal(getattr(from_start, name), torch.cat([getattr(s, name) for s in sharded]))
    other = next(_workload(data, 0.5).batches(seed=4, start_step=3, rank=0, world_size=1, local_batch_size=8,
                                              device=CPU))
    assert not torch.equal(other.input_ids, from_start.input_ids)


def test_share_0_gives_the_plain_windows(data):
    workload = _workload(data, 0.0)
    assert workload.exercises is None
    for step in range(3):
        index = workload.window_indices(5, step, 1, 2, 8)
        inputs, labels = workload.train_windows.arrays(workload.train_split.tokens, index)
        batch = next(workload.batches(seed=5, start_step=step, rank=1, world_size=2, local_batch_size=8,
                                      device=CPU))
        assert torch.equal(batch.input_ids, torch.from_numpy(inputs))
        assert torch.equal(batch.labels, torch.from_numpy(labels))


def test_saved_runs_without_the_setting_resume_on_plain_text(data):
    saved = _workload(data, 0.0).to_dict()
    assert saved["retrieval_share"] == 0.0
    del saved["retrieval_share"]
    assert LMWorkload.from_dict(saved).config.retrieval_share == 0.0
    default = LMConfig().retrieval_share
    assert default > 0
    assert LMWorkload.from_dict(_workload(data, default).to_dict()).config.retrieval_share == default


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_bad_shares_are_refused(share):
    with pytest.raises(ValueError, match=r"retrieval_share must be in \[0, 1\]"):
        LMConfig(retrieval_share=share)


def test_errors_are_one_line(data, tmp_path, capsys):
    with pytest.raises(ValueError, match="too short for retrieval exercises"):
        _workload(data, 0.05, context=16)
    common = ["lm", "train", "--data", str(data), "--size", "lm_tiny", "--device", "cpu", "--no-progress"]
    for flags, message in ((["--retrieval-share", "2"], "retrieval_share must be in [0, 1], got 2.0"),
                           (["--context", "16"], "--retrieval-share 0")):
        assert main(common + ["--run-dir", str(tmp_path / "r"), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
