"""The `asentmax` command line: train, eval, compare, demo (the synthetic tasks of arXiv:2506.16640).

Flags are derived from the config dataclasses (TrainConfig, asentmax.nn.ModelConfig, EvalConfig):
one kebab-case flag per field, help text from the field's metadata. A flag that is not given keeps the
preset's value, so `asentmax train --preset mqmtar --attention asentmax` changes only the attention.

Every problem a user can cause (a bad flag, impossible lengths, a missing, truncated or foreign
checkpoint, an unreadable config.json or eval.json, a missing GPU, an existing run directory) is
reported as one line on stderr with exit code 2, before anything is written. Bare `asentmax` prints the
usage and the commands on stderr, exit 2 (no command was run); Ctrl-C ends with one line, exit 130.
`asentmax train --stall-step S` (and `asentmax lm train`) ends a run still on a loss plateau at step S with
one line, exit 3 (runs.STALLED_EXIT), so a shell loop over seeds can start the next one; a run a signal
ended exits 130 (runs.INTERRUPTED_EXIT).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import types
import typing
from pathlib import Path


class UsageError(Exception):
    """A problem with the command line: reported on one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage dump), exit code 2."""

    def error(self, message: str):
        raise UsageError(message)


def _flag_type(hint):
    """(argparse type, nargs, choices) for a dataclass field's type hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _flag_type(inner[0]) if len(inner) == 1 else (str, None, None)
    if origin is typing.Literal:
        return type(args[0]), None, list(args)
    if origin in (tuple, list):
        return args[0], "+", None
    return hint, None, None


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_flags(parser, cls, *, skip=(), choices: dict | None = None, defaults_note: str | None = None,
                     defaults: dict | None = None):
    """One flag per field of dataclass `cls` (`choices` maps field names to allowed values, `defaults` to
    the default the help shows where it is not the field's own, e.g. a preset's); absent flags stay out of
    the namespace. Returns the field names."""
    group = parser.add_argument_group(f"{cls.__name__} options")
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        kind, nargs, allowed = _flag_type(hints[f.name])
        allowed = list((choices or {}).get(f.name, allowed) or []) or None
        if kind is bool:
            kind = _parse_bool
        elif kind is float:
            kind = _finite_float
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = (defaults or {}).get(f.name, f.metadata.get("default_help", default))
        note = defaults_note or f"default: {shown}"
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, nargs=nargs,
                           choices=allowed, default=argparse.SUPPRESS,
                           metavar=None if allowed else f.name.upper(),
                           help=f"{f.metadata.get('help', f.name.replace('_', ' '))} ({note})")
        names.append(f.name)
    return names


def _given(args, names) -> dict:
    """The config fields given on the command line (lists from nargs='+' become tuples)."""
    given = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return {name: tuple(value) if isinstance(value, list) else value for name, value in given.items()}


# ---- train ----

TRAIN_EPILOG = ("`asentmax train --preset sort --help` lists the sort preset's values. --resume continues "
                "a run from its checkpoint; --resume --steps N extends a (finished) run to N steps with the "
                "lr at its minimum after the original steps. Ctrl-C (SIGINT) or SIGTERM saves a checkpoint "
                "at the current step and exits with code 130.")


def _preset_values(preset: str) -> dict:
    """Every train, workload and model field's value under the preset of task `preset` (model fields of
    a task without a model preset: ModelConfig's defaults, the architecture marked 'required')."""
    from asentmax.nn import ModelConfig
    from asentmax.tasks.workload import ARCHITECTURE_FIELDS, TaskWorkload
    from asentmax.trainer import TrainConfig

    workload = TaskWorkload(task=preset)
    values = {**dataclasses.asdict(TrainConfig(**workload.train_preset())), **workload.to_dict()}
    try:
        model = workload.model_config().to_dict()
    except ValueError:
        model = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
        model.update({name: "required (no model preset)" for name in ARCHITECTURE_FIELDS})
    return {**model, **values}


def _describe_preset(parser, preset: str) -> None:
    """Set each config flag's help to its field help and the value under `preset`."""
    values = _preset_values(preset)
    for action in parser._actions:
        base = getattr(action, "field_help", None)
        if base is not None:
            value = values.get(action.dest)
            shown = (" ".join(map(str, value)) or "none") if isinstance(value, (tuple, list)) else value
            action.help = f"{base} (default: {shown}, from the {preset} preset)"


