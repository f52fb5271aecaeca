"""The one protocol every synthetic task follows (docs/method.md section 6).

A task draws an `Example` (source ids, target ids) of a given length from a seeded
`numpy.random.Generator`; `encode` lays it out for a decoder-only model as

    <bos> source <sep> target <eos>

and marks the positions where the next-token loss is taken (those whose NEXT token is a target
token or <eos>). A tagging task (`Task.tagging`: local count and 2-back, which the paper's code trains as
token classification) has one target token per source token instead and is read as

    <bos> source        with the label of source token i predicted at its own position

so its answers are never generated: one forward pass scores them. `inputs_and_labels` gives either
layout as model inputs and per-position labels (IGNORE_INDEX where no loss is taken). Special ids are
shared by all tasks (PAD=0, BOS=1, SEP=2, EOS=3); each task's own symbols start at FIRST_SYMBOL=4. A
task's vocabulary never depends on the length, so a model trained at length 64 can be evaluated at 64k.

`length` is the sample's source length, the paper's "length" (training lengths uniform in
[32, 64], ID = 64, k-times = 64 k). `Task.source_length(length)` gives the exact `len(source)`:
it equals `length` for every task except MQMTAR, whose `length` counts the pairs-and-blanks
context only (the 4 queries come after it; see mqmtar.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asentmax.data import IGNORE_INDEX

PAD, BOS, SEP, EOS = 0, 1, 2, 3
FIRST_SYMBOL = 4
SPECIAL_NAMES = ("<pad>", "<bos>", "<sep>", "<eos>")


@dataclass
class Example:
    """One sample: token ids of the source (prompt) and of the target (answer), without specials."""

    source: list[int]
    target: list[int]

    def to_dict(self) -> dict:
        return {"source": list(self.source), "target": list(self.target)}

    @classmethod
    def from_dict(cls, data: dict) -> Example:
        if not isinstance(data, dict) or set(data) != {"source", "target"}:
            raise ValueError(f"an example must have exactly the keys 'source' and 'target', got {data!r:.60}")
        for key in ("source", "target"):
            values = data[key]
            if not isinstance(values, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values
            ):
                raise ValueError(f"example field {key!r} must be a list of ints")
        return cls(source=list(data["source"]), target=list(data["target"]))


class Task:
    """Base class: subclasses set `name`, `min_length`, `symbol_names`, the presets, `eval_multipliers`
    where the paper tests other lengths, and implement `_generate`.

    `symbol_names` lists the human-readable names of the task's own symbols, which get the ids
    FIRST_SYMBOL, FIRST_SYMBOL + 1, ...; `vocab_size = FIRST_SYMBOL + len(symbol_names)`.
    """

    name: str = ""
    min_length: int = 1
    # Presets (docs/method.md section 6, reference training): the TrainConfig fields this task sets
    # (asentmax.trainer.TrainConfig; the rest keep their defaults), and its reference model, a function
    # (vocab_size, **overrides) -> ModelConfig, or None when the paper gives none (then the user must).
    train_preset: dict = {}
    model_preset = None
    # The lengths `asentmax eval` tests by default, as multiples of the 1x length: the columns of the task's
    # table in arXiv:2506.16640, section 4 (MQMTAR's 1x..1024x for the tasks the paper has no table of).
    eval_multipliers: tuple[float, ...] = (1, 2, 4, 16, 64, 256, 1024)
    # True: the target labels the source token by token (len(target) == len(source)), predicted at each
    # source token's own position (`inputs_and_labels`), as the paper's code trains its token-classification
    # tasks; scored by one forward pass (asentmax.eval), never generated.
    tagging: bool = False

    def __init__(self, symbol_names: list[str]):
        self.symbol_names = list(symbol_names)
        self.vocab_size = FIRST_SYMBOL + len(self.symbol_names)
        self._names = list(SPECIAL_NAMES) + self.symbol_names

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"

    def vocab_mismatch(self, model_vocab_size: int) -> str | None:
        """None when a model of `model_vocab_size` token ids reads exactly this task's ids, else the
        difference in words: the one rule of training (TaskWorkload.check_model) and evaluation. A model with
        fewer ids would index past its embedding; one with more was trained on other samples (the task's
        ids changed since) and would be scored on these without an error."""
        if model_vocab_size == self.vocab_size:
            return None
        return f"its model reads {model_vocab_size} token ids, task {self.name!r} has {self.vocab_size}"

    def source_length(self, length: int) -> int:
        """Exact `len(source)` of a sample drawn with this `length` (identity unless overridden)."""
        self.check_length(length)
        return length

    def with_fresh_tables(self, rng: np.random.Generator) -> Task:
        """This task with new word tables drawn from `rng`, as the paper's code draws them for every split
        (MQMTAR's key and value tables); ValueError for a task without tables."""
        raise ValueError(f"task {self.name!r} has no key and value tables to draw afresh (mqmtar has)")

    def answer_sources(self, example: Example) -> list[int | None] | None:
        """For each target token, the index of the source token it is copied from (None for a token that
        copies none, such as MQMTAR's query markers); None for a task whose answers are not copies of single
        source tokens (Sort). `asentmax eval` scores the answers by where their source sits."""
        return None

    def check_length(self, length: int) -> None:
        if not isinstance(length, (int, np.integer)) or isinstance(length, bool):
            raise ValueError(f"task {self.name!r}: length must be an int, got {type(length).__name__}")
        if length < self.min_length:
            raise ValueError(f"task {self.name!r}: length {length} is too small (minimum {self.min_length})")

    def sample(self, length: int, rng: np.random.Generator) -> Example:
        """Draw one example whose source has `length` tokens (see `source_length`)."""
        self.check_length(length)
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        source, target = self._generate(int(length), rng)
        return Example(
            source=np.asarray(source, dtype=np.int64).tolist(),
            target=np.asarray(target, dtype=np.int64).tolist(),
        )

    def _generate(self, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def encode(self, example: Example) -> tuple[list[int], list[bool]]:
        """tokens = [BOS] + source + [SEP] + target + [EOS]; target_mask[i] is True where tokens[i+1]
        is a target token or EOS (the positions where the next-token loss is taken). A tagging task has no
        such layout (ValueError): see inputs_and_labels."""
        if self.tagging:
            raise ValueError(f"task {self.name!r} labels its source tokens one by one (Task.tagging): "
                             "use inputs_and_labels")
        tokens = [BOS, *example.source, SEP, *example.target, EOS]
        first_loss_position = len(example.source) + 1  # the SEP position predicts target[0] (or EOS)
        mask = [first_loss_position <= i < len(tokens) - 1 for i in range(len(tokens))]
        return tokens, mask

    def inputs_and_labels(self, example: Example) -> tuple[list[int], list[int]]:
        """The model's input tokens and the label of every input position (IGNORE_INDEX where no loss is
        taken): tokens[:-1] of `encode` and the next token where its target_mask is True; for a tagging task
        [BOS] + source and, at each source token, its target token."""
        if self.tagging:
            if len(example.target) != len(example.source):
                raise ValueError(f"task {self.name!r}: a tagging example needs one target token per source "
                                 f"token, got {len(example.source)} and {len(example.target)}")
            return [BOS, *example.source], [IGNORE_INDEX, *example.target]
        tokens, mask = self.encode(example)
        if len(tokens) != len(mask):
            raise ValueError(f"task {self.name!r}: {len(tokens)} tokens but {len(mask)} mask entries")
        labels = [token if scored else IGNORE_INDEX
                  for token, scored in zip(tokens[1:], mask[:-1], strict=True)]
        return tokens[:-1], labels

    def decode_tokens(self, ids) -> str:
        """Space-separated human-readable names of token ids (for printing, not for parsing)."""
        words = []
        for token in ids:
            token = int(token)
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"task {self.name!r}: token id {token} outside [0, {self.vocab_size})")
            words.append(self._names[token])
        return " ".join(words)
