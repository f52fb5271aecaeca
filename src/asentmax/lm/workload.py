"""The language-modelling workload of the shared trainer (arXiv:2506.16640, section 5): windows of one
document at the training context (asentmax.lm.dataset), next-token loss on every real token, the model
from a size preset and an attention preset.

Attention presets (the paper's section-5 models, NAPE positions unless named otherwise):
  softmax_rope   softmax with RoPE (the usual baseline)      softmax_nape   softmax
  ssmax_nape     scalable softmax (delta form)               entmax_nape    1.5-entmax
  asentmax_nape  ASEntmax (alpha 1.5, adaptive temperature on the NoPE heads)
Sizes: the model presets of asentmax.nn (lm_tiny for tests, lm_25m, lm_120m) at the tokenizer's vocabulary.

Batches are a pure function of (seed, rank, step), the seed being the trainer's: sample
s = (step * world_size + rank) * local_batch + i of the whole run reads window perm_e[s mod W] of epoch
e = s // W, perm_e a permutation seeded by (seed, e). So a run resumes exactly at any step and the ranks
read disjoint shards of one global batch.

Retrieval exercises (`retrieval_share`, asentmax.lm.retrieval): sample j of the global batch of a step
becomes an exercise when u_j < retrieval_share, u the step's uniforms seeded by (seed, step); the exercise
itself is drawn from a generator seeded by (seed, s). With retrieval_share 0 the batches are the plain
windows, exactly as before the option existed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from asentmax import precision
from asentmax.data import IGNORE_INDEX, Batch
from asentmax.lm.dataset import Split, Windows, read_manifest, windows
from asentmax.lm.retrieval import RetrievalExercises
from asentmax.lm.tokenizer import LMTokenizer
from asentmax.nn import ModelConfig, lm_25m, lm_120m, lm_tiny

ATTENTION_PRESETS: dict[str, dict] = {
    "softmax_rope": dict(attention="softmax", position="rope"),
    "softmax_nape": dict(attention="softmax", position="nape"),
    "ssmax_nape": dict(attention="ssmax", position="nape"),
    "entmax_nape": dict(attention="entmax", position="nape"),
    "asentmax_nape": dict(attention="asentmax", position="nape"),
}
MODEL_SIZES = {"lm_tiny": lm_tiny, "lm_25m": lm_25m, "lm_120m": lm_120m}
CHOICE_STREAM, EXERCISE_STREAM = 0x5E1EC7, 0xE8E7C15E  # the retrieval generators' seed tags


@dataclass
class LMConfig:
    """What the LM workload needs besides the generic optimisation settings."""

    data: str = field(default="data/lm", metadata={"help": "folder written by `asentmax lm prepare`"})
    preset: str = field(default="asentmax_nape", metadata={"help": "attention preset: "
                                                           + " | ".join(ATTENTION_PRESETS)})
    size: str = field(default="lm_25m", metadata={"help": "model size: " + " | ".join(MODEL_SIZES)})
    context: int = field(default=512, metadata={"help": "training context (tokens per window)"})
    val_windows: int = field(default=512, metadata={"help": "validation windows (the first ones of the "
                                                            "valid split)"})
    val_batch_size: int = field(default=32, metadata={"help": "validation batch size"})
    retrieval_share: float = field(default=0.1, metadata={
        "help": "fraction of training windows rewritten as retrieval exercises (key -> value statements "
                "and a question whose completion is the value; asentmax.lm.retrieval); 0 = plain text"})

    def __post_init__(self):
        if self.preset not in ATTENTION_PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; "
                             f"expected one of {', '.join(ATTENTION_PRESETS)}")
        if self.size not in MODEL_SIZES:
            raise ValueError(f"unknown size {self.size!r}; expected one of {', '.join(MODEL_SIZES)}")
        for name in ("context", "val_windows", "val_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.retrieval_share <= 1.0:
            raise ValueError(f"retrieval_share must be in [0, 1], got {self.retrieval_share}")


def model_config_for(config: LMConfig, vocab_size: int, overrides: dict | None = None) -> ModelConfig:
    return MODEL_SIZES[config.size](vocab_size, **{**ATTENTION_PRESETS[config.preset], **(overrides or {})})


class LMWorkload:
    """Workload 2 of the trainer (the contract: model_config, batches, validate, to_dict)."""

    name = "lm"
    title = name  # the progress bar's label: no task name below the workload's

    def __init__(self, config: LMConfig):
        self.config = config
        folder = Path(config.data)
        self.manifest = read_manifest(folder)
        self.train_split = Split.load(folder / "train.npz")
        self.valid_split = Split.load(folder / "valid.npz")
        self.train_windows: Windows = windows(self.train_split, config.context)
        self.valid_windows: Windows = windows(self.valid_split, config.context)
        self._epoch_order: tuple[int, int, np.ndarray] | None = None  # (seed, epoch, permutation)
        self.exercises = (RetrievalExercises(LMTokenizer.load(folder), config.context)
                          if config.retrieval_share > 0 else None)

    @classmethod
    def from_dict(cls, values: dict) -> LMWorkload:
        """The workload `to_dict` saved; ValueError for keys that are not LMConfig fields."""
        values = {key: value for key, value in values.items() if key != "name"}
        values.setdefault("retrieval_share", 0.0)  # runs saved before the option trained on plain text
        unknown = set(values) - set(LMConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown lm workload settings: {', '.join(sorted(unknown))}")
        return cls(LMConfig(**values))

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self.config)}

    def model_config(self, overrides: dict | None = None) -> ModelConfig:
        return model_config_for(self.config, int(self.manifest["vocab_size"]), overrides)

    def check_model(self, model_config: ModelConfig) -> None:
        if model_config.vocab_size < int(self.manifest["vocab_size"]):
            raise ValueError(f"model vocab_size {model_config.vocab_size} < the tokenizer's "
                             f"{self.manifest['vocab_size']}")

    @property
    def targets_per_epoch(self) -> int:
        return self.train_windows.n_targets

    def _order(self, seed: int, epoch: int) -> np.ndarray:
        if self._epoch_order is None or self._epoch_order[:2] != (seed, epoch):
            rng = np.random.default_rng([seed, epoch])
            self._epoch_order = (seed, epoch, rng.permutation(len(self.train_windows)))
        return self._epoch_order[2]

    def window_indices(self, seed: int, step: int, rank: int, world_size: int,
                       local_batch_size: int) -> np.ndarray:
        """The training windows of `step` on `rank` (see the module docstring)."""
        n = len(self.train_windows)
        first = (step * world_size + rank) * local_batch_size
        samples = np.arange(first, first + local_batch_size, dtype=np.int64)
        out = np.empty(local_batch_size, dtype=np.int64)
        for epoch in np.unique(samples // n):
            here = samples // n == epoch
            out[here] = self._order(seed, int(epoch))[samples[here] % n]
        return out

    def exercise_rows(self, seed: int, step: int, rank: int, world_size: int,
                      local_batch_size: int) -> np.ndarray:
        """The rows of `step`'s batch on `rank` that become retrieval exercises (see the module docstring)."""
        if self.exercises is None:
            return np.zeros(0, dtype=np.int64)
        u = np.random.default_rng([seed, step, CHOICE_STREAM]).random(world_size * local_batch_size)
        return np.flatnonzero(u[rank * local_batch_size:(rank + 1) * local_batch_size]
                              < self.config.retrieval_share)

    def _insert_exercises(self, inputs: np.ndarray, labels: np.ndarray, index: np.ndarray, *, seed: int,
                          step: int, rank: int, world_size: int) -> None:
        """Rewrite the exercise rows of one batch in place: every real token of an exercise is scored."""
        local_batch_size, c = inputs.shape
        w = self.train_windows
        for row in self.exercise_rows(seed, step, rank, world_size, local_batch_size):
            sample = (step * world_size + rank) * local_batch_size + int(row)
            lo = int(w.starts[index[row]])
            window = self.train_split.tokens[lo:min(lo + c + 1, int(w.ends[index[row]]))].astype(np.int64)
            rng = np.random.default_rng([seed, sample, EXERCISE_STREAM])
            tokens = self.exercises.compose(window, rng).tokens
            # no shorter than the window, so it overwrites all of the window's real tokens and labels
            inputs[row, :len(tokens) - 1], labels[row, :len(tokens) - 1] = tokens[:-1], tokens[1:]

    def batches(self, *, seed: int, start_step: int, rank: int, world_size: int, local_batch_size: int,
                device: torch.device) -> Iterator[Batch]:
        step = start_step
        while True:
            index = self.window_indices(seed, step, rank, world_size, local_batch_size)
            inputs, labels = self.train_windows.arrays(self.train_split.tokens, index)
            if self.exercises is not None:
                self._insert_exercises(inputs, labels, index, seed=seed, step=step, rank=rank,
                                       world_size=world_size)
            yield Batch(torch.from_numpy(inputs).to(device, non_blocking=True),
                        torch.from_numpy(labels).to(device, non_blocking=True))
            step += 1

    def selection_score(self, rows: list[dict]) -> None:
        """No best.pt for language modelling (the Workload protocol of asentmax.trainer)."""
        return None

    def stall_score_error(self, checks: int) -> str:
        """No validation stall check for language modelling (the Workload protocol of asentmax.trainer)."""
        return ("--stall-val-step stops a run by a validation score, and this run keeps none (language "
                "modelling has no validation stall check)")

    def stall_score(self, rows: list[dict], check: int) -> None:
        """Never asked: stall_score_error refuses every check first."""
        return None

    @torch.no_grad()
    def validate(self, model, *, seed: int, step: int, device, autocast_dtype) -> list[dict]:
        """One row: mean next-token loss (and its perplexity) over the first val_windows windows of the
        valid split."""
        device = torch.device(device)
        n = min(self.config.val_windows, len(self.valid_windows))
        total, count = 0.0, 0
        was_training = model.training
        model.eval()
        for lo in range(0, n, self.config.val_batch_size):
            index = np.arange(lo, min(n, lo + self.config.val_batch_size))
            inputs, labels = self.valid_windows.arrays(self.valid_split.tokens, index)
            inputs, labels = torch.from_numpy(inputs).to(device), torch.from_numpy(labels).to(device)
            with precision.autocast(device, autocast_dtype):
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                                   reduction="sum")
            total += float(loss)
            count += int((labels != IGNORE_INDEX).sum())
        model.train(was_training)
        mean = total / max(count, 1)
        return [{"val_loss": mean, "val_ppl": math.exp(min(mean, 50.0))}]
