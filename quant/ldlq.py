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


def group_inverses(u: torch.Tensor) -> torch.Tensor:
    """U_FF^-1 of every 8 x 8 diagonal block of u [K, K], as [K/8, 8, 8]: one batched solve, not one a group."""
    g = u.shape[0] // GROUP
    i = torch.arange(g, device=u.device)
    blocks = u.reshape(g, GROUP, g, GROUP)[i, :, i, :]                      # [G, 8, 8]
    eye = torch.eye(GROUP, dtype=u.dtype, device=u.device).expand(g, GROUP, GROUP)
    return torch.linalg.solve_triangular(blocks, eye, upper=True)


def sweep(w: torch.Tensor, u: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, s: torch.Tensor, *,
          block: int = 128, metric: str = "ldl", beam: int = 8, rounds: int = 1) -> torch.Tensor:
    """int64 codes [N, K/8, 2] for w [N, K] given scales s [N, K/128] (float32, global applied).

    Everything that does not depend on the running weights is formed once before the loop (the groups'
    U_FF^-1, the codebooks mapped through them and their squared norms, the per-group scales), and a
    group's error is mapped with a matmul, not a triangular solve: a group step is a few small kernels,
    whose count is what bounds the sweep on a GPU."""
    if metric not in METRICS:
        raise ValueError(f"ldlq.sweep: metric must be one of {METRICS}, got {metric!r}")
    if block % GROUP:
        raise ValueError(f"ldlq.sweep: block must be a multiple of {GROUP}, got {block}")
    n, k = w.shape
    w = w.clone()
    picked = []                                                              # (a, b) of each group, in order
    per_group = SCALE_BLOCK // GROUP
    sg = s.repeat_interleave(per_group, dim=1)                               # [N, G]
    inv = (1.0 / torch.where(sg == 0, torch.ones_like(sg), sg))              # a zero scale decodes to zero
    t = group_inverses(u)                                                    # [G, 8, 8]
    b0t, b1t = torch.matmul(c0, t), torch.matmul(c1, t)                      # [G, 256, 8] error-space books
    bt = (b0t, b1t) if metric == "ldl" else (c0.expand_as(b0t), c1.expand_as(b1t))
    norms = ((bt[0] * bt[0]).sum(-1), (bt[1] * bt[1]).sum(-1))               # [G, 256] each
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb, ub = w[:, b0:b1].clone(), u[b0:b1, b0:b1]
        errs = []
        for g0 in range(0, b1 - b0, GROUP):
            g = (b0 + g0) // GROUP
            cols = slice(g0, g0 + GROUP)
            v = wb[:, cols] * inv[:, g:g + 1]
            vt = v @ t[g] if metric == "ldl" else v
            a, b = assign_pair(vt, bt[0][g], bt[1][g], rounds=rounds, beam=beam, norms=(norms[0][g], norms[1][g]))
            picked += [a, b]
            err = wb[:, cols] - (c0[a] + c1[b]) * sg[:, g:g + 1]
            e = err @ t[g]                                                   # e U_FF^-1
            if g0 + GROUP < b1 - b0:
                wb[:, g0 + GROUP:].addmm_(e, ub[cols, g0 + GROUP:], alpha=-1.0)
            errs.append(e)
        if b1 < k:
            w[:, b1:].addmm_(torch.cat(errs, dim=1), u[b0:b1, b1:], alpha=-1.0)
    return torch.stack(picked, dim=1).reshape(n, k // GROUP, 2)


def code_values(codes: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor) -> torch.Tensor:
    """Normalized decoded values c0[a] + c1[b] as [N, K]."""
    return (c0[codes[..., 0]] + c1[codes[..., 1]]).reshape(codes.shape[0], -1)
