"""benchmarks/device_plan.py: a plan's runs train and evaluate side by side; a failing run stops only its own
chain; a window that closes mid-training leaves a checkpoint the next call resumes from; run_together, the
runner reproduce_paper.py and plateau_study.py share, names the commands that failed."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_plan.py"
TINY = ("--task reverse --min-length 3 --max-length 6 --batch-size 4 --warmup-steps 1 --val-every 0 "
        "--log-every 1 --d-model 32 --n-layers 1 --n-heads 2 --d-ff 64 --device cpu")


def load_device_plan():
    spec = importlib.util.spec_from_file_location("device_plan", SCRIPT)
    device_plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_plan)
    return device_plan


def call(tmp_path, plan, *args, timeout=300):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"runs": plan}))
    return subprocess.run([sys.executable, str(SCRIPT), str(path), "--work", str(tmp_path / "work"), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={"PYTHONPATH": str(SCRIPT.parents[1] / "src"), "PATH": "/usr/bin:/bin"})


def test_runs_train_then_evaluate_and_a_failing_run_stops_only_itself(tmp_path):
    evals = ["--multipliers 1 --samples 2", "--multipliers 1 2 --samples 2 --tables train"]
    plan = {"good": {"train": TINY + " --steps 4", "evals": evals},
            "bad": {"train": TINY + " --steps 4 --lr -1", "evals": ["--multipliers 1 --samples 2"]}}
    result = call(tmp_path, plan, "--seconds", "240")
    assert result.returncode == 1, result.stderr
    work = tmp_path / "work"
    status = json.loads((work / "status.json").read_text())
    assert status["good"]["trained"] and status["good"]["evals_done"] == 2 and "failed" not in status["good"]
    assert [s["step"] for s in status["good"]["steps"]] == ["train", "eval0", "eval1"]
    assert status["bad"]["failed"] == "train" and not status["bad"]["trained"]
    assert "lr" in (work / "bad.train.log").read_text()
    rows = json.loads((work / "good" / "eval.json").read_text())["rows"]
    assert [row["length"] for row in rows] == [6, 12]  # the second evaluation continued the first
    assert "good: trained, evaluations 2/2" in result.stdout
    # the failed step's line quotes the error its log names
    failed_line = next(line for line in result.stdout.splitlines() if line.startswith("bad:"))
    assert "FAILED at train: asentmax train: error: " in failed_line and "lr" in failed_line, failed_line
    again = call(tmp_path, {"good": plan["good"]}, "--seconds", "240")  # all done: nothing runs
    assert again.returncode == 0 and "good: trained, evaluations 2/2 (nothing to do)" in again.stdout


def test_eval_flags_reach_every_evaluation(tmp_path):
    """--eval-flags is appended to each evaluation of the call: here a setting the CPU refuses in one line,
    so the evaluation fails and its log shows the flag arrived."""
    plan = {"run": {"train": TINY + " --steps 2", "evals": ["--multipliers 1 --samples 2"]}}
    result = call(tmp_path, plan, "--seconds", "240", "--eval-flags", "--cuda-graphs on")
    assert result.returncode == 1
    assert "FAILED at eval0: asentmax eval: error: --cuda-graphs on" in result.stdout
    assert "--cuda-graphs on: cuda_graph=True needs" in (tmp_path / "work" / "run.eval.log").read_text()


def test_work_in_an_evaluation_s_flags_stands_for_work(tmp_path):
    """`{work}` in an evaluation's flags is --work, as in training's: an --output placed in the run's dir."""
    plan = {"run": {"train": TINY + " --steps 2",
                    "evals": ["--multipliers 1 --samples 2 --output {work}/run/eval_x"]}}
    result = call(tmp_path, plan, "--seconds", "240")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "work" / "run" / "eval_x.json").read_text())["rows"][0]["length"] == 6


