"""Triton twin of kernels/ref/swiglu.py: silu(gate) * up on [..., 2F] = [gate | up], and its backward."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels.ref import swiglu as ref
from kernels.triton.elementary import sigmoid_f32, silu_f32
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton

BLOCK = 1024


@triton.jit(do_not_specialize=["F"])
def _forward_kernel(x_ptr, y_ptr, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < F
    gate = tl.load(x_ptr + row * 2 * F + col, mask=m, other=0.0)
    up = tl.load(x_ptr + row * 2 * F + F + col, mask=m, other=0.0)
    tl.store(y_ptr + row * F + col, silu_f32(gate) * up, mask=m)


@triton.jit(do_not_specialize=["F"])
def _backward_kernel(x_ptr, g_ptr, dx_ptr, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < F
    gate = tl.load(x_ptr + row * 2 * F + col, mask=m, other=0.0)
    up = tl.load(x_ptr + row * 2 * F + F + col, mask=m, other=0.0)
    g = tl.load(g_ptr + row * F + col, mask=m, other=0.0)
    s = sigmoid_f32(gate)
    dgate = (g * up) * (s * (1.0 + gate * (1.0 - s)))  # the reference's float32 expression, op for op
    dup = g * silu_f32(gate)  # recomputed: the forward's bits
    tl.store(dx_ptr + row * 2 * F + col, dgate, mask=m)
    tl.store(dx_ptr + row * 2 * F + F + col, dup, mask=m)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        x = gate_up.contiguous()
        f = x.shape[-1] // 2
        y = torch.empty((*x.shape[:-1], f), dtype=x.dtype, device=x.device)
        rows = x.numel() // (2 * f)
        if rows:
            _forward_kernel[(rows, cdiv(f, BLOCK))](x, y, f, BLOCK=BLOCK, **BR_OPTIONS)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        f = x.shape[-1] // 2
        dx = torch.empty_like(x)
        rows = x.numel() // (2 * f)
        if rows:
            _backward_kernel[(rows, cdiv(f, BLOCK))](x, g.contiguous(), dx, f, BLOCK=BLOCK, **BR_OPTIONS)
        return dx


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for float32 [..., 2F]: the bits of kernels.ref.swiglu.swiglu."""
    if not on_triton(gate_up) or gate_up.dtype != torch.float32 or gate_up.dim() < 1 \
            or gate_up.shape[-1] % 2 or gate_up.shape[-1] == 0:
        return ref.swiglu(gate_up)
    return _SwiGLU.apply(gate_up)


def __getattr__(name: str):
    return getattr(ref, name)
