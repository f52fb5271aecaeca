"""Length-generalisation evaluation (PAPER.md sections 3-4): exact match of greedy decoding per length.

For each length multiplier m (1x = the training "ID" length, up to 1024x) a fixed, seeded evaluation
set is drawn (asentmax.tasks.make_eval_set), prompts `<bos> source <sep>` are decoded greedily with
the model's KV cache (`Transformer.generate`), in batches sized by a token budget so long lengths stay
memory-safe on CPU (the model's "auto" attention backend is the chunked torch path there). A sample is
an exact match when it reproduces the target and then <eos> (the tokens the training loss covers);
per-token accuracy is over the same tokens. Exact match comes with a Wilson confidence interval.

Training validates with `asentmax.tasks.scoring.teacher_forced_accuracy` instead (one forward pass; the
same exact match as greedy decoding).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import NormalDist

import torch

from asentmax.data import IGNORE_INDEX, collate
from asentmax.ops.types import BACKENDS
from asentmax.tasks.scoring import autocast, shape_batches


@dataclass
class EvalConfig:
    """Settings of `asentmax eval`."""

    multipliers: tuple[float, ...] = field(
        default=(1, 2, 4, 16, 64, 256, 1024), metadata={"help": "lengths to test, as multiples of id-length"})
    id_length: int = field(default=0, metadata={"help": "the 1x length (0: the run's max training length)"})
    samples: int = field(default=100, metadata={"help": "test samples per length"})
    batch_size: int = field(default=64, metadata={"help": "most sequences decoded at once"})
    max_batch_tokens: int = field(default=32768, metadata={"help": "most prompt tokens decoded at once"})
    seed: int = field(default=1234, metadata={"help": "seed of the evaluation sets"})
    dispersion_samples: int = field(default=8, metadata={"help": "samples per length for attention stats"})
    dispersion_max_tokens: int = field(
        default=2048, metadata={"help": "longest sequence for attention statistics (they are dense: O(n^2))"})
    confidence: float = field(default=0.95, metadata={"help": "confidence level of the Wilson interval"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    amp: str = field(default="auto", metadata={"help": "auto (bf16 on CUDA) | bf16 | off"})
    attention_backend: str = field(
        default="", metadata={"help": "replace the model's attention backend: " + "|".join(BACKENDS)})

    def validate(self) -> None:
        if self.attention_backend not in ("", *BACKENDS):
            raise ValueError(f"unknown attention-backend {self.attention_backend!r}")
        if not self.multipliers or any(not m > 0 for m in self.multipliers):
            raise ValueError(f"multipliers must be positive, got {self.multipliers}")
        if self.dispersion_samples < 0 or self.dispersion_max_tokens < 0:
            raise ValueError("dispersion-samples and dispersion-max-tokens must be >= 0")
        for name in ("samples", "batch_size", "max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.id_length < 0:
            raise ValueError(f"id-length must be >= 0, got {self.id_length}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.amp not in ("auto", "bf16", "off"):
            raise ValueError(f"amp must be auto, bf16 or off, got {self.amp!r}")


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion successes / n."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes}, {n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def multiplier_lengths(id_length: int, multipliers, task) -> list[int]:
    """Lengths id_length * m; ValueError when one is not a whole number or below the task's minimum."""
    lengths = []
    for m in multipliers:
        length = id_length * m
        if abs(length - round(length)) > 1e-9:
            raise ValueError(f"{m}x of length {id_length} is not a whole number of tokens")
        task.check_length(int(round(length)))
        lengths.append(int(round(length)))
    return lengths


@torch.no_grad()
def greedy_accuracy(model, task, examples, *, device, autocast_dtype=None, batch_size: int = 64,
                    max_batch_tokens: int = 32768) -> dict:
    """Greedy-decode every prompt with the KV cache; score target + EOS. Returns counts and rates."""
    from asentmax.tasks.base import BOS, EOS, SEP

    exact, correct, total = 0, 0, 0
    key = lambda e: (len(e.source) + 2, len(e.target))
    for indices in shape_batches(examples, key, batch_size, max_batch_tokens):
        group = [examples[i] for i in indices]
        prompts = torch.tensor([[BOS, *e.source, SEP] for e in group], dtype=torch.long, device=device)
        expected = torch.tensor([[*e.target, EOS] for e in group], dtype=torch.long, device=device)
        with autocast(device, autocast_dtype):
            out = model.generate(prompts, expected.shape[1], temperature=0.0)
        hits = out[:, prompts.shape[1]:] == expected
        exact += int(hits.all(1).sum())
        correct += int(hits.sum())
        total += hits.numel()
    return {"n": len(examples), "n_exact": exact, "exact_match": exact / len(examples),
            "token_accuracy": correct / total}


