"""Atomic writes and blake3 digests of files: every file the project writes (stream, run directories,
checkpoints, certificates, ARVQ layers) goes through here, so a reader never sees half a file or half a
directory."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's entries: a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, durable: bool = True) -> Iterator[Path]:
    """A temporary sibling of `path` for a writer that needs a file name (parquet, safetensors, a PNG): on
    success fsynced (unless not `durable`) and renamed onto `path`; on any error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the file from other users
        if durable:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to `path` through a temporary file: readers never see half a file."""
    with atomic_path(path, durable) as tmp:
        tmp.write_bytes(data)


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """A temporary sibling directory to fill; on success every file in it and the directory are fsynced and it
    is renamed to `path`, which must not exist: the directory appears whole or not at all. On error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_path(f)
        os.chmod(tmp, 0o755)
        fsync_path(tmp)
        os.rename(tmp, path)  # fails if `path` appeared meanwhile: nothing is overwritten
        fsync_path(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def canonical_json(obj: object) -> bytes:
    """The one JSON encoding we hash and write: sorted keys, no whitespace variation, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def atomic_write_json(path: str | Path, obj: object, durable: bool = True) -> None:
    """Pretty JSON (sorted keys, so two writes of the same object are the same bytes), written atomically."""
    text = json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), durable)