class _PresetAction(argparse.Action):
    """Stores the preset (or task) name and shows its values in a later --help."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, value)
        _describe_preset(parser, value)


def _train_parser(sub):
    from asentmax.nn import ModelConfig, config
    from asentmax.precision import AMP_MODES
    from asentmax.tasks import TASK_NAMES
    from asentmax.tasks.mqmtar import LAYOUTS
    from asentmax.tasks.workload import TaskWorkload
    from asentmax.trainer import TrainConfig

    p = sub.add_parser("train", help="train a model on a synthetic task", epilog=TRAIN_EPILOG, description=(
        "Train a model on a synthetic task. Flags not given keep the preset's values "
        "(--preset, else the preset of --task, else copy)."))
    p.add_argument("--run-dir", required=True, type=Path,
                   help="output directory (refused if it holds another run's checkpoint or other files)")
    p.add_argument("--preset", choices=TASK_NAMES, action=_PresetAction,
                   help="the task's training and model preset; put it before --help to see its values")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --run-dir")
    p.add_argument("--stop-at-step", type=int, help="stop (with a checkpoint) after this many steps")
    p.add_argument("--init-from", type=Path, metavar="CHECKPOINT", help=(
        "start a new run from another run's weights (its run directory, for its checkpoint.pt, or a .pt file "
        "such as its best.pt) with a fresh optimizer and schedule, e.g. a second, lower cosine after a "
        "first run; the model flags must give the same architecture, except for the attention normaliser: "
        "another normaliser's weights start the shared parameters, and the length-aware temperature's keep "
        "their init (e.g. softmax's weights for an ASEntmax run)"))
    p.add_argument("--init-fresh", nargs="+", metavar="PATTERN", help=(
        "with --init-from: parameters whose names match one of these fnmatch patterns (e.g. '*.attn.wq.*' "
        "'*.attn.wk.*'; names look like blocks.0.attn.wq.weight) are not taken from its weights but keep "
        "this run's own draw from --seed, e.g. an ASEntmax run on MQMTAR from softmax's weights that learns "
        "its own attention (query and key projections re-initialised); config.json's init_from lists them "
        "as \"fresh\", and `asentmax compare` counts them in the run's recipe"))
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--task", choices=TASK_NAMES, action=_PresetAction, default=argparse.SUPPRESS,
                   help="synthetic task (its preset applies unless --preset is given)")
    workload_names = ["task"] + add_config_flags(p, TaskWorkload, skip=("task",), choices={"layout": LAYOUTS})
    train_choices = {"device": ("auto", "cpu", "cuda"), "amp": AMP_MODES}
    train_names = add_config_flags(p, TrainConfig, choices=train_choices)
    model_names = add_config_flags(p, ModelConfig, skip=("vocab_size",) + tuple(train_names + workload_names),
                                   choices=config.CHOICES)
    field_help = {f.name: f.metadata.get("help", f.name.replace("_", " "))
                  for cls in (TaskWorkload, TrainConfig, ModelConfig) for f in dataclasses.fields(cls)}
    for action in p._actions:
        if action.dest in field_help and action.dest != "task":
            action.field_help = field_help[action.dest]
    _describe_preset(p, "copy")
    p.set_defaults(run=_run_train, train_names=train_names, workload_names=workload_names,
                   model_names=model_names)


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible on this machine; use --device cpu or auto")


def _main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _run_train(args) -> None:
    from asentmax.runs import RunError
    from asentmax.trainer import NonFiniteLoss, train

    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise UsageError(f"--stop-at-step must be >= 1, got {args.stop_at_step}")
    if args.resume and args.init_from is not None:
        raise UsageError("--init-from starts a new run; --resume continues one with its own weights")
    if args.init_fresh and args.init_from is None:
        raise UsageError("--init-fresh names parameters of the --init-from weights; give --init-from too")
    try:
        if args.resume:
            from asentmax.train import resume_run

            saved, steps = _saved_run(args)
            summary = resume_run(args.run_dir, saved, steps=steps, stop_at_step=args.stop_at_step,
                                 progress=not args.no_progress)
        else:
            workload, train_config, model_config, initial_weights = _new_run(args)
            summary = train(workload, train_config, model_config, args.run_dir,
                            stop_at_step=args.stop_at_step, progress=not args.no_progress,
                            initial_weights=initial_weights)
    except (RunError, NonFiniteLoss) as error:
        raise UsageError(str(error)) from None
    _report_training(summary, args.run_dir)


def _world_size() -> int:
    """Processes torchrun launched (1 without it)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _check_world(train_config) -> None:
    world_size = _world_size()
    if train_config.batch_size % world_size:
        raise UsageError(f"--batch-size {train_config.batch_size} is not divisible by {world_size} processes")


