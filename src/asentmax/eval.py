"""Length-generalisation evaluation (docs/method.md section 7): exact match of greedy decoding per length
multiplier.

For each length multiplier m (1x = the training "ID" length, up to 1024x) a fixed, seeded evaluation
set is drawn (asentmax.tasks.make_eval_set), prompts `<bos> source <sep>` are decoded greedily with
the model's KV cache (`Transformer.generate`), in batches sized by a token budget so long lengths stay
memory-safe on CPU (the model's "auto" attention backend is the chunked torch path there). A sample is
an exact match when it reproduces the target and then <eos> (the tokens the training loss covers);
per-token accuracy is over the same tokens. Exact match comes with a Wilson confidence interval. For tasks
whose answers copy source tokens (Copy, Reverse, MQMTAR's values: Task.answer_sources) the answer tokens are
also scored by the tenth of the source they copy from ("source_tenth_accuracy"), which shows whether a long
context fails everywhere or where its answers sit far from the query (the start of the source, say).
A tagging task (Task.tagging: local count, 2-back) has nothing to decode: its labels are the argmax of one
forward pass over `<bos> source` (answer_accuracy), as the paper's code scores its token classification.

`plan_evaluation` then `run_evaluation` (the two: `evaluate_run`) drive `asentmax eval`, built for runs a
person waits for (warnings and notes go to `note`, stderr by default as `asentmax train`'s; each length's
result to `log`, stdout):
- the results file (<output>.json and .md, default <run-dir>/eval.*) is rewritten atomically after every
  length, with the lengths still to do listed in it, so an interrupted evaluation loses at most one length;
- a re-run continues: lengths already in the file are skipped when the file was made from the same
  checkpoint (sha256) with the same evaluation settings (samples, seed, id-length, dispersion, confidence,
  attention backend, device type and autocast; batch sizes and multipliers may differ). A file from another
  checkpoint is replaced (a note says so); a file from other settings is refused (pass --fresh to replace
  it, or --output to write elsewhere);
- a progress bar over the samples of each length, and before a length whose time, extrapolated from the
  lengths measured so far, exceeds a minute, a line with the estimate; when the first length is above 1x,
  a line says it has none (nothing shorter to extrapolate from);
- an evaluation of best.pt that holds checkpoint.pt's weights (a run whose best validation was its last
  step) takes the lengths that the run's evaluation of checkpoint.pt as it is now (its default output, the
  same tables and settings) already has, instead of decoding the same samples with the same weights again;
  a note says so and the result records the file as rows_from;
- a run whose training stopped before its planned steps (Ctrl-C, a time limit, --stop-at-step: the step of
  its checkpoint.pt below its train_config's steps) gets a warning line, and its name in eval.md and in
  `asentmax compare` says "cut at S of N steps" (runs.training_cut; eval.json has the step as train_step,
  an evaluation of best.pt as last_checkpoint);
- the default multipliers are the task's (Task.eval_multipliers: the columns of its table in the paper);
  on the CPU they stop at `cpu_max_length` tokens (MQMTAR's 1x..1024x is hours there); any --multipliers
  given explicitly are evaluated as given, with the estimate printed.

Training validates with `asentmax.tasks.scoring.teacher_forced_accuracy` instead (one forward pass; the
same exact match as greedy decoding).
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import NormalDist

import numpy as np
import torch

from asentmax import precision
from asentmax.data import IGNORE_INDEX, collate
from asentmax.nn.generation import CUDA_GRAPH_SETTINGS, decodes_with_cuda_graph
from asentmax.ops.attention import backend_refusal
from asentmax.ops.types import BACKENDS
from asentmax.runs import (
    BEST_NAME,
    CHECKPOINT_NAME,
    CONFIG_NAME,
    RunError,
    describe_device,
    evaluation_name,
    format_multiplier,
    git_commit,
    load_checkpoint,
    load_evaluation,
    planned_end,
    read_json,
    run_name,
    saved_layout,
    training_cut,
    write_json,
    write_text,
)
from asentmax.tasks.eval_sets import eval_set_digest
from asentmax.tasks.scoring import shape_batches, teacher_forced_counts

ESTIMATE_THRESHOLD_S = 60.0  # announce a length estimated to take longer than this
TABLES_STREAM = 1  # with --tables fresh, a length's tables come from default_rng([seed, length, 1])
SOURCE_PARTS = 10  # source_tenth_accuracy: answers scored by the tenth of the source they copy from
# EvalConfig's fields with a fixed set of values (the CLI's choices; attention_backend: "" or BACKENDS)
CHOICES = {"checkpoint": ("last", "best"), "tables": ("train", "fresh"), "device": ("auto", "cpu", "cuda"),
           "amp": precision.EVAL_AMP_MODES, "cuda_graphs": CUDA_GRAPH_SETTINGS}


@dataclass
class EvalConfig:
    """Settings of `asentmax eval`."""

    multipliers: tuple[float, ...] = field(default=(), metadata={
        "help": "lengths to test, as multiples of id-length", "default_help":
        "the run's task's: the columns of its table in the paper (MQMTAR's 1 .. 1024 where the paper has "
        "none); on the CPU only those up to cpu-max-length tokens"})
    id_length: int = field(default=0, metadata={"help": "the 1x length (0: the run's max training length)"})
    samples: int = field(default=100, metadata={"help": "test samples per length"})
    batch_size: int = field(default=64, metadata={"help": "most sequences decoded at once"})
    max_batch_tokens: int = field(default=32768, metadata={"help": "most prompt tokens decoded at once"})
    seed: int = field(default=1234, metadata={"help": "seed of the evaluation sets"})
    checkpoint: str = field(default="last", metadata={"help": (
        "last (checkpoint.pt) | best (best.pt, the best validation of a run trained with --keep-best-at; "
        "written to eval_best.json unless --output)")})
    dispersion_samples: int = field(default=8, metadata={"help": "samples per length for attention stats"})
    dispersion_max_tokens: int = field(
        default=2048, metadata={"help": "longest sequence for attention statistics (they are dense: O(n^2))"})
    confidence: float = field(default=0.95, metadata={"help": "confidence level of the Wilson interval"})
    cpu_max_length: int = field(default=4096, metadata={
        "help": "on the CPU, the default multipliers stop at this many tokens (0: no limit); "
                "explicit --multipliers are never cut"})
    tables: str = field(default="train", metadata={"help": (
        "train (the run's word tables) | fresh (new MQMTAR key and value tables for every test length, as "
        "the paper's code draws every test set; written to eval_fresh.json unless --output)")})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    amp: str = field(default="auto", metadata={"help": "auto (bf16 on CUDA) | bf16 | off"})
    attention_backend: str = field(
        default="", metadata={"help": "replace the model's attention backend: " + "|".join(BACKENDS)})
    cuda_graphs: str = field(default="auto", metadata={"help": (
        "auto | on | off: decode with generate(cuda_graph=True), a static KV cache whose steps replay a CUDA "
        "graph (the same attention, less host time a step; softmax steps run on the fused kernels instead of "
        "SDPA, so a near-tie can round the other way); auto (default): on CUDA where the model allows it "
        "(not top-k attention), off on the CPU")})

    def validate(self) -> None:
        if self.attention_backend not in ("", *BACKENDS):
            raise ValueError(f"unknown attention-backend {self.attention_backend!r}")
        if any(not (m > 0 and math.isfinite(m)) for m in self.multipliers):
            given = " ".join(map(str, self.multipliers))
            raise ValueError(f"multipliers must be positive and finite, got {given}")
        if len(set(self.multipliers)) < len(self.multipliers):
            given = " ".join(map(str, self.multipliers))
            raise ValueError(f"multipliers must differ from each other, got {given}")
        if self.dispersion_samples < 0 or self.dispersion_max_tokens < 0:
            raise ValueError("dispersion-samples and dispersion-max-tokens must be >= 0")
        for name in ("samples", "batch_size", "max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("id_length", "seed", "cpu_max_length"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


def eval_device(config: EvalConfig) -> torch.device:
    """The device `config` asks for; ValueError (one line) when it is not usable on this machine."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine; "
                         "use --device cpu or auto")
    device = torch.device("cuda" if config.device != "cpu" and torch.cuda.is_available() else "cpu")
    refusal = backend_refusal(config.attention_backend, device.type)
    if refusal is not None:
        raise ValueError(f"--attention-backend {refusal}")
    return device


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
        if not math.isfinite(length) or length <= 0:
            raise ValueError(f"multiplier {m} gives no length")
        if abs(length - round(length)) > 1e-9:
            raise ValueError(f"{m}x of length {id_length} is not a whole number of tokens")
        task.check_length(int(round(length)))
        lengths.append(int(round(length)))
    return lengths


