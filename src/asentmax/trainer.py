"""The one training engine: it runs any workload (the synthetic tasks, the language model) and knows
nothing about either (docs/method.md section 6, reference training).

AdamW, linear warm-up then cosine decay to min_lr_ratio * lr (optionally over fewer steps than the run:
`decay_steps`, after which the lr stays at the minimum), gradient clipping, bf16 autocast on CUDA (or, with
amp "bf16-true", weights, activations and AdamW states all in bf16, as the paper code's Lightning precision),
next-token cross-entropy on the labelled tokens only, periodic validation by the workload (rank 0),
a tqdm bar, CSV (and TensorBoard when installed) logs, and atomic checkpoints holding everything a
resume needs to continue bit for bit: configs, workload, model, optimizer, schedule, RNG states of
torch / numpy / python, the partial log window, the step, and the git commit.

The loss is normalised by the GLOBAL number of labelled tokens, counted on the device and summed over
data-parallel ranks, so the averaged DDP gradient equals the single-process gradient of the concatenated
batch. The loss of the log window is summed on the device as well: the host reads it at log steps, at
checkpoints and at the end only, so the loop does not wait for the device at every step. A non-finite
loss stops the run at the next of those reads with the exact step it first appeared at and which
checkpoint exists.

Speed (issue 14): on CUDA the model is torch.compile'd by default with the sequence length marked
dynamic (`compiled_for_training`: one graph for every length bucket) and AdamW is fused; with a workload
whose batches are drawn on the device (asentmax.tasks.device_sampling) no step between log steps waits
for the device. `--lr-scaling sqrt` is the large-batch rule: peak lr = lr * sqrt(batch-size / 128).
`--cuda-graphs` (auto by default: on where it can run) compiles in torch.compile's mode
"reduce-overhead": Inductor's CUDA graph trees record the compiled forward and backward of each bucket
width once and replay them, so a step launches two graphs instead of hundreds of kernels (the step was
host-bound: results/train_gpu_profile.md).
Only the model's forward and backward are graphed: the loss, clipping, fused AdamW, the loss window and the
batches stay eager, and nothing a graph returns outlives its step (the logits are reduced to the loss at
once, the gradients are set to None after AdamW), so the next replay may overwrite it.

Data-parallel training runs under `torchrun` (gloo on CPU, NCCL on CUDA). A checkpoint also resumes
under another number of processes (say 2 GPUs -> 1): model, optimizer and schedule continue, rank 0's
RNG state seeds every rank, and the new ranks draw their shards of the same global batch size.

SIGINT / SIGTERM during the loop end the run with a checkpoint: a single process after the current step,
data-parallel ranks after the first log step that follows (every rank stops at the same step without a
host wait at every step); `train` then returns with summary["interrupted"] set. At every log step the loop
checks that its handlers are still installed and puts them back, with a warning naming the replacement, where
something replaced them (StopRequest.reclaim).

log.csv columns: step, loss (mean over the labelled tokens since the last line), lr, grad_norm (the mean over
the steps since the last line of the gradient's total 2-norm before clipping: late in a run, where the loss
is near zero, it shows how small the gradients Adam divides by have become), tokens (non-pad input tokens of
all ranks since the last line, counted in this process), tokens_per_s, elapsed_s.
val.csv: step, then the columns of the rows the workload's `validate` returns.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm.auto import tqdm

from asentmax import precision
from asentmax.data import IGNORE_INDEX, PAD_ID, Batch
from asentmax.runs import (
    BEST_NAME,
    CHECKPOINT_NAME,
    CONFIG_NAME,
    LOG_NAME,
    STALLED_NAME,
    TENSORBOARD_NAME,
    VAL_NAME,
    RunError,
    describe_device,
    git_commit,
    planned_end,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_json,
)


@dataclass
class TrainConfig:
    """The optimisation settings of a run: everything except the workload and the model."""

    steps: int = field(default=5000, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=128, metadata={"help": "global batch size (split over DDP ranks)"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})  # see lr_scaling
    lr_scaling: str = field(default="none", metadata={"help": (
        "large-batch rule: none (lr as given) | sqrt (peak lr = lr * sqrt(batch-size / 128): the presets' "
        "lr is the paper's at batch 128, and square-root scaling keeps Adam's update noise about constant "
        "as the batch grows, e.g. MQMTAR 2e-4 at 128 -> 4e-4 at 512; warm-up and decay stay in steps)")})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final learning rate as a fraction of lr"})
    warmup_steps: int = field(default=200, metadata={"help": "linear warm-up steps"})
    decay_steps: int = field(
        default=0, metadata={"help": "the cosine decays over this many steps, then the lr stays at its "
                                     "minimum (0: over all steps)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.99, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "max gradient norm (0 disables clipping)"})
    val_every: int = field(default=500, metadata={"help": "validate every N steps (0: only at the end)"})
    log_every: int = field(default=20, metadata={"help": "log every N steps"})
    checkpoint_every: int = field(default=500, metadata={"help": "checkpoint every N steps (and at the end)"})
    seed: int = field(default=0, metadata={"help": "seed of the init, and of the data unless --data-seed"})
    data_seed: int = field(default=-1, metadata={"default_help": "-1: --seed", "help": (
        "seed of the training batches and the validation sets alone, --seed then seeding the init only: "
        "runs that swap the two tell whether a seed's outcome comes from its init or its data "
        "(results/paper/reverse.md)")})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    amp: str = field(default="auto", metadata={"help": (
        "auto (bf16 autocast on CUDA) | bf16 (autocast over fp32 weights) | bf16-true (weights, activations "
        "and AdamW states in bf16, the paper code's precision; the loss in fp32; a step below half a "
        "weight's bf16 spacing, |w|/512 to |w|/256, rounds away, so a small learning rate moves few "
        "weights: results/paper/mqmtar.md, sixty-fourth session) | off")})
    compile: str = field(default="auto", metadata={"help": (
        "torch.compile the training forward and backward: auto (on CUDA) | on | off; the sequence length "
        "is marked dynamic, so one graph serves every length bucket (no recompile per length)")})
    cuda_graphs: str = field(default="auto", metadata={"help": (
        "replay the compiled forward and backward as CUDA graphs (torch.compile mode reduce-overhead: "
        "recorded once per length bucket; a step then launches two graphs instead of hundreds of "
        "kernels; loss, clipping and AdamW stay eager): auto (where the step is compiled, on one CUDA "
        "GPU, and no attention call reads the device: nn/attention.py cuda_graph_refusal) | on | off")})
    fused: str = field(default="auto", metadata={"help": "fused AdamW: auto (on CUDA) | on | off"})
    deterministic: bool = field(default=False, metadata={"help": (
        "bitwise reproducible training: the run under torch.use_deterministic_algorithms (Inductor's "
        "atomic adds, such as the embedding gradient's, become deterministic kernels; cuBLAS gets a fixed "
        "workspace), so the same command, code and GPU give the same losses and weights; slower. Without "
        "it the same seed can end far apart on a GPU (results/paper/mqmtar.md)")})
    temperature_lr_scale: float = field(default=1.0, metadata={"help": (
        "learning-rate multiplier of the length-aware temperature parameters (ASEntmax's beta/gamma "
        "projections, SSMax's s): results/paper/plateau")})
    temperature_delay_steps: int = field(default=0, metadata={"help": (
        "the temperature parameters keep their initial values for this many steps, then follow the "
        "schedule after a warm-up of their own (0: from the start)")})
    stall_step: tuple[int, ...] = field(default=(), metadata={"default_help": "none", "help": (
        "steps of the stall checks (at most --steps): stop the run (with a checkpoint, exit code 3) at the "
        "first log step from each one on if no log line so far had a training loss below its --stall-loss "
        "(at the last step the run ends anyway and is recorded as stopped): it has not left "
        "a loss plateau (MQMTAR, results/paper/mqmtar.md: the plateau near 0.6, where a run that leaves it "
        "late generalises less far, then a second one near 0.01, where runs that stay do not generalise; "
        "e.g. --stall-step 7000 19200 --stall-loss 0.3 0.004)")})
    stall_loss: tuple[float, ...] = field(default=(0.3,), metadata={"default_help": "0.3", "help": (
        "the training loss of each stall check (one value: every check's); the first is also the loss below "
        "which a run has left the plateau (escape_step)")})
    steps_after_escape: int = field(default=0, metadata={"default_help": "none", "help": (
        "end the run (with a checkpoint, exit code 0) this many steps after it left the loss plateau: "
        "after escape_step, the first log step with a training loss below the first --stall-loss. For a "
        "start that only has to leave the plateau, whose step varies by seed (MQMTAR's softmax start with "
        "the paper code's blocks left it by step 4,000 on two seeds and at 8,740 and 13,160 on two others, "
        "results/paper/mqmtar.md), e.g. --steps 24000 --stall-step 24000 --stall-loss 0.3 "
        "--steps-after-escape 2000; 0: none")})
    stall_val_step: tuple[int, ...] = field(default=(), metadata={"default_help": "none", "help": (
        "steps of the validation stall checks: stop the run (with a checkpoint, exit code 3) at the first "
        "validation from each one on whose stall score is below its --stall-val-score (TaskWorkload: the "
        "exact match at its --stall-val-at, else at --keep-best-at; it needs one of them). MQMTAR: runs on "
        "the second plateau score 0.08-0.31 at 16x on validation at step 25,600, runs that generalise "
        "0.50-0.93 (results/paper/mqmtar.md), e.g. --keep-best-at 16 --stall-val-step 25600 "
        "--stall-val-score 0.4; two checks: --stall-val-at 16 256 --stall-val-step 12800 32000 "
        "--stall-val-score 0.5 0.1")})
    stall_val_score: tuple[float, ...] = field(default=(), metadata={"default_help": "none", "help": (
        "the stall score below which each --stall-val-step check stops the run (> 0; exact match from 0 to "
        "1; one value: every check's)")})

    def validate(self) -> None:
        """Raise ValueError for settings that cannot run (one line naming the flag)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name.replace('_', '-')} must be a finite number, got {value}")
        for name in ("steps", "batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "decay_steps", "val_every", "checkpoint_every", "grad_clip",
                     "weight_decay", "temperature_lr_scale", "temperature_delay_steps", "seed",
                     "steps_after_escape"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.data_seed < -1:
            raise ValueError(f"data-seed must be >= 0 (or -1: --seed's), got {self.data_seed}")
        checks = [("stall-step", step) for step, _ in self.stall_checks()]  # raises for bad stall values
        checks += [("stall-val-step", step) for step, _ in self.stall_val_checks()]
        for flag, step in checks:
            if step > self.steps:
                raise ValueError(f"{flag} {step} is after the last step (--steps {self.steps}): that check "
                                 "would never run")
        if self.stall_val_step and not self.val_every:
            raise ValueError("--stall-val-step checks a validation, and --val-every 0 runs none before the "
                             "last step; give --val-every")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and 0 <= min-lr-ratio <= 1, got {self.lr}, {self.min_lr_ratio}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"betas must lie in [0, 1), got {self.beta1}, {self.beta2}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.amp not in precision.AMP_MODES:
            raise ValueError(f"amp must be one of {', '.join(precision.AMP_MODES)}, got {self.amp!r}")
        for name in ("compile", "fused", "cuda_graphs"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise ValueError(f"{name.replace('_', '-')} must be auto, on or off, "
                                 f"got {getattr(self, name)!r}")
        if self.cuda_graphs == "on":
            if self.compile == "off":
                raise ValueError("--cuda-graphs on replays the compiled step and --compile is off; "
                                 "drop one of them")
            if self.device == "cpu" or (self.device == "auto" and not torch.cuda.is_available()):
                raise ValueError("--cuda-graphs on needs a CUDA GPU (CUDA graphs capture GPU kernels); use "
                                 "--cuda-graphs off or auto on the CPU")
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"lr-scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")

    def stall_checks(self) -> list[tuple[int, float]]:
        """(step, loss) of each stall check (--stall-step, --stall-loss); ValueError in one line for steps
        that are not >= 1 and increasing, losses that are not > 0, or counts that do not pair up."""
        return paired_checks(self.stall_step, self.stall_loss, "stall-step", "stall-loss", "losses > 0")

    def stall_val_checks(self) -> list[tuple[int, float]]:
        """(step, score) of each validation stall check (--stall-val-step, --stall-val-score; none without
        steps); ValueError in one line as stall_checks."""
        if not self.stall_val_step:
            return []
        return paired_checks(self.stall_val_step, self.stall_val_score, "stall-val-step", "stall-val-score",
                             "> 0 with --stall-val-step")

    def peak_lr(self) -> float:
        """The peak learning rate after the large-batch rule (`lr_scaling`)."""
        if self.lr_scaling == "sqrt":
            return self.lr * math.sqrt(self.batch_size / LR_REFERENCE_BATCH)
        return self.lr

    def uses(self, name: str, device: torch.device) -> bool:
        """Whether the "compile" / "fused" / "cuda_graphs" setting is on for `device` ("auto": on CUDA
        only; cuda_graphs' auto has further conditions: uses_cuda_graphs)."""
        value = getattr(self, name)
        return value == "on" or (value == "auto" and device.type == "cuda")

    def batch_seed(self) -> int:
        """The seed of the training batches and validation sets: --data-seed, or --seed where it is -1."""
        return self.seed if self.data_seed == -1 else self.data_seed

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        values = dict(values)
        for name in ("compile", "fused"):  # saved as booleans before "auto" existed
            if isinstance(values.get(name), bool):
                values[name] = "on" if values[name] else "off"
        values.setdefault("cuda_graphs", "off")  # runs saved before the setting trained without graphs
        if isinstance(values.get("stall_loss"), (int, float)):
            values["stall_loss"] = (values["stall_loss"],)
        for name in ("stall_step", "stall_val_step", "stall_val_score"):  # saved as one number (0: none)
            if isinstance(values.get(name), (int, float)):
                values[name] = (values[name],) if values[name] else ()
        for name in ("stall_step", "stall_loss", "stall_val_step", "stall_val_score"):  # JSON lists
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return cls(**values)


def paired_checks(steps, values, steps_flag: str, values_flag: str,
                  values_rule: str) -> list[tuple[int, float]]:
    """(step, value) of each check of a flag pair such as --stall-step / --stall-loss: one value for every
    step or one per step; ValueError in one line for steps that are not >= 1 and increasing, values that are
    not > 0 (`values_rule` says so), or counts that do not pair up."""
    steps, values = tuple(steps), tuple(values)
    if any(s < 1 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"{steps_flag} must be steps >= 1 in increasing order, got "
                         + " ".join(map(str, steps)))
    if not values or not all(value > 0 for value in values):
        raise ValueError(f"{values_flag} must be {values_rule}, got "
                         f"{' '.join(f'{value:g}' for value in values) or 'none'}")
    if len(values) != 1 and len(values) != len(steps):
        raise ValueError(f"{values_flag} needs one value or one per --{steps_flag} ({len(steps)}), "
                         f"got {len(values)}")
    return list(zip(steps, values * len(steps) if len(values) == 1 else values, strict=True))


LR_SCALINGS = ("none", "sqrt")
ADAM_EPS = 1e-8  # AdamW's eps (torch's default): where a gradient's running RMS falls near it, steps shrink
LR_REFERENCE_BATCH = 128  # the paper's batch size (arXiv:2506.16640, section 3), where the presets' lr holds


# Inductor's mm padding off for the compiled training step. Where pad_mm pads an mm whose output the backward
# keeps (the ASEntmax temperature projection of an 8-head model: 4 outputs, padded to 8 in bf16), the backward
# is compiled with that output's stride fixed at the length it was compiled for, and the next length fails
# `assert_size_stride` (seen with PyTorch 2.11; 2.13's set_tracing_context_output_strides still evaluates the
# symbolic stride). pad_mm pads where timing both versions on the GPU favours padding, so the crash came and
# went; with padding forced it came at the third step, on the same tensor, and with pad_mm off the same run
# trained (results/session40_gpu/README.md). It timed so small an mm because its roofline check read the
# H100's peak as 0.535 TFLOPS, not about 535 (a GPU missing from Inductor's datasheet table gets Triton's
# estimate, fed the clock in MHz where it wants kHz; upstream PR 196372), so every mm looked compute-bound.
# Turning pad_mm off cost nothing measurable: 4.98 against 5.01 ms a step (results/session41_gpu/README.md).
INDUCTOR_OPTIONS = {"shape_padding": False}


def initial_model(model_config, seed: int):
    """The model a run of `seed` starts from: torch's generators seeded with `seed` (train's later draws
    continue from there), then the model drawn on the CPU, so its weights depend on the seed alone, not on the
    device it trains on."""
    from asentmax.nn import Transformer

    torch.manual_seed(seed)
    return Transformer(model_config)


def compiled_for_training(model, backend: str = "inductor", mode: str | None = None):
    """torch.compile'd `model` as a function of input_ids whose sequence dimension is marked dynamic: the
    batches of every length bucket share one graph (a dimension that cannot stay symbolic falls back to
    one graph per bucket width, a handful, never one per batch).

    Before the first compiled call one row goes through the plain model (eval mode, no grad, so no
    dropout draws and no DDP hooks): state the model builds lazily per device (the ALiBi slopes' device
    copy) then exists before tracing, instead of changing a guard and recompiling at the second step.

    mode="reduce-overhead" (--cuda-graphs): the same compiled code, replayed as CUDA graphs by Inductor's
    cudagraph trees, one forward and one backward graph per bucket width, each recorded at its second
    call (the first warms up). Each call then starts a new training step
    (torch.compiler.cudagraph_mark_step_begin): the outputs of the previous call, and the gradients its
    backward left, belong to the graphs' memory and are overwritten, so the caller runs one forward and
    one backward per step and sets the gradients to None (zero_grad) before the next call.

    With Inductor, its mm padding (pad_mm) is off (INDUCTOR_OPTIONS)."""
    if backend == "inductor":
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode or "default"), **INDUCTOR_OPTIONS}
        compiled = torch.compile(model, backend=backend, options=options)
    else:
        compiled = torch.compile(model, backend=backend, mode=mode)
    graphed = mode == "reduce-overhead"
    plain = getattr(model, "module", model)  # under DDP, the wrapped model
    primed = False

    def forward(input_ids: torch.Tensor) -> torch.Tensor:
        nonlocal primed
        if not primed:
            was_training = plain.training
            with torch.no_grad():
                plain.eval()
                plain(input_ids[:1])
                plain.train(was_training)
            primed = True
        torch._dynamo.maybe_mark_dynamic(input_ids, 1)
        if graphed:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(input_ids)

    return forward


