"""Run directories: their layout, config I/O, checkpoints that cannot run code, provenance.

Every driver (training, evaluation, comparison, the demo) reads and writes run directories through this
module and through nothing else, so none of them imports another. A run directory holds:

    config.json      the configs of the run, its git commit, device, command and parameter count
    checkpoint.pt    model, optimizer, schedule, RNG states and step (written atomically)
    log.csv          training log;  val.csv  validation log;  tensorboard/  (optional)
    eval.json / eval.md   evaluation results
    best.pt          (optional) the weights, step and score of the best validation so far, and the configs;
                     eval_best.json / eval_best.md its evaluation
    stalled.json     (only while a stall check has ended the run) that check's record; gone once it continues

Checkpoints are loaded with `torch.load(weights_only=True)`: only tensors and plain containers of
numbers and strings are accepted, so a crafted file cannot run code. RNG states are therefore stored as
tensors and lists (numpy's and python's own state objects are converted on the way in and out).

`load_evaluation` reads an eval.json back (for `asentmax compare` and a continued `asentmax eval`) and
checks that it is shaped like what asentmax.eval writes; `load_stalled` reads a run that a stall check ended
(config.json and stalled.json), which `asentmax compare` counts beside the evaluated runs of its recipe.
`training_loss`, `training_grad_norm` and `validation_exact_match` read log.csv and val.csv back (compare's
training plot, the benchmarks that screen runs by their early validation).

`RunError` is the one exception for a run directory a user can damage (a missing, truncated or foreign
checkpoint; an unreadable config.json or eval.json): its message is one line naming the file and what to do.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pickle
import random
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import torch

CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.pt"
LOG_NAME = "log.csv"
VAL_NAME = "val.csv"
EVAL_NAME = "eval"  # eval.json and eval.md
BEST_NAME = "best.pt"  # the weights of the best validation (a workload's selection_score), when kept
BEST_EVAL_NAME = "eval_best"  # eval_best.json and eval_best.md: `asentmax eval --checkpoint best`
FRESH_TABLES_SUFFIX = "_fresh"  # eval_fresh.*, eval_best_fresh.*: `asentmax eval --tables fresh`
TENSORBOARD_NAME = "tensorboard"
STALLED_NAME = "stalled.json"  # the trainer's summary["stalled"] of a run a stall check ended


def evaluation_name(checkpoint: str = "last", tables: str = "train") -> str:
    """The default name (without .json / .md) of the results of `asentmax eval --checkpoint C --tables T`."""
    return (BEST_EVAL_NAME if checkpoint == "best" else EVAL_NAME) + (FRESH_TABLES_SUFFIX if tables == "fresh"
                                                                       else "")


RUN_FILES = (CONFIG_NAME, CHECKPOINT_NAME, LOG_NAME, VAL_NAME, TENSORBOARD_NAME, BEST_NAME, STALLED_NAME,
             *(evaluation_name(c, t) + ext for c in ("last", "best") for t in ("train", "fresh")
               for ext in (".json", ".md")))


class RunError(ValueError):
    """A run directory (or a file in it) that cannot be used as it is; the message is one line."""


# ---- provenance ----

def git_commit() -> str:
    """HEAD of the repository holding this file (+ '-dirty' with uncommitted changes), or 'unknown'.

    $ASENTMAX_GIT_COMMIT, when set, is returned instead: for a copy of a working tree whose git metadata
    is not its own (e.g. a tree shipped to a remote GPU machine)."""
    if os.environ.get("ASENTMAX_GIT_COMMIT"):
        return os.environ["ASENTMAX_GIT_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


# ---- JSON files ----

def write_text(path: Path | str, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then atomically rename it."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path | str, data: dict) -> None:
    """Write `data` as indented JSON, atomically (write_text)."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def read_json(path: Path | str, what: str = "file") -> dict:
    """A JSON object from `path`; RunError (one line naming the file) when it is missing or not JSON."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"no {what} at {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunError(f"{path} is not a readable JSON {what} ({type(error).__name__}); "
                       "restore or delete it") from None
    if not isinstance(data, dict):
        raise RunError(f"{path} is not a JSON object; restore or delete it")
    return data


# ---- the state of a run directory ----

def _csv_rows(path: Path, columns: tuple[str, ...]) -> list[dict] | None:
    """Rows of a run's CSV log with `columns` as floats, or None when the file is missing, lacks a column
    or holds a row that is not numbers (a log of another tool, a truncated file)."""
    if not path.is_file():
        return None
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not set(columns) <= set(reader.fieldnames):
            return None
        try:
            return [{name: float(row[name]) for name in columns} for row in reader]
        except (TypeError, ValueError):
            return None


def training_loss(run_dir: Path | str) -> list[tuple[int, float]]:
    """[(step, loss)] of a run's log.csv in its order; [] where it has none that can be read."""
    rows = _csv_rows(Path(run_dir) / LOG_NAME, ("step", "loss")) or []
    return [(int(row["step"]), row["loss"]) for row in rows]