def _saved_run(args):
    """The checkpoint of --run-dir to resume and the --steps to extend it to (None: keep its steps)."""
    from asentmax.runs import CHECKPOINT_NAME
    from asentmax.train import extended, load_run
    from asentmax.trainer import check_attention_backend, check_cuda_graphs

    train_overrides = _given(args, args.train_names)
    steps = train_overrides.pop("steps", None)
    if train_overrides or _given(args, args.model_names) or _given(args, args.workload_names) or args.preset:
        raise UsageError("--resume continues with the saved configuration; drop the config flags "
                         "(only --steps may be given, to extend the run)")
    if not (args.run_dir / CHECKPOINT_NAME).is_file():
        raise UsageError(f"no checkpoint to resume at {args.run_dir / CHECKPOINT_NAME}; run the command "
                         "without --resume to start the run")
    saved = load_run(args.run_dir)
    _check_device(saved.train_config.device)
    _check_world(saved.train_config)
    try:
        saved.train_config.validate()
        check_attention_backend(saved.train_config, saved.model_config)
        check_cuda_graphs(saved.train_config, saved.model_config, _world_size())
    except ValueError as error:
        raise UsageError(f"{error} (the run's saved configuration)") from None
    if steps is not None and steps != saved.train_config.steps:
        try:
            extended(saved.train_config, steps, saved.checkpoint["step"])
        except ValueError as error:
            raise UsageError(str(error)) from None
    return saved, steps


def _initial_weights(path: Path, model_config, fresh_patterns=()) -> tuple[dict, dict]:
    """(model state dict, {"path", "step", "samples", "recipe", "git_commit"[, "attention"][, "fresh"]}) of
    the checkpoint --init-from names (a run directory: its checkpoint.pt; samples: those its weights were
    trained on, its own step x batch size plus its prior_samples, None if unknown; recipe: runs.prior_recipe);
    UsageError in one line for a missing or unreadable one, or one whose model differs from `model_config`
    (naming the fields). A checkpoint of another normaliser (e.g. softmax's weights for an ASEntmax run: a
    dense start) may differ in the normaliser's own fields (nn/config.py NORMALISER_FIELDS); its record then
    names that normaliser. "fresh": the sorted names of its parameters that match a pattern of
    `fresh_patterns` (--init-fresh), with those tied to them (the tied head), which the run draws afresh
    (trainer.load_initial_weights); UsageError for a pattern that matches none, or patterns that take all."""
    from asentmax.nn import ModelConfig
    from asentmax.runs import CHECKPOINT_NAME, RunError, load_checkpoint, prior_recipe, samples_trained

    file = path / CHECKPOINT_NAME if path.is_dir() else path
    if not file.is_file():
        raise UsageError(f"--init-from {path}: no checkpoint at {file}")
    try:
        checkpoint = load_checkpoint(file)
        saved = ModelConfig.from_dict(checkpoint["model_config"])
    except RunError as error:
        raise UsageError(f"--init-from: {error}") from None
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"--init-from {file}: not a checkpoint of a model this version can build") from None
    differ = model_config.init_from_differences(saved)
    if differ:
        raise UsageError(f"--init-from {file}: its model differs in {', '.join(differ)}; give the model "
                         "flags of that run (only the attention normaliser's own fields may differ)")
    samples = samples_trained(checkpoint.get("step"), checkpoint.get("train_config"),
                              checkpoint.get("prior_samples", 0))
    record = {"path": str(file), "step": checkpoint.get("step"), "samples": samples,
              "recipe": prior_recipe(checkpoint), "git_commit": checkpoint.get("git_commit")}
    other_normaliser = saved.attention != model_config.attention
    fresh = _fresh_names(checkpoint["model"], fresh_patterns, file, model_config) if fresh_patterns else []
    return checkpoint["model"], {**record, **({"attention": saved.attention} if other_normaliser else {}),
                                 **({"fresh": fresh} if fresh else {})}


