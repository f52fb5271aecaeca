"""Training driver for the synthetic length-generalisation tasks (PAPER.md section 3, "reference training").

AdamW (betas 0.9, 0.99, weight decay 0), linear warm-up then cosine decay, gradient clipping, bf16
autocast on CUDA, next-token loss on target tokens only, length-bucketed batches (asentmax.data),
periodic validation at a few lengths, a tqdm bar, CSV (and TensorBoard when installed) logs, and
atomic checkpoints holding everything `--resume` needs to continue bit-for-bit: both configs, model,
optimizer, scheduler, RNG states of torch / numpy / python, the step, and the git commit.

Data-parallel training runs under `torchrun` (gloo on CPU, NCCL on CUDA): every rank draws its own
shard (asentmax.data.training_batch is seeded by (seed, rank, step)) and the loss is normalised by the
global number of target tokens, so the averaged DDP gradient equals the single-process gradient of the
concatenated batch. A checkpoint also resumes under another number of processes (say 2 GPUs -> 1): the
model, optimizer and schedule continue, rank 0's RNG state seeds every rank, and the new ranks draw their
shards of the same global batch size (so the data differ from a run that kept its world size).

log.csv columns: step, loss (mean over the target tokens since the last line), lr, tokens (non-pad input
tokens of all ranks since the last line, counted in this process), tokens_per_s, elapsed_s.
Run directory: config.json, checkpoint.pt, log.csv, val.csv, tensorboard/ (optional).
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm.auto import tqdm

from asentmax.data import IGNORE_INDEX, Batch, length_buckets, training_batch
from asentmax.runs import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    LOG_NAME,
    TENSORBOARD_NAME,
    VAL_NAME,
    describe_device,
    git_commit,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)



@dataclass
class TrainConfig:
    """Everything about a training run except the model (asentmax.nn.ModelConfig)."""

    task: str = field(default="copy", metadata={"help": "synthetic task name (asentmax.tasks.TASK_NAMES)"})
    min_length: int = field(default=32, metadata={"help": "shortest training length"})
    max_length: int = field(default=64, metadata={"help": "longest training length (the 'ID' length)"})
    steps: int = field(default=5000, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=128, metadata={"help": "global batch size (split over DDP ranks)"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final learning rate as a fraction of lr"})
    warmup_steps: int = field(default=200, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.99, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "max gradient norm (0 disables clipping)"})
    length_buckets: int = field(default=4, metadata={"help": "training-length buckets (batches share one)"})
    val_every: int = field(default=500, metadata={"help": "validate every N steps (0: only at the end)"})
    val_multipliers: tuple[int, ...] = field(
        default=(1, 2, 4), metadata={"help": "validation lengths as multiples of max-length"})
    val_samples: int = field(default=64, metadata={"help": "validation samples per length"})
    log_every: int = field(default=20, metadata={"help": "log every N steps"})
    checkpoint_every: int = field(default=500, metadata={"help": "checkpoint every N steps (and at the end)"})
    seed: int = field(default=0, metadata={"help": "seed of model init and data"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    amp: str = field(default="auto", metadata={"help": "auto (bf16 on CUDA) | bf16 | off"})

    def validate(self) -> None:
        """Raise ValueError for settings that cannot run."""
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 <= min-length <= max-length, got {self.min_length}, {self.max_length}")
        positive = ("steps", "batch_size", "length_buckets", "val_samples", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "val_every", "checkpoint_every", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and 0 <= min-lr-ratio <= 1, got {self.lr}, {self.min_lr_ratio}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"betas must lie in [0, 1), got {self.beta1}, {self.beta2}")
        if any(m < 1 for m in self.val_multipliers):
            raise ValueError(f"val-multipliers must be >= 1, got {self.val_multipliers}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.amp not in ("auto", "bf16", "off"):
            raise ValueError(f"amp must be auto, bf16 or off, got {self.amp!r}")


# ---- presets: one plain function per paper task (PAPER.md section 3, reference training) ----

def mqmtar_preset() -> TrainConfig:
    return TrainConfig(task="mqmtar", lr=2e-4, steps=20000, warmup_steps=1000)


def copy_preset() -> TrainConfig:
    return TrainConfig(task="copy", lr=1e-3, steps=5000)


def reverse_preset() -> TrainConfig:
    return TrainConfig(task="reverse", lr=4e-4, steps=10000, warmup_steps=500)


def sort_preset() -> TrainConfig:
    return TrainConfig(task="sort", lr=4e-4, steps=10000, warmup_steps=500)


def flipflop_preset() -> TrainConfig:
    return TrainConfig(task="flipflop", lr=1e-3, steps=5000)


def local_count_preset() -> TrainConfig:
    return TrainConfig(task="local_count", lr=1e-3, steps=5000)


def two_back_preset() -> TrainConfig:
    return TrainConfig(task="two_back", lr=1e-3, steps=5000)


PRESETS = {
    "mqmtar": mqmtar_preset, "copy": copy_preset, "reverse": reverse_preset, "sort": sort_preset,
    "flipflop": flipflop_preset, "local_count": local_count_preset, "two_back": two_back_preset,
}
# asentmax.nn.presets function giving each task's reference model (PAPER.md section 3)
MODEL_PRESETS = {"mqmtar": "mqmtar_model", "copy": "copy_model", "reverse": "reverse_model",
                 "sort": "sort_model"}


def model_config_for(task, overrides: dict | None = None):
    """The task's reference ModelConfig (asentmax.nn.presets) with `overrides` applied."""
    from asentmax.nn import presets

    preset = getattr(presets, MODEL_PRESETS.get(task.name, "copy_model"))
    return preset(task.vocab_size, **(overrides or {}))


