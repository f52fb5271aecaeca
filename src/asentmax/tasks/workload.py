"""The synthetic tasks as a training workload (docs/method.md section 6, reference training).

`TaskWorkload` is what `asentmax.trainer.train` runs for a task: it draws the length-bucketed training
batches (asentmax.tasks.device_sampling.training_batches: on CUDA drawn on the GPU for the paper's tasks,
else asentmax.data's numpy path; a pure function of seed, rank and step either way, so a run resumes
exactly and every data-parallel rank reads its own shard), validates with teacher-forced exact match at
a few multiples of the longest training length (rank 0 only; with keep-best-at, its exact match at one of
them is the selection score of best.pt; the validation stall check reads the exact match at stall-val-at,
or else at keep-best-at), and builds the task's preset model. Its
fields are the task-specific settings of a run; `to_dict()` / `from_dict()` store and rebuild it from a
checkpoint.

Presets belong to the tasks (`Task.train_preset`, `Task.model_preset` in each task's file): this file
reads them and knows no task by name, so a new task needs no edit here or in the trainer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

import torch

from asentmax.data import Batch, length_buckets
from asentmax.tasks.base import Task
from asentmax.tasks.device_sampling import training_batches, uses_device_sampler
from asentmax.tasks.eval_sets import make_eval_set
from asentmax.tasks.registry import get_task, task_options
from asentmax.tasks.scoring import teacher_forced_accuracy

# the model sizes a task without a model preset needs from the user
ARCHITECTURE_FIELDS = ("d_model", "n_layers", "n_heads", "d_ff")


def build_task(name: str, layout: str = "random") -> Task:
    """Task `name` with sample layout `layout`, for the tasks that take one (mqmtar's asentmax.tasks.mqmtar
    LAYOUTS); the others lay their samples out one way and accept "random" only. ValueError otherwise."""
    if "layout" in task_options(name):
        return get_task(name, layout=layout)
    if layout != "random":
        raise ValueError(f"layout {layout!r}: task {name!r} lays out its samples one way only (random)")
    return get_task(name)


@dataclass
class TaskWorkload:
    """Training and validation data of one synthetic task."""

    name: ClassVar[str] = "task"

    task: str = field(default="copy", metadata={"help": "synthetic task name (asentmax.tasks.TASK_NAMES)"})
    min_length: int = field(default=32, metadata={"help": "shortest training length"})
    max_length: int = field(default=64, metadata={"help": "longest training length (the 'ID' length)"})
    length_buckets: int = field(default=4, metadata={"help": "training-length buckets (batches share one)"})
    val_multipliers: tuple[int, ...] = field(
        default=(1, 2, 4), metadata={"help": "validation lengths as multiples of max-length"})
    val_samples: int = field(default=64, metadata={"help": "validation samples per length"})
    keep_best_at: int = field(default=0, metadata={"help": (
        "one of val-multipliers: keep the weights of the validation with the highest exact match at that "
        "length (ties: the higher token accuracy) in best.pt (`asentmax eval --checkpoint best`), as the "
        "paper's code picks the checkpoint it tests (results/paper/README.md); 0: off")})
    stall_val_at: tuple[int, ...] = field(default=(), metadata={"default_help": "keep-best-at's", "help": (
        "among val-multipliers: the length whose validation exact match each --stall-val-step check reads "
        "(one value: every check's; else one per check). MQMTAR's dense-start recipe keeps best.pt at 256x, "
        "where all its runs score near 0 at step 12,800; at 16x its two runs that never generalised past 16x "
        "scored 0.27 there and its eight that did 0.67-0.84 (results/paper/mqmtar.md, fifty-sixth session), "
        "e.g. --stall-val-at 16 --stall-val-step 12800 --stall-val-score 0.5; by default keep-best-at's "
        "length")})
    sampling: str = field(default="auto", metadata={"help": (
        "training batches: auto (drawn on the GPU for mqmtar/copy/reverse/sort on CUDA, else numpy on the "
        "host) | device (torch on the training device, CPU too) | host (numpy); the two paths draw "
        "different batches of the same distribution (asentmax.tasks.device_sampling)")})
    layout: str = field(default="random", metadata={"help": (
        "mqmtar's sample layout, for training, validation and `asentmax eval`: random (the pairs at "
        "uniformly random places in the blanks) | stretches (pair j alone in the j-th of P stretches of "
        "L // P tokens, as the paper's code lays out its samples: results/paper/README.md); other tasks: "
        "random")})
    lookalikes: float = field(default=0.0, metadata={"help": (
        "mqmtar, training batches only: the share of samples given one planted look-alike of a queried key "
        "(a key sharing one of its tokens, or its word as another pair's value: what long test contexts "
        "hold by chance and the failing models confuse, results/paper/mqmtar/collisions.md); validation "
        "and `asentmax eval` draw the paper's samples; 0: the paper's training samples")})
    lookalike_kinds: tuple[str, ...] = field(default=(), metadata={"default_help": "all", "help": (
        "mqmtar with --lookalikes: which look-alikes to plant, among first (a key sharing the queried key's "
        "first token), second (its second token) and value (its word as another pair's value)")})

    @property
    def title(self) -> str:
        return self.task

    def __post_init__(self):
        self.val_multipliers = tuple(self.val_multipliers)
        self.lookalike_kinds = tuple(self.lookalike_kinds)
        if isinstance(self.stall_val_at, int):  # saved as one number before checks were lists (0: none)
            self.stall_val_at = (self.stall_val_at,) if self.stall_val_at else ()
        self.stall_val_at = tuple(self.stall_val_at)
        self.task_object = build_task(self.task, self.layout)  # ValueError for an unknown task or layout
        self.training_task = self.task_object
        if self.lookalike_kinds and not self.lookalikes:
            raise ValueError("--lookalike-kinds: only with --lookalikes (a share of samples above 0)")
        if self.lookalikes:
            if "lookalikes" not in task_options(self.task):
                raise ValueError(f"--lookalikes: task {self.task!r} has no keys to plant look-alikes of "
                                 "(mqmtar has)")
            self.training_task = get_task(self.task, layout=self.layout, lookalikes=self.lookalikes,
                                          lookalike_kinds=self.lookalike_kinds)
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 <= min-length <= max-length, got {self.min_length}, {self.max_length}")
        for name in ("length_buckets", "val_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.val_multipliers or any(m < 1 for m in self.val_multipliers):
            raise ValueError(f"val-multipliers must be >= 1, got {self.val_multipliers}")
        named = [("keep_best_at", self.keep_best_at), *(("stall_val_at", m) for m in self.stall_val_at)]
        for name, value in named:
            if value and value not in self.val_multipliers:
                raise ValueError(f"{name.replace('_', '-')} must be 0 or one of the val-multipliers "
                                 f"({' '.join(map(str, self.val_multipliers))}), got {value}")
        for length in (self.min_length, self.max_length):
            self.task_object.check_length(length)
        uses_device_sampler(self.task_object, "cpu", self.sampling)  # ValueError for a bad mode or task
        self._val_sets: dict[int, list] | None = None

    # ---- presets ----

    def train_preset(self) -> dict:
        """The task's TrainConfig settings (lr, steps, warm-up, ...) as a dict of field values."""
        return dict(self.task_object.train_preset)

    def model_config(self, overrides: dict | None = None):
        """The task's preset ModelConfig with `overrides`; a task without a model preset needs the
        architecture (d_model, n_layers, n_heads, d_ff) in `overrides` and raises ValueError otherwise."""
        from asentmax.nn import ModelConfig

        overrides = dict(overrides or {})
        preset = self.task_object.model_preset
        if preset is not None:
            return preset(self.task_object.vocab_size, **overrides)
        missing = [name for name in ARCHITECTURE_FIELDS if name not in overrides]
        if missing:
            raise ValueError(f"task {self.task!r} has no model preset; give "
                             + ", ".join(f"--{name.replace('_', '-')}" for name in missing))
        return ModelConfig(vocab_size=self.task_object.vocab_size, **overrides)

    def check_model(self, model_config) -> None:
        """The model's vocabulary must be the task's (Task.vocab_mismatch): `asentmax eval` refuses a run
        whose vocabulary differs, so training refuses it too."""
        mismatch = self.task_object.vocab_mismatch(model_config.vocab_size)
        if mismatch is not None:
            raise ValueError(f"model vocab_size {model_config.vocab_size}: {mismatch}")

    # ---- the Workload protocol of asentmax.trainer ----

    def batches(self, *, seed: int, start_step: int, rank: int, world_size: int, local_batch_size: int,
                device: torch.device) -> Iterator[Batch]:
        """The training batches of steps start_step, start_step + 1, ... on `rank` (its shard)."""
        buckets = length_buckets(self.min_length, self.max_length, self.length_buckets)
        return training_batches(self.training_task, buckets, seed=seed, start_step=start_step, rank=rank,
                                local_batch_size=local_batch_size, device=device, sampling=self.sampling)

    def validate(self, model, *, seed: int, step: int, device, autocast_dtype) -> list[dict]:
        """One row per validation length: length, exact_match, token_accuracy (teacher-forced)."""
        if self._val_sets is None:
            self._val_sets = {self.max_length * m: make_eval_set(self.task_object, self.max_length * m,
                                                                 self.val_samples, seed=seed + 1)
                              for m in self.val_multipliers}
        return [{"length": length, **teacher_forced_accuracy(model, self.task_object, examples, device=device,
                                                             autocast_dtype=autocast_dtype)}
                for length, examples in self._val_sets.items()]

    def stall_score_error(self, checks: int) -> str | None:
        """Why this workload cannot score `checks` validation stall checks, in one line (no stall-val-at and
        no keep-best-at, or a count of stall-val-at values that does not pair up), else None."""
        if not (self.stall_val_at or self.keep_best_at):
            return ("--stall-val-step stops a run by a validation score, and this run keeps none (a task "
                    "run keeps one with --stall-val-at M or --keep-best-at M: the exact match at M x the "
                    "training length)")
        if len(self.stall_val_at) > 1 and len(self.stall_val_at) != checks:
            return (f"stall-val-at needs one value or one per --stall-val-step ({checks}), got "
                    f"{len(self.stall_val_at)}")
        return None

    def stall_score(self, rows: list[dict], check: int) -> float:
        """What validation stall check `check` (0-based, of --stall-val-step's) reads: the exact match of
        `rows` (validate's) at its stall-val-at x max-length, or at keep-best-at's length without one."""
        multipliers = self.stall_val_at or (self.keep_best_at,)
        return self._row_at(rows, multipliers[check if len(multipliers) > 1 else 0])["exact_match"]

    def selection_score(self, rows: list[dict]) -> tuple[float, float] | None:
        """What best.pt is kept by (higher is better): (exact match, token accuracy) of `rows` (validate's)
        at keep-best-at x max-length, or None when keep-best-at is off. Token accuracy breaks ties of exact
        match, such as a run whose exact match there is 0 at every validation (best.pt would otherwise be
        the first validation's weights)."""
        if not self.keep_best_at:
            return None
        row = self._row_at(rows, self.keep_best_at)
        return row["exact_match"], row["token_accuracy"]

    def _row_at(self, rows: list[dict], multiplier: int) -> dict:
        """The row of `rows` (validate's) at `multiplier` x max-length (one of val-multipliers)."""
        return next(row for row in rows if row["length"] == self.max_length * multiplier)

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self)}

    @classmethod
    def from_dict(cls, values: dict) -> TaskWorkload:
        """The workload `to_dict` saved; ValueError for keys that are not fields."""
        values = {key: value for key, value in values.items() if key != "name"}
        values.setdefault("sampling", "host")  # runs saved before device sampling drew numpy batches
        # a run saved before `layout` existed gets its default, "random" (as asentmax.runs.saved_layout)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown task workload settings: {', '.join(sorted(unknown))}")
        return cls(**values)
