"""SwiGLU on the fused gate/up GEMM output: [..., 2F] = [gate | up] -> silu(gate) * up, [..., F]."""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernels.ref.checks import expect
from kernels.ref.elementary import sigmoid_, silu_

F32 = torch.float32


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        f = gate_up.shape[-1] // 2
        return silu_(gate_up[..., :f]) * gate_up[..., f:]

    @staticmethod
    @once_differentiable  # backward is built from BR forward-only ops: no double backward
    def backward(ctx, g):
        (gate_up,) = ctx.saved_tensors
        f = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :f], gate_up[..., f:]
        s = sigmoid_(gate)
        # silu'(x) = s (1 + x (1 - s)), the same float32 expression as elementary.silu's backward
        dgate = (g * up) * (s * (1.0 + gate * (1.0 - s)))
        dup = g * silu_(gate)  # recomputed: the forward's bits, nothing saved but the input
        return torch.cat([dgate, dup], dim=-1)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for float32 gate_up [..., 2F] laid out as [gate | up] along the last dim."""
    expect("swiglu", "gate_up", gate_up, dtype=F32)
    if gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu: argument 'gate_up' must have an even last dim [..., 2F], "
                         f"got shape {tuple(gate_up.shape)}")
    return _SwiGLU.apply(gate_up)
