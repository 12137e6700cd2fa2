"""Quality measures: weight and layer-output relative errors, per expert and pooled over experts."""
from __future__ import annotations

import math

import torch


def weight_rel_error(w: torch.Tensor, wq: torch.Tensor) -> float:
    """||W - Wq||_F / ||W||_F."""
    w, wq = w.double(), wq.double()
    return float((w - wq).norm() / w.norm())


def output_sq(w: torch.Tensor, wq: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """(||(W - Wq) X^T||^2, ||W X^T||^2) for activations x [n, K] (float64)."""
    w, wq, x = w.double(), wq.double(), x.double()
    return float(((w - wq) @ x.T).pow(2).sum()), float((w @ x.T).pow(2).sum())


def output_rel_error(w: torch.Tensor, wq: torch.Tensor, x: torch.Tensor) -> float:
    """||(W - Wq) X^T|| / ||W X^T|| on activations x [n, K]."""
    err, ref = output_sq(w, wq, x)
    return math.sqrt(err / ref) if ref > 0 else float("nan")


def pooled(pairs: list[tuple[float, float]]) -> float:
    """sqrt(sum err^2 / sum ref^2) over experts: each expert weighs by its output energy on its tokens."""
    err, ref = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return math.sqrt(err / ref) if ref > 0 else float("nan")
