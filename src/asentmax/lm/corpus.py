"""The language-modelling corpus: English documentation and a public-domain dictionary shipped in pinned
Debian packages (arXiv:2506.16640, section 5 trains on web text; this is the offline stand-in one script
can rebuild anywhere the Debian archive is reachable).

`SOURCES` pins every package by exact version and sha256 of its .deb. `fetch_sources` downloads them with
`apt-get download`, checks the checksums and unpacks them with `dpkg-deb -x`; `read_documents` turns the
unpacked trees into plain-text documents (one file = one document; the dictionary is cut into chunks of
whole entries), `clean_text` normalises whitespace, and `deduplicate` drops exact duplicates (after
whitespace normalisation) and documents shorter than `MIN_DOCUMENT_CHARS`. Documents held out for the
long-context evaluation must also be prose (`prose_fraction` >= MIN_PROSE_FRACTION).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

MIN_DOCUMENT_CHARS = 200
MIN_PROSE_FRACTION = 0.8  # a held-out document is mostly letters and spaces (no tables of code points)
DICTIONARY_CHUNK_CHARS = 40_000  # gcide is cut into documents of whole entries, about this long


@dataclass(frozen=True)
class Source:
    """One Debian package: where its documents live inside the unpacked tree and how to read them."""

    package: str
    version: str
    sha256: str
    root: str  # folder inside the package
    patterns: tuple[str, ...]  # globs under root
    reader: str  # text | gzip | html | dictionary
    exclude: tuple[str, ...] = ()  # substrings of relative paths to skip
    held_out_ok: bool = True  # may its long documents be held out for the long-context evaluation?

    @property
    def deb_name(self) -> str:
        return f"{self.package}_{self.version.replace(':', '%3a')}_all.deb"


SOURCES: tuple[Source, ...] = (
    Source("linux-doc-6.1", "6.1.192-3", "f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f",
           "usr/share/doc/linux-doc-6.1/Documentation", ("**/*.rst.gz", "**/*.txt.gz"), "gzip",
           exclude=("translations/", "devicetree/bindings/")),
    Source("python3.11-doc", "3.11.2-6+deb12u9",
           "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
           "usr/share/doc/python3.11/html/_sources", ("**/*.rst.txt",), "text"),
    Source("perl-doc", "5.36.0-7+deb12u4", "f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8",
           "usr/share/perl/5.36.0/pod", ("*.pod",), "text"),
    Source("postgresql-doc-15", "15.20-0+deb12u1",
           "4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7",
           "usr/share/doc/postgresql-doc-15/html", ("*.html",), "html"),
    Source("python-django-doc", "3:3.2.25-0+deb12u7",
           "87307f067916df72e17180d35b7cde5c7ea6080336cda518efd7f6e66988a7ca",
           "usr/share/doc/python-django-doc/html", ("**/*.html",), "html",
           exclude=("genindex", "py-modindex", "search.html", "_modules/")),
    Source("git-doc", "1:2.39.5-0+deb12u3",
           "3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec",
           "usr/share/doc/git-doc", ("**/*.txt",), "text"),
    Source("nodejs-doc", "18.20.4+dfsg-1~deb12u3",
           "d2fbd4f3aecccea9d901a03842ef8380379e0d33010a48af5e797ed68ae874ce",
           "usr/share/doc/nodejs/api", ("*.md.gz",), "gzip"),
    Source("debian-reference-en", "2.100", "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f",
           "usr/share/debian-reference", ("debian-reference.en.txt.gz",), "gzip"),
    Source("dict-gcide", "0.48.5+nmu2", "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
           "usr/share/dictd", ("gcide.dict.dz",), "dictionary", held_out_ok=False),
)


@dataclass(frozen=True)
class Document:
    source: str  # package name
    name: str  # path inside the package (plus #chunk for the dictionary)
    text: str
    held_out_ok: bool


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sources(cache: Path, sources: tuple[Source, ...] = SOURCES) -> dict[str, Path]:
    """Download (apt-get download, into `cache`), verify and unpack every source; package -> unpacked dir."""
    cache.mkdir(parents=True, exist_ok=True)
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"lm prepare needs {tool} (a Debian/Ubuntu host) to fetch the corpus packages")
    unpacked = {}
    for source in sources:
        deb = cache / source.deb_name
        if not deb.is_file():
            spec = f"{source.package}={source.version}"
            result = subprocess.run(["apt-get", "download", spec], cwd=cache, capture_output=True, text=True)
            if result.returncode != 0 or not deb.is_file():
                last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"apt-get download {spec} failed ({last}); run `apt-get update` first")
        digest = sha256_file(deb)
        if digest != source.sha256:
            raise RuntimeError(f"{deb} has sha256 {digest}, expected {source.sha256}; delete it and retry")
        target = cache / "unpacked" / source.package
        if not (target / ".done").is_file():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
            (target / ".done").write_text(source.sha256 + "\n")
        unpacked[source.package] = target
    return unpacked


class _TextOfHTML(HTMLParser):
    """Visible text of an HTML page (no script/style/navigation), block elements ending lines."""

    BLOCKS = {"p", "div", "pre", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "br", "table",
              "section", "blockquote"}
    SKIP = {"script", "style", "head", "nav"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        elif tag == "pre":
            self.pre += 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> str:
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


def clean_text(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row, no leading/trailing blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def dictionary_chunks(text: str, chunk_chars: int = DICTIONARY_CHUNK_CHARS) -> list[str]:
    """A dictd database as documents of whole entries (entries are separated by blank lines and start at
    column 0); the database's own header entries (00-database-*) are dropped."""
    entries = re.split(r"\n\n(?=\S)", text)
    entries = [e for e in entries if e.strip() and not e.lstrip().startswith("00-database")]
    chunks, current, size = [], [], 0
    for entry in entries:
        current.append(entry)
        size += len(entry) + 2
        if size >= chunk_chars:
            chunks.append("\n\n".join(current))
            current, size = [], 0
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _read(path: Path, reader: str) -> str:
    raw = gzip.decompress(path.read_bytes()) if reader in ("gzip", "dictionary") else path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    return html_to_text(text) if reader == "html" else text


