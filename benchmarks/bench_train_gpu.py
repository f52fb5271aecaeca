"""Training throughput of a task's preset (--task; MQMTAR by default) for every attention normaliser
(issue 14, item 5).

For softmax, SSMax, entmax and ASEntmax (all with NAPE positions) at the task's reference model
(arXiv:2506.16640, section 3; MQMTAR: 4 layers, d_model 512, 16 heads, FFN 1024; Sort: 2 layers, d_model 256,
8 heads, in the paper code's blocks; training lengths 32-64 in 4 buckets, bf16 autocast, AdamW) and each batch
size, one row holds:

- bare step, eager and torch.compile'd: forward, target-token loss, backward, clipping, AdamW, on batches
  drawn in advance (the length-bucket mix of training, so the compiled model sees every bucket's shape);
  ms/step and samples/s; the compiled row's ratio to softmax compiled of the same batch size, measured
  earlier in the same process;
- first compiled step: seconds until the first compiled step returned (tracing and compiling), and until
  every bucket's shape had run once, with the number of graphs compiled;
- CUDA graphs (on CUDA only): the same compiled bare step in torch.compile's mode reduce-overhead, as
  `--cuda-graphs` runs it (compiled_for_training(mode="reduce-overhead"): Inductor's cudagraph trees),
  timed after two untimed passes over the batches (a width's graphs are recorded at its second call); its
  ms/step, samples/s, speed-up over the compiled row and the number of CUDA graphs captured (one forward
  and one backward per width, plus the empty graph that makes a tree's memory pool);
- step graph (on CUDA only): the WHOLE bare step (forward, loss, backward, clipping, AdamW) captured as one
  CUDA graph per width (StepGraph: compiled without cudagraph trees, AdamW fused and capturable), what a
  trainer without host work inside the step would run; its ms/step (with the copy of each batch into the
  graph's inputs), its speed-up over the CUDA-graphs row, and its agreement with the trainer's step: both
  run --check-steps steps from the same weights on the same batches, and the row gives the largest relative
  difference of their losses and ||difference|| / ||update|| of their parameter updates;
- whole loop: the command line itself (`asentmax train --preset TASK`, a fresh process, compile and
  fused AdamW at their defaults, CUDA graphs off) for --loop-steps steps; its steady-state ms/step
  from log.csv's elapsed_s between the first log line after the warm-up and the last one (compilation,
  the final validation and the checkpoint are outside that window); its ratio to the bare compiled step;
  on CUDA the same loop again with --cuda-graphs on (a refusal by the trainer is recorded) and the
  largest relative difference between its logged losses and those of the loop without graphs (same
  seed, same batches: bf16 rounding and atomics only);
- validation: ms of one validation by the task workload (the presets' 3 lengths, eager model, as the
  trainer runs it) and its share of training time at val-every 500 (TrainConfig's default; the MQMTAR
  preset's is 3,200 since the eleventh session); checkpoint: writing model + AdamW state once
  (asentmax.runs.save_checkpoint) and its share at checkpoint-every 500 (MQMTAR's preset: 1,600);
- data: ms per batch of the training sampler alone (device sampler, synchronised) as a fraction of the
  loop's ms/step: an upper bound of the time the step waits for data (the trainer draws each batch one
  step ahead on a side CUDA stream, so these kernels mostly run beside the previous step);
- TFLOP/s of the compiled bare step: model FLOPs of the padded batch (2 x every Linear's weights per
  token, causal attention 2 d T (T + 1) per layer and row, backward = 2 x forward) over its time, and their
  fraction of the bf16 matmul ceiling measured at start (one 8192^3 bf16 matmul, median of repeats);
- with --profile: the compiled step's kernels under torch.profiler (self device time, top 30) to
  OUT_profile_<attention>_<batch>.txt, to show where a normaliser's extra time goes.

Rows go to OUT.md and OUT.json after every row. The host's numpy producer (asentmax.data.training_batch)
is timed once for comparison. A time budget (--budget-s) skips the rows that would not fit, saying so.

    PYTHONPATH=src python benchmarks/bench_train_gpu.py --out results/train_gpu          # one GPU
    PYTHONPATH=src python benchmarks/bench_train_gpu.py --smoke --out /tmp/train_smoke    # CPU, tiny
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from asentmax import precision
from asentmax.data import IGNORE_INDEX, Batch, length_buckets, training_batch
from asentmax.nn import Transformer
from asentmax.runs import git_commit, save_checkpoint
from asentmax.tasks.device_sampling import DeviceBatchSampler
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import TrainConfig, compiled_for_training

NORMALISERS = ("softmax", "ssmax", "entmax", "asentmax")
REPO = Path(__file__).resolve().parents[1]
EVERY = 500  # TrainConfig's default validation and checkpoint interval (val_every, checkpoint_every)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: torch.device, size: int, dtype: torch.dtype, repeats: int) -> float:
    """TFLOP/s of one size^3 matmul (median of `repeats`)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e12


