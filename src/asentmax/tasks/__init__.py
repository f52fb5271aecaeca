"""Synthetic length-generalisation tasks (docs/method.md section 6), all on one protocol (tasks/base.py).

Every sequence is `<bos> source <sep> target <eos>` with PAD=0, BOS=1, SEP=2, EOS=3 and the task's
symbols from 4 up. Default vocabularies (fixed, independent of the length) and source lengths:

| task        | vocab | len(source)  | target                                          | file          |
|-------------|-------|--------------|-------------------------------------------------|---------------|
| mqmtar      | 263   | length + 12  | `? v1 v2` for each of the 4 queries (12 tokens) | mqmtar.py     |
| copy        | 36    | length       | the source                                      | sequence.py   |
| reverse     | 36    | length       | the source reversed                             | sequence.py   |
| sort        | 36    | length       | the source sorted                               | sequence.py   |
| flipflop    | 9     | length       | one bit: the last written bit                   | flipflop.py   |
| local_count | 68    | length       | per position, the 0-based count within its run  | local_count.py|
| two_back    | 20    | length       | per position, the token two steps earlier       | two_back.py   |

Local count and 2-back are tagging tasks (Task.tagging, as the paper's code trains them: token
classification): the model reads `<bos> source` and predicts target[i] at source token i, so their answers
are scored off one forward pass, never generated (Task.inputs_and_labels lays out either kind).

For MQMTAR `length` is the paper's L, the pairs-and-blanks context (P S <= L tokens with layout
"stretches", the paper's code's); the 4 queries follow it. `task.source_length(length)` returns the exact
source length for any task.

    >>> task = get_task("sort")
    >>> example = task.sample(64, numpy.random.default_rng(0))
    >>> tokens, target_mask = task.encode(example)
"""

from asentmax.tasks.base import BOS, EOS, FIRST_SYMBOL, PAD, SEP, Example, Task
from asentmax.tasks.eval_sets import load_jsonl, make_eval_set, save_jsonl
from asentmax.tasks.registry import TASK_NAMES, get_task, task_options

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
    "task_options",
    "make_eval_set",
    "save_jsonl",
    "load_jsonl",
]