def training_grad_norm(run_dir: Path | str) -> list[tuple[int, float]]:
    """[(step, grad_norm)] of a run's log.csv (the mean pre-clipping gradient norm of each log window) in its
    order, leaving out the windows whose norm is unknown (nan: the first window after a resume from a
    checkpoint that predates the column); [] where the log has no such column."""
    rows = _csv_rows(Path(run_dir) / LOG_NAME, ("step", "grad_norm")) or []
    return [(int(row["step"]), row["grad_norm"]) for row in rows if math.isfinite(row["grad_norm"])]


def validation_exact_match(run_dir: Path | str) -> dict[tuple[int, int], float]:
    """{(step, length): exact match (0-1)} of a run's val.csv in its order; {} where it has none that can be
    read."""
    rows = _csv_rows(Path(run_dir) / VAL_NAME, ("step", "length", "exact_match")) or []
    return {(int(row["step"]), int(row["length"])): row["exact_match"] for row in rows}


def restartable(run_dir: Path | str) -> bool:
    """True for a run directory without a checkpoint that holds only what a run writes before its first
    checkpoint (a config.json of asentmax, the logs, tensorboard/): starting it again loses nothing."""
    run_dir = Path(run_dir)
    if (run_dir / CHECKPOINT_NAME).exists() or not all(p.name in RUN_FILES for p in run_dir.iterdir()):
        return False
    if not (run_dir / CONFIG_NAME).exists():
        return True
    try:
        return "train_config" in read_json(run_dir / CONFIG_NAME)
    except RunError:
        return False


def clear_run_files(run_dir: Path | str) -> None:
    """Delete the files a run writes (RUN_FILES) from `run_dir`; other files stay."""
    for name in RUN_FILES:
        target = Path(run_dir) / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


# ---- evaluation results (eval.json, written by asentmax.eval) ----

def format_multiplier(m: float) -> str:
    """A length multiplier as the tables write it: 1x, 1.5x, 1024x."""
    return f"{m:g}x"


def check_distinct_runs(run_dirs) -> None:
    """RunError (one line) when a command is given the same run twice (paths that resolve alike)."""
    if len({Path(d).resolve() for d in run_dirs}) < len(run_dirs):
        raise RunError("a run is given twice")


def planned_end(train_config: dict | None, escape_step: int | None) -> int | None:
    """The step a run's training was to end at: its --steps, or escape_step + --steps-after-escape where that
    comes first (the trainer ends it there); None when the config does not say."""
    config = train_config or {}
    steps, after = config.get("steps"), config.get("steps_after_escape") or 0
    if after and isinstance(escape_step, int) and isinstance(steps, int):
        return min(steps, escape_step + after)
    return steps


def training_cut(result: dict) -> tuple[int, int] | None:
    """(step, planned steps) of an evaluated run whose training stopped before its planned end (Ctrl-C, a
    time limit, --stop-at-step), None when it finished or the file does not say: the step of its
    checkpoint.pt against planned_end of its train_config and escape_step, which for an evaluation of
    best.pt (whose own train_step is the best validation's) are its `last_checkpoint` record."""
    if result.get("eval_config", {}).get("checkpoint") == "best":
        last = result.get("last_checkpoint") or {}
        step, planned = last.get("step"), last.get("steps")
    else:
        step, planned = result.get("train_step"), planned_end(result.get("train_config"),
                                                               result.get("escape_step"))
    ints = all(isinstance(n, int) and not isinstance(n, bool) for n in (step, planned))
    return (step, planned) if ints and step < planned else None


def samples_trained(step, train_config: dict | None, prior_samples: int = 0) -> int | None:
    """Training samples behind weights at `step` of a run: step x its batch size, plus prior_samples (those
    its --init-from weights had been trained on); None when the step or the batch size is unknown."""
    batch = (train_config or {}).get("batch_size")
    if not (isinstance(step, int) and isinstance(batch, int)):
        return None
    return step * batch + prior_samples


# what a checkpoint keeps of the run that trained its weights, as a run started from them keeps it
PRIOR_RECIPE_FIELDS = ("train_config", "workload", "model_config", "prior_samples", "prior_recipe")


def prior_recipe(checkpoint: dict) -> dict:
    """The recipe behind a checkpoint's weights: the configs of the run that trained them and that run's own
    prior_samples and prior_recipe (so a chain of --init-from starts nests). A run started from them keeps
    it as "prior_recipe" in config.json, its checkpoints and its evaluations (with "fresh_parameters" added:
    the names it drew afresh, --init-fresh), where `asentmax compare` takes it for the start's sample count:
    with --steps-after-escape a start's length varies by seed, its rule does not."""
    return {key: checkpoint[key] for key in PRIOR_RECIPE_FIELDS if checkpoint.get(key) is not None}


