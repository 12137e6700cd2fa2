"""Reductions with one canonical result on every device: sum, mean, max, dot, global L2 norm.

Scheme (all of them): exact int64 fixed point (kernels/ref/fixed.py). The only roundings are the
per-addend rounding to the fixed-point grid (relative to the largest addend, so addends more than
2^(62 - ceil(log2 n)) below it lose low bits) and the final int64 -> float64 -> float32 casts.
"""
from __future__ import annotations

import torch

from kernels.ref import fixed
from kernels.ref.checks import expect, same_device
from kernels.ref.elementary import sqrt_

FLOATS = (torch.float32, torch.float64)


def _norm_dim(x: torch.Tensor, dim: int) -> int:
    return dim % x.dim() if x.dim() else 0


def exact_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False, *, scale: float | None = None,
              out_dtype=torch.float32) -> torch.Tensor:
    """Sum over `dim`, computed exactly in int64 fixed point; optionally times float `scale` in float64.

    `scale` is a host float (e.g. the reciprocal 1/n of a mean) applied to the float64 result before the
    final cast; float64 products are IEEE-rounded on every device.
    """
    expect("exact_sum", "x", x, dtype=FLOATS)
    d = _norm_dim(x, dim)
    n = x.shape[d] if x.dim() else 1
    amax = torch.amax(fixed.finite_or_zero(x).abs(), dim=d, keepdim=True)
    s = fixed.scale_exponent(amax, n)
    total = fixed.to_fixed(fixed.finite_or_zero(x), s).sum(dim=d, keepdim=True)  # br-ok: int64 sum is exact
    out = total.to(torch.float64) * fixed.pow2(-s)
    if scale is not None:
        out = out * scale  # br-ok: float64 tensor * host float (IEEE multiply, not a division)
    out = out.to(out_dtype)
    bad = fixed.nonfinite_sum(x, d, True)
    out = torch.where(torch.isfinite(bad), out, bad.to(out_dtype))
    return out if keepdim else out.squeeze(d)


def exact_mean(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Mean over `dim`: the exact sum times the reciprocal of the count (reciprocal multiply, float64)."""
    n = x.shape[_norm_dim(x, dim)] if x.dim() else 1
    return exact_sum(x, dim, keepdim, scale=1.0 / n)


def dot(a: torch.Tensor, b: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Dot product along `dim` of float32 tensors: products are exact in float64, sum exact in int64."""
    expect("dot", "a", a, dtype=torch.float32)
    expect("dot", "b", b, dtype=torch.float32)
    same_device("dot", a=a, b=b)
    if a.shape != b.shape:
        raise ValueError(f"dot: arguments 'a' {tuple(a.shape)} and 'b' {tuple(b.shape)} must have one shape")
    return exact_sum(a.to(torch.float64) * b.to(torch.float64), dim, keepdim)


class _Max(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim):
        m = torch.amax(x, dim=dim, keepdim=True)
        # gradient goes to the first maximal element: ties resolved by position, not by the device
        pos = torch.arange(x.shape[dim], device=x.device).view([-1 if i == dim else 1 for i in range(x.dim())])
        first = torch.amin(torch.where(x == m, pos, x.shape[dim]), dim=dim, keepdim=True)
        ctx.save_for_backward(first)
        ctx.dim, ctx.shape = dim, x.shape
        return m if keepdim else m.squeeze(dim)

    @staticmethod
    def backward(ctx, g):
        (first,) = ctx.saved_tensors
        if g.dim() < len(ctx.shape):
            g = g.unsqueeze(ctx.dim)
        out = torch.zeros(ctx.shape, dtype=g.dtype, device=g.device)
        return out.scatter(ctx.dim, first, g), None, None


def max(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:  # noqa: A001
    """Max over `dim` (exact by nature); the gradient flows to the first maximal element."""
    expect("max", "x", x, dtype=FLOATS)
    return _Max.apply(x, _norm_dim(x, dim), keepdim)


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, scale):
        ctx.dim, ctx.keepdim, ctx.scale, ctx.shape = dim, keepdim, scale, x.shape
        return exact_sum(x, dim, keepdim, scale=scale)

    @staticmethod
    def backward(ctx, g):
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        if ctx.scale is not None:
            g = g * torch.tensor(ctx.scale, dtype=torch.float32, device=g.device)
        return g.expand(ctx.shape).contiguous(), None, None, None


def sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:  # noqa: A001
    """Differentiable exact sum over `dim` (float32)."""
    expect("sum", "x", x, dtype=torch.float32)
    return _Sum.apply(x, _norm_dim(x, dim), keepdim, None)


def mean(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Differentiable exact mean over `dim` (float32): exact sum times the reciprocal of the count."""
    expect("mean", "x", x, dtype=torch.float32)
    d = _norm_dim(x, dim)
    return _Sum.apply(x, d, keepdim, 1.0 / x.shape[d])


def l2_squares(tensors: list[torch.Tensor], who: str = "global_l2_norm") -> list[torch.Tensor]:
    """The elements' squares, exact in float64, one flat tensor per input."""
    for i, t in enumerate(tensors):
        expect(who, f"tensors[{i}]", t, dtype=(torch.float32, torch.bfloat16))
    return [t.to(torch.float64).square().reshape(-1) for t in tensors]


def l2_max_square(sq: list[torch.Tensor], device) -> torch.Tensor:
    """The largest finite square (float64 0-dim; 0 if none): it fixes the one fixed-point scale (max is exact)."""
    return torch.stack([torch.amax(fixed.finite_or_zero(q)) for q in sq if q.numel()]
                       or [torch.zeros((), dtype=torch.float64, device=device)]).amax()


def l2_fixed_sum(sq: list[torch.Tensor], s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 sum of the finite squares on the grid 2^-s, float64 sum of the non-finite ones): both order-free."""
    total = torch.zeros((), dtype=torch.int64, device=s.device)
    bad = torch.zeros((), dtype=torch.float64, device=s.device)
    for q in sq:
        total = total + fixed.to_fixed(fixed.finite_or_zero(q), s).sum()  # br-ok: int64 sum is exact
        bad = bad + fixed.nonfinite_sum(q, 0, False)
    return total, bad


def l2_norm_from_fixed(total: torch.Tensor, s: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """float32(sqrt(float64(float32 sum))), or the non-finite stand-in."""
    norm = sqrt_(fixed.from_fixed(total, s, torch.float32))
    return torch.where(torch.isfinite(bad), norm, bad.to(torch.float32))


def global_l2_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """sqrt(sum of squares) over a list of tensors (gradient clipping), as a 0-dim float32.

    Squares are exact in float64; one fixed-point scale from the largest square over all tensors;
    int64 sums per tensor, added as integers; float32(sqrt(float64(float32 sum))) at the end. The four
    steps are public so that a sharded caller (training/sharding.py) can all-reduce the max and the sums between them.
    """
    if not tensors:
        raise ValueError("global_l2_norm: argument 'tensors' is empty")
    sq = l2_squares(tensors)
    n = 0
    for q in sq:
        n += q.numel()
    s = fixed.scale_exponent(l2_max_square(sq, tensors[0].device), n)
    total, bad = l2_fixed_sum(sq, s)
    return l2_norm_from_fixed(total, s, bad)
