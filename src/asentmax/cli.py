"""The `asentmax` command line: train, eval, compare, demo (the synthetic tasks of arXiv:2506.16640).

Flags are derived from the config dataclasses (TrainConfig, asentmax.nn.ModelConfig, EvalConfig):
one kebab-case flag per field, help text from the field's metadata. A flag that is not given keeps the
preset's value, so `asentmax train --preset mqmtar --attention asentmax` changes only the attention.

Every problem a user can cause (a bad flag, impossible lengths, a missing, truncated or foreign
checkpoint, an unreadable config.json or eval.json, a missing GPU, an existing run directory) is
reported as one line on stderr with exit code 2, before anything is written. Bare `asentmax` prints the
usage and the commands on stderr, exit 2 (no command was run); Ctrl-C ends with one line, exit 130.
"""

from __future__ import annotations

import argparse
import dataclasses
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
        note = defaults_note or f"default: {f.metadata.get('default_help', default)}"
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

    p = sub.add_parser("eval", help="exact match per length multiplier of trained runs", description=(
        "Greedy-decode fixed test sets at each length multiplier; writes <run-dir>/eval.json and eval.md "
        "(or --output) after every length. A re-run continues where the last one stopped (same checkpoint "
        "and settings); on the CPU the default multipliers stop at --cpu-max-length tokens, and a length "
        "estimated to take over a minute is announced with its estimate."))
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding checkpoint.pt")
    p.add_argument("--output", type=Path, help="output path prefix (one run dir only)")
    p.add_argument("--fresh", action="store_true",
                   help="replace an earlier eval.json instead of continuing it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    names = add_config_flags(p, EvalConfig)
    p.set_defaults(run=_run_eval, eval_names=names)


def _run_eval(args) -> None:
    from asentmax.eval import EvalConfig, plan_evaluation, run_evaluation

    if args.output is not None and len(args.run_dirs) > 1:
        raise UsageError("--output needs exactly one run dir")
    if len({d.resolve() for d in args.run_dirs}) < len(args.run_dirs):
        raise UsageError("a run dir is given twice")
    try:
        config = EvalConfig(**_given(args, args.eval_names))
        plans = [plan_evaluation(run_dir, config, args.output, fresh=args.fresh) for run_dir in args.run_dirs]
    except (ValueError, TypeError) as error:  # RunError is a ValueError
        raise UsageError(str(error)) from error
    for plan in plans:
        print(f"evaluating {plan.run_dir} at lengths {', '.join(map(str, plan.lengths))}", flush=True)
        for note in plan.notes:
            print(note, flush=True)
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
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding eval.json")
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
    from asentmax.compare import compare_runs

    _writable_dir(args.output_dir, "--output-dir")
    print(compare_runs(args.run_dirs, args.output_dir))  # RunError (one line) for an unusable eval.json


# ---- demo ----

def _demo_parser(sub):
    from asentmax.demo import DEFAULT_OUTPUT, PUBLISHED_DIR

    p = sub.add_parser("demo", help="train softmax and ASEntmax on CPU and compare them (~5 min)",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    from asentmax.runs import RunError

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), "")
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
