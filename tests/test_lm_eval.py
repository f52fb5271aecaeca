"""LM evaluation: windowed perplexity against token-by-token scoring through the KV cache, needle prompts
(exact length, the needle's value in the prompt, the answer exact), exact-match scoring of a copying
oracle and of a wrong one through the real generate, batched needle generation against one prompt at a
time, and the dispersion statistics (asentmax.lm.evaluate / needles)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from asentmax.lm.corpus import read_text_folder
from asentmax.lm.dataset import Split, prepare
from asentmax.lm.evaluate import dispersion_by_length, perplexity_by_length, retrieval_accuracy
from asentmax.lm.needles import (
    NIAH_NEEDLE,
    NOISE,
    PASSKEY_INTRO,
    PASSKEY_NEEDLE,
    TASKS,
    NeedleBuilder,
    leading_digits,
)
from asentmax.lm.report import markdown
from asentmax.lm.tokenizer import DOC_ID, LMTokenizer
from asentmax.nn import KVCache, Transformer, lm_tiny
from asentmax.nn.generation import generate
from conftest import randomize_temperatures

pytest.importorskip("tokenizers")

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "asentmax" / "lm" / "sample"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    prepare(read_text_folder(SAMPLE), out, vocab_size=400, context=16, n_test=2, n_valid=1, sources=[])
    test = Split.load(out / "test.npz")
    return LMTokenizer.load(out), [np.asarray(test.document(d)) for d in range(test.n_documents)]


@torch.no_grad()
def _cached_nll(model, tokens: np.ndarray) -> float:
    """Summed NLL of tokens[1:] given tokens[:-1], one token at a time through the KV cache (fp64)."""
    cache, total = KVCache(), 0.0
    for i in range(len(tokens) - 1):
        logits = model(torch.tensor([[int(tokens[i])]]), cache=cache)[0, -1]
        total -= float(torch.log_softmax(logits, -1)[int(tokens[i + 1])])
    return total


@pytest.mark.parametrize("preset", [dict(attention="asentmax", position="nape"),
                                    dict(attention="softmax", position="rope")], ids=["asentmax", "rope"])
def test_windowed_perplexity_matches_token_by_token_scoring(preset):
    torch.manual_seed(0)
    model = Transformer(lm_tiny(37, **preset)).double().eval()
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 37, size=n) for n in (33, 40, 20)]  # the 20-token one is too short: skipped
    result = perplexity_by_length(model, docs, [32, 8], tokens_per_batch=40)
    for length in (32, 8):
        expected = sum(_cached_nll(model, doc[lo:lo + length + 1]) for doc in docs[:2]
                       for lo in range(0, 32, length))
        assert result[length]["tokens"] == 64
        assert result[length]["nll"] * 64 == pytest.approx(expected, rel=1e-10)
        assert result[length]["ppl"] == pytest.approx(math.exp(expected / 64), rel=1e-10)
    with pytest.raises(ValueError, match="do not divide"):
        perplexity_by_length(model, docs, [32, 12], tokens_per_batch=40)


def _needle_value(text: str, task: str) -> str:
    """An independent reader of the needle: the digits the prompt's needle sentence states."""
    pattern = (r"The pass key is (\d+)\." if task == "passkey"
               else r"special magic numbers for [a-z-]+ is: (\d+)\.")
    found = re.findall(pattern, text)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("task", TASKS)
def test_needle_prompts(data, task):
    tokenizer, documents = data
    builder = NeedleBuilder(tokenizer, np.concatenate(documents))
    haystack = np.concatenate(documents)
    haystack = haystack[haystack != DOC_ID]
    rng = np.random.default_rng(0)
    shortest = builder.min_length(task)
    for length in (shortest, shortest + 7, shortest + 150):
        for _ in range(4):
            sample = builder.sample(task, length, rng)
            assert len(sample.prompt) == length and sample.prompt[0] == DOC_ID
            text = tokenizer.decode(sample.prompt[1:].tolist())
            assert _needle_value(text, task) == sample.answer
            assert len(sample.answer) == (5 if task == "passkey" else 7)
            needle = (PASSKEY_NEEDLE if task == "passkey" else NIAH_NEEDLE).format(
                key=re.search(r"numbers for ([a-z-]+) is", text).group(1) if task != "passkey" else "",
                value=sample.answer)
            needle_ids = tokenizer.encode(needle)
            at = sample.needle_start
            assert sample.prompt[at:at + len(needle_ids)].tolist() == needle_ids
            assert text.endswith("is:" if task != "passkey" else "The pass key is")
            question = len(tokenizer.encode(text[text.rindex("\nWhat is"):]))
            head = 1 + (len(tokenizer.encode(PASSKEY_INTRO)) if task == "passkey" else 0)
            hay = np.concatenate([sample.prompt[head:sample.needle_start],
                                  sample.prompt[sample.needle_start + len(needle_ids):length - question]])
            if task == "niah_2":  # the haystack around the needle is one contiguous piece of held-out text
                windows = np.lib.stride_tricks.sliding_window_view(haystack, len(hay))
                assert (windows == hay).all(1).any()
            else:  # repeated noise, cut only between two passages
                assert (hay == np.resize(tokenizer.encode(NOISE), len(hay))).all()
                assert (sample.needle_start - head) % len(tokenizer.encode(NOISE)) == 0
    with pytest.raises(ValueError, match="too short"):
        builder.sample(task, 10, rng)