def _fresh_names(weights: dict, patterns, file: Path, model_config) -> list[str]:
    """The sorted names of `weights` that match one of the fnmatch `patterns` (--init-fresh) or share a tensor
    with one that does (a tied head and embedding); UsageError for a pattern that matches no name, or
    patterns that take every one the model of `model_config` would load (another normaliser's temperature
    parameters are never loaded: trainer.load_initial_weights)."""
    import fnmatch

    import torch

    from asentmax.nn import Transformer

    with torch.device("meta"):  # the model's parameter names, without allocating or drawing its weights
        own = set(Transformer(model_config).state_dict())
    names = list(weights)
    fresh = set()
    for pattern in patterns:
        matched = fnmatch.filter(names, pattern)
        if not matched:
            raise UsageError(f"--init-fresh {pattern!r} matches no parameter of {file} (its names are like "
                             f"{', '.join(names[:3])})")
        fresh.update(matched)
    tied = {weights[name].data_ptr() for name in fresh if weights[name].numel()}
    fresh.update(name for name in names if weights[name].numel() and weights[name].data_ptr() in tied)
    if own & set(names) <= fresh:
        raise UsageError(f"--init-fresh {' '.join(patterns)} takes every parameter of {file}; train without "
                         "--init-from instead")
    return sorted(fresh)


def _new_run(args):
    """(workload, TrainConfig, ModelConfig, initial weights or None) of the flags, checked, with --run-dir
    ready for them."""
    from asentmax.tasks import get_task
    from asentmax.tasks.workload import TaskWorkload
    from asentmax.trainer import TrainConfig, check_attention_backend, check_cuda_graphs, check_stall_val

    run_dir: Path = args.run_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"run dir {run_dir} is a file")
    workload_overrides = _given(args, args.workload_names)
    preset = args.preset or workload_overrides.get("task", "copy")
    try:
        workload = TaskWorkload(**{"task": preset, **workload_overrides})
        train_config = TrainConfig(**{**get_task(preset).train_preset, **_given(args, args.train_names)})
        train_config.validate()
        model_overrides = _given(args, args.model_names)
        model_config = workload.model_config(model_overrides)
        check_normaliser_flags(model_config.attention, model_overrides)
        workload.check_model(model_config)
        check_stall_val(train_config, workload)
        check_attention_backend(train_config, model_config)
        check_cuda_graphs(train_config, model_config, _world_size())
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from None
    _check_device(train_config.device)
    _check_world(train_config)
    initial_weights = (None if args.init_from is None else
                       _initial_weights(args.init_from, model_config, args.init_fresh or ()))
    _prepare_run_dir(run_dir, args.overwrite)
    if train_config.warmup_steps > train_config.steps and _main_rank():
        print(f"warning: --warmup-steps {train_config.warmup_steps} > --steps {train_config.steps}: the lr "
              f"rises for the whole run and peaks at "
              f"{train_config.lr * train_config.steps / train_config.warmup_steps:.3g}, not --lr "
              f"{train_config.lr:g}", file=sys.stderr)
    return workload, train_config, model_config, initial_weights


def check_normaliser_flags(attention: str, given: dict) -> None:
    """UsageError when the user gave a flag of nn/normalisers.py PARAMETERS (--alpha, --topk-k, the
    temperature options; `given`: the parsed flags) for a normaliser that does not read it; a preset's value
    is not the user's and passes.
    benchmarks/reproduce_paper.py checks its --train-flags for every method with it."""
    from asentmax.nn.normalisers import NORMALISERS, PARAMETERS, get_normaliser

    for name in PARAMETERS:
        if name in given and not get_normaliser(attention).reads(name):
            flag = f"--{name.replace('_', '-')}"
            readers = " or ".join(n.name for n in NORMALISERS if n.reads(name))
            raise UsageError(f"{flag} has no effect with --attention {attention} (only {readers} reads it); "
                             f"drop {flag}")


