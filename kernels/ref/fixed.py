"""Exact reductions through int64 fixed point (docs/architecture.md, contract point 3).

Addends are scaled by one power of two taken from an order-independent statistic (the exponent
of the largest magnitude, computed exactly), rounded once to int64 and added as integers. Integer
addition is associative, so any kernel may add in any order, atomics included, and get these bits.
Headroom of ceil(log2(n)) bits keeps n addends below 2^62, so the int64 sum cannot overflow.
"""
from __future__ import annotations

import torch

TOP_BIT = 62  # addends are scaled below 2^(TOP_BIT - headroom); the sum stays below 2^62


def headroom_bits(n: int) -> int:
    """ceil(log2(n)) for n >= 1: bits the sum of n addends can grow beyond the largest one."""
    return max(int(n) - 1, 0).bit_length()


def pow2(e: torch.Tensor) -> torch.Tensor:
    """float64 2^e for integer e in [-1022, 1023], built from the exponent bits (no pow, no libm)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def frexp_exponent(a: torch.Tensor) -> torch.Tensor:
    """The integer e with 2^(e-1) <= |a| < 2^e (0 for a == 0), read exactly by frexp."""
    return torch.frexp(a)[1].to(torch.int64)


def scale_exponent(amax: torch.Tensor, n: int) -> torch.Tensor:
    """Shift s such that every |addend| * 2^s < 2^(62 - headroom(n)): int64 sums of n cannot overflow."""
    return (TOP_BIT - headroom_bits(n)) - frexp_exponent(amax.to(torch.float64))


def to_fixed(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Round x * 2^s to int64 (half to even); s broadcasts against x. Exact scaling in float64."""
    return torch.round(x.to(torch.float64) * pow2(s)).to(torch.int64)


def from_fixed(q: torch.Tensor, s: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q * 2^-s as `dtype`: int64 -> float64 (one rounding), exact scaling, one cast."""
    return (q.to(torch.float64) * pow2(-s)).to(dtype)


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """x with inf and NaN replaced by +0.0 (a selection, no arithmetic; one pass where isfinite + where take four)."""
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def nonfinite_along(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Whether each slice along `dim` (kept) holds an inf or NaN: amax propagates NaN, and |-inf| is inf."""
    if x.shape[dim] == 0:  # amax has nothing to take
        shape = list(x.shape)
        shape[dim] = 1
        return torch.zeros(shape, dtype=torch.bool, device=x.device)
    return ~torch.isfinite(torch.amax(x.abs(), dim=dim, keepdim=True))


def nonfinite_sum(x: torch.Tensor, dim, keepdim: bool) -> torch.Tensor:
    """Sum of only the non-finite addends (finite ones zeroed): inf/nan arithmetic is order-free."""
    only = x - finite_or_zero(x)  # finite: x - x = +0.0 exactly; inf - 0 = inf; NaN stays NaN
    return only.sum(dim=dim, keepdim=keepdim)  # br-ok: addends are 0, +-inf or nan, whose sum is order-independent
