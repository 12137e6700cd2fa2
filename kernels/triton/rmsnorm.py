"""Triton twin of kernels/ref/rmsnorm.py: y = (x * rstd) * w, rstd = rsqrt(mean(x^2) + eps), and its backward.

A program takes one row (or, for short rows, several: ROW_TILE elements): the exact fixed-point mean takes
two passes (largest square, then the int64 sum), a third writes the output. dweight sums over every row
exactly: column splits report their largest product, then their int64 sums at the column's scale, then a
last kernel adds the splits and rounds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.ref import fixed as ref_fixed, rmsnorm as ref
from kernels.triton.elementary import rsqrt_f32
from kernels.triton.fixedpoint import (finite_abs, flags_of, from_fixed, nonfinite_sum, or_reduce,
                                       scale_shift, to_fixed)
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, pow2_at_least
from kernels.triton.reduce import _double_bits

F32 = torch.float32
COL_BLOCK, COL_ROWS = 64, 32  # dweight tiles: 64 columns x 32 rows
ROW_TILE = 1024  # elements of the row kernels' tile (rows x columns): free for the bits; 1024 (8 rows of
# 128) ran one layer's norms 1.10x one row a program and 1.23x 2048 on the H200 (tile sweep, commit eea27bf;
# `git show 0106f46:docs/perf.md`)
LONG_ROW_STEP = 2048  # columns a step of a row too long to share its program


@triton.jit
def _terms(g_rows, x_rows, w_ptr, idx, m, rstd, D, MODE: tl.constexpr, HAS_W: tl.constexpr):
    """The float32 factors [R, BLOCK] of R rows' means at columns idx: (x, x) for the forward; (gh, xhat) for
    the backward (rstd [R])."""
    x = tl.load(x_rows[:, None] + idx[None, :], mask=m, other=0.0)
    a = x
    b = x
    if MODE == 1:
        a = tl.load(g_rows[:, None] + idx[None, :], mask=m, other=0.0)
        if HAS_W:
            a = a * tl.load(w_ptr + idx, mask=idx < D, other=0.0)[None, :]
        b = x * rstd[:, None]  # the forward's xhat bits
    return a, b


@triton.jit
def _row_mean(g_rows, x_rows, w_ptr, live, rstd, D, top, inv_bits,
              MODE: tl.constexpr, HAS_W: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    """float32 exact mean [R] of the float64 products a * b over each row: ref exact_mean, bit for bit."""
    amax = tl.zeros([R, BLOCK], tl.float64)
    fl = tl.zeros([R, BLOCK], tl.int32)
    for start in range(0, D, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        a, b = _terms(g_rows, x_rows, w_ptr, idx, live[:, None] & (idx < D)[None, :], rstd, D, MODE, HAS_W)
        p = a.to(tl.float64) * b.to(tl.float64)  # exact: float32 products fit in float64
        amax = tl.maximum(amax, finite_abs(p))
        fl = fl | flags_of(p)
    s = scale_shift(tl.max(amax, 1), top)
    acc = tl.zeros([R, BLOCK], tl.int64)
    for start in range(0, D, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        a, b = _terms(g_rows, x_rows, w_ptr, idx, live[:, None] & (idx < D)[None, :], rstd, D, MODE, HAS_W)
        acc += to_fixed(a.to(tl.float64) * b.to(tl.float64), s[:, None])  # integer adds: any order
    mean = (from_fixed(tl.sum(acc, 1), s) * inv_bits.to(tl.int64).to(tl.float64, bitcast=True)).to(tl.float32)
    f = or_reduce(fl, 1)
    return tl.where(f != 0, nonfinite_sum(f).to(tl.float32), mean)


@triton.jit(do_not_specialize=["N", "D", "top", "inv_bits"])
def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, N, D, top, inv_bits, eps,
                    HAS_W: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    """R rows of N: y = (x * rstd) * w and rstd (rows are independent: any R gives the same bits)."""
    row = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = row < N
    xr = x_ptr + row * D
    ms = _row_mean(xr, xr, w_ptr, live, tl.zeros([R], tl.float32), D, top, inv_bits, MODE=0, HAS_W=False,
                   R=R, BLOCK=BLOCK)
    rstd = rsqrt_f32(ms + eps)
    tl.store(rstd_ptr + row, rstd, mask=live)
    for start in range(0, D, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        m = live[:, None] & (idx < D)[None, :]
        y = tl.load(xr[:, None] + idx[None, :], mask=m, other=0.0) * rstd[:, None]
        if HAS_W:
            y = y * tl.load(w_ptr + idx, mask=idx < D, other=0.0)[None, :]  # (x * rstd) * w: the definition's order
        tl.store(y_ptr + row[:, None] * D + idx[None, :], y, mask=m)


@triton.jit(do_not_specialize=["N", "D", "top", "inv_bits"])
def _dx_kernel(g_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, N, D, top, inv_bits,
               HAS_W: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    """dx = (gh - xhat * c) * rstd with c the exact mean of gh * xhat (gh = g * w, xhat = x * rstd), R rows."""
    row = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = row < N
    rstd = tl.load(rstd_ptr + row, mask=live, other=0.0)
    g_rows, x_rows = g_ptr + row * D, x_ptr + row * D
    c = _row_mean(g_rows, x_rows, w_ptr, live, rstd, D, top, inv_bits, MODE=1, HAS_W=HAS_W, R=R,
                  BLOCK=BLOCK)
    for start in range(0, D, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        m = live[:, None] & (idx < D)[None, :]
        gh, xhat = _terms(g_rows, x_rows, w_ptr, idx, m, rstd, D, MODE=1, HAS_W=HAS_W)
        tl.store(dx_ptr + row[:, None] * D + idx[None, :], (gh - xhat * c[:, None]) * rstd[:, None], mask=m)


@triton.jit
def _dw_tile(g_ptr, x_ptr, rstd_ptr, r0, cols, R, D, ROWS: tl.constexpr):
    """float64 g * xhat over a [ROWS, cols] tile (0 outside the matrix)."""
    rows = r0 + tl.arange(0, ROWS)
    m = (rows[:, None] < R) & (cols[None, :] < D)
    off = rows[:, None].to(tl.int64) * D + cols[None, :]
    g = tl.load(g_ptr + off, mask=m, other=0.0)
    x = tl.load(x_ptr + off, mask=m, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < R, other=0.0)
    return g.to(tl.float64) * (x * rstd[:, None]).to(tl.float64)


@triton.jit(do_not_specialize=["R", "D", "span"])
def _dw_stats_kernel(g_ptr, x_ptr, rstd_ptr, amax_ptr, flags_ptr, R, D, span,
                     ROWS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.program_id(1)
    amax = tl.zeros([BLOCK], tl.float64)
    fl = tl.zeros([BLOCK], tl.int32)
    for r in range(0, span, ROWS):
        p = _dw_tile(g_ptr, x_ptr, rstd_ptr, part * span + r, cols, R, D, ROWS)
        amax = tl.maximum(amax, tl.max(finite_abs(p), 0))
        fl = fl | or_reduce(flags_of(p), 0)
    tl.store(amax_ptr + part * D + cols, amax, mask=cols < D)
    tl.store(flags_ptr + part * D + cols, fl, mask=cols < D)


@triton.jit
def _col_max(amax_ptr, cols, S, D, S_POW2: tl.constexpr):
    j = tl.arange(0, S_POW2)
    a = tl.load(amax_ptr + j[:, None] * D + cols[None, :], mask=(j[:, None] < S) & (cols[None, :] < D), other=0.0)
    return tl.max(a, 0)


@triton.jit(do_not_specialize=["R", "D", "span", "S", "top"])
def _dw_sum_kernel(g_ptr, x_ptr, rstd_ptr, amax_ptr, part_ptr, R, D, span, S, top,
                   S_POW2: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.program_id(1)
    s = scale_shift(_col_max(amax_ptr, cols, S, D, S_POW2), top)
    acc = tl.zeros([BLOCK], tl.int64)
    for r in range(0, span, ROWS):
        p = _dw_tile(g_ptr, x_ptr, rstd_ptr, part * span + r, cols, R, D, ROWS)
        acc += tl.sum(to_fixed(p, s[None, :]), 0)  # integer adds: any order, same sum
    tl.store(part_ptr + part * D + cols, acc, mask=cols < D)


@triton.jit(do_not_specialize=["D", "S", "top"])
def _dw_finish_kernel(amax_ptr, flags_ptr, part_ptr, dw_ptr, D, S, top, S_POW2: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    j = tl.arange(0, S_POW2)
    m = (j[:, None] < S) & (cols[None, :] < D)
    off = j[:, None] * D + cols[None, :]
    s = scale_shift(_col_max(amax_ptr, cols, S, D, S_POW2), top)
    total = tl.sum(tl.load(part_ptr + off, mask=m, other=0), 0)
    fl = or_reduce(tl.load(flags_ptr + off, mask=m, other=0), 0)
    dw = tl.where(fl != 0, nonfinite_sum(fl).to(tl.float32), from_fixed(total, s).to(tl.float32))
    tl.store(dw_ptr + cols, dw, mask=cols < D)


def _row_tile(d: int) -> tuple[int, int]:
    """(rows per program, columns per step): a long row has a program to itself; short rows (the per-head QK
    norm's 128) share one, ROW_TILE elements a step."""
    block = min(pow2_at_least(d), LONG_ROW_STEP)
    return max(1, ROW_TILE // block), block


def _forward(x2: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    r, d = x2.shape
    y = torch.empty_like(x2)
    rstd = torch.empty(r, dtype=F32, device=x2.device)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(d)
    rows, block = _row_tile(d)
    _forward_kernel[(cdiv(r, rows),)](x2, weight if weight is not None else x2, y, rstd, r, d, top,
                                      _double_bits(1.0 / d), eps, HAS_W=weight is not None, R=rows, BLOCK=block,
                                      num_warps=8, **BR_OPTIONS)
    return y, rstd


def _dx(g2, x2, weight, rstd) -> torch.Tensor:
    r, d = x2.shape
    dx = torch.empty_like(x2)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(d)
    rows, block = _row_tile(d)
    _dx_kernel[(cdiv(r, rows),)](g2, x2, weight if weight is not None else x2, rstd, dx, r, d, top,
                                 _double_bits(1.0 / d), HAS_W=weight is not None, R=rows, BLOCK=block, num_warps=8,
                                 **BR_OPTIONS)
    return dx


def _dw(g2, x2, rstd, splits: int | None = None) -> torch.Tensor:
    """Exact column sums of g * xhat over all rows (ref: exact_sum(gx, dim=0))."""
    r, d = x2.shape
    cb = cdiv(d, COL_BLOCK)
    s = splits or max(1, min(cdiv(r, 8 * COL_ROWS), cdiv(1024, cb)))
    span = cdiv(cdiv(r, s), COL_ROWS) * COL_ROWS
    s = cdiv(r, span)
    dev = x2.device
    amax = torch.empty(s, d, dtype=torch.float64, device=dev)
    flags = torch.empty(s, d, dtype=torch.int32, device=dev)
    parts = torch.empty(s, d, dtype=torch.int64, device=dev)
    dw = torch.empty(d, dtype=F32, device=dev)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(r)
    sp = pow2_at_least(s)
    _dw_stats_kernel[(cb, s)](g2, x2, rstd, amax, flags, r, d, span, ROWS=COL_ROWS, BLOCK=COL_BLOCK, **BR_OPTIONS)
    _dw_sum_kernel[(cb, s)](g2, x2, rstd, amax, parts, r, d, span, s, top, S_POW2=sp, ROWS=COL_ROWS,
                            BLOCK=COL_BLOCK, **BR_OPTIONS)
    _dw_finish_kernel[(cb,)](amax, flags, parts, dw, d, s, top, S_POW2=sp, BLOCK=COL_BLOCK, **BR_OPTIONS)
    return dw


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        d = x.shape[-1]
        y, rstd = _forward(x.contiguous().reshape(-1, d), weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y.reshape(x.shape)

    @staticmethod
    @once_differentiable  # as the reference: the backward is not itself differentiable
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        d = x.shape[-1]
        x2, g2 = x.contiguous().reshape(-1, d), g.contiguous().reshape(-1, d)
        dx = _dx(g2, x2, weight, rstd).reshape(x.shape) if ctx.needs_input_grad[0] else None
        dw = _dw(g2, x2, rstd) if weight is not None and ctx.needs_input_grad[1] else None
        return dx, dw, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of float32 x [..., D] over D, times `weight` [D]: the bits of kernels.ref.rmsnorm.rmsnorm."""
    if not on_triton(x, weight) or x.dim() < 1 or x.numel() == 0 or x.dtype != F32:
        return ref.rmsnorm(x, weight, eps)
    ref.expect("rmsnorm", "x", x, dtype=F32)
    if weight is not None:
        ref.expect("rmsnorm", "weight", weight, dtype=F32, shape=(x.shape[-1],))
        weight = weight.contiguous()
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps == eps and 0 <= eps < float("inf")):
        raise ValueError(f"rmsnorm: argument 'eps' must be a finite float >= 0, got {eps!r}")
    # the reference's float32 eps (a host double -> float cast), passed as an exactly representable float
    eps32 = float(torch.tensor(float(eps), dtype=F32))
    return _RMSNorm.apply(x, weight, eps32)


def __getattr__(name: str):
    return getattr(ref, name)
