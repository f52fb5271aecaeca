"""The training engine (asentmax.trainer) on the task workload (asentmax.tasks.workload, asentmax.data):
batching, schedule, loss goes down, exact resume, DDP (2 gloo processes) gradients equal to the
single-process gradients of the concatenated batch."""

import csv
import math
import os
from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from asentmax.data import IGNORE_INDEX, collate, length_buckets, training_batch
from asentmax.nn import ModelConfig, Transformer
from asentmax.runs import CHECKPOINT_NAME, load_checkpoint
from asentmax.tasks import get_task
from asentmax.tasks.workload import TaskWorkload
from asentmax.train import resume_run
from asentmax.trainer import (
    DelayedWarmupCosine,
    Distributed,
    NonFiniteLoss,
    TrainConfig,
    WarmupCosine,
    initial_model,
    restored_window,
    target_loss,
    train,
)
from conftest import join_workers

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(task, **overrides) -> ModelConfig:
    fields = dict(d_model=32, n_layers=1, n_heads=2, d_ff=64, attention="softmax", position="nape")
    return ModelConfig(vocab_size=task.vocab_size, **{**fields, **overrides})


def tiny_train(**overrides) -> TrainConfig:
    fields = dict(steps=12, batch_size=8, lr=3e-3, warmup_steps=3, val_every=0, log_every=2,
                  checkpoint_every=4, seed=3)
    return TrainConfig(**{**fields, **overrides})


def tiny_workload(**overrides) -> TaskWorkload:
    return TaskWorkload(**{**dict(task="copy", min_length=3, max_length=6, val_multipliers=(1, 2),
                                  val_samples=4), **overrides})


# ---- data ----

@pytest.mark.parametrize("lo,hi,n", [(32, 64, 4), (8, 16, 3), (5, 5, 4), (1, 3, 8), (10, 111, 7)])
def test_length_buckets_partition_the_range(lo, hi, n):
    buckets = length_buckets(lo, hi, n)
    covered = [length for a, b in buckets for length in range(a, b + 1)]
    assert covered == list(range(lo, hi + 1))
    assert len(buckets) == min(n, hi - lo + 1)
    sizes = [b - a + 1 for a, b in buckets]
    assert max(sizes) - min(sizes) <= 1


def test_length_buckets_reject_bad_ranges():
    with pytest.raises(ValueError, match="min_length"):
        length_buckets(10, 5, 2)
    with pytest.raises(ValueError, match="n_buckets"):
        length_buckets(5, 10, 0)


def test_collate_scores_target_and_eos_only():
    task = get_task("reverse")
    rng = np.random.default_rng(0)
    examples = [task.sample(n, rng) for n in (3, 7, 1)]
    batch = collate(task, examples)
    assert batch.input_ids.shape == (3, 7 + 7 + 3 - 1)
    for row, example in enumerate(examples):
        sequence = [1, *example.source, 2, *example.target, 3]  # independent layout: BOS src SEP tgt EOS
        n = len(sequence) - 1
        assert batch.input_ids[row, :n].tolist() == sequence[:-1]
        assert (batch.input_ids[row, n:] == 0).all()
        scored = batch.labels[row] != IGNORE_INDEX
        first = len(example.source) + 1  # the SEP position predicts target[0]
        assert scored.nonzero().flatten().tolist() == list(range(first, n))
        assert batch.labels[row, scored].tolist() == [*example.target, 3]


def test_collate_labels_each_source_token_of_a_tagging_task():
    task = get_task("two_back")
    rng = np.random.default_rng(0)
    examples = [task.sample(n, rng) for n in (3, 9, 1)]
    batch = collate(task, examples)
    assert batch.input_ids.shape == (3, 1 + 9)
    for row, example in enumerate(examples):
        n = 1 + len(example.source)
        assert batch.input_ids[row, :n].tolist() == [1, *example.source]  # BOS then the source, no SEP
        assert (batch.input_ids[row, n:] == 0).all()
        assert batch.labels[row, 0] == IGNORE_INDEX and (batch.labels[row, n:] == IGNORE_INDEX).all()
        assert batch.labels[row, 1:n].tolist() == example.target  # position of source[i] -> target[i]


