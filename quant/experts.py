"""A cold expert under PV tuning (its latents and Adam moments) and its gated contribution to the coupled output:
what the tuner (quant/pv.py) and index reassignment (quant/reassign.py) both work on."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from quant import objective as obj
from quant.student import Latent, expert_forward

F32 = torch.float32
PROJS = ("w13", "w2")


@dataclass
class ExpertState:
    """One cold expert on a gang member: its two projections' latents and Adam moments."""
    expert: int
    lat: dict[str, Latent]
    frozen: bool = False

    def __post_init__(self) -> None:
        self.m = {(p, k): torch.zeros_like(getattr(self.lat[p], k)) for p in PROJS for k in ("books", "logs")}
        self.v = {key: torch.zeros_like(t) for key, t in self.m.items()}

    def snapshot(self) -> dict[str, Latent]:
        return {p: self.lat[p].clone() for p in PROJS}


def contribution(es: ExpertState, s: obj.Split, rows: torch.Tensor | None, emulate: bool,
                 w: dict[str, torch.Tensor] | None = None, steps=None) -> torch.Tensor:
    """gate * expert(f) of one expert on split rows (all when None), zero on rows not routed to it."""
    sub = s if rows is None else s.take(rows)
    hit = (sub.topk == es.expert)
    pos = torch.nonzero(hit.any(dim=1)).flatten()
    gate = torch.amax(torch.where(hit, sub.gates, torch.zeros_like(sub.gates))[pos], dim=1)
    if w is None:
        w = {p: es.lat[p].weight() for p in PROJS}
    y = expert_forward(sub.f[pos], w["w13"], w["w2"], steps, emulate) * gate[:, None]
    # distinct rows: one add per element, no order to choose
    return torch.zeros(sub.f.shape, dtype=F32, device=sub.f.device).index_add(0, pos, y)
