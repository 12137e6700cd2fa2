"""Atomic writes and blake3 digests of files: every file the stream writes goes through here."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import blake3


def blake3_bytes(data: bytes) -> str:
    """Hex blake3 of a byte string."""
    return blake3.blake3(data).hexdigest()


def blake3_file(path: str | Path) -> str:
    """Hex blake3 of a file's raw bytes, read in chunks so large shards do not fill memory."""
    h = blake3.blake3()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes, durable: bool = True) -> None:
    """Write to a temporary file in the same directory, fsync (unless not `durable`), then os.replace:
    readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide shards and manifests from other users
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def canonical_json(obj: object) -> bytes:
    """The one JSON encoding we hash and write: sorted keys, no whitespace variation, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def atomic_write_json(path: str | Path, obj: object, durable: bool = True) -> None:
    """Pretty JSON (sorted keys, so two writes of the same object are the same bytes), written atomically."""
    text = json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), durable)
