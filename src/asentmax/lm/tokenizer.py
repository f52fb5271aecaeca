"""Byte-level BPE tokenizer of the language-modelling workload, trained with the `tokenizers` library on
the training split only (arXiv:2506.16640, section 5 uses a Llama-3 tokenizer; a corpus of ~25M tokens
wants a smaller vocabulary, ~16K).

Byte-level: every UTF-8 string encodes and decodes back to itself exactly. Id 0 is padding (the
trainer's PAD_ID) and id 1 marks the start of every document (a model always sees where a document
begins, since no window crosses a document boundary).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from asentmax.data import PAD_ID

PAD_TOKEN = "<|pad|>"
DOC_TOKEN = "<|doc|>"
DOC_ID = 1
TOKENIZER_NAME = "tokenizer.json"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise RuntimeError("the LM workload needs the `tokenizers` package: "
                           "pip install 'asentmax[lm]'") from None
    return tokenizers


class LMTokenizer:
    """A thin wrapper of tokenizers.Tokenizer with the workload's two special tokens."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        if tokenizer.token_to_id(PAD_TOKEN) != PAD_ID or tokenizer.token_to_id(DOC_TOKEN) != DOC_ID:
            raise ValueError(f"tokenizer must map {PAD_TOKEN} -> {PAD_ID} and {DOC_TOKEN} -> {DOC_ID}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> LMTokenizer:
        tk = _tokenizers()
        if vocab_size < 260:
            raise ValueError(f"vocab_size must be >= 260 (256 bytes + special tokens), got {vocab_size}")
        tokenizer = tk.Tokenizer(tk.models.BPE())
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                         special_tokens=[PAD_TOKEN, DOC_TOKEN],
                                         initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def load(cls, folder: Path | str) -> LMTokenizer:
        path = Path(folder) / TOKENIZER_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_NAME} in {folder}; run `asentmax lm prepare` first")
        return cls(_tokenizers().Tokenizer.from_file(str(path)))

    def save(self, folder: Path | str) -> None:
        self._tok.save(str(Path(folder) / TOKENIZER_NAME))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_texts(self) -> list[str]:
        """The decoded text of every id (index = id)."""
        return [self._tok.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)]
