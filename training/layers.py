"""The model's building blocks shared by the dense FFN and the MoE experts: the int8 W8A8 QAT linear, its
activation-step calibration, the SwiGLU FFN. Written only from kernels/ref ops (through `ops`)."""
from __future__ import annotations

import torch

import kernels.ref.int8_linear
import kernels.ref.swiglu
from kernels import ref as REF
from kernels.ref.int8_linear import repin_constant
from kernels.ref.reduce import exact_mean
from training import windows
from training.windows import Param


class Calibration:
    """Sets each linear's missing activation step from its first input: LSQ's 2 mean|x| / sqrt(127)."""

    def __init__(self) -> None:
        self.steps: dict[str, torch.Tensor] = {}

    def step_for(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name not in self.steps:
            # exact mean (int64 fixed point) times float32(2/sqrt(127)): the re-pinned weight-step formula
            s = exact_mean(x.detach().abs().reshape(-1), dim=0) * repin_constant(x.device)
            self.steps[name] = torch.where(s > 0, s, torch.ones_like(s))
        return self.steps[name]


def linear(p: dict[str, Param], name: str, x: torch.Tensor, calib: Calibration | None = None,
           ops=REF) -> torch.Tensor:
    """int8 W8A8 QAT linear `name` (weight `name.weight`, activation step `name.s_x`) on x [windows, T, K]; a
    per-window weight gives per-window gradients (training/windows.py)."""
    s_x = calib.step_for(f"{name}.s_x", x) if calib is not None else p[f"{name}.s_x"]
    return windows.int8_linear(ops, x, p[f"{name}.weight"], s_x)


def ffn(p: dict[str, Param], prefix: str, x: torch.Tensor, calib: Calibration | None = None,
        ops=REF) -> torch.Tensor:
    """SwiGLU FFN: one fused gate|up GEMM, silu(gate) * up, the down projection."""
    up = ops.swiglu.swiglu(linear(p, f"{prefix}.w_gate_up", x, calib, ops))
    return linear(p, f"{prefix}.w_down", up, calib, ops)
