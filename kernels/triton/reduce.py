"""Triton twins of the exact reductions in kernels/ref/reduce.py: exact_sum, exact_mean, sum, mean,
global_l2_norm.

Many rows: one program per row does both passes (largest finite magnitude and non-finite flags, then
the int64 fixed-point sum at the row's scale, the row re-read from cache). Few long rows: rows are split
over programs, pass 1 takes each split's largest magnitude, pass 2 each split's int64 sum at the row's
scale, pass 3 adds the splits' integers and rounds once. Any split count gives the same bits.
"""
from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from kernels.ref import fixed as ref_fixed, reduce as ref
from kernels.ref.checks import expect
from kernels.triton.fixedpoint import from_fixed, nonfinite_sum, or_reduce, scale_shift, span_stats, to_fixed
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, pow2_at_least, split_spans, upload
from kernels.triton.tables import owner

BLOCK = 1024
TARGET_PROGRAMS = 1024  # enough programs to fill 132 SMs several times over


@triton.jit(do_not_specialize=["n", "span", "S"])
def _stats_kernel(x_ptr, amax_ptr, flags_ptr, n, span, S, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    amax, fl = span_stats(x_ptr + row * n, part.to(tl.int64) * span, span, n, False, BLOCK)
    tl.store(amax_ptr + row * S + part, amax)
    tl.store(flags_ptr + row * S + part, fl)


@triton.jit(do_not_specialize=["n", "span", "S", "top"])
def _sum_kernel(x_ptr, amax_ptr, part_ptr, n, span, S, top, S_POW2: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    j = tl.arange(0, S_POW2)
    s = scale_shift(tl.max(tl.load(amax_ptr + row * S + j, mask=j < S, other=0.0), 0), top)
    base = x_ptr + row * n
    lo = part.to(tl.int64) * span
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, span, BLOCK):  # span is a multiple of BLOCK: blocks never straddle splits
        idx = lo + start + tl.arange(0, BLOCK)
        v = tl.load(base + idx, mask=idx < n, other=0.0).to(tl.float64)
        acc += to_fixed(v, s)  # exact: any order of these integer adds gives the same sum
    tl.store(part_ptr + row * S + part, tl.sum(acc, 0))


@triton.jit
def _result(total, s, fl, scale_bits, dt, HAS_SCALE: tl.constexpr):
    """The int64 total at scale s back to float (one rounding), times the host double, as dtype dt."""
    out = from_fixed(total, s)
    if HAS_SCALE:
        out = out * scale_bits.to(tl.int64).to(tl.float64, bitcast=True)  # the host double, bit for bit
    return tl.where(fl != 0, nonfinite_sum(fl).to(dt), out.to(dt))


@triton.jit(do_not_specialize=["S", "top", "scale_bits"])
def _finish_kernel(amax_ptr, flags_ptr, part_ptr, out_ptr, S, top, scale_bits,
                   HAS_SCALE: tl.constexpr, S_POW2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, S_POW2)
    on = j < S
    s = scale_shift(tl.max(tl.load(amax_ptr + row * S + j, mask=on, other=0.0), 0), top)
    total = tl.sum(tl.load(part_ptr + row * S + j, mask=on, other=0), 0)
    fl = or_reduce(tl.load(flags_ptr + row * S + j, mask=on, other=0), 0)
    tl.store(out_ptr + row, _result(total, s, fl, scale_bits, out_ptr.dtype.element_ty, HAS_SCALE))


@triton.jit(do_not_specialize=["n", "top", "scale_bits"])
def _row_kernel(x_ptr, out_ptr, n, top, scale_bits, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """A whole row in one program (many rows): both passes in one launch, the second from cache."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * n
    amax, fl = span_stats(base, 0, n, n, False, BLOCK)
    s = scale_shift(amax, top)
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc += to_fixed(tl.load(base + idx, mask=idx < n, other=0.0).to(tl.float64), s)
    tl.store(out_ptr + row, _result(tl.sum(acc, 0), s, fl, scale_bits, out_ptr.dtype.element_ty, HAS_SCALE))


@triton.jit
def _split_of(table, starts, T, BF16: tl.constexpr, TPAD: tl.constexpr):
    """(x, lo, span, n): this program's split of its tensor. table[t] = (address, n, span) of tensor t, whose
    splits are programs starts[t].. (kernels/triton/tables)."""
    p = tl.program_id(0)
    t = owner(starts, p, T, TPAD)
    addr = tl.load(table + t * 3)
    if BF16:
        x_ptr = addr.to(tl.pointer_type(tl.bfloat16))
    else:
        x_ptr = addr.to(tl.pointer_type(tl.float32))
    span = tl.load(table + t * 3 + 2)
    return x_ptr, (p - tl.load(starts + t)).to(tl.int64) * span, span, tl.load(table + t * 3 + 1)


@triton.jit(do_not_specialize=["T"])
def _l2_stats_kernel(table, starts, T, amax_ptr, bad_ptr, BF16: tl.constexpr, TPAD: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Per split of the tensors of one dtype: its largest finite square and the float64 sum of its non-finite
    squares."""
    x_ptr, lo, span, n = _split_of(table, starts, T, BF16, TPAD)
    amax, fl = span_stats(x_ptr, lo, span, n, True, BLOCK)
    part = tl.program_id(0)
    tl.store(amax_ptr + part, amax)
    tl.store(bad_ptr + part, nonfinite_sum(fl))  # 0, +inf or NaN (a square is never -inf)


@triton.jit(do_not_specialize=["T"])
def _l2_sum_kernel(table, starts, T, s_ptr, part_ptr, BF16: tl.constexpr, TPAD: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Per split of the tensors of one dtype: the int64 sum of its finite squares at the one scale 2^s (s from
    s_ptr)."""
    x_ptr, lo, span, n = _split_of(table, starts, T, BF16, TPAD)
    s = tl.load(s_ptr)
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, span, BLOCK):
        idx = lo + start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float64)
        acc += to_fixed(v * v, s)  # exact: any order of these integer adds gives the same sum
    tl.store(part_ptr + tl.program_id(0), tl.sum(acc, 0))


def _double_bits(v: float) -> int:
    """The IEEE bits of a host double as a signed int64 (passed to the kernel, which bitcasts back)."""
    return struct.unpack("<q", struct.pack("<d", float(v)))[0]


def row_sum(x2: torch.Tensor, out_dtype: torch.dtype, scale: float | None = None,
            splits: int | None = None) -> torch.Tensor:
    """Exact sum of each row of a contiguous 2-D float tensor [R, n] (n >= 1), times `scale` if given."""
    r, n = x2.shape
    s = splits or max(1, min(cdiv(n, 4 * BLOCK), cdiv(TARGET_PROGRAMS, r)))
    span = cdiv(cdiv(n, s), BLOCK) * BLOCK
    s = cdiv(n, span)
    top = ref_fixed.TOP_BIT - ref_fixed.headroom_bits(n)
    dev = x2.device
    out = torch.empty(r, dtype=out_dtype, device=dev)
    if s == 1 and splits is None:  # rows enough to fill the GPU: one launch, one program per row
        _row_kernel[(r,)](x2, out, n, top, _double_bits(scale or 0.0), HAS_SCALE=scale is not None,
                          BLOCK=min(pow2_at_least(n), 2048), **BR_OPTIONS)
        return out
    amax = torch.empty(r, s, dtype=torch.float64, device=dev)
    flags = torch.empty(r, s, dtype=torch.int32, device=dev)
    parts = torch.empty(r, s, dtype=torch.int64, device=dev)
    sp = pow2_at_least(s)
    _stats_kernel[(r, s)](x2, amax, flags, n, span, s, BLOCK=BLOCK, **BR_OPTIONS)
    _sum_kernel[(r, s)](x2, amax, parts, n, span, s, top, S_POW2=sp, BLOCK=BLOCK, **BR_OPTIONS)
    _finish_kernel[(r,)](amax, flags, parts, out, s, top, _double_bits(scale or 0.0),
                         HAS_SCALE=scale is not None, S_POW2=sp, **BR_OPTIONS)
    return out


def exact_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False, *, scale: float | None = None,
              out_dtype=torch.float32) -> torch.Tensor:
    """kernels.ref.reduce.exact_sum, computed by the Triton kernels (same bits)."""
    expect("exact_sum", "x", x, dtype=ref.FLOATS)
    if not on_triton(x) or x.dim() == 0 or x.numel() == 0:
        return ref.exact_sum(x, dim, keepdim, scale=scale, out_dtype=out_dtype)
    d = dim % x.dim()
    moved = x.movedim(d, -1)
    n = moved.shape[-1]
    out = row_sum(moved.contiguous().reshape(-1, n), out_dtype, scale).reshape(moved.shape[:-1])
    return out.unsqueeze(d) if keepdim else out


def exact_mean(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Mean over `dim`: the exact sum times the host reciprocal of the count (as the reference)."""
    n = x.shape[dim % x.dim()] if x.dim() else 1
    return exact_sum(x, dim, keepdim, scale=1.0 / n)


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, scale):
        ctx.dim, ctx.keepdim, ctx.scale, ctx.shape = dim, keepdim, scale, x.shape
        return exact_sum(x, dim, keepdim, scale=scale)

    @staticmethod
    def backward(ctx, g):
        # the reference's backward: a broadcast and one float32 multiply (BR-safe eager ops)
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        if ctx.scale is not None:
            g = g * upload(ctx.scale, g.device)
        return g.expand(ctx.shape).contiguous(), None, None, None


def sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:  # noqa: A001
    """Differentiable exact sum over `dim` (float32): the bits of kernels.ref.reduce.sum."""
    if not on_triton(x):
        return ref.sum(x, dim, keepdim)
    expect("sum", "x", x, dtype=torch.float32)
    return _Sum.apply(x, dim % x.dim() if x.dim() else 0, keepdim, None)


def mean(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Differentiable exact mean over `dim` (float32): the bits of kernels.ref.reduce.mean."""
    if not on_triton(x):
        return ref.mean(x, dim, keepdim)
    expect("mean", "x", x, dtype=torch.float32)
    d = dim % x.dim() if x.dim() else 0
    return _Sum.apply(x, d, keepdim, 1.0 / x.shape[d])


def global_l2_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """kernels.ref.reduce.global_l2_norm, computed by two launches per dtype and no host sync (same bits).

    Every tensor is split over programs; pass 1 writes each split's largest finite square and the sum of
    its non-finite squares, pass 2 each split's int64 sum at the one scale taken from the max over all
    splits of all tensors. One launch takes every tensor of a dtype (a table row each, kernels/triton/tables):
    a launch per tensor left the GPU idle while the host launched the gradients' ~160 tensors (docs/perf.md).
    The splits share one buffer per statistic, reduced by torch: max, int64 sums and sums of 0/+inf/NaN are
    order-free. The reference's final step ends it.
    """
    for i, t in enumerate(tensors):
        expect("global_l2_norm", f"tensors[{i}]", t, dtype=(torch.float32, torch.bfloat16))
    if not tensors or not on_triton(*tensors) or len({t.device for t in tensors}) > 1:
        return ref.global_l2_norm(tensors)
    flat = [t.contiguous().view(-1) for t in tensors]  # kept alive until the launches are queued
    n = 0
    for x in flat:  # (this module's `sum` is the exact reduction's twin)
        n += x.numel()
    dev = tensors[0].device
    groups = [_l2_table([x for x in flat if x.dtype == dt and x.numel()], dev)
              for dt in (torch.float32, torch.bfloat16)]
    groups = [g for g in groups if g is not None]
    if not groups:  # only empty tensors: nothing to launch
        return ref.global_l2_norm(tensors)
    splits = 0
    for g in groups:
        splits += g["programs"]
    amax = torch.empty(splits, dtype=torch.float64, device=dev)
    bad = torch.empty(splits, dtype=torch.float64, device=dev)
    parts = torch.empty(splits, dtype=torch.int64, device=dev)
    at = 0
    for g in groups:
        _l2_stats_kernel[(g["programs"],)](g["table"], g["starts"], g["T"], amax[at:], bad[at:], **g["meta"],
                                           BLOCK=BLOCK, **BR_OPTIONS)
        at += g["programs"]
    s = ref_fixed.scale_exponent(torch.amax(amax), n)  # the reference's scale from the same max (exact)
    at = 0
    for g in groups:
        _l2_sum_kernel[(g["programs"],)](g["table"], g["starts"], g["T"], s, parts[at:], **g["meta"], BLOCK=BLOCK,
                                         **BR_OPTIONS)
        at += g["programs"]
    return ref.l2_norm_from_fixed(parts.sum(), s, bad.sum())  # br-ok: int64 sum; 0/+inf/NaN sum is order-free


def _l2_table(flat: list[torch.Tensor], device: torch.device) -> dict | None:
    """One launch's table for non-empty flat tensors of one dtype (None for none): a row (address, n, span)
    each, a tensor in up to TARGET_PROGRAMS splits of whole BLOCKs, and each tensor's first program."""
    if not flat:
        return None
    rows, starts, programs = [], [], 0
    for x in flat:
        k, span = split_spans(x.numel(), BLOCK, TARGET_PROGRAMS)
        rows += [x.data_ptr(), x.numel(), span]
        starts.append(programs)
        programs += k
    # pageable and non-blocking: staged at once, no wait for the GPU's queue; one transfer for both
    host = torch.tensor(rows + starts, dtype=torch.int64).to(device, non_blocking=True)
    return {"table": host, "starts": host[len(rows):], "T": len(flat), "programs": programs,
            "meta": dict(BF16=flat[0].dtype == torch.bfloat16, TPAD=pow2_at_least(len(flat)))}


def __getattr__(name: str):
    """Names without a twin (dot, max) are the reference's."""
    return getattr(ref, name)