@torch.no_grad()
def answer_dispersion(model, task, examples, *, device) -> dict:
    """Attention statistics (asentmax.nn.stats) at the scored (answer) positions of a teacher-forced pass:
    means over layers, heads and those queries of the normalised entropy H(p) / log n and support size."""
    batch = collate(task, examples).to(device)
    _, stats = model(batch.input_ids, return_stats=True)
    scored = (batch.labels != IGNORE_INDEX)[:, None, :]  # (B, 1, T)
    entropy = torch.stack([s.normalised_entropy.float() for s in stats])  # (L, B, H, T)
    support = torch.stack([s.support_size.float() for s in stats])
    at_answers_entropy = entropy[:, scored.expand_as(entropy[0])]  # (L, n_answer_queries * H)
    at_answers_support = support[:, scored.expand_as(support[0])]
    return {"normalised_entropy": float(at_answers_entropy.mean()),
            "support_size": float(at_answers_support.mean()),
            "normalised_entropy_per_layer": at_answers_entropy.mean(1).tolist(),
            "support_size_per_layer": at_answers_support.mean(1).tolist(),
            "n_samples": len(examples)}


def evaluate(model, task, lengths, *, samples: int, seed: int, device, autocast_dtype=None,
             batch_size: int = 64, max_batch_tokens: int = 32768, confidence: float = 0.95,
             dispersion_samples: int = 0, dispersion_max_tokens: int = 2048, progress=None) -> list[dict]:
    """One row per length: exact match (+ Wilson interval), per-token accuracy, seconds taken, and (for
    sequences up to dispersion_max_tokens) attention dispersion on the first dispersion_samples examples."""
    from asentmax.tasks import make_eval_set

    rows = []
    model.eval()
    for length in lengths:
        start = time.perf_counter()
        examples = make_eval_set(task, length, samples, seed)
        scores = greedy_accuracy(model, task, examples, device=device, autocast_dtype=autocast_dtype,
                                 batch_size=batch_size, max_batch_tokens=max_batch_tokens)
        low, high = wilson_interval(scores["n_exact"], scores["n"], confidence)
        row = {"length": length, **scores, "ci_low": low, "ci_high": high,
               "seconds": time.perf_counter() - start}
        subset = examples[:dispersion_samples]
        if subset and max(len(e.source) + len(e.target) + 2 for e in subset) <= dispersion_max_tokens:
            row["dispersion"] = answer_dispersion(model, task, subset, device=device)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def load_model(run_dir: Path | str, device: torch.device, attention_backend: str = ""):
    """The trained Transformer of a run directory (from its checkpoint), its task and the checkpoint;
    a non-empty `attention_backend` replaces the one the model was trained with."""
    from asentmax.nn import ModelConfig, Transformer
    from asentmax.runs import CHECKPOINT_NAME, load_checkpoint
    from asentmax.tasks import get_task

    checkpoint = load_checkpoint(Path(run_dir) / CHECKPOINT_NAME)
    model_config = ModelConfig(**checkpoint["model_config"])
    if attention_backend:
        model_config = replace(model_config, attention_backend=attention_backend)
    model = Transformer(model_config)
    model.load_state_dict(checkpoint["model"])
    model.to(device).eval()
    return model, get_task(checkpoint["workload"]["task"]), checkpoint


def markdown_table(rows: list[dict], id_length: int, title: str) -> str:
    """Exact match % (with the interval) and token accuracy % per length multiplier."""
    lines = [f"### {title}", "", "| length | multiplier | exact match % | 95% CI | token acc % | n |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['length']} | {format_multiplier(row['length'] / id_length)} | "
                     f"{100 * row['exact_match']:.1f} | "
                     f"{100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f} | "
                     f"{100 * row['token_accuracy']:.1f} | {row['n']} |")
    return "\n".join(lines) + "\n"


def format_multiplier(m: float) -> str:
    return f"{m:g}x"


def evaluate_run(run_dir: Path | str, config: EvalConfig, output: Path | str | None = None,
                 log=print) -> dict:
    """Evaluate a run's checkpoint at every multiplier; write <output>.json and .md (default run_dir/eval)."""
    from asentmax.runs import describe_device, git_commit

    config.validate()
    run_dir = Path(run_dir)
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    device = torch.device("cuda" if use_cuda else "cpu")
    model, task, checkpoint = load_model(run_dir, device, config.attention_backend)
    id_length = config.id_length or checkpoint["workload"]["max_length"]
    lengths = multiplier_lengths(id_length, config.multipliers, task)
    use_bf16 = config.amp == "bf16" or (config.amp == "auto" and device.type == "cuda")
    rows = evaluate(model, task, lengths, samples=config.samples, seed=config.seed, device=device,
                    autocast_dtype=torch.bfloat16 if use_bf16 else None, batch_size=config.batch_size,
                    max_batch_tokens=config.max_batch_tokens, confidence=config.confidence,
                    dispersion_samples=config.dispersion_samples,
                    dispersion_max_tokens=config.dispersion_max_tokens,
                    progress=lambda r: log(f"length {r['length']}: exact match {100 * r['exact_match']:.1f}% "
                                           f"({r['n_exact']}/{r['n']}), {r['seconds']:.1f}s"))
    result = {"run_dir": str(run_dir), "task": task.name, "id_length": id_length, "rows": rows,
              "eval_config": asdict(config), "model_config": checkpoint["model_config"],
              "train_config": checkpoint["train_config"], "workload": checkpoint["workload"],
              "train_step": checkpoint["step"],
              "git_commit": git_commit(), "device": describe_device(device)}
    output = Path(output) if output is not None else run_dir / "eval"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    title = f"{task.name}, {checkpoint['model_config'].get('attention')} ({run_dir.name})"
    output.with_suffix(".md").write_text(markdown_table(rows, id_length, title))
    return result
