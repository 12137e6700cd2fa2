"""Correctly rounded and exact device building blocks shared by the Triton twins.

Compiled: libdevice `div_rn` / `sqrt_rn` / `rint` (PTX div.rn, sqrt.rn, cvt.rni), never Triton's
`/` (approximate for float32: docs/architecture.md, measured facts). Under TRITON_INTERPRET the
interpreter has no libdevice, so numpy's IEEE division, sqrt and a half-to-even rint stand in (a logic
check only).
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.launch import INTERPRET

INF = tl.constexpr(float("inf"))

if INTERPRET:
    @triton.jit
    def div_rn(a, b):
        """a / b correctly rounded (numpy's IEEE division)."""
        return a / b

    @triton.jit
    def sqrt_rn(a):
        """Correctly rounded sqrt (numpy's IEEE sqrt)."""
        return tl.sqrt(a)

    @triton.jit
    def rint(a):
        """Round float64 to an integer value, half to even: (|a| + 2^52) - 2^52 is exact for |a| < 2^52."""
        big = 4503599627370496.0
        m = tl.abs(a)
        r = (m + big) - big
        r = tl.where(m < big, r, m)
        # the sign of a, zeros included (rint(-0.3) and rint(-0.0) are -0.0, as libdevice's and torch.round):
        # Triton's -r is 0 - r, which gives +0.0 for r = 0
        return tl.where(a < 0, r * -1.0, tl.where(a == 0, a, r))
else:
    from triton.language.extra import libdevice

    @triton.jit
    def div_rn(a, b):
        """a / b correctly rounded (div.rn), float32 or float64."""
        return libdevice.div_rn(a, b)

    @triton.jit
    def sqrt_rn(a):
        """Correctly rounded sqrt (sqrt.rn), float32 or float64."""
        return libdevice.sqrt_rn(a)

    @triton.jit
    def rint(a):
        """Round to the nearest integer value, half to even (torch.round)."""
        return libdevice.rint(a)


@triton.jit
def pow2(e):
    """float64 2^e for int64 e in [-1022, 1023], built from the exponent bits (exact)."""
    return ((e.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def frexp_exponent(a):
    """The integer e with 2^(e-1) <= a < 2^e for finite float64 a >= 0 (0 for a == 0), as torch.frexp."""
    field = (a.to(tl.int64, bitcast=True) >> 52) & 0x7FF
    # a float64 subnormal (never from float32 data): rescale by 2^64 exactly and read again
    a2 = a * 18446744073709551616.0
    field2 = (a2.to(tl.int64, bitcast=True) >> 52) & 0x7FF
    e = tl.where(field == 0, field2 - 1086, field - 1022)
    return tl.where(a == 0, 0, e)


@triton.jit
def isfinite(x):
    """x is neither inf nor nan."""
    return tl.abs(x) < INF


@triton.jit
def nan_f64():
    """A quiet float64 NaN, from its bits (a NaN constexpr global fails Triton's changed-global check)."""
    return tl.full([], 0x7FF8000000000000, tl.int64).to(tl.float64, bitcast=True)
