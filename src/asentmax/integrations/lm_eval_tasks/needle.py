"""Local single-needle retrieval for lm-evaluation-harness (RULER S-NIAH-1 style, arXiv:2506.16640,
section 5): a haystack of one repeated noise passage hides "the special magic number for KEY is: NNNNNNN"
(a 7-digit number); the prompt ends where the number starts and the answer is scored by exact match.

needle.jsonl is `make_docs()` written out (tests check it); `load_docs` is the task's custom_dataset.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DOCS_PATH = Path(__file__).with_name("needle.jsonl")
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEYS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
        "kestrel", "lagoon", "meadow", "nectar", "onyx", "pewter", "quartz", "raven", "saffron", "tundra")
HAYSTACK_REPEATS = (2, 4, 8, 16)


def prompt(key: str, value: str, repeats: int, depth: float) -> str:
    """The haystack (repeats noise passages) with the needle after round(depth * repeats) of them."""
    at = round(depth * repeats)
    needle = f"One of the special magic numbers for {key} is: {value}. "
    haystack = NOISE * at + needle + NOISE * (repeats - at)
    return (f"Some special magic numbers are hidden in the text below. Memorize them.\n{haystack}\n"
            f"The special magic number for {key} is:")


def make_docs(count: int = 32, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for index in range(count):
        key = KEYS[index % len(KEYS)]
        value = str(rng.randrange(1_000_000, 10_000_000))
        repeats = HAYSTACK_REPEATS[index % len(HAYSTACK_REPEATS)]
        depth = rng.choice((0.0, 0.25, 0.5, 0.75, 1.0))
        docs.append({"input": prompt(key, value, repeats, depth), "answer": value, "key": key,
                     "haystack_repeats": repeats, "depth": depth})
    return docs


def write_docs(path: Path = DOCS_PATH) -> None:
    path.write_text("".join(json.dumps(doc) + "\n" for doc in make_docs()))


def load_docs(**kwargs):
    """custom_dataset for needle.yaml: the JSONL as a datasets.DatasetDict with one "test" split."""
    import datasets

    rows = [json.loads(line) for line in DOCS_PATH.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


if __name__ == "__main__":
    write_docs()
