"""LM data: corpus reading helpers, the tokenizer round trip, the prepared splits, windows that never
cross a document, and deterministic sharded batches (asentmax.lm.corpus / tokenizer / dataset / workload)."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from asentmax.data import IGNORE_INDEX, PAD_ID
from asentmax.lm.corpus import (
    SOURCES,
    Document,
    Source,
    clean_text,
    deduplicate,
    dictionary_chunks,
    fetch_sources,
    html_to_text,
    read_documents,
    read_text_folder,
    sha256_file,
)
from asentmax.lm.dataset import Split, prepare, read_manifest, split_documents, windows
from asentmax.lm.tokenizer import DOC_ID, LMTokenizer
from asentmax.lm.workload import LMConfig, LMWorkload

pytest.importorskip("tokenizers")

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "asentmax" / "lm" / "sample"
CONTEXT = 16


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    documents = deduplicate(read_text_folder(SAMPLE))
    manifest = prepare(documents, out, vocab_size=400, context=CONTEXT, n_test=2, n_valid=1, sources=[])
    return out, manifest, documents


def test_sources_are_pinned():
    for source in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{64}", source.sha256), source.package
        assert source.version and source.deb_name.endswith("_all.deb")
    assert len({s.package for s in SOURCES}) == len(SOURCES)


def test_clean_text_and_html():
    assert clean_text("a  \r\nb\n\n\n\nc\n\n") == "a\nb\n\nc"
    text = html_to_text("<html><head><title>T</title></head><body><script>x=1</script>"
                        "<p>Hello <b>big</b>\n world</p><pre>  keep\n  this</pre></body></html>")
    assert "x=1" not in text and "T" not in text
    assert "Hello big world" in text and "  keep\n  this" in text


def test_dictionary_chunks_keep_whole_entries():
    entries = [f"word{i} \\word{i}\\ n.\n   1. meaning number {i}\n      continued" for i in range(50)]
    text = "00-database-info\n   header\n\n" + "\n\n".join(entries)
    chunks = dictionary_chunks(text, chunk_chars=300)
    assert len(chunks) > 3
    assert "\n\n".join(chunks) == "\n\n".join(entries)  # header dropped, every entry once, in order
    assert all(chunk.startswith("word") for chunk in chunks)


def test_deduplicate_drops_whitespace_duplicates_and_short_documents():
    long = "x " * 200
    docs = [Document("s", "a", long, True), Document("s", "b", long.replace(" ", "\n"), True),
            Document("s", "c", "short", True), Document("s", "d", long + "y", True)]
    assert [d.name for d in deduplicate(docs)] == ["a", "d"]


def test_tokenizer_round_trip(prepared):
    out, _, documents = prepared
    tokenizer = LMTokenizer.load(out)
    texts = [d.text for d in documents] + ["  leading spaces, tabs\tand\n\nnewlines ", "naïve café ☕ 数字 7"]
    for text in texts:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert PAD_ID not in ids and DOC_ID not in ids
    assert tokenizer.vocab_size == 400


def test_prepare_splits(prepared):
    out, manifest, documents = prepared
    assert read_manifest(out) == manifest
    tokenizer = LMTokenizer.load(out)
    names = {name: set() for name in ("train", "valid", "test")}
    texts = {d.name: d.text for d in documents}
    by_text = {d.text: d.name for d in documents}
    for name in names:
        split = Split.load(out / f"{name}.npz")
        assert split.n_documents == manifest["splits"][name]["documents"] >= 1
        for d in range(split.n_documents):
            doc = split.document(d)
            assert doc[0] == DOC_ID and DOC_ID not in doc[1:]
            text = tokenizer.decode(doc[1:].tolist())
            names[name].add(by_text[text])
            if name == "test":
                assert len(doc) >= manifest["min_test_tokens"] == 16 * CONTEXT + 1
    assert sum(len(v) for v in names.values()) == len(texts)
    assert not (names["train"] & names["test"]) and not (names["train"] & names["valid"])
    assert set(manifest["splits"]["test"]["names"]) == {f"sample/{n}" for n in names["test"]}


def _oracle_targets(split: Split) -> list[int]:
    """Every token position but each document's first: what one epoch must score, once each."""
    return [p for d in range(split.n_documents) for p in range(split.offsets[d] + 1, split.offsets[d + 1])]


@pytest.mark.parametrize("context", [1, 3, 16, 1000])
def test_windows_score_every_target_once_within_its_document(context):
    rng = np.random.default_rng(0)
    lengths = [1, 2, 5, 16, 17, 33, 48, 100]
    split = Split.from_documents([list(rng.integers(2, 50, size=n - 1)) for n in lengths])
    split.tokens[:] = np.arange(len(split.tokens))  # token value = its position, so labels name positions
    w = windows(split, context)
    inputs, labels = w.arrays(split.tokens, np.arange(len(w)))
    scored = labels[labels != IGNORE_INDEX].tolist()
    assert sorted(scored) == _oracle_targets(split)  # each once
    assert w.n_targets == len(scored)
    doc_of = np.searchsorted(split.offsets, np.arange(len(split.tokens)), side="right") - 1
    for row in range(len(w)):
        real = inputs[row][(inputs[row] != PAD_ID) | (np.arange(context) == 0)]
        doc = doc_of[real[0]]
        assert (doc_of[real] == doc).all()  # no window mixes documents
        assert (np.diff(real) == 1).all()  # contiguous, in order
        for j in np.flatnonzero(labels[row] != IGNORE_INDEX):  # the label is the input's next token
            assert labels[row, j] == inputs[row, j] + 1 and doc_of[labels[row, j]] == doc