def test_training_batches_are_deterministic_and_distinct_per_rank_and_step():
    task = get_task("copy")
    buckets = length_buckets(4, 12, 3)
    make = lambda rank, step: training_batch(task, seed=5, rank=rank, step=step, batch_size=6,
                                             buckets=buckets)
    a, b = make(0, 7), make(0, 7)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(make(1, 7).input_ids[:, :4], a.input_ids[:, :4])
    assert not torch.equal(make(0, 8).input_ids[:, :4], a.input_ids[:, :4])
    for step in range(20):  # one bucket per batch: every source length lies inside one bucket
        lengths = {int(n) for n in (make(0, step).labels != IGNORE_INDEX).sum(1) - 1}
        assert any(all(lo <= n <= hi for n in lengths) for lo, hi in buckets)


# ---- schedule ----

def test_warmup_cosine_schedule():
    schedule = WarmupCosine(warmup=10, total=110, min_ratio=0.1)
    assert schedule(0) == pytest.approx(0.1)
    assert schedule(9) == pytest.approx(1.0)
    assert schedule(10) == pytest.approx(1.0)
    assert schedule(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule(110) == pytest.approx(0.1)
    values = [schedule(s) for s in range(10, 111)]
    assert all(x >= y for x, y in zip(values, values[1:], strict=False))


def test_delayed_temperature_schedule():
    run = WarmupCosine(warmup=10, total=110, min_ratio=0.1)
    delayed = DelayedWarmupCosine(warmup=10, total=110, min_ratio=0.1, delay=30, scale=0.5)
    assert [delayed(s) for s in (0, 15, 29)] == [0.0, 0.0, 0.0]
    assert delayed(30) == pytest.approx(0.5 * run(30) / 10)  # its own warm-up starts after the delay
    assert delayed(39) == pytest.approx(0.5 * run(39))
    assert delayed(80) == pytest.approx(0.5 * run(80))
    assert DelayedWarmupCosine(10, 110, 0.1, delay=0, scale=1.0)(5) == run(5)


def test_temperature_parameters_wait_for_their_delay_then_learn(tmp_path):
    """--temperature-delay-steps: ASEntmax's beta/gamma projections keep their initial values while every
    other parameter trains; after the delay they move (results/paper/plateau)."""
    task = get_task("copy")
    model_config = tiny_model(task, attention="asentmax")
    names = [n for n, _ in Transformer(model_config).named_parameters() if ".temperature." in n]
    assert names  # the asentmax model has temperature parameters

    def weights(steps):
        run_dir = tmp_path / f"delay_{steps}"
        train(tiny_workload(), tiny_train(steps=steps, temperature_delay_steps=6, checkpoint_every=0),
              model_config, run_dir, progress=False)
        return load_checkpoint(run_dir / CHECKPOINT_NAME)["model"]

    frozen, moved = weights(6), weights(12)
    torch.manual_seed(3)  # the trainer's seed (tiny_train): the same initial weights
    initial = {n: p.detach().clone() for n, p in Transformer(model_config).named_parameters()}
    for name in names:
        assert torch.equal(frozen[name], initial[name]), name
        assert not torch.equal(moved[name], initial[name]), name
    assert not torch.equal(frozen["blocks.0.attn.wq.weight"], initial["blocks.0.attn.wq.weight"])


# ---- training ----

def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_training_reduces_the_loss(tmp_path):
    task = get_task("copy")  # 32 symbols: predicting the marginal gives log(32) nats per token
    config = tiny_train(steps=150, batch_size=16, warmup_steps=10, log_every=10, checkpoint_every=0,
                        val_every=75)
    summary = train(tiny_workload(), config, tiny_model(task, d_model=48, n_heads=4), tmp_path / "run",
                    progress=False)
    losses = [float(r["loss"]) for r in _read_csv(tmp_path / "run" / "log.csv")]
    assert len(losses) == 15 and summary["step"] == 150
    assert losses[0] > 0.95 * math.log(32)  # starts at chance
    assert losses[-1] < 0.85 * losses[0]
    assert losses[-1] < 0.85 * math.log(32)  # below the marginal: it reads the source
    val = _read_csv(tmp_path / "run" / "val.csv")
    assert [int(r["step"]) for r in val] == [75, 75, 150, 150]
    assert {int(r["length"]) for r in val} == {6, 12}


@pytest.mark.parametrize("attention,amp", [("softmax", "auto"), ("asentmax", "auto"),
                                           ("asentmax", "bf16-true")])
def test_kill_and_resume_gives_the_same_weights(tmp_path, attention, amp):
    task = get_task("copy")
    # dropout > 0 makes the result depend on the restored torch RNG state
    model_config = tiny_model(task, attention=attention, dropout=0.1)
    config = tiny_train(amp=amp)
    straight = train(tiny_workload(), config, model_config, tmp_path / "straight", progress=False)
    first = train(tiny_workload(), config, model_config, tmp_path / "resumed", stop_at_step=5,
                  progress=False)
    assert first["step"] == 5 and load_checkpoint(tmp_path / "resumed" / CHECKPOINT_NAME)["step"] == 5
    resumed = resume_run(tmp_path / "resumed", progress=False)  # fresh objects, from the checkpoint
    assert straight["step"] == resumed["step"] == 12
    a = load_checkpoint(tmp_path / "straight" / CHECKPOINT_NAME)
    b = load_checkpoint(tmp_path / "resumed" / CHECKPOINT_NAME)
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for key, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][key][name]))
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 12
    assert straight["loss"] == resumed["loss"]
    log_a, log_b = _read_csv(tmp_path / "straight" / "log.csv"), _read_csv(tmp_path / "resumed" / "log.csv")
    assert [r["step"] for r in log_a] == [r["step"] for r in log_b]
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b]
    # step 5's gradient norm was in the checkpoint's window: the resumed run logs the same mean at step 6
    assert [r["grad_norm"] for r in log_a] == [r["grad_norm"] for r in log_b]


