"""Causal (optionally sliding-window) GQA attention with the P.V product in int8 (OPEN-1B 3.1, 3.2).

Forward: logits = hp_matmul(q, k^T) * scale (int8 slices, exact by construction), masked with -inf
(our exp of -inf is exactly 0), our softmax, then P.V in int8 per block of `pv_block` keys: P per query
row and block with scale (row max)/127, V per block and head-dim column with scale (amax)/127, exact
int8 GEMMs, dequantized in float32 and accumulated exactly in int64 fixed point whose scale comes from
the whole V column before the pass, so neither block order nor a split over blocks can change a bit.
Backward: straight-through through the quantizers, i.e. the gradient of unquantized softmax(QK^T)V,
every contraction through hp_matmul_. GQA: query head h uses kv head h // (Hq/Hkv); queries are viewed
as [B, Hkv, G*T, D] so dK and dV contract over (query head, query) jointly, one exact int64 sum.
Non-finite inputs: a query row whose P holds NaN, or a head-dim column of V holding a non-finite
value, comes out NaN (the quantizers see zeros there, so no NaN is ever cast to int8).
"""
from __future__ import annotations

import math

import torch

from kernels.ref import fixed
from kernels.ref.checks import expect, same_device
from kernels.ref.contraction import hp_matmul_
from kernels.ref.elementary import rsqrt_
from kernels.ref.intmm import int8_bmm
from kernels.ref.softmax import softmax_, softmax_backward

F32 = torch.float32
QMAX = 127.0
MAX_PV_BLOCK = 1024  # 127 * 127 * 1024 < 2^24: every block's int32 sum converts to float32 exactly


def default_scale(d: int, device=None) -> torch.Tensor:
    """1/sqrt(d) as a float32 0-dim tensor, from our rsqrt (no libm)."""
    return rsqrt_(torch.tensor(float(d), dtype=F32, device=device))


def allowed_keys(t: int, causal: bool, window: int | None, device=None) -> torch.Tensor | None:
    """[T, T] bool: query i sees key j iff j <= i (causal) and i - window < j; None when all are seen."""
    if not causal:
        return None
    i = torch.arange(t, device=device).view(-1, 1)
    j = torch.arange(t, device=device).view(1, -1)
    ok = j <= i
    if window is not None:
        ok = ok & (j > i - window)
    return ok


def quantize_int8(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of finite `x` with scale amax/127 (amax broadcasts); returns (int8, float32 scale)."""
    # tensor/tensor divisions only: CUDA turns division by a Python scalar into a reciprocal multiply
    scale = amax / torch.full_like(amax, QMAX)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(x / safe), -QMAX, QMAX)
    return q.to(torch.int8), scale


def pv_int8(p: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """P [..., M, T] (probabilities in [0, 1]) @ V [..., T, D] in int8 per block of `block` keys,
    the blocks' dequantized products summed exactly in int64 fixed point."""
    t = v.shape[-2]
    p_bad = fixed.nonfinite_along(p, -1)
    v_bad = fixed.nonfinite_along(v, -2)
    p = fixed.finite_or_zero(p)
    v = fixed.finite_or_zero(v)
    # |block sum| <= keys in block * column amax (P <= 1), so T * amax bounds the total: one spare bit
    # covers the few float32 roundings of the dequantization
    s = fixed.scale_exponent(torch.amax(v.abs(), dim=-2, keepdim=True), t) - 1
    acc = None
    for b0 in range(0, t, block):
        pb, vb = p[..., b0:b0 + block], v[..., b0:b0 + block, :]
        qp, sp = quantize_int8(pb, torch.amax(pb, dim=-1, keepdim=True))
        qv, sv = quantize_int8(vb, torch.amax(vb.abs(), dim=-2, keepdim=True))
        c = (int8_bmm(qp, qv).to(F32) * sp) * sv
        part = fixed.to_fixed(c, s)
        acc = part if acc is None else acc + part
    out = fixed.from_fixed(acc, s)
    nan = torch.full_like(out, math.nan)
    return torch.where(p_bad | v_bad, nan, out)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, allowed, scale, pv_block):
        b, hq, t, d = q.shape
        hkv = k.shape[1]
        g = hq // hkv
        qg = q.reshape(b, hkv, g * t, d)
        logits = hp_matmul_(qg, k.transpose(-1, -2)) * scale
        if allowed is not None:
            neg = torch.full((), -math.inf, dtype=F32, device=q.device)
            logits = torch.where(allowed, logits.view(b, hkv, g, t, t), neg).view(b, hkv, g * t, t)
        p = softmax_(logits, -1)
        ctx.save_for_backward(qg, k, v, p, scale)
        return pv_int8(p, v, pv_block).reshape(b, hq, t, d)

    @staticmethod
    def backward(ctx, go):
        qg, k, v, p, scale = ctx.saved_tensors
        b, hkv, gt, d = qg.shape
        gog = go.reshape(b, hkv, gt, d)
        dq = dk = dv = None
        if ctx.needs_input_grad[2]:
            dv = hp_matmul_(p.transpose(-1, -2), gog)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            dp = hp_matmul_(gog, v.transpose(-1, -2))
            # straight-through: the unquantized softmax backward, P * (dP - rowsum(P * dP))
            ds = softmax_backward(p, dp, -1)
            if ctx.needs_input_grad[0]:
                dq = (hp_matmul_(ds, k) * scale).reshape(go.shape)
            if ctx.needs_input_grad[1]:
                dk = hp_matmul_(ds.transpose(-1, -2), qg) * scale
        return dq, dk, dv, None, None, None


def _check(q, k, v, causal, window, scale, pv_block) -> None:
    op = "attention"
    expect(op, "q", q, dtype=F32, ndim=4)
    b, hq, t, d = q.shape
    expect(op, "k", k, dtype=F32, shape=(b, None, t, d))
    expect(op, "v", v, dtype=F32, shape=tuple(k.shape))
    same_device(op, q=q, k=k, v=v)
    hkv = k.shape[1]
    if t < 1 or d < 1 or hkv < 1 or hq % hkv:
        raise ValueError(f"{op}: argument 'k' must have a head count dividing q's {hq} (and T, D >= 1), "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not isinstance(causal, bool):
        raise ValueError(f"{op}: argument 'causal' must be a bool, got {causal!r}")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"{op}: argument 'window' must be None or an int >= 1, got {window!r}")
        if not causal:
            raise ValueError(f"{op}: argument 'window' needs causal=True, got window={window}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"{op}: argument 'scale' must be None or a finite float > 0, got {scale!r}")
    if isinstance(pv_block, bool) or not isinstance(pv_block, int) or not 1 <= pv_block <= MAX_PV_BLOCK:
        raise ValueError(f"{op}: argument 'pv_block' must be an int in 1..{MAX_PV_BLOCK}, got {pv_block!r}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              window: int | None = None, scale: float | None = None, pv_block: int = 64) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v with int8 P.V: q [B, Hq, T, D], k, v [B, Hkv, T, D] -> [B, Hq, T, D]."""
    _check(q, k, v, causal, window, scale, pv_block)
    d = q.shape[-1]
    # a host float becomes float32 by one IEEE rounding; the default avoids libm entirely
    sc = default_scale(d, q.device) if scale is None else torch.tensor(float(scale), dtype=F32, device=q.device)
    allowed = allowed_keys(q.shape[2], causal, window, q.device)
    return _Attention.apply(q, k, v, allowed, sc, pv_block)
