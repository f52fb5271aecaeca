"""--cuda-graphs (asentmax.trainer, issue 14) on the CPU: its values and how it resolves, the one-line
refusals of a setting that cannot run (the CPU, --compile off, torchrun, a normaliser the trainer keeps
eager, attention on a backend that reads the device, a resumed run whose saved setting cannot run here),
and the CPU path unchanged (auto compiles without CUDA graphs and trains as off does). The GPU side is
tests/test_cuda_graphs_gpu.py."""

import csv

import pytest
import torch

import asentmax.ops.attention as dispatcher
import asentmax.trainer as trainer
from asentmax.cli import main
from asentmax.nn import ModelConfig, Transformer
from asentmax.nn.attention import cuda_graph_refusal
from asentmax.runs import load_checkpoint, save_checkpoint
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import Distributed, TrainConfig, check_cuda_graphs, train, uses_cuda_graphs

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--task", "copy", "--min-length", "3", "--max-length", "6", "--steps", "4", "--batch-size", "4",
        "--warmup-steps", "1", "--val-every", "0", "--val-samples", "2", "--log-every", "2",
        "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]
MODEL = dict(vocab_size=40, d_model=32, n_layers=1, n_heads=2, d_ff=64)


@pytest.fixture
def triton_runs(monkeypatch):
    """As on a CUDA machine: the dispatcher finds the Triton kernels available."""
    monkeypatch.setattr(dispatcher, "_triton_available", lambda: True)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("asentmax train: error:") and err.count("\n") == 1, err
    return err


def test_auto_by_default_and_off_for_runs_saved_before_the_setting():
    assert TrainConfig().cuda_graphs == "auto"
    assert TrainConfig.from_dict({"steps": 3, "compile": True}).cuda_graphs == "off"


@pytest.mark.parametrize("settings,message", [
    (dict(cuda_graphs="yes"), "cuda-graphs must be auto, on or off"),
    (dict(cuda_graphs=True), "cuda-graphs must be auto, on or off"),
    (dict(cuda_graphs="on", compile="off"), "--compile is off"),
    (dict(cuda_graphs="on", device="cpu"), "needs a CUDA GPU"),
    (dict(cuda_graphs="on", device="auto"), "needs a CUDA GPU"),  # on a machine without CUDA
])
def test_settings_that_cannot_run_are_refused(settings, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=message) as error:
        TrainConfig(**settings).validate()
    assert "\n" not in str(error.value)


def test_auto_and_off_never_refuse():
    for settings in (dict(cuda_graphs="auto", device="cpu"), dict(cuda_graphs="auto", compile="off"),
                     dict(cuda_graphs="off", device="cpu")):
        TrainConfig(**settings).validate()
        check_cuda_graphs(TrainConfig(**settings), ModelConfig(attention="ssmax", **MODEL), world_size=2)


def test_on_needs_one_process(triton_runs):
    on = TrainConfig(cuda_graphs="on")
    with pytest.raises(ValueError, match="one process, got 2"):
        check_cuda_graphs(on, ModelConfig(attention="asentmax", **MODEL), world_size=2)
    for name in ("softmax", "ssmax", "topk", "entmax", "asentmax"):
        check_cuda_graphs(on, ModelConfig(attention=name, **MODEL), world_size=1)


@pytest.mark.parametrize("settings,backend", [
    (dict(attention="entmax", alpha=2.5), "chunked"),  # outside the fused kernels' alpha range
    (dict(attention="asentmax", d_model=1024, n_heads=2), "chunked"),  # head_dim 512
    (dict(attention="asentmax", attention_backend="chunked"), "chunked"),
    (dict(attention="entmax", attention_backend="reference"), "reference"),
    (dict(attention="softmax", attention_backend="chunked"), "chunked"),  # its fallback beside SDPA
])
def test_attention_on_a_backend_that_reads_the_device_is_refused(triton_runs, settings, backend):
    config = ModelConfig(**{**MODEL, **settings})
    refusal = cuda_graph_refusal(config)
    assert refusal is not None and f"runs on the {backend} backend" in refusal
    with pytest.raises(ValueError, match=f"--cuda-graphs on: .* {backend} backend") as error:
        check_cuda_graphs(TrainConfig(cuda_graphs="on"), config, world_size=1)
    assert "\n" not in str(error.value)
    cuda = Distributed(device=torch.device("cuda"))
    assert not uses_cuda_graphs(TrainConfig(cuda_graphs="auto"), config, cuda)


def test_sdpa_topk_and_the_fused_kernels_can_be_captured(triton_runs):
    for settings in (dict(attention="softmax"), dict(attention="ssmax"), dict(attention="entmax", alpha=2.0),
                     dict(attention="asentmax", attention_backend="triton"),
                     dict(attention="topk", attention_backend="chunked")):
        assert cuda_graph_refusal(ModelConfig(**{**MODEL, **settings})) is None, settings


