"""blake3 digests of tensors: the one definition every package uses (op cases, stage digests, the state hash,
checkpoints, ARVQ files), and bit comparisons.

A tensor's bytes are its elements in C order, little-endian (`tensor_bytes`). Two kinds of digest:
- `tensor_digest` / `digest_many`: blake3 of "dtype|shape|" + bytes; over several named tensors, in sorted
  name order. Equal digests mean equal bits.
- `raw_digests` / `named_digest`: what the stage digests and the state hash use. A tensor's raw digest is blake3
  of its bytes alone (no header: on the GPU the bytes are hashed where they lie, no staging copy); dtype and shape
  are bound next to it in the enclosing serialization:
      named_digest = blake3(b"open-1b-tensors/1" | per name, sorted by UTF-8 bytes:
                            u32 len(name) | name | u32 len(dtype) | dtype | u32 ndim | u64 dim... | raw digest)
  A `DigestMemo` lets the state hash reuse the raw digests the step's stage digests already computed;
  a `PendingNamed` is a named_digest queued on the device and read later (no host synchronization).
CUDA tensors are hashed on the GPU (kernels/triton/statehash.py, the standard BLAKE3 tree) where Triton is
installed: the digests are identical, and only 32 bytes per tensor reach the host.
"""
from __future__ import annotations

import functools
import struct

import blake3
import numpy as np
import torch

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-width ints: bf16/fp8 pass unchanged


def le_array(t: torch.Tensor) -> np.ndarray:
    """The tensor's elements as a contiguous little-endian unsigned-int array (a view where possible)."""
    t = t.detach().to("cpu").contiguous()
    arr = t.reshape(-1).view(_INTS[t.element_size()]).numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw little-endian bytes of a tensor, on the host, contiguous."""
    return le_array(t).tobytes()


NAMED_FORMAT = b"open-1b-tensors/1"


@functools.cache
def _gpu_blake3():
    """kernels.triton.statehash where Triton is installed, else None (the host path then copies)."""
    try:
        from kernels.triton import statehash
    except ImportError:
        return None
    return statehash


def gpu_hasher(t: torch.Tensor):
    """The on-device BLAKE3 module for a CUDA tensor when Triton can run it, else None."""
    return _gpu_blake3() if t.is_cuda else None


def _host_blake3(t: torch.Tensor, head: bytes = b"") -> bytes:
    """blake3 of `head` then the tensor's little-endian bytes, read in place, on several threads."""
    h = blake3.blake3(head, max_threads=blake3.blake3.AUTO)  # the digest does not depend on the thread count
    arr = le_array(t)
    if arr.nbytes:
        h.update(memoryview(arr).cast("B"))
    return h.digest()


def tensor_digest(t: torch.Tensor) -> str:
    """blake3 hex digest of "dtype|shape|" then the bytes: equal digests mean equal bits. Hashed where the tensor
    lies (CUDA: on the device; host: in place, on several threads)."""
    if (gpu := gpu_hasher(t)) is not None:
        return gpu.tensor_digest(t)
    return _host_blake3(t, f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode()).hex()


def digest_many(named: dict[str, torch.Tensor]) -> str:
    """One digest over several named tensors, in sorted name order."""
    h = blake3.blake3()
    for name in sorted(named):
        h.update(name.encode() + b"\0" + tensor_digest(named[name]).encode())
    return h.hexdigest()


