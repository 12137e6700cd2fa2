"""A run's append-only JSON-lines logs: one record per line, flushed and fsynced as it is written.

`hashlog.jsonl` holds only what is a function of (config, corpus, code): two runs of the same steps on
any machine write byte-identical files. Timings and other machine facts go to `metrics.jsonl`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from training.errors import CheckpointError

HASHLOG, METRICS = "hashlog.jsonl", "metrics.jsonl"  # a run directory's two logs


class JsonlLog:
    """Append records to `path`, each followed by flush + fsync (a crash loses at most the line in flight)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonlLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict]:
    """All complete records of a log (a torn last line, from a crash mid-write, is dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no newline after it: the write never finished
                break
            raise CheckpointError(f"{path}: line {i + 1} is not JSON") from None
    return out


def rewrite_jsonl(path: str | Path, records: list[dict]) -> None:
    """Replace the log with `records`, atomically (temp file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
