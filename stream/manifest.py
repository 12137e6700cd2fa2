"""Manifests: what a corpus is, by digest. Per shard the blake3 of its raw bytes, its size, document and
token counts; per corpus the tokenizer's blake3. The stream is a function of the seed and this file.

Token counts exclude separators. `manifest_digest` (blake3 of the canonical JSON) names the corpus in
saved stream states, so a state cannot be restored against another corpus or tokenizer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress

from stream.cache import ShardTokens, cache_path, write_cache
from stream.errors import ConfigError, IntegrityError, StreamError
from stream.fileio import atomic_write_json, blake3_bytes, blake3_file, canonical_json, check_member, member
from stream.readers import read_documents
from stream.sources import CorpusConfig
from stream.tokenizer import SEPARATOR, load_tokenizer

MANIFEST_NAME = "manifest.json"
FORMAT = "stream-manifest/1"


@dataclass(frozen=True)
class ShardEntry:
    path: str  # relative to the corpus root
    blake3: str
    bytes: int
    documents: int
    tokens: int


@dataclass(frozen=True)
class SourceEntry:
    name: str
    weight: float
    text_column: str
    shards: tuple[ShardEntry, ...]

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)


@dataclass(frozen=True)
class Manifest:
    root: Path
    tokenizer_path: str
    tokenizer_blake3: str
    separator: str
    separator_id: int
    vocab_size: int
    sources: tuple[SourceEntry, ...]

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "tokenizer": {"path": self.tokenizer_path, "blake3": self.tokenizer_blake3, "separator": self.separator,
                          "separator_id": self.separator_id, "vocab_size": self.vocab_size},
            "sources": [{"name": s.name, "weight": s.weight, "text_column": s.text_column,
                         "documents": s.documents, "tokens": s.tokens,
                         "shards": [vars(e).copy() for e in s.shards]} for s in self.sources],
        }

    @property
    def digest(self) -> str:
        """blake3 of the canonical JSON: the corpus's identity."""
        return blake3_bytes(canonical_json(self.to_dict()))

    def shard_file(self, entry: ShardEntry) -> Path:
        """The shard's file, inside the corpus root (`member`: no `..`, no symbolic link below it)."""
        return self._member(entry.path, "shard path")

    @property
    def tokenizer_file(self) -> Path:
        """The tokenizer's file, inside the corpus root like every shard."""
        return self._member(self.tokenizer_path, "tokenizer path")

    def _member(self, rel: str, field: str) -> Path:
        try:
            return member(self.root, rel)
        except ValueError as e:
            raise StreamError(f"manifest in {self.root}: {field}: {e}") from None


def manifest_from_dict(d: dict, root: Path) -> Manifest:
    """Parse a manifest; structural problems raise StreamError naming the field."""
    try:
        if d["format"] != FORMAT:
            raise StreamError(f"manifest in {root}: format {d['format']!r}, expected {FORMAT!r}")
        t = d["tokenizer"]
        sources = tuple(
            SourceEntry(s["name"], s["weight"], s["text_column"], tuple(
                ShardEntry(e["path"], e["blake3"], int(e["bytes"]), int(e["documents"]), int(e["tokens"]))
                for e in s["shards"]))
            for s in d["sources"])
        m = Manifest(root, t["path"], t["blake3"], t["separator"], int(t["separator_id"]), int(t["vocab_size"]), sources)
    except (KeyError, TypeError, ValueError) as e:
        raise StreamError(f"manifest in {root}: missing or malformed field {e}; rebuild it with `python -m app data "
                          f"build-demo` or `data prepare`") from None
    names = [("tokenizer path", m.tokenizer_path)]
    names += [(f"source {s.name!r} shard path", e.path) for s in m.sources for e in s.shards]
    for field, rel in names:  # before any file is opened: a listed name stays inside the corpus root
        try:
            check_member(rel)
        except ValueError as e:
            raise StreamError(f"manifest in {root}: {field}: {e}") from None
    for s in m.sources:
        if s.documents < 1:
            raise ConfigError(f"manifest in {root}: source {s.name!r} has no documents")
    return m


def load_manifest(root: str | Path) -> Manifest:
    """Read `<root>/manifest.json`."""
    root = Path(root)
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise StreamError(f"{path}: no manifest (build one with `python -m app data build-demo` or `data prepare`)")
    try:
        d = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StreamError(f"{path}: not valid JSON ({e}); rebuild the manifest with `python -m app data build-demo` "
                          f"or `data prepare`") from None
    if not isinstance(d, dict):
        raise StreamError(f"{path}: expected a JSON object; rebuild the manifest with `python -m app data build-demo` "
                          f"or `data prepare`")
    return manifest_from_dict(d, root)


def read_shard_bytes(path: Path, expected: str | None = None, expected_size: int | None = None) -> tuple[bytes, str]:
    """The raw bytes of a shard and their blake3; with `expected`, a mismatch raises IntegrityError."""
    if not path.is_file():
        if expected is not None:
            raise IntegrityError("shard", str(path), expected, "missing", "the file does not exist")
        raise StreamError(f"shard {path}: no such file")
    data = path.read_bytes()
    actual = blake3_bytes(data)
    if expected is not None and actual != expected:
        detail = f"size {len(data)} bytes, manifest says {expected_size}" if expected_size is not None else ""
        if expected_size is not None and len(data) < expected_size:
            detail += " (truncated)"
        raise IntegrityError("shard", str(path), expected, actual, detail)
    return data, actual


def verify_file(what: str, path: Path, expected: str) -> None:
    """Raise IntegrityError unless `path` exists with blake3 `expected`."""
    if not path.is_file():
        raise IntegrityError(what, str(path), expected, "missing", "the file does not exist")
    actual = blake3_file(path)
    if actual != expected:
        raise IntegrityError(what, str(path), expected, actual)


def build_manifest(config: CorpusConfig, cache_dir: str | Path | None = None, separator: str = SEPARATOR,
                   progress: bool = True) -> Manifest:
    """Hash, read and tokenize every shard of `config` (filling the cache), then write `<root>/manifest.json`."""
    root = Path(config.root)
    cache_dir = Path(cache_dir) if cache_dir is not None else root / "cache"
    tok = load_tokenizer(root / config.tokenizer, separator)
    sources = []
    n_shards = sum(len(s.shards) for s in config.sources)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("tokenizing shards", total=n_shards)
        for src in config.sources:
            entries = []
            for rel in src.shards:
                data, digest = read_shard_bytes(root / rel)
                docs = read_documents(root / rel, src.text_column, data)
                if not docs.texts:
                    raise ConfigError(f"source {src.name!r}: shard {rel} has no non-empty documents")
                tokens, offsets = tok.encode_documents(docs.texts)
                st = ShardTokens(tokens, offsets, docs.spans, docs.unit)
                write_cache(cache_path(cache_dir, digest, tok.digest), st)
                entries.append(ShardEntry(rel, digest, len(data), st.documents, st.text_tokens))
                bar.advance(task)
            sources.append(SourceEntry(src.name, src.weight, src.text_column, tuple(entries)))
    m = Manifest(root, config.tokenizer, tok.digest, separator, tok.separator_id, tok.vocab_size, tuple(sources))
    atomic_write_json(root / MANIFEST_NAME, m.to_dict())
    return m
