"""Block scales: initial RMS scales, the per-(layer, projection) global, E4M3 rounding, and the
least-squares refit of the scales given the codes (the ARVQ write-up, section 3).

A scale is stored as e4m3(sigma) with the weight block ~ sigma * global * codes. The global puts the
largest initial scale at SCALE_CEIL = 224, half of E4M3's 448, leaving headroom for the refit to grow a
scale without saturating; the smallest normal E4M3 (2^-6) is then 1/14336 of the largest scale.
"""
from __future__ import annotations

import torch

from quant.format import SCALE_BLOCK
from quant.fp_formats import e4m3_decode, e4m3_encode

SCALE_CEIL = 224.0


def block_rms(w: torch.Tensor) -> torch.Tensor:
    """RMS of each [row, 128-column block] of w [N, K] -> [N, K/128]."""
    n, k = w.shape
    return w.reshape(n, k // SCALE_BLOCK, SCALE_BLOCK).pow(2).mean(-1).sqrt()


def choose_global(raw_scales: list[torch.Tensor]) -> torch.Tensor:
    """float32 global (0-dim) that maps the largest raw scale of every expert to SCALE_CEIL."""
    top = max(float(s.max()) for s in raw_scales)
    g = top / SCALE_CEIL if top > 0 else 1.0
    return torch.tensor(g, dtype=torch.float32)


def to_e4m3(sigma: torch.Tensor) -> torch.Tensor:
    """E4M3 codes (uint8) of sigma values (saturating)."""
    return e4m3_encode(sigma.float())


def dequant(codes: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
    """float32 scales e4m3(code) * global, as the decoder forms them."""
    return e4m3_decode(codes) * glob.to(codes.device)


def refit(w: torch.Tensor, h: torch.Tensor, qn: torch.Tensor, codes: torch.Tensor, glob: torch.Tensor,
          ridge: float = 1e-4) -> torch.Tensor:
    """E4M3 codes minimizing each row's (w - w_hat) H (w - w_hat)^T given normalized codes qn [N, K].

    w_hat[r, block b] = sigma[r, b] * global * qn[r, block b]; sigma enters linearly, so per row this is
    a [nb x nb] least-squares system A sigma = c with A[b, b'] = qb^T H[b, b'] qb' (full H: the codes
    were chosen with cross-block error feedback, so blocks must be refit jointly, not one by one).
    A ridge pulls sigma toward its current value along diag(A); the result is rounded to E4M3.
    """
    n, k = w.shape
    nb = k // SCALE_BLOCK
    qg = (qn * glob.to(qn.device)).float()
    a = torch.empty(n, nb, nb, dtype=torch.float64, device=w.device)
    for b in range(nb):
        cols = slice(b * SCALE_BLOCK, (b + 1) * SCALE_BLOCK)
        p = qg[:, cols] @ h[cols, :]                                       # [N, K]: q_b^T H[b, :]
        a[:, b, :] = (p * qg).reshape(n, nb, SCALE_BLOCK).sum(-1).double()
    c = ((w @ h) * qg).reshape(n, nb, SCALE_BLOCK).sum(-1).double()       # q_b^T H w
    sigma0 = e4m3_decode(codes).double()
    diag = torch.diagonal(a, dim1=1, dim2=2)
    reg = ridge * diag + 1e-12 * diag.amax(dim=1, keepdim=True).clamp(min=1e-30)
    sigma = torch.linalg.solve(a + torch.diag_embed(reg), (c + reg * sigma0).unsqueeze(-1)).squeeze(-1)
    return to_e4m3(sigma.float())