def read_documents(unpacked: dict[str, Path], sources: tuple[Source, ...] = SOURCES) -> list[Document]:
    """Every document of every source, cleaned, in a fixed order (sources, then sorted paths)."""
    documents = []
    for source in sources:
        root = unpacked[source.package] / source.root
        if not root.is_dir():
            raise RuntimeError(f"{source.package}: no folder {source.root} in the unpacked package")
        paths = sorted({p for pattern in source.patterns for p in root.glob(pattern) if p.is_file()})
        for path in paths:
            rel = path.relative_to(root).as_posix()
            if any(part in rel for part in source.exclude):
                continue
            text = _read(path, source.reader)
            if source.reader == "dictionary":
                for i, chunk in enumerate(dictionary_chunks(text)):
                    documents.append(Document(source.package, f"{rel}#{i}", clean_text(chunk), False))
            else:
                documents.append(Document(source.package, rel, clean_text(text), source.held_out_ok))
    return documents


def deduplicate(documents: list[Document], min_chars: int = MIN_DOCUMENT_CHARS) -> list[Document]:
    """Drop documents shorter than min_chars and exact duplicates (after collapsing whitespace); the first
    copy in order is kept."""
    seen, kept = set(), []
    for document in documents:
        if len(document.text) < min_chars:
            continue
        key = hashlib.sha256(" ".join(document.text.split()).encode()).digest()
        if key in seen:
            continue
        seen.add(key)
        kept.append(document)
    return kept


def prose_fraction(text: str) -> float:
    """The fraction of a text's characters that are letters or spaces."""
    return sum(c.isalpha() or c == " " for c in text) / max(len(text), 1)


def read_text_folder(folder: Path) -> list[Document]:
    """Documents from a folder of .txt files (one file = one document; the tests' shipped sample)."""
    paths = sorted(folder.glob("*.txt"))
    if not paths:
        raise ValueError(f"no .txt documents in {folder}")
    return [Document(folder.name, p.name, clean_text(p.read_text(encoding="utf-8")), True) for p in paths]
