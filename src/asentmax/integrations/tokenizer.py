"""A byte-level tokenizer built in code (no download): token id b is the byte b (0..255), id 256 is <eos>.

`byte_tokenizer()` returns a transformers PreTrainedTokenizerFast, so it saves and loads with a model
directory (save_hf(..., tokenizer=byte_tokenizer())) and works with lm-evaluation-harness. Bytes reach
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


def byte_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {character: byte for byte, character in enumerate(byte_characters())}
    vocab[EOS_TOKEN] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
