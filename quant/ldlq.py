"""LDLQ/GPTQ error-feedback column sweep with fixed codebooks (the ARVQ write-up, section 3).

Columns are taken 8 at a time (one group), left to right, in blocks of `block` columns. With U the upper
Cholesky factor of H^-1 (H^-1 = U^T U), quantizing group F with error e = W_F - Q_F and moving the
not-yet-quantized columns R by -e U_FF^-1 U_FR is the optimal (OBS) compensation, and the group's own
contribution to the output error is ||e U_FF^-1||^2. Inside a block the update is applied group by
group; outside, once per block (GPTQ's lazy batch update: same result, fewer large matmuls).

`metric` picks the assignment distance: "l2" is the ARVQ write-up's plain L2 on the normalized group; "ldl"
uses the exact per-group output metric ||(v - c) U_FF^-1||^2 (codebooks mapped through U_FF^-1 per group,
8 x 8: nearly free). It matters when a few input channels carry most of the activation energy.
"""
from __future__ import annotations

import torch

from quant.codebook import assign_pair
from quant.format import GROUP, SCALE_BLOCK

METRICS = ("l2", "ldl")


def sweep(w: torch.Tensor, u: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, s: torch.Tensor, *,
          block: int = 128, metric: str = "ldl", beam: int = 8, rounds: int = 1) -> torch.Tensor:
    """int64 codes [N, K/8, 2] for w [N, K] given scales s [N, K/128] (float32, global applied)."""
    if metric not in METRICS:
        raise ValueError(f"ldlq.sweep: metric must be one of {METRICS}, got {metric!r}")
    if block % GROUP:
        raise ValueError(f"ldlq.sweep: block must be a multiple of {GROUP}, got {block}")
    n, k = w.shape
    w = w.clone()
    codes = torch.empty(n, k // GROUP, 2, dtype=torch.int64, device=w.device)
    safe = torch.where(s == 0, torch.ones_like(s), s)  # a zero scale decodes to zero whatever the codes
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb, ub = w[:, b0:b1].clone(), u[b0:b1, b0:b1]
        errs = torch.zeros_like(wb)
        for g0 in range(0, b1 - b0, GROUP):
            cols = slice(g0, g0 + GROUP)
            sv = s[:, (b0 + g0) // SCALE_BLOCK].unsqueeze(1)
            v = wb[:, cols] / safe[:, (b0 + g0) // SCALE_BLOCK].unsqueeze(1)
            ugg = ub[cols, cols]
            if metric == "ldl":
                t = torch.linalg.solve_triangular(ugg, torch.eye(GROUP, dtype=ugg.dtype, device=ugg.device),
                                                  upper=True)  # U_FF^-1
                a, b = assign_pair(v @ t, c0 @ t, c1 @ t, rounds=rounds, beam=beam)
            else:
                a, b = assign_pair(v, c0, c1, rounds=rounds, beam=beam)
            g = (b0 + g0) // GROUP
            codes[:, g, 0], codes[:, g, 1] = a, b
            err = wb[:, cols] - (c0[a] + c1[b]) * sv
            e = torch.linalg.solve_triangular(ugg, err, upper=True, left=False)  # e U_FF^-1
            wb[:, g0 + GROUP:] -= e @ ub[cols, g0 + GROUP:]
            errs[:, cols] = e
        w[:, b1:] -= errs @ u[b0:b1, b1:]
    return codes


def code_values(codes: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor:
    """Normalized decoded values c0[a] + c1[b] as [N, K]."""
    return (c0[codes[..., 0]] + c1[codes[..., 1]]).reshape(codes.shape[0], -1)