# ---- pieces of a training step ----

class WarmupCosine:
    """LR multiplier: linear warm-up to 1 over `warmup` steps, then cosine decay to `min_ratio` at `total`."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


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


def setup_distributed(device_name: str) -> Distributed:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, NCCL on CUDA) and pick the device."""
    use_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if device_name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
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


def target_loss(model, batch: Batch, world: Distributed, autocast_dtype) -> tuple[torch.Tensor, float, int]:
    """Cross-entropy on target tokens, normalised by the GLOBAL target-token count times world size, so the
    DDP gradient average equals the gradient of the mean over all ranks' tokens.

    Returns (loss to backpropagate, summed loss over this rank's tokens, global target-token count)."""
    n_local = torch.tensor([batch.n_target_tokens], dtype=torch.float64, device=batch.labels.device)
    if world.active:
        dist.all_reduce(n_local)
    n_global = int(n_local.item())
    if n_global == 0:
        raise ValueError("batch has no target tokens")
    with torch.autocast(device_type=batch.input_ids.device.type, dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        logits = model(batch.input_ids)
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(), reduction="sum",
                               ignore_index=IGNORE_INDEX)
    return loss_sum * (world.world_size / n_global), float(loss_sum.detach()), n_global


# ---- logs ----

class CsvLog:
    """Append-only CSV; on resume, rows written after the checkpoint's step are dropped first."""

    def __init__(self, path: Path, columns: list[str], keep_until_step: int | None):
        self.path, self.columns = path, columns
        rows = []
        if keep_until_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= keep_until_step]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)

    def write(self, row: dict) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)


def restored_window(rank_states: list[dict], world: Distributed) -> tuple[float, int]:
    """(loss sum, global target count) of the partial log window saved in a checkpoint, for this rank.

    Loss sums are per rank, the target count is global. When the world size changed since the checkpoint
    (say 2 GPUs -> 1), rank 0 takes over the loss sums of all saved ranks, so the first window logged after
    the resume still averages over every token of that window."""
    if len(rank_states) == world.world_size:
        window = rank_states[world.rank]["window"]
        return window["loss"], window["targets"]
    targets = rank_states[0]["window"]["targets"]
    if not world.is_main:
        return 0.0, targets
    return sum(state["window"]["loss"] for state in rank_states), targets


