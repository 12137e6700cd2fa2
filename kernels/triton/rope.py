"""Triton twin of apply_rope in kernels/ref/rope.py: the half-split rotation and its transpose.

(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), each product and difference rounded separately
(enable_fp_fusion=False); the backward rotates by -sin (an exact negation). Tables stay the reference's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.ref import rope as ref
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, pow2_at_least


@triton.jit(do_not_specialize=["n_rows", "T", "H"])
def _rotate_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, n_rows, T, H,
                   NEG_SIN: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    m = (rows[:, None] < n_rows) & (cols[None, :] < H)
    xo = rows[:, None] * (2 * H) + cols[None, :]
    to = (rows % T)[:, None] * H + cols[None, :]
    x1 = tl.load(x_ptr + xo, mask=m, other=0.0)
    x2 = tl.load(x_ptr + xo + H, mask=m, other=0.0)
    c = tl.load(cos_ptr + to, mask=m, other=0.0)
    s = tl.load(sin_ptr + to, mask=m, other=0.0)
    if NEG_SIN:
        s = -s
    tl.store(y_ptr + xo, x1 * c - x2 * s, mask=m)
    tl.store(y_ptr + xo + H, x2 * c + x1 * s, mask=m)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neg_sin: bool) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    t, h = cos.shape
    n_rows = x.numel() // (2 * h)
    bh = pow2_at_least(h)
    rows = max(1, 2048 // bh)
    if n_rows:
        _rotate_kernel[(cdiv(n_rows, rows),)](x, cos.contiguous(), sin.contiguous(), y, n_rows, t, h,
                                              NEG_SIN=neg_sin, ROWS=rows, BLOCK_H=bh, **BR_OPTIONS)
    return y


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, False)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return _rotate(g, cos, sin, True), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate float32 x [..., T, head_dim] by tables [T, head_dim // 2]: the bits of ref.apply_rope."""
    ok = on_triton(x, cos, sin) and x.dtype == torch.float32 and x.dim() >= 2 and x.shape[-1] >= 2 \
        and x.shape[-1] % 2 == 0 and cos.dtype == sin.dtype == torch.float32 \
        and tuple(cos.shape) == tuple(sin.shape) == (x.shape[-2], x.shape[-1] // 2)
    if not ok:
        return ref.apply_rope(x, cos, sin)  # also the reference's argument errors
    return _Rope.apply(x, cos, sin)


def __getattr__(name: str):
    return getattr(ref, name)
