"""Synthetic length-generalisation tasks (PAPER.md section 3), all on one protocol (tasks/base.py)."""

from asentmax.tasks.base import BOS, EOS, FIRST_SYMBOL, PAD, SEP, Example, Task
from asentmax.tasks.eval_sets import load_jsonl, make_eval_set, save_jsonl
from asentmax.tasks.registry import TASK_NAMES, get_task

__all__ = [
    "PAD",
    "BOS",
    "SEP",
    "EOS",
    "FIRST_SYMBOL",
    "Example",
    "Task",
    "TASK_NAMES",
    "get_task",
    "make_eval_set",
    "save_jsonl",
    "load_jsonl",
]
