"""Elementary functions of our own: no torch transcendental, no libm (BR contract point 5).

Each evaluates in float64 from IEEE `+ - * /`, exact power-of-two scaling and integer ops, then rounds
once to float32. Separate elementwise ops (never addcmul/lerp), so no FMA can contract them. The float64
result is accurate to ~1e-15 relative, so the float32 output is the correctly rounded value except when
the exact result lies within ~1e-8 ulp of a rounding tie: the tested bound is < 1 ulp (tests/kernels).
"""
from __future__ import annotations

import math

import torch

from kernels.ref.checks import expect
from kernels.ref.fixed import pow2

F32 = torch.float32
F64 = torch.float64

LOG2E = 1.4426950408889634
# ln 2 split (fdlibm): LN2_HI has 32 significant bits, so k * LN2_HI is exact for |k| < 2^21.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
TWO_OVER_PI = 6.36619772367581382433e-01
# pi/2 split in three 33-bit parts (fdlibm): k * part is exact for |k| < 2^20.
PIO2_1 = 1.57079632673412561417e+00
PIO2_2 = 6.07710050630396597660e-11
PIO2_3 = 2.02226624871116645580e-21
SQRT_HALF = 0.70710678118654752440

# 1/n! are IEEE quotients of exactly representable integers: the same double on every host.
_INV_FACT = [1.0 / math.factorial(n) for n in range(20)]


def _alt(i: int) -> float:
    """(-1)^i without a float pow."""
    return -1.0 if i % 2 else 1.0


def _horner(r: torch.Tensor, coeffs: list[float]) -> torch.Tensor:
    """sum_i coeffs[i] * r^i by Horner with separate * and + (no FMA possible in eager ops)."""
    p = torch.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p.mul_(r).add_(c)  # in place: the same roundings, without a fresh tensor per term
    return p


def _scale2(p: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """p * 2^k for integer k in [-1100, 1100], in two exact halves (pow2 covers [-1022, 1023])."""
    k1 = torch.div(k, 2, rounding_mode="floor")
    return (p * pow2(k1)) * pow2(k - k1)


def exp64(x: torch.Tensor) -> torch.Tensor:
    """exp of a float64 tensor: x = k ln2 + r, |r| <= ln2/2, degree-13 Taylor polynomial, times 2^k."""
    xc = torch.clamp(x, -745.5, 709.9)
    k = torch.round(xc * LOG2E)
    r = (xc - k * LN2_HI) - k * LN2_LO
    y = _scale2(_horner(r, _INV_FACT[:14]), k.to(torch.int64))
    y = torch.where(x > 709.9, torch.full_like(y, math.inf), y)
    return torch.where(torch.isnan(x), x, y)


def log64(x: torch.Tensor) -> torch.Tensor:
    """log of a positive float64 tensor: x = m 2^e, m in [sqrt(1/2), sqrt(2)), 2 atanh((m-1)/(m+1)) series."""
    m, e = torch.frexp(x)
    low = m < SQRT_HALF
    m = torch.where(low, m + m, m)
    e = (e - low.to(e.dtype)).to(F64)
    f = m - 1.0
    s = f / (f + 2.0)
    s2 = s * s
    # 2 atanh(s) = 2 s (1 + s^2/3 + s^4/5 + ...); |s| <= 0.1716 so 12 terms reach 1e-17
    series = _horner(s2, [1.0 / (2 * i + 1) for i in range(12)])
    lm = (s + s) * series
    y = e * LN2_HI + (lm + e * LN2_LO)
    y = torch.where(x == 0, torch.full_like(y, -math.inf), y)
    y = torch.where(x < 0, torch.full_like(y, math.nan), y)
    y = torch.where(x == math.inf, x, y)
    return torch.where(torch.isnan(x), x, y)


def sincos64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin x, cos x) of float64 x: Cody-Waite reduction by pi/2 (3 parts), Taylor on |r| <= pi/4.

    Accurate (< 1 float32 ulp after the cast) for |x| <= 2^20; beyond it still deterministic.
    """
    k = torch.round(x * TWO_OVER_PI)
    r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3
    r2 = r * r
    # sin r = r (1 - r^2/3! + ...), cos r = 1 - r^2/2! + ...; |r| <= 0.786 so degree 19/18 reach 1e-18
    s = r * _horner(r2, [_alt(i) * _INV_FACT[2 * i + 1] for i in range(10)])
    c = _horner(r2, [_alt(i) * _INV_FACT[2 * i] for i in range(10)])
    q = torch.remainder(k.to(torch.int64), 4)
    sin = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    cos = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    bad = ~torch.isfinite(x)
    nan = torch.full_like(x, math.nan)
    return torch.where(bad, nan, sin), torch.where(bad, nan, cos)


def sqrt64_of_f32(x: torch.Tensor) -> torch.Tensor:
    """float64 sqrt of float32-representable values: correctly rounded (IEEE 754 requires it)."""
    return torch.sqrt(x.to(F64))  # br-ok: f64 sqrt of float32 values, identical on x86/ARM/H200 (docs/architecture.md)


def _f32(op: str, x: torch.Tensor) -> None:
    expect(op, "x", x, dtype=F32)


# --- forward definitions on float32 tensors (no autograd) ---

def exp_(x: torch.Tensor) -> torch.Tensor:
    return exp64(x.to(F64)).to(F32)


def log_(x: torch.Tensor) -> torch.Tensor:
    return log64(x.to(F64)).to(F32)


def sqrt_(x: torch.Tensor) -> torch.Tensor:
    return sqrt64_of_f32(x).to(F32)


def rsqrt_(x: torch.Tensor) -> torch.Tensor:
    """1/sqrt(x): float64 reciprocal of the correctly rounded sqrt, one Newton step, one cast."""
    x64 = x.to(F64)
    r = 1.0 / sqrt64_of_f32(x)  # br-ok: float division of a host constant by a tensor is tensor division
    r = r * (1.5 - (0.5 * x64) * (r * r))
    r = torch.where(x == 0, torch.full_like(r, math.inf), r)
    r = torch.where(x == math.inf, torch.zeros_like(r), r)
    return r.to(F32)


def reciprocal_(x: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(x) / x


def sigmoid_(x: torch.Tensor) -> torch.Tensor:
    x64 = x.to(F64)
    return (1.0 / (1.0 + exp64(-x64))).to(F32)  # br-ok: 1.0 / tensor is tensor division (correctly rounded)


def silu_(x: torch.Tensor) -> torch.Tensor:
    x64 = x.to(F64)
    return (x64 / (1.0 + exp64(-x64))).to(F32)


def sin_(x: torch.Tensor) -> torch.Tensor:
    return sincos64(x.to(F64))[0].to(F32)


def cos_(x: torch.Tensor) -> torch.Tensor:
    return sincos64(x.to(F64))[1].to(F32)


# --- autograd wrappers: forward above, backward from the saved output with float32 ops ---

def _unary(name: str, forward, grad, save_input: bool):
    """An autograd Function: `forward` on float32, backward `grad(g, saved)` from the saved input or output."""
    def fwd(ctx, x):
        y = forward(x)
        ctx.save_for_backward(x if save_input else y)
        return y

    def bwd(ctx, g):
        return grad(g, ctx.saved_tensors[0])

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


def _silu_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    s = sigmoid_(x)
    return g * (s * (1.0 + x * (1.0 - s)))


# backward formulas: fixed float32 op order, so every device rounds the same way
_Exp = _unary("_Exp", exp_, lambda g, y: g * y, save_input=False)
_Log = _unary("_Log", log_, lambda g, x: g / x, save_input=True)
_Sqrt = _unary("_Sqrt", sqrt_, lambda g, y: g / (y + y), save_input=False)
_Rsqrt = _unary("_Rsqrt", rsqrt_, lambda g, y: g * (((y * y) * y) * -0.5), save_input=False)
_Reciprocal = _unary("_Reciprocal", reciprocal_, lambda g, y: -(g * (y * y)), save_input=False)
_Sigmoid = _unary("_Sigmoid", sigmoid_, lambda g, y: g * (y * (1.0 - y)), save_input=False)
_Silu = _unary("_Silu", silu_, _silu_grad, save_input=True)
_Sin = _unary("_Sin", sin_, lambda g, x: g * cos_(x), save_input=True)
_Cos = _unary("_Cos", cos_, lambda g, x: -(g * sin_(x)), save_input=True)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x, float32, < 1 ulp."""
    _f32("exp", x)
    return _Exp.apply(x)


