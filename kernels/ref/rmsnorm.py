"""RMSNorm over the last dim, with a gain (pre-norm, embedding norm) or gain-free (per-head QK norm).

y = (x * rstd) * w with rstd = rsqrt(mean(x^2) + eps). Squares are exact in float64 and the mean is an
exact fixed-point sum times 1/D, rounded once to float32; rsqrt is elementary.rsqrt_ (< 1 ulp).
"""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from kernels.ref.checks import expect, same_device
from kernels.ref.elementary import rsqrt_
from kernels.ref.reduce import exact_mean, exact_sum

F32 = torch.float32
F64 = torch.float64


def _rstd(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """rsqrt(mean(x^2) + eps) per row, keepdim; float32 squares are exact in float64."""
    x64 = x.to(F64)
    ms = exact_mean(x64 * x64, dim=-1, keepdim=True)
    return rsqrt_(ms + eps)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = _rstd(x, eps)
        y = x * rstd
        if weight is not None:
            y = y * weight  # (x * rstd) * w: this order is the definition
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @once_differentiable  # backward is built from BR forward-only ops: no double backward
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        xhat = x * rstd  # the forward's bits
        dx = dw = None
        if ctx.needs_input_grad[0]:
            gh = g * weight if weight is not None else g
            # dx = rstd * (gh - xhat * mean(gh * xhat)); the mean is exact (float64 products, int64 sum)
            c = exact_mean(gh.to(F64) * xhat.to(F64), dim=-1, keepdim=True)
            dx = (gh - xhat * c) * rstd
        if weight is not None and ctx.needs_input_grad[1]:
            d = x.shape[-1]
            gx = (g.to(F64) * xhat.to(F64)).reshape(-1, d)  # float32 products are exact in float64
            # dweight sums over every leading dim: exact, so the batch layout never changes its bits
            dw = exact_sum(gx, dim=0) if gx.shape[0] else torch.zeros(d, dtype=F32, device=x.device)
        return dx, dw, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of float32 x [..., D] over D, times the float32 gain `weight` [D] when given."""
    expect("rmsnorm", "x", x, dtype=F32)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"rmsnorm: argument 'x' must have a non-empty last dim, got shape {tuple(x.shape)}")
    if weight is not None:
        expect("rmsnorm", "weight", weight, dtype=F32, shape=(x.shape[-1],))
        same_device("rmsnorm", x=x, weight=weight)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"rmsnorm: argument 'eps' must be a finite float >= 0, got {eps!r}")
    # eps enters as a float32 tensor built from the host double (a deterministic cast)
    eps_t = torch.tensor(float(eps), dtype=F32, device=x.device)
    return _RMSNorm.apply(x, weight, eps_t)
