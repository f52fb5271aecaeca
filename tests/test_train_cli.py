"""`asentmax train` when users do what users do (issue 12): damaged or crafted checkpoints, a missing GPU,
non-finite flags, a diverging run, Ctrl-C / SIGTERM, half-made run directories, extending a finished run,
a warm-up longer than the run, and help that shows the preset's values. Every user error exits 2 with one
line on stderr and writes nothing."""

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import asentmax
from asentmax import trainer
from asentmax.cli import main
from asentmax.runs import TENSORBOARD_NAME, load_checkpoint
from asentmax.tasks import get_task

TINY = ["--task", "copy", "--min-length", "3", "--max-length", "6", "--steps", "8", "--batch-size", "4",
        "--warmup-steps", "2", "--val-every", "0", "--val-samples", "2", "--log-every", "2",
        "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("asentmax train: error:") and err.count("\n") == 1, err
    return err


def _files(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _finished_run(tmp_path, *extra) -> Path:
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY, *extra]) == 0
    return run


# ---- checkpoints a user cannot trust ----

class RunsCode:
    """Unpickling this calls exec: a checkpoint holding it would run code in a weights_only=False load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def test_a_crafted_checkpoint_runs_nothing(tmp_path, capsys):
    run = _finished_run(tmp_path)
    marker = tmp_path / "marker"
    path = run / "checkpoint.pt"
    torch.save({"model": RunsCode(marker), "step": 1}, path)
    torch.load(path, weights_only=False)  # the file is live: an unsafe load runs its code
    assert marker.read_text() == "ran"
    marker.unlink()
    before = _files(run)

    assert main(["train", "--run-dir", str(run), "--resume"]) == 2
    err = _one_line_error(capsys)
    assert str(path) in err and "not a loadable asentmax checkpoint" in err
    assert not marker.exists() and _files(run) == before


def test_a_truncated_checkpoint_is_one_line(tmp_path, capsys):
    run = _finished_run(tmp_path)
    path = run / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = _files(run)
    assert main(["train", "--run-dir", str(run), "--resume", "--steps", "12"]) == 2
    assert str(path) in _one_line_error(capsys)
    assert _files(run) == before


# ---- flags that cannot run ----

def test_device_cuda_without_a_gpu_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, "--device", "cuda"]) == 2
    assert "--device cuda" in _one_line_error(capsys)
    assert not (tmp_path / "new").exists()


def test_attention_backend_triton_on_the_cpu_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    argv = ["train", "--run-dir", str(tmp_path / "new"), *TINY, "--device", "cpu"]
    assert main([*argv, "--attention-backend", "triton"]) == 2
    assert "--attention-backend triton needs" in _one_line_error(capsys)
    assert not (tmp_path / "new").exists()
    # a run trained with the kernels (on a GPU), evaluated on the CPU: one line that names the way out
    run = _finished_run(tmp_path, "--device", "cpu")
    state = load_checkpoint(run / "checkpoint.pt")
    state["model_config"]["attention_backend"] = "triton"
    torch.save(state, run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["eval", str(run), "--device", "cpu", "--multipliers", "1", "--samples", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asentmax eval: error:") and err.count("\n") == 1, err
    assert "checkpoint.pt: attention backend triton needs" in err and "--attention-backend chunked" in err
    assert main(["eval", str(run), "--device", "cpu", "--multipliers", "1", "--samples", "2",
                 "--attention-backend", "chunked", "--no-progress"]) == 0
    assert main(["train", "--run-dir", str(run), "--resume", "--steps", "10"]) == 2
    assert "--attention-backend triton needs" in _one_line_error(capsys)


@pytest.mark.parametrize("flag,value", [("--lr", "inf"), ("--lr", "nan"), ("--min-lr-ratio", "nan"),
                                        ("--grad-clip", "inf"), ("--weight-decay", "-inf"),
                                        ("--beta2", "nan"), ("--dropout", "nan"), ("--alpha", "inf")])
def test_non_finite_numbers_are_refused_before_anything_is_written(tmp_path, capsys, flag, value):
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, f"{flag}={value}"]) == 2
    err = _one_line_error(capsys)
    assert flag in err and "finite" in err
    assert not (tmp_path / "new").exists()


def test_a_negative_data_seed_other_than_minus_one_is_refused(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, "--data-seed", "-2"]) == 2
    assert "data-seed must be >= 0 (or -1: --seed's), got -2" in _one_line_error(capsys)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("attention", ["softmax", "ssmax", "topk"])
def test_alpha_for_a_normaliser_without_one_is_refused(tmp_path, capsys, attention):
    run = tmp_path / "new"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", attention, "--alpha", "1.7"]) == 2
    assert f"--alpha has no effect with --attention {attention}" in _one_line_error(capsys)
    assert not run.exists()
    # the preset's alpha is not the user's: softmax without --alpha trains, and entmax takes --alpha
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", attention, "--steps", "1"]) == 0
    assert main(["train", "--run-dir", str(tmp_path / "entmax"), *TINY, "--attention", "entmax",
                 "--alpha", "1.7", "--steps", "1"]) == 0


@pytest.mark.parametrize("attention", ["softmax", "ssmax", "entmax", "asentmax"])
def test_topk_k_for_a_normaliser_without_one_is_refused(tmp_path, capsys, monkeypatch, attention):
    run = tmp_path / "new"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", attention, "--topk-k", "4"]) == 2
    err = _one_line_error(capsys)
    assert f"--topk-k has no effect with --attention {attention} (only topk reads it); drop --topk-k" in err
    assert not run.exists()
    # a preset's topk_k is not the user's: the run trains
    from asentmax.nn.presets import copy_model
    from asentmax.tasks.sequence import CopyTask

    monkeypatch.setattr(CopyTask, "model_preset", staticmethod(
        lambda vocab_size, **overrides: copy_model(vocab_size, **{"topk_k": 4, **overrides})))
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", attention, "--steps", "1"]) == 0
    assert load_checkpoint(run / "checkpoint.pt")["model_config"]["topk_k"] == 4


@pytest.mark.parametrize("attention, flag, value",
                         [("entmax", "--theta-delta", "0.5"), ("softmax", "--gamma-range", "1"),
                          ("asentmax", "--ssmax-form", "plain"), ("entmax", "--ssmax-s-init", "1"),
                          ("ssmax", "--asentmax-gamma-init", "1"), ("softmax", "--asentmax-beta-init", "1")])
def test_temperature_flags_for_a_normaliser_without_that_temperature_are_refused(tmp_path, capsys, attention,
                                                                                  flag, value):
    run = tmp_path / "new"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", attention, flag, value]) == 2
    assert f"{flag} has no effect with --attention {attention}" in _one_line_error(capsys)
    assert not run.exists()


def test_the_paper_code_block_flags_stay_open_to_every_method(tmp_path):
    run = tmp_path / "softmax"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", "softmax", "--asentmax-init", "normal",
                 "--steps", "1"]) == 0


def test_topk_k_is_taken_by_topk(tmp_path):
    run = tmp_path / "topk"
    assert main(["train", "--run-dir", str(run), *TINY, "--attention", "topk", "--topk-k", "3",
                 "--steps", "1"]) == 0
    assert load_checkpoint(run / "checkpoint.pt")["model_config"]["topk_k"] == 3


def test_a_diverging_run_says_which_checkpoint_exists(tmp_path, capsys):
    run = tmp_path / "new"
    assert main(["train", "--run-dir", str(run), *TINY, "--lr", "1e30", "--checkpoint-every", "0"]) == 2
    err = _one_line_error(capsys)
    assert "non-finite training loss at step" in err and "no checkpoint was written" in err
    assert not (run / "checkpoint.pt").exists()


def test_a_task_without_a_model_preset_needs_the_architecture(tmp_path, capsys):
    flags = ["--task", "flipflop", "--min-length", "3", "--max-length", "7", "--no-progress"]
    assert main(["train", "--run-dir", str(tmp_path / "new"), *flags]) == 2
    err = _one_line_error(capsys)
    assert "'flipflop' has no model preset" in err and "--d-model, --n-layers, --n-heads, --d-ff" in err
    assert not (tmp_path / "new").exists()
    architecture = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64"]
    assert main(["train", "--run-dir", str(tmp_path / "new"), *flags, *architecture, "--batch-size", "4",
                 "--stop-at-step", "2", "--val-samples", "2"]) == 0
    saved = load_checkpoint(tmp_path / "new" / "checkpoint.pt")
    assert saved["model_config"]["vocab_size"] == get_task("flipflop").vocab_size
    assert saved["model_config"]["d_model"] == 32


# ---- run directories ----

def test_a_run_dir_without_a_checkpoint_starts_again(tmp_path, capsys):
    run = _finished_run(tmp_path)
    (run / "checkpoint.pt").unlink()  # as if killed before its first checkpoint
    # tensorboard/ too where the optional package is installed (the GPU machine has it)
    with_tensorboard = importlib.util.find_spec("tensorboard") is not None
    logs = ["config.json", "log.csv", "val.csv"] + ([TENSORBOARD_NAME] if with_tensorboard else [])
    assert sorted(p.name for p in run.iterdir()) == sorted(logs)
    assert main(["train", "--run-dir", str(run), *TINY, "--steps", "4"]) == 0
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 4
    assert [int(r["step"]) for r in _read_csv(run / "log.csv")] == [2, 4]


def test_a_run_dir_with_a_checkpoint_or_other_files_is_kept(tmp_path, capsys):
    run = _finished_run(tmp_path)
    before = _files(run)
    assert main(["train", "--run-dir", str(run), *TINY]) == 2
    assert "holds a checkpoint" in _one_line_error(capsys)
    (run / "checkpoint.pt").unlink()
    (run / "notes.txt").write_text("mine")
    assert main(["train", "--run-dir", str(run), *TINY]) == 2
    _one_line_error(capsys)
    assert (run / "notes.txt").read_text() == "mine"
    assert (run / "config.json").read_bytes() == before["config.json"]


def test_a_run_dir_below_a_file_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    assert main(["train", "--run-dir", str(blocker / "run"), *TINY]) == 2
    assert str(blocker / "run") in _one_line_error(capsys)
    assert blocker.read_text() == "mine"


def test_resume_of_a_finished_run_says_so(tmp_path, capsys):
    run = _finished_run(tmp_path)
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "already at step 8" in out and "--steps" in out


def test_stop_at_step_between_log_steps_reports_the_steps_trained(tmp_path, capsys):
    # with --log-every 8, steps 1-3 and 4-5 hold no log step: each call trained, and says so
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY, "--log-every", "8", "--stop-at-step", "3"]) == 0
    out = capsys.readouterr().out
    assert "at step 3 after" in out and "nothing to do" not in out
    assert main(["train", "--run-dir", str(run), "--resume", "--stop-at-step", "5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "at step 5 after" in out and "nothing to do" not in out
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 5
    assert main(["train", "--run-dir", str(run), "--resume", "--stop-at-step", "5", "--no-progress"]) == 0
    assert "at step 5 already (--stop-at-step); nothing to do" in capsys.readouterr().out


def test_resume_with_steps_extends_a_finished_run_at_the_minimum_lr(tmp_path, capsys):
    run = _finished_run(tmp_path, "--lr", "0.004", "--min-lr-ratio", "0.25")
    assert main(["train", "--run-dir", str(run), "--resume", "--steps", "12", "--no-progress"]) == 0
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 12
    rows = _read_csv(run / "log.csv")
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8, 10, 12]
    # steps 9..12 continue where the cosine ended (step 8 of 8): lr * min-lr-ratio
    assert [float(r["lr"]) for r in rows[4:]] == [0.004 * 0.25] * 2
    assert float(rows[2]["lr"]) > 0.004 * 0.25  # the cosine still decayed before
    assert main(["train", "--run-dir", str(run), "--resume", "--steps", "10"]) == 2
    assert "only extends" in _one_line_error(capsys)


def test_a_warm_up_longer_than_the_run_is_warned_about(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "new"), *TINY, "--warmup-steps", "20"]) == 0
    err = capsys.readouterr().err
    assert "warning: --warmup-steps 20 > --steps 8" in err and "peaks at 0.0004" in err
    # a warm-up as long as the run reaches --lr at its last step: nothing to warn about
    assert main(["train", "--run-dir", str(tmp_path / "equal"), *TINY, "--warmup-steps", "8"]) == 0
    assert "warning" not in capsys.readouterr().err


# ---- help ----

def _flag_help(text: str, flag: str) -> str:
    """The help of `flag` in argparse's --help output, on one line."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith(flag + " "))
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith(" " * 10):  # the next flag (two spaces in) or the next section
            break
        block.append(line)
    return " ".join(" ".join(block).split())