def test_auto_means_one_cuda_process(triton_runs):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    auto, on = TrainConfig(cuda_graphs="auto"), TrainConfig(cuda_graphs="on")
    model = ModelConfig(attention="asentmax", **MODEL)
    assert uses_cuda_graphs(auto, model, Distributed(device=cuda))
    assert not uses_cuda_graphs(auto, model, Distributed(device=cpu))
    assert not uses_cuda_graphs(auto, model, Distributed(rank=1, world_size=2, device=cuda))
    assert uses_cuda_graphs(TrainConfig(), model, Distributed(device=cuda))  # auto is the default
    assert not uses_cuda_graphs(TrainConfig(cuda_graphs="off"), model, Distributed(device=cuda))
    assert uses_cuda_graphs(on, model, Distributed(device=cuda))


@pytest.mark.parametrize("extra,message", [
    (["--cuda-graphs", "on", "--device", "cpu"], "needs a CUDA GPU"),
    (["--cuda-graphs", "on", "--compile", "off"], "--compile is off"),
    (["--cuda-graphs", "sometimes"], "cuda-graphs must be auto, on or off"),
])
def test_the_cli_refuses_in_one_line_before_writing(tmp_path, capsys, extra, message):
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, *extra]) == 2
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("extra,world_size,message", [
    (["--cuda-graphs", "on"], "2", "one process, got 2"),
    (["--cuda-graphs", "on", "--attention", "entmax", "--attention-backend", "chunked"], "1",
     "runs on the chunked backend"),
])
def test_the_cli_refuses_what_cuda_graphs_cannot_run_on_a_gpu(tmp_path, capsys, monkeypatch, triton_runs,
                                                              extra, world_size, message):
    """torchrun, attention that reads the device: as on a GPU machine
    (is_available patched), refused before any process group or file."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, *extra]) == 2
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "new").exists()


def test_resuming_a_graphed_run_where_it_cannot_run_is_one_line(tmp_path, capsys, monkeypatch):
    """A run saved with --cuda-graphs on (made on a GPU; here its checkpoint is edited) resumed on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY]) == 0
    checkpoint = load_checkpoint(run / "checkpoint.pt")
    checkpoint["train_config"]["cuda_graphs"] = "on"
    save_checkpoint(run / "checkpoint.pt", checkpoint)
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "--steps", "6"]) == 2
    err = _one_line_error(capsys)
    assert "needs a CUDA GPU" in err and "saved configuration" in err


def test_the_cpu_path_compiles_without_cuda_graphs_and_trains_as_off(tmp_path, monkeypatch):
    """compile on with cuda-graphs auto on the CPU: compiled_for_training gets no mode (the default
    compile, as before the setting existed), and the run logs what cuda-graphs off logs."""
    modes = []

    def recording(model, backend="inductor", mode=None):
        modes.append(mode)
        return model

    monkeypatch.setattr(trainer, "compiled_for_training", recording)
    workload = TaskWorkload(task="copy", min_length=3, max_length=6, val_multipliers=(1,), val_samples=2)
    model_config = workload.model_config(dict(d_model=16, n_layers=1, n_heads=2, d_ff=32))
    losses = {}
    for setting in ("auto", "off"):
        config = TrainConfig(steps=4, batch_size=4, warmup_steps=1, val_every=0, log_every=1,
                             checkpoint_every=0, device="cpu", compile="on", cuda_graphs=setting)
        train(workload, config, model_config, tmp_path / setting, progress=False)
        with open(tmp_path / setting / "log.csv", newline="") as f:
            losses[setting] = [row["loss"] for row in csv.DictReader(f)]
    assert modes == [None, None]
    assert losses["auto"] == losses["off"] and len(losses["off"]) == 4


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_graphed_forward_starts_a_cudagraph_step_at_every_call(monkeypatch, mode):
    """compiled_for_training passes the mode to torch.compile, and under CUDA graphs marks each call as a
    new training step, so that a replay may overwrite the previous step's outputs (which the trainer no
    longer holds) instead of recording the next step as a new branch of the graph tree."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **options: calls.append(options) or model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append("step"))
    model = Transformer(ModelConfig(attention="asentmax", position="nape", **MODEL))
    forward = trainer.compiled_for_training(model, mode=mode)
    ids = torch.randint(0, 40, (2, 7))
    for _ in range(2):
        torch.testing.assert_close(forward(ids), model(ids))
    steps = ["step", "step"] if mode else []
    # the mode as Inductor options, with mm padding off (trainer.INDUCTOR_OPTIONS)
    options = {"triton.cudagraphs": True} if mode else {}
    assert calls == [{"backend": "inductor", "options": {**options, "shape_padding": False}}, *steps]


def test_another_backend_gets_the_mode_and_no_inductor_options(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **options: calls.append(options) or model)
    trainer.compiled_for_training(torch.nn.Linear(2, 2), backend="aot_eager", mode="reduce-overhead")
    assert calls == [{"backend": "aot_eager", "mode": "reduce-overhead"}]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_takes_the_inductor_options(mode):
    """torch.compile checks option names and types when it is called (the compile itself waits for the
    first forward): a name this torch does not know would raise here."""
    forward = trainer.compiled_for_training(torch.nn.Linear(2, 2), mode=mode)
    assert callable(forward)
