"""The PV objective (the ARVQ write-up, section 4): what one layer's cold experts must supply, and how it is scored.

Per captured token (row): frozen = the block output from everything but the cold experts on the student
input; reference = the donor block with all its experts, on the reference trajectory (`target="reference"`)
or on the student's own input (`target="same_input"`); required = reference - frozen. Then

    loss          = sum_i w_i ||cold_i - required_i||^2 / (denominator * sum_i w_i)
    denominator   = mean over training rows of ||required_i||^2   (per-row energy: comparable across layers)
    reference_rel = ||(frozen + cold) - reference|| / ||reference||  (whole block, residual included)

Row weights w default to 1; `boundary_weight` up-weights rows whose next token is a boundary (the
separator). Every sum is exact (kernels.ref.reduce), so a score is the same bits on every gang member.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.ref.elementary import sqrt_
from kernels.ref.reduce import exact_mean, exact_sum, sum as dsum
from quant.errors import ConfigError

F32 = torch.float32
TARGETS = ("reference", "same_input")
SPLITS = ("train", "val", "audit")


def routed_rows(topk: torch.Tensor, gates: torch.Tensor, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows routed to `expert` in row order, their gate values) from one routing."""
    hit = topk == expert
    rows = torch.nonzero(hit.any(dim=1)).flatten()
    g = torch.where(hit, gates, torch.zeros_like(gates))[rows]
    return rows, torch.amax(g, dim=1)  # one positive gate per row, the rest 0: max picks it exactly


@dataclass
class Split:
    """One split's rows: the student MoE input, routing, frozen part, reference output and row weights."""
    f: torch.Tensor          # [R, D]
    topk: torch.Tensor       # int64 [R, k]
    gates: torch.Tensor      # [R, k]
    frozen: torch.Tensor     # [R, D]
    reference: torch.Tensor  # [R, D]
    weights: torch.Tensor    # [R]
    _rows: dict = field(default_factory=dict, repr=False)

    @property
    def required(self) -> torch.Tensor:
        return self.reference - self.frozen

    def routed(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, gates) routed to `expert` (cached)."""
        if expert not in self._rows:
            self._rows[expert] = routed_rows(self.topk, self.gates, expert)
        return self._rows[expert]

    def take(self, rows: torch.Tensor) -> "Split":
        return Split(self.f[rows], self.topk[rows], self.gates[rows], self.frozen[rows], self.reference[rows],
                     self.weights[rows])


@dataclass
class LayerProblem:
    """Everything a gang member needs to tune one layer's cold experts."""
    layer: int
    cold: list[int]
    splits: dict[str, Split]
    denominator: torch.Tensor  # float32 0-dim
    act_steps: dict[int, tuple[torch.Tensor, torch.Tensor]]  # per cold expert: (w13, w2) activation steps

    def split(self, name: str) -> Split:
        return self.splits[name]


def make_problem(layer: int, cold: list[int], splits: dict[str, Split],
                 act_steps: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> LayerProblem:
    """The problem with its denominator from the training split."""
    missing = set(SPLITS) - set(splits)
    if missing:
        raise ConfigError(f"layer {layer}: splits {sorted(missing)} missing")
    req = splits["train"].required
    den = exact_mean(exact_sum(req * req, dim=1), dim=0)
    if not float(den) > 0:
        raise ConfigError(f"layer {layer}: the cold experts have nothing to supply (required energy {float(den)})")
    return LayerProblem(layer, list(cold), splits, den, act_steps)


def row_weights(next_ids: torch.Tensor, boundary_id: int = 0, boundary_weight: float = 1.0) -> torch.Tensor:
    """[R] weights: 1, or `boundary_weight` where the next token is the boundary id."""
    if not boundary_weight > 0:
        raise ConfigError(f"boundary_weight must be > 0, got {boundary_weight}")
    w = torch.ones(next_ids.numel(), dtype=F32)
    return torch.where(next_ids.reshape(-1) == boundary_id, torch.full_like(w, boundary_weight), w)


def loss(cold: torch.Tensor, s: Split, den: torch.Tensor) -> torch.Tensor:
    """The PV loss on split rows s for the cold sum `cold` [R, D]; differentiable in cold."""
    d = cold - s.required
    per = dsum((d * d) * s.weights[:, None], dim=1)
    total = dsum(per, dim=0)
    return total * (torch.ones((), dtype=F32) / (den * exact_sum(s.weights, dim=0)))


def sse(cold: torch.Tensor, s: Split) -> torch.Tensor:
    """sum_i w_i ||cold_i - required_i||^2 (no gradient): the reassignment's acceptance measure."""
    d = cold - s.required
    return exact_sum(exact_sum((d * d) * s.weights[:, None], dim=1), dim=0)


def reference_rel(cold: torch.Tensor, s: Split) -> float:
    """||frozen + cold - reference|| / ||reference|| over the split (the selection metric)."""
    e = (s.frozen + cold) - s.reference
    num = exact_sum(exact_sum(e * e, dim=1), dim=0)
    ref = exact_sum(exact_sum(s.reference * s.reference, dim=1), dim=0)
    return float(sqrt_(num) / sqrt_(ref))
