"""2-bit scalar baselines at ARVQ's scale budget: round-to-nearest (RTN) and GPTQ.

Both use the symmetric 4-level grid {-1.5, -0.5, 0.5, 1.5} * step (no zero point: a 2-bit zero point
would cost another 8 bits per block) with one E4M3 step per [row, 128-column block] under an fp32 global,
i.e. 2 + 8/128 = 2.0625 bits/weight, ARVQ's budget without its codebooks. Each block's step is the best
of a grid of RMS multiples after E4M3 rounding (MSE clipping search: RTN with absmax steps is far worse
at 2 bits and would flatter ARVQ). GPTQ (Frantar et al. 2022): columns left to right, error feedback
through the upper Cholesky factor of H^-1, lazy block updates, steps chosen on the updated weights as
each block is entered; no activation reordering.
"""
from __future__ import annotations

import torch

from quant import scales as sc
from quant.format import SCALE_BLOCK
from quant.hessian import damped_inverse_factor

STEP_FACTORS = torch.linspace(0.5, 1.6, 23)  # step / block RMS candidates; the Gaussian optimum is ~0.996


def quantize(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """x on the grid {-1.5, -0.5, 0.5, 1.5} * step (step broadcasts; a zero step gives zero)."""
    safe = torch.where(step == 0, torch.ones_like(step), step)
    return torch.clamp(torch.floor(x / safe), -2, 1).add(0.5) * step


def best_steps(wb: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """float32 E4M3-representable steps [N, nb] minimizing each block's squared error."""
    n, k = wb.shape
    blocks = wb.reshape(n, k // SCALE_BLOCK, SCALE_BLOCK)
    rms = blocks.pow(2).mean(-1)
    rms = rms.sqrt()
    best, best_err = None, None
    for f in STEP_FACTORS.tolist():
        step = sc.dequant(sc.to_e4m3(rms * f / glob), glob)
        err = (blocks - quantize(blocks, step.unsqueeze(-1))).pow(2).sum(-1)
        if best is None:
            best, best_err = step, err
        else:
            better = err < best_err
            best, best_err = torch.where(better, step, best), torch.where(better, err, best_err)
    return best


def global_for(weights: list[torch.Tensor]) -> torch.Tensor:
    """The shared fp32 global: the largest candidate step of any block maps to E4M3 224."""
    return sc.choose_global([sc.block_rms(w.float()) * float(STEP_FACTORS.max()) for w in weights])


def rtn(w: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest 2-bit weights (float32, decoded) of w [N, K]."""
    w = w.float()
    step = best_steps(w, glob).repeat_interleave(SCALE_BLOCK, dim=1)
    return quantize(w, step)


def gptq(w: torch.Tensor, h: torch.Tensor, glob: torch.Tensor, at: str, rel_damp: float = 1e-3) -> torch.Tensor:
    """GPTQ 2-bit weights (float32, decoded) of w [N, K] with Hessian h [K, K]."""
    w = w.float().clone()
    u = damped_inverse_factor(h.float(), at, rel_damp).u
    n, k = w.shape
    out = torch.empty_like(w)
    for b0 in range(0, k, SCALE_BLOCK):  # GPTQ's lazy block = the scale block
        b1 = b0 + SCALE_BLOCK
        wb, ub = w[:, b0:b1].clone(), u[b0:b1, b0:b1]
        step = best_steps(wb, glob)[:, 0]
        errs = torch.zeros_like(wb)
        for j in range(b1 - b0):
            q = quantize(wb[:, j], step)
            out[:, b0 + j] = q
            e = (wb[:, j] - q) / ub[j, j]
            wb[:, j + 1:] -= e.unsqueeze(1) * ub[j, j + 1:].unsqueeze(0)
            errs[:, j] = e
        w[:, b1:] -= errs @ u[b0:b1, b1:]
    return out


def bits_per_weight(n: int, k: int, experts: int = 1) -> float:
    """2-bit codes + one E4M3 step per 128 weights + one fp32 global per (layer, projection)."""
    return 2.0 + 8.0 / SCALE_BLOCK + 32.0 / (n * k * experts)
