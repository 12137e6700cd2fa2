"""The exact gradient sum's integer format and its one conversion to float32 (training/reduction.py's ExactSum).

A sum is one integer L per element on the absolute grid 2^-GRID, held in three int64 limbs of DIGIT-bit
digits: L = l2 * 2^80 + l1 * 2^40 + l0. Partials add limb by limb without carries (2^40 * MAX_PARTIALS = 2^62:
no limb overflows); `normalize` carries to the unique form 0 <= l0, l1 < 2^40, `combine` maps those digits to
float64 by a fixed chain, and `scaled` / `to_float32` apply the scale and the one float32 rounding.
The accumulator (training) and the compact wire (collectives/exact_wire.py) share this chain bit for bit.
"""
from __future__ import annotations

import torch

F32, F64 = torch.float32, torch.float64
GRID = 96  # fixed-point grid 2^-GRID
DIGIT = 40  # bits per limb digit; 3 limbs span 120 bits, |g| * 2^GRID < 2^120
LIMIT = float(1 << (3 * DIGIT - GRID))  # 2^24: larger magnitudes are flagged, not wrapped
MAX_PARTIALS = 1 << 22  # 2^40 * 2^22 = 2^62: no limb overflows before normalization
M40, M80 = float(1 << DIGIT), float(1 << (2 * DIGIT))
LOW = (1 << DIGIT) - 1
DOWN = float.fromhex("0x1p-96")  # 2^-GRID, exact


def normalize_(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """In place, the same integer with 0 <= l0, l1 < 2^40 (arithmetic shifts are floors, and x - (x >> 40 << 40) is
    x's low 40 bits in two's complement); l2 keeps the sign."""
    l1 += l0 >> DIGIT
    l0 &= LOW
    l2 += l1 >> DIGIT
    l1 &= LOW
    return l0, l1, l2


def normalize(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`normalize_` on copies."""
    return normalize_(l0.clone(), l1.clone(), l2.clone())


def combine(l0: torch.Tensor, l1: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """float64 of normalized limbs by a fixed chain of float64 operations: the same bits on every device.

    Error (collectives/exact_wire.py relies on it): |combine - L| <= 3.0001 * 2^-53 * |L|. Where |l2| <= 2^53,
    l2 * 2^80 + l1 * 2^40 is exact before its one rounding and l0 adds one more; where |l2| > 2^53, l2's own
    rounding adds 2^-53 * |l2| * 2^80 <= 2^-53 * |L| * (1 + 2^-52). Where L is itself a float64, every step is
    exact and the chain gives L (floor(L / 2^k) * 2^k and floor(L / 2^80) are then float64s too). The chain is
    not monotone in L: at L = -2^93 - 1 it gives -2^93 + 2^40, at L = -2^93 it gives -2^93."""
    # bit-relevant: this order of float64 ops is the definition (the Triton twin follows it)
    return (l2.to(F64) * M80 + l1.to(F64) * M40) + l0.to(F64)


def value(limbs: torch.Tensor) -> torch.Tensor:
    """The float64 of limbs (3, ...) in any carry form: `combine` of the normalized digits."""
    return combine(*normalize(limbs[0], limbs[1], limbs[2]))


def scaled(v: torch.Tensor, scale: float) -> torch.Tensor:
    """v * 2^-GRID (exact: v is an integer >= 1 in magnitude, or 0) times the host double `scale` (one rounding)."""
    return (v * DOWN) * scale


# the one NaN a sum gives: a NaN's sign and payload depend on the hardware that made it (x86 makes inf - inf
# negative, ARM and CUDA positive), so every NaN result is this quiet NaN's bits
NAN_BITS = 0x7FC00000


def to_float32(w: torch.Tensor, bad: torch.Tensor | None) -> torch.Tensor:
    """The one float32 rounding; where the non-finite stand-in `bad` is inf/NaN it is the result (None: all 0), a
    NaN as NAN_BITS."""
    if bad is None:
        return w.to(F32)
    out = torch.where(torch.isfinite(bad), w, bad).to(F32)
    nan = torch.tensor(NAN_BITS, dtype=torch.int32, device=out.device).view(F32)
    return torch.where(torch.isnan(out), nan, out)
