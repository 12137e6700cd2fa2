"""int8 GEMM with a block Walsh-Hadamard rotation along the contraction dim (the backward GEMMs of
int8_linear, paper section 3.2).

a [R, C] times b [C, S]: rotate a's rows and b's columns along C with B (kernels/ref/hadamard.py), quantize
rotated a per row and rotated b per column to symmetric int8 with step amax / 127, multiply exactly in
int32, dequantize, and multiply by 1/b (a power of two, exact) since B B^T = b I. The rotation spreads
one outlier of a row over its whole block, so the row's step stops being set by a single element.
Non-finite inputs make their whole output row / column NaN (deterministic, loud), as in contraction.py.
"""
from __future__ import annotations

import torch

from kernels.ref import fixed
from kernels.ref.hadamard import DEFAULT_BLOCK, block_hadamard, inverse_block_scale
from kernels.ref.intmm import int8_mm

QMAX = 127
# 127^2 * C must fit int32 for the exact product
MAX_CONTRACTION = (2**31 - 1) // (QMAX * QMAX)


def symmetric_step(amax: torch.Tensor) -> torch.Tensor:
    """amax / 127 (tensor / tensor: CUDA turns a Python-scalar division into a reciprocal multiply);
    an all-zero slice gets step 1 so its codes are 0 rather than NaN."""
    step = amax / torch.tensor(float(QMAX), dtype=amax.dtype, device=amax.device)
    return torch.where(step > 0, step, torch.ones_like(step))


def to_int8(v: torch.Tensor) -> torch.Tensor:
    """round-half-even, clamp to [-127, 127], int8; NaN becomes 0 first (a NaN -> int cast is undefined)."""
    v = torch.clamp(torch.round(v), -QMAX, QMAX)
    return torch.where(v == v, v, torch.zeros_like(v)).to(torch.int8)


def quantize_symmetric(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of float32 x with one step per slice along `dim` (amax / 127, amax exact); (codes, step)."""
    step = symmetric_step(torch.amax(x.abs(), dim=dim, keepdim=True))
    return to_int8(x / step), step


def _bad(x: torch.Tensor, dim: int) -> torch.Tensor:
    return fixed.nonfinite_along(x, dim)


def rotated_int8_mm(a: torch.Tensor, b: torch.Tensor, *, rotate: bool = True,
                    block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """a [R, C] float32 times b [C, S] float32 -> float32 [R, S] through int8 (see module doc).

    Dequantization order (fixed): ((float32(acc) * step_a[r]) * step_b[s]) * (1/b).
    With rotate=False the same quantization runs on the unrotated operands (for measurement).
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"rotated_int8_mm: shapes 'a' {tuple(a.shape)} and 'b' {tuple(b.shape)} do not contract")
    c = a.shape[1]
    bad = _bad(a, 1) | _bad(b, 0)
    a, b = fixed.finite_or_zero(a), fixed.finite_or_zero(b)
    if rotate:
        a, b = block_hadamard(a, dim=1, block=block), block_hadamard(b, dim=0, block=block)
    if a.shape[1] > MAX_CONTRACTION:
        raise ValueError(f"rotated_int8_mm: contraction length {a.shape[1]} exceeds {MAX_CONTRACTION} (int32 overflow)")
    qa, sa = quantize_symmetric(a, dim=1)   # step per row of a   [R, 1]
    qb, sb = quantize_symmetric(b, dim=0)   # step per column of b [1, S]
    out = (int8_mm(qa, qb).to(torch.float32) * sa) * sb
    if rotate:
        out = out * inverse_block_scale(c, block, device=out.device)  # exact power-of-two multiply
    return torch.where(bad, torch.full_like(out, float("nan")), out)