def test_a_closing_window_checkpoints_and_the_next_call_resumes(tmp_path):
    plan = {"long": {"train": TINY + " --steps 1000000", "evals": ["--multipliers 1 --samples 2"]}}
    first = call(tmp_path, plan, "--seconds", "10", "--margin", "2")
    assert first.returncode == 0, first.stderr
    run = tmp_path / "work" / "long"
    step = torch.load(run / "checkpoint.pt", weights_only=False)["step"]
    status = json.loads((tmp_path / "work" / "status.json").read_text())["long"]
    assert 0 < step < 1000000 and not status["trained"] and status["steps"][0]["exit"] == 130
    second = call(tmp_path, plan, "--seconds", "10", "--margin", "2")
    assert second.returncode == 0, second.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] > step
    commands = [line for line in (tmp_path / "work" / "long.train.log").read_text().splitlines()
                if line.startswith("$ asentmax train")]
    assert len(commands) == 2 and "--resume" not in commands[0] and commands[1].endswith("--resume")
    assert not (run / "eval.json").exists()  # never trained to the end: not evaluated


def test_a_stalled_run_ends_its_chain_unevaluated_and_stays_stopped(tmp_path):
    plan = {"stuck": {"train": TINY + " --steps 40 --stall-step 2 --stall-loss 1e-9",
                      "evals": ["--multipliers 1 --samples 2"]}}
    first = call(tmp_path, plan, "--seconds", "240")
    assert first.returncode == 0, first.stderr  # a stall is an outcome, not a failure
    work = tmp_path / "work"
    status = json.loads((work / "status.json").read_text())["stuck"]
    assert status["stalled"] and not status["trained"] and status["steps"][0]["exit"] == 3
    assert torch.load(work / "stuck" / "checkpoint.pt", weights_only=False)["step"] == 2
    assert "stopped by a stall check" in first.stdout and not (work / "stuck" / "eval.json").exists()
    again = call(tmp_path, plan, "--seconds", "240", "--continuing")  # not resumed past its stall check
    assert again.returncode == 0 and "(nothing to do)" in again.stdout
    assert torch.load(work / "stuck" / "checkpoint.pt", weights_only=False)["step"] == 2


def test_continuing_refuses_to_start_a_run_from_step_0(tmp_path):
    plan = {name: {"train": TINY + " --steps 4", "evals": []} for name in ("a", "b")}
    result = call(tmp_path, plan, "--seconds", "60", "--continuing")
    assert result.returncode == 2
    assert "--continuing: a, b would start again from step 0" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "work").exists()  # nothing started, nothing written
    assert call(tmp_path, {"a": plan["a"]}, "--seconds", "120").returncode == 0
    result = call(tmp_path, plan, "--seconds", "60", "--continuing")
    assert result.returncode == 2 and "--continuing: b would" in result.stderr  # a is trained; b is not


def test_a_run_after_another_starts_from_its_weights_once_it_has_trained(tmp_path):
    plan = {"first": {"train": TINY + " --steps 30", "evals": ["--multipliers 1 --samples 2"]},
            "second": {"after": "first", "train": TINY + " --steps 3 --init-from {work}/first",
                       "evals": ["--multipliers 1 --samples 2"]}}
    alone = call(tmp_path, {"second": plan["second"], "first": plan["first"]}, "--seconds", "60",
                 "--runs", "second")
    assert alone.returncode == 2 and "second (after first): that run is neither trained" in alone.stderr
    result = call(tmp_path, plan, "--seconds", "240")
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    status = json.loads((work / "status.json").read_text())
    assert status["first"]["trained"] and status["second"]["trained"] and status["second"]["evals_done"] == 1
    config = json.loads((work / "second" / "config.json").read_text())
    assert config["init_from"]["path"] == str(work / "first" / "checkpoint.pt")
    assert config["init_from"]["step"] == 30  # the first run's last step: it waited for the whole training
    assert torch.load(work / "second" / "checkpoint.pt", weights_only=False)["step"] == 3


