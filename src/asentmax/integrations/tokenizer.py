"""A byte-level tokenizer built in code (no download): token id b is the byte b (0..255), id 256 is <eos>.

`byte_tokenizer()` returns a transformers PreTrainedTokenizerFast, so it saves and loads with a model
directory (save_hf(..., tokenizer=byte_tokenizer())) and works with lm-evaluation-harness;
`as_transformers_tokenizer` wraps any tokenizers.Tokenizer (e.g. a trained BPE) the same way. Bytes reach
the tokenizers library as the printable characters of its ByteLevel alphabet; the decoder maps them back.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<eos>"
BYTE_VOCAB_SIZE = 257  # 256 bytes + <eos>


def byte_characters() -> list[str]:
    """The ByteLevel character standing for each byte 0..255: printable bytes stand for themselves, the
    others for the characters from U+0100 on, in byte order (the GPT-2 convention tokenizers uses)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    characters, extra = [], 0
    for byte in range(256):
        if byte in printable:
            characters.append(chr(byte))
        else:
            characters.append(chr(256 + extra))
            extra += 1
    return characters


def as_transformers_tokenizer(tokenizer, eos_token: str | None = None) -> PreTrainedTokenizerFast:
    """A transformers tokenizer (saved with a model directory, read by lm_eval) from a tokenizers.Tokenizer;
    eos_token names its end-of-text token (lm_eval's end of generation and prefix token). A transformers
    tokenizer (anything with save_pretrained) is returned as it is."""
    if hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError("expected a tokenizers.Tokenizer or a transformers tokenizer, got "
                        f"{type(tokenizer).__name__}")
    if eos_token is not None and tokenizer.token_to_id(eos_token) is None:
        raise ValueError(f"eos_token {eos_token!r} is not in the tokenizer's vocabulary")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos_token, pad_token=eos_token)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {character: byte for byte, character in enumerate(byte_characters())}
    vocab[EOS_TOKEN] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN])
    return as_transformers_tokenizer(tokenizer, eos_token=EOS_TOKEN)