def trace_at_step_zero(step_model, model, draw_first_batch, world: Distributed, autocast_dtype) -> None:
    """One forward and backward of the compiled `step_model` on the batch draw_first_batch() gives (the run's
    step-0 batch), its gradients dropped and every RNG state put back, the draw's included: what a resumed
    --deterministic run does before its own first step. Inductor sizes its kernels' blocks by the first
    call's shapes (the hint of the dynamic sequence dimension), so a resumed run traced at its own step's
    batch width could sum in other orders than the run it continues, and part from it on a GPU
    (tests/test_train_cli.py's CUDA signal case); traced at step 0's width, it compiles the kernels the run
    compiled at its start."""
    saved = rng_state()
    model.train()
    loss, _, _, _ = target_loss(step_model, draw_first_batch(), world, autocast_dtype)
    loss.backward()
    model.zero_grad(set_to_none=True)
    set_rng_state(saved)


def below_stall_score(workload, rows: list[dict], check: int, stall_score: float, world,
                      device) -> float | None:
    """The workload's stall score for validation stall check `check` of validation `rows` (rank 0's) where
    it is below `stall_score`, else None; every rank gets rank 0's answer (one broadcast under DDP)."""
    score = workload.stall_score(rows, check) if world.is_main else math.nan
    shared = torch.tensor(score, dtype=torch.float64, device=device)
    if world.active:
        dist.broadcast(shared, 0)
    score = float(shared)
    return score if score < stall_score else None