@torch.no_grad()
def greedy_accuracy(model, task, examples, *, device, autocast_dtype=None, batch_size: int = 64,
                    max_batch_tokens: int = 32768, on_batch=None, cuda_graph: bool = False) -> dict:
    """Greedy-decode every prompt with the KV cache; score target + EOS. Returns counts and rates,
    "exact_by_sample" (1 for each example decoded exactly, 0 otherwise, in the order of `examples`: two
    evaluations of one test set compare sample by sample), and for a task whose answers copy source tokens
    (Task.answer_sources) "source_tenth_accuracy": the accuracy of the answer tokens copied from each tenth of
    the source, first tenth first (None for a tenth no answer comes from). `on_batch(n)` (optional) is called
    after each batch with the number of samples it held."""
    from asentmax.tasks.base import BOS, EOS, SEP

    exact_by_sample, correct, total = [0] * len(examples), 0, 0
    tenth_correct = np.zeros(SOURCE_PARTS, dtype=np.int64)
    tenth_total = np.zeros(SOURCE_PARTS, dtype=np.int64)
    copies = True
    key = lambda e: (len(e.source) + 2, len(e.target))
    for indices in shape_batches(examples, key, batch_size, max_batch_tokens):
        group = [examples[i] for i in indices]
        prompts = torch.tensor([[BOS, *e.source, SEP] for e in group], dtype=torch.long, device=device)
        expected = torch.tensor([[*e.target, EOS] for e in group], dtype=torch.long, device=device)
        with precision.autocast(device, autocast_dtype):
            out = model.generate(prompts, expected.shape[1], temperature=0.0, cuda_graph=cuda_graph)
        hits = out[:, prompts.shape[1]:] == expected
        for i, right in zip(indices, hits.all(1).tolist(), strict=True):
            exact_by_sample[i] = int(right)
        correct += int(hits.sum())
        total += hits.numel()
        copies = copies and _count_by_source_part(task, group, hits.cpu().numpy(), tenth_correct, tenth_total)
        if on_batch is not None:
            on_batch(len(indices))
    scores = exact_scores(exact_by_sample, correct, total)
    if copies and tenth_total.any():
        scores["source_tenth_accuracy"] = [float(c / t) if t else None
                                           for c, t in zip(tenth_correct, tenth_total, strict=True)]
    return scores