def _copy_next(context: list[int]) -> int:
    """The token that followed the latest earlier occurrence of the longest suffix of `context`."""
    best, following = 0, 0
    for j in range(len(context) - 1):
        matched = 0
        while matched <= j and context[j - matched] == context[len(context) - 1 - matched]:
            matched += 1
        if matched and matched >= best:
            best, following = matched, context[j + 1]
    return following


class _CopyModel(torch.nn.Module):
    """An oracle LM that retrieves by exact copying (an ideal induction head): its next token is the one that
    followed the longest earlier match of the context's suffix, plus `shift` (nonzero: always wrong). It
    keeps its tokens in the KV cache, so asentmax.nn.generation.generate drives it exactly as it drives the
    Transformer (prefill, then one cached token per step; padded prompts realigned and masked)."""

    def __init__(self, vocab_size: int, shift: int = 0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))  # where retrieval_accuracy reads the device
        self.vocab_size, self.shift = vocab_size, shift

    def forward(self, input_ids, attention_mask=None, cache=None):
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask
        ids, mask = input_ids, real
        if cache is not None:
            ids, mask = (x[:, 0, :, 0] for x in cache.update(0, input_ids[:, None, :, None],
                                                              real[:, None, :, None]))
        logits = torch.zeros(*input_ids.shape, self.vocab_size, dtype=torch.float64)
        for row in range(input_ids.shape[0]):
            following = _copy_next(ids[row][mask[row]].tolist())
            logits[row, -1, (following + self.shift) % self.vocab_size] = 1.0
        return logits

    def generate(self, input_ids, max_new_tokens, **kwargs):
        return generate(self, input_ids, max_new_tokens, **kwargs)


@pytest.mark.parametrize("task", TASKS)
def test_copying_oracle_scores_100_and_a_wrong_one_0(data, task):
    """The scoring path of the evaluation (prompts, batched generate with its KV cache, the completion's
    span, decoding, exact match) credits a model that copies the needle and nothing else; 6 prompts in
    batches of 4 (a short last batch)."""
    tokenizer, documents = data
    builder = NeedleBuilder(tokenizer, np.concatenate(documents))
    length = builder.min_length(task) + 20
    right, wrong = (retrieval_accuracy(_CopyModel(tokenizer.vocab_size, shift), builder, task, length,
                                       n_samples=6, seed=0, batch_size=4) for shift in (0, 1))
    assert right["accuracy"] == 100.0 and wrong["accuracy"] == 0.0 and right["samples"] == 6
    for example in right["examples"]:  # the completion is the value, then the needle's text goes on
        assert example["completion"].startswith(f" {example['answer']}.")
    # prompts of different lengths, left padded in one batch: each row still copies its own needle
    rng = np.random.default_rng(1)
    samples = [builder.sample(task, n, rng) for n in (length, length + 13, length + 40)]
    width = length + 40
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for row, sample in enumerate(samples):
        ids[row, width - len(sample.prompt):] = torch.from_numpy(sample.prompt)
        mask[row, width - len(sample.prompt):] = True
    out = _CopyModel(tokenizer.vocab_size).generate(ids, 10, attention_mask=mask)
    for row, sample in enumerate(samples):
        assert leading_digits(tokenizer.decode(out[row, width:].tolist())) == sample.answer


@pytest.mark.parametrize("preset", [dict(attention="asentmax", position="nape"),
                                    dict(attention="softmax", position="rope")], ids=["asentmax", "rope"])
