"""Softmax and log-sum-exp with one canonical result on every device.

e = exp(x - max) with the subtraction and our exp in float64 (one rounding to float32), s = the exact
fixed-point sum of the float32 e, y = e * (1 / s) with one correctly rounded tensor division.
Error vs float64: a few float32 ulps per element (bound stated in tests/kernels/test_attention_loss.py).
A row holding +inf or only -inf gives NaN (as torch does for +inf); -inf entries give exactly 0.
"""
from __future__ import annotations

import torch

from kernels.ref.checks import expect
from kernels.ref.elementary import exp64, log64, reciprocal_
from kernels.ref.reduce import exact_sum

F32 = torch.float32
F64 = torch.float64


def shifted_exp(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, e, s) along `dim` (kept): m the exact max, e = float32 exp(x - m), s the exact sum of e (float64)."""
    m = torch.amax(x, dim=dim, keepdim=True)
    # x - m is exact in float64 for float32 operands, so e carries only exp's own rounding
    e = exp64(x.to(F64) - m.to(F64)).to(F32)
    s = exact_sum(e, dim, keepdim=True, out_dtype=F64)
    return m, e, s


def softmax_(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of float32 `x` along `dim`, without autograd."""
    _, e, s = shifted_exp(x, dim)
    # reciprocal multiply: one tensor division per row, the same bits on CPU and CUDA
    return e * reciprocal_(s.to(F32))


def logsumexp_(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """log(sum(exp(x))) along `dim` = m + log(s), in float64 from the exact sum, one rounding."""
    m, _, s = shifted_exp(x, dim)
    out = (m.to(F64) + log64(s)).to(F32)
    return out if keepdim else out.squeeze(dim)


def softmax_backward(y: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    """dx = y * (g - <g, y>) along `dim`: products exact in float64, the dot an exact fixed-point sum,
    the rest in float64 with one rounding (g - <g, y> cancels for a dominant y; float64 keeps its bits)."""
    y64, g64 = y.to(F64), g.to(F64)
    d = exact_sum(g64 * y64, dim, keepdim=True, out_dtype=F64)
    return (y64 * (g64 - d)).to(F32)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = softmax_(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, g.contiguous(), ctx.dim), None


class _LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim):
        m, e, s = shifted_exp(x, dim)
        ctx.save_for_backward(e * reciprocal_(s.to(F32)))
        ctx.dim, ctx.keepdim = dim, keepdim
        out = (m.to(F64) + log64(s)).to(F32)
        return out if keepdim else out.squeeze(dim)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        return g * y, None, None


def _dim(op: str, x: torch.Tensor, dim: int) -> int:
    expect(op, "x", x, dtype=F32)
    if x.dim() == 0:
        raise ValueError(f"{op}: argument 'x' must have at least 1 dim, got a 0-dim tensor")
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}: argument 'dim' must be an int in [{-x.dim()}, {x.dim()}), got {dim!r}")
    return dim % x.dim()


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Differentiable BR softmax of float32 `x` along `dim`."""
    return _Softmax.apply(x, _dim("softmax", x, dim))


def logsumexp(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Differentiable BR log-sum-exp of float32 `x` along `dim` (gradient: the softmax)."""
    return _LogSumExp.apply(x, _dim("logsumexp", x, dim), keepdim)
