"""Document readers for the formats public corpora ship in: jsonl, jsonl.zst (field `text`) and parquet.

A reader returns the documents of one shard in file order, each with its span: the byte range of its
line (for jsonl.zst, in the decompressed stream) or its row index (parquet). Empty documents are
dropped at read time, as the report's ingest does; spans keep pointing at the original lines.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from stream.errors import StreamError
from stream.sources import shard_format


@dataclass(frozen=True)
class Documents:
    """The non-empty documents of one shard; `spans[i]` = [start, end) in `unit`s of the shard file."""

    texts: list[str]
    spans: np.ndarray  # int64 (n, 2)
    unit: str  # "byte", "decompressed byte" or "row"


def _jsonl(data: bytes, path: Path, column: str, unit: str) -> Documents:
    texts: list[str] = []
    spans: list[tuple[int, int]] = []
    start = 0
    n = len(data)
    lineno = 0
    while start < n:
        end = data.find(b"\n", start)
        if end < 0:
            end = n
        lineno += 1
        line = data[start:end]
        if line.strip():
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise StreamError(f"shard {path}: line {lineno} is not JSON ({e})") from None
            text = rec.get(column) if isinstance(rec, dict) else None
            if text is not None and not isinstance(text, str):
                raise StreamError(f"shard {path}: line {lineno} field {column!r} is not a string")
            if text:
                texts.append(text)
                spans.append((start, end))
        start = end + 1
    return Documents(texts, np.array(spans, dtype=np.int64).reshape(-1, 2), unit)


def read_bytes_zst(data: bytes) -> bytes:
    """Decompress a whole zstd file (frames written with or without a content size)."""
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as r:
        return r.read()


def _parquet(path: Path, column: str, data: bytes | None) -> Documents:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # read the bytes the caller hashed, not the file again: what is verified is what is read
        table = pq.read_table(path if data is None else pa.BufferReader(data), columns=[column])
    except (KeyError, ValueError) as e:
        raise StreamError(f"shard {path}: no text column {column!r} ({e})") from None
    texts, spans = [], []
    for i, text in enumerate(table.column(column).to_pylist()):
        if text is not None and not isinstance(text, str):
            raise StreamError(f"shard {path}: row {i} column {column!r} is not a string")
        if text:
            texts.append(text)
            spans.append((i, i + 1))
    return Documents(texts, np.array(spans, dtype=np.int64).reshape(-1, 2), "row")


def read_documents(path: str | Path, text_column: str = "text", data: bytes | None = None) -> Documents:
    """The documents of a shard. `data`: the file's bytes when the caller already read (and hashed) them."""
    path = Path(path)
    fmt = shard_format(path.name)
    if fmt == "parquet":
        return _parquet(path, text_column, data)
    raw = path.read_bytes() if data is None else data
    if fmt == "jsonl.zst":
        return _jsonl(read_bytes_zst(raw), path, text_column, "decompressed byte")
    return _jsonl(raw, path, text_column, "byte")