def test_bf16_true_trains_weights_and_adamw_states_in_bf16(tmp_path):
    from asentmax.eval import EvalConfig, evaluate_run

    task = get_task("copy")
    config = tiny_train(steps=100, batch_size=16, warmup_steps=10, log_every=10, checkpoint_every=0,
                        amp="bf16-true")
    model_config = tiny_model(task, d_model=48, n_heads=4, attention="asentmax")
    train(tiny_workload(), config, model_config, tmp_path / "true", progress=False)
    checkpoint = load_checkpoint(tmp_path / "true" / CHECKPOINT_NAME)
    assert {value.dtype for value in checkpoint["model"].values()} == {torch.bfloat16}
    states = [value for state in checkpoint["optimizer"]["state"].values()
              for key, value in state.items() if key != "step"]
    assert states and {value.dtype for value in states} == {torch.bfloat16}
    losses = [float(r["loss"]) for r in _read_csv(tmp_path / "true" / "log.csv")]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.9 * losses[0]
    # one step at a negligible lr: the weights are the fp32 run's draw, rounded once to bf16
    for name, amp in (("fp32", "off"), ("bf16", "bf16-true")):
        train(tiny_workload(), tiny_train(steps=1, amp=amp, lr=1e-12, warmup_steps=0), model_config,
              tmp_path / name, progress=False)
    fp32 = load_checkpoint(tmp_path / "fp32" / CHECKPOINT_NAME)["model"]
    bf16 = load_checkpoint(tmp_path / "bf16" / CHECKPOINT_NAME)["model"]
    for name in fp32:
        assert torch.all((bf16[name].float() - fp32[name]).abs() <= 2**-8 * fp32[name].abs() + 1e-11), name
    result = evaluate_run(tmp_path / "true", EvalConfig(multipliers=(1,), samples=4, device="cpu"),
                          log=lambda _: None)
    assert result["rows"][0]["n"] == 4  # evaluation reads the bf16 weights