def test_preset_help_shows_the_preset_values(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--preset", "sort", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    sort = get_task("sort")
    model = sort.model_preset(sort.vocab_size)
    for flag, value in (("--lr", sort.train_preset["lr"]), ("--steps", sort.train_preset["steps"]),
                        ("--warmup-steps", sort.train_preset["warmup_steps"]), ("--n-layers", model.n_layers),
                        ("--n-heads", model.n_heads), ("--d-model", model.d_model)):
        assert f"(default: {value}, from the sort preset)" in _flag_help(text, flag), flag


# ---- interruption ----

LONG_TINY = [*TINY, "--steps", "100000", "--log-every", "1", "--checkpoint-every", "0"]

# where a resumed run must equal a straight one bit for bit: the CPU, or CUDA under --deterministic true (the
# compiled step's atomic adds make two plain GPU runs differ; README, "--deterministic")
EXACT_DEVICE_FLAGS = {"cpu": ["--device", "cpu"], "cuda": ["--device", "cuda", "--deterministic", "true"]}


def _interrupted_run(run: Path, sig: int, flags, rows=3, like_timeout=False, start_s=300,
                     stop_s=120) -> tuple[int, str]:
    """Start a long `asentmax train` in a child process with `flags`, send `sig` once log.csv has more than
    `rows` lines, return (code, stderr). `like_timeout`: as GNU `timeout` does, the signal goes to the child,
    then to its process group (the child starts its own)."""
    env = {**os.environ, "PYTHONPATH": str(Path(asentmax.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "asentmax", "train", "--run-dir", str(run), *flags],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=like_timeout)
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline and child.poll() is None:
        if (run / "log.csv").is_file() and len((run / "log.csv").read_text().splitlines()) > rows:
            break
        time.sleep(0.2)
    child.send_signal(sig)
    if like_timeout:
        os.killpg(child.pid, sig)  # timeout's second copy, to the whole group, right after the first
    _, err = child.communicate(timeout=stop_s)
    return child.returncode, err


ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize(("sig", "like_timeout", "device"), [
    pytest.param(signal.SIGINT, False, "cpu", id="SIGINT"),
    pytest.param(signal.SIGTERM, False, "cpu", id="SIGTERM"),
    pytest.param(signal.SIGTERM, True, "cpu", id="SIGTERM-as-timeout-sends-it"),
    pytest.param(signal.SIGTERM, True, "cuda", id="SIGTERM-as-timeout-sends-it-on-cuda-deterministic",
                 marks=ON_CUDA)])
def test_a_signal_saves_the_current_step_and_resume_is_exact(tmp_path, capsys, sig, like_timeout, device):
    """The CUDA case trains with the trainer's defaults there (compiled, CUDA graphs, batches drawn on the
    GPU, bf16 autocast) under --deterministic true; the CPU cases pin --device cpu, since --device auto would
    train them on a GPU where there is one, and plain GPU runs are not bit for bit repeatable."""
    run = tmp_path / "run"
    flags = [*LONG_TINY, *EXACT_DEVICE_FLAGS[device]]
    code, err = _interrupted_run(run, sig, flags, like_timeout=like_timeout)
    assert code == 130 and "Traceback" not in err, err[-2000:]
    step = load_checkpoint(run / "checkpoint.pt")["step"]
    assert f"interrupted ({signal.Signals(sig).name}) at step {step};" in err
    assert f"Resume with: asentmax train --run-dir {run} --resume" in err

    # the checkpoint is an exact point of the run: resumed to step + 3 == a straight run to step + 3
    at_signal = load_checkpoint(run / "checkpoint.pt")
    stop = ["--stop-at-step", str(step + 3)]
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", *stop]) == 0
    assert main(["train", "--run-dir", str(tmp_path / "straight"), *flags, *stop]) == 0
    a, b = (load_checkpoint(d / "checkpoint.pt") for d in (run, tmp_path / "straight"))
    assert a["step"] == b["step"] == step + 3
    differ = _differing_weights(a, b)
    if differ:  # where they part: the signal's checkpoint against a straight run to its step
        to_signal = tmp_path / "to_signal"
        assert main(["train", "--run-dir", str(to_signal), *flags, "--stop-at-step", str(step)]) == 0
        at_step = _differing_weights(at_signal, load_checkpoint(to_signal / "checkpoint.pt"))
        raise AssertionError(f"resumed run != straight run at step {step + 3}: {differ}; at the signal's "
                             f"step {step}: {at_step or 'equal'}")
    logs = [[r["loss"] for r in _read_csv(d / "log.csv")] for d in (run, tmp_path / "straight")]
    assert logs[0] == logs[1] and len(logs[0]) == step + 3


def _differing_weights(a: dict, b: dict) -> str:
    """How two checkpoints' weights differ, in one line ('' where bit for bit equal)."""
    names = [name for name in a["model"] if not torch.equal(a["model"][name], b["model"][name])]
    if not names:
        return ""
    largest = max((a["model"][n].double() - b["model"][n].double()).abs().max().item() for n in names)
    return (f"{len(names)} of {len(a['model'])} tensors differ (first {names[0]}; largest |difference| "
            f"{largest:.3g})")


@pytest.mark.parametrize("deterministic", ["true", "false"])
def test_a_resumed_deterministic_run_first_traces_its_compiled_step_at_step_zero(tmp_path, monkeypatch,
                                                                                  deterministic):
    """Inductor sizes a compiled step's kernels by its first call's shapes, so a resumed --deterministic run
    calls it first on step 0's batch, as the run it continues did (trainer.trace_at_step_zero), and that
    call leaves no trace in the run. The compiled step is replaced by the plain model, noting each call's
    batch width."""
    widths = []

    def noting_widths(model, backend="inductor", mode=None):
        def forward(input_ids):
            widths.append(input_ids.shape[1])
            return model(input_ids)
        return forward

    monkeypatch.setattr(trainer, "compiled_for_training", noting_widths)
    flags = [*TINY, "--device", "cpu", "--compile", "on", "--deterministic", deterministic,
             "--dropout", "0.1"]  # dropout: the extra call's RNG draws must be undone
    assert main(["train", "--run-dir", str(tmp_path / "straight"), *flags]) == 0
    straight = list(widths)
    resume_at = next(step for step, width in enumerate(straight) if width != straight[0])
    assert main(["train", "--run-dir", str(tmp_path / "run"), *flags, "--stop-at-step", str(resume_at)]) == 0
    widths.clear()
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--resume", "--no-progress"]) == 0
    traced_first = [straight[0]] if deterministic == "true" else []
    assert widths == traced_first + straight[resume_at:]
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt") for d in ("run", "straight"))
    differ = _differing_weights(a, b)
    assert not differ, differ  # the extra call's gradients and RNG draws are gone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["softmax", "asentmax"])
def test_timeout_on_cuda_saves_the_current_step(tmp_path, attention):
    """As GNU `timeout -s TERM` stops a run on the GPU (SIGTERM to the child, then to its process group, with
    the trainer's defaults there: compiled, CUDA graphs, device sampling): the run must end with the
    interruption checkpoint. In the tenth session's device calls two ASEntmax runs stopped so ended without it
    (no "interrupted" line; they resumed from their last periodic checkpoint) where softmax's wrote it."""
    run = tmp_path / "run"
    flags = ["--preset", "mqmtar", "--attention", attention, "--batch-size", "64", "--steps", "100000",
             "--log-every", "20", "--checkpoint-every", "0", "--val-every", "0", "--device", "cuda",
             "--no-progress"]
    code, err = _interrupted_run(run, signal.SIGTERM, flags, rows=10, like_timeout=True, stop_s=180)
    assert code == 130 and "Traceback" not in err, err[-2000:]
    step = load_checkpoint(run / "checkpoint.pt")["step"]
    logged = [int(row["step"]) for row in _read_csv(run / "log.csv")]
    assert f"interrupted (SIGTERM) at step {step};" in err and step >= logged[-1], err[-2000:]


def test_a_handler_replaced_during_the_run_is_put_back_and_sigterm_still_saves(tmp_path, monkeypatch, capsys):
    """Something in the loop (a library, here a stand-in at step 3) replaces the SIGTERM handler; at the next
    log step the trainer puts its own back with a warning, so a SIGTERM at step 6 still ends the run there
    with its checkpoint (without the check it reached the stand-in and the run went on to its last step)."""
    from asentmax.nn import ModelConfig
    from asentmax.tasks.workload import TaskWorkload
    from asentmax.trainer import TrainConfig, target_loss, train

    reached = []
    step_calls = []

    def loss_with_a_stand_in(*args, **kwargs):
        step_calls.append(None)
        if len(step_calls) == 3:
            signal.signal(signal.SIGTERM, lambda signum, frame: reached.append(signum))
        if len(step_calls) == 6:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return target_loss(*args, **kwargs)

    monkeypatch.setattr("asentmax.trainer.target_loss", loss_with_a_stand_in)
    task = get_task("copy")
    workload = TaskWorkload(task="copy", min_length=3, max_length=6, val_multipliers=(1,), val_samples=2)
    model = ModelConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                        attention="asentmax", position="nape")
    config = TrainConfig(steps=40, batch_size=4, warmup_steps=2, val_every=0, log_every=1, checkpoint_every=0,
                         seed=3)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        summary = train(workload, config, model, tmp_path / "run", progress=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert summary["interrupted"] == "SIGTERM" and summary["step"] == 6 and reached == []
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == 6
    err = capsys.readouterr().err
    assert "warning: at step 3 the trainer's signal handlers had been replaced (SIGTERM by" in err


def test_a_repeated_sigterm_is_the_same_stop_request_and_ctrl_c_twice_aborts():
    """GNU `timeout` delivers SIGTERM twice (to the child, then to its process group); the second copy
    must not reach the previous handler (the default one kills a run while it writes its checkpoint).
    A second SIGINT does reach it: Ctrl-C twice aborts at once."""
    from asentmax.trainer import StopRequest

    reached = []
    previous = {sig: signal.signal(sig, lambda signum, frame: reached.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with StopRequest() as request:
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the Python-level handler runs between the signals
            assert request.signal_name == "SIGTERM" and reached == []
            for _ in range(2):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            assert request.signal_name == "SIGINT" and reached == [signal.SIGINT]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
