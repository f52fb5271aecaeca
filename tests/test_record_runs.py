"""benchmarks/record_runs.py: a finished and a stalled plan run are copied with their logs and device_plan
lines (the stalled run's evaluation as eval_at_stall); their runs.json entries are computed from the files
(samples = reached step x batch + prior samples) and appended after the existing entries, in runs.json's own
format, and the existing entries stay as they were; bad input is refused on one line before anything is
written."""

import json

import pytest

from conftest import load_benchmark

record = load_benchmark("record_runs")

TRAIN = "asentmax train --run-dir runs/plan/{name} --no-progress --preset reverse --seed {seed}"


def plan_run(work, name, *, seed, steps, reached, batch=128, prior=0, stalled=False,
             evals=("eval", "eval_best")):
    """A run as device_plan leaves it in --work: its directory and its step logs."""
    run = work / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "train_config": {"seed": seed, "steps": steps, "batch_size": batch}, "prior_samples": prior,
        "workload": {"task": "reverse"}, "model_config": {"attention": "asentmax"}, "device": "cuda:H100"}))
    (run / "log.csv").write_text("step,loss\n1,2.0\n")
    (run / "val.csv").write_text("step,length,exact_match\n2000,64,0.5\n")
    for evaluation in evals:
        (run / f"{evaluation}.json").write_text(json.dumps({"rows": [], "name": evaluation}))
        (run / f"{evaluation}.md").write_text(f"# {evaluation}\n")
    log = [f"$ {TRAIN.format(name=name, seed=seed)}", f"step {reached // 2}: length 64 exact_match 0.5"]
    if stalled:
        (run / "stalled.json").write_text(json.dumps({"step": reached, "stall_val_step": reached}))
        log.append(f"stalled: validation score 0 at step {reached}")
    else:
        log += [f"step {reached}: length 64 exact_match 1.0", f"at step {reached} after 9.0s in this process"]
    (work / f"{name}.train.log").write_text("\n".join(log) + "\n")
    command = f"$ asentmax eval runs/plan/{name} --samples 3"
    best = "" if stalled else f"{command} --checkpoint best\n"
    logged = f"{command}\nlength 64: {0.0 if stalled else 1.0}\n{best}"
    (work / f"{name}.eval.log").write_text(logged)


@pytest.fixture
def plan(tmp_path):
    work = tmp_path / "work"
    plan_run(work, "reverse_done", seed=1, steps=400, reached=400, prior=1000,
             evals=("eval", "eval_best", "eval_fp32"))  # the last as an --output in the run's dir
    plan_run(work, "reverse_screen", seed=7, steps=400, reached=100, stalled=True, evals=("eval",))
    log = tmp_path / "device_plan.log"
    log.write_text("reverse_done: trained, evaluations 2/2 (train exit 0 in 12.5 s, eval0 exit 0 in 2 s, "
                   "eval1 exit 0 in 1.5 s)\n"
                   "reverse_screen: training, evaluations 0/2; stopped by a stall check "
                   "(train exit 3 in 4.3 s)\n"
                   "reverse_done_longer: trained (train exit 0 in 99 s)\n")
    return work, log