def test_batches_are_deterministic_and_shard_the_global_batch(prepared):
    out, _, _ = prepared
    workload = LMWorkload(LMConfig(data=str(out), size="lm_tiny", context=CONTEXT, retrieval_share=0.0))
    n = len(workload.train_windows)
    one = workload.window_indices(seed=3, step=5, rank=0, world_size=1, local_batch_size=8)
    two = np.concatenate([workload.window_indices(seed=3, step=5, rank=r, world_size=2, local_batch_size=4)
                          for r in range(2)])
    assert (one == two).all()
    epoch = np.concatenate([workload.window_indices(seed=3, step=s, rank=0, world_size=1, local_batch_size=1)
                            for s in range(n)])
    assert sorted(epoch.tolist()) == list(range(n))  # one epoch reads every window once
    other = workload.window_indices(seed=4, step=5, rank=0, world_size=1, local_batch_size=8)
    assert not (other == one).all()
    batch = next(workload.batches(seed=3, start_step=5, rank=0, world_size=1, local_batch_size=8,
                                  device=torch.device("cpu")))
    inputs, labels = workload.train_windows.arrays(workload.train_split.tokens, one)
    assert torch.equal(batch.input_ids, torch.from_numpy(inputs))
    assert torch.equal(batch.labels, torch.from_numpy(labels))
    assert workload.to_dict()["name"] == "lm"
    assert LMWorkload.from_dict(workload.to_dict()).to_dict() == workload.to_dict()


def test_config_errors(prepared):
    out, _, _ = prepared
    with pytest.raises(ValueError, match="unknown preset"):
        LMConfig(preset="nope")
    with pytest.raises(ValueError, match="unknown lm workload settings: bogus"):
        LMWorkload.from_dict({"name": "lm", "data": str(out), "bogus": 1})
    with pytest.raises(FileNotFoundError, match="lm prepare"):
        LMWorkload(LMConfig(data=str(out / "missing")))


def test_held_out_documents_are_long_prose_that_may_be_held_out():
    prose = "the quick brown fox jumps over the lazy dog " * 30
    table = "0x1F 0x2A [\\x00-\\x20] {}; " * 60
    docs = [Document("s", f"p{i}", prose + str(i), True) for i in range(6)]
    docs += [Document("s", "table", table, True), Document("s", "dictionary", prose + "!", False),
             Document("s", "short", "the fox " * 10, True)]
    splits = split_documents(docs, min_test_chars=1000, n_test=10, n_valid=2)
    assert {d.name for d in splits["test"]} == {f"p{i}" for i in range(6)}
    assert len(splits["valid"]) == 2 and len(splits["train"]) == 1
    assert sorted(d.name for s in splits.values() for d in s) == sorted(d.name for d in docs)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("apt-get") is None,
                    reason="needs dpkg-deb and apt-get (Debian)")
def test_fetch_sources_checks_and_unpacks_a_package(tmp_path):
    """A package already in the cache is verified against its pinned sha256, unpacked and read."""
    tree = tmp_path / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text("Package: lm-sample\nVersion: 1.0\nArchitecture: all\n"
                                             "Maintainer: t <t@t>\nDescription: t\n")
    docs = tree / "usr" / "share" / "doc" / "lm-sample"
    docs.mkdir(parents=True)
    (docs / "a.txt").write_text("first document " * 20)
    (docs / "b.txt.gz").write_bytes(gzip.compress(("second document " * 20).encode()))
    (docs / "skip.txt").write_text("excluded " * 40)
    cache = tmp_path / "cache"
    cache.mkdir()
    deb = cache / "lm-sample_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(tree), str(deb)], check=True, capture_output=True)
    plain = Source("lm-sample", "1.0", sha256_file(deb), "usr/share/doc/lm-sample", ("*.txt",), "text",
                   exclude=("skip",))
    packed = Source("lm-sample", "1.0", sha256_file(deb), "usr/share/doc/lm-sample", ("*.gz",), "gzip")
    unpacked = fetch_sources(cache, (plain,))
    read = read_documents(unpacked, (plain,)) + read_documents(unpacked, (packed,))
    assert [(d.name, d.text) for d in read] == [("a.txt", ("first document " * 20).strip()),
                                                ("b.txt.gz", ("second document " * 20).strip())]
    wrong = Source("lm-sample", "1.0", "0" * 64, "usr/share/doc/lm-sample", ("*.txt",), "text")
    with pytest.raises(RuntimeError, match="sha256"):
        fetch_sources(cache, (wrong,))
