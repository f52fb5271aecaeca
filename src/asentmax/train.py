"""The training driver: builds or rebuilds a run's workload and configs and hands them to the one engine,
asentmax.trainer (docs/method.md section 6, reference training).

WORKLOADS maps a workload's name (the "name" in its `to_dict()`, saved in every checkpoint) to the
function that rebuilds it from that dict; a new workload adds one entry here. `resume_run` continues a
run from its checkpoint with the saved configs.

Extending a run: `resume_run(run_dir, steps=N)` with N above the saved total continues to step N. The
schedule does not restart or stretch: the cosine keeps decaying over the steps the run was started with
(TrainConfig.decay_steps is set to them) and the lr then stays at its minimum, min_lr_ratio * lr, for
the added steps; a finished run so continues at the lr it ended with.
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

from asentmax.lm.workload import LMWorkload
from asentmax.runs import CHECKPOINT_NAME, CONFIG_NAME, RunError, load_checkpoint, read_json, write_json
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import TrainConfig, train

WORKLOADS = {TaskWorkload.name: TaskWorkload.from_dict, LMWorkload.name: LMWorkload.from_dict}


def workload_from_dict(values: dict):
    """The workload a checkpoint's "workload" dict describes; ValueError for an unknown one."""
    name = values.get("name") if isinstance(values, dict) else None
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name](values)


class SavedRun(NamedTuple):
    """A run directory's checkpoint and what it rebuilds."""

    checkpoint: dict
    workload: object
    train_config: TrainConfig
    model_config: object


def load_run(run_dir: Path | str) -> SavedRun:
    """The checkpoint of `run_dir` and its workload and configs; RunError (one line) when it is missing,
    damaged, or holds no configuration this version can rebuild."""
    from asentmax.nn import ModelConfig

    path = Path(run_dir) / CHECKPOINT_NAME
    checkpoint = load_checkpoint(path)
    try:
        return SavedRun(checkpoint, workload_from_dict(checkpoint["workload"]),
                        TrainConfig.from_dict(checkpoint["train_config"]),
                        ModelConfig.from_dict(checkpoint["model_config"]))
    except (KeyError, TypeError, ValueError) as error:
        raise RunError(f"{path} holds no usable run configuration ({error}); "
                       "delete it to start again") from None


def extended(train_config: TrainConfig, steps: int, at_step: int) -> TrainConfig:
    """`train_config` continued to `steps` total steps from `at_step` (see the module docstring)."""
    if steps < max(at_step, train_config.steps):
        raise ValueError(f"--steps {steps} is below the run's {train_config.steps} steps (checkpoint at step "
                         f"{at_step}); --resume --steps only extends a run (stop early with --stop-at-step)")
    return replace(train_config, steps=steps, decay_steps=train_config.decay_steps or train_config.steps)


def resume_run(run_dir: Path | str, saved: SavedRun | None = None, *, steps: int | None = None,
               stop_at_step: int | None = None, progress: bool = True) -> dict:
    """Continue the run in `run_dir` from its checkpoint (`saved`, loaded when None), to `steps` total
    steps when given."""
    run_dir = Path(run_dir)
    saved = saved or load_run(run_dir)
    train_config, step = saved.train_config, saved.checkpoint["step"]
    if steps is not None and steps != train_config.steps:
        train_config = extended(train_config, steps, step)
        if int(os.environ.get("RANK", "0")) == 0 and (run_dir / CONFIG_NAME).is_file():
            config = read_json(run_dir / CONFIG_NAME, "run config")
            config.setdefault("extended", []).append({"at_step": step, "steps": steps})
            write_json(run_dir / CONFIG_NAME, {**config, "train_config": asdict(train_config)})
    return train(saved.workload, train_config, saved.model_config, run_dir, checkpoint=saved.checkpoint,
                 stop_at_step=stop_at_step, progress=progress)
