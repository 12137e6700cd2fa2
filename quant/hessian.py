"""Per-expert activation Hessians and the escalating-damp Cholesky factor of H^-1 (the ARVQ write-up, section 3).

w13's Hessian is E[x x^T] over the tokens routed to the expert, w2's is E[m m^T] with m the expert's
SwiGLU intermediate on those tokens; an expert with fewer than `min_tokens` routed tokens uses all
captured tokens instead (its own intermediate on them, for w2). Accumulation is float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.capture import LayerCapture
from quant.errors import FitError, where


@dataclass(frozen=True)
class ExpertHessian:
    h: torch.Tensor      # float32 [K, K]
    tokens: int          # tokens it averages over
    fallback: bool       # True when the expert had < min_tokens routed tokens and all tokens were used


@dataclass(frozen=True)
class Factor:
    u: torch.Tensor      # float32 [K, K] upper: H_damped^-1 = U^T U
    damp: float          # the damping added to H's diagonal
    attempts: int        # factorizations tried (1 = the first damping worked)


def hessian(x: torch.Tensor) -> torch.Tensor:
    """E[x x^T] = x^T x / n in float32."""
    x = x.float()
    return (x.T @ x) * (1.0 / max(x.shape[0], 1))


def check_finite(t: torch.Tensor, at: str, what: str) -> None:
    """Raise FitError naming the place and the tensor if t holds NaN or Inf."""
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise FitError(at, f"{what} has {int(bad.sum())} non-finite value(s), first at {idx}")


def expert_hessian(cap: LayerCapture, projection: str, expert: int, min_tokens: int = 32) -> ExpertHessian:
    """The Hessian of one expert's projection from the capture, with the < min_tokens fallback."""
    at = where(cap.layer, expert, projection)
    tok, _ = cap.routed(expert)
    fallback = len(tok) < min_tokens
    x = cap.inputs(projection, expert, None if fallback else tok)
    check_finite(x, at, "captured activations" if projection == "w13" else "SwiGLU intermediate")
    h = hessian(x)
    check_finite(h, at, "Hessian")
    return ExpertHessian(h, int(x.shape[0]), fallback)


def damped_inverse_factor(h: torch.Tensor, at: str, rel_damp: float = 1e-3, factor: float = 4.0,
                          attempts: int = 12) -> Factor:
    """Upper Cholesky U of (H + d I)^-1, d = rel_damp * mean(diag H) times `factor` per failed attempt."""
    check_finite(h, at, "Hessian")
    mean_diag = float(torch.diagonal(h).double().mean())
    if not mean_diag > 0.0:
        raise FitError(at, f"Hessian has mean diagonal {mean_diag}; expected > 0 (no activations?)")
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    damp = rel_damp * mean_diag
    for attempt in range(1, attempts + 1):
        lower, info = torch.linalg.cholesky_ex(h + damp * eye)
        if int(info) == 0:
            u, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0 and bool(torch.isfinite(u).all()):
                return Factor(u, damp, attempt)
        damp *= factor
    raise FitError(at, f"Cholesky of the damped Hessian inverse failed {attempts} times; last damp {damp / factor:.4g} "
                       f"= {damp / factor / mean_diag:.3g} x mean(diag H). The Hessian is far from positive "
                       f"definite: check the captured activations")
