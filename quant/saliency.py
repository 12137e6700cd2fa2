"""The hot/cold split: REAP expert saliency from captured activations, mixed over domains, top experts hot.

REAP (Lasby et al. 2025, router-weighted expert activation pruning) scores expert e by the mean, over the
tokens routed to it, of gate_e(x) * ||f_e(x)||_2 with f_e the expert's output. The ARVQ write-up's allocation is
75% text-REAP / 25% multimodal salience: scores are computed per domain, each domain's scores are
normalized to sum to 1 over a layer's experts (so the domains mix on one scale), then mixed. The hot set
is the top experts by count or share, over all layers together ("global") or per layer; ties go to the
lower (layer, expert). Everything not hot is cold and gets ARVQ.
"""
from __future__ import annotations

import math

import torch

from quant.capture import LayerCapture
from quant.errors import ConfigError

TEXT, OTHER = 0, 1


def reap_scores(cap: LayerCapture, domain: int | None = None) -> torch.Tensor:
    """float64 [E]: mean over routed tokens (of `domain`, or all) of gate * ||expert output||; 0 if none."""
    out = torch.zeros(cap.n_experts, dtype=torch.float64)
    for e in range(cap.n_experts):
        tok, gate = cap.routed(e)
        if domain is not None:
            keep = cap.domain[tok] == domain
            tok, gate = tok[keep], gate[keep]
        if len(tok):
            norms = cap.expert_output(e, cap.x[tok]).double().norm(dim=1)
            out[e] = (gate.double() * norms).mean()
    return out


def _share(s: torch.Tensor) -> torch.Tensor:
    total = float(s.sum())
    return s / total if total > 0 else s


def mixed_scores(cap: LayerCapture, text_weight: float = 0.75) -> torch.Tensor:
    """text_weight * text REAP share + (1 - text_weight) * other-domain share; text only when no other tokens."""
    if not 0.0 <= text_weight <= 1.0:
        raise ConfigError(f"text_weight must be in [0, 1], got {text_weight}")
    text = _share(reap_scores(cap, TEXT))
    if not bool((cap.domain == OTHER).any()):
        return text
    return text_weight * text + (1.0 - text_weight) * _share(reap_scores(cap, OTHER))


def select_hot(scores: dict[int, torch.Tensor], count: int | None = None, share: float | None = None,
               scope: str = "global") -> dict[int, list[int]]:
    """Hot expert ids per layer: the top `count` (or ceil(share * experts)) by score, globally or per layer."""
    if (count is None) == (share is None):
        raise ConfigError("select_hot: give exactly one of count and share")
    if share is not None and not 0.0 <= share <= 1.0:
        raise ConfigError(f"select_hot: share must be in [0, 1], got {share}")
    if count is not None and count < 0:
        raise ConfigError(f"select_hot: count must be >= 0, got {count}")
    if scope not in ("global", "layer"):
        raise ConfigError(f"select_hot: scope must be 'global' or 'layer', got {scope!r}")
    groups = [sorted(scores)] if scope == "global" else [[layer] for layer in sorted(scores)]
    hot: dict[int, list[int]] = {layer: [] for layer in scores}
    for layers in groups:
        items = [(-float(scores[layer][e]), layer, e) for layer in layers for e in range(len(scores[layer]))]
        n = count if count is not None else math.ceil(share * len(items) - 1e-9)
        for _, layer, e in sorted(items)[: min(n, len(items))]:
            hot[layer].append(e)
    return {layer: sorted(v) for layer, v in hot.items()}