def test_progress_bar_names_the_task(tmp_path, capsys):
    task = get_task("reverse")
    train(tiny_workload(task="reverse"), tiny_train(steps=2), tiny_model(task), tmp_path / "run",
          progress=True)
    assert "train reverse" in capsys.readouterr().err


def test_checkpoint_holds_configs_states_and_provenance(tmp_path):
    task = get_task("copy")
    train(tiny_workload(), tiny_train(steps=4), tiny_model(task), tmp_path / "run", progress=False)
    checkpoint = load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    for key in ("train_config", "workload", "model_config", "model", "optimizer", "scheduler", "rank_states",
                "step", "git_commit", "device"):
        assert key in checkpoint, key
    assert set(checkpoint["rank_states"][0]["rng"]) >= {"torch", "numpy", "python"}
    assert checkpoint["model_config"] == {**tiny_model(task).to_dict()}
    assert checkpoint["train_config"]["steps"] == 4 and checkpoint["step"] == 4
    assert TaskWorkload.from_dict(checkpoint["workload"]) == tiny_workload()
    assert not [p for p in os.listdir(tmp_path / "run") if ".tmp" in p]  # atomic write left no temp file


def test_data_seed_seeds_the_batches_and_validation_and_seed_the_init(tmp_path, monkeypatch):
    """--data-seed D with --seed S: the weights start as seed S's, the batches and validation sets are seed
    D's; without it both follow --seed (runs saved before the flag read as -1)."""
    consumed = defaultdict(lambda: {"batches": [], "val_seeds": []})  # per run
    original_batches, original_validate = TaskWorkload.batches, TaskWorkload.validate

    def recorded_batches(self, **kwargs):
        for batch in original_batches(self, **kwargs):
            consumed[run]["batches"].append(batch)
            yield batch

    def recorded_validate(self, model, **kwargs):
        consumed[run]["val_seeds"].append(kwargs["seed"])
        return original_validate(self, model, **kwargs)

    monkeypatch.setattr(TaskWorkload, "batches", recorded_batches)
    monkeypatch.setattr(TaskWorkload, "validate", recorded_validate)
    task = get_task("copy")
    seeds = {"seed1": dict(seed=1), "seed1_data2": dict(seed=1, data_seed=2), "seed2": dict(seed=2)}
    weights = {}
    for run, flags in seeds.items():  # a negligible lr: the weights stay the init's
        train(tiny_workload(), tiny_train(steps=3, lr=1e-12, warmup_steps=0, val_every=3, **flags),
              tiny_model(task), tmp_path / run, progress=False)
        weights[run] = load_checkpoint(tmp_path / run / CHECKPOINT_NAME)["model"]
    for name, value in weights["seed1"].items():
        assert torch.allclose(weights["seed1_data2"][name], value, rtol=0, atol=1e-9), name
    assert any(not torch.allclose(weights["seed2"][name], value, rtol=0, atol=1e-3)
               for name, value in weights["seed1"].items())

    def same_batches(a, b):
        return all(torch.equal(x.input_ids, y.input_ids) and torch.equal(x.labels, y.labels)
                   for x, y in zip(consumed[a]["batches"], consumed[b]["batches"], strict=True))

    assert same_batches("seed1_data2", "seed2") and not same_batches("seed1", "seed2")
    assert [consumed[run]["val_seeds"] for run in seeds] == [[1], [2], [2]]
    saved = load_checkpoint(tmp_path / "seed1_data2" / CHECKPOINT_NAME)["train_config"]
    assert (saved["seed"], saved["data_seed"]) == (1, 2)
    old = {name: value for name, value in saved.items() if name != "data_seed"}
    assert TrainConfig.from_dict(old).batch_seed() == 1
    with pytest.raises(ValueError, match="data-seed must be >= 0"):
        tiny_train(data_seed=-2).validate()


@pytest.mark.parametrize("change", [-1, 1])
def test_mismatched_vocab_is_refused(tmp_path, change):
    """A model vocabulary smaller or larger than the task's: evaluation would refuse the run, so training
    does too."""
    vocab_size = get_task(tiny_workload().task).vocab_size + change
    with pytest.raises(ValueError, match="vocab_size"):
        train(tiny_workload(), tiny_train(),
              ModelConfig(vocab_size=vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=16),
              tmp_path / "run", progress=False)