def _ranked(score) -> tuple:
    """A selection score as a tuple, so that a number (a checkpoint saved before scores were tuples, or a
    workload's own) and a tuple compare in order: (0.5,) < (0.5, 0.9) < (0.75,)."""
    return tuple(score) if isinstance(score, (tuple, list)) else (score,)


def check_stall_val(train_config: TrainConfig, workload) -> None:
    """ValueError in one line where validation stall checks are given and the workload cannot score them
    (workload.stall_score_error: TaskWorkload without --stall-val-at or --keep-best-at, or with a count of
    --stall-val-at values that does not pair up; language modelling)."""
    checks = train_config.stall_val_checks()
    error = workload.stall_score_error(len(checks)) if checks else None
    if error:
        raise ValueError(error)


class Workload(Protocol):
    """What the trainer runs: one object per run (asentmax.tasks.workload.TaskWorkload is one).

    Batches must be a pure function of (seed, rank, step) for exact resume; validate runs on rank 0
    only and returns rows (dicts of numbers) that go to val.csv, one line each. selection_score(rows) is
    the number, or tuple of numbers compared in order (higher is better), by which the weights of the best
    validation so far are kept in best.pt, or None for none. stall_score(rows, check) is the number that
    validation stall check `check` (0-based, of --stall-val-step's) compares with its --stall-val-score;
    stall_score_error(checks) says in one line why the workload cannot score that many checks (then they are
    refused before the run starts), or is None."""

    name: str

    @property
    def title(self) -> str:
        """What the progress bar names the run after: the task (reverse, mqmtar, ...) or the workload kind."""
        ...

    def model_config(self, overrides: dict | None = None): ...

    def check_model(self, model_config) -> None: ...

    def batches(self, *, seed: int, start_step: int, rank: int, world_size: int, local_batch_size: int,
                device: torch.device) -> Iterator[Batch]: ...

    def validate(self, model, *, seed: int, step: int, device, autocast_dtype) -> list[dict]: ...

    def selection_score(self, rows: list[dict]) -> float | tuple[float, ...] | None: ...

    def stall_score(self, rows: list[dict], check: int) -> float | None: ...

    def stall_score_error(self, checks: int) -> str | None: ...

    def to_dict(self) -> dict: ...


