"""Exact int8 x int8 -> int32 matrix products (the BR-safe contraction primitive)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ref.checks import expect, same_device


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] int8 @ b [K, N] int8 -> int32 [M, N], exact (every K < 2^17 fits int32).

    cuBLAS's int8 path needs M > 16 and K, N multiples of 8 and is fastest with b column-major;
    zero padding is exact, so the result is the same on every device.
    """
    expect("int8_mm", "a", a, dtype=torch.int8, ndim=2)
    expect("int8_mm", "b", b, dtype=torch.int8, ndim=2)
    same_device("int8_mm", a=a, b=b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"int8_mm: inner dims differ: 'a' {tuple(a.shape)} vs 'b' {tuple(b.shape)}")
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=torch.int32, device=a.device)
    if a.device.type != "cuda":
        return torch._int_mm(a.contiguous(), b.contiguous())
    mp, kp, np_ = max(_round_up(m, 8), 32), _round_up(k, 8), _round_up(n, 8)
    ap = F.pad(a, (0, kp - k, 0, mp - m)).contiguous()
    bp = F.pad(b, (0, np_ - n, 0, kp - k)).t().contiguous().t()
    return torch._int_mm(ap, bp)[:m, :n]


def int8_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched int8_mm over leading dims: a [..., M, K] @ b [..., K, N] -> int32 [..., M, N]."""
    if a.dim() == 2:
        return int8_mm(a, b)
    lead = a.shape[:-2]
    if b.shape[:-2] != lead:
        raise ValueError(f"int8_bmm: batch dims differ: 'a' {tuple(a.shape)} vs 'b' {tuple(b.shape)}")
    a2 = a.reshape(-1, *a.shape[-2:])
    b2 = b.reshape(-1, *b.shape[-2:])
    out = torch.stack([int8_mm(a2[i], b2[i]) for i in range(a2.shape[0])]) if a2.shape[0] else \
        torch.zeros((0, a.shape[-2], b.shape[-1]), dtype=torch.int32, device=a.device)
    return out.reshape(*lead, a.shape[-2], b.shape[-1])