STALLED_EXIT = 3  # exit code of a training that a stall check ended (TrainConfig.stall_checks)
INTERRUPTED_EXIT = 130  # exit code of a training that SIGINT or SIGTERM ended, with a checkpoint


def stall_reason(stalled: dict) -> str:
    """What the stall check that ended a run found, in one line, from its record (the trainer's
    summary["stalled"], a run's stalled.json)."""
    if "stall_val_step" in stalled:
        return (f"validation score {stalled['score']:.4g} at step {stalled['step']}, below --stall-val-step "
                f"{stalled['stall_val_step']} --stall-val-score {stalled['stall_val_score']:g}")
    return (f"no training loss below --stall-loss {stalled['stall_loss']:g} by step {stalled['step']} "
            f"(--stall-step {stalled['stall_step']}; lowest logged loss {stalled['lowest_loss']:.4f})")


def training_stop(summary: dict, run_dir: Path | str, resume_command: str) -> tuple[int, str] | None:
    """(exit code, one line for stderr) of a training that a stall check or a signal ended, from the summary
    of asentmax.trainer.train; None for one that ran to its planned end or its --stop-at-step. Both CLIs'
    train commands (asentmax train, asentmax lm train) end that way, so a shell loop or a scheduler can tell
    a finished run from a stopped one; `resume_command` continues the run."""
    checkpoint = Path(run_dir) / CHECKPOINT_NAME
    stalled = summary.get("stalled")
    if stalled:
        plateau = "" if "stall_val_step" in stalled else ": the run is on a loss plateau"
        return STALLED_EXIT, (
            f"stalled: {stall_reason(stalled)}{plateau}. {checkpoint} holds step {stalled['step']}; start "
            f"again with another --seed, or continue with: {resume_command}")
    if summary.get("interrupted"):
        return INTERRUPTED_EXIT, (
            f"interrupted ({summary['interrupted']}) at step {summary['step']}; {checkpoint} holds step "
            f"{summary['checkpoint_step']}. Resume with: {resume_command}")
    return None


def run_name(result: dict) -> str:
    """The run directory's name, with ", best.pt" for an evaluation of its best-validation weights,
    ", fresh tables" for one on new word tables (`asentmax eval --tables fresh`) and ", cut at S of N steps"
    for a run whose training stopped short (training_cut)."""
    config = result.get("eval_config", {})
    cut = training_cut(result)
    return (Path(result["run_dir"]).name + (", best.pt" if config.get("checkpoint") == "best" else "")
            + (", fresh tables" if config.get("tables") == "fresh" else "")
            + (f", cut at {cut[0]} of {cut[1]} steps" if cut else ""))


def saved_layout(workload: dict) -> str:
    """The sample layout of a saved task workload record (config.json, a checkpoint, eval.json): its
    `layout`, or "random", the only layout there was, for a run saved before the option existed."""
    return workload.get("layout", "random")


def saved_evaluation(eval_config: dict) -> dict:
    """An evaluation record's settings (eval.json's eval_config) with those added since the first evaluations
    at the values they had in effect before: the last step's checkpoint and the run's word tables."""
    return {"checkpoint": "last", "tables": "train", **eval_config}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _evaluation_problem(data: dict) -> str | None:
    """What makes `data` unusable as an evaluation result (None when it is usable)."""
    if not isinstance(data.get("task"), str) or not isinstance(data.get("run_dir"), str):
        return "no task or run_dir"
    if not (isinstance(data.get("id_length"), int) and data["id_length"] > 0):
        return "no positive id_length"
    model_config = data.get("model_config")
    if not (isinstance(model_config, dict) and isinstance(model_config.get("attention"), str)):
        return "no model_config.attention"
    if not isinstance(data.get("rows"), list):
        return "no rows"
    for row in data["rows"]:
        if not isinstance(row, dict) or not all(_number(row.get(k)) for k in (
                "length", "n", "n_exact", "exact_match", "token_accuracy", "ci_low", "ci_high")):
            return "a row without length, n, n_exact, exact_match, token_accuracy, ci_low, ci_high"
        if not (row["length"] > 0 and row["n"] > 0 and 0 <= row["exact_match"] <= 1):
            return f"an impossible row at length {row['length']}"
        by_sample = row.get("exact_by_sample")
        if by_sample is not None and not (isinstance(by_sample, list) and len(by_sample) == row["n"]
                                          and all(v in (0, 1) for v in by_sample)
                                          and sum(by_sample) == row["n_exact"]):
            return f"an exact_by_sample at length {row['length']} that is not n 0/1 values summing to n_exact"
        if "test_set_digest" in row and not isinstance(row["test_set_digest"], str):
            return f"a test_set_digest at length {row['length']} that is not a string"
        dispersion = row.get("dispersion")
        if dispersion is not None and not (isinstance(dispersion, dict) and all(
                _number(dispersion.get(k)) for k in ("normalised_entropy", "support_size"))):
            return f"unreadable dispersion at length {row['length']}"
    return None


