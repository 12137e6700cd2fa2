"""Device side of the exact int64 fixed-point reductions (kernels/ref/fixed.py, BR contract point 3).

A reduction is two passes over its addends: the largest finite magnitude (and which non-finite values
occur), then the int64 sum at the scale 2^(62 - headroom - exponent(max)). Integer addition is
associative, so blocks, splits and lanes may add in any order and still give the reference's bits.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.ieee import INF, frexp_exponent, isfinite, nan_f64, pow2, rint

# non-finite addends seen, as bits: their sum is order-free (nan wins; +inf with -inf is nan)
HAS_NAN = tl.constexpr(1)
HAS_PINF = tl.constexpr(2)
HAS_NINF = tl.constexpr(4)


@triton.jit
def flags_of(x):
    """Per-element non-finite bits of x (int32)."""
    f = tl.where(x != x, HAS_NAN, 0)
    f = f | tl.where(x == INF, HAS_PINF, 0)
    return f | tl.where(x == -INF, HAS_NINF, 0)


@triton.jit
def or_reduce(f, axis):
    """Bitwise OR of int32 flags along `axis`: one max per flag bit (the same result as a reduce with `|`,
    which Triton's interpreter would run element by element in Python)."""
    return tl.max(f & HAS_NAN, axis) | tl.max(f & HAS_PINF, axis) | tl.max(f & HAS_NINF, axis)


@triton.jit
def nonfinite_sum(flags):
    """float64 sum of the non-finite addends alone, from their OR-ed flags (0 when there are none)."""
    pinf = (flags & HAS_PINF) != 0
    ninf = (flags & HAS_NINF) != 0
    v = tl.where(pinf, INF, tl.where(ninf, -INF, 0.0))
    return tl.where(((flags & HAS_NAN) != 0) | (pinf & ninf), nan_f64(), v)


@triton.jit
def finite_abs(x):
    """|x| where x is finite, else 0 (float64): the statistic the scale is taken from."""
    return tl.where(isfinite(x), tl.abs(x), 0.0)


@triton.jit
def scale_shift(amax, top):
    """The shift s with every |addend| * 2^s < 2^top; top = 62 - ceil(log2 n) (fixed.scale_exponent)."""
    return top - frexp_exponent(amax)


@triton.jit
def to_fixed(x, s):
    """round(x * 2^s) as int64, half to even; non-finite x count as 0 (fixed.to_fixed of finite_or_zero)."""
    x = tl.where(isfinite(x), x, 0.0)
    return rint(x * pow2(s)).to(tl.int64)


@triton.jit
def from_fixed(q, s):
    """float64 q * 2^-s: one rounding int64 -> float64, exact scaling."""
    return q.to(tl.float64) * pow2(-s)


@triton.jit
def span_stats(x_ptr, lo, span, n, SQUARE: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 1 over elements [lo, lo + span) of the n at x (a split's span is a multiple of BLOCK, so blocks never
    straddle splits; or lo 0, span n): (largest finite |x|, or x^2 with SQUARE, exact in float64 for float32 or
    bfloat16 x; the OR of the non-finite flags)."""
    amax = tl.zeros([BLOCK], tl.float64)
    fl = tl.zeros([BLOCK], tl.int32)
    for start in range(0, span, BLOCK):
        idx = lo + start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float64)  # float32 and bf16 widen exactly
        if SQUARE:
            v = v * v
        amax = tl.maximum(amax, finite_abs(v))
        fl = fl | flags_of(v)
    return tl.max(amax, 0), or_reduce(fl, 0)