# ---- DDP ----

def _ddp_worker(rank, world_size, init_file, examples_per_rank, state, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    task = get_task("copy")
    model = Transformer(tiny_model(task, attention="asentmax"))
    model.load_state_dict(state)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    batch = collate(task, examples_per_rank[rank])
    loss, _, _, _ = target_loss(ddp, batch, Distributed(rank, world_size), None)
    loss.backward()
    if rank == 0:
        torch.save({name: p.grad for name, p in model.named_parameters()}, f"{out_dir}/grads.pt")
    del ddp  # its reducer holds the process group: freed after destroy_process_group it can hang gloo
    # the whole training loop on the same group: collectives for loss, logging, validation, checkpoints
    train(tiny_workload(), tiny_train(steps=4, batch_size=6, val_every=2, checkpoint_every=2),
          tiny_model(task), f"{out_dir}/run", progress=False)
    dist.destroy_process_group()


def test_ddp_gradients_match_single_process(tmp_path):
    task = get_task("copy")
    rng = np.random.default_rng(11)
    # different lengths and counts of target tokens per rank: the loss normalisation must be global
    shards = [[task.sample(n, rng) for n in (3, 9, 5)], [task.sample(n, rng) for n in (12, 2, 7)]]
    torch.manual_seed(0)
    model = Transformer(tiny_model(task, attention="asentmax"))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    workers = mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "init"), shards, state, str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    join_workers(workers)
    ddp_grads = torch.load(tmp_path / "grads.pt")

    loss, loss_sum, n, _ = target_loss(model, collate(task, shards[0] + shards[1]), Distributed(), None)
    loss.backward()
    assert int(n) == sum(len(e.target) + 1 for shard in shards for e in shard)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ddp_grads[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)

    checkpoint = load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    assert checkpoint["step"] == 4 and checkpoint["world_size"] == 2 and len(checkpoint["rank_states"]) == 2
    assert [int(r["step"]) for r in _read_csv(tmp_path / "run" / "log.csv")] == [2, 4]
    assert [int(r["step"]) for r in _read_csv(tmp_path / "run" / "val.csv")] == [2, 2, 4, 4]


def _interrupted_ddp_worker(rank, init_file, out_dir):
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    summary = train(tiny_workload(), tiny_train(steps=100000, log_every=3, checkpoint_every=0),
                    tiny_model(get_task("copy")), f"{out_dir}/run", progress=False)
    with open(f"{out_dir}/summary{rank}.json", "w") as f:
        json.dump({key: summary[key] for key in ("step", "interrupted", "checkpoint_step")}, f)
    dist.destroy_process_group()


