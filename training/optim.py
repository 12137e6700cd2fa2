"""The recipe's optimizer side (report 3.2): global-norm clip, the spike protocol, AdamW on bf16 masters.

Spike protocol, precisely: a step whose pre-clip global norm exceeds `spike_threshold` (strictly), or is
not finite, arms the protocol with `spike_skip` = 5. While armed, a step is not applied (parameters,
moments and Adam's step count stay as they were) and the count drops by one. So the triggering step itself
is skipped and is the first of the five: one event skips five optimizer steps, as the report counts
(two events, ten skips). A trigger inside the window re-arms it to five. Skipped steps still consume their
windows and tokens (the schedules are anchored to tokens), and their gradients are still hashed.

AdamW: kernels.ref.adamw.adamw_step per tensor, float32 moments, bf16 (or float32) parameter widened and
rounded once; Adam's bias correction counts applied updates. Weight decay 0.1 on linears, the router and
the LM head; none on the input embedding, norm gains or activation steps (training/params.py: DECAYED).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.config import TrainConfig
from training.params import ParamSpec
import kernels.ref.adamw
import kernels.ref.reduce
from kernels import ref as REF
from kernels.ref.adamw import clip_coefficient


@dataclass
class SpikeState:
    remaining: int = 0  # steps still to skip
    events: int = 0  # triggers so far
    skipped: int = 0  # steps skipped so far

    def as_dict(self) -> dict[str, int]:
        return {"remaining": self.remaining, "events": self.events, "skipped": self.skipped}


def spike_decision(norm: float, spike: SpikeState, cfg: TrainConfig) -> tuple[bool, bool]:
    """(apply this step?, did it trigger?) and advance `spike` in place (module doc)."""
    triggered = not math.isfinite(norm) or norm > cfg.spike_threshold
    if triggered:
        spike.remaining = cfg.spike_skip
        spike.events += 1
    if spike.remaining > 0:
        spike.remaining -= 1
        spike.skipped += 1
        return False, triggered
    return True, triggered


def clip(grads: dict[str, torch.Tensor], max_norm: float, ops=REF
         ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(pre-clip global L2 norm, coefficient min(1, max_norm / (norm + 1e-6)), grads times it).

    The norm is exact (int64 fixed point), so it does not depend on the order of the tensors.
    """
    names = sorted(grads)
    norm = ops.reduce.global_l2_norm([grads[k] for k in names])
    coef = clip_coefficient(norm, max_norm)
    if float(coef) == 1.0 and math.isfinite(float(norm)):
        # a finite norm means every element is finite, and x * 1.0 is x bit for bit: skip a pass over the grads
        return norm, coef, {k: grads[k] for k in names}
    return norm, coef, {k: grads[k] * coef for k in names}


def adamw_update(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], m: dict[str, torch.Tensor],
                 v: dict[str, torch.Tensor], specs: dict[str, ParamSpec], step: int, lr: float,
                 cfg: TrainConfig, ops=REF) -> None:
    """One AdamW step (1-based `step`) on every parameter, in place, in sorted name order."""
    for k in sorted(params):
        adamw_tensor(params[k], grads[k], m[k], v[k], specs[k], step, lr, cfg, ops)


def adamw_tensor(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, spec: ParamSpec,
                 step: int, lr: float, cfg: TrainConfig, ops=REF) -> None:
    """AdamW on one tensor, or on a slice of one (elementwise: the same bits), with its weight decay; in place."""
    wd = cfg.weight_decay if spec.decayed else 0.0
    ops.adamw.adamw_step(param, grad, m, v, step=step, lr=lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps, weight_decay=wd)