def test_a_run_after_one_that_stalls_waits_and_says_so(tmp_path):
    plan = {"stuck": {"train": TINY + " --steps 40 --stall-step 2 --stall-loss 0.0001", "evals": []},
            "next": {"after": "stuck", "train": TINY + " --steps 3 --init-from {work}/stuck", "evals": []}}
    result = call(tmp_path, plan, "--seconds", "120")
    assert result.returncode == 0, result.stderr
    status = json.loads((tmp_path / "work" / "status.json").read_text())
    assert status["stuck"]["stalled"] and status["next"]["waiting_for"] == "stuck"
    assert "next: training, evaluations 0/0; waiting for stuck to train" in result.stdout
    assert not (tmp_path / "work" / "next").exists()


def test_plan_mistakes_are_one_line(tmp_path):
    result = call(tmp_path, {"x": {"train": 3}}, "--seconds", "60")
    assert result.returncode != 0 and "needs \"train\": a string of flags" in result.stderr
    result = call(tmp_path, {"x": {"train": TINY}}, "--seconds", "60", "--runs", "y")
    assert result.returncode == 2 and "--runs y: not in" in result.stderr.splitlines()[-1]
    result = call(tmp_path, {"x": {"train": TINY, "after": "z"}}, "--seconds", "60")
    assert result.returncode == 1 and "run 'x' is after 'z', which is not another run" in result.stderr


def test_run_together_logs_every_command_and_names_the_ones_that_failed(tmp_path):
    device_plan = load_device_plan()
    with pytest.raises(SystemExit, match=r"^check failed for bad \(exit 2\); see ") as stop:
        device_plan.run_together({"good": ["--help"], "bad": ["no-such-command"]}, tmp_path, "check", None)
    assert "good" not in str(stop.value)
    for name in ("good", "bad"):
        log = (tmp_path / f"{name}.check.log").read_text()
        assert log.startswith("$ asentmax ") and len(log.splitlines()) > 1


def test_each_run_compiles_into_a_cache_of_its_own(tmp_path, monkeypatch):
    device_plan = load_device_plan()
    caches = {}

    class Finished:
        returncode = 0

        def wait(self, timeout=None):
            return 0

    def popen(args, stdout, stderr, env):
        caches[Path(stdout.name).name] = env["TORCHINDUCTOR_CACHE_DIR"]
        return Finished()

    monkeypatch.setattr(device_plan.subprocess, "Popen", popen)
    names = ("run_lookalikes0.1", "run_lookalikes0.5")  # a dot in a run's name
    for name in names:
        for stage in ("train", "eval"):
            device_plan.run_step(["--help"], tmp_path / f"{name}.{stage}.log", None)
    for name in names:  # a run's training and evaluations share its cache, under --work
        assert caches[f"{name}.train.log"] == caches[f"{name}.eval.log"] == str(
            tmp_path / device_plan.COMPILE_CACHE / name)
    assert caches[f"{names[0]}.train.log"] != caches[f"{names[1]}.train.log"]


def test_side_by_side_returns_every_result_and_raises_a_failure():
    side_by_side = load_device_plan().side_by_side
    assert side_by_side({"a": lambda: 1, "b": lambda: 2}) == {"a": 1, "b": 2}
    with pytest.raises(ZeroDivisionError):
        side_by_side({"a": lambda: 1, "b": lambda: 1 / 0})


def link_repository_folders(tmp_path, *folders):
    """The repository's `folders` linked into tmp_path: a checkout in which the device scripts run and write
    their runs/ under tmp_path."""
    for folder in folders:
        (tmp_path / folder).symlink_to(SCRIPT.parents[1] / folder)


CHIMERA_DIR = "runs/chimera/"  # where `bash benchmarks/device_calls.sh chimeras` writes its start checkpoints
DEVICE_CALLS = (SCRIPT.parent / "device_calls.sh").read_text()
CHIMERAS = set(re.findall(r"^    chimera (\w+) ", DEVICE_CALLS, re.M))  # the starts it writes
# the run whose model they take
CHIMERA_SOURCE = SCRIPT.parents[1] / re.search(r"^    source=(\S+)$", DEVICE_CALLS, re.M).group(1)