def test_a_signal_to_one_ddp_rank_stops_every_rank_at_the_same_step(tmp_path):
    import json
    import signal
    import time

    workers = mp.start_processes(_interrupted_ddp_worker, args=(str(tmp_path / "init"), str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    log = tmp_path / "run" / "log.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (log.is_file() and len(log.read_text().splitlines()) > 3):
        time.sleep(0.2)
    os.kill(workers.processes[1].pid, signal.SIGINT)  # rank 1 only, as a kill of one process would
    join_workers(workers)
    summaries = [json.loads((tmp_path / f"summary{rank}.json").read_text()) for rank in (0, 1)]
    assert summaries[1]["interrupted"] == "SIGINT"
    assert summaries[0]["interrupted"] == "a signal on another rank"
    step = summaries[0]["step"]
    assert summaries[1]["step"] == step and summaries[0]["checkpoint_step"] == step
    assert step % 3 == 0  # the ranks learn of the signal at a log step (every 3 steps)
    saved = load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    assert saved["step"] == step and saved["world_size"] == 2 and len(saved["rank_states"]) == 2
    assert int(_read_csv(log)[-1]["step"]) == step


def _stall_val_ddp_worker(rank, init_file, out_dir):
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    # no exact match reaches 1.5: the first validation from step 3 (step 4) stops the run, by rank 0's score
    summary = train(tiny_workload(keep_best_at=2),
                    tiny_train(val_every=2, stall_val_step=(3,), stall_val_score=(1.5,), checkpoint_every=0),
                    tiny_model(get_task("copy")), f"{out_dir}/run", progress=False)
    with open(f"{out_dir}/summary{rank}.json", "w") as f:
        json.dump({key: summary[key] for key in ("step", "stalled", "checkpoint_step")}, f)
    dist.destroy_process_group()


def test_the_validation_stall_check_stops_every_ddp_rank_at_the_same_step(tmp_path):
    """Only rank 0 validates; the other rank stops at the same step by its broadcast answer (a rank that
    went on would hang the next collective, and join_workers would time out)."""
    import json

    workers = mp.start_processes(_stall_val_ddp_worker, args=(str(tmp_path / "init"), str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    join_workers(workers)
    summaries = [json.loads((tmp_path / f"summary{rank}.json").read_text()) for rank in (0, 1)]
    assert [s["step"] for s in summaries] == [4, 4] and summaries[0]["checkpoint_step"] == 4
    assert summaries[0]["stalled"] == summaries[1]["stalled"]
    assert summaries[0]["stalled"]["stall_val_step"] == 3 and summaries[0]["stalled"]["score"] < 1.5
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)["step"] == 4


def test_non_finite_loss_stops_training(tmp_path):
    task = get_task("copy")
    # a learning rate of 1e30 turns the weights into inf/NaN within a few updates, before any checkpoint
    with pytest.raises(NonFiniteLoss, match=r"loss at step \d+; no checkpoint was written"):
        train(tiny_workload(), tiny_train(lr=1e30, checkpoint_every=0), tiny_model(task), tmp_path / "run",
              progress=False)
    assert not (tmp_path / "run" / CHECKPOINT_NAME).exists()


class BrokenAtStep(TaskWorkload):
    """The copy workload whose batch of 0-based step `broken` has no labelled token (a 0/0 loss)."""

    broken = 6

    def batches(self, *, start_step, **kwargs):
        for step, batch in enumerate(super().batches(start_step=start_step, **kwargs), start_step):
            if step == self.broken:
                batch.labels.fill_(IGNORE_INDEX)
            yield batch


def test_non_finite_loss_names_its_step_and_the_checkpoint_that_exists(tmp_path):
    task = get_task("copy")
    workload = BrokenAtStep.from_dict(tiny_workload().to_dict())
    with pytest.raises(NonFiniteLoss) as error:  # logs every 5 steps: found at step 10, happened at step 7
        train(workload, tiny_train(log_every=5, checkpoint_every=4), tiny_model(task), tmp_path / "run",
              progress=False)
    path = tmp_path / "run" / CHECKPOINT_NAME
    assert str(error.value) == (f"non-finite training loss at step 7; {path} holds step 4 (written before "
                                "the loss broke); resume from it with a lower lr, or start again")
    saved = load_checkpoint(path)
    assert saved["step"] == 4 and all(torch.isfinite(v).all() for v in saved["model"].values())


def test_rng_state_from_a_host_with_more_gpus(monkeypatch):
    """A checkpoint written with 2 GPUs' RNG states restores on a host with 1 GPU (only the visible one)."""
    from asentmax.runs import rng_state, set_rng_state

    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.zeros(16, dtype=torch.uint8)] * 2)

    def set_all(states):
        if len(states) > torch.cuda.device_count():
            raise RuntimeError("more states than devices")  # what CUDA does: no device 1 to seed
        restored.extend(states)

    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    set_rng_state(rng_state())
    assert len(restored) == 1


def test_git_commit_is_read_from_the_environment_when_set(monkeypatch):
    """A tree copied to another machine keeps stale git metadata; ASENTMAX_GIT_COMMIT names the tree."""
    from asentmax.runs import git_commit

    monkeypatch.delenv("ASENTMAX_GIT_COMMIT", raising=False)
    from_git = git_commit()
    monkeypatch.setenv("ASENTMAX_GIT_COMMIT", "0123abc")
    assert git_commit() == "0123abc" != from_git


@pytest.mark.parametrize("grad_clip", [1e-3, 0.0])
def test_log_grad_norm_is_the_mean_pre_clip_norm_of_the_window(tmp_path, grad_clip):
    """log.csv's grad_norm: at step 1 the total 2-norm of the first batch's gradient at the initial weights
    (computed here from the trainer's own init and batches), before clipping (clipped at 1e-3 it would read
    1e-3) and also without clipping; with --log-every 3 each line the mean of the per-step norms (the last,
    partial window over its one step), the same trajectory as --log-every 1."""
    task = get_task("copy")
    model_config = tiny_model(task, dropout=0.0)
    every_step = train(tiny_workload(), tiny_train(steps=4, log_every=1, grad_clip=grad_clip), model_config,
                       tmp_path / "every", progress=False)
    windowed = train(tiny_workload(), tiny_train(steps=4, log_every=3, grad_clip=grad_clip), model_config,
                     tmp_path / "windowed", progress=False)
    assert every_step["step"] == windowed["step"] == 4
    norms = [float(r["grad_norm"]) for r in _read_csv(tmp_path / "every" / "log.csv")]
    assert [float(r["grad_norm"]) for r in _read_csv(tmp_path / "windowed" / "log.csv")] == pytest.approx(
        [sum(norms[:3]) / 3, norms[3]], rel=1e-4)  # the logged values have 5 significant digits

    config = tiny_train(steps=4, log_every=1, grad_clip=grad_clip)
    model = initial_model(model_config, config.seed)
    batch = next(tiny_workload().batches(seed=config.batch_seed(), start_step=0, rank=0, world_size=1,
                                         local_batch_size=config.batch_size, device=torch.device("cpu")))
    loss, _, _, _ = target_loss(model, batch, Distributed(), None)
    loss.backward()
    expected = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    assert expected > 10 * max(grad_clip, 1e-3)  # so a clipped norm could not pass for it
    assert norms[0] == pytest.approx(float(expected), rel=1e-4)


def test_restored_window_takes_rank_0s_grad_norm_and_marks_old_checkpoints_unknown():
    """Saved by two ranks, resumed by one (rank 0 sums the loss of both) or two (each its own loss); the
    gradient-norm sum is rank 0's either way; a checkpoint from before it was kept gives NaN (unknown)."""
    states = [{"window": {"loss": 1.5, "targets": 40, "grad_norm": 6.0}},
              {"window": {"loss": 2.5, "targets": 40, "grad_norm": 6.0}}]
    assert restored_window(states, Distributed(rank=0, world_size=1)) == (4.0, 40, 6.0)
    assert restored_window(states, Distributed(rank=1, world_size=2)) == (2.5, 40, 6.0)
    old = [{"window": {"loss": 1.5, "targets": 40}}]
    loss, targets, grad_norm = restored_window(old, Distributed())
    assert (loss, targets) == (1.5, 40) and math.isnan(grad_norm)


def test_log_csv_keeps_a_tiny_loss_to_seven_significant_digits(tmp_path, monkeypatch):
    """A run near zero loss (Copy's, late in the cosine) must log its loss, not 0: every loss below 5e-7 was
    written as 0.000000 before the sixty-second session. Here the cross-entropy is scaled by 1e-9 (the
    gradient with it), so the logged losses are about 3e-9; each must be the trainer's own to 7 digits."""
    real = torch.nn.functional.cross_entropy
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda *args, **kw: real(*args, **kw) * 1e-9)
    task = get_task("copy")
    summary = train(tiny_workload(), tiny_train(steps=4, checkpoint_every=0), tiny_model(task),
                    tmp_path / "run", progress=False)
    with open(tmp_path / "run" / "log.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    assert len(losses) == 2 and all(1e-10 < loss < 1e-8 for loss in losses), losses
    assert losses[-1] == pytest.approx(summary["loss"], rel=1e-6)
