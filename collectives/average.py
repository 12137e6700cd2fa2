"""Averages as multiplications by a precomputed reciprocal (report A.3)."""
from __future__ import annotations

import torch


def reciprocal(n: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """1/n as a 0-dim tensor: IEEE double division on the host, then one rounding to `dtype`."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"average count must be a positive int, got {n!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"reciprocal needs a floating dtype, got {dtype}")
    # bit-relevant: host double 1.0 / n (correctly rounded everywhere), rounded once to dtype
    return torch.tensor(1.0 / n, dtype=torch.float64).to(dtype).to(device)


def average_(tensor: torch.Tensor, n: int) -> torch.Tensor:
    """tensor *= 1/n in place; never `tensor / n` (CUDA's scalar division is a reciprocal multiply, the CPU's is not)."""
    return tensor.mul_(reciprocal(n, tensor.dtype, tensor.device))