def answer_accuracy(model, task, examples, *, device, autocast_dtype=None, batch_size: int = 64,
                    max_batch_tokens: int = 32768, on_batch=None, cuda_graph: bool = False) -> dict:
    """The test scores of `examples` (keys as greedy_accuracy's): greedy decoding, or for a tagging task
    (Task.tagging) the argmax label at every source token of one forward pass, which is all its answer is."""
    if not task.tagging:
        return greedy_accuracy(model, task, examples, device=device, autocast_dtype=autocast_dtype,
                               batch_size=batch_size, max_batch_tokens=max_batch_tokens, on_batch=on_batch,
                               cuda_graph=cuda_graph)
    return exact_scores(*teacher_forced_counts(
        model, task, examples, device=device, autocast_dtype=autocast_dtype, batch_size=batch_size,
        max_batch_tokens=max_batch_tokens, on_batch=on_batch))


def exact_scores(exact_by_sample: list[int], correct: int, total: int) -> dict:
    """An evaluation row's counts and rates from each sample's exact match (1/0) and the answer tokens right
    out of all scored."""
    exact = sum(exact_by_sample)
    return {"n": len(exact_by_sample), "n_exact": exact, "exact_match": exact / len(exact_by_sample),
            "token_accuracy": correct / total, "exact_by_sample": exact_by_sample}


def _count_by_source_part(task, examples, hits, part_correct, part_total) -> bool:
    """Add each answer token's hit (hits: (B, >= len(target))) to the part of the source it copies from
    (len(part_total) equal parts); False, counting nothing, for a task whose answers copy no source token."""
    parts = len(part_total)
    for example, row in zip(examples, hits, strict=True):
        sources = task.answer_sources(example)
        if sources is None:
            return False
        copied = [(position, hit) for position, hit in zip(sources, row, strict=False)  # row: + EOS
                  if position is not None]
        if not copied:
            continue
        positions, hit = (np.asarray(column) for column in zip(*copied, strict=True))
        part = positions * parts // len(example.source)
        np.add.at(part_correct, part, hit.astype(np.int64))
        np.add.at(part_total, part, 1)
    return True


def at_answers(stats, scored: torch.Tensor, name: str) -> torch.Tensor:
    """Attention statistic `name` (asentmax.nn.stats.AttentionStats) of every layer at the scored queries
    (`scored`, (B, T) bool) as (layers, heads, scored queries)."""
    values = torch.stack([getattr(s, name).float() for s in stats])  # (L, B, H, T)
    return values.transpose(1, 2)[:, :, scored]