class NonFiniteLoss(FloatingPointError):
    """The training loss became inf or NaN; the message says at which step and which checkpoint exists."""


# ---- pieces of a training step ----

class WarmupCosine:
    """LR multiplier: linear warm-up to 1 over `warmup` steps, then cosine decay to `min_ratio` at `total`
    (and `min_ratio` after it)."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    @classmethod
    def of(cls, config: TrainConfig) -> WarmupCosine:
        return cls(config.warmup_steps, config.decay_steps or config.steps, config.min_lr_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class DelayedWarmupCosine(WarmupCosine):
    """The temperature parameters' LR multiplier: 0 for `delay` steps, then `scale` times the run's
    WarmupCosine, ramped in linearly over `warmup` steps from the end of the delay."""

    def __init__(self, warmup: int, total: int, min_ratio: float, delay: int, scale: float):
        super().__init__(warmup, total, min_ratio)
        self.delay, self.scale = delay, scale

    def __call__(self, step: int) -> float:
        if step < self.delay:
            return 0.0
        ramp = min(1.0, (step - self.delay + 1) / self.warmup) if self.delay and self.warmup else 1.0
        return self.scale * ramp * super().__call__(step)


def lr_multipliers(config: TrainConfig, n_groups: int) -> list[WarmupCosine]:
    """One LR multiplier per optimizer parameter group: the model's, then the temperatures' (if any)."""
    run = WarmupCosine.of(config)
    temperatures = DelayedWarmupCosine(run.warmup, run.total, run.min_ratio, config.temperature_delay_steps,
                                       config.temperature_lr_scale)
    return [run, temperatures][:n_groups]


def check_cuda_graphs(train_config: TrainConfig, model_config, world_size: int) -> None:
    """ValueError (one line) when --cuda-graphs on cannot run with this model and number of processes; the
    settings alone are checked by TrainConfig.validate."""
    from asentmax.nn.attention import cuda_graph_refusal

    if train_config.cuda_graphs != "on":
        return
    if world_size > 1:
        raise ValueError(f"--cuda-graphs on runs in one process, got {world_size} (CUDA graphs under DDP "
                         "are not supported here); use --cuda-graphs off or auto under torchrun")
    refusal = cuda_graph_refusal(model_config)
    if refusal is not None:
        raise ValueError(f"--cuda-graphs on: {refusal}; use --cuda-graphs off or auto")


def check_attention_backend(train_config: TrainConfig, model_config) -> None:
    """ValueError (one line) when the model's --attention-backend cannot run on the training device."""
    from asentmax.ops.attention import backend_refusal

    refusal = backend_refusal(model_config.attention_backend,
                              "cuda" if uses_cuda(train_config.device) else "cpu")
    if refusal is not None:
        raise ValueError(f"--attention-backend {refusal}")