def test_every_committed_plan_builds_valid_configs(tmp_path):
    from asentmax.cli import _given, _new_run, build_parser
    from asentmax.eval import EvalConfig
    from asentmax.nn import ModelConfig
    from asentmax.tasks.registry import has_fresh_tables

    device_plan = load_device_plan()
    plans = sorted((SCRIPT.parent / "plans").glob("*.json"))
    assert plans
    parser = build_parser()
    for path in plans:
        plan = device_plan.read_plan(path)
        models = {}
        for name, run in sorted(plan.items(), key=lambda item: item[1]["after"] is not None):
            flags = [flag.replace("{work}", str(tmp_path / path.stem)) for flag in run["train"]]
            init_from = flags.index("--init-from") if "--init-from" in flags else None
            chimera = None
            if init_from is not None and flags[init_from + 1].startswith(CHIMERA_DIR):
                chimera = Path(flags[init_from + 1]).stem  # a start that device_calls.sh chimeras writes
                assert chimera in CHIMERAS, name
                del flags[init_from:init_from + 2]
            elif init_from is not None:  # the prerequisite's weights: its run dir, a model of the same shape
                assert run["after"] and flags[init_from + 1] == str(tmp_path / path.stem / run["after"]), name
                del flags[init_from:init_from + 2]
            args = parser.parse_args(["train", "--run-dir", str(tmp_path / path.stem / name), *flags])
            workload, train_config, model_config, _ = _new_run(args)  # the trainer's own checks
            models[name] = model_config
            if chimera is not None:  # the model of the run whose config chimera_init reads
                source = ModelConfig.from_dict(json.loads((CHIMERA_SOURCE / "config.json").read_text())
                                               ["model_config"])
                assert not model_config.init_from_differences(source), name
            elif init_from is not None:  # the same model, except the normaliser's own fields (a dense start)
                source = models[run["after"]]
                assert not model_config.init_from_differences(source), name
                assert model_config.attention_backend == source.attention_backend, name
            assert train_config.steps >= train_config.warmup_steps, name
            for flags in run["evals"]:
                args = parser.parse_args(["eval", str(tmp_path), *flags])
                config = EvalConfig(**_given(args, args.eval_names))
                config.validate()
                assert config.tables == "train" or has_fresh_tables(workload.task), (name, flags)


def test_committed_plans_parse():
    """Every run of every committed plan (benchmarks/plans/*.json) has train and eval flags that `asentmax`
    parses: a typo costs no device time."""
    from asentmax.cli import build_parser

    parser = build_parser()
    plans = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "plans").glob("*.json"))
    assert plans
    for path in plans:
        for name, run in load_device_plan().read_plan(path).items():
            parser.parse_args(["train", "--run-dir", name, *run["train"]])
            for flags in run["evals"]:
                parser.parse_args(["eval", name, *flags])


def test_error_line_quotes_the_last_line_that_names_an_error(tmp_path):
    """As Inductor's assertion in the fortieth session: hint lines follow the error, and are not quoted."""
    device_plan = load_device_plan()
    log = tmp_path / "run.train.log"
    log.write_text("$ asentmax train ...\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "AssertionError: expected size 128==128, stride 640==912 at dim=0\n"
                   "This error most often comes from a incorrect fake (aka meta) kernel for a custom op.\n"
                   "See https://pytorch.org/docs/stable/library.html#torch.library.opcheck\n\n")
    assert device_plan.error_line(log) == "AssertionError: expected size 128==128, stride 640==912 at dim=0"
    log.write_text("step 20\nKilled\n")
    assert device_plan.error_line(log) == "Killed"
    assert device_plan.error_line(tmp_path / "missing.log") == "nothing in missing.log"