@torch.no_grad()
def answer_dispersion(model, task, examples, *, device) -> dict:
    """Attention statistics (asentmax.nn.stats) at the scored (answer) positions of a teacher-forced pass:
    means over layers, heads and those queries of the normalised entropy H(p) / log n and support size;
    per layer; and per layer and head ([layer][head]) of the support size and of theta, the inverse
    temperature (ASEntmax's delta + beta log(n + 1)^gamma, SSMax's; 1 for a head without one), which tells
    whether a head sharpens or flattens its attention as the length grows."""
    batch = collate(task, examples).to(device)
    _, stats = model(batch.input_ids, return_stats=True)
    scored = batch.labels != IGNORE_INDEX  # (B, T)
    entropy, support, theta = (at_answers(stats, scored, name)
                               for name in ("normalised_entropy", "support_size", "theta"))
    return {"normalised_entropy": float(entropy.mean()),
            "support_size": float(support.mean()),
            "normalised_entropy_per_layer": entropy.flatten(1).mean(1).tolist(),
            "support_size_per_layer": support.flatten(1).mean(1).tolist(),
            "support_size_per_head": support.mean(2).tolist(),
            "theta_per_head": theta.mean(2).tolist(),
            "n_samples": len(examples)}


def estimate_seconds(rows: list[dict], length: int, samples: int) -> float | None:
    """Seconds to evaluate `samples` samples at `length`, extrapolated from the rows measured at shorter
    lengths: time per sample ~ length^p, with p fitted on the last two such rows and kept in [1, 2]
    (2, the prompt's attention cost, with one row). None without a shorter measured row."""
    shorter = sorted((r for r in rows if r["length"] < length and r.get("seconds", 0) > 0),
                     key=lambda r: r["length"])
    if not shorter:
        return None
    last = shorter[-1]
    per_sample = last["seconds"] / last["n"]
    power = 2.0
    if len(shorter) > 1:
        before = shorter[-2]
        ratio = per_sample / (before["seconds"] / before["n"])
        power = min(2.0, max(1.0, math.log(ratio) / math.log(last["length"] / before["length"])))
    return per_sample * (length / last["length"]) ** power * samples


