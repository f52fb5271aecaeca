"""The `asentmax` command line: train, eval, compare, demo (issue 5; PAPER.md sections 3-4).

Flags are derived from the config dataclasses (TrainConfig, asentmax.nn.ModelConfig, EvalConfig):
one kebab-case flag per field, help text from the field's metadata. A flag that is not given keeps the
preset's value, so `asentmax train --preset mqmtar --attention asentmax` changes only the attention.

Every argument problem (unknown task, impossible lengths, missing checkpoint, existing run directory)
is reported as one line on stderr with exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
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


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_flags(parser, cls, *, skip=(), choices: dict | None = None, defaults_note: str | None = None):
    """One flag per field of dataclass `cls` (`choices` maps field names to allowed values); absent flags
    stay out of the namespace. Returns the field names."""
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
        default = f.default if f.default is not dataclasses.MISSING else None
        note = defaults_note or f"default: {default}"
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

def _train_parser(sub):
    from asentmax.nn import ModelConfig, config
    from asentmax.tasks import TASK_NAMES
    from asentmax.train import PRESETS, TrainConfig

    p = sub.add_parser("train", help="train a model on a synthetic task", description=(
        "Train a model on a synthetic task. Flags not given keep the preset's values "
        "(--preset, else the preset of --task)."))
    p.add_argument("--run-dir", required=True, type=Path, help="output directory (refused if it exists)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="paper task preset (training and model)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --run-dir")
    p.add_argument("--stop-at-step", type=int, help="stop (with a checkpoint) after this many steps")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    train_choices = {"task": TASK_NAMES, "device": ("auto", "cpu", "cuda"), "amp": ("auto", "bf16", "off")}
    train_names = add_config_flags(p, TrainConfig, choices=train_choices)
    model_choices = {"attention": config.ATTENTIONS, "position": config.POSITIONS, "mlp": config.MLPS,
                     "alibi_slopes": config.ALIBI_SLOPES, "asentmax_init": config.ASENTMAX_INITS,
                     "ssmax_form": config.SSMAX_FORMS, "attention_backend": config.BACKENDS}
    model_names = add_config_flags(p, ModelConfig, skip=("vocab_size",) + tuple(train_names),
                                   choices=model_choices, defaults_note="default: from the preset")
    p.set_defaults(run=_run_train, train_names=train_names, model_names=model_names)


def _run_train(args) -> None:
    from asentmax.tasks import get_task
    from asentmax.runs import CHECKPOINT_NAME, RUN_FILES
    from asentmax.train import PRESETS, model_config_for, train

    run_dir: Path = args.run_dir
    train_overrides, model_overrides = _given(args, args.train_names), _given(args, args.model_names)
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise UsageError(f"--stop-at-step must be >= 1, got {args.stop_at_step}")
    if args.resume:
        if train_overrides or model_overrides or args.preset:
            raise UsageError("--resume continues with the saved configuration; drop the config flags")
        if not (run_dir / CHECKPOINT_NAME).is_file():
            raise UsageError(f"no checkpoint to resume at {run_dir / CHECKPOINT_NAME}")
        _report_training(train(None, None, run_dir, resume=True, stop_at_step=args.stop_at_step,
                               progress=not args.no_progress))
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"run dir {run_dir} is a file")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not args.overwrite:
        raise UsageError(f"run dir {run_dir} exists and is not empty; pass --resume or --overwrite")
    preset = args.preset or train_overrides.get("task", "copy")
    if preset not in PRESETS:
        raise UsageError(f"no preset for task {preset!r}")
    train_config = dataclasses.replace(PRESETS[preset](), **train_overrides)
    try:
        train_config.validate()
        task = get_task(train_config.task)
        for length in (train_config.min_length, train_config.max_length):
            task.check_length(length)
        model_config = model_config_for(task, model_overrides)
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from error
    if args.overwrite and int(os.environ.get("RANK", "0")) == 0:
        for name in RUN_FILES:
            target = run_dir / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    _report_training(train(train_config, model_config, run_dir, stop_at_step=args.stop_at_step,
                           progress=not args.no_progress))


def _report_training(summary: dict) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"at step {summary['step']} after {summary['elapsed_s']:.1f}s in this process, last loss "
              f"{summary['loss']:.4f}; run dir {summary['run_dir']}")


# ---- eval ----

def _eval_parser(sub):
    from asentmax.eval import EvalConfig

    p = sub.add_parser("eval", help="exact match per length multiplier of trained runs",
                       description="Greedy-decode fixed test sets at each length multiplier; writes "
                                   "<run-dir>/eval.json and eval.md (or --output).")
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding checkpoint.pt")
    p.add_argument("--output", type=Path, help="output path prefix (one run dir only)")
    names = add_config_flags(p, EvalConfig)
    p.set_defaults(run=_run_eval, eval_names=names)


def _run_eval(args) -> None:
    from asentmax.eval import EvalConfig, evaluate_run, multiplier_lengths
    from asentmax.tasks import get_task
    from asentmax.runs import CHECKPOINT_NAME, CONFIG_NAME

    if args.output is not None and len(args.run_dirs) > 1:
        raise UsageError("--output needs exactly one run dir")
    config = EvalConfig(**_given(args, args.eval_names))
    try:
        config.validate()
        for run_dir in args.run_dirs:
            if not (run_dir / CHECKPOINT_NAME).is_file():
                raise ValueError(f"no checkpoint at {run_dir / CHECKPOINT_NAME}")
            saved = json.loads((run_dir / CONFIG_NAME).read_text())["train_config"]
            multiplier_lengths(config.id_length or saved["max_length"], config.multipliers,
                               get_task(saved["task"]))
    except (ValueError, TypeError, OSError, KeyError) as error:
        raise UsageError(str(error)) from error
    for run_dir in args.run_dirs:
        print(f"evaluating {run_dir}")
        result = evaluate_run(run_dir, config, args.output)
        print(f"wrote {args.output or run_dir / 'eval'}.json ({len(result['rows'])} lengths)")


# ---- compare ----

def _compare_parser(sub):
    p = sub.add_parser("compare", help="several evaluated runs into one table and plots",
                       description="Markdown table (with the paper's numbers), accuracy-vs-length and "
                                   "attention-dispersion plots from evaluated run directories.")
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding eval.json")
    p.add_argument("--output-dir", type=Path, required=True, help="where compare.md and the PNGs go")
    p.set_defaults(run=_run_compare)


def _run_compare(args) -> None:
    from asentmax.compare import compare_runs

    missing = [str(d / "eval.json") for d in args.run_dirs if not (d / "eval.json").is_file()]
    if missing:
        raise UsageError(f"not evaluated (run `asentmax eval` first): {', '.join(missing)}")
    table = compare_runs(args.run_dirs, args.output_dir)
    print(table)


# ---- demo ----

def _demo_parser(sub):
    p = sub.add_parser("demo", help="train softmax and ASEntmax on CPU and compare them (~10 min)",
                       description="The `make demo` run: see asentmax.demo.")
    p.add_argument("--output-dir", type=Path, default=Path("results/demo"), help="default: results/demo")
    p.add_argument("--steps", type=int, help="training steps per model (default: the demo's)")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> None:
    from asentmax.demo import run_demo

    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    run_demo(args.output_dir, steps=args.steps)


def build_parser() -> Parser:
    parser = Parser(prog="asentmax",
                    description="ASEntmax length-generalisation experiments (arXiv:2506.16640)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (_train_parser, _eval_parser, _compare_parser, _demo_parser):
        add(sub)
    from asentmax.lm.cli import add_lm_parser

    add_lm_parser(sub, add_config_flags, UsageError)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
        args.run(args)
    except UsageError as error:
        command = next((a for a in argv if not a.startswith("-")), "")
        print(f"asentmax {command}: error: {error}".replace("  ", " "), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