def test_a_part_stops_only_its_own_work_s_leftover_processes():
    """device_calls.sh's stop_leftovers WORK ends the `asentmax train`/`eval` processes of WORK's runs and
    leaves another part's: a plan part that ended first stopped the screens beside it (forty-third
    session). The work folders are named after this process, so no one else's runs can match."""
    function = re.search(r"^stop_leftovers\(\) \{.*?^\}$", DEVICE_CALLS, re.M | re.S).group(0)
    plan, screens = f"runs/test{os.getpid()}plan", f"runs/test{os.getpid()}screens"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "asentmax"]
    procs = {name: subprocess.Popen(sleeper + args) for name, args in
             {"plan_train": ["train", "--run-dir", f"{plan}/a"], "plan_eval": ["eval", f"{plan}/a"],
              "screen": ["train", "--run-dir", f"{screens}/b"],
              "other": ["train", "--run-dir", f"{plan}b/c"]}.items()}
    try:
        time.sleep(0.5)
        subprocess.run(["bash", "-c", f"{function}\nstop_leftovers {plan}"], check=True, timeout=30)
        time.sleep(0.5)
        alive = {name for name, proc in procs.items() if proc.poll() is None}
        assert alive == {"screen", "other"}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_a_run_left_by_an_earlier_session_is_refused(tmp_path):
    """A machine that kept --work from an earlier session must not resume (or evaluate) that session's run as
    this one's: a run, or the run it is after, last written more than --stale-hours ago stops the call."""
    plan = {"base": {"train": TINY + " --steps 2", "evals": []},
            "later": {"after": "base", "train": TINY + " --steps 2", "evals": []}}
    assert call(tmp_path, {"base": plan["base"]}, "--seconds", "120").returncode == 0
    assert call(tmp_path, plan, "--seconds", "120").returncode == 0  # minutes apart: one session's calls
    work = tmp_path / "work"
    old = time.time() - 5 * 3600
    for path in [*work.glob("base*"), *(work / "base").rglob("*")]:
        os.utime(path, (old, old))
    result = call(tmp_path, plan, "--seconds", "60", "--runs", "later")
    assert result.returncode == 2
    message = result.stderr.splitlines()[-1]
    assert "base (5.0 h ago): last written under" in message and "nothing started" in message
    assert "later (" not in message  # written just now
    before = (work / "status.json").stat().st_mtime  # the earlier call's: the refused one wrote nothing
    assert call(tmp_path, plan, "--seconds", "60", "--runs", "later", "--stale-hours", "6").returncode == 0
    assert (work / "status.json").stat().st_mtime > before  # raised, the call runs


def test_chimeras_writes_only_the_starts_named(tmp_path):
    """`device_calls.sh chimeras NAME...` writes those starts alone (each draws both seeds' models again); a
    name it has no start for is refused."""
    link_repository_folders(tmp_path, "benchmarks", "src", "results")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}

    def chimeras(*names):
        return subprocess.run(["bash", "benchmarks/device_calls.sh", "chimeras", *names], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)

    assert chimeras("io1_block1_rest8").returncode == 0
    assert sorted(p.name for p in (tmp_path / "runs" / "chimera").iterdir()) == ["io1_block1_rest8.pt"]
    result = chimeras("io1_block9_rest8")
    assert result.returncode == 2 and "chimeras: no start named io1_block9_rest8" in result.stderr


