"""Triton twins of kernels/ref/elementary.py: exp, sqrt, rsqrt, sigmoid, silu (forward and backward).

Each mirrors the reference op for op: float64 range reduction and Horner steps as separate rounded
`*` and `+` (launched with enable_fp_fusion=False), exact power-of-two scaling, libdevice div_rn /
sqrt_rn, one rounding to float32. Other names of the module are the reference's (module __getattr__).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import elementary as ref
from kernels.ref.checks import expect
from kernels.triton.ieee import INF, div_rn, frexp_exponent, nan_f64, pow2, rint, sqrt_rn
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton

F32 = torch.float32

# the reference's float64 constants, bit for bit (a constexpr next to a float64 operand stays float64)
LOG2E = tl.constexpr(ref.LOG2E)
LN2_HI = tl.constexpr(ref.LN2_HI)
LN2_LO = tl.constexpr(ref.LN2_LO)
C0, C1, C2, C3, C4, C5, C6 = (tl.constexpr(c) for c in ref._INV_FACT[:7])
C7, C8, C9, C10, C11, C12, C13 = (tl.constexpr(c) for c in ref._INV_FACT[7:14])
EXP_HI = tl.constexpr(709.9)  # not a float32: materialized as a float64 tensor (tl.minimum and > would round it)

SQRT_HALF = tl.constexpr(ref.SQRT_HALF)
L0, L1, L2, L3, L4, L5 = (tl.constexpr(1.0 / (2 * i + 1)) for i in range(6))  # ref.log64's series, as doubles
L6, L7, L8, L9, L10, L11 = (tl.constexpr(1.0 / (2 * i + 1)) for i in range(6, 12))

EXP, SQRT, RSQRT, SIGMOID, SILU = 0, 1, 2, 3, 4
BLOCK = 1024


@triton.jit
def exp64(x):
    """ref.exp64: x = k ln2 + r, degree-13 Taylor polynomial by Horner, times 2^k in two exact halves."""
    hi = tl.full(x.shape, EXP_HI, tl.float64)
    xc = tl.minimum(tl.maximum(x, -745.5), hi)
    k = rint(xc * LOG2E)
    r = (xc - k * LN2_HI) - k * LN2_LO
    p = C13 * r + C12  # each step is a rounded * then a rounded + (no FMA: enable_fp_fusion=False)
    p = p * r + C11
    p = p * r + C10
    p = p * r + C9
    p = p * r + C8
    p = p * r + C7
    p = p * r + C6
    p = p * r + C5
    p = p * r + C4
    p = p * r + C3
    p = p * r + C2
    p = p * r + C1
    p = p * r + C0
    ki = k.to(tl.int64)
    k1 = ki >> 1  # floor division by 2 (arithmetic shift), as torch.div(..., rounding_mode="floor")
    y = (p * pow2(k1)) * pow2(ki - k1)
    y = tl.where(x > hi, INF, y)
    return tl.where(x != x, x, y)


@triton.jit
def log64(x):
    """ref.log64 of float64 x: x = m 2^e, m in [sqrt(1/2), sqrt(2)), 2 atanh((m-1)/(m+1)) by Horner, + e ln2."""
    e = frexp_exponent(tl.abs(x))
    h = e >> 1  # 2^-e in two exact halves: a subnormal x has e < -1022
    m = (x * pow2(-h)) * pow2(h - e)  # torch.frexp's mantissa in [0.5, 1), exact
    low = m < tl.full(m.shape, SQRT_HALF, tl.float64)  # a float64 tensor: `m < SQRT_HALF` would round it to float32
    m = tl.where(low, m + m, m)
    ef = (e - low.to(tl.int64)).to(tl.float64)
    f = m - 1.0
    s = div_rn(f, f + 2.0)
    s2 = s * s
    p = L11 * s2 + L10  # rounded * then rounded + (no FMA: enable_fp_fusion=False)
    p = p * s2 + L9
    p = p * s2 + L8
    p = p * s2 + L7
    p = p * s2 + L6
    p = p * s2 + L5
    p = p * s2 + L4
    p = p * s2 + L3
    p = p * s2 + L2
    p = p * s2 + L1
    p = p * s2 + L0
    lm = (s + s) * p
    y = ef * LN2_HI + (lm + ef * LN2_LO)
    y = tl.where(x == 0, -INF, y)
    y = tl.where(x < 0, nan_f64(), y)
    y = tl.where(x == INF, x, y)
    return tl.where(x != x, x, y)


@triton.jit
def exp_f32(x):
    return exp64(x.to(tl.float64)).to(tl.float32)


@triton.jit
def sqrt_f32(x):
    return sqrt_rn(x.to(tl.float64)).to(tl.float32)


@triton.jit
def rsqrt_f32(x):
    """ref.rsqrt_: float64 reciprocal of the correctly rounded sqrt, one Newton step, one cast."""
    x64 = x.to(tl.float64)
    r = div_rn(tl.full(x.shape, 1.0, tl.float64), sqrt_rn(x64))
    r = r * (1.5 - (0.5 * x64) * (r * r))
    r = tl.where(x == 0, INF, r)
    r = tl.where(x == INF, 0.0, r)
    return r.to(tl.float32)


@triton.jit
def sigmoid_f32(x):
    x64 = x.to(tl.float64)
    return div_rn(tl.full(x.shape, 1.0, tl.float64), 1.0 + exp64(-x64)).to(tl.float32)


@triton.jit
def silu_f32(x):
    x64 = x.to(tl.float64)
    return div_rn(x64, 1.0 + exp64(-x64)).to(tl.float32)


@triton.jit
def silu_grad_f32(x):
    """s (1 + x (1 - s)) with s = sigmoid(x): the reference's float32 silu' expression."""
    s = sigmoid_f32(x)
    return s * (1.0 + x * (1.0 - s))


@triton.jit(do_not_specialize=["n"])
def _forward_kernel(x_ptr, y_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    if OP == 0:
        y = exp_f32(x)
    elif OP == 1:
        y = sqrt_f32(x)
    elif OP == 2:
        y = rsqrt_f32(x)
    elif OP == 3:
        y = sigmoid_f32(x)
    else:
        y = silu_f32(x)
    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit(do_not_specialize=["n"])
def _backward_kernel(g_ptr, s_ptr, dx_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    """dx from the upstream g and the saved tensor s (the output y, or the input x for silu)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    s = tl.load(s_ptr + offs, mask=mask, other=1.0)
    if OP == 0:
        dx = g * s
    elif OP == 1:
        dx = div_rn(g, s + s)
    elif OP == 2:
        dx = g * (((s * s) * s) * -0.5)
    elif OP == 3:
        dx = g * (s * (1.0 - s))
    else:
        dx = g * silu_grad_f32(s)
    tl.store(dx_ptr + offs, dx, mask=mask)


