"""Fuzz test of the `asentmax` command line: seeded random bad argument combinations and damaged run
directories (truncated, empty, random, planted-code and foreign checkpoints; garbage, misshapen and
missing config.json and eval.json; a file where a directory belongs and the other way round). Every
case must exit 2 with exactly one line on stderr, no traceback, and leave every existing file as it
was (checksums of the whole tree before and after; no file or directory appears). The CLI runs
in-process (asentmax.cli.main) for speed, plus a few cases in a real subprocess."""

import functools
import hashlib
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch

from asentmax.cli import main

SEED = 20260612
N_RANDOM = 140

TINY = ["--task", "copy", "--min-length", "3", "--max-length", "6", "--steps", "4", "--batch-size", "4",
        "--warmup-steps", "1", "--val-every", "4", "--val-samples", "2", "--log-every", "2",
        "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--no-progress"]


class _Planted:
    """Unpickling this runs os.system: a loader that executes code creates the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _damage_checkpoint(run, root, how):
    path = run / "checkpoint.pt"
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random":
        path.write_bytes(random.Random(1).randbytes(4096))
    elif how == "planted-code":
        torch.save({"model": _Planted(root / "code-ran"), "step": 1}, path)
    elif how == "foreign":  # loads fine, but is no model of this package
        torch.save({"model": {"w": torch.zeros(2)}, "step": 3, "model_config": {"vocab_size": 9},
                    "train_config": {"task": "copy", "max_length": 6}}, path)
    elif how == "unknown-model-field":
        state = torch.load(path, weights_only=True)
        state["model_config"]["warp_drive"] = True
        torch.save(state, path)
    elif how == "a-directory":
        path.unlink()
        path.mkdir()
    elif how == "missing":
        path.unlink()


CHECKPOINT_DAMAGES = ("truncated", "empty", "random", "planted-code", "foreign", "unknown-model-field",
                      "a-directory", "missing")
RUN_DAMAGES = {  # damage -> function(run dir, root) applied to a copy of a good evaluated run
    **{f"checkpoint-{how}": functools.partial(_damage_checkpoint, how=how) for how in CHECKPOINT_DAMAGES},
    "config-garbage": lambda run, root: (run / "config.json").write_bytes(b"{\"train_config\": {"),
    "config-not-utf8": lambda run, root: (run / "config.json").write_bytes(b"\xff\xfe\x00{}"),
    "config-a-list": lambda run, root: (run / "config.json").write_text("[1, 2, 3]"),
    "config-no-workload": lambda run, root: (run / "config.json").write_text('{"model_config": {}}'),
    "config-unknown-task": lambda run, root: (run / "config.json").write_text(
        '{"workload": {"name": "task", "task": "juggle", "max_length": 6}}'),
    "config-other-workload": lambda run, root: (run / "config.json").write_text(
        '{"workload": {"name": "lm"}}'),
    "config-other-task": lambda run, root: (run / "config.json").write_text(
        '{"workload": {"name": "task", "task": "sort", "max_length": 6}}'),
    "config-missing": lambda run, root: (run / "config.json").unlink(),
    "config-a-directory": lambda run, root: ((run / "config.json").unlink(), (run / "config.json").mkdir()),
}
EVAL_DAMAGES = {  # these break a re-run of eval, and (but for eval.md) compare
    "eval-garbage": lambda run, root: (run / "eval.json").write_text('{"rows": [ '),
    "eval-misshapen": lambda run, root: (run / "eval.json").write_text('{"rows": [{"length": -1}]}'),
    "eval-a-list": lambda run, root: (run / "eval.json").write_text("[]"),
    "eval-a-directory": lambda run, root: ((run / "eval.json").unlink(), (run / "eval.json").mkdir()),
    "eval-md-a-directory": lambda run, root: ((run / "eval.md").unlink(), (run / "eval.md").mkdir()),
}
NOT_A_RUN = ("run-dir-missing", "run-dir-a-file", "run-dir-empty")
COMPARE_DAMAGES = (*(name for name in EVAL_DAMAGES if name != "eval-md-a-directory"), *NOT_A_RUN)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """root/good (trained and evaluated), root/<damage> (damaged copies), root/a-file, root/run-dir-*."""
    root = tmp_path_factory.mktemp("fuzz")
    good = root / "good"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["train", "--run-dir", str(good), *TINY]) == 0
        assert main(["eval", str(good), "--multipliers", "1", "2", "--samples", "2"]) == 0
    finally:
        torch.set_num_threads(before)
    for name, damage in {**RUN_DAMAGES, **EVAL_DAMAGES}.items():
        shutil.copytree(good, root / name)
        damage(root / name, root)
    (root / "a-file").write_text("not a directory")
    (root / "run-dir-a-file").write_text("not a run")
    (root / "run-dir-empty").mkdir()
    return root


def _valid_eval_flags(rng):
    options = [["--samples", "2"], ["--multipliers", "1", "2"], ["--batch-size", "3"], ["--no-progress"],
               ["--seed", "5"], ["--dispersion-samples", "0"], ["--amp", "off"], ["--device", "cpu"],
               ["--max-batch-tokens", "64"], ["--confidence", "0.9"], ["--cpu-max-length", "12"]]
    return [token for flag in rng.sample(options, rng.randint(0, 3)) for token in flag]


BAD_EVAL_FLAGS = [
    ["--samples", "0"], ["--samples", "-3"], ["--samples", "abc"], ["--samples", "1.5"], ["--samples"],
    ["--batch-size", "0"], ["--max-batch-tokens", "0"], ["--confidence", "1"], ["--confidence", "nan"],
    ["--confidence", "inf"], ["--confidence", "-0.1"], ["--multipliers", "0"], ["--multipliers", "-2"],
    ["--multipliers", "nan"], ["--multipliers", "inf"], ["--multipliers", "1e400"], ["--multipliers", "x"],
    ["--multipliers"], ["--multipliers", "1", "0.3"], ["--id-length", "-1"], ["--id-length", "six"],
    ["--seed", "-1"], ["--dispersion-samples", "-1"], ["--dispersion-max-tokens", "-5"],
    ["--cpu-max-length", "-1"], ["--device", "tpu"], ["--device", "cuda"], ["--amp", "fp8"],
    ["--attention-backend", "magic"], ["--bogus"], ["--output"], ["--output", "@a-file/eval"],
    ["--fresh", "--samples", "0"], ["--fresh", "--output", "@eval-a-directory/eval"],
    ["--fresh", "--output", "@eval-md-a-directory/eval"],
]
BAD_TRAIN = [
    [], ["--task", "juggle"], ["--attention", "magic"], ["--steps", "abc"], ["--steps", "0"],
    ["--lr", "-1"], ["--min-length", "9", "--max-length", "4"], ["--d-model", "30", "--n-heads", "4"],
    ["--device", "tpu"], ["--preset", "nope"], ["--bogus"],
]
BAD_DEMO = [["--steps", "0"], ["--steps", "-5"], ["--steps", "abc"], ["--output-dir", "@a-file"],
            ["--output-dir", "@a-file/x"], ["--publish"], ["--bogus"], ["--steps"]]


def _cases():
    """Every damaged run dir under eval (and, for eval.json damage, compare), then seeded random mixes."""
    rng = random.Random(SEED)
    cases = [["eval", f"@{name}"] for name in (*RUN_DAMAGES, *EVAL_DAMAGES, *NOT_A_RUN)]
    cases += [["compare", "@good", f"@{name}", "--output-dir", "@new"] for name in COMPARE_DAMAGES]
    cases += [["train", "--run-dir", f"@checkpoint-{how}", "--resume", "--no-progress"]
              for how in ("truncated", "empty", "random", "planted-code", "missing")]
    cases += [["eval", "@good", *flag] for flag in BAD_EVAL_FLAGS]
    cases += [["train", "--run-dir", "@new", *TINY, *flag] if flag else ["train", *TINY]
              for flag in BAD_TRAIN]
    cases += [["demo", *flag] for flag in BAD_DEMO]
    cases += [[], ["fly"], ["--bogus"], ["eval"], ["compare"], ["compare", "@good"], ["evaluate", "@good"],
              ["compare", "--output-dir", "@new"], ["compare", "@good", "--output-dir", "@a-file"],
              ["compare", "@good", "--output-dir", "@a-file/report"],
              ["eval", "@good", "@good"], ["eval", "@good", "@checkpoint-truncated", "--output", "@new/e"]]
    cases = [case for case in cases if case]  # bare `asentmax` prints the usage: tested in test_cli.py
    all_damage = [*RUN_DAMAGES, *EVAL_DAMAGES, *NOT_A_RUN]
    for _ in range(N_RANDOM):
        kind = rng.choice(["eval-damage", "eval-flag", "compare", "train", "demo"])
        if kind == "eval-damage":
            dirs = rng.sample(["@good", *(f"@{d}" for d in all_damage)], rng.randint(1, 3))
            if dirs == ["@good"]:
                dirs.append(f"@{rng.choice(all_damage)}")
            rng.shuffle(dirs)
            cases.append(["eval", *dirs, *_valid_eval_flags(rng)])
        elif kind == "eval-flag":
            cases.append(["eval", "@good", *_valid_eval_flags(rng), *rng.choice(BAD_EVAL_FLAGS)])
        elif kind == "compare":
            bad = [f"@{d}" for d in rng.sample(COMPARE_DAMAGES, rng.randint(1, 2))]
            dirs = ["@good", *bad]
            rng.shuffle(dirs)
            cases.append(["compare", *dirs, "--output-dir", rng.choice(["@new", "@a-file", "@a-file/sub"])])
        elif kind == "train":
            cases.append(["train", "--run-dir", "@new", *TINY, *rng.choice(BAD_TRAIN[1:])])
        else:
            cases.append(["demo", *rng.choice(BAD_DEMO)])
    return cases


CASES = _cases()


def _resolve(case, root):
    return [str(root / token[1:]) if token.startswith("@") else token for token in case]


def _tree(root):
    """path -> sha256 (files) or 'dir', for everything under root."""
    out = {}
    for path in sorted(root.rglob("*")):
        out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


@pytest.fixture(scope="module")
def tree_before(world):
    return _tree(world)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[" ".join(c)[:60] for c in CASES])
def test_bad_invocation_is_one_line_exit_2_and_changes_nothing(index, world, tree_before, capsys,
                                                               monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "--device cuda" means: no GPU here
    monkeypatch.chdir(world)  # not a checkout: `demo --publish` has nowhere to publish
    argv = _resolve(CASES[index], world)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"exit {code} for {argv}: {err}"
    assert err.count("\n") == 1 and err.startswith("asentmax") and "Traceback" not in err, err
    assert _tree(world) == tree_before


@pytest.mark.parametrize("case", [["eval", "@checkpoint-planted-code"],
                                  ["compare", "@good", "@eval-garbage", "--output-dir", "@new"]])
def test_bad_invocation_in_a_subprocess(case, world, tree_before):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "asentmax", *_resolve(case, world)], capture_output=True,
                            text=True, timeout=180, env=env, cwd=world)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert _tree(world) == tree_before
