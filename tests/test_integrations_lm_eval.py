"""lm-evaluation-harness model "asentmax" (asentmax.integrations.lm_eval) on a tiny random model with the
byte tokenizer, offline: lm_eval's perplexity of a local task equals the package's own perplexity
evaluation (asentmax.lm.evaluate.sequence_nll); loglikelihood and generate_until equal direct
computations; the shipped needle task runs end to end, through simple_evaluate and the command line."""

import json
import math

import pytest
import torch

pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from asentmax.integrations.hf_model import save_hf  # noqa: E402
from asentmax.integrations.lm_eval import AsentmaxLM, main, task_manager  # noqa: E402
from asentmax.integrations.lm_eval_tasks import needle  # noqa: E402
from asentmax.integrations.tokenizer import BYTE_VOCAB_SIZE, byte_tokenizer  # noqa: E402
from asentmax.lm.evaluate import sequence_nll  # noqa: E402
from asentmax.nn import Transformer  # noqa: E402
from asentmax.nn.presets import lm_tiny  # noqa: E402

TEXTS = ["the cat sat on the mat", "key 4821 -> 7463343\nvalue", "naïve  spaces\tand tabs"]
PPL_TASK = """task: tiny_text_ppl
dataset_path: ""
custom_dataset: !function texts.load
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
TEXTS_LOADER = """import datasets, json, pathlib
def load(**kwargs):
    lines = (pathlib.Path(__file__).parent / "texts.jsonl").read_text().splitlines()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([json.loads(x) for x in lines])})
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = Transformer(lm_tiny(BYTE_VOCAB_SIZE, attention="asentmax", position="nape", init_std=0.3)).eval()
    directory = tmp_path_factory.mktemp("asentmax-hf")
    save_hf(model, model.config, directory, tokenizer=byte_tokenizer())
    return directory, model


def logprobs_of(model, prefix: list[int], target: list[int]) -> torch.Tensor:
    """log p(target_i | prefix + target_<i) for each target token, from one forward of the Transformer."""
    ids = torch.tensor([prefix + target[:-1]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids)[0].double(), dim=-1)
    return logprobs[len(prefix) - 1:].gather(1, torch.tensor(target)[:, None])[:, 0]


def test_perplexity_equals_the_package_model(model_dir, tmp_path):
    directory, model = model_dir
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (tmp_path / "texts.py").write_text(TEXTS_LOADER)
    (tmp_path / "ppl.yaml").write_text(PPL_TASK)
    lm = AsentmaxLM(pretrained=str(directory), batch_size=2, max_length=64)
    results = lm_eval.simple_evaluate(model=lm, tasks=["tiny_text_ppl"], task_manager=task_manager(tmp_path))
    metrics = results["results"]["tiny_text_ppl"]

    # the package's own perplexity evaluation, each text after the prefix token lm_eval conditions it on
    eos = BYTE_VOCAB_SIZE - 1
    nll = [sequence_nll(model, torch.tensor([[eos] + list(t.encode())]), batch_size=1) for t in TEXTS]
    total = -sum(value for value, _ in nll)
    assert sum(count for _, count in nll) == sum(len(t.encode()) for t in TEXTS)
    n_bytes = sum(len(t.encode()) for t in TEXTS)
    n_words = sum(len(t.split()) for t in TEXTS)
    assert metrics["byte_perplexity,none"] == pytest.approx(math.exp(-total / n_bytes), rel=1e-5)
    assert metrics["bits_per_byte,none"] == pytest.approx(-total / n_bytes / math.log(2), rel=1e-5)
    assert metrics["word_perplexity,none"] == pytest.approx(math.exp(-total / n_words), rel=1e-4)


def test_rolling_windows_score_every_token_once(model_dir):
    directory, model = model_dir
    text = TEXTS[1]
    short = AsentmaxLM(pretrained=str(directory), max_length=8)
    whole = AsentmaxLM(pretrained=str(directory), max_length=64)
    request = Instance("loglikelihood_rolling", {}, (text,), 0)
    windowed, full = short.loglikelihood_rolling([request])[0], whole.loglikelihood_rolling([request])[0]
    direct = float(logprobs_of(model, [BYTE_VOCAB_SIZE - 1], list(text.encode())).sum())
    assert full == pytest.approx(direct, rel=1e-5)
    assert windowed != pytest.approx(direct, rel=1e-3)  # shorter contexts: a different (finite) score
    assert math.isfinite(windowed) and windowed < 0


def test_loglikelihood_equals_direct_computation(model_dir):
    directory, model = model_dir
    pairs = [("The key is", " 42"), ("a", "bc"), ("longer context here:", " x\n")]
    lm = AsentmaxLM(pretrained=str(directory), batch_size=3)
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    for (context, continuation), (score, greedy) in zip(pairs, got, strict=True):
        logprobs = logprobs_of(model, list(context.encode()), list(continuation.encode()))
        assert score == pytest.approx(float(logprobs.sum()), rel=1e-5)
        ids = list((context + continuation).encode())
        with torch.no_grad():
            argmax = model(torch.tensor([ids[:-1]]))[0].argmax(-1)[len(context.encode()) - 1:]
        assert greedy == bool((argmax == torch.tensor(list(continuation.encode()))).all())


