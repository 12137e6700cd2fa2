"""blake3 digests of tensors over a canonical serialization (dtype, shape, little-endian bytes)."""
from __future__ import annotations

import blake3
import numpy as np
import torch


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw little-endian bytes of a tensor, on the host, contiguous."""
    t = t.detach().to("cpu").contiguous()
    # view as same-width integers so bf16/fp8 go through numpy unchanged
    width = t.element_size()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    arr = t.view(ints).numpy() if t.dim() else t.reshape(1).view(ints).numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def tensor_digest(t: torch.Tensor) -> str:
    """blake3 hex digest of dtype, shape and bytes: equal digests mean equal bits."""
    h = blake3.blake3()
    h.update(f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode())
    h.update(tensor_bytes(t))
    return h.hexdigest()


def digest_many(named: dict[str, torch.Tensor]) -> str:
    """One digest over several named tensors, in sorted name order."""
    h = blake3.blake3()
    for name in sorted(named):
        h.update(name.encode() + b"\0" + tensor_digest(named[name]).encode())
    return h.hexdigest()


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b have the same dtype, shape and raw bits (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def first_mismatch(a: torch.Tensor, b: torch.Tensor):
    """(index, a value, b value) of the first element whose bits differ, or None."""
    a, b = a.detach().cpu(), b.detach().cpu()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    diff = a.contiguous().view(ints) != b.contiguous().view(ints)
    if not bool(diff.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(diff)[0])
    return idx, a[idx].item(), b[idx].item()