def uses_cuda_graphs(train_config: TrainConfig, model_config, world: Distributed) -> bool:
    """Whether the compiled step (--compile) is replayed as CUDA graphs: --cuda-graphs on
    (TrainConfig.validate and check_cuda_graphs refuse it where it cannot run), or auto on one CUDA device
    for a model whose attention a graph can capture (nn/attention.py cuda_graph_refusal)."""
    from asentmax.nn.attention import cuda_graph_refusal

    if not train_config.uses("cuda_graphs", world.device):
        return False
    return train_config.cuda_graphs == "on" or (not world.active and cuda_graph_refusal(model_config) is None)


def parameter_groups(model) -> list[dict]:
    """AdamW parameter groups: the model's parameters, then (when there are any) its temperatures'."""
    temperatures = list(model.temperature_parameters())
    chosen = {id(p) for p in temperatures}
    groups = [{"params": [p for p in model.parameters() if id(p) not in chosen]}]
    return groups + ([{"params": temperatures}] if temperatures else [])


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # True when setup_distributed created the process group (and must end it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def uses_cuda(device_name: str) -> bool:
    """Whether --device `device_name` (auto | cpu | cuda) trains on CUDA."""
    return device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())


def setup_distributed(device_name: str) -> Distributed:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, NCCL on CUDA) and pick the device."""
    use_cuda = uses_cuda(device_name)
    if device_name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; use --device cpu or auto")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    owns_group = world_size > 1 and not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return Distributed(rank=rank, world_size=world_size, device=device, owns_group=owns_group)


def target_loss(model, batch: Batch, world: Distributed, autocast_dtype,
                stop_flag: torch.Tensor | None = None):
    """Cross-entropy on the labelled tokens, normalised by the GLOBAL labelled-token count times the world
    size, so the DDP gradient average equals the gradient of the mean over all ranks' tokens.

    Returns (loss to backpropagate, summed loss over this rank's tokens, global labelled-token count,
    the ranks' summed stop flags or None), all device tensors: nothing here waits for the device.
    `stop_flag` (DDP only: a 0-dim float64 device tensor, 1 once this rank was signalled) travels in the
    same all-reduce as the token count, so every rank learns of a signal at the same step."""
    n_global = (batch.labels != IGNORE_INDEX).sum().double()
    agreed_stop = None
    if world.active:
        counts = n_global[None] if stop_flag is None else torch.stack([n_global, stop_flag])
        dist.all_reduce(counts)
        n_global = counts[0]
        agreed_stop = None if stop_flag is None else counts[1]
    with precision.autocast(batch.input_ids.device, autocast_dtype):
        logits = model(batch.input_ids)
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(), reduction="sum",
                               ignore_index=IGNORE_INDEX)
    loss = loss_sum * (world.world_size / n_global).to(loss_sum.dtype)
    return loss, loss_sum.detach(), n_global, agreed_stop


# ---- logs ----

class CsvLog:
    """Append-only CSV; on resume, rows written after the checkpoint's step are dropped first. Without
    `columns` the header comes from the kept file or from the first row written."""

    def __init__(self, path: Path, columns: list[str] | None, keep_until_step: int | None):
        self.path, self.columns = path, columns
        rows = []
        if keep_until_step is not None and path.exists():
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                rows = [r for r in reader if int(r["step"]) <= keep_until_step]
                self.columns = self.columns or (list(reader.fieldnames) if reader.fieldnames else None)
        with open(path, "w", newline="") as f:
            if self.columns:
                writer = csv.DictWriter(f, self.columns)
                writer.writeheader()
                writer.writerows(rows)

    def write(self, row: dict) -> None:
        with open(self.path, "a", newline="") as f:
            if self.columns is None:
                self.columns = list(row)
                csv.DictWriter(f, self.columns).writeheader()
            csv.DictWriter(f, self.columns).writerow(row)


def restored_window(rank_states: list[dict], world: Distributed) -> tuple[float, int, float]:
    """(loss sum, global labelled-token count, gradient-norm sum) of the partial log window saved in a
    checkpoint, for this rank. Loss sums are per rank, the count is global, and the gradient norms are the
    same on every rank (the gradient is all-reduced before they are taken; NaN from a checkpoint saved before
    they were kept: that window's grad_norm is unknown). When the world size changed since the checkpoint
    (say 2 GPUs -> 1), rank 0 takes over the loss sums of all saved ranks, so the first window logged after
    the resume still averages over every token of that window."""
    grad_norm = rank_states[0]["window"].get("grad_norm", math.nan)
    if len(rank_states) == world.world_size:
        window = rank_states[world.rank]["window"]
        return window["loss"], window["targets"], grad_norm
    targets = rank_states[0]["window"]["targets"]
    if not world.is_main:
        return 0.0, targets, grad_norm
    return sum(state["window"]["loss"] for state in rank_states), targets, grad_norm


def tensorboard_writer(run_dir: Path):
    """A SummaryWriter when the optional tensorboard package is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / TENSORBOARD_NAME))


def _row_text(row: dict) -> str:
    return " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())


