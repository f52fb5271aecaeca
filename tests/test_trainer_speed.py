"""The trainer's speed settings (asentmax.trainer, issue 14 item 2): one compiled graph for every length
bucket, the large-batch learning-rate rule, compile/fused settings; on CUDA, training steps between
log steps never wait for the device."""

import csv
import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from asentmax.nn import ModelConfig, Transformer
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import TrainConfig, compiled_for_training, train

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_compiled_graph_serves_every_bucket_width():
    """Plain torch.compile compiles twice for four widths (static, then automatic dynamic); marking the
    sequence dimension dynamic up front compiles once, and the outputs equal the eager model's."""
    counter = CompileCounter()
    torch._dynamo.reset()
    model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                                    attention="softmax", position="nape"))
    forward = compiled_for_training(model, backend=counter)
    for width in (9, 13, 17, 21):
        ids = torch.randint(0, 40, (2, width))
        torch.testing.assert_close(forward(ids), model(ids))
    assert counter.frame_count == 1


def test_sqrt_lr_scaling_reaches_the_optimizer(tmp_path):
    config = TrainConfig(steps=1, batch_size=32, lr=2e-3, lr_scaling="sqrt", warmup_steps=0, val_every=0,
                         log_every=1, checkpoint_every=0, device="cpu")
    assert config.peak_lr() == pytest.approx(2e-3 * math.sqrt(32 / 128))
    assert TrainConfig(batch_size=512, lr=2e-4, lr_scaling="sqrt").peak_lr() == pytest.approx(4e-4)
    assert TrainConfig(batch_size=512, lr=2e-4).peak_lr() == 2e-4  # "none" is the default
    workload = TaskWorkload(task="copy", min_length=3, max_length=6, val_multipliers=(1,), val_samples=2)
    model = workload.model_config(dict(d_model=16, n_layers=1, n_heads=2, d_ff=32))
    train(workload, config, model, tmp_path / "run", progress=False)
    with open(tmp_path / "run" / "log.csv", newline="") as f:
        logged_lr = float(next(csv.DictReader(f))["lr"])  # warm-up 0: step 1 runs at the peak
    assert logged_lr == pytest.approx(config.peak_lr(), rel=1e-3)


def test_compile_and_fused_settings():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    config = TrainConfig()
    assert config.uses("compile", cuda) and not config.uses("compile", cpu)
    assert config.uses("fused", cuda) and not config.uses("fused", cpu)
    assert TrainConfig(compile="on").uses("compile", cpu) and not TrainConfig(fused="off").uses("fused", cuda)
    saved_as_booleans = TrainConfig.from_dict({"compile": True, "fused": False})
    assert (saved_as_booleans.compile, saved_as_booleans.fused) == ("on", "off")
    for bad in (dict(compile="yes"), dict(fused=True), dict(lr_scaling="linear")):
        with pytest.raises(ValueError, match="compile|fused|lr-scaling"):
            TrainConfig(**bad).validate()


class SyncCheckedWorkload(TaskWorkload):
    """Runs the steps after the first (compilation) and before the last (log, validation, checkpoint)
    with CUDA's sync debug mode on "error": any host-device synchronisation there raises."""

    def batches(self, **kwargs):
        inner = super().batches(**kwargs)
        yield next(inner)
        for _ in range(self.checked_steps):
            torch.cuda.set_sync_debug_mode("error")
            yield next(inner)
        torch.cuda.set_sync_debug_mode("default")
        yield from inner


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_steps_never_wait_for_the_device(tmp_path):
    workload = SyncCheckedWorkload(task="mqmtar", val_multipliers=(1,), val_samples=8)
    workload.checked_steps = 6
    config = TrainConfig(steps=8, batch_size=64, log_every=100, val_every=0, checkpoint_every=0)
    try:
        train(workload, config, workload.model_config(dict(attention="softmax")), tmp_path / "run",
              progress=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
