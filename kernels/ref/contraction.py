"""Higher-precision BR contraction by int8 slicing (the Ozaki idea), for attention logits, the LM head
and the embedding-side products.

Each row of A (and each column of B) is scaled by a power of two from its largest magnitude and split
into `slices` int8 slices of 7 bits each (|slice| <= 64). Slice products are exact int32 GEMMs; the
pairs with i + j < slices are combined exactly in int64 with shifts, converted once to float64, scaled
by exact powers of two and rounded once to float32. Bits are fixed by construction on every device.
Accuracy: operands keep 7*slices - 1 bits below their row/column maximum; 3 slices give a relative
error of about 1e-6 of sum_k |a_ik b_kj| on Gaussian operands, under 1e-4 with outlier columns
(tests/kernels/test_core.py, test_contraction_accuracy_vs_float64, checks it against float64).
Non-finite inputs make their whole output row/column NaN (deterministic, loud).
"""
from __future__ import annotations

import torch

from kernels.ref import fixed
from kernels.ref.checks import expect, same_device
from kernels.ref.intmm import int8_bmm

SLICE_BITS = 7
DEFAULT_SLICES = 3


def split_rows(a: torch.Tensor, slices: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Split float32 rows (last dim is contracted) into int8 slices; returns (slices, row exponent e).

    a ~= 2^(e - 6) * sum_i slice_i * 2^(-7 i), with |a| < 2^e per row; every step is exact in float64.
    """
    finite = fixed.finite_or_zero(a).to(torch.float64)
    e = fixed.frexp_exponent(torch.amax(finite.abs(), dim=-1, keepdim=True))
    r = finite * fixed.pow2(6 - e)                      # |r| < 64, exact
    out = []
    for i in range(slices):
        q = torch.round(r)                              # |q| <= 64 fits int8
        out.append(q.to(torch.int8))
        r = (r - q) * float(1 << SLICE_BITS)            # exact: q is r's nearest integer
    return out, e


def _bad_rows(a: torch.Tensor) -> torch.Tensor:
    return fixed.nonfinite_along(a, -1)


def hp_matmul_(a: torch.Tensor, b: torch.Tensor, slices: int = DEFAULT_SLICES) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] -> float32 [..., M, N], without autograd (see module doc)."""
    bt = b.transpose(-1, -2)
    sa, ea = split_rows(a, slices)
    sb, eb = split_rows(bt, slices)
    acc = None
    for i in range(slices):
        for j in range(slices - i):
            p = int8_bmm(sa[i], sb[j].transpose(-1, -2)).to(torch.int64)
            p = p << (SLICE_BITS * (2 * (slices - 1) - i - j))   # exact: < 2^31 * 2^(14 (slices-1))
            acc = p if acc is None else acc + p
    low = 6 + SLICE_BITS * (slices - 1)
    out = acc.to(torch.float64) * fixed.pow2(ea - low) * fixed.pow2(eb - low).transpose(-1, -2)
    bad = _bad_rows(a) | _bad_rows(bt).transpose(-1, -2)
    return torch.where(bad, torch.full_like(out, float("nan")), out).to(torch.float32)


class _HpMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, slices):
        ctx.save_for_backward(a, b)
        ctx.slices = slices
        return hp_matmul_(a, b, slices)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = hp_matmul_(g, b.transpose(-1, -2), ctx.slices)
        if ctx.needs_input_grad[1]:
            gb = hp_matmul_(a.transpose(-1, -2), g, ctx.slices)
        return ga, gb, None


def hp_matmul(a: torch.Tensor, b: torch.Tensor, slices: int = DEFAULT_SLICES) -> torch.Tensor:
    """Differentiable BR matmul a [..., M, K] @ b [..., K, N] (same batch dims) in float32."""
    expect("hp_matmul", "a", a, dtype=torch.float32)
    expect("hp_matmul", "b", b, dtype=torch.float32, ndim=a.dim())
    same_device("hp_matmul", a=a, b=b)
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"hp_matmul: shapes 'a' {tuple(a.shape)} and 'b' {tuple(b.shape)} do not contract")
    if not 1 <= slices <= 4:
        raise ValueError(f"hp_matmul: argument 'slices' must be in 1..4, got {slices}")
    return _HpMatmul.apply(a, b, slices)
