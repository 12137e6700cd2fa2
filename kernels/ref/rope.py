"""Rotary position embeddings: BR tables and the half-split rotation (Llama convention).

Tables: inv_freq_i = theta^(-2i/d) = exp64(-(2i/d) log64(theta)), angle = pos * inv_freq_i, cos/sin by
sincos64, all float64 from IEEE ops and our own polynomials, rounded once to float32. Against a float64
libm reference (tests/kernels/test_nn_ops.py, up to seq 4096 x head_dim 128): max 0.50001 float32 ulp,
i.e. correctly rounded but for 1 of 262k entries that lies next to a rounding tie.
Rotation pairs element i with i + d/2: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
"""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from kernels.ref.checks import expect, same_device
from kernels.ref.elementary import exp64, log64, sincos64

F32 = torch.float32
F64 = torch.float64


def rope_tables(seq_len: int, head_dim: int, theta: float = 5e5,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each float32 [seq_len, head_dim // 2], for positions 0..seq_len-1."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"rope_tables: argument 'seq_len' must be an int >= 0, got {seq_len!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"rope_tables: argument 'head_dim' must be an even int >= 2, got {head_dim!r}")
    if not isinstance(theta, (int, float)) or not (math.isfinite(theta) and theta > 1):
        raise ValueError(f"rope_tables: argument 'theta' must be a finite float > 1, got {theta!r}")
    two_i = torch.arange(0, head_dim, 2, dtype=F64, device=device)
    # tensor / tensor: a float64 division by a Python scalar differs between CPU and CUDA (docs/architecture.md)
    frac = two_i / torch.tensor(float(head_dim), dtype=F64, device=device)
    inv_freq = exp64(-(frac * log64(torch.tensor(float(theta), dtype=F64, device=device))))
    pos = torch.arange(seq_len, dtype=F64, device=device)
    angle = pos[:, None] * inv_freq[None, :]  # exact integer times float64, one rounding
    sin, cos = sincos64(angle)
    return cos.to(F32), sin.to(F32)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation by the tabled angle; separate * and - / + (no FMA in eager ops)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    @once_differentiable  # backward is built from BR forward-only ops: no double backward
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        # the transpose of a rotation is the rotation by -angle: sin -> -sin (negation is exact)
        return _rotate(g, cos, -sin), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate float32 x [..., T, head_dim] by tables [T, head_dim // 2]; the tables are constants (no grad)."""
    expect("apply_rope", "x", x, dtype=F32)
    if x.dim() < 2 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"apply_rope: argument 'x' must be [..., T, head_dim] with even head_dim, "
                         f"got shape {tuple(x.shape)}")
    t, h = x.shape[-2], x.shape[-1] // 2
    expect("apply_rope", "cos", cos, dtype=F32, shape=(t, h))
    expect("apply_rope", "sin", sin, dtype=F32, shape=(t, h))
    same_device("apply_rope", x=x, cos=cos, sin=sin)
    return _Rope.apply(x, cos, sin)