def print_note(line: str) -> None:
    """The default `note` of the drivers below: a warning or note line on stderr, where `asentmax train`
    prints its own."""
    print(line, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else (f"{seconds / 60:.0f} min" if seconds < 7200
                                                      else f"{seconds / 3600:.1f} h")


def examples_for_length(task, length: int, samples: int, seed: int, tables: str = "train"):
    """(the task the set was drawn from, its examples): `asentmax eval`'s test set of one length,
    make_eval_set of `task` or, with tables="fresh", of a copy with new word tables (Task.with_fresh_tables,
    from numpy's default_rng([seed, length, TABLES_STREAM])), as the paper's code draws every test set."""
    from asentmax.tasks import make_eval_set

    length_task = (task.with_fresh_tables(np.random.default_rng([seed, length, TABLES_STREAM]))
                   if tables == "fresh" else task)
    return length_task, make_eval_set(length_task, length, samples, seed)


def evaluate(model, task, lengths, *, samples: int, seed: int, device, autocast_dtype=None,
             batch_size: int = 64, max_batch_tokens: int = 32768, confidence: float = 0.95,
             dispersion_samples: int = 0, dispersion_max_tokens: int = 2048, done=(), on_row=None,
             progress: bool = False, log=print, note=print_note, tables: str = "train",
             estimate_threshold_s: float = ESTIMATE_THRESHOLD_S, cuda_graph: bool = False) -> list[dict]:
    """One row per length, shortest first: exact match (+ Wilson interval; which samples in
    exact_by_sample, and the set's eval_set_digest as test_set_digest), per-token accuracy, seconds taken,
    and (for sequences up to dispersion_max_tokens) attention dispersion on the first
    dispersion_samples examples. Rows in `done` (earlier results) are kept and their lengths skipped;
    `on_row(rows)` gets every row so far after each length; `progress` shows a bar over the samples;
    `log` gets each length's result line, `note` the estimate announced before a long length.
    `tables="fresh"`: each length's set is drawn with new word tables (examples_for_length); `cuda_graph`:
    decoding steps replayed from CUDA graphs (generate)."""
    from tqdm.auto import tqdm

    rows = {row["length"]: row for row in done}
    model.eval()
    for length in sorted(set(lengths) - set(rows)):
        estimate = estimate_seconds(list(rows.values()), length, samples)
        if estimate is not None and estimate > estimate_threshold_s:
            note(f"length {length}: estimated {_duration(estimate)} on {torch.device(device).type} "
                "(extrapolated from the shorter lengths); finished lengths are saved, so Ctrl-C and the "
                "same command later continue from there")
        start = time.perf_counter()
        length_task, examples = examples_for_length(task, length, samples, seed, tables)
        with tqdm(total=samples, desc=f"length {length}", unit="sample", disable=not progress,
                  leave=False) as bar:
            scores = answer_accuracy(model, length_task, examples, device=device,
                                     autocast_dtype=autocast_dtype, batch_size=batch_size,
                                     max_batch_tokens=max_batch_tokens, on_batch=bar.update,
                                     cuda_graph=cuda_graph)
        low, high = wilson_interval(scores["n_exact"], scores["n"], confidence)
        row = {"length": length, **scores, "ci_low": low, "ci_high": high,
               "test_set_digest": eval_set_digest(examples)}
        subset = examples[:dispersion_samples]
        if subset and max(len(e.source) + len(e.target) + 2 for e in subset) <= dispersion_max_tokens:
            row["dispersion"] = answer_dispersion(model, length_task, subset, device=device)
        row["seconds"] = time.perf_counter() - start
        rows[length] = row
        log(f"length {length}: exact match {100 * row['exact_match']:.1f}% ({row['n_exact']}/{row['n']}), "
            f"{row['seconds']:.1f}s")
        if "source_tenth_accuracy" in row:
            tenths = " ".join("-" if v is None else f"{100 * v:.1f}" for v in row["source_tenth_accuracy"])
            log(f"length {length}: token accuracy % by the tenth of the source the answers copy: {tenths}")
        if on_row is not None:
            on_row(sorted(rows.values(), key=lambda r: r["length"]))
    return sorted(rows.values(), key=lambda r: r["length"])


def markdown_table(rows: list[dict], id_length: int, title: str) -> str:
    """Exact match % (with the interval) and token accuracy % per length multiplier; then, where rows have
    it, the accuracy % of the answer tokens by the tenth of the source they copy from."""
    lines = [f"### {title}", "", "| length | multiplier | exact match % | 95% CI | token acc % | n |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['length']} | {format_multiplier(row['length'] / id_length)} | "
                     f"{100 * row['exact_match']:.1f} | "
                     f"{100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f} | "
                     f"{100 * row['token_accuracy']:.1f} | {row['n']} |")
    by_part = [row for row in rows if row.get("source_tenth_accuracy")]
    if by_part:
        lines += ["", "Token accuracy % of the answers by where in the source they are copied from (tenths, "
                  "start first; '-': no answer from there):", "",
                  "| length | " + " | ".join(f"{10 * i}-{10 * i + 10}%" for i in range(SOURCE_PARTS)) + " |",
                  "|---|" + "---|" * SOURCE_PARTS]
        for row in by_part:
            cells = ("-" if value is None else f"{100 * value:.1f}"
                     for value in row["source_tenth_accuracy"])
            lines.append(f"| {row['length']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---- evaluation files ----

def _write_results(output: Path, result: dict) -> None:
    """<output>.json and <output>.md, each replaced atomically; the .md's title names the task (and its
    sample layout where not the default), the attention and the run (runs.run_name)."""

    write_json(output.with_suffix(".json"), result)
    model_config = result["model_config"]
    layout = saved_layout(result.get("workload") or {})
    task = result["task"] if layout == "random" else f"{result['task']} ({layout} layout)"
    title = f"{task}, {model_config.get('attention')} ({run_name(result)})"
    text = markdown_table(result["rows"], result["id_length"], title)
    if result["pending_lengths"]:
        text += f"\nNot evaluated yet: lengths {', '.join(map(str, result['pending_lengths']))}.\n"
    write_text(output.with_suffix(".md"), text)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- the `asentmax eval` driver ----

@dataclass
class EvalPlan:
    """Everything `asentmax eval` checked about one run before it starts computing (see plan_evaluation)."""

    run_dir: Path
    output: Path  # results go to output.json and output.md
    config: EvalConfig
    device: torch.device
    autocast_dtype: torch.dtype | None
    task: object
    model_config: object
    model_state: dict
    lengths: list[int]
    done: list[dict]  # rows reused from an earlier run of the same protocol
    cuda_graph: bool  # decoding steps replayed from CUDA graphs (--cuda-graphs)
    header: dict  # the result file without its rows
    notes: list[str]  # warnings and notes to print (on stderr) before starting


def _saved_task(run_dir: Path) -> tuple[str, int, str]:
    """(task name, longest training length, sample layout) of a synthetic-task run, from its config.json
    (the workload record the trainer writes; a run saved before layouts existed has "random"); RunError
    naming the file when it is unreadable or not such a run."""
    path = run_dir / CONFIG_NAME
    workload = read_json(path, "run config").get("workload")
    if not isinstance(workload, dict):
        raise RunError(f"{path} has no workload record; restore it from the run")
    if workload.get("name") != "task":
        raise RunError(f"{path} is a {workload.get('name')!r} run; `asentmax eval` scores synthetic-task "
                       "runs")
    if not (isinstance(workload.get("task"), str) and isinstance(workload.get("max_length"), int)
            and workload["max_length"] > 0):
        raise RunError(f"{path} has no task and max_length in its workload; restore it from the run")
    layout = saved_layout(workload)
    if not isinstance(layout, str):
        raise RunError(f"{path} has a layout that is not a name ({layout!r}); restore it from the run")
    return workload["task"], workload["max_length"], layout


def _model_from_checkpoint(path: Path, checkpoint: dict, attention_backend: str):
    """(ModelConfig, model state) of a loaded checkpoint, checked by building the model once."""
    from asentmax.nn import ModelConfig, Transformer

    try:
        model_config = ModelConfig.from_dict(checkpoint["model_config"])
        if attention_backend:
            model_config = replace(model_config, attention_backend=attention_backend)
        Transformer(model_config).load_state_dict(checkpoint["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise RunError(f"{path} does not hold a model this version can build ({reason})") from None
    return model_config, checkpoint["model"]


def resolve_multipliers(config: EvalConfig, id_length: int, device: torch.device,
                        defaults: tuple[float, ...]) -> tuple[tuple, list]:
    """(multipliers to evaluate, defaults left out): the explicit ones, or the task's `defaults`
    (Task.eval_multipliers), on the CPU only up to config.cpu_max_length tokens (at least 1x)."""
    if config.multipliers:
        return tuple(config.multipliers), []
    if device.type != "cpu" or not config.cpu_max_length:
        return tuple(defaults), []
    kept = tuple(m for m in defaults if m == 1 or id_length * m <= config.cpu_max_length)
    return kept, [m for m in defaults if m not in kept]


def _saved_protocol(evaluation: dict) -> dict | None:
    """The protocol an evaluation file records (a file from before --tables: the run's own tables), or None
    for a file written before protocols were recorded."""
    saved = evaluation.get("protocol")
    return {"tables": "train", **saved} if isinstance(saved, dict) else None


def _reusable_rows(path: Path, protocol: dict, fresh: bool) -> tuple[list[dict], list[str], str | None]:
    """Rows of an earlier evaluation at `path` made with the same protocol, notes to print, and the file that
    evaluation took its rows from (its rows_from), if any."""
    for target in (path, path.with_suffix(".md")):
        if target.exists() and not target.is_file():
            raise RunError(f"{target} is not a file; move it away or pass --output")
    if fresh or not path.exists():
        return [], [], None
    try:
        earlier = load_evaluation(path)
    except RunError as error:
        raise RunError(f"{error} (or pass --fresh to replace it)") from None
    saved = _saved_protocol(earlier)
    if saved is None:
        return [], [f"{path} was written by an older asentmax (no protocol recorded); it will be "
                    "replaced"], None
    if {k: saved.get(k) for k in ("checkpoint_sha256", "train_step")} != \
            {k: protocol[k] for k in ("checkpoint_sha256", "train_step")}:
        return [], [f"{path} holds results of an earlier checkpoint; it will be replaced"], None
    differ = [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in protocol.items() if saved.get(k) != v]
    if differ:
        raise RunError(f"{path} was made with other settings ({'; '.join(differ)}); pass --fresh to replace "
                       "it or --output to write elsewhere")
    return earlier["rows"], [], earlier.get("rows_from")


def _same_weights(a: dict, b: dict) -> bool:
    """Whether two checkpoints hold the same model weights, bit for bit."""
    return a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][name], b["model"][name])
                                                          for name in a["model"])


def _rows_of_the_last_checkpoint(run_dir: Path, tables: str, protocol: dict,
                                 lengths: set[int]) -> tuple[Path, list[dict]]:
    """(the path, its rows at `lengths`) of the run's evaluation of its checkpoint.pt as it is now (by
    sha256) on `tables` (its default output), where it was made with `protocol` but for the checkpoint:
    what an evaluation of a best.pt with the same weights would compute again. No rows where there is no
    such file or it was made otherwise."""
    path = run_dir / (evaluation_name("last", tables) + ".json")
    try:
        earlier = load_evaluation(path) if path.is_file() else None
    except RunError:
        earlier = None
    saved = None if earlier is None else _saved_protocol(earlier)
    apart_from_checkpoint = [key for key in protocol if key not in ("checkpoint", "checkpoint_sha256")]
    if (saved is None or any(saved.get(key) != protocol[key] for key in apart_from_checkpoint)
            or saved.get("checkpoint_sha256") != _sha256(run_dir / CHECKPOINT_NAME)):
        return path, []
    return path, [row for row in earlier["rows"] if row["length"] in lengths]


def plan_evaluation(run_dir: Path | str, config: EvalConfig, output: Path | str | None = None, *,
                    fresh: bool = False) -> EvalPlan:
    """Check everything about evaluating `run_dir` that can fail before any computing (ValueError /
    RunError, one line): the settings, the device, config.json, the checkpoint, the lengths, the output
    location and an earlier result file there. Nothing is written."""
    from asentmax.tasks import TASK_NAMES
    from asentmax.tasks.registry import fresh_tables_refusal
    from asentmax.tasks.workload import build_task

    config.validate()
    device = eval_device(config)
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run dir {run_dir} {'is not a directory' if run_dir.exists() else 'does not exist'}")
    task_name, max_length, layout = _saved_task(run_dir)
    best = config.checkpoint == "best"
    checkpoint_path = run_dir / (BEST_NAME if best else CHECKPOINT_NAME)
    if best and not checkpoint_path.is_file():
        raise RunError(f"no {BEST_NAME} in {run_dir}: only a run trained with --keep-best-at keeps one")
    checkpoint = load_checkpoint(checkpoint_path)
    model_config, model_state = _model_from_checkpoint(checkpoint_path, checkpoint, config.attention_backend)
    refusal = backend_refusal(model_config.attention_backend, device.type)
    if refusal is not None:  # a run trained with --attention-backend triton, evaluated on the CPU
        raise RunError(f"{checkpoint_path}: attention backend {refusal} (--attention-backend chunked)")
    try:
        cuda_graph = decodes_with_cuda_graph(config.cuda_graphs, model_config, device.type)
    except ValueError as error:
        raise RunError(str(error)) from None
    if task_name not in TASK_NAMES:
        raise RunError(f"{run_dir / CONFIG_NAME} names an unknown task {task_name!r}")
    try:
        task = build_task(task_name, layout)  # the layout the run trained on: its eval sets' layout
    except ValueError as error:
        raise RunError(f"{run_dir / CONFIG_NAME}: {error}") from None
    refusal = fresh_tables_refusal(task_name) if config.tables == "fresh" else None
    if refusal is not None:
        raise RunError(refusal)
    mismatch = task.vocab_mismatch(model_config.vocab_size)
    if mismatch is not None:  # the run trained on the task's ids: its samples changed since
        raise RunError(f"{checkpoint_path}: {mismatch} now (its samples changed since the run trained: "
                       "retrain it)")
    saved_workload = checkpoint.get("workload")
    if (not isinstance(saved_workload, dict) or saved_workload.get("task") != task_name
            or saved_layout(saved_workload) != layout):
        raise RunError(f"{checkpoint_path} is not the checkpoint of the {task_name} run ({layout} layout) "
                       f"that {run_dir / CONFIG_NAME} describes")
    id_length = config.id_length or max_length
    multipliers, left_out = resolve_multipliers(config, id_length, device, task.eval_multipliers)
    lengths = multiplier_lengths(id_length, multipliers, task)
    if output is None:
        output = run_dir / evaluation_name(config.checkpoint, config.tables)
    output = Path(output)
    folder = output.parent
    if folder.exists() and not folder.is_dir():
        raise RunError(f"cannot write {output}.json: {folder} is a file")
    autocast_dtype = precision.autocast_dtype(config.amp, device)
    protocol = {"checkpoint_sha256": _sha256(checkpoint_path), "train_step": checkpoint["step"],
                "id_length": id_length, "device_type": device.type,
                "autocast": "bf16" if autocast_dtype is not None else "off",
                **{k: v for k, v in asdict(config).items()
                   if k not in ("multipliers", "batch_size", "max_batch_tokens", "cpu_max_length", "device",
                                "amp", "cuda_graphs")}}
    # rows_from_last: the evaluation of checkpoint.pt whose rows this one takes (or took, continuing its file)
    done, notes, rows_from_last = _reusable_rows(output.with_suffix(".json"), protocol, fresh)
    last = None  # checkpoint.pt beside best.pt: where the run's training got to, and maybe the same weights
    if best and (run_dir / CHECKPOINT_NAME).is_file():
        try:
            last = load_checkpoint(run_dir / CHECKPOINT_NAME)
        except RunError:  # best.pt alone can be evaluated; where training got to is then unknown
            last = None
    from_last = []
    missing = set(lengths) - {row["length"] for row in done}
    if (missing and last is not None and last["step"] == checkpoint["step"]
            and _same_weights(last, checkpoint)):
        path, from_last = _rows_of_the_last_checkpoint(run_dir, config.tables, protocol, missing)
        if from_last:
            done += from_last
            rows_from_last = path
            notes.append(f"{BEST_NAME} holds the weights of {CHECKPOINT_NAME} (step {checkpoint['step']}): "
                         f"lengths {', '.join(str(row['length']) for row in from_last)} are taken from "
                         f"{path}, the same weights on the same samples")
    if left_out:
        notes.append(f"on the CPU the default multipliers stop at {config.cpu_max_length} tokens: leaving "
                     f"out {' '.join(f'{m}x' for m in left_out)} (give --multipliers to run them)")
    reused = sorted({row["length"] for row in done} & set(lengths))
    taken_from_last = {row["length"] for row in from_last}
    continued = [length for length in reused if length not in taken_from_last]
    if continued:
        notes.append(f"continuing {output}.json: lengths {', '.join(map(str, continued))} are done")
    first = min(set(lengths) - set(reused), default=None)
    if first is not None and first > id_length and estimate_seconds(done, first, config.samples) is None:
        notes.append(f"length {first} ({format_multiplier(first / id_length)}) is the first length: no time "
                     "estimate, nothing shorter is measured to extrapolate from (a shorter multiplier first, "
                     "e.g. 1, gives one)")
    header = {"run_dir": str(run_dir), "task": task.name, "id_length": id_length,
              "eval_config": {**asdict(config), "multipliers": list(multipliers)}, "protocol": protocol,
              "model_config": asdict(model_config), "train_config": checkpoint.get("train_config"),
              "workload": saved_workload, "train_step": checkpoint["step"],
              "escape_step": checkpoint.get("escape_step"),
              "prior_samples": checkpoint.get("prior_samples", 0),
              **({"prior_recipe": checkpoint["prior_recipe"]} if checkpoint.get("prior_recipe") else {}),
              "git_commit": git_commit(),
              "device": describe_device(device), "cuda_graph": cuda_graph,
              **({"rows_from": str(rows_from_last)} if rows_from_last else {})}
    if last is not None:  # where the run's training got to, for training_cut
        header["last_checkpoint"] = {"step": last["step"], "steps": planned_end(last.get("train_config"),
                                                                               last.get("escape_step"))}
    cut = training_cut(header)
    if cut:
        notes.insert(0, f"warning: run {run_dir} stopped at step {cut[0]} of {cut[1]} planned; evaluating "
                        + (f"{BEST_NAME}, of step {checkpoint['step']}" if best else
                           f"the checkpoint of step {cut[0]}")
                        + f" (`asentmax train --run-dir {run_dir} --resume` trains it to the end)")
    return EvalPlan(run_dir=run_dir, output=output, config=config, device=device,
                    autocast_dtype=autocast_dtype, task=task, model_config=model_config,
                    model_state=model_state, lengths=lengths, done=done, cuda_graph=cuda_graph, header=header,
                    notes=notes)


def run_evaluation(plan: EvalPlan, *, progress: bool = False, log=print, note=print_note) -> dict:
    """Evaluate a plan's lengths not done yet, rewriting <output>.json/.md after each; returns the result."""
    from asentmax.nn import Transformer

    model = Transformer(plan.model_config)
    model.load_state_dict(plan.model_state)
    model.to(plan.device).eval()
    config = plan.config
    plan.output.parent.mkdir(parents=True, exist_ok=True)
    result = dict(plan.header)

    def save(rows):
        result["rows"] = rows
        result["pending_lengths"] = sorted(set(plan.lengths) - {row["length"] for row in rows})
        _write_results(plan.output, result)

    rows = evaluate(model, plan.task, plan.lengths, samples=config.samples, seed=config.seed,
                    device=plan.device, autocast_dtype=plan.autocast_dtype, batch_size=config.batch_size,
                    max_batch_tokens=config.max_batch_tokens, confidence=config.confidence,
                    dispersion_samples=config.dispersion_samples,
                    dispersion_max_tokens=config.dispersion_max_tokens, done=plan.done, on_row=save,
                    progress=progress, log=log, note=note, tables=config.tables, cuda_graph=plan.cuda_graph)
    save(rows)
    return result


def evaluate_run(run_dir: Path | str, config: EvalConfig, output: Path | str | None = None, *,
                 fresh: bool = False, progress: bool = False, log=print, note=print_note) -> dict:
    """plan_evaluation then run_evaluation: evaluate a run's checkpoint at every multiplier and write
    <output>.json and .md (default run_dir/eval), continuing an earlier evaluation of the same protocol."""
    plan = plan_evaluation(run_dir, config, output, fresh=fresh)
    for line in plan.notes:
        note(line)
    return run_evaluation(plan, progress=progress, log=log, note=note)