def load_evaluation(path: Path | str) -> dict:
    """An evaluation result (eval.json, or a run directory holding one); RunError (one line naming the
    file) when it is missing, not JSON or not shaped like what `asentmax eval` writes. Read from a run
    directory, or from a file in one (beside its config.json: eval_best.json, eval_fresh.json), its run_dir
    is that directory, so a run copied or moved since it was evaluated is named where it is; a file
    elsewhere (`eval --output`) keeps its recorded run_dir."""
    path = Path(path)
    run_dir = None
    if path.suffix != ".json":
        run_dir, path = path, path / f"{EVAL_NAME}.json"
    elif (path.parent / CONFIG_NAME).is_file():
        run_dir = path.parent
    if not path.exists():
        raise RunError(f"no evaluation at {path} (run `asentmax eval` first)")
    data = read_json(path, "evaluation")
    problem = _evaluation_problem(data)
    if problem:
        raise RunError(f"{path} is not an asentmax evaluation ({problem}); re-run `asentmax eval --fresh`")
    return data if run_dir is None else {**data, "run_dir": str(run_dir)}


def stalled_unevaluated(path: Path | str) -> bool:
    """Whether `path` is a run directory that a stall check ended (stalled.json) and that holds no
    evaluation: what `asentmax compare` reads with load_stalled instead of load_evaluation."""
    path = Path(path)
    return (path / STALLED_NAME).is_file() and not (path / f"{EVAL_NAME}.json").exists()


def load_stalled(run_dir: Path | str) -> dict:
    """A run that a stall check ended, as `asentmax compare` counts it: run_dir, task, the configs,
    prior_samples and prior_recipe of its config.json and its stalled.json record as "stalled"; RunError (one
    line naming the file) when either file is missing or not what training writes."""
    run_dir = Path(run_dir)
    stalled = read_json(run_dir / STALLED_NAME, "stall record")
    config = read_json(run_dir / CONFIG_NAME, "run config")
    checks = "stall_val_step" in stalled or "stall_step" in stalled
    if not (isinstance(stalled.get("step"), int) and checks):
        raise RunError(f"{run_dir / STALLED_NAME} is not a stall record of asentmax training; restore or "
                       "delete it")
    if not all(isinstance(config.get(key), dict) for key in ("train_config", "model_config", "workload")):
        raise RunError(f"{run_dir / CONFIG_NAME} has no training configs; restore it")
    return {"run_dir": str(run_dir), "task": config["workload"].get("task"),
            **{key: config[key] for key in ("train_config", "model_config", "workload")},
            "prior_samples": config.get("prior_samples") or 0, "prior_recipe": config.get("prior_recipe"),
            "stalled": stalled}


# ---- checkpoints ----

def save_checkpoint(path: Path | str, state: dict) -> None:
    """Write `state` with torch.save to a temporary file beside `path`, then atomically rename it."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path | str, map_location="cpu") -> dict:
    """The checkpoint at `path`, loaded with weights_only=True (no code in the file can run).

    Raises RunError with one line for a missing, truncated, corrupt or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError,
            AttributeError, TypeError, KeyError, IndexError) as error:
        if re.search(r"unsupported (global|class)", str(error), re.IGNORECASE):
            reason = "it holds objects other than tensors and plain data: refused, nothing in it ran"
        elif isinstance(error, (pickle.UnpicklingError, EOFError, zipfile.BadZipFile)) \
                or "PytorchStreamReader" in str(error):
            reason = "truncated, or not a torch checkpoint file"
        else:
            reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise RunError(f"{path} is not a loadable asentmax checkpoint ({reason}); "
                       "delete it to start the run again") from None
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise RunError(f"{path} is not an asentmax checkpoint (no model or step); delete it to start again")
    return state


# ---- RNG states as tensors and lists (loadable with weights_only=True) ----

def rng_state() -> dict:
    """torch, numpy, python (and visible CUDA) RNG states in a form torch.load(weights_only=True) accepts."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "python": [version, list(internal), gauss_next]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["key"].numpy().astype(np.uint32),
                         numpy_state["pos"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        # a checkpoint from a host with more GPUs (a 2-GPU run resumed on 1 GPU) restores the visible ones
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