def log(x: torch.Tensor) -> torch.Tensor:
    """Natural log, float32, < 1 ulp; log(0) = -inf, log(x < 0) = nan."""
    _f32("log", x)
    return _Log.apply(x)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded square root, float32."""
    _f32("sqrt", x)
    return _Sqrt.apply(x)


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    """1/sqrt(x), float32, < 1 ulp."""
    _f32("rsqrt", x)
    return _Rsqrt.apply(x)


def reciprocal(x: torch.Tensor) -> torch.Tensor:
    """1/x, correctly rounded (tensor / tensor)."""
    _f32("reciprocal", x)
    return _Reciprocal.apply(x)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1/(1+e^-x), float32, < 1 ulp."""
    _f32("sigmoid", x)
    return _Sigmoid.apply(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), float32, < 1 ulp."""
    _f32("silu", x)
    return _Silu.apply(x)


def sin(x: torch.Tensor) -> torch.Tensor:
    """sin x, float32, < 1 ulp for |x| <= 2^20 (RoPE angles stay far below)."""
    _f32("sin", x)
    return _Sin.apply(x)


def cos(x: torch.Tensor) -> torch.Tensor:
    """cos x, float32, < 1 ulp for |x| <= 2^20."""
    _f32("cos", x)
    return _Cos.apply(x)


def pow_int(base: float, t: int) -> float:
    """base^t for an integer t >= 0 by binary exponentiation on IEEE doubles (no libm powf)."""
    if t < 0:
        raise ValueError(f"pow_int: argument 't' must be >= 0, got {t}")
    result, b = 1.0, float(base)
    while t:
        if t & 1:
            result = result * b
        b = b * b
        t >>= 1
    return result


def bias_correction(beta: float, t: int) -> float:
    """AdamW's 1 - beta^t as a double, without libm (the anchor's powf forked two machines at step 15)."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"bias_correction: argument 'beta' must be in [0, 1), got {beta}")
    if t < 1:
        raise ValueError(f"bias_correction: argument 't' must be >= 1, got {t}")
    return 1.0 - pow_int(beta, t)
