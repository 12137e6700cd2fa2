"""Triton twin of adamw_step in kernels/ref/adamw.py: one fused pass over param, grad, m and v.

The op order is the reference's, each op a separate float32 rounding (enable_fp_fusion=False), the two
divisions div_rn, the sqrt float32(sqrt_rn(float64(v_hat))); the scalars are the reference's float32
casts of its host doubles, loaded from one small tensor.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.ref import adamw as ref
from kernels.ref.elementary import bias_correction
from kernels.triton.ieee import div_rn, sqrt_rn
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, to_device

F32 = torch.float32
BLOCK = 1024  # elements a program
WARPS = 8  # warps a program: 4 elements a thread, 1.19x the 4-warp program's 8 (docs/perf.md's history)


@triton.jit(do_not_specialize=["n"])
def _step_kernel(p_ptr, g_ptr, m_ptr, v_ptr, k_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b1, omb1 = tl.load(k_ptr + 0), tl.load(k_ptr + 1)
    b2, omb2 = tl.load(k_ptr + 2), tl.load(k_ptr + 3)
    bc1, bc2 = tl.load(k_ptr + 4), tl.load(k_ptr + 5)
    lr, lr_wd, eps = tl.load(k_ptr + 6), tl.load(k_ptr + 7), tl.load(k_ptr + 8)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    m = m * b1 + g * omb1
    v = v * b2 + (g * g) * omb2
    m_hat = div_rn(m, tl.broadcast_to(bc1, [BLOCK]))
    v_hat = div_rn(v, tl.broadcast_to(bc2, [BLOCK]))
    update = div_rn(m_hat, sqrt_rn(v_hat.to(tl.float64)).to(tl.float32) + eps)
    p = (p - p * lr_wd) - update * lr
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)  # the one rounding to the param dtype


def scalars(beta1: float, beta2: float, eps: float, lr: float, weight_decay: float, step: int) -> torch.Tensor:
    """The reference's nine float32 scalars, each a host double cast to float32 (on the host)."""
    vals = [beta1, 1.0 - beta1, beta2, 1.0 - beta2, bias_correction(beta1, step), bias_correction(beta2, step),
            lr, lr * weight_decay, eps]
    return torch.stack([torch.tensor(float(v), dtype=F32) for v in vals])


@functools.lru_cache(maxsize=32)
def _device_scalars(beta1: str, beta2: str, eps: str, lr: str, weight_decay: str, step: int,
                    device: torch.device) -> torch.Tensor:
    """scalars(...) on the device, keyed by the doubles' hex (so -0.0 and 0.0 differ): a step's tensors share
    one or two uploads instead of one host-to-device copy, and its wait, per tensor. Never written."""
    hx = float.fromhex
    return to_device(scalars(hx(beta1), hx(beta2), hx(eps), hx(lr), hx(weight_decay), step), device)


def adamw_step(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, step: int,
               lr: float, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8,
               weight_decay: float = 0.0) -> torch.Tensor:
    """One AdamW step in place (param, m, v): the bits of kernels.ref.adamw.adamw_step."""
    tensors = (param, grad, m, v)
    fast = on_triton(*tensors) and all(t.is_contiguous() for t in tensors) \
        and param.dtype in ref.PARAM_DTYPES and grad.dtype in ref.PARAM_DTYPES and m.dtype == v.dtype == F32 \
        and param.shape == grad.shape == m.shape == v.shape
    if not fast or isinstance(step, bool) or not isinstance(step, int) or step < 1:
        return ref.adamw_step(param, grad, m, v, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                              weight_decay=weight_decay)
    for name, val, lo, hi, lo_open, hi_open in (("lr", lr, 0.0, float("inf"), False, True),
                                                ("beta1", beta1, 0.0, 1.0, False, True),
                                                ("beta2", beta2, 0.0, 1.0, False, True),
                                                ("eps", eps, 0.0, float("inf"), True, True),
                                                ("weight_decay", weight_decay, 0.0, float("inf"), False, True)):
        ref._check_scalar(name, val, lo, hi, lo_open, hi_open)
    k = _device_scalars(float(beta1).hex(), float(beta2).hex(), float(eps).hex(), float(lr).hex(),
                        float(weight_decay).hex(), step, param.device)
    n = param.numel()
    if n:
        with torch.no_grad():
            _step_kernel[(cdiv(n, BLOCK),)](param, grad, m, v, k, n, BLOCK=BLOCK, num_warps=WARPS, **BR_OPTIONS)
    return param


def __getattr__(name: str):
    """clip_coefficient is the reference's."""
    return getattr(ref, name)