def attention_flops(config, batch_size: int, width: int) -> float:
    """Training FLOPs of causal attention: q.k and p.v over the T (T + 1) / 2 visible pairs, 2 FLOPs per
    multiply-add and head dimension, in every layer, times 3 (backward = 2 x forward)."""
    return 3 * batch_size * config.n_layers * 2 * width * (width + 1) * config.n_heads * config.head_dim


def step_flops(model: Transformer, batch_size: int, width: int) -> float:
    """Training FLOPs of one step on a (batch_size, width) batch: 3 x (2 x every Linear's weights per
    token) plus attention_flops."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 3 * batch_size * 2 * width * linear + attention_flops(model.config, batch_size, width)


def make_step(model, optimizer, autocast_dtype, grad_clip: float):
    """The bare training step the trainer runs (asentmax.trainer): loss over the target tokens divided by
    their count (on the device), backward, clipping, AdamW, zero_grad."""
    device = next(model.parameters()).device

    def step(forward, batch):
        n_targets = (batch.labels != IGNORE_INDEX).sum()
        with precision.autocast(device, autocast_dtype):
            logits = forward(batch.input_ids)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(), reduction="sum",
                               ignore_index=IGNORE_INDEX) / n_targets
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def time_steps(step, forward, batches, n_steps: int, device) -> float:
    """ms per step over n_steps steps cycling through `batches` (after one untimed pass over them)."""
    for batch in batches:
        step(forward, batch)
    sync(device)
    start = time.perf_counter()
    for i in range(n_steps):
        step(forward, batches[i % len(batches)])
    sync(device)
    return (time.perf_counter() - start) / n_steps * 1e3


def graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def cuda_graph_captures():
    """Counts the CUDA graphs captured while it is open (calls of torch.cuda.CUDAGraph.capture_begin, which
    Inductor's cudagraph trees and torch.cuda.graph both go through): yields a list, one entry per
    capture."""
    captures = []
    capture_begin = torch.cuda.CUDAGraph.capture_begin

    def counted(graph, *args, **kwargs):
        captures.append(1)
        return capture_begin(graph, *args, **kwargs)

    torch.cuda.CUDAGraph.capture_begin = counted
    try:
        yield captures
    finally:
        torch.cuda.CUDAGraph.capture_begin = capture_begin


def first_error_line(error: Exception) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0][:160]}"


def bare_row(args, normaliser: str, batch_size: int, device, autocast_dtype, sampler, workload) -> dict:
    """Eager and compiled bare-step timings (a compile failure is recorded, the eager numbers kept),
    first-step compile time, graphs compiled and model FLOPs of one configuration."""
    batches = [sampler.batch(seed=0, rank=0, step=s, batch_size=batch_size) for s in range(args.batches)]
    widths = sorted({b.input_ids.shape[1] for b in batches})
    row = {"normaliser": normaliser, "batch": batch_size, "widths": widths}
    torch.manual_seed(0)
    model = Transformer(model_config(args, normaliser, workload)).to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), **fused)
    step = make_step(model, optimizer, autocast_dtype, grad_clip=1.0)
    flops = statistics.fmean(step_flops(model, batch_size, b.input_ids.shape[1]) for b in batches)
    row["mean_width"] = statistics.fmean(b.input_ids.shape[1] for b in batches)
    row["eager_ms"] = time_steps(step, model, batches, args.steps, device)
    row["val_ms"] = validation_ms(args, model, device, autocast_dtype)
    row["checkpoint_ms"] = checkpoint_ms(model, optimizer)
    try:
        row.update(compiled_timings(args, model, step, batches, device))
    except Exception as error:  # a normaliser that does not compile is a result, not the end of the run
        row["compile_error"] = first_error_line(error)
    if device.type == "cuda":
        try:
            row.update(graphed_timings(args, model, step, batches, device))
        except Exception as error:
            row["graphs_error"] = first_error_line(error)
        try:
            row.update(step_graph_timings(args, model, batches, device, autocast_dtype))
        except Exception as error:
            row["step_graph_error"] = first_error_line(error)
    for kind in ("eager", "compiled", "graphs", "step_graph"):
        if f"{kind}_ms" in row:
            row[f"{kind}_samples_s"] = batch_size / (row[f"{kind}_ms"] * 1e-3)
            row[f"{kind}_tflops"] = flops / (row[f"{kind}_ms"] * 1e-3) / 1e12
    if "compiled_ms" in row and "graphs_ms" in row:
        row["graphs_vs_compiled"] = row["compiled_ms"] / row["graphs_ms"]
    if "graphs_ms" in row and "step_graph_ms" in row:
        row["step_graph_vs_graphs"] = row["graphs_ms"] / row["step_graph_ms"]
    return row


def compiled_timings(args, model, step, batches, device) -> dict:
    torch._dynamo.reset()
    graphs_before = graph_count()
    if args.shapes == "trainer":  # what asentmax.trainer runs: the sequence length marked dynamic
        compiled = compiled_for_training(model, backend=args.compile_backend)
    else:  # one static graph per bucket width
        compiled = torch.compile(model, backend=args.compile_backend, dynamic=False)
    start = time.perf_counter()
    step(compiled, batches[0])
    sync(device)
    timings = {"first_step_s": time.perf_counter() - start}
    seen = {batches[0].input_ids.shape[1]}
    for batch in batches:
        if batch.input_ids.shape[1] not in seen:
            seen.add(batch.input_ids.shape[1])
            step(compiled, batch)
    sync(device)
    timings["all_shapes_s"] = time.perf_counter() - start
    timings["graphs"] = graph_count() - graphs_before
    timings["compiled_ms"] = time_steps(step, compiled, batches, args.steps, device)
    if args.profile:
        profile_steps(args, step, compiled, batches, device)
    return timings


def graphed_timings(args, model, step, batches, device) -> dict:
    """The compiled bare step replayed as CUDA graphs (the trainer's --cuda-graphs): ms/step after two
    untimed passes over `batches` (every width warms up at its first call and is recorded at its second),
    and the CUDA graphs captured."""
    torch._dynamo.reset()
    with cuda_graph_captures() as captures:
        forward = compiled_for_training(model, backend=args.compile_backend, mode="reduce-overhead")
        for _ in range(2):
            for batch in batches:
                step(forward, batch)
        timings = {"graphs_ms": time_steps(step, forward, batches, args.steps, device)}
    timings["cuda_graphs"] = len(captures)
    return timings


class StepGraph:
    """The whole bare step (forward, loss, backward, clipping, AdamW, zero_grad) captured as ONE CUDA graph
    per bucket width: the forward compiled as the trainer compiles it but without cudagraph trees, AdamW
    fused with capturable=True and its lr a device tensor (the trainer's schedule would fill it each step).
    Each width is warmed up three times on a side stream, then captured into its own memory pool; the
    warm-up steps change the weights. Calling it on a batch copies the batch into its width's static
    inputs, refills the lr and replays, returning the loss tensor (valid until that width's next replay).
    It keeps the compiled forward alive: its kernels are what the graphs replay."""

    def __init__(self, model, batches, device, autocast_dtype, backend: str):
        torch._dynamo.reset()
        self.forward = compiled_for_training(model, backend=backend)
        self.lr = torch.tensor(1e-4, device=device)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr, betas=(0.9, 0.99), fused=True,
                                           capturable=True)
        step = make_step(model, self.optimizer, autocast_dtype, grad_clip=1.0)
        first_of_width = {}
        for batch in batches:
            first_of_width.setdefault(batch.input_ids.shape[1], batch)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for batch in first_of_width.values():
                for _ in range(3):
                    step(self.forward, batch)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graphs = {}
        for width, batch in first_of_width.items():
            static = Batch(batch.input_ids.clone(), batch.labels.clone())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = step(self.forward, static)
            self.graphs[width] = (graph, static, loss)

    def __call__(self, batch) -> torch.Tensor:
        graph, static, loss = self.graphs[batch.input_ids.shape[1]]
        static.input_ids.copy_(batch.input_ids)
        static.labels.copy_(batch.labels)
        self.lr.fill_(1e-4)
        graph.replay()
        return loss

    def restart(self, model, weights: dict) -> None:
        """`weights` back into the model and AdamW's moments and step counts to zero, IN PLACE (the graphs
        hold these tensors' addresses): a fresh optimizer at those weights."""
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(weights[name])
        for state in self.optimizer.state.values():
            for value in state.values():
                value.zero_()


def relative_update_difference(initial: dict, reference: dict, other: dict) -> float:
    """||other - reference|| / ||reference - initial|| over all parameters (dicts of tensors): how much two
    runs' parameter updates from `initial` differ, relative to the update."""
    difference = sum(float((other[k].double() - reference[k].double()).square().sum()) for k in reference)
    update = sum(float((reference[k].double() - initial[k].double()).square().sum()) for k in reference)
    return (difference / update) ** 0.5


def step_graph_agreement(model, batches, device, autocast_dtype, backend: str, steps: int):
    """From the model's current weights, `steps` steps of the trainer's --cuda-graphs step (compiled forward
    and backward as cudagraph trees; loss, clipping and fused AdamW eager), then, from the same weights and
    a fresh AdamW, `steps` steps of a StepGraph on the same batches. Returns (the StepGraph, the largest
    relative difference of the two runs' losses, ||graph - trainer|| / ||trainer - start|| of their
    parameter updates). The model ends with the StepGraph's weights."""
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch._dynamo.reset()
    forward = compiled_for_training(model, backend=backend, mode="reduce-overhead")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), fused=True)
    step = make_step(model, optimizer, autocast_dtype, grad_clip=1.0)
    trainer_losses = [float(step(forward, batches[i % len(batches)])) for i in range(steps)]
    trainer_weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    graph = StepGraph(model, batches, device, autocast_dtype, backend)
    graph.restart(model, start)
    graph_losses = [float(graph(batches[i % len(batches)])) for i in range(steps)]
    loss_difference = max(abs(a - b) / abs(b) for a, b in zip(graph_losses, trainer_losses, strict=True))
    graph_weights = {name: p.detach() for name, p in model.named_parameters()}
    return graph, loss_difference, relative_update_difference(start, trainer_weights, graph_weights)


def step_graph_timings(args, model, batches, device, autocast_dtype) -> dict:
    """The step graph's agreement with the trainer's step over --check-steps steps, then its ms/step
    cycling through `batches` (the batch copies and the lr refill included)."""
    graph, loss_difference, update_difference = step_graph_agreement(
        model, batches, device, autocast_dtype, args.compile_backend, args.check_steps)
    ms = time_steps(lambda _forward, batch: graph(batch), None, batches, args.steps, device)
    return {"step_graph_ms": ms, "step_graph_loss_diff": loss_difference,
            "step_graph_update_diff": update_difference, "step_graph_captures": len(graph.graphs)}


def profile_steps(args, step, forward, batches, device) -> None:
    """torch.profiler over one pass of the compiled step through `batches`: the top 30 kernels by self
    device time, per step, to OUT_profile_<attention>_<batch>.txt."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for batch in batches:
            step(forward, batch)
        sync(device)
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=30, max_name_column_width=90)
    name = f"{args.out.name}_profile_{args.current}.txt"
    (args.out.parent / name).write_text(f"{len(batches)} compiled steps, {args.current}\n{table}\n")


def validation_ms(args, model, device, autocast_dtype) -> float:
    """ms of one validation by the task workload with the preset's lengths (1, 2, 4 x 64) and
    --val-samples samples per length, on the eager model as the trainer runs it (after one warm-up call,
    which also draws the validation sets)."""
    workload = TaskWorkload(task=args.task, val_samples=args.val_samples)
    model.eval()
    workload.validate(model, seed=0, step=0, device=device, autocast_dtype=autocast_dtype)
    sync(device)
    start = time.perf_counter()
    workload.validate(model, seed=0, step=0, device=device, autocast_dtype=autocast_dtype)
    sync(device)
    model.train()
    return (time.perf_counter() - start) * 1e3


def checkpoint_ms(model, optimizer) -> float:
    """ms of writing model + optimizer state with asentmax.runs.save_checkpoint (the bulk of the trainer's
    checkpoint), to a temporary directory, median of 3."""
    times = []
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(3):
            start = time.perf_counter()
            save_checkpoint(Path(directory) / "checkpoint.pt",
                            {"model": model.state_dict(), "optimizer": optimizer.state_dict()})
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def data_ms(sampler, batch_size: int, n: int, device) -> float:
    """ms per training batch of the device sampler alone (synchronised)."""
    sampler.batch(seed=0, rank=0, step=0, batch_size=batch_size)
    sync(device)
    start = time.perf_counter()
    for s in range(n):
        sampler.batch(seed=0, rank=0, step=s, batch_size=batch_size)
    sync(device)
    return (time.perf_counter() - start) / n * 1e3


def host_producer_samples_s(task, buckets, batch_size: int, n: int) -> float:
    """Samples/s of the host's numpy producer (asentmax.data.training_batch), one process."""
    start = time.perf_counter()
    for s in range(n):
        training_batch(task, seed=0, rank=0, step=s, batch_size=batch_size, buckets=buckets)
    return n * batch_size / (time.perf_counter() - start)


def loop_row(args, normaliser: str, batch_size: int, device, cuda_graphs: str = "off") -> dict:
    """`asentmax train` itself, in a fresh process, for --loop-steps steps (the in-process trainer of an
    earlier version measured 13.9 ms a step for ASEntmax where the command line took 23: results/
    train_loop_gpu.md); steady-state ms/step from its log.csv, and its logged losses. Its schedule and seed
    are given (floor 0.1, seed 0: what the preset gave before the tenth session), so the loop runs the same
    steps whatever the preset says. Keys start with "loop_", or "graphs_loop_" with cuda_graphs "on"."""
    sizes = [arg for name, value in model_sizes(args).items()
             for arg in (f"--{name.replace('_', '-')}", str(value))]
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, "-m", "asentmax", "train", "--preset", args.task, "--attention",
                   normaliser, "--position", "nape", *sizes, "--steps", str(args.loop_steps), "--batch-size",
                   str(batch_size), "--lr", "1e-4", "--warmup-steps", "10", "--min-lr-ratio", "0.1",
                   "--seed", "0", "--log-every",
                   str(args.log_every), "--val-every", "0", "--checkpoint-every", "0",
                   "--val-multipliers", "1", "--val-samples", str(args.val_samples), "--sampling", "device",
                   "--device", device.type, "--cuda-graphs", cuda_graphs, "--no-progress", "--overwrite",
                   "--run-dir", run_dir]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        total_s = time.perf_counter() - start
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"asentmax train exited with {done.returncode}: {last}")
        with open(Path(run_dir) / "log.csv", newline="") as f:
            log = [(int(r["step"]), float(r["elapsed_s"]), float(r["loss"])) for r in csv.DictReader(f)]
    if len(log) < 2:
        raise ValueError(f"--loop-steps {args.loop_steps} gives {len(log)} log line(s) at --log-every "
                         f"{args.log_every}; the steady state needs two")
    (first_step, first_s, _), (last_step, last_s, _) = log[len(log) // 3], log[-1]
    if last_s <= first_s:
        raise ValueError(f"steps {first_step}-{last_step} took less than log.csv's resolution (1 ms): give "
                         "more --loop-steps")
    loop_ms = (last_s - first_s) / (last_step - first_step) * 1e3
    prefix = "graphs_loop" if cuda_graphs == "on" else "loop"
    return {f"{prefix}_ms": loop_ms, f"{prefix}_samples_s": batch_size / (loop_ms * 1e-3),
            f"{prefix}_total_s": total_s, f"{prefix}_compiled": TrainConfig().uses("compile", device),
            f"{prefix}_first_log_s": log[0][1], f"{prefix}_window": [first_step, last_step],
            f"{prefix}_losses": [loss for _, _, loss in log]}


def model_sizes(args) -> dict:
    """ModelConfig overrides of the preset: a tiny model for --smoke, none otherwise."""
    return dict(d_model=32, n_layers=2, n_heads=4, d_ff=64) if args.smoke else {}


def model_config(args, normaliser: str, workload: TaskWorkload):
    """The workload's preset model with `normaliser` and NAPE (and --smoke's sizes)."""
    return workload.model_config({"attention": normaliser, "position": "nape", **model_sizes(args)})


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


COLUMNS = ("attention", "batch", "eager ms", "compiled ms", "compiled samples/s", "vs softmax compiled",
           "CUDA graphs ms", "CUDA graphs samples/s", "CUDA graphs / compiled", "step graph ms",
           "step graph samples/s", "step graph speed-up over CUDA graphs",
           "step graph loss / update difference", "loop ms", "loop samples/s",
           "loop / bare compiled", "loop with CUDA graphs samples/s", "its loss difference",
           "data % of loop step", "validation ms (% of training)", "checkpoint ms (%)", "TFLOP/s",
           "% of ceiling", "first step s", "all shapes s", "graphs", "CUDA graphs captured")


def fmt_sci(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def write(out: Path, meta: dict, rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        f"# Training throughput, {meta['task']} preset (issue 14 item 5)", "",
        f"Command: `{meta['command']}`  ",
        f"Device: {meta['device']}; torch {meta['torch']}; git {meta['git']}  ",
        f"bf16 matmul ceiling ({meta['matmul_size']}^3): {fmt(meta['matmul_tflops'])} TFLOP/s; "
        f"host numpy producer (asentmax.data.training_batch): {fmt(meta['host_samples_s'], 0)} samples/s "
        f"at batch {meta['host_batch']}  ",
        f"compile: backend {meta['compile_backend']}, shapes: {meta['shapes']}; "
        f"bare steps timed: {meta['steps']} over {meta['batches']} pre-drawn batches", "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['normaliser']} | {r['batch']} | {r['skipped']} |" + " |" * (len(COLUMNS) - 3))
            continue
        best = "compiled" if "compiled_ms" in r else "eager"
        lines.append(
            f"| {r['normaliser']} | {r['batch']} | {fmt(r['eager_ms'], 2)} | "
            f"{fmt(r.get('compiled_ms'), 2)} | "
            f"{fmt(r.get('compiled_samples_s'), 0)} | {fmt(r.get('vs_softmax'), 2)} | "
            f"{fmt(r.get('graphs_ms'), 2)} | {fmt(r.get('graphs_samples_s'), 0)} | "
            f"{fmt(r.get('graphs_vs_compiled'), 2)} | "
            f"{fmt(r.get('step_graph_ms'), 2)} | {fmt(r.get('step_graph_samples_s'), 0)} | "
            f"{fmt(r.get('step_graph_vs_graphs'), 2)} | "
            f"{fmt_sci(r.get('step_graph_loss_diff'))} / {fmt_sci(r.get('step_graph_update_diff'))} | "
            f"{fmt(r.get('loop_ms'), 2)} | "
            f"{fmt(r.get('loop_samples_s'), 0)} | {fmt(r.get('loop_vs_bare'), 2)} | "
            f"{fmt(r.get('graphs_loop_samples_s'), 0)} | {fmt_sci(r.get('graphs_loop_loss_diff'))} | "
            f"{fmt(r.get('data_percent'), 1)} | {fmt(r['val_ms'], 0)} ({fmt(r.get('val_percent'), 1)}) | "
            f"{fmt(r['checkpoint_ms'], 0)} ({fmt(r.get('checkpoint_percent'), 1)}) | "
            f"{fmt(r[f'{best}_tflops'])} | {fmt(r['ceiling_percent'])} | "
            f"{fmt(r.get('first_step_s'))} | {fmt(r.get('all_shapes_s'))} | {fmt(r.get('graphs'))} | "
            f"{fmt(r.get('cuda_graphs'))} |")
        for key in ("compile_error", "graphs_error", "step_graph_error", "loop_error", "graphs_loop_error"):
            if key in r:
                lines.append(f"|  | {key.replace('_', ' ')}: {r[key]} |" + " |" * (len(COLUMNS) - 2))
    lines += ["", "CUDA graphs: the compiled bare step replayed as CUDA graphs (torch.compile mode "
              "reduce-overhead, as --cuda-graphs runs it), after two untimed passes; / compiled: the "
              "compiled row's ms over its ms; CUDA graphs captured: one forward and one backward per width, "
              "plus one empty graph per memory pool. "
              "Step graph: the whole bare step (forward, loss, backward, clipping, AdamW) as one CUDA graph "
              "per width (StepGraph), its speed-up: the CUDA graphs row's ms over its ms, and its difference "
              "from the trainer's step over --check-steps steps from the same weights and batches: the "
              "largest relative loss difference / ||parameter difference|| over ||parameter update||. "
              "Loop: the trainer's log.csv elapsed_s between the steps in `loop_window` (JSON); "
              "loop with CUDA graphs: the same loop with --cuda-graphs on, and its loss difference: the "
              "largest relative difference between its logged losses and the loop's without graphs; "
              "loop / bare: the bare compiled step's ms (eager where compiling failed) over the loop's; "
              "data %: the device sampler's ms per batch (alone, synchronised) over the loop's ms/step, "
              "an upper bound (the trainer draws batches one step ahead on a side stream); "
              f"validation: one call of the workload's (3 lengths, eager) and its share of training time at "
              f"val-every {EVERY}; checkpoint: model + AdamW state written once (save_checkpoint), share of "
              f"training time at checkpoint-every {EVERY}; "
              "TFLOP/s: model FLOPs of the padded batch over the compiled bare step (eager where "
              "compiling failed).", ""]
    out.with_suffix(".md").write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "train_gpu")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU (tests the script)")
    parser.add_argument("--task", default="mqmtar", choices=("mqmtar", "copy", "reverse", "sort"),
                        help="whose preset model, lengths, validation and `asentmax train --preset` to time")
    parser.add_argument("--normalisers", default=",".join(NORMALISERS))
    parser.add_argument("--batch-sizes", default="512,128")
    parser.add_argument("--steps", type=int, default=30, help="timed bare steps per variant")
    parser.add_argument("--batches", type=int, default=16, help="pre-drawn batches the bare steps cycle")
    parser.add_argument("--check-steps", type=int, default=8,
                        help="steps of the step graph's agreement check with the trainer's step (CUDA)")
    parser.add_argument("--loop-steps", type=int, default=240, help="trainer steps per row (0: no loop)")
    parser.add_argument("--log-every", type=int, default=40)
    parser.add_argument("--val-samples", type=int, default=64)
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--shapes", default="trainer", choices=("trainer", "static"),
                        help="compiled bare step: the trainer's (sequence length dynamic, one graph) or one "
                             "static graph per bucket width")
    parser.add_argument("--profile", action="store_true",
                        help="write the compiled step's top kernels (torch.profiler) per row")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="rows that would start later than this many seconds are skipped (and listed)")
    args = parser.parse_args(argv)
    if args.smoke:
        device, autocast_dtype, matmul_size = torch.device("cpu"), None, 256
        args.compile_backend = "eager" if args.compile_backend == "inductor" else args.compile_backend
        args.steps, args.batches, args.loop_steps, args.log_every = 2, 4, min(args.loop_steps, 6), 2
        args.val_samples = 2
        batch_sizes = [4]
    else:
        if not torch.cuda.is_available():
            parser.error("needs a CUDA GPU (use --smoke on CPU)")
        device, autocast_dtype, matmul_size = torch.device("cuda"), torch.bfloat16, 8192
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    normalisers = args.normalisers.split(",")
    for name in normalisers:
        if name not in NORMALISERS:
            parser.error(f"unknown normaliser {name!r}; choose from {', '.join(NORMALISERS)}")
    if "softmax" in normalisers:  # softmax first: the others are compared with it
        normalisers = ["softmax"] + [n for n in normalisers if n != "softmax"]

    clock = time.perf_counter()
    workload = TaskWorkload(task=args.task)
    task = workload.task_object
    buckets = length_buckets(workload.min_length, workload.max_length, workload.length_buckets)
    sampler = DeviceBatchSampler(task, buckets, device)
    commit = git_commit()  # $ASENTMAX_GIT_COMMIT on a copied tree, whose git metadata is stale
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    meta = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "task": args.task,
            "torch": torch.__version__,
            "device": name,
            "git": commit, "matmul_size": matmul_size, "compile_backend": args.compile_backend,
            "shapes": args.shapes, "steps": args.steps, "batches": args.batches,
            "matmul_tflops": matmul_ceiling(device, matmul_size, torch.bfloat16 if device.type == "cuda"
                                            else torch.float32, repeats=10),
            "host_batch": batch_sizes[0],
            "host_samples_s": host_producer_samples_s(task, buckets, batch_sizes[0], 2 if args.smoke else 4)}
    rows: list[dict] = []
    write(args.out, meta, rows)
    softmax_compiled: dict[int, float] = {}
    for batch_size in batch_sizes:
        for normaliser in normalisers:
            if time.perf_counter() - clock > args.budget_s:
                rows.append({"normaliser": normaliser, "batch": batch_size,
                             "skipped": f"skipped: past the {args.budget_s:.0f} s budget"})
                write(args.out, meta, rows)
                continue
            args.current = f"{normaliser}_{batch_size}"
            row = bare_row(args, normaliser, batch_size, device, autocast_dtype, sampler, workload)
            best = "compiled" if "compiled_ms" in row else "eager"
            if normaliser == "softmax" and best == "compiled":
                softmax_compiled[batch_size] = row["compiled_samples_s"]
            if batch_size in softmax_compiled and best == "compiled":
                row["vs_softmax"] = row["compiled_samples_s"] / softmax_compiled[batch_size]
            row["ceiling_percent"] = 100 * row[f"{best}_tflops"] / meta["matmul_tflops"]
            if args.loop_steps:
                try:
                    row.update(loop_row(args, normaliser, batch_size, device))
                    row["loop_vs_bare"] = row[f"{best}_ms"] / row["loop_ms"]
                    row["data_ms"] = data_ms(sampler, batch_size, 10, device)
                    row["data_samples_s"] = batch_size / (row["data_ms"] * 1e-3)
                    row["data_percent"] = 100 * row["data_ms"] / row["loop_ms"]
                    for what in ("val", "checkpoint"):  # share of training time at the presets' interval
                        cost = row[f"{what}_ms"]
                        row[f"{what}_percent"] = 100 * cost / (cost + EVERY * row["loop_ms"])
                except Exception as error:
                    row["loop_error"] = first_error_line(error)
                if device.type == "cuda":
                    try:  # a refusal of --cuda-graphs on (nn/attention.py cuda_graph_refusal) is recorded
                        row.update(loop_row(args, normaliser, batch_size, device, cuda_graphs="on"))
                        if "loop_losses" in row:  # the same steps logged, so the lists have one length
                            pairs = zip(row["graphs_loop_losses"], row["loop_losses"], strict=True)
                            row["graphs_loop_loss_diff"] = max(abs(a - b) / abs(b) for a, b in pairs)
                    except Exception as error:
                        row["graphs_loop_error"] = first_error_line(error)
            rows.append(row)
            write(args.out, meta, rows)
            print(json.dumps(row), flush=True)
    meta["total_s"] = time.perf_counter() - clock
    write(args.out, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
