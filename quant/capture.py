"""Captured MoE-block activations for one layer: what the fit, the baselines and the saliency consume.

A capture holds the block's normalized input x for every captured token, the router's top-k choice and
gate values, and the experts' weights (w13 [E, 2F, H] as [gate; up], w2 [E, H, F]). The SwiGLU
intermediate m = silu(x w_gate^T) * (x w_up^T) is recomputed from the original (unquantized) w13 in
float32; the fit is numerical optimization, not a bit-audited path, so torch float ops are fine here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PROJECTIONS = ("w13", "w2")


@dataclass(frozen=True)
class LayerCapture:
    """One MoE layer's captured routing and activations (float32, one device)."""
    layer: int
    x: torch.Tensor        # [T, H] block input after the norm
    topk: torch.Tensor     # int64 [T, k] routed expert ids
    gates: torch.Tensor    # float32 [T, k] gate values of those experts
    w13: torch.Tensor      # [E, 2F, H]: rows [0, F) gate, [F, 2F) up
    w2: torch.Tensor       # [E, H, F]
    domain: torch.Tensor   # int64 [T]: 0 text, 1 other (e.g. multimodal); saliency can weight them

    @property
    def n_experts(self) -> int:
        return int(self.w13.shape[0])

    def weight(self, projection: str, expert: int) -> torch.Tensor:
        """The [N, K] weight of one expert's projection."""
        if projection not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
        return (self.w13 if projection == "w13" else self.w2)[expert]

    def routed(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token indices, gate values) of the tokens routed to `expert`, in token order."""
        hit = self.topk == expert
        tok = torch.nonzero(hit.any(dim=1)).flatten()
        return tok, (self.gates * hit).sum(dim=1)[tok]

    def intermediate(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU intermediate m [n, F] of `expert` for inputs x [n, H]."""
        gu = x @ self.w13[expert].T
        f = gu.shape[-1] // 2
        return F.silu(gu[:, :f]) * gu[:, f:]

    def expert_output(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """The expert's output [n, H] for inputs x [n, H]."""
        return self.intermediate(expert, x) @ self.w2[expert].T

    def inputs(self, projection: str, expert: int, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The activations [n, K] that multiply the projection's weight: x for w13, m for w2."""
        x = self.x if tokens is None else self.x[tokens]
        return x if projection == "w13" else self.intermediate(expert, x)

    def split(self, held_out: float) -> tuple["LayerCapture", "LayerCapture"]:
        """(calibration, held-out): the last `held_out` share of tokens is held out."""
        if not 0.0 < held_out < 1.0:
            raise ValueError(f"held_out must be in (0, 1), got {held_out}")
        cut = int(round(self.x.shape[0] * (1.0 - held_out)))
        part = lambda sl: LayerCapture(self.layer, self.x[sl], self.topk[sl], self.gates[sl], self.w13, self.w2,
                                       self.domain[sl])
        return part(slice(0, cut)), part(slice(cut, None))