class StopRequest:
    """Turns SIGINT / SIGTERM into a flag the loop reads after each step (main thread only). After a
    SIGINT the previous handlers are back (Ctrl-C twice aborts at once); a repeated SIGTERM is the same
    request again, not an abort: GNU `timeout` delivers its signal twice, to the child and to its
    process group, and the second copy must not kill a run that is writing its checkpoint."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    def reclaim(self) -> str | None:
        """Put the handlers back where something replaced them since __enter__ (main thread only; nothing
        once a signal came: the run is stopping, and a first Ctrl-C hands the handlers back on purpose).
        Returns what had replaced them, else None. Two ASEntmax runs on CUDA once ended on SIGTERM without
        their checkpoint where softmax's wrote it (results/gpu_tests_session10.md), as if a library had
        replaced the handler during the run."""
        if not self._previous or self.signal_name is not None:
            return None
        replaced = []
        for sig in self.SIGNALS:
            current = signal.getsignal(sig)
            if current != self._handle:
                replaced.append(f"{signal.Signals(sig).name} by {current!r}")
                signal.signal(sig, self._handle)
        return "; ".join(replaced) or None

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ---- the loop ----

def load_initial_weights(model: torch.nn.Module, weights: dict, fresh=()) -> list[str]:
    """Load `weights` (a state dict) into `model`; the names of the length-aware temperature's parameters
    that `weights` lacks (another normaliser's model) keep their init and are returned, and that normaliser's
    own temperature parameters in `weights` (SSMax's s) are left out. The names in `fresh` (--init-fresh) are
    not loaded, whether `weights` holds them or not: they keep their init too (not returned). ValueError for
    any other difference, or for a loaded name that shares its tensor with a fresh one (a tied head)."""
    own, fresh = model.state_dict(), set(fresh)

    def is_temperature(name: str) -> bool:  # nn/attention.py's submodule `temperature`
        return ".attn.temperature." in name

    missing = [name for name in own if name not in weights and name not in fresh]
    extra = [name for name in weights if name not in own]
    wrong = [name for name in missing + extra if not is_temperature(name)]
    if wrong:
        raise ValueError(f"initial weights do not fit the model: {', '.join(wrong[:4])}"
                         + (f" and {len(wrong) - 4} more" if len(wrong) > 4 else ""))
    loaded = {name: value for name, value in weights.items() if name in own and name not in fresh}
    fresh_tensors = {own[name].data_ptr() for name in fresh if name in own}
    tied = [name for name in loaded if own[name].data_ptr() in fresh_tensors]
    if tied:
        raise ValueError(f"initial weights: {', '.join(tied)} shares its tensor with a fresh parameter; "
                         "take it fresh too")
    model.load_state_dict(loaded, strict=False)
    return missing


def train(workload: Workload, train_config: TrainConfig, model_config, run_dir: Path | str, *,
          checkpoint: dict | None = None, stop_at_step: int | None = None, progress: bool = True,
          initial_weights: tuple[dict, dict] | None = None) -> dict:
    """Train `model_config` on `workload` in `run_dir`; returns a summary.

    `checkpoint` (a dict from asentmax.runs.load_checkpoint of this run) resumes from it: model,
    optimizer, schedule, RNG states and step come from it, the configs from the arguments (the caller
    passes the saved ones; a larger `train_config.steps` extends the run). `stop_at_step` ends the run
    early after that many total steps with a checkpoint (as if killed there). `initial_weights` (a new
    run only: a model state dict of the same architecture and a record of where it comes from, which
    config.json keeps as "init_from") starts the model from those weights instead of a fresh draw; the
    optimizer and the schedule start afresh. The weights may be another normaliser's: the temperature
    parameters they lack keep their init (load_initial_weights; "init_from" lists them as "kept_initial").
    The names the record lists as "fresh" (--init-fresh) are not loaded but keep this run's own draw too; the
    run's prior_recipe keeps them as "fresh_parameters", so `asentmax compare` tells such a start apart.
    Each stall check (`train_config.stall_checks()`: step S, loss L) ends it the same way at the first log
    step from S on when no log line so far had a loss below L (summary["stalled"]); a run resumed past S is
    not checked again there. Each validation stall check (`train_config.stall_val_checks()`: step S, score
    X) ends it at the first validation from S on whose stall score (workload.stall_score) is below X. A
    stopped run's record (summary["stalled"]) is also written to run_dir/stalled.json, which a continued run
    removes. With `train_config.steps_after_escape` K the run ends K steps after its escape_step with a
    checkpoint, as --stop-at-step would end it there (summary["ended_after_escape"]); a resumed run that
    reached that step has nothing left to do.

    Summary: step, start_step (the step this process began at), total_steps, loss (of the last log line
    of this process, None when it wrote none: no step ran, or none of its steps was a log step), val
    (the last validation rows), run_dir, elapsed_s, checkpoint_step (None without one), interrupted (the
    signal name, or None), stalled ({"step", "loss", "lowest_loss", "stall_step", "stall_loss"} when a
    stall check ended the run, {"step", "score", "stall_val_step", "stall_val_score"} when a validation
    stall check did, else None), escape_step (the first log step with a loss below the first
    stall_loss, None when none was), ended_after_escape (whether the run ended at escape_step +
    steps_after_escape).
    `train_config.deterministic` runs all of it under deterministic_algorithms."""
    with deterministic_algorithms(train_config.deterministic):
        return _train(workload, train_config, model_config, run_dir, checkpoint=checkpoint,
                      stop_at_step=stop_at_step, progress=progress, initial_weights=initial_weights)


@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    """With `on`: torch.use_deterministic_algorithms(True) inside the block (Inductor then lowers its
    atomic adds to deterministic kernels), the earlier setting after it, and CUBLAS_WORKSPACE_CONFIG set for
    the process where it is unset (cuBLAS reads it when it creates a handle: at the run's first matmul in a
    fresh process). Without: nothing."""
    if not on:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _train(workload: Workload, train_config: TrainConfig, model_config, run_dir: Path | str, *,
           checkpoint: dict | None, stop_at_step: int | None, progress: bool,
           initial_weights: tuple[dict, dict] | None) -> dict:
    """train's run (see train), inside its deterministic_algorithms block."""
    run_dir = Path(run_dir)
    train_config.validate()
    workload.check_model(model_config)
    check_stall_val(train_config, workload)

    check_attention_backend(train_config, model_config)
    world = setup_distributed(train_config.device)
    check_cuda_graphs(train_config, model_config, world.world_size)
    if train_config.batch_size % world.world_size:
        raise ValueError(f"batch-size {train_config.batch_size} not divisible by {world.world_size} ranks")
    local_batch = train_config.batch_size // world.world_size
    autocast_dtype = precision.autocast_dtype(train_config.amp, world.device)

    model = initial_model(model_config, train_config.seed).to(world.device)
    if initial_weights is not None:
        if checkpoint is not None:
            raise ValueError("initial weights start a new run; a resumed run has its own")
        kept_initial = load_initial_weights(model, initial_weights[0], initial_weights[1].get("fresh", ()))
        initial_weights = (initial_weights[0], {**initial_weights[1],
                                                **({"kept_initial": kept_initial} if kept_initial else {})})
    if train_config.amp == "bf16-true":  # drawn in fp32 as for the other precisions, then rounded once
        model = model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(parameter_groups(model), lr=train_config.peak_lr(),
                                  betas=(train_config.beta1, train_config.beta2), eps=ADAM_EPS,
                                  weight_decay=train_config.weight_decay,
                                  **({"fused": True} if train_config.uses("fused", world.device) else {}))
    multipliers = lr_multipliers(train_config, len(optimizer.param_groups))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, multipliers)
    step, window_loss, window_targets, window_grad_norm = 0, 0.0, 0, 0.0  # the log window: loss sum,
    # global target count and the sum of the steps' gradient norms
    escape_step = None  # the first log step with a training loss below the first stall_loss
    lowest_loss = math.inf  # the lowest logged training loss so far
    if checkpoint is not None:
        if "optimizer" not in checkpoint:
            raise RunError(f"{Path(run_dir) / CHECKPOINT_NAME} has no optimizer state (a checkpoint carried "
                           "by benchmarks/carry_checkpoint.py): it cannot resume; start a new run from it "
                           "with --init-from")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scheduler.lr_lambdas = multipliers  # load_state_dict restored the saved ones
        step = checkpoint["step"]
        rank_states = checkpoint["rank_states"]
        saved_state = rank_states[world.rank] if len(rank_states) == world.world_size else rank_states[0]
        set_rng_state(saved_state["rng"])
        window_loss, window_targets, window_grad_norm = restored_window(rank_states, world)
        escape_step = checkpoint.get("escape_step")
        # checkpoints from before lowest_loss was kept: below the plateau's loss if the run had escaped
        # (then no later check can stop it), else unknown above it
        lowest_loss = checkpoint.get("lowest_loss", -math.inf if escape_step is not None else math.inf)
    saved_step = None if checkpoint is None else step
    start_step = step
    best = None if checkpoint is None else checkpoint.get("best")  # {"score", "step"} of best.pt
    ddp_model = model
    if world.active:
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None)
    step_model = ddp_model
    if train_config.uses("compile", world.device):
        mode = "reduce-overhead" if uses_cuda_graphs(train_config, model_config, world) else None
        step_model = compiled_for_training(ddp_model, mode=mode)
        if train_config.deterministic and step > 0:
            def draw_first_batch() -> Batch:
                return next(workload.batches(seed=train_config.batch_seed(), start_step=0, rank=world.rank,
                                             world_size=world.world_size, local_batch_size=local_batch,
                                             device=world.device))

            trace_at_step_zero(step_model, model, draw_first_batch, world, autocast_dtype)

    commit = git_commit()
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / STALLED_NAME).unlink(missing_ok=True)  # a stopped run continued is no longer stopped
        # samples the weights were trained on before this run's step 0 (the --init-from chain's), and the
        # recipe of the run that trained them (runs.prior_recipe), with the parameters this run drew afresh
        if checkpoint is not None:
            prior_samples, prior = checkpoint.get("prior_samples", 0), checkpoint.get("prior_recipe")
        elif initial_weights is not None:
            record = initial_weights[1]
            prior_samples = record.get("samples") or 0
            prior = record.get("recipe")
            if record.get("fresh"):
                prior = {**(prior or {}), "fresh_parameters": record["fresh"]}
        else:
            prior_samples, prior = 0, None
        config_record = {"train_config": asdict(train_config), "workload": workload.to_dict(),
                         "model_config": asdict(model_config), "prior_samples": prior_samples,
                         **({"prior_recipe": prior} if prior else {})}
        if checkpoint is None:
            init_from = ({} if initial_weights is None else  # its recipe is the record's prior_recipe
                         {"init_from": {k: v for k, v in initial_weights[1].items() if k != "recipe"}})
            (run_dir / CONFIG_NAME).write_text(json.dumps({
                **config_record, "git_commit": commit, "device": describe_device(world.device),
                "world_size": world.world_size, "torch_version": torch.__version__, "command": sys.argv,
                "n_parameters": sum(p.numel() for p in model.parameters()), **init_from}, indent=2) + "\n")
        keep = step if checkpoint is not None else None
        log = CsvLog(run_dir / LOG_NAME, ["step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s",
                                          "elapsed_s"], keep)
        val_log = CsvLog(run_dir / VAL_NAME, None, keep)
        writer = tensorboard_writer(run_dir)

    device = world.device
    window_loss_t = torch.tensor(window_loss, dtype=torch.float64, device=device)
    window_targets_t = torch.tensor(float(window_targets), dtype=torch.float64, device=device)
    window_tokens_t = torch.zeros((), dtype=torch.float64, device=device)
    window_grad_norm_t = torch.tensor(window_grad_norm, dtype=torch.float64, device=device)
    first_bad_step = torch.zeros((), dtype=torch.int64, device=device)  # 0: every loss so far was finite

    def check_finite() -> None:
        """Raise NonFiniteLoss when a loss since the last check was inf/NaN (reads the device)."""
        bad = first_bad_step.clone()
        if world.active:
            bad = torch.where(bad > 0, bad, torch.iinfo(torch.int64).max)
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
            bad = torch.where(bad == torch.iinfo(torch.int64).max, 0, bad)
        bad_step = int(bad)
        if bad_step:
            if saved_step is None:
                where = f"no checkpoint was written, so {run_dir} cannot be resumed; start it again"
            else:
                where = (f"{run_dir / CHECKPOINT_NAME} holds step {saved_step} (written before the loss "
                         "broke); resume from it with a lower lr, or start again")
            raise NonFiniteLoss(f"non-finite training loss at step {bad_step}; {where}")

    def validate() -> list[dict]:
        nonlocal best
        rows = []
        if world.is_main:
            model.eval()
            rows = workload.validate(model, seed=train_config.batch_seed(), step=step, device=device,
                                     autocast_dtype=autocast_dtype)
            for row in rows:
                val_log.write({"step": step, **row})
                if writer is not None:
                    label = "".join(f"_{v}" for v in row.values() if isinstance(v, int))
                    for key, value in row.items():
                        if isinstance(value, float):
                            writer.add_scalar(f"val/{key}{label}", value, step)
            score = workload.selection_score(rows)
            # ties keep the earlier
            if score is not None and (best is None or _ranked(score) > _ranked(best["score"])):
                best = {"score": score, "step": step}
                save_checkpoint(run_dir / BEST_NAME, {**config_record, "model": model.state_dict(),
                                                      "step": step, "score": score, "git_commit": commit})
            model.train()
        if world.active:
            dist.barrier()
        return rows

    def checkpoint_now() -> None:
        nonlocal saved_step
        check_finite()
        # per rank: RNG states and the partial loss window, so a resumed run logs the same numbers
        mine = {"rng": rng_state(), "window": {"loss": float(window_loss_t), "targets": int(window_targets_t),
                                               "grad_norm": float(window_grad_norm_t)}}
        states = [None] * world.world_size
        if world.active:
            dist.all_gather_object(states, mine)
        else:
            states = [mine]
        if world.is_main:
            save_checkpoint(run_dir / CHECKPOINT_NAME, {
                **config_record, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rank_states": states, "step": step, "best": best, "escape_step": escape_step,
                "lowest_loss": lowest_loss,
                "git_commit": commit,
                "device": describe_device(device), "world_size": world.world_size})
        saved_step = step

    total = train_config.steps
    end = min(planned_end(asdict(train_config), escape_step), total if stop_at_step is None else stop_at_step)
    bar = tqdm(total=total, initial=step, disable=not (progress and world.is_main), dynamic_ncols=True,
               desc=f"train {workload.title}")
    batches = workload.batches(seed=train_config.batch_seed(), start_step=step, rank=world.rank,
                               world_size=world.world_size, local_batch_size=local_batch, device=device)
    model.train()
    window_start = time.perf_counter()
    start_time, last_loss, val_rows, interrupted, stalled = time.perf_counter(), None, [], None, None
    stall_checks, stall_val_checks = train_config.stall_checks(), train_config.stall_val_checks()
    # DDP: a signalled rank sets its flag on the device; the ranks' sum is read at log steps only (the host
    # reads the device there anyway), so all stop after the same step without a wait at every step
    stop_flag = torch.zeros((), dtype=torch.float64, device=device) if world.active else None
    with StopRequest() as stop_request:
        while step < end:
            batch = next(batches)
            if stop_flag is not None and stop_request.signal_name is not None:
                stop_flag.fill_(1.0)
            loss, loss_sum, n_targets, agreed_stop = target_loss(step_model, batch, world, autocast_dtype,
                                                                 stop_flag)
            loss.backward()
            if train_config.grad_clip > 0:  # the norm before clipping
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
            else:
                grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()
                                                           if p.grad is not None])
            window_grad_norm_t += grad_norm.double()
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            first_bad_step.copy_(torch.where((first_bad_step == 0) & ~torch.isfinite(loss.detach()),
                                             step, first_bad_step))
            window_loss_t += loss_sum.double()
            window_targets_t += n_targets
            window_tokens_t += (batch.input_ids != PAD_ID).sum()
            logged = step % train_config.log_every == 0 or step == total
            if logged:
                check_finite()
                replaced = stop_request.reclaim()
                if replaced is not None:
                    print(f"warning: at step {step} the trainer's signal handlers had been replaced "
                          f"({replaced}); put back, so SIGINT / SIGTERM still end the run with a checkpoint",
                          file=sys.stderr)
                totals = torch.stack([window_loss_t, window_tokens_t])
                if world.active:
                    dist.all_reduce(totals)
                last_loss = float(totals[0]) / int(window_targets_t)
                tokens = int(totals[1])  # non-pad tokens of all ranks since the last log line
                tokens_per_s = tokens / max(time.perf_counter() - window_start, 1e-9)
                window_steps = step - (step - 1) // train_config.log_every * train_config.log_every
                mean_grad_norm = float(window_grad_norm_t) / window_steps
                if world.is_main:
                    log.write({"step": step, "loss": f"{last_loss:.7g}", "lr": f"{lr:.3e}",
                               "grad_norm": f"{mean_grad_norm:.4e}", "tokens": tokens,
                               "tokens_per_s": f"{tokens_per_s:.1f}",
                               "elapsed_s": f"{time.perf_counter() - start_time:.3f}"})
                    if writer is not None:
                        writer.add_scalar("train/loss", last_loss, step)
                        writer.add_scalar("train/lr", lr, step)
                        writer.add_scalar("train/grad_norm", mean_grad_norm, step)
                bar.set_postfix(loss=f"{last_loss:.4f}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
                if escape_step is None and last_loss < train_config.stall_loss[0]:
                    escape_step = step
                    end = min(end, planned_end(asdict(train_config), escape_step))  # --steps-after-escape
                lowest_loss = min(lowest_loss, last_loss)
                for stall_step, stall_loss in stall_checks:  # the first log step from stall_step on
                    if (step - train_config.log_every < stall_step <= step and stalled is None
                            and lowest_loss >= stall_loss):
                        stalled = {"step": step, "loss": last_loss, "lowest_loss": lowest_loss,
                                   "stall_step": stall_step, "stall_loss": stall_loss}
                        end = step
                for t in (window_loss_t, window_targets_t, window_tokens_t, window_grad_norm_t):
                    t.zero_()
                window_start = time.perf_counter()
            bar.update(1)
            if (train_config.val_every and step % train_config.val_every == 0) or step == total:
                val_rows = validate()
                if world.is_main:
                    bar.write(f"step {step}: " + "; ".join(_row_text(row) for row in val_rows))
                for check, (stall_val_step, stall_val_score) in enumerate(stall_val_checks):
                    # the first validation from stall_val_step on
                    if step - train_config.val_every < stall_val_step <= step and stalled is None:
                        score = below_stall_score(workload, val_rows, check, stall_val_score, world, device)
                        if score is not None:
                            stalled = {"step": step, "score": score, "stall_val_step": stall_val_step,
                                       "stall_val_score": stall_val_score}
                            end = step
            if agreed_stop is None:
                stop = stop_request.signal_name is not None
            else:
                stop = logged and bool(agreed_stop > 0)
            if stop and step < end:  # a signal in the last step changes nothing
                interrupted = stop_request.signal_name or "a signal on another rank"
                end = step
            if (train_config.checkpoint_every and step % train_config.checkpoint_every == 0) or step == end:
                checkpoint_now()
    bar.close()
    if world.is_main and writer is not None:
        writer.close()
    if world.is_main and stalled is not None:
        write_json(run_dir / STALLED_NAME, stalled)
    if world.active:
        # gloo frees a finished collective's tensors on its own thread, which needs the GIL; a process
        # group destroyed while that is pending (the DDP reducer holds a reference) can deadlock, so the
        # wrappers go first and a barrier lets those threads finish
        del ddp_model, step_model
        dist.barrier()
    if world.owns_group:
        dist.destroy_process_group()
    return {"step": step, "start_step": start_step, "total_steps": total, "loss": last_loss, "val": val_rows,
            "run_dir": str(run_dir), "elapsed_s": time.perf_counter() - start_time,
            "checkpoint_step": saved_step, "interrupted": interrupted, "stalled": stalled,
            "escape_step": escape_step,
            "ended_after_escape": bool(train_config.steps_after_escape and escape_step is not None
                                       and step == escape_step + train_config.steps_after_escape
                                       and stalled is None)}
