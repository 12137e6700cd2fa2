"""Sources: a name, an ordered list of shards and a token-share weight, declared in JSON or TOML.

    tokenizer = "tokenizer.json"            # optional, relative to the config file
    [[sources]]
    name = "web"
    weight = 66.7                           # token share; normalised over all sources
    shards = ["web/000.jsonl.zst", "web/001.parquet"]
    text_column = "text"                    # field (jsonl) or column (parquet) holding the text

Shard paths are relative to the config file's directory, so a corpus directory can move.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from stream.errors import ConfigError

FORMATS = ("jsonl", "jsonl.zst", "parquet")


def shard_format(path: str) -> str:
    """The reader a shard needs, from its file name."""
    for fmt in sorted(FORMATS, key=len, reverse=True):
        if path.endswith("." + fmt):
            return fmt
    raise ConfigError(f"shard {path!r}: unknown format; the name must end in one of .{', .'.join(FORMATS)}")


@dataclass(frozen=True)
class SourceConfig:
    """One source of the mix. `shards` are paths relative to the corpus root, in declared order."""

    name: str
    shards: tuple[str, ...]
    weight: float
    text_column: str = "text"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ConfigError(f"source.name: expected a non-empty string without '/', got {self.name!r}")
        if not isinstance(self.shards, tuple) or not self.shards:
            raise ConfigError(f"source {self.name!r}: shards must be a non-empty tuple of paths")
        if len(set(self.shards)) != len(self.shards):
            raise ConfigError(f"source {self.name!r}: shards contains a duplicate path")
        for s in self.shards:
            if not isinstance(s, str) or not s:
                raise ConfigError(f"source {self.name!r}: shard {s!r} is not a path")
            shard_format(s)
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w < float("inf")):
            raise ConfigError(f"source {self.name!r}: weight must be a finite number > 0, got {w!r}")
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ConfigError(f"source {self.name!r}: text_column must be a non-empty string")

    @property
    def share(self) -> Fraction:
        """The weight as an exact rational (a float is a binary fraction: no rounding here)."""
        return Fraction(self.weight)


@dataclass(frozen=True)
class CorpusConfig:
    """The sources of a corpus, in declared order; `root` is the directory shard paths are relative to."""

    sources: tuple[SourceConfig, ...]
    root: Path = field(default=Path("."))
    tokenizer: str = "tokenizer.json"

    def __post_init__(self) -> None:
        if not isinstance(self.sources, tuple) or not self.sources:
            raise ConfigError("corpus.sources: expected at least one source")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"corpus.sources: duplicate source name in {names}")

    def to_dict(self) -> dict:
        """The JSON form written next to a corpus (root omitted: it is where the file lies)."""
        return {"tokenizer": self.tokenizer,
                "sources": [{"name": s.name, "weight": s.weight, "text_column": s.text_column,
                             "shards": list(s.shards)} for s in self.sources]}


def corpus_from_dict(d: dict, root: Path) -> CorpusConfig:
    """Validate a parsed config file."""
    if not isinstance(d, dict) or not isinstance(d.get("sources"), list):
        raise ConfigError("corpus config: expected a table with a 'sources' list")
    sources = []
    for i, s in enumerate(d["sources"]):
        if not isinstance(s, dict):
            raise ConfigError(f"corpus config: sources[{i}] is not a table")
        unknown = set(s) - {"name", "weight", "shards", "text_column"}
        if unknown:
            raise ConfigError(f"corpus config: sources[{i}] has unknown keys {sorted(unknown)}")
        if not isinstance(s.get("shards"), list):
            raise ConfigError(f"corpus config: sources[{i}].shards must be a list of paths")
        sources.append(SourceConfig(name=s.get("name"), shards=tuple(s["shards"]), weight=s.get("weight"),
                                    text_column=s.get("text_column", "text")))
    tok = d.get("tokenizer", "tokenizer.json")
    if not isinstance(tok, str) or not tok:
        raise ConfigError(f"corpus config: tokenizer must be a path, got {tok!r}")
    return CorpusConfig(sources=tuple(sources), root=root, tokenizer=tok)


def load_corpus_config(path: str | Path) -> CorpusConfig:
    """Read a corpus config (`.json` or `.toml`); shard paths resolve against its directory."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"corpus config {path}: no such file")
    if path.suffix not in (".toml", ".json"):
        raise ConfigError(f"corpus config {path}: expected a .json or .toml file")
    raw = path.read_bytes()
    try:
        d = tomllib.loads(raw.decode("utf-8")) if path.suffix == ".toml" else json.loads(raw)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"corpus config {path}: not valid {path.suffix[1:].upper()} ({e}); fix the file") from None
    try:
        return corpus_from_dict(d, path.parent)
    except ConfigError as e:  # its messages name the key; this one adds the file
        raise ConfigError(f"{path}: {e}") from None