@pytest.mark.parametrize("layout", ["indent 1, sorted keys", "indent 2, unsorted keys"])
def test_runs_are_copied_and_appended_in_the_files_format(tmp_path, plan, layout):
    work, log = plan
    out = tmp_path / "out"
    out.mkdir()
    old = {"zeta_run": {"train_command": "t", "seed": 3, "call": "c"}, "alpha_run": {"seed": 1, "call": "d"}}
    indent, sort_keys = (1, True) if layout.startswith("indent 1") else (2, False)
    if sort_keys:
        old = {name: dict(sorted(fields.items())) for name, fields in old.items()}
    (out / "runs.json").write_text(json.dumps(old, indent=indent) + "\n")
    assert record.main(["--work", str(work), "--out", str(out), "--logs", str(log), "--git", "abc1234",
                        "--call", "a call", "reverse_done=done", "reverse_screen=screen_stalled"]) == 0

    done, stalled = out / "done", out / "screen_stalled"
    assert sorted(p.name for p in done.iterdir()) == sorted(
        ["config.json", "log.csv", "val.csv", "eval.json", "eval.md", "eval_best.json", "eval_best.md",
         "eval_fp32.json", "eval_fp32.md", "train.log", "eval.log", "device_plan.log"])
    assert sorted(p.name for p in stalled.iterdir()) == sorted(
        ["config.json", "log.csv", "val.csv", "stalled.json", "eval_at_stall.json", "eval_at_stall.md",
         "eval_at_stall.log", "train.log", "device_plan.log"])
    for name, run in (("reverse_done", done), ("reverse_screen", stalled)):
        assert (run / "train.log").read_text() == (work / f"{name}.train.log").read_text()
        assert (run / "device_plan.log").read_text().splitlines() == [
            line for line in log.read_text().splitlines() if line.startswith(f"{name}:")]
    assert json.loads((stalled / "eval_at_stall.json").read_text())["name"] == "eval"
    assert (stalled / "eval_at_stall.log").read_text() == (work / "reverse_screen.eval.log").read_text()

    text = (out / "runs.json").read_text()
    runs = json.loads(text)
    assert text.startswith("{\n" + " " * indent + '"zeta_run"')
    assert list(runs) == ["zeta_run", "alpha_run", "done", "screen_stalled"]
    assert {name: runs[name] for name in old} == old
    assert (list(runs["done"]) == sorted(runs["done"])) == sort_keys
    assert runs["done"] == {
        "train_command": TRAIN.format(name="reverse_done", seed=1),
        "eval_command": "asentmax eval runs/plan/reverse_done --samples 3; "
                        "asentmax eval runs/plan/reverse_done --samples 3 --checkpoint best",
        "seed": 1, "steps_planned": 400, "steps_reached": 400, "batch_size": 128,
        "samples_seen": 400 * 128 + 1000, "device": "cuda:H100", "git_commit": "abc1234",
        "train_wall_s": 12.5, "eval_wall_s": 3.5, "call": "a call"}
    screen = runs["screen_stalled"]
    assert (screen["steps_reached"], screen["samples_seen"]) == (100, 100 * 128)
    assert (screen["train_wall_s"], screen["eval_wall_s"]) == (4.3, 0)
    assert screen["eval_command"] == "asentmax eval runs/plan/reverse_screen --samples 3"
    (work / "reverse_screen.eval.log").unlink()
    unlogged = record.entry(work, "reverse_screen", [], "abc1234", "c")
    assert unlogged["eval_command"] == "not evaluated in the plan"


@pytest.mark.parametrize("pair, message", [("reverse_done", "is not PLAN_RUN=NAME"),
                                           ("reverse_done=a/b", "is not PLAN_RUN=NAME"),
                                           ("reverse_gone=gone", "not a run of the plan"),
                                           ("reverse_done=alpha_run", "already recorded"),
                                           ("reverse_done=existing", "already recorded"),
                                           ("--missing-log", "does not exist")])
def test_bad_input_is_refused_on_one_line_before_writing(tmp_path, plan, capsys, pair, message):
    work, log = plan
    out = tmp_path / "out"
    (out / "existing").mkdir(parents=True)
    before = json.dumps({"alpha_run": {"seed": 1}}, indent=1) + "\n"
    (out / "runs.json").write_text(before)
    logs = [str(tmp_path / "no.log")] if pair == "--missing-log" else [str(log)]
    pairs = ["reverse_done=fine"] if pair == "--missing-log" else ["reverse_screen=first", pair]
    assert record.main(["--work", str(work), "--out", str(out), "--logs", *logs, "--git", "g", "--call", "c",
                        *pairs]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("record_runs: error: ") and message in err
    assert (out / "runs.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["existing", "runs.json"]
