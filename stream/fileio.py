"""Atomic writes and blake3 digests of files: every file the project writes (stream, run directories,
checkpoints, certificates, ARVQ layers) goes through here, so a reader never sees half a file or half a
directory. Also the checks on what such files name or announce when read back (`member`,
`check_safetensors_header`): a name one file lists stays inside its directory, and a header's sizes fit the
file before any parser allocates from them."""
from __future__ import annotations

import json
import os
import shutil
import struct
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


def check_member(rel: str) -> None:
    """Refuse (ValueError) a file name some file lists unless it is a plain relative path: not empty, not
    absolute, no `..`, no backslash or NUL. Pure string checks, so a parser can run them before any read."""
    if not isinstance(rel, str):
        raise ValueError(f"{rel!r} is not a string")
    for bad, why in ((not rel, "is empty"), (rel.startswith("/"), "is absolute"),
                     ("\\" in rel, "contains a backslash"), ("\0" in rel, "contains a NUL byte"),
                     (".." in rel.split("/"), "has a '..' component")):
        if bad:
            raise ValueError(f"{rel!r} {why}; a listed file must stay inside its directory")


def member(root: Path, rel: str) -> Path:
    """`root / rel` for a name that a file lists (a manifest's shard or tokenizer, a run.json entry): the name
    passes `check_member` and no component below `root` is a symbolic link (root itself may be one), so
    nothing outside `root` is read or written through it."""
    check_member(rel)
    path = Path(root)
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            raise ValueError(f"{rel!r} goes through a symbolic link ({path}); a listed file must stay inside "
                             f"its directory")
    return path


SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                        "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
MAX_SAFETENSORS_HEADER = 16 << 20


def check_safetensors_header(path: Path) -> None:
    """Refuse (ValueError naming the tensor) a safetensors file whose header does not describe its own bytes:
    run before any safetensors parser sees the file, so nothing is allocated from an absurd announced size."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = _header_length(f.read(8), size)
        _check_tensors(f.read(n), size - 8 - n)


def check_safetensors_bytes(data: bytes) -> None:
    """`check_safetensors_header` for a file already read into memory (`data` is what gets parsed)."""
    n = _header_length(data[:8], len(data))
    _check_tensors(data[8:8 + n], len(data) - 8 - n)


def _header_length(head: bytes, size: int) -> int:
    if len(head) < 8:
        raise ValueError(f"not a safetensors file ({size} bytes, shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8 or n > MAX_SAFETENSORS_HEADER:
        raise ValueError(f"header length {n} exceeds the file ({size} bytes) or {MAX_SAFETENSORS_HEADER} bytes")
    return n


def _check_tensors(header: bytes, data_len: int) -> None:
    """Each tensor entry: known dtype, shape of non-negative ints, offsets inside the data and matching the
    shape, no two tensors sharing bytes."""
    try:
        entries = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"header is not valid JSON ({e})") from None
    if not isinstance(entries, dict):
        raise ValueError(f"header is a JSON {type(entries).__name__}, not an object")
    spans = []
    for name, t in entries.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict):
            raise ValueError(f"tensor {name!r}: entry is not an object")
        dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if dtype not in SAFETENSORS_ITEMSIZE:
            raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not a safetensors dtype")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: shape {shape!r} is not a list of non-negative ints")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_len):
            raise ValueError(f"tensor {name!r}: data_offsets {offsets!r} not [begin, end] with "
                             f"0 <= begin <= end <= {data_len} (the data's size)")
        nbytes = SAFETENSORS_ITEMSIZE[dtype] if 0 not in shape else 0
        for d in shape:
            nbytes = min(nbytes * d, data_len + 1)  # capped: an absurd shape stays a small int
        if nbytes != offsets[1] - offsets[0]:
            raise ValueError(f"tensor {name!r}: shape {shape} of {dtype} is "
                             f"{'more than ' if nbytes > data_len else ''}{nbytes} bytes, data_offsets "
                             f"{offsets} span {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError(f"tensor {b!r}: data_offsets overlap tensor {a!r}")
