"""Fused AdamW step (decoupled weight decay) for bf16 or float32 params, float32 moments, in place.

Op order, each a separate float32 op (the definition; a fused kernel must keep it):
  p, g = float32(param), float32(grad)                       # exact widening, once
  m = m * b1 + g * (1 - b1);  v = v * b2 + (g * g) * (1 - b2)
  m_hat = m / bc1;  v_hat = v / bc2                          # bc = 1 - beta^t, elementary.bias_correction
  update = m_hat / (sqrt(v_hat) + eps)                       # sqrt correctly rounded (elementary.sqrt_)
  p = (p - p * lr_wd) - update * lr                          # lr_wd = float32(lr * weight_decay as doubles)
  param = p rounded to param.dtype, once
Every host scalar (b1, 1 - b1, bc1, lr, ...) is computed as an IEEE double and cast to a float32 0-dim
tensor, so no division by a Python scalar and no libm appears anywhere.
"""
from __future__ import annotations

import math

import torch

from kernels.ref.checks import expect, same_device
from kernels.ref.elementary import bias_correction, sqrt_

F32 = torch.float32
PARAM_DTYPES = (torch.float32, torch.bfloat16)


def _f32(v: float, device) -> torch.Tensor:
    """A host double as a float32 0-dim tensor (the double -> float cast is IEEE, the same everywhere)."""
    return torch.tensor(float(v), dtype=F32, device=device)


def _check_scalar(name: str, v, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"adamw_step: argument {name!r} must be a finite float in {lb}{lo}, {hi}{rb}, got {v!r}")


def adamw_step(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, step: int,
               lr: float, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8,
               weight_decay: float = 0.0) -> torch.Tensor:
    """One AdamW step at `step` (1-based): updates param, m and v in place and returns param."""
    expect("adamw_step", "param", param, dtype=PARAM_DTYPES)
    expect("adamw_step", "grad", grad, dtype=PARAM_DTYPES, shape=tuple(param.shape))
    expect("adamw_step", "m", m, dtype=F32, shape=tuple(param.shape))
    expect("adamw_step", "v", v, dtype=F32, shape=tuple(param.shape))
    same_device("adamw_step", param=param, grad=grad, m=m, v=v)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"adamw_step: argument 'step' must be an int >= 1, got {step!r}")
    _check_scalar("lr", lr, 0.0, math.inf, hi_open=True)
    _check_scalar("beta1", beta1, 0.0, 1.0, hi_open=True)
    _check_scalar("beta2", beta2, 0.0, 1.0, hi_open=True)
    _check_scalar("eps", eps, 0.0, math.inf, lo_open=True, hi_open=True)
    _check_scalar("weight_decay", weight_decay, 0.0, math.inf, hi_open=True)

    dev = param.device
    b1, omb1 = _f32(beta1, dev), _f32(1.0 - beta1, dev)
    b2, omb2 = _f32(beta2, dev), _f32(1.0 - beta2, dev)
    bc1 = _f32(bias_correction(beta1, step), dev)
    bc2 = _f32(bias_correction(beta2, step), dev)
    lr_t, lr_wd, eps_t = _f32(lr, dev), _f32(lr * weight_decay, dev), _f32(eps, dev)

    with torch.no_grad():
        p = param.to(F32)
        g = grad.to(F32)
        m.copy_(m * b1 + g * omb1)
        v.copy_(v * b2 + (g * g) * omb2)
        # tensor / tensor division: correctly rounded everywhere (a Python-scalar divisor is not)
        update = (m / bc1) / (sqrt_(v / bc2) + eps_t)
        p = (p - p * lr_wd) - update * lr_t
        param.copy_(p.to(param.dtype))  # the one rounding back to the param dtype
    return param


def clip_coefficient(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """min(1, max_norm / (total_norm + 1e-6)) as a float32 0-dim tensor (tensor division); NaN stays NaN."""
    expect("clip_coefficient", "total_norm", total_norm, dtype=F32, ndim=0)
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or \
            not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"clip_coefficient: argument 'max_norm' must be a finite float > 0, got {max_norm!r}")
    dev = total_norm.device
    coef = _f32(max_norm, dev) / (total_norm + _f32(1e-6, dev))
    return torch.where(coef > 1.0, _f32(1.0, dev), coef)  # NaN > 1 is false: a NaN norm stays visible
