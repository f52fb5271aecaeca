"""GPU checks of --cuda-graphs (asentmax.trainer, issue 14; run on the H200, skipped elsewhere).

The trainer with the compiled forward and backward replayed as CUDA graphs (torch.compile mode
reduce-overhead) trains as the compiled trainer without them: the same loss at every step and the same
parameters after the run, for softmax (SDPA), entmax and ASEntmax (the fused Triton custom ops) on MQMTAR
batches of two length buckets, in fp32 (where the two runs differ only by Inductor's atomic adds). Each
bucket width records one forward and one backward graph, at its second step, and nothing is recorded
after that (no graph per batch, no re-recording); Inductor skips no graph; and the graphed steps after the
recordings never wait for the device.

Also: with Inductor made to pad every mm it may (force_shape_pad), ASEntmax with 8 heads still trains over
two widths, compiled and graphed (pad_mm is off in the trainer's compile). And the training benchmark's
StepGraph (the whole step as one CUDA graph per width) trains as the trainer's step.

Run: PYTHONPATH=src python -m pytest -q -m gpu tests/test_cuda_graphs_gpu.py
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters

from asentmax.nn import Transformer
from asentmax.runs import load_checkpoint
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import TrainConfig, train
from conftest import load_benchmark

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MODEL = dict(d_model=128, n_layers=2, n_heads=4, d_ff=256, position="nape")
BATCH, STEPS = 32, 16


def cuda_graph_captures():
    """benchmarks/bench_train_gpu.py's counter of CUDA graph captures (torch.cuda.CUDAGraph.capture_begin)."""
    return load_benchmark("bench_train_gpu").cuda_graph_captures()


class ObservedWorkload(TaskWorkload):
    """MQMTAR in two length buckets, noting each training batch's width and how many CUDA graphs had been
    captured before its step; the steps whose index is in `checked` run under CUDA's sync debug mode
    "error" (a host-device synchronisation there raises)."""

    def observe(self, captures: list, checked=()) -> ObservedWorkload:
        self.captures, self.checked, self.widths, self.captures_before = captures, set(checked), [], []
        return self

    def batches(self, **kwargs):
        for index, batch in enumerate(super().batches(**kwargs)):
            torch.cuda.set_sync_debug_mode("error" if index in self.checked else "default")
            self.widths.append(batch.input_ids.shape[1])
            self.captures_before.append(len(self.captures))
            yield batch


def workload() -> ObservedWorkload:
    return ObservedWorkload(task="mqmtar", length_buckets=2, val_multipliers=(1,), val_samples=4)


