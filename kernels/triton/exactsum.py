"""Fused Triton kernels of training/reduction.py's ExactSum (the "exact" gradient reduction): the same bits.

`accumulate` is ExactSum._grid + _accumulate in one pass for up to 4 partials: limbs[0..2] += the three
sign-keeping 40-bit digits of round(g * 2^96) of each partial's in-range elements, and bad += x * inf for
the others. `result` is
ExactSum.result: the grid-rounded single pending partial, or the carry-normalized limbs, through the same
fixed chain of float64 operations, times the host double `scale`, rounded once to float32.

Elementwise where the eager code branches: _grid touches `bad` only when some element is out of range.
Here each element's stand-in is added only where that element is out of range; for the other elements
the eager branch adds +0.0, which leaves every value `bad` can hold (+0, +-inf, NaN) as it was.
Every operation on the digits is exact, so any exact formulation gives the eager integers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.ieee import INF, isfinite, rint
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton  # noqa: F401  (on_triton: ExactSum's test)
from kernels.triton.reduce import _double_bits

# the definition lives in collectives/limbs.py (GRID, DIGIT, LIMIT); kernels import no other package
GRID = 96  # fixed-point grid 2^-GRID
DIGIT = tl.constexpr(40)  # bits per limb digit
LIMIT = tl.constexpr(16777216.0)  # 2^(3 * DIGIT - GRID) = 2^24: larger magnitudes go to `bad`
NAN_BITS = tl.constexpr(0x7FC00000)  # collectives/limbs.py's NAN_BITS: every NaN result is this quiet NaN
# exact powers of two from integers (no host pow); each is a float32 constant exactly, widened exactly
UP, DOWN = tl.constexpr(float(1 << GRID)), tl.constexpr(1.0 / float(1 << GRID))
M80, M40 = tl.constexpr(float(1 << 80)), tl.constexpr(float(1 << 40))
D80, D40 = tl.constexpr(1.0 / float(1 << 80)), tl.constexpr(1.0 / float(1 << 40))
BLOCK = 1024


@triton.jit
def _in_range(x):
    """Elements that go on the grid (finite, |x| < 2^24); the rest become `bad` stand-ins (x * inf)."""
    return isfinite(x) & (tl.abs(x) < LIMIT)


@triton.jit
def _digits(g_ptr, bad_ptr, idx, on):
    """One partial's three 40-bit digits of its grid integers; its out-of-range elements' stand-ins go to bad."""
    x = tl.load(g_ptr + idx, mask=on, other=0.0).to(tl.float64)
    ok = _in_range(x)
    out = on & ~ok  # bad is read and written only where an element is out of range (in place)
    tl.store(bad_ptr + idx, tl.load(bad_ptr + idx, mask=out, other=0.0) + x * INF, mask=out)
    r = rint(tl.where(ok, x, 0.0) * UP)  # the one rounding; |r| < 2^120
    # digits by truncation keep r's sign (float -> int64 conversion truncates; |r * 2^-80| < 2^40), and
    # each remainder is exact: the same integers as the eager trunc chain (a zero's sign cannot reach them)
    d2 = (r * D80).to(tl.int64)
    r = r - d2.to(tl.float64) * M80
    d1 = (r * D40).to(tl.int64)
    d0 = (r - d1.to(tl.float64) * M40).to(tl.int64)
    return d0, d1, d2


@triton.jit(do_not_specialize=["n"])
def _accumulate_kernel(g0_ptr, g1_ptr, g2_ptr, g3_ptr, limbs_ptr, bad_ptr, n, PARTIALS: tl.constexpr,
                       FRESH: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    on = idx < n
    i1 = idx + n  # limbs[1] and limbs[2] (int64: 2 * n may pass 2^31)
    i2 = i1 + n
    d0, d1, d2 = _digits(g0_ptr, bad_ptr, idx, on)
    # up to 4 partials' digits summed in registers, then one pass over the limbs: integer adds, any order
    if PARTIALS > 1:
        e0, e1, e2 = _digits(g1_ptr, bad_ptr, idx, on)
        d0, d1, d2 = d0 + e0, d1 + e1, d2 + e2
    if PARTIALS > 2:
        e0, e1, e2 = _digits(g2_ptr, bad_ptr, idx, on)
        d0, d1, d2 = d0 + e0, d1 + e1, d2 + e2
    if PARTIALS > 3:
        e0, e1, e2 = _digits(g3_ptr, bad_ptr, idx, on)
        d0, d1, d2 = d0 + e0, d1 + e1, d2 + e2
    if not FRESH:  # FRESH: the limbs are new (torch.empty); 0 + d is d
        d0 += tl.load(limbs_ptr + idx, mask=on, other=0)
        d1 += tl.load(limbs_ptr + i1, mask=on, other=0)
        d2 += tl.load(limbs_ptr + i2, mask=on, other=0)
    tl.store(limbs_ptr + idx, d0, mask=on)
    tl.store(limbs_ptr + i1, d1, mask=on)
    tl.store(limbs_ptr + i2, d2, mask=on)


@triton.jit(do_not_specialize=["n", "scale_bits"])
def _result_kernel(src_ptr, bad_ptr, out_ptr, n, scale_bits, PENDING: tl.constexpr, HAS_BAD: tl.constexpr,
                   BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    on = idx < n
    if HAS_BAD:
        bad = tl.load(bad_ptr + idx, mask=on, other=0.0)
    else:  # no stand-ins yet: +0.0, as the zeros ExactSum would have allocated
        bad = tl.zeros([BLOCK], tl.float64)
    if PENDING:  # src is the one partial: its grid integer (+ 0.0: an integer zero has no sign)
        x = tl.load(src_ptr + idx, mask=on, other=0.0).to(tl.float64)
        ok = _in_range(x)
        bad = tl.where(ok, bad, bad + x * INF)
        v = rint(tl.where(ok, x, 0.0) * UP) + 0.0
    else:  # src is the limbs [3, n]: carry-normalize to 0 <= l0, l1 < 2^40 (arithmetic shifts are floors)
        l0 = tl.load(src_ptr + idx, mask=on, other=0)
        l1 = tl.load(src_ptr + (idx + n), mask=on, other=0)  # int64 offsets: 2 * n may pass 2^31
        l2 = tl.load(src_ptr + (idx + n + n), mask=on, other=0)
        c = l0 >> DIGIT
        l0 = l0 - (c << DIGIT)
        l1 = l1 + c
        c = l1 >> DIGIT
        l1 = l1 - (c << DIGIT)
        l2 = l2 + c
        v = (l2.to(tl.float64) * M80 + l1.to(tl.float64) * M40) + l0.to(tl.float64)  # products exact
    v = (v * DOWN) * scale_bits.to(tl.int64).to(tl.float64, bitcast=True)  # the host double, bit for bit
    r = tl.where(isfinite(bad), v, bad).to(tl.float32)
    nan = tl.full([BLOCK], NAN_BITS, tl.int32).to(tl.float32, bitcast=True)
    tl.store(out_ptr + idx, tl.where(r != r, nan, r), mask=on)  # limbs.to_float32's one NaN


MAX_FUSED = 4  # partials one accumulate pass takes


def accumulate(gs: torch.Tensor | list[torch.Tensor], limbs: torch.Tensor, bad: torch.Tensor,
               fresh: bool = False) -> None:
    """ExactSum._accumulate of each partial in `gs` (one tensor, or a list of 1..MAX_FUSED), in place on
    contiguous int64 `limbs` [3, *shape] and float64 `bad` [*shape], in one pass over the limbs.

    `fresh`: the limbs hold garbage (torch.empty) and are written, not added to.
    """
    gs = [gs] if isinstance(gs, torch.Tensor) else list(gs)
    n = bad.numel()
    if not 1 <= len(gs) <= MAX_FUSED or any(g.numel() != n for g in gs) or limbs.numel() != 3 * n:
        raise ValueError(f"exactsum.accumulate: partials {[tuple(g.shape) for g in gs]}, limbs {tuple(limbs.shape)} "
                         f"and bad {tuple(bad.shape)} do not match (1..{MAX_FUSED} partials of bad's size)")
    if n:
        ptrs = [g.contiguous() for g in gs]
        ptrs += ptrs[:1] * (MAX_FUSED - len(ptrs))  # unused pointer arguments (PARTIALS says how many are read)
        _accumulate_kernel[(cdiv(n, BLOCK),)](*ptrs, limbs, bad, n, PARTIALS=len(gs), FRESH=fresh, BLOCK=BLOCK,
                                              **BR_OPTIONS)


def result(src: torch.Tensor, bad: torch.Tensor | None, scale: float, pending: bool,
           shape: tuple[int, ...]) -> torch.Tensor:
    """ExactSum.result(scale) as float32 [*shape]: from the single pending partial `src` (pending=True) or from
    the int64 limbs `src` [3, *shape]; `bad` None stands for zeros (no pass over them). Does not touch `bad`
    (the eager path's update of it there is added again when the partial is flushed: x + c + c == x + c for
    every stand-in c)."""
    out = torch.empty(shape, dtype=torch.float32, device=src.device)
    n = out.numel()
    if bad is not None and bad.numel() != n:
        raise ValueError(f"exactsum.result: bad {tuple(bad.shape)} does not match shape {shape}")
    if n:
        _result_kernel[(cdiv(n, BLOCK),)](src.contiguous(), bad.contiguous() if bad is not None else out, out, n,
                                          _double_bits(scale), PENDING=pending, HAS_BAD=bad is not None,
                                          BLOCK=BLOCK, **BR_OPTIONS)
    return out
