"""Retrieval exercises mixed into LM training windows (issue 16), so that a small model learns the
in-context copying that the needle evaluation of arXiv:2506.16640, section 5 (RULER single-needle tasks,
passkey; asentmax.lm.needles) measures at lengths beyond the training context.

An exercise rewrites one training window: a few statements "key -> value" go in at uniformly drawn token
positions (inside a word too) of the window's own corpus text (one document, so no document boundary is
crossed), and after the last of them a completion-style question about one key, followed by its value
and a full stop, goes in at another such position; the rest of the window's text follows. The window
keeps at most C + 1 tokens (the training context plus one), the text being cut at its end to make room,
and the loss covers every real token as in any window, so the model learns to copy the value that the
question's key was given.

Relation to the evaluation: the same family of statements and questions, drawn independently. Two of the
five wordings are the evaluation's own (the S-NIAH "special magic number" needle and question, and the
pass key), three paraphrase them. Keys are two word tokens of the tokenizer's vocabulary joined by a
hyphen, the evaluation's key words left out; values have 2-9 digits (the evaluation's 7 and 5); keyed
wordings state 1-4 keys, one of which is asked, the pass-key wordings one value. An exercise never
exceeds the training context, whereas the evaluation's prompts go to 16x it, and its haystack is corpus
text, whereas S-NIAH-1 and passkey use a repeated noise passage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from asentmax.lm.needles import (
    ADJECTIVES,
    NIAH_NEEDLE,
    NIAH_QUESTION,
    NOUNS,
    PASSKEY_NEEDLE,
    PASSKEY_QUESTION,
)
from asentmax.lm.tokenizer import DOC_ID, LMTokenizer

# (statement, question): the question ends where the value starts; wordings without {key} state one value
WORDINGS: tuple[tuple[str, str], ...] = (
    (NIAH_NEEDLE, NIAH_QUESTION),
    (" The special magic number for {key} is: {value}.", "\nThe special magic number for {key} is:"),
    (" Remember that the number of {key} is {value}.",
     "\nWhat is the number of {key}? The number of {key} is"),
    (PASSKEY_NEEDLE, PASSKEY_QUESTION),
    (" The secret code is {value}. Keep it in mind.", "\nWhat is the secret code? The secret code is"),
)
MAX_KEYS = 4
VALUE_DIGITS = (2, 9)
KEY_WORD = re.compile(r" [a-z]{3,10}")
DRAWS = 100  # attempts to draw an exercise that fits the context


@dataclass
class Exercise:
    tokens: np.ndarray  # (n,) int64, n <= context + 1: the rewritten window
    value: str  # the digits the question asks for
    answer_start: int  # tokens[answer_start:] starts with the value's tokens (right after the question)
    text: np.ndarray  # (n,) bool: which tokens are the window's own corpus text (in order, a prefix of it)


class RetrievalExercises:
    """Draws exercises for windows of at most `context` + 1 tokens (see the module docstring)."""

    def __init__(self, tokenizer: LMTokenizer, context: int):
        self.tokenizer, self.context = tokenizer, context
        taken = set(ADJECTIVES) | set(NOUNS)
        self.words = sorted({t[1:] for t in tokenizer.token_texts() if KEY_WORD.fullmatch(t)} - taken)
        if len(self.words) < 2:
            raise ValueError(f"the tokenizer has {len(self.words)} word tokens; retrieval exercises need 2")
        shortest = min(sum(map(len, self._encode(self._pieces(w, ["a-a"], ["0" * VALUE_DIGITS[0]], 0))))
                       for w in range(len(WORDINGS)))
        if shortest > context:
            raise ValueError(f"context {context} is too short for retrieval exercises ({shortest} tokens at "
                             f"least); use a longer --context or --retrieval-share 0")

    @staticmethod
    def _pieces(wording: int, keys: list[str], values: list[str], asked: int) -> list[str]:
        """Texts of the statements, the question and the answer."""
        statement, question = WORDINGS[wording]
        return ([statement.format(key=k, value=v) for k, v in zip(keys, values, strict=True)]
                + [question.format(key=keys[asked]), f" {values[asked]}."])

    def _encode(self, pieces: list[str]) -> list[list[int]]:
        return [self.tokenizer.encode(p) for p in pieces]

    def _draw(self, rng: np.random.Generator) -> tuple[list[list[int]], str]:
        """Token pieces (statements..., question, answer) of one exercise that fits, and its value."""
        for _ in range(DRAWS):
            wording = int(rng.integers(len(WORDINGS)))
            n_keys = int(rng.integers(1, MAX_KEYS + 1)) if "{key}" in WORDINGS[wording][0] else 1
            pairs = rng.integers(len(self.words), size=(n_keys, 2))
            keys = [f"{self.words[a]}-{self.words[b]}" for a, b in pairs]
            if len(set(keys)) < n_keys:
                continue
            values = []
            for digits in rng.integers(VALUE_DIGITS[0], VALUE_DIGITS[1] + 1, size=n_keys):
                values.append(str(int(rng.integers(10 ** (digits - 1), 10 ** digits))))
            asked = int(rng.integers(n_keys))
            pieces = self._encode(self._pieces(wording, keys, values, asked))
            while sum(map(len, pieces)) > self.context and len(keys) > 1:  # drop a statement not asked
                drop = int(rng.integers(len(keys) - 1))
                drop += drop >= asked
                asked -= drop < asked
                del keys[drop], values[drop], pieces[drop]
            if sum(map(len, pieces)) <= self.context:
                return pieces, values[asked]
        raise ValueError(f"no retrieval exercise fits context {self.context} in {DRAWS} draws")

    def compose(self, window: np.ndarray, rng: np.random.Generator) -> Exercise:
        """The exercise version of `window` (its real tokens, at most context + 1 of them)."""
        pieces, value = self._draw(rng)
        *statements, question, answer = pieces
        n_text = min(len(window), self.context + 1 - sum(map(len, pieces)))
        head = int(window[0] == DOC_ID)  # the document's start token stays first
        cuts = np.sort(rng.integers(head, n_text + 1, size=len(statements) + 1))
        parts, is_text, at = [], [], 0
        for cut, piece in zip(cuts, [*statements, question + answer], strict=True):  # keys in random order
            parts += [window[at:cut], np.asarray(piece, dtype=np.int64)]
            is_text += [np.ones(cut - at, bool), np.zeros(len(piece), bool)]
            at = cut
        parts.append(window[at:n_text])
        is_text.append(np.ones(n_text - at, bool))
        tokens = np.concatenate(parts).astype(np.int64)
        return Exercise(tokens, value, int(cuts[-1]) + sum(map(len, statements)) + len(question),
                        np.concatenate(is_text))
