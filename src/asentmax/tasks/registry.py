"""Task names -> task classes (docs/method.md section 6): `get_task(name, **options)`, `task_options(name)`,
`eval_multipliers(name)`, `has_fresh_tables(name)`, `fresh_tables_refusal(name)` and `TASK_NAMES`."""

from __future__ import annotations

import inspect

from asentmax.tasks.base import Task
from asentmax.tasks.flipflop import FlipFlopTask
from asentmax.tasks.local_count import LocalCountTask
from asentmax.tasks.mqmtar import MQMTARTask
from asentmax.tasks.sequence import CopyTask, ReverseTask, SortTask
from asentmax.tasks.two_back import TwoBackTask

_TASKS: dict[str, type[Task]] = {
    "mqmtar": MQMTARTask,
    "copy": CopyTask,
    "reverse": ReverseTask,
    "sort": SortTask,
    "flipflop": FlipFlopTask,
    "local_count": LocalCountTask,
    "two_back": TwoBackTask,
}

TASK_NAMES: tuple[str, ...] = tuple(_TASKS)


def _task_class(name: str) -> type[Task]:
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASK_NAMES)}")
    return _TASKS[name]


def task_options(name: str) -> tuple[str, ...]:
    """The options task `name` takes: its constructor's parameters (e.g. n_symbols; mqmtar's layout)."""
    return tuple(inspect.signature(_task_class(name)).parameters)


def eval_multipliers(name: str) -> tuple[float, ...]:
    """The lengths task `name` is tested at by default, as multiples of its 1x length
    (Task.eval_multipliers)."""
    return _task_class(name).eval_multipliers


def has_fresh_tables(name: str) -> bool:
    """Whether task `name` has word tables to draw afresh (`asentmax eval --tables fresh`): its class
    overrides Task.with_fresh_tables, as MQMTAR's does for its key and value tables."""
    return _task_class(name).with_fresh_tables is not Task.with_fresh_tables


def fresh_tables_refusal(name: str) -> str | None:
    """The one-line refusal of `--tables fresh` for task `name` (`asentmax eval`,
    benchmarks/reproduce_paper.py), or None when it has tables to draw afresh."""
    if has_fresh_tables(name):
        return None
    return f"--tables fresh: task {name!r} has no key and value tables to draw afresh"


def get_task(name: str, **options) -> Task:
    """Build the task called `name`; options go to its constructor (ValueError for one it does not take)."""
    unknown = sorted(set(options) - set(task_options(name)))
    if unknown:
        raise ValueError(f"task {name!r} has no option {', '.join(unknown)} (its options: "
                         f"{', '.join(task_options(name)) or 'none'})")
    return _TASKS[name](**options)
