"""Issue 6 (data-parallel training): a checkpoint written by 2 DDP processes (gloo) resumes in 1 process
with an exact first log window and exact global token counts; the scaling report of
benchmarks/bench_ddp_scaling.py computed from fake logs."""

import csv
import math

import pytest
import torch
import torch.multiprocessing as mp

from asentmax.data import length_buckets, training_batch
from asentmax.nn import ModelConfig, Transformer
from asentmax.runs import CHECKPOINT_NAME, load_checkpoint
from asentmax.tasks import get_task
from asentmax.tasks.workload import TaskWorkload
from asentmax.train import resume_run
from asentmax.trainer import Distributed, TrainConfig, target_loss, train
from conftest import join_workers, load_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")

def tiny_config() -> TrainConfig:
    return TrainConfig(steps=6, batch_size=8, lr=3e-3, warmup_steps=2, val_every=0, log_every=2,
                       checkpoint_every=0, seed=3, device="cpu")


def tiny_workload() -> TaskWorkload:
    return TaskWorkload(task="copy", min_length=3, max_length=6, val_multipliers=(1,), val_samples=4)


def tiny_model() -> ModelConfig:
    return ModelConfig(vocab_size=get_task("copy").vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                       attention="asentmax", position="nape")


def _two_process_worker(rank, init_file, run_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    # step 3: mid log window
    train(tiny_workload(), tiny_config(), tiny_model(), run_dir, stop_at_step=3, progress=False)
    dist.destroy_process_group()


def _read_log(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_two_process_checkpoint_resumes_in_one_process(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    workers = mp.start_processes(_two_process_worker, args=(str(tmp_path / "init"), str(run_dir)), nprocs=2,
                                 join=False, start_method="spawn")
    join_workers(workers)
    saved = load_checkpoint(run_dir / CHECKPOINT_NAME)
    assert saved["step"] == 3 and saved["world_size"] == 2 and len(saved["rank_states"]) == 2
    # the window's gradient norms are taken after the all-reduce: both ranks saved the same sum
    norms = [state["window"]["grad_norm"] for state in saved["rank_states"]]
    assert norms[0] == norms[1] > 0

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    summary = resume_run(run_dir, progress=False)
    assert summary["step"] == 6
    resumed = load_checkpoint(run_dir / CHECKPOINT_NAME)
    assert resumed["step"] == 6 and resumed["world_size"] == 1 and len(resumed["rank_states"]) == 1
    assert resumed["scheduler"]["last_epoch"] == 6

    # independent count: the batches each (rank, step) draws, 4 per rank on 2 ranks, 8 on 1 rank
    task, config, workload = get_task("copy"), tiny_config(), tiny_workload()
    buckets = length_buckets(workload.min_length, workload.max_length, workload.length_buckets)
    batch = lambda rank, step, size: training_batch(task, seed=config.seed, rank=rank, step=step,
                                                    batch_size=size, buckets=buckets)
    log = _read_log(run_dir / "log.csv")
    assert [int(r["step"]) for r in log] == [2, 4, 6]
    assert int(log[0]["tokens"]) == sum(batch(r, s, 4).n_tokens for r in (0, 1) for s in (0, 1))
    assert int(log[1]["tokens"]) == batch(0, 3, 8).n_tokens  # step 3 ran in the 2-process run
    assert int(log[2]["tokens"]) == batch(0, 4, 8).n_tokens + batch(0, 5, 8).n_tokens

    # the window logged at step 4 spans the resume: both saved ranks' step-3 losses + the 1-process step 4
    model = Transformer(tiny_model())
    model.load_state_dict(saved["model"])
    with torch.no_grad():
        _, loss_sum, n_targets, _ = target_loss(model, batch(0, 3, 8), Distributed(), None)
    windows = [state["window"] for state in saved["rank_states"]]
    assert windows[0]["targets"] == windows[1]["targets"] > 0
    expected = (sum(w["loss"] for w in windows) + float(loss_sum)) / (windows[0]["targets"] + int(n_targets))
    assert float(log[1]["loss"]) == pytest.approx(expected, rel=1e-5)
    assert math.isfinite(float(log[2]["loss"]))


# ---- the report of benchmarks/bench_ddp_scaling.py ----

@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_ddp_scaling")


def fake_log(window_tokens, window_seconds, losses, first_step=0, every=10):
    rows, elapsed = [], 0.0
    for i, (tokens, seconds, loss) in enumerate(zip(window_tokens, window_seconds, losses, strict=True)):
        elapsed += seconds
        rows.append({"step": first_step + every * (i + 1), "loss": loss, "tokens": tokens,
                     "elapsed_s": elapsed})
    return rows


def test_scaling_report_from_fake_logs(bench, tmp_path):
    n = 10  # windows of 10 steps up to step 100; the first (step 10) holds the compilation
    one = fake_log([1000 + 7 * i for i in range(n)], [5.0] + [0.5 + 0.01 * i for i in range(1, n)],
                   [5.0 - 0.1 * i for i in range(n)])
    two = fake_log([1010 + 3 * i for i in range(n)], [9.0] + [0.3] * (n - 1),
                   [5.0 - 0.11 * i for i in range(n)])
    after = fake_log([2000, 2100, 2200], [4.0, 1.0, 1.25], [3.95, 3.9, 3.8], first_step=100)
    summary = bench.summarise(one, two, two + after, steps=100)

    rate_one = sum(1000 + 7 * i for i in range(1, n)) / sum(0.5 + 0.01 * i for i in range(1, n))
    rate_two = sum(1010 + 3 * i for i in range(1, n)) / (0.3 * (n - 1))
    assert summary["one_gpu"]["tokens_per_s"] == pytest.approx(rate_one)
    assert summary["two_gpus"]["tokens_per_s"] == pytest.approx(rate_two)
    assert summary["two_gpus"]["steps_per_s"] == pytest.approx(90 / (0.3 * 9))
    assert summary["scaling_efficiency"] == pytest.approx(rate_two / (2 * rate_one))
    assert summary["one_gpu"]["final_loss"] == pytest.approx(4.1)
    assert summary["two_gpus"]["final_loss"] == pytest.approx(4.01)
    resumed = summary["resumed"]
    assert (resumed["first_step"], resumed["final_step"], resumed["from_step"]) == (110, 130, 110)
    assert resumed["tokens_per_s"] == pytest.approx((2100 + 2200) / 2.25)
    assert resumed["continues"]  # 3.95 <= 1.1 * 4.01

    jumped = fake_log([2000, 2100], [4.0, 1.0], [4.5, 4.4], first_step=100)  # 4.5 > 1.1 * 4.01: a restart
    assert not bench.summarise(one, two, two + jumped, steps=100)["resumed"]["continues"]
    with pytest.raises(ValueError, match="logged steps"):
        bench.steady_throughput(one, 10, 105)

    setup = {"label": "fake", "n_parameters": 123, "attention_backend": "auto = triton", "batch_size": 128,
             "git_commit": "abc", "device": "cuda:fake",
             "wall_s": {"one_gpu": 60.0, "two_gpus": 50.0, "resumed": 20.0},
             "driver_command": "python benchmarks/bench_ddp_scaling.py", "commands": ["torchrun ..."],
             "versions": {"torch": "x"}}
    text = bench.markdown(summary, setup)
    efficiency = rate_two / (2 * rate_one)
    assert f"| 2 | 10-100 | {rate_two:,.0f} | {90 / 2.7:.2f} | {efficiency:.3f} | 4.0100" in text
    bench.plot_losses(one, two, two + after, 100, tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_log_interval_divides_the_steps(bench):
    for steps in (2, 3, 40, 130, 400, 997):
        every = bench.log_every(steps)
        assert steps % every == 0 and 1 <= every <= max(1, steps // 40)
