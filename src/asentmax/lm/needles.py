"""Needle-retrieval prompts for a base model (arXiv:2506.16640, section 5: RULER single-needle tasks;
Mohtashami & Jaggi's passkey), each exactly `length` tokens long and written as a completion: the prompt
ends where the value starts, and the answer is the value's digits (exact match after greedy decoding).

  niah_1   RULER S-NIAH-1: a key word -> 7-digit number needle in a haystack of one repeated noise passage
  niah_2   RULER S-NIAH-2: the same needle in a haystack of held-out text (the test documents)
  passkey  a 5-digit pass key in repeated noise, after an instruction to remember it

The needle goes in at a sentence boundary at a uniformly drawn depth. Token ids are concatenated piece by
piece (haystack, needle, haystack, question), every piece starting with a space or a newline, so that a
piece's tokens do not depend on its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asentmax.lm.tokenizer import DOC_ID, LMTokenizer

TASKS = ("niah_1", "niah_2", "passkey")
NOISE = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. "
                 "Find it and memorize it. I will quiz you about the important information there.")
NIAH_NEEDLE = " One of the special magic numbers for {key} is: {value}."
NIAH_QUESTION = ("\nWhat is the special magic number for {key} mentioned in the provided text? "
                 "The special magic number for {key} mentioned in the provided text is:")
PASSKEY_NEEDLE = " The pass key is {value}. Remember it. {value} is the pass key."
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"
ADJECTIVES = ("quiet", "bright", "hollow", "silver", "gentle", "crooked", "hidden", "ancient", "brave",
              "calm", "dusty", "eager", "frozen", "golden", "humble", "icy", "jolly", "lively", "misty",
              "narrow", "orange", "proud", "rapid", "sleepy", "tidy", "upper", "vivid", "wooden", "young",
              "zealous")
NOUNS = ("harbor", "lantern", "meadow", "falcon", "garden", "kettle", "island", "compass", "ribbon", "canyon",
         "orchard", "pebble", "tunnel", "violin", "window", "anchor", "basket", "candle", "dragon", "engine",
         "feather", "glacier", "hammer", "jacket", "ladder", "magnet", "needle", "pillow", "rocket", "saddle")


@dataclass
class NeedleSample:
    prompt: np.ndarray  # (length,) int64 token ids, starting with DOC_ID
    answer: str  # the digits the model must produce
    needle_start: int  # token index of the needle in the prompt
    depth: float  # requested depth in [0, 1]


def _key(rng: np.random.Generator) -> str:
    return f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}-{NOUNS[rng.integers(len(NOUNS))]}"


def _repeat(unit: list[int], n: int) -> np.ndarray:
    return np.resize(np.asarray(unit, dtype=np.int64), n)


class NeedleBuilder:
    """Builds prompts of exact token lengths; `haystack_tokens` (the held-out text, DOC ids removed) feeds
    niah_2, whose needle goes between two tokens where a sentence ends: the first ends in '.', '!' or '?'
    and the second starts with white space, or the first ends with a newline."""

    def __init__(self, tokenizer: LMTokenizer, haystack_tokens: np.ndarray):
        self.tokenizer = tokenizer
        self.noise = tokenizer.encode(NOISE)
        self.haystack = haystack_tokens[haystack_tokens != DOC_ID].astype(np.int64)
        texts = tokenizer.token_texts()
        self.ends_sentence = np.array([t.endswith((".", "!", "?")) for t in texts])
        self.ends_line = np.array([t.endswith("\n") for t in texts])
        self.starts_space = np.array([t[:1].isspace() for t in texts])
        self._min_length: dict[str, int] = {}

    def _pieces(self, task: str, rng: np.random.Generator) -> tuple[str, list[int], list[int], list[int]]:
        """(value, head, needle, question) of one prompt."""
        if task not in TASKS:
            raise ValueError(f"unknown needle task {task!r}; expected one of {', '.join(TASKS)}")
        encode = self.tokenizer.encode
        if task == "passkey":
            value = str(int(rng.integers(10_000, 100_000)))
            return (value, [DOC_ID] + encode(PASSKEY_INTRO), encode(PASSKEY_NEEDLE.format(value=value)),
                    encode(PASSKEY_QUESTION))
        key, value = _key(rng), str(int(rng.integers(1_000_000, 10_000_000)))
        return value, [DOC_ID], encode(NIAH_NEEDLE.format(key=key, value=value)), encode(
            NIAH_QUESTION.format(key=key))

    def min_length(self, task: str, draws: int = 64) -> int:
        """A prompt length every draw of `task` fits in (the longest of `draws` draws, plus 8 tokens of
        haystack and 8 of margin)."""
        if task not in self._min_length:
            rng = np.random.default_rng(0)
            self._min_length[task] = max(sum(len(p) for p in self._pieces(task, rng)[1:])
                                         for _ in range(draws)) + 16
        return self._min_length[task]

    def sample(self, task: str, length: int, rng: np.random.Generator) -> NeedleSample:
        value, head, needle, question = self._pieces(task, rng)
        n_hay = length - len(head) - len(needle) - len(question)
        if n_hay < 1:
            raise ValueError(f"length {length} is too short for a {task} prompt "
                             f"({length - n_hay + 1} tokens at least)")
        depth = float(rng.random())
        if task == "niah_2":
            if len(self.haystack) < n_hay:
                raise ValueError(f"the held-out text has {len(self.haystack)} tokens; niah_2 at length "
                                 f"{length} needs {n_hay}")
            start = int(rng.integers(0, len(self.haystack) - n_hay + 1))
            hay = self.haystack[start:start + n_hay]
            before, after = hay[:-1], hay[1:]
            ends = np.flatnonzero((self.ends_sentence[before] & self.starts_space[after])
                                  | self.ends_line[before]) + 1  # cut points: hay[:cut] ends a sentence
            target = int(round(depth * n_hay))
            cut = int(ends[np.abs(ends - target).argmin()]) if len(ends) else target
        else:
            hay = _repeat(self.noise, n_hay)
            units = np.arange(0, n_hay + 1, len(self.noise))  # cut points between noise passages
            cut = int(units[np.abs(units - round(depth * n_hay)).argmin()])
        ids = [np.asarray(piece, dtype=np.int64) for piece in (head, needle, question)]
        prompt = np.concatenate([ids[0], hay[:cut], ids[1], hay[cut:], ids[2]])
        return NeedleSample(prompt, value, len(head) + cut, depth)


def leading_digits(text: str) -> str:
    """The digits at the start of a completion, after leading whitespace ('' when there are none)."""
    text = text.lstrip()
    end = 0
    while end < len(text) and text[end].isdigit():
        end += 1
    return text[:end]