def test_batched_needle_generation_equals_one_at_a_time(data, preset):
    """retrieval_accuracy's batched greedy completions of a Transformer equal one-prompt-at-a-time decoding
    and the argmax of a full uncached forward; so do prompts of different lengths left padded in one batch
    (fp64, random weights with nonzero temperature parameters)."""
    tokenizer, documents = data
    builder = NeedleBuilder(tokenizer, np.concatenate(documents))
    torch.manual_seed(0)
    model = Transformer(lm_tiny(tokenizer.vocab_size, init_std=0.2, **preset)).double().eval()
    randomize_temperatures(model)
    task, new = "niah_1", 6
    length = builder.min_length(task) + 30

    def alone(prompt: np.ndarray) -> list[int]:
        out = model.generate(torch.from_numpy(prompt)[None], new)
        full = model(out)[0, len(prompt) - 1:-1].argmax(-1)
        assert full.tolist() == out[0, len(prompt):].tolist()
        return out[0, len(prompt):].tolist()

    result = retrieval_accuracy(model, builder, task, length, n_samples=3, seed=0, batch_size=3,
                                max_new_tokens=new)
    rng = np.random.default_rng([0, TASKS.index(task), length])  # the prompts retrieval_accuracy drew
    for example in result["examples"]:
        sample = builder.sample(task, length, rng)
        assert sample.answer == example["answer"]
        assert tokenizer.decode(alone(sample.prompt)) == example["completion"]
    rng = np.random.default_rng(2)
    samples = [builder.sample(name, n, rng) for name, n in (("niah_1", length), ("passkey", length + 25),
                                                            ("niah_2", length + 9))]
    width = max(len(s.prompt) for s in samples)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for row, sample in enumerate(samples):
        ids[row, width - len(sample.prompt):] = torch.from_numpy(sample.prompt)
        mask[row, width - len(sample.prompt):] = True
    out = model.generate(ids, new, attention_mask=mask)
    for row, sample in enumerate(samples):
        assert out[row, width:].tolist() == alone(sample.prompt)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_needle_completions_replayed_from_cuda_graphs_equal_eager_ones(data):
    """On CUDA (run on the H200; `asentmax lm eval --cuda-graphs auto` decodes so there): retrieval_accuracy
    with cuda_graph=True completes each needle prompt as eager decoding does (ASEntmax, fp32: the same fused
    kernels either way)."""
    tokenizer, documents = data
    builder = NeedleBuilder(tokenizer, np.concatenate(documents))
    torch.manual_seed(0)
    model = Transformer(lm_tiny(tokenizer.vocab_size, init_std=0.2, attention="asentmax", position="nape"))
    model = model.cuda().eval()
    randomize_temperatures(model)
    length = builder.min_length("niah_1") + 30
    eager, graphed = (retrieval_accuracy(model, builder, "niah_1", length, n_samples=3, seed=0, batch_size=1,
                                         max_new_tokens=8, cuda_graph=graph) for graph in (False, True))
    assert graphed == eager and len(eager["examples"]) == 3


def test_leading_digits():
    assert leading_digits(" 1234567. The") == "1234567"
    assert leading_digits("\n 42") == "42"
    assert leading_digits(" : 42") == ""


def test_dispersion_of_uniform_softmax_attention():
    """Zero query/key weights make softmax attention uniform: entropy log n_i, support n_i, exactly."""
    torch.manual_seed(0)
    model = Transformer(lm_tiny(37, attention="softmax", position="nope")).double().eval()
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.wq.weight)
    docs = [np.arange(40) % 37]
    out = dispersion_by_length(model, docs, [8, 32], n_windows=1)
    for length in (8, 32):
        n = np.arange(1, length + 1)
        assert out[length]["entropy"] == pytest.approx(np.log(n).mean(), rel=1e-9)
        assert out[length]["support_size"] == pytest.approx(n.mean(), rel=1e-9)
        assert out[length]["normalised_entropy"] == pytest.approx(1.0, rel=1e-9)
        assert out[length]["support_fraction"] == pytest.approx(1.0, rel=1e-9)


def test_report_tables():
    result = {"context": 512, "multipliers": [1, 4, 8],
              "perplexity": {"1": {"ppl": 10.0}, "4": {"ppl": 12.0}, "8": {"ppl": 25.0}},
              "retrieval": {"niah_1": {"1": {"accuracy": None}, "4": {"accuracy": 50.0},
                                       "8": {"accuracy": 2.5}}},
              "dispersion": {"1": {"entropy": 1.0, "normalised_entropy": 0.5, "support_size": 9.0,
                                   "support_fraction": 0.25}}}
    text = markdown({"run": result})
    assert "| run | 2.500 | 50.0 | 2.5 |" in text  # ppl 25 / 10; S-NIAH-1 at 4x and 8x
    assert "| run | 10.00 | 12.00 | 25.00 |" in text
    assert "| paper ASEntmax (420M, C=2048) |  | 10.89 | 10.01 |" in text  # paper 4K/8K/16K = our 2x/4x/8x
    assert "| run | 1x | 1.000 | 0.500 | 9.0 | 0.250 |" in text