def trained(run_dir: Path, attention: str, cuda_graphs: str, steps: int = STEPS, log_every: int = 1,
            checked=()):
    """(workload observed, model config, logged losses, final parameters, CUDA graphs captured, Inductor's
    cudagraph skips) of one fp32 run of the trainer."""
    torch._dynamo.reset()
    counters.clear()
    config = TrainConfig(steps=steps, batch_size=BATCH, lr=1e-3, warmup_steps=2, log_every=log_every,
                         val_every=0, checkpoint_every=0, amp="off", device="cuda", cuda_graphs=cuda_graphs)
    with cuda_graph_captures() as captures:
        observed = workload().observe(captures, checked)
        model_config = observed.model_config({**MODEL, "attention": attention})
        try:
            train(observed, config, model_config, run_dir, progress=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    with open(run_dir / "log.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    parameters = load_checkpoint(run_dir / "checkpoint.pt")["model"]
    return observed, model_config, losses, parameters, len(captures), counters["inductor"]["cudagraph_skips"]


def relative_update_difference(initial: dict, reference: dict, other: dict) -> float:
    """benchmarks/bench_train_gpu.py's ||other - reference|| / ||reference - initial|| over the parameters."""
    return load_benchmark("bench_train_gpu").relative_update_difference(initial, reference, other)


def settled_index(widths: list[int]) -> int:
    """The batch index at which every width has appeared twice (its graphs are then recorded)."""
    second = [[i for i, w in enumerate(widths) if w == width][1] for width in set(widths)]
    return max(second)


@pytest.mark.parametrize("attention", ["softmax", "entmax", "asentmax"])
def test_graphed_training_equals_compiled_training(attention, tmp_path):
    observed, model_config, losses, parameters, captures, _ = trained(tmp_path / "compiled", attention, "off")
    assert captures == 0  # off means off
    graphed, _, graphed_losses, graphed_parameters, graphed_captures, skips = trained(
        tmp_path / "graphed", attention, "on")

    assert graphed.widths == observed.widths  # the same batches
    widths = graphed.widths
    assert len(set(widths)) == 2 and all(widths.count(w) >= 2 for w in set(widths)), widths  # the premise
    assert len(graphed_losses) == STEPS
    torch.testing.assert_close(torch.tensor(graphed_losses), torch.tensor(losses), rtol=1e-4, atol=1e-6)
    torch.manual_seed(0)  # the trainer's initial parameters (TrainConfig.seed 0)
    initial = Transformer(model_config).state_dict()
    difference = relative_update_difference(initial, parameters, graphed_parameters)
    assert difference < 1e-3, difference

    # one forward and one backward graph per width (plus one empty graph that makes the memory pool),
    # all recorded by the step at which every width had appeared twice
    assert skips == 0
    assert 2 * len(set(widths)) <= graphed_captures <= 2 * len(set(widths)) + 1, graphed_captures
    settled = settled_index(widths)
    assert graphed.captures_before[settled + 1:] == [graphed_captures] * (STEPS - settled - 1), (
        widths, graphed.captures_before)


def test_graphed_steps_never_wait_for_the_device(tmp_path):
    """After the recordings, the steps between log steps make no host-device synchronisation (the
    replays, the eager loss, clipping and AdamW, the device-side loss window and the device sampler);
    the last step (log line, validation, checkpoint) reads the device and is not checked."""
    ahead = workload().observe([]).batches(seed=0, start_step=0, rank=0, world_size=1, local_batch_size=BATCH,
                               device=torch.device("cuda"))
    widths = [batch.input_ids.shape[1] for batch in itertools.islice(ahead, 40)]
    start = settled_index(widths) + 1
    steps = start + 6
    observed, *_, captures, skips = trained(tmp_path / "run", "asentmax", "on", steps=steps, log_every=100,
                                            checked=range(start, steps - 1))
    assert observed.widths == widths[:steps] and skips == 0
    assert observed.captures_before[start:] == [captures] * (steps - start)


@pytest.mark.parametrize("attention", ["softmax", "asentmax"])
def test_bf16_true_trains_compiled_and_graphed_in_bf16(attention, tmp_path):
    """--amp bf16-true on CUDA with the default compile and CUDA graphs: the loss falls and stays finite,
    weights and AdamW states are bf16, and the graphs are recorded once per width as in fp32."""
    torch._dynamo.reset()
    counters.clear()
    config = TrainConfig(steps=60, batch_size=BATCH, lr=1e-3, warmup_steps=5, log_every=5, val_every=0,
                         checkpoint_every=0, amp="bf16-true", device="cuda", cuda_graphs="on")
    with cuda_graph_captures() as captures:
        observed = workload().observe(captures)
        train(observed, config, observed.model_config({**MODEL, "attention": attention}), tmp_path,
              progress=False)
    with open(tmp_path / "log.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.8 * losses[0], losses
    checkpoint = load_checkpoint(tmp_path / "checkpoint.pt")
    assert {value.dtype for value in checkpoint["model"].values()} == {torch.bfloat16}
    states = [value for state in checkpoint["optimizer"]["state"].values()
              for key, value in state.items() if key != "step"]
    assert {value.dtype for value in states} == {torch.bfloat16}
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert len(captures) <= 2 * len(set(observed.widths)) + 1


@pytest.mark.parametrize("attention", ["softmax", "asentmax"])
def test_the_benchmarks_step_graph_trains_as_the_trainers_step(attention):
    """benchmarks/bench_train_gpu.py's StepGraph (the whole step, AdamW included, as one CUDA graph per width)
    against the trainer's --cuda-graphs step, in fp32, from the same weights on the same batches of two
    widths: the same losses and parameter updates but for Inductor's atomic adds. A graph that replayed a
    stale lr, kept last step's gradients or did not restart AdamW's moments would fail this."""
    bench = load_benchmark("bench_train_gpu")
    device = torch.device("cuda")
    tasks = TaskWorkload(task="mqmtar", length_buckets=2, val_multipliers=(1,), val_samples=4)
    torch.manual_seed(0)
    model = Transformer(tasks.model_config({**MODEL, "attention": attention})).to(device)
    batches = list(itertools.islice(tasks.batches(seed=0, start_step=0, rank=0, world_size=1,
                                                  local_batch_size=BATCH, device=device), 12))
    assert len({batch.input_ids.shape[1] for batch in batches}) == 2  # the premise: two widths
    graph, loss_difference, update_difference = bench.step_graph_agreement(
        model, batches, device, None, "inductor", steps=8)
    assert len(graph.graphs) == 2
    assert loss_difference < 1e-4, loss_difference
    assert update_difference < 1e-3, update_difference


@pytest.mark.parametrize("cuda_graphs", ["off", "on"])
def test_training_survives_inductor_padding_every_mm_it_may(cuda_graphs, tmp_path):
    """ASEntmax under NAPE with 8 heads has a 4-output temperature projection, which Inductor's pad_mm pads
    to 8 in bf16 where it judges padding faster. A (B, T, 4) output of row stride 8 (that projection, by its
    shape) is kept for the backward, whose compiled graph then fixed that stride at the first width's value
    and failed `assert_size_stride` at the second width (results/session40_gpu/README.md). With padding
    forced wherever Inductor allows it, the trainer (compiled_for_training: pad_mm off) trains over both
    widths in bf16 autocast (amp auto)."""
    torch._dynamo.reset()
    config = TrainConfig(steps=8, batch_size=BATCH, lr=1e-3, warmup_steps=2, log_every=1, val_every=0,
                         checkpoint_every=0, device="cuda", cuda_graphs=cuda_graphs)
    observed = workload().observe([])
    model_config = observed.model_config({**MODEL, "n_heads": 8, "attention": "asentmax"})
    with inductor_config.patch(force_shape_pad=True):
        train(observed, config, model_config, tmp_path, progress=False)
    assert len(set(observed.widths)) == 2, observed.widths  # the premise: the width changes
    with open(tmp_path / "log.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 8
