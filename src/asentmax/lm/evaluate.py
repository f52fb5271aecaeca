"""Long-context evaluation of a trained LM (arXiv:2506.16640, section 5): perplexity at multiples of the
training context, needle retrieval (RULER S-NIAH-1/2, passkey; asentmax.lm.needles) and attention
dispersion (entropy, normalised entropy, support size; section 1) as the context grows.

Perplexity: every held-out document contributes its first max_multiplier * C + 1 tokens, so each length
scores the same targets; at length L they are cut into consecutive windows of L targets, and each token is
scored with all earlier tokens of its window in context. The model's attention backend "auto" runs the
fused Triton kernels on a GPU and the chunked path on a CPU, so memory grows linearly with L; only the
dispersion statistics build dense attention, and only up to `stats_max_length`.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from asentmax import precision
from asentmax.lm.needles import TASKS, NeedleBuilder, leading_digits
from asentmax.lm.tokenizer import LMTokenizer
from asentmax.nn import summarise_stats


@torch.no_grad()
def sequence_nll(model, sequences: torch.Tensor, *, batch_size: int,
                 autocast_dtype=None) -> tuple[float, int]:
    """Summed next-token negative log-likelihood (nats) of (N, L + 1) token sequences, and the target count:
    sequence n is read as input[:L] and scored on [1:]."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for lo in range(0, sequences.shape[0], batch_size):
        chunk = sequences[lo:lo + batch_size].to(device)
        with precision.autocast(device, autocast_dtype):
            logits = model(chunk[:, :-1])
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32, fp64 stays
        total += float(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
        count += chunk[:, 1:].numel()
    return total, count


def perplexity_by_length(model, documents: list[np.ndarray], lengths: list[int], *, tokens_per_batch: int,
                         autocast_dtype=None) -> dict[int, dict]:
    """{L: {"ppl", "nll", "tokens"}}: each document's first max(lengths) + 1 tokens, scored in windows of L
    targets (see the module docstring); every L must divide max(lengths)."""
    span = max(lengths)
    bad = [length for length in lengths if span % length]
    if bad:
        raise ValueError(f"perplexity lengths {bad} do not divide the longest length {span}")
    kept = [np.asarray(d[:span + 1], dtype=np.int64) for d in documents if len(d) >= span + 1]
    if not kept:
        raise ValueError(f"no held-out document has {span + 1} tokens")
    docs = torch.from_numpy(np.stack(kept))  # (D, span + 1)
    out = {}
    for length in lengths:
        k = span // length
        idx = torch.arange(k)[:, None] * length + torch.arange(length + 1)[None, :]  # (k, L + 1)
        windows = docs[:, idx].reshape(-1, length + 1)
        nll, count = sequence_nll(model, windows, batch_size=max(1, tokens_per_batch // length),
                                  autocast_dtype=autocast_dtype)
        out[length] = {"ppl": math.exp(nll / count), "nll": nll / count, "tokens": count}
    return out


@torch.no_grad()
def retrieval_accuracy(model, builder: NeedleBuilder, task: str, length: int, *, n_samples: int, seed: int,
                       batch_size: int, autocast_dtype=None, max_new_tokens: int = 10,
                       cuda_graph: bool = False) -> dict:
    """Exact match (%) of greedy completions against the needle's value over n_samples prompts of `length`;
    `cuda_graph`: decoding steps replayed from CUDA graphs (generate)."""
    device = next(model.parameters()).device
    rng = np.random.default_rng([seed, TASKS.index(task), length])
    samples = [builder.sample(task, length, rng) for _ in range(n_samples)]
    correct, examples = 0, []
    for lo in range(0, n_samples, batch_size):
        group = samples[lo:lo + batch_size]
        prompts = torch.from_numpy(np.stack([s.prompt for s in group])).to(device)
        with precision.autocast(device, autocast_dtype):
            out = model.generate(prompts, max_new_tokens, cuda_graph=cuda_graph)
        for sample, row in zip(group, out[:, length:].tolist(), strict=True):
            completion = builder.tokenizer.decode(row)
            correct += leading_digits(completion) == sample.answer
            if len(examples) < 3:
                examples.append({"answer": sample.answer, "completion": completion, "depth": sample.depth})
    return {"accuracy": 100.0 * correct / n_samples, "samples": n_samples, "examples": examples}


@torch.no_grad()
def dispersion_by_length(model, documents: list[np.ndarray], lengths: list[int], *, n_windows: int,
                         autocast_dtype=None) -> dict[int, dict]:
    """{L: mean entropy, normalised entropy, support size (over layers, heads and queries) and per layer}
    from `n_windows` held-out windows of L tokens each (dense statistics: keep L small)."""
    device = next(model.parameters()).device
    out = {}
    for length in lengths:
        kept = [np.asarray(d[:length], dtype=np.int64) for d in documents if len(d) >= length][:n_windows]
        if not kept:
            continue
        inputs = torch.from_numpy(np.stack(kept)).to(device)
        per_window = []
        for row in inputs:
            with precision.autocast(device, autocast_dtype):
                _, stats = model(row[None], return_stats=True)
            per_window.append(summarise_stats(stats))
        record = {}
        for name in ("entropy", "normalised_entropy", "support_size", "theta"):
            layers = np.array([w[name] for w in per_window], dtype=np.float64).mean(0)  # (layers, heads)
            record[name] = float(np.nanmean(layers))
            record[f"{name}_per_layer"] = [float(v) for v in np.nanmean(layers, axis=1)]
        record["support_fraction"] = record["support_size"] / ((length + 1) / 2)  # mean n_i is (L + 1) / 2
        record["windows"] = len(kept)
        out[length] = record
    return out


def evaluate_model(model, tokenizer: LMTokenizer, test_documents: list[np.ndarray], *, context: int,
                   multipliers: list[int], retrieval_samples: int, retrieval_batch_size: int,
                   tokens_per_batch: int, stats_max_length: int, stats_windows: int, seed: int,
                   tasks: tuple[str, ...] = TASKS, autocast_dtype=None, cuda_graph: bool = False) -> dict:
    """Everything of the module at lengths multiplier * context; the JSON-ready results. `cuda_graph`: the
    needle completions decode with generate(cuda_graph=True)."""
    lengths = [m * context for m in multipliers]
    seconds, start = {}, time.perf_counter()
    ppl = perplexity_by_length(model, test_documents, lengths, tokens_per_batch=tokens_per_batch,
                               autocast_dtype=autocast_dtype)
    seconds["perplexity"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    # the S-NIAH-2 haystack: the documents' scored prefixes, so that each weighs the same
    builder = NeedleBuilder(tokenizer, np.concatenate([d[:max(lengths) + 1] for d in test_documents]))
    retrieval: dict[str, dict] = {task: {} for task in tasks}
    for task in tasks:
        for m in multipliers:
            if m * context < builder.min_length(task):
                retrieval[task][str(m)] = {"accuracy": None, "skipped": f"a {task} prompt needs "
                                           f"{builder.min_length(task)} tokens"}
                continue
            retrieval[task][str(m)] = retrieval_accuracy(
                model, builder, task, m * context, n_samples=retrieval_samples, seed=seed,
                batch_size=retrieval_batch_size, autocast_dtype=autocast_dtype, cuda_graph=cuda_graph)
    seconds["retrieval"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    stats_lengths = [m * context for m in multipliers if m * context <= stats_max_length]
    dispersion = dispersion_by_length(model, test_documents, stats_lengths, n_windows=stats_windows,
                                      autocast_dtype=autocast_dtype)
    seconds["dispersion"] = round(time.perf_counter() - start, 2)
    return {"context": context, "multipliers": multipliers, "seconds": seconds, "cuda_graph": cuda_graph,
            "perplexity": {str(length // context): v for length, v in ppl.items()},
            "retrieval": retrieval,
            "dispersion": {str(length // context): v for length, v in dispersion.items()}}