def test_issue15_base_sets_a_stopped_base_aside_and_trains_it_again(tmp_path):
    """`issue15_gpu_call.sh base` trains the base again (same flags) after a stall check stopped it, keeping
    the stopped attempt as mqmtar_asentmax_preset_stalled1 (its state lines in call_base.log renamed too),
    up to BASE_ATTEMPTS; `phases` then starts nothing from a base that stopped every time. A base that trains
    is trained once."""
    link_repository_folders(tmp_path, "benchmarks", "src")

    def gpu_call(part, base_flags):
        plan = tmp_path / "plan.json"
        phase = {"after": "mqmtar_asentmax_preset", "evals": [],
                 "train": TINY + " --steps 2 --init-from {work}/mqmtar_asentmax_preset"}
        runs = {"mqmtar_asentmax_preset": {"train": TINY + base_flags, "evals": []},
                "mqmtar_asentmax_preset_then_lr2e-5": phase}
        plan.write_text(json.dumps({"runs": runs}))
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PLAN": str(plan), "WINDOW": "200",
               "OUT": str(tmp_path / "out"), "BASE_ATTEMPTS": "2",
               "SECOND_PHASES": "mqmtar_asentmax_preset_then_lr2e-5"}
        return subprocess.run(["bash", "benchmarks/issue15_gpu_call.sh", part], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)

    work = tmp_path / "runs" / "plan"
    stuck = " --steps 40 --stall-step 2 --stall-loss 1e-9"
    base = gpu_call("base", stuck)
    assert base.returncode == 0, base.stderr
    assert "set aside as mqmtar_asentmax_preset_stalled1" in base.stdout
    for name in ("mqmtar_asentmax_preset_stalled1", "mqmtar_asentmax_preset"):  # two attempts, both stopped
        assert (work / f"{name}.stalled").exists() and (work / name / "checkpoint.pt").exists()
        assert (work / f"{name}.train.log").exists()
    assert not (work / "mqmtar_asentmax_preset_stalled2").exists()
    log_lines = (work / "call_base.log").read_text().splitlines()
    states = [line.split(":")[0] for line in log_lines if ": " in line]
    # each attempt's state lines name the directory it ended in (record_runs.py counts its seconds by them)
    assert "mqmtar_asentmax_preset_stalled1" in states and "mqmtar_asentmax_preset" in states
    phases = gpu_call("phases", stuck)
    assert phases.returncode == 0 and "no second phases from it" in phases.stdout
    assert not (work / "mqmtar_asentmax_preset_then_lr2e-5").exists()

    shutil.rmtree(work)  # a new session: nothing left
    base = gpu_call("base", " --steps 3")
    assert base.returncode == 0 and "set aside" not in base.stdout
    assert (work / "mqmtar_asentmax_preset.trained").exists()
    assert not list(work.glob("*stalled*"))


def test_issue15_after_runs_the_named_gpu_test_files_and_a_cut_suite_still_reports(tmp_path):
    """`issue15_gpu_call.sh after` runs only the GPU test files in TEST_FILES, and a suite that TEST_SECONDS
    cuts is interrupted as by Ctrl-C: its log still has the passed tests, the slowest durations and where
    it stood, and the summary line counts what passed."""
    link_repository_folders(tmp_path, "benchmarks", "src")
    (tmp_path / "gpu_checks").mkdir()
    (tmp_path / "gpu_checks" / "test_named.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_quick():\n    pass\n\n\n"
        "@pytest.mark.gpu\ndef test_stuck():\n    time.sleep(120)\n")
    (tmp_path / "gpu_checks" / "test_not_named.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_elsewhere():\n    pass\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "SECOND_PHASES": "no_such_run", "PROBE_MULTIPLIERS": "1", "TEST_SECONDS": "15",
           "TEST_FILES": "gpu_checks/test_named.py"}
    started = time.monotonic()
    after = subprocess.run(["bash", "benchmarks/issue15_gpu_call.sh", "after"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env=env)
    assert time.monotonic() - started < 90, "the cut suite outlived TEST_SECONDS"
    assert after.returncode == 0, after.stderr
    assert "GPU tests: exit 124, 1 passed, 0 failed" in after.stdout
    log = (tmp_path / "runs" / "plan" / "gpu_tests.log").read_text()
    assert "test_named.py::test_quick PASSED" in log and "test_elsewhere" not in log
    assert "slowest" in log and "test_named.py:12: KeyboardInterrupt" in log