def test_amp_bf16_scores_under_bf16_autocast(model_dir):
    """amp=bf16 (what amp=auto does on a GPU) scores and generates as the model under torch.autocast(bf16)
    does, whose scores differ from its fp32 ones; amp=auto on a CPU scores in fp32."""
    directory, model = model_dir
    pairs = [("The key is", " 42"), ("longer context here:", " x\n")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    bf16 = AsentmaxLM(pretrained=str(directory), amp="bf16").loglikelihood(requests)
    auto = AsentmaxLM(pretrained=str(directory), device="cpu").loglikelihood(requests)
    for (context, continuation), (score, _), (fp32_score, _) in zip(pairs, bf16, auto, strict=True):
        prefix, target = list(context.encode()), list(continuation.encode())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = float(logprobs_of(model, prefix, target).sum())
        assert score == pytest.approx(expected, rel=1e-5)
        assert fp32_score == pytest.approx(float(logprobs_of(model, prefix, target).sum()), rel=1e-5)
        assert abs(score - fp32_score) > 1e-4 * abs(fp32_score)
    context = "The special magic number for amber is:"
    request = Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 12}), 0)
    (text,) = AsentmaxLM(pretrained=str(directory), amp="bf16").generate_until([request])
    prompt = torch.tensor([list(context.encode())])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new = model.generate(prompt, 12)[0, prompt.shape[1]:].tolist()
    eos = BYTE_VOCAB_SIZE - 1
    assert text == bytes(new[:new.index(eos)] if eos in new else new).decode("utf-8", errors="replace")


def test_generate_until_equals_greedy_decoding(model_dir):
    directory, model = model_dir
    lm = AsentmaxLM(pretrained=str(directory))
    context = "The special magic number for amber is:"
    request = Instance("generate_until", {}, (context, {"until": ["q"], "max_gen_toks": 7}), 0)
    (text,) = lm.generate_until([request])
    prompt = torch.tensor([list(context.encode())])
    new = model.generate(prompt, 7)[0, prompt.shape[1]:].tolist()
    eos = BYTE_VOCAB_SIZE - 1
    new = new[:new.index(eos)] if eos in new else new
    expected = bytes(new).decode("utf-8", errors="replace").split("q")[0]
    assert text == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_until_with_cuda_graphs_equals_without(model_dir):
    """On CUDA (run on the H200; cuda_graphs=auto is on there): completions whose steps replay CUDA graphs
    equal eager ones, on ASEntmax (the same fused kernels either way), over contexts of several lengths."""
    directory, _ = model_dir
    contexts = ["The special magic number for amber is:", "key 4821 -> 7463343\nvalue " * 9, "a"]
    requests = [Instance("generate_until", {}, (context, {"until": ["q"], "max_gen_toks": 24}), i)
                for i, context in enumerate(contexts)]
    graphed = AsentmaxLM(pretrained=str(directory), device="cuda")
    assert graphed.cuda_graph is True
    eager = AsentmaxLM(pretrained=str(directory), device="cuda", cuda_graphs="off")
    assert graphed.generate_until(requests) == eager.generate_until(requests)


def test_shipped_needle_file_is_the_generator_output():
    lines = needle.DOCS_PATH.read_text().splitlines()
    assert [json.loads(line) for line in lines] == needle.make_docs()
    doc = needle.make_docs()[0]
    assert doc["input"].endswith(f"for {doc['key']} is:")
    assert f"{doc['key']} is: {doc['answer']}." in doc["input"]
    assert len(doc["answer"]) == 7 and doc["answer"].isdigit()


def test_needle_task_runs_end_to_end(model_dir):
    directory, _ = model_dir
    lm = AsentmaxLM(pretrained=str(directory), max_length=1024)
    results = lm_eval.simple_evaluate(model=lm, tasks=["asentmax_needle"], task_manager=task_manager(),
                                      limit=2)
    assert results["results"]["asentmax_needle"]["exact_match,strip"] in (0.0, 0.5, 1.0)


def test_command_line(model_dir, tmp_path, capsys, monkeypatch):
    directory, _ = model_dir
    from lm_eval.tasks import TaskManager

    build = TaskManager.__init__  # indexing lm_eval's thousands of own task files takes seconds: skip it
    monkeypatch.setattr(TaskManager, "__init__",
                        lambda self, *args, **kwargs: build(self, *args, **kwargs, include_defaults=False))
    main(["--model", "asentmax", "--model_args", f"pretrained={directory},max_length=1024", "--device", "cpu",
          "--tasks", "asentmax_needle", "--limit", "1", "--output_path", str(tmp_path / "out")])
    assert "asentmax_needle" in capsys.readouterr().out
    assert list((tmp_path / "out").rglob("results_*.json"))


def test_bad_arguments_are_refused(model_dir):
    directory, _ = model_dir
    with pytest.raises(ValueError, match="batch_size"):
        AsentmaxLM(pretrained=str(directory), batch_size="auto")
    with pytest.raises(ValueError, match="dtype"):
        AsentmaxLM(pretrained=str(directory), dtype="int8")
    with pytest.raises(ValueError, match="^amp must be one of auto, bf16, off, got 'fp8'$"):
        AsentmaxLM(pretrained=str(directory), amp="fp8")
    with pytest.raises(ValueError, match="^cuda_graphs on: cuda_graph=True needs the model and input_ids on "
                                         "a CUDA device$"):
        AsentmaxLM(pretrained=str(directory), device="cpu", cuda_graphs="on")
    with pytest.raises(ValueError, match="^cuda_graphs sometimes: must be one of auto, on, off$"):
        AsentmaxLM(pretrained=str(directory), cuda_graphs="sometimes")
    assert AsentmaxLM(pretrained=str(directory), device="cpu").cuda_graph is False  # auto: off on a CPU
    lm = AsentmaxLM(pretrained=str(directory))
    with pytest.raises(ValueError, match="top_p"):
        lm.generate_until([Instance("generate_until", {}, ("a", {"until": ["\n"], "top_p": 0.9}), 0)])