def _prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Refuse a run dir holding a run or other files; clear one the user overwrites or that can restart
    (asentmax.runs.restartable: no checkpoint, only files a run writes before its first one)."""
    from asentmax.runs import CHECKPOINT_NAME, clear_run_files, restartable

    try:
        if run_dir.is_dir() and any(run_dir.iterdir()):
            if not overwrite:
                if (run_dir / CHECKPOINT_NAME).is_file():
                    raise UsageError(f"run dir {run_dir} holds a checkpoint; pass --resume to continue it or "
                                     "--overwrite to replace it")
                if not restartable(run_dir):
                    raise UsageError(f"run dir {run_dir} exists and is not empty; pass --resume or "
                                     "--overwrite")
                if _main_rank():
                    print(f"run dir {run_dir} holds no checkpoint: starting it again", file=sys.stderr)
            if _main_rank():
                clear_run_files(run_dir)
        if _main_rank():
            run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot use run dir {run_dir}: {error.strerror or error}") from None


def _report_training(summary: dict, run_dir: Path) -> None:
    from asentmax.runs import training_stop

    stop = training_stop(summary, run_dir, f"asentmax train --run-dir {run_dir} --resume")
    if stop is not None:
        if _main_rank():
            print(stop[1], file=sys.stderr)
        raise SystemExit(stop[0])
    if not _main_rank():
        return
    escape = (f"left the loss plateau at step {summary['escape_step']} and ended "
              f"{summary['step'] - summary['escape_step']} steps later (--steps-after-escape)"
              if summary.get("ended_after_escape") else None)
    if summary["step"] == summary["start_step"] and escape:
        print(f"run {run_dir} {escape}; nothing to do")
        return
    if summary["step"] == summary["start_step"] and summary["step"] >= summary["total_steps"]:
        print(f"run {run_dir} is already at step {summary['step']}, its last step; extend it with "
              f"`asentmax train --run-dir {run_dir} --resume --steps N` (N > {summary['step']})")
        return
    if summary["step"] == summary["start_step"]:
        print(f"run {run_dir} is at step {summary['step']} already (--stop-at-step); nothing to do")
        return
    loss = "no log step yet" if summary["loss"] is None else f"last loss {summary['loss']:.4g}"
    print(f"at step {summary['step']} after {summary['elapsed_s']:.1f}s in this process, {loss}; "
          f"run dir {summary['run_dir']}" + (f" ({escape})" if escape else ""))


# ---- eval ----

def _eval_parser(sub):
    from asentmax.eval import CHOICES, EvalConfig
    from asentmax.ops.types import BACKENDS

    p = sub.add_parser("eval", help="exact match per length multiplier of trained runs", description=(
        "Greedy-decode fixed test sets at each length multiplier; writes <run-dir>/eval.json and eval.md "
        "(eval_best.* with --checkpoint best, a _fresh suffix with --tables fresh; or --output) after every "
        "length. A re-run continues where the last one stopped (same checkpoint and settings); the default "
        "multipliers are the task's table's in the paper, on the CPU only up to --cpu-max-length tokens; a "
        "length estimated to take over a minute is announced with its estimate, a first length above 1x as "
        "having none."))
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding checkpoint.pt")
    p.add_argument("--output", type=Path, help="output path prefix (one run dir only)")
    p.add_argument("--fresh", action="store_true",
                   help="replace an earlier eval.json instead of continuing it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    names = add_config_flags(p, EvalConfig, choices={**CHOICES, "attention_backend": BACKENDS})
    p.set_defaults(run=_run_eval, eval_names=names)


def _run_eval(args) -> None:
    from asentmax.eval import EvalConfig, plan_evaluation, print_note, run_evaluation
    from asentmax.runs import check_distinct_runs

    if args.output is not None and len(args.run_dirs) > 1:
        raise UsageError("--output needs exactly one run dir")
    check_distinct_runs(args.run_dirs)
    try:
        config = EvalConfig(**_given(args, args.eval_names))
        plans = [plan_evaluation(run_dir, config, args.output, fresh=args.fresh) for run_dir in args.run_dirs]
    except (ValueError, TypeError) as error:  # RunError is a ValueError
        raise UsageError(str(error)) from error
    for plan in plans:
        print(f"evaluating {plan.run_dir} at lengths {', '.join(map(str, plan.lengths))}", flush=True)
        for note in plan.notes:
            print_note(note)
        try:
            result = run_evaluation(plan, progress=not args.no_progress)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted; the finished lengths are in {plan.output}.json, the same "
                              "command continues from there") from None
        print(f"wrote {plan.output}.json ({len(result['rows'])} lengths)")


# ---- compare ----

def _compare_parser(sub):
    p = sub.add_parser("compare", help="several evaluated runs into one table and plots",
                       description="Markdown table (with the paper's numbers), accuracy-vs-length and "
                                   "attention-dispersion plots from evaluated run directories.")
    p.add_argument("run_dirs", nargs="+", type=Path,
                   help="run directories holding eval.json (or an eval_*.json file of one); a run directory "
                        "that a stall check stopped (stalled.json, no eval.json) is counted with the runs of "
                        "its recipe")
    p.add_argument("--output-dir", type=Path, required=True, help="where compare.md and the PNGs go")
    p.set_defaults(run=_run_compare)


def _writable_dir(path: Path, flag: str) -> None:
    """UsageError unless `path` is a directory, or can be made one, that this process can write."""
    existing = next(p for p in (path, *path.parents) if p.exists())  # "." or "/" at the latest
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {existing} is not writable")


def _run_compare(args) -> None:
    from asentmax.report import compare_runs
    from asentmax.runs import check_distinct_runs

    _writable_dir(args.output_dir, "--output-dir")
    check_distinct_runs(args.run_dirs)
    print(compare_runs(args.run_dirs, args.output_dir))  # RunError (one line) for an unusable eval.json


# ---- demo ----

def _demo_parser(sub):
    from asentmax.demo import DEFAULT_OUTPUT, PUBLISHED_DIR

    p = sub.add_parser("demo", help="train softmax and ASEntmax on CPU and compare them (~2 min)",
                       description="The `make demo` run: see asentmax.demo. Writes to an ignored directory "
                                   "unless told otherwise; --publish also refreshes the committed evidence.")
    p.add_argument("--output-dir", type=Path, default=Path(DEFAULT_OUTPUT), help=f"default: {DEFAULT_OUTPUT}")
    p.add_argument("--steps", type=int, help="training steps per model (default: the demo's)")
    p.add_argument("--publish", action="store_true",
                   help=f"then copy the results to {PUBLISHED_DIR} and rewrite README.md's demo table (run "
                        "from the repository root; `make demo-results`)")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> None:
    from asentmax.demo import check_publish_target, run_demo

    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    _writable_dir(args.output_dir, "--output-dir")
    try:
        if args.publish:
            check_publish_target(Path.cwd())
    except ValueError as error:
        raise UsageError(str(error)) from error
    run_demo(args.output_dir, steps=args.steps, publish_root=Path.cwd() if args.publish else None)


class Interrupted(Exception):
    """Ctrl-C, handled: its message (one line) is printed and the exit code is 130."""


def build_parser() -> Parser:
    from asentmax import __version__

    parser = Parser(prog="asentmax",
                    description="ASEntmax length-generalisation experiments (arXiv:2506.16640)")
    parser.add_argument("--version", action="version", version=f"asentmax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for add in (_train_parser, _eval_parser, _compare_parser, _demo_parser):
        add(sub)
    from asentmax.lm.cli import add_lm_parser

    add_lm_parser(sub, add_config_flags, UsageError)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        return _main(argv, command)
    except KeyboardInterrupt:  # Ctrl-C where no step handles it: importing torch, building, compiling
        print(f"asentmax {command}: interrupted".replace("  ", " "), file=sys.stderr)
        return 130


def _main(argv: list[str], command: str) -> int:
    from asentmax.runs import RunError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        args.run(args)
    except (UsageError, RunError) as error:
        print(f"asentmax {command}: error: {error}".replace("  ", " "), file=sys.stderr)
        return 2
    except Interrupted as error:
        print(f"asentmax {command}: {error}".replace("  ", " "), file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
