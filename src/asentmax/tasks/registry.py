"""Task names -> task classes (docs/method.md section 6): `get_task(name, **kwargs)` and `TASK_NAMES`."""

from __future__ import annotations

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


def get_task(name: str, **kwargs) -> Task:
    """Build the task called `name`; kwargs go to its constructor (e.g. n_symbols, n_queries)."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASK_NAMES)}")
    return _TASKS[name](**kwargs)
