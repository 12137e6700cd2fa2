"""Tensor digests as kernels.digest defines them (same values): on CPU tensors hashed without copies and on
several threads; on CUDA tensors hashed on the GPU (kernels/triton/statehash.py, the standard BLAKE3 tree),
so only 32-byte digests cross to the host."""
from __future__ import annotations

import functools

import blake3
import numpy as np
import torch


def le_array(t: torch.Tensor) -> np.ndarray:
    """The tensor's elements as a contiguous little-endian unsigned-int array (a view where possible)."""
    t = t.detach().to("cpu").contiguous()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    arr = t.reshape(-1).view(ints).numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


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


def tensor_digest(t: torch.Tensor) -> str:
    """kernels.digest.tensor_digest's value, hashed without copying the bytes and on several threads."""
    if (gpu := gpu_hasher(t)) is not None:
        return gpu.tensor_digest(t)
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