def queue_raw(tensors: list[torch.Tensor]):
    """raw_digests, started now and read later: returns a function giving them (waiting then, once). CUDA
    tensors are hashed on their device, queued, one transfer per device when read; the tensors themselves
    are not held, so they may be freed meanwhile. Host tensors are hashed at once."""
    out: list[bytes | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if gpu_hasher(t) is not None:
            by_device.setdefault(t.device, []).append(i)
        else:
            out[i] = _host_blake3(t)
    queued = [(idx, _gpu_blake3().queue_digests([tensors[i] for i in idx])) for idx in by_device.values()]

    def read() -> list[bytes]:
        for idx, rows in queued:
            host = rows.cpu().numpy().astype("<i4")
            for j, i in enumerate(idx):
                out[i] = host[j].tobytes()
        queued.clear()
        return out  # type: ignore[return-value]
    return read


def raw_digests(tensors: list[torch.Tensor]) -> list[bytes]:
    """blake3 of each tensor's raw little-endian bytes (32 bytes each); CUDA tensors hashed on their device
    together, with one transfer of the digests per device."""
    return queue_raw(tensors)()


class DigestMemo:
    """Raw digests computed during one step, by tensor identity, for the state hash of that step's end state.

    Valid only while nothing writes the tensors: Triton kernels that write in place do not bump torch's version
    counter, so this is no cache across steps. It holds the tensors, so an id is never reused while it lives."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[torch.Tensor, bytes]] = {}
        self._queued: list[tuple[list[torch.Tensor], object]] = []

    def queue(self, tensors: list[torch.Tensor]) -> None:
        """Start hashing the tensors not yet known, all in one batch, without waiting: the next `digests` reads
        them (one wait for several named digests instead of one each, with the GPU idle between)."""
        queued = {id(t) for ts, _ in self._queued for t in ts}
        missing = list({id(t): t for t in tensors if id(t) not in self._known and id(t) not in queued}.values())
        if missing:
            self._queued.append((missing, queue_raw(missing)))

    def digests(self, tensors: list[torch.Tensor]) -> list[bytes]:
        for ts, read in self._queued:
            for t, d in zip(ts, read()):
                self._known[id(t)] = (t, d)
        self._queued.clear()
        missing = list({id(t): t for t in tensors if id(t) not in self._known}.values())
        for t, d in zip(missing, raw_digests(missing)):
            self._known[id(t)] = (t, d)
        return [self._known[id(t)][1] for t in tensors]


def tensor_head(t: torch.Tensor) -> bytes:
    """u32 len(dtype) | dtype | u32 ndim | u64 dim...: what binds a raw digest to its tensor's type and shape."""
    dt = str(t.dtype).removeprefix("torch.").encode()
    return (struct.pack("<I", len(dt)) + dt + struct.pack("<I", t.dim())
            + b"".join(struct.pack("<Q", int(s)) for s in t.shape))


def _named(heads: list[bytes], raw: list[bytes]) -> str:
    h = blake3.blake3(NAMED_FORMAT)
    for head, d in zip(heads, raw):
        h.update(head + d)
    return h.hexdigest()


def _heads(named: dict[str, torch.Tensor], names: list[str]) -> list[bytes]:
    return [struct.pack("<I", len(k.encode())) + k.encode() + tensor_head(named[k]) for k in names]


def named_digest(named: dict[str, torch.Tensor], memo: DigestMemo | None = None) -> str:
    """The stage digest of several named tensors (module doc), hex."""
    names = sorted(named, key=lambda s: s.encode())
    return _named(_heads(named, names), (memo or DigestMemo()).digests([named[k] for k in names]))


class PendingNamed:
    """named_digest(named), hashed on the tensors' device without waiting: `hex()` waits, once. Holds no tensor,
    so a step hashes each microbatch's gradients and frees them without a host synchronization per microbatch."""

    def __init__(self, named: dict[str, torch.Tensor]) -> None:
        names = sorted(named, key=lambda s: s.encode())
        self._heads = _heads(named, names)
        self._read = queue_raw([named[k] for k in names])
        self._hex: str | None = None

    def hex(self) -> str:
        if self._hex is None:
            self._hex = _named(self._heads, self._read())
        return self._hex


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b have the same dtype, shape and raw bits (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    ints = _INTS[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def first_mismatch(a: torch.Tensor, b: torch.Tensor):
    """(index, a value, b value) of the first element whose bits differ, or None."""
    a, b = a.detach().cpu(), b.detach().cpu()
    ints = _INTS[a.element_size()]
    diff = a.contiguous().view(ints) != b.contiguous().view(ints)
    if not bool(diff.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(diff)[0])
    return idx, a[idx].item(), b[idx].item()