def tensorboard_writer(run_dir: Path):
    """A SummaryWriter when the optional tensorboard package is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / TENSORBOARD_NAME))


# ---- the loop ----

def train(train_config: TrainConfig, model_config=None, run_dir: Path | str = "runs/run", *,
          resume: bool = False, stop_at_step: int | None = None, progress: bool = True) -> dict:
    """Train (or resume) a model in `run_dir`; returns a summary. `model_config` None = the task's preset.

    `stop_at_step` ends the run early after that many total steps with a checkpoint (as if killed there);
    a later `resume=True` call continues exactly. On resume the configs saved in the checkpoint are used."""
    from asentmax.eval import teacher_forced_accuracy
    from asentmax.nn import ModelConfig, Transformer
    from asentmax.tasks import get_task, make_eval_set

    run_dir = Path(run_dir)
    checkpoint = None
    if resume:
        checkpoint = load_checkpoint(run_dir / CHECKPOINT_NAME)
        saved = checkpoint["train_config"]
        train_config = TrainConfig(**{**saved, "val_multipliers": tuple(saved["val_multipliers"])})
        model_config = ModelConfig(**checkpoint["model_config"])
    train_config.validate()
    task = get_task(train_config.task)
    if model_config is None:
        model_config = model_config_for(task)
    if model_config.vocab_size < task.vocab_size:
        raise ValueError(f"model vocab_size {model_config.vocab_size} < task vocab_size {task.vocab_size}")

    world = setup_distributed(train_config.device)
    if train_config.batch_size % world.world_size:
        raise ValueError(f"batch-size {train_config.batch_size} not divisible by {world.world_size} ranks")
    local_batch = train_config.batch_size // world.world_size
    use_bf16 = train_config.amp == "bf16" or (train_config.amp == "auto" and world.device.type == "cuda")
    autocast_dtype = torch.bfloat16 if use_bf16 else None

    torch.manual_seed(train_config.seed)
    model = Transformer(model_config).to(world.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_config.lr, betas=(train_config.beta1,
                                  train_config.beta2), weight_decay=train_config.weight_decay)
    schedule = WarmupCosine(train_config.warmup_steps, train_config.steps, train_config.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    step, window_loss, window_targets = 0, 0.0, 0  # the log window: loss sum and global target count
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        step = checkpoint["step"]
        rank_states = checkpoint["rank_states"]
        saved_state = rank_states[world.rank] if len(rank_states) == world.world_size else rank_states[0]
        set_rng_state(saved_state["rng"])
        window_loss, window_targets = restored_window(rank_states, world)
    ddp_model = model
    if world.active:
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None)

    commit = git_commit()
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if checkpoint is None:
            (run_dir / CONFIG_NAME).write_text(json.dumps({
                "train_config": asdict(train_config), "model_config": asdict(model_config),
                "git_commit": commit, "device": describe_device(world.device), "world_size": world.world_size,
                "torch_version": torch.__version__, "command": sys.argv,
                "n_parameters": sum(p.numel() for p in model.parameters())}, indent=2) + "\n")
        keep = step if checkpoint is not None else None
        log = CsvLog(run_dir / LOG_NAME, ["step", "loss", "lr", "tokens", "tokens_per_s", "elapsed_s"], keep)
        val_log = CsvLog(run_dir / VAL_NAME, ["step", "length", "exact_match", "token_accuracy"], keep)
        writer = tensorboard_writer(run_dir)

    buckets = length_buckets(train_config.min_length, train_config.max_length, train_config.length_buckets)
    val_lengths = [train_config.max_length * m for m in train_config.val_multipliers]
    val_sets = {n: make_eval_set(task, n, train_config.val_samples, seed=train_config.seed + 1)
                for n in val_lengths} if world.is_main else {}

    def validate() -> dict:
        results = {}
        if world.is_main:
            model.eval()
            for length, examples in val_sets.items():
                acc = teacher_forced_accuracy(model, task, examples, device=world.device,
                                              autocast_dtype=autocast_dtype)
                results[length] = acc
                val_log.write({"step": step, "length": length, **acc})
                if writer is not None:
                    writer.add_scalar(f"val/exact_match_{length}", acc["exact_match"], step)
            model.train()
        if world.active:
            dist.barrier()
        return results

    def checkpoint_now() -> None:
        # per rank: RNG states and the partial loss window, so a resumed run logs the same numbers
        mine = {"rng": rng_state(), "window": {"loss": window_loss, "targets": window_targets}}
        states = [None] * world.world_size
        if world.active:
            dist.all_gather_object(states, mine)
        else:
            states = [mine]
        if world.is_main:
            save_checkpoint(run_dir / CHECKPOINT_NAME, {
                "train_config": asdict(train_config), "model_config": asdict(model_config),
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rank_states": states, "step": step,
                "git_commit": commit, "device": describe_device(world.device),
                "world_size": world.world_size})

    end = train_config.steps if stop_at_step is None else min(train_config.steps, stop_at_step)
    bar = tqdm(total=train_config.steps, initial=step, disable=not (progress and world.is_main),
               dynamic_ncols=True, desc=f"train {task.name}")
    model.train()
    window_tokens, window_start = 0, time.perf_counter()
    start_time, last_loss, val_results = time.perf_counter(), float("nan"), {}
    while step < end:
        batch = training_batch(task, seed=train_config.seed, rank=world.rank, step=step,
                               batch_size=local_batch, buckets=buckets).to(world.device)
        loss, loss_sum, n_targets = target_loss(ddp_model, batch, world, autocast_dtype)
        if not math.isfinite(loss_sum):
            raise FloatingPointError(f"non-finite training loss at step {step + 1} (rank {world.rank}); "
                                     f"the last checkpoint in {run_dir} is intact")
        loss.backward()
        if train_config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window_loss += loss_sum
        window_targets += n_targets
        window_tokens += batch.n_tokens
        if step % train_config.log_every == 0 or step == train_config.steps:
            totals = torch.tensor([window_loss, window_tokens], dtype=torch.float64, device=world.device)
            if world.active:
                dist.all_reduce(totals)
            last_loss = float(totals[0]) / window_targets
            tokens = int(totals[1])  # non-pad tokens of all ranks since the last log line (in this process)
            tokens_per_s = tokens / max(time.perf_counter() - window_start, 1e-9)
            if world.is_main:
                log.write({"step": step, "loss": f"{last_loss:.6f}", "lr": f"{lr:.3e}", "tokens": tokens,
                           "tokens_per_s": f"{tokens_per_s:.1f}",
                           "elapsed_s": f"{time.perf_counter() - start_time:.2f}"})
                if writer is not None:
                    writer.add_scalar("train/loss", last_loss, step)
                    writer.add_scalar("train/lr", lr, step)
            bar.set_postfix(loss=f"{last_loss:.4f}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
            window_loss, window_targets, window_tokens, window_start = 0.0, 0, 0, time.perf_counter()
        bar.update(1)
        if (train_config.val_every and step % train_config.val_every == 0) or step == train_config.steps:
            val_results = validate()
            if world.is_main:
                bar.write(f"step {step}: " + ", ".join(
                    f"len {n}: EM {r['exact_match']:.3f}" for n, r in val_results.items()))
        if (train_config.checkpoint_every and step % train_config.checkpoint_every == 0) or step == end:
            checkpoint_now()
    bar.close()
    if world.is_main and writer is not None:
        writer.close()
    if world.owns_group:
        dist.destroy_process_group()
    return {"step": step, "loss": last_loss, "val": val_results, "run_dir": str(run_dir),
            "elapsed_s": time.perf_counter() - start_time}
