"""Tensor digests as kernels.digest defines them (same values), hashed without copies and on several threads."""
from __future__ import annotations

import blake3
import numpy as np
import torch


def le_array(t: torch.Tensor) -> np.ndarray:
    """The tensor's elements as a contiguous little-endian unsigned-int array (a view where possible)."""
    t = t.detach().to("cpu").contiguous()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    arr = t.reshape(-1).view(ints).numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def tensor_digest(t: torch.Tensor) -> str:
    """kernels.digest.tensor_digest's value, hashed without copying the bytes and on several threads."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update(f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode())
    arr = le_array(t)
    if arr.nbytes:
        h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


def digest_many(named: dict[str, torch.Tensor]) -> str:
    """kernels.digest.digest_many's value (sorted names, per-tensor digests), computed by `tensor_digest`."""
    h = blake3.blake3()
    for name in sorted(named):
        h.update(name.encode() + b"\0" + tensor_digest(named[name]).encode())
    return h.hexdigest()
