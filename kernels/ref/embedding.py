"""Token embedding: forward is a gather; the weight gradient is an exact int64 fixed-point scatter-add.

Backward: one global scale from the exact max |grad| over all tokens, headroom ceil(log2 N) bits for N
tokens (no row can collect more than N addends), each grad rounded once to int64, index_add_ on int64
(exact and order-free, atomics included), one conversion back. Rows never indexed are exactly +0.
Error vs float64: at most N * 2^-(s+1) absolute per entry (s the fixed-point shift, so ~2^-(62-log2 N)
of max |grad| per addend), plus the final float32 rounding.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernels.ref import fixed
from kernels.ref.checks import expect, same_device

F32 = torch.float32
F64 = torch.float64
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


def _scatter_count(mask: torch.Tensor, idx: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-row counts of a [N, D] bool mask gathered to [rows, D] by idx: int64, exact."""
    out = torch.zeros((rows, mask.shape[1]), dtype=torch.int64, device=mask.device)
    return out.index_add_(0, idx, mask.to(torch.int64))  # br-ok: int64 index_add is exact and order-free


def _nonfinite_rows(g: torch.Tensor, idx: torch.Tensor, rows: int) -> torch.Tensor:
    """IEEE sums of only the non-finite addends per entry (0 where none): from exact counts of +inf/-inf/nan."""
    pos = _scatter_count(g == float("inf"), idx, rows) > 0
    neg = _scatter_count(g == float("-inf"), idx, rows) > 0
    nan = (_scatter_count(torch.isnan(g), idx, rows) > 0) | (pos & neg)
    out = torch.zeros((rows, g.shape[1]), dtype=F64, device=g.device)
    out = torch.where(pos, torch.full_like(out, float("inf")), out)
    out = torch.where(neg, torch.full_like(out, float("-inf")), out)
    return torch.where(nan, torch.full_like(out, float("nan")), out)


def embedding_grad(ids: torch.Tensor, g: torch.Tensor, rows: int) -> torch.Tensor:
    """dW [rows, D] float32 of the gather weight[ids], for output gradient g [*ids.shape, D]."""
    d = g.shape[-1]
    idx = ids.reshape(-1).to(torch.int64)
    g2 = g.reshape(-1, d).to(F64)  # float32 and bf16 widen exactly
    n = idx.numel()
    if n == 0:
        return torch.zeros((rows, d), dtype=F32, device=g.device)
    finite = fixed.finite_or_zero(g2)
    # one scale for the whole tensor from the exact max: every row shares the same fixed-point grid
    s = fixed.scale_exponent(torch.amax(finite.abs()), n)
    acc = torch.zeros((rows, d), dtype=torch.int64, device=g.device)
    acc.index_add_(0, idx, fixed.to_fixed(finite, s))  # br-ok: int64 index_add is exact and order-free
    out = acc.to(F64) * fixed.pow2(-s)
    if not bool(torch.isfinite(g2).all()):
        bad = _nonfinite_rows(g2, idx, rows)
        out = torch.where(torch.isfinite(bad), out, bad)
    return out.to(F32)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight):
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]
        return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[1])

    @staticmethod
    @once_differentiable  # backward is built from BR forward-only ops: no double backward
    def backward(ctx, g):
        (ids,) = ctx.saved_tensors
        dw = embedding_grad(ids, g, ctx.rows)
        # bf16 weights: float64 -> float32 -> bf16, two explicit roundings, the same on every device
        return None, dw.to(g.dtype)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[ids] for integer ids [...] and weight [V, D] (float32 or bf16) -> [..., D]."""
    expect("embedding", "ids", ids, dtype=(torch.int64, torch.int32))
    expect("embedding", "weight", weight, dtype=WEIGHT_DTYPES, ndim=2)
    same_device("embedding", ids=ids, weight=weight)
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= weight.shape[0]:
            raise ValueError(f"embedding: argument 'ids' must lie in [0, {weight.shape[0]}), "
                             f"got values in [{lo}, {hi}]")
    return _Embedding.apply(ids, weight)
