"""The prepared LM data: document splits, their on-disk form, and training windows that never cross a
document boundary (arXiv:2506.16640, section 5; the paper packs web documents at context 2048).

`prepare` splits the deduplicated documents (asentmax.lm.corpus) into
  test   long held-out documents, each >= `min_test_tokens` tokens (16x the training context), for
         long-context perplexity and as the S-NIAH-2 haystack;
  valid  a few other documents for the validation loss during training;
  train  the rest; the tokenizer is trained on this split only (held-out candidates that prove shorter
         than min_test_tokens once encoded join the split after the tokenizer is trained),
and writes `{split}.npz` (tokens uint16, every document starting with DOC_ID; offsets int64 of the
document starts), tokenizer.json and manifest.json into one folder.

Windows (`windows`): a document of n tokens gives the windows [0, C], [C, 2C], ... of C + 1 tokens (input
= first C, labels = last C), the last one shifted back to end at the document's end with the labels it
shares with the previous window ignored, so every target of the document is scored exactly once per
epoch; a document shorter than C + 1 tokens is one window padded on the right (PAD_ID inputs, ignored
labels; causal attention never lets a real token see the right padding). No window mixes two
documents, so no token attends across a document boundary.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asentmax.data import IGNORE_INDEX, PAD_ID
from asentmax.lm.corpus import MIN_PROSE_FRACTION, Document, prose_fraction
from asentmax.lm.tokenizer import DOC_ID, LMTokenizer

SPLITS = ("train", "valid", "test")
MANIFEST_NAME = "manifest.json"


@dataclass
class Split:
    """The documents of one split as one token array: document d is tokens[offsets[d]:offsets[d + 1]]."""

    tokens: np.ndarray  # (N,) uint16
    offsets: np.ndarray  # (D + 1,) int64

    @property
    def n_documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, d: int) -> np.ndarray:
        return self.tokens[self.offsets[d]:self.offsets[d + 1]]

    @classmethod
    def from_documents(cls, encoded: list[list[int]]) -> Split:
        lengths = np.array([len(ids) + 1 for ids in encoded], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.empty(int(offsets[-1]), dtype=np.uint16)
        for d, ids in enumerate(encoded):
            tokens[offsets[d]] = DOC_ID
            tokens[offsets[d] + 1:offsets[d + 1]] = ids
        return cls(tokens, offsets)

    def save(self, path: Path) -> None:
        np.savez_compressed(path, tokens=self.tokens, offsets=self.offsets)

    @classmethod
    def load(cls, path: Path | str) -> Split:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no {path.name} in {path.parent}; run `asentmax lm prepare` first")
        with np.load(path) as data:
            return cls(data["tokens"], data["offsets"])


def _order_key(document: Document) -> bytes:
    return hashlib.sha256(f"{document.source}/{document.name}".encode()).digest()


def split_documents(documents: list[Document], *, min_test_chars: int, n_test: int,
                    n_valid: int) -> dict[str, list[Document]]:
    """Deterministic split (documents ranked by a hash of their name): the first n_test documents that
    may be held out, have >= min_test_chars characters and are prose are test candidates, the next n_valid
    documents of the rest are validation, everything else trains."""
    ranked = sorted(documents, key=_order_key)
    test = [d for d in ranked if d.held_out_ok and len(d.text) >= min_test_chars
            and prose_fraction(d.text) >= MIN_PROSE_FRACTION][:n_test]
    chosen = {id(d) for d in test}
    rest = [d for d in ranked if id(d) not in chosen]
    return {"test": test, "valid": rest[:n_valid], "train": rest[n_valid:]}


def prepare(documents: list[Document], out: Path, *, vocab_size: int, context: int, n_test: int,
            n_valid: int, sources: list[dict]) -> dict:
    """Split, train the tokenizer on the training split, encode, and write the folder; returns the manifest.
    Test candidates shorter than 16 * context + 1 tokens once encoded move to the training split."""
    min_test_tokens = 16 * context + 1
    splits = split_documents(documents, min_test_chars=3 * min_test_tokens, n_test=n_test, n_valid=n_valid)
    if not splits["test"]:
        raise ValueError(f"no document is long enough to hold out (>= {3 * min_test_tokens} characters)")
    tokenizer = LMTokenizer.train((d.text for d in splits["train"]), vocab_size)
    if tokenizer.vocab_size > 65536:
        raise ValueError(f"vocab_size {tokenizer.vocab_size} does not fit the uint16 token arrays")
    encoded = {name: tokenizer.encode_batch([d.text for d in docs]) for name, docs in splits.items()}
    short = [i for i, ids in enumerate(encoded["test"]) if len(ids) + 1 < min_test_tokens]
    for i in reversed(short):
        splits["train"].append(splits["test"].pop(i))
        encoded["train"].append(encoded["test"].pop(i))
    if not splits["test"]:
        raise ValueError(f"no held-out document reaches {min_test_tokens} tokens")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out)
    manifest = {"context": context, "min_test_tokens": min_test_tokens, "vocab_size": tokenizer.vocab_size,
                "tokenizer": {"kind": "byte-level BPE", "library": f"tokenizers {_tokenizers_version()}",
                              "trained_on": "train split (before short held-out candidates joined it)"},
                "sources": sources, "splits": {}}
    for name in SPLITS:
        split = Split.from_documents(encoded[name])
        split.save(out / f"{name}.npz")
        per_source: dict[str, int] = {}
        for document, ids in zip(splits[name], encoded[name], strict=True):
            per_source[document.source] = per_source.get(document.source, 0) + len(ids) + 1
        manifest["splits"][name] = {"documents": split.n_documents, "tokens": int(len(split.tokens)),
                                    "characters": sum(len(d.text) for d in splits[name]),
                                    "tokens_per_source": per_source,
                                    **({"names": [f"{d.source}/{d.name}" for d in splits[name]]}
                                       if name == "test" else {})}
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


def read_manifest(folder: Path | str) -> dict:
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {MANIFEST_NAME} in {folder}; run `asentmax lm prepare --out {folder}`")
    return json.loads(path.read_text())


@dataclass
class Windows:
    """Training windows of one split at context C: window w reads tokens[starts[w] : starts[w] + C + 1]
    (clipped at its document's end ends[w]); labels before first_label[w] (window-relative) are ignored."""

    starts: np.ndarray  # (W,) int64
    ends: np.ndarray  # (W,) int64, exclusive end of the window's document
    first_label: np.ndarray  # (W,) int64
    context: int

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def n_targets(self) -> int:
        """Scored tokens over all windows (each document's tokens but its first, once)."""
        span = np.minimum(self.ends - self.starts - 1, self.context)
        return int((span - self.first_label).sum())

    def arrays(self, tokens: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, labels) int64 arrays (len(index), C) of the windows `index`."""
        c = self.context
        pos = self.starts[index, None] + np.arange(c + 1)  # (B, C + 1)
        real = pos < self.ends[index, None]
        values = np.where(real, tokens[np.minimum(pos, len(tokens) - 1)].astype(np.int64), PAD_ID)
        inputs = np.where(real[:, :-1], values[:, :-1], PAD_ID)
        labels = np.where(real[:, 1:], values[:, 1:], IGNORE_INDEX)
        labels[np.arange(c)[None, :] < self.first_label[index, None]] = IGNORE_INDEX
        return inputs, labels


def windows(split: Split, context: int) -> Windows:
    """The windows of every document of `split` (see the module docstring)."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    starts, ends, first = [], [], []
    for d in range(split.n_documents):
        lo, hi = int(split.offsets[d]), int(split.offsets[d + 1])
        n_targets = hi - lo - 1
        if n_targets < 1:
            continue
        k = -(-n_targets // context)  # windows of this document
        s = lo + context * np.arange(k, dtype=np.int64)
        f = np.zeros(k, dtype=np.int64)
        if k > 1 and n_targets % context:
            last = hi - context - 1
            f[-1] = s[-1] - last
            s[-1] = last
        starts.append(s)
        ends.append(np.full(k, hi, dtype=np.int64))
        first.append(f)
    if not starts:
        raise ValueError("the split has no document with at least two tokens")
    return Windows(np.concatenate(starts), np.concatenate(ends), np.concatenate(first), context)