def unary(x: torch.Tensor, op: int) -> torch.Tensor:
    """The forward of elementwise op `op` on float32 x (any shape), no autograd."""
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _forward_kernel[(cdiv(n, BLOCK),)](x, y, n, OP=op, BLOCK=BLOCK, **BR_OPTIONS)
    return y


def unary_backward(g: torch.Tensor, saved: torch.Tensor, op: int) -> torch.Tensor:
    g, saved = g.contiguous(), saved.contiguous()
    dx = torch.empty_like(saved)
    n = saved.numel()
    if n:
        _backward_kernel[(cdiv(n, BLOCK),)](g, saved, dx, n, OP=op, BLOCK=BLOCK, **BR_OPTIONS)
    return dx


class _Unary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op):
        y = unary(x, op)
        ctx.save_for_backward(x if op == SILU else y)
        ctx.op = op
        return y

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        return unary_backward(g, saved, ctx.op), None


def _apply(name: str, op: int, x: torch.Tensor) -> torch.Tensor:
    if not on_triton(x):
        return getattr(ref, name)(x)
    expect(name, "x", x, dtype=F32)
    return _Unary.apply(x, op)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x, float32: the bits of kernels.ref.elementary.exp."""
    return _apply("exp", EXP, x)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded square root, float32."""
    return _apply("sqrt", SQRT, x)


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    """1/sqrt(x), float32: the bits of kernels.ref.elementary.rsqrt."""
    return _apply("rsqrt", RSQRT, x)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1/(1+e^-x), float32: the bits of kernels.ref.elementary.sigmoid."""
    return _apply("sigmoid", SIGMOID, x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), float32: the bits of kernels.ref.elementary.silu."""
    return _apply("silu", SILU, x)


def _forward_only(name: str, op: int):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return unary(x, op) if on_triton(x) and x.dtype == F32 else getattr(ref, name)(x)
    fn.__name__ = name
    fn.__doc__ = f"The no-autograd forward kernels.ref.elementary.{name} on float32 x."
    return fn


exp_ = _forward_only("exp_", EXP)
sqrt_ = _forward_only("sqrt_", SQRT)
rsqrt_ = _forward_only("rsqrt_", RSQRT)
sigmoid_ = _forward_only("sigmoid_", SIGMOID)
silu_ = _forward_only("silu_", SILU)


def __getattr__(name: str):
    """Names without a twin are the reference's (a twin never changes what an op means)."""
    return getattr(ref, name)
