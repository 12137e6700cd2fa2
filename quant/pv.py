"""PV tuning of one layer's cold experts against the coupled output (the ARVQ write-up, section 6).

Adam over two groups per expert projection, FP4-constrained codebooks and E4M3-constrained log block
scales (quant/student.py); an update accumulates `microbatches` passes of `micro_rows` training rows
(drawn without replacement from a Philox shuffle per epoch); drift penalties toward the initial values;
global grad-norm clip; LR x0.25 after `lr_decay_after` updates (earlier after `worse_checks` validations
more than 0.1% worse than the best, then stop after `patience` updates without improvement); validation
every `validate_every` updates keeps the best; output-gradient index reassignment every `reassign_every`
updates (quant/reassign.py); experts with < `min_rows` routed training rows stay frozen (coverage gate).

Gang-safe by construction: the coupled output and every cross-expert total go through Reducer (exact,
order- and owner-free); everything else is per expert in BR ops, so each expert's tuned bits do not
depend on which actor owns it or how many actors there are. Decisions (best, early stop) come from
coupled values every member computes identically.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch

from kernels.ref.adamw import adamw_step, clip_coefficient
from kernels.ref.elementary import sqrt_
from kernels.ref.philox import random_bits
from kernels.ref.reduce import exact_sum
from quant import objective as obj
from quant.errors import ConfigError, FitError
from quant.expert_sum import Reducer
from quant.experts import PROJS, ExpertState, contribution
from quant.reassign import reassign
from quant.student import decode_latent

F32 = torch.float32


@dataclass(frozen=True)
class PVConfig:
    """Defaults from the ARVQ write-up, section 6 (the full-corpus campaign), unless noted."""
    updates: int = 69
    microbatches: int = 4
    micro_rows: int = 1024          # ours: the tiny model's scale (the write-up: 65,536 tokens)
    lr_books: float = 0.003
    lr_scales: float = 0.0005       # ours: at 0.002 every log-scale crossed its E4M3 boundary together (docs/quant.md)
    lr_decay_after: int = 45
    lr_decay_factor: float = 0.25
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    validate_every: int = 5
    adaptive: bool = True
    worse_tol: float = 1e-3
    worse_checks: int = 3
    patience: int = 15
    drift: float = 0.01
    clip: float = 1.0
    min_rows: int = 256
    reassign_every: int = 20
    max_fraction: float = 0.001
    trust_ratio: float = 0.01
    target_ratio: float = 0.03
    slack: float = 1e-7
    emulate: bool = False
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("microbatches", "micro_rows", "validate_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"PVConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("updates", "lr_decay_after", "worse_checks", "patience", "min_rows", "reassign_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"PVConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr_books", "lr_scales", "drift", "worse_tol", "slack"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"PVConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr_decay_factor", "max_fraction", "trust_ratio", "target_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"PVConfig.{name} must be in (0, 1], got {getattr(self, name)}")
        if not self.clip > 0:
            raise ConfigError(f"PVConfig.clip must be > 0, got {self.clip}")


def batches(n_rows: int, cfg: PVConfig):
    """Endless microbatches (int64 row indices): a Philox shuffle per epoch, no replacement within it."""
    epoch = 0
    per = min(cfg.micro_rows, n_rows)
    while True:
        keys = random_bits(cfg.seed, 1000 + epoch, n_rows) * n_rows + torch.arange(n_rows)  # distinct keys (host)
        perm = torch.sort(keys).indices
        for i in range(0, n_rows - per + 1, per):
            yield torch.sort(perm[i:i + per]).values  # ascending rows: gathers in one order
        epoch += 1


class Tuner:
    """PV tuning of the experts this gang member owns; `run()` returns the best latents and the history."""

    def __init__(self, problem: obj.LayerProblem, experts: list[ExpertState], reducer: Reducer, cfg: PVConfig,
                 log: Callable[..., None] | None = None, crash_at: int | None = None) -> None:
        self.p, self.experts, self.r, self.cfg = problem, experts, reducer, cfg
        self.log = log or (lambda *a, **k: None)
        self.crash_at = crash_at  # fault injection for the gang tests: die at this update
        train = problem.split("train")
        for es in experts:  # coverage gate: too few routed rows to learn from
            es.frozen = len(train.routed(es.expert)[0]) < cfg.min_rows

    def coupled(self, split: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        s = self.p.split(split)
        n = s.f.shape[0] if rows is None else len(rows)
        with torch.no_grad():
            parts = [contribution(es, s, rows, self.cfg.emulate, None, self.p.act_steps[es.expert])
                     for es in self.experts]
        return self.r.expert_sum(parts, (n, s.f.shape[1]))

    def rel(self, split: str) -> float:
        return obj.reference_rel(self.coupled(split), self.p.split(split))

    def _grads(self, rows: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """Gradients of one microbatch's loss w.r.t. every local latent; and the loss."""
        s = self.p.split("train").take(rows)
        leaves, parts = {}, []
        for es in self.experts:
            w = {}
            for pr in PROJS:
                b = es.lat[pr].books.detach().clone().requires_grad_(True)
                lg = es.lat[pr].logs.detach().clone().requires_grad_(True)
                leaves[(es.expert, pr)] = (b, lg)
                w[pr] = decode_latent(es.lat[pr], b, lg)
            parts.append(contribution(es, s, None, self.cfg.emulate, w, self.p.act_steps[es.expert]))
        cold = self.r.expert_sum(parts, tuple(s.f.shape))
        loss = obj.loss(cold, s, self.p.denominator)
        if parts:
            loss.backward()
        return {k: (b.grad, lg.grad) for k, (b, lg) in leaves.items()}, loss.detach()

    def _lr(self, update: int, decayed: bool) -> tuple[float, float]:
        f = self.cfg.lr_decay_factor if decayed else 1.0
        return self.cfg.lr_books * f, self.cfg.lr_scales * f

    def _step(self, grads: dict, update: int, decayed: bool) -> float:
        cfg = self.cfg
        inv = torch.tensor(1.0 / cfg.microbatches, dtype=F32)
        final = {}
        sq = []
        for es in self.experts:
            total = torch.zeros((), dtype=F32, device=es.lat["w13"].books.device)
            for pr in PROJS:
                lat = es.lat[pr]
                gb, gl = grads[(es.expert, pr)]
                gb, gl = gb * inv, gl * inv
                if cfg.drift:  # d/dx drift * mean((x - x0)^2)
                    gb = gb + (lat.books - lat.books0) * torch.tensor(2.0 * cfg.drift / lat.books.numel(), dtype=F32)
                    gl = gl + (lat.logs - lat.logs0) * torch.tensor(2.0 * cfg.drift / lat.logs.numel(), dtype=F32)
                if es.frozen:
                    gb, gl = torch.zeros_like(gb), torch.zeros_like(gl)
                final[(es.expert, pr)] = (gb, gl)
                total = total + exact_sum(torch.cat([(gb * gb).reshape(-1), (gl * gl).reshape(-1)]), dim=0)
            sq.append(total)
        norm = sqrt_(self.r.scalar_sum(sq))
        if not bool(torch.isfinite(norm)):
            raise FitError(f"layer {self.p.layer}", f"PV gradient norm is {float(norm)} at update {update}")
        coef = clip_coefficient(norm, cfg.clip)
        lr_b, lr_s = self._lr(update, decayed)
        for es in self.experts:
            if es.frozen:
                continue
            for pr in PROJS:
                lat = es.lat[pr]
                gb, gl = final[(es.expert, pr)]
                adamw_step(lat.books, gb * coef, es.m[(pr, "books")], es.v[(pr, "books")], step=update, lr=lr_b,
                           beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps)
                adamw_step(lat.logs, gl * coef, es.m[(pr, "logs")], es.v[(pr, "logs")], step=update, lr=lr_s,
                           beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps)
                lat.project_()
        return float(norm)

    def run(self) -> dict:
        """Tune; afterwards the experts hold the best validated latents. Returns the history and choices."""
        cfg = self.cfg
        it = batches(self.p.split("train").f.shape[0], cfg)
        best = self.rel("val")
        initial = best
        best_at, best_lat = 0, [es.snapshot() for es in self.experts]
        history = [{"update": 0, "val_rel": best}]
        decayed, decayed_at, worse, stop = False, 0, 0, "budget"
        reassigned = []
        self.log("pv_start", layer=self.p.layer, val_rel=best, experts=[e.expert for e in self.experts],
                 frozen=[e.expert for e in self.experts if e.frozen])
        for update in range(1, cfg.updates + 1):
            if self.crash_at is not None and update == self.crash_at:
                import os
                os._exit(17)  # simulated node loss: no cleanup, no goodbye
            if not decayed and update > cfg.lr_decay_after:
                decayed, decayed_at = True, update
            acc, losses = None, []
            for _ in range(cfg.microbatches):
                g, lv = self._grads(next(it))
                losses.append(float(lv))
                acc = g if acc is None else {k: (acc[k][0] + g[k][0], acc[k][1] + g[k][1]) for k in acc}
            norm = self._step(acc, update, decayed)
            rec = {"update": update, "train_loss": sum(losses) / len(losses), "grad_norm": norm}
            if cfg.reassign_every and update % cfg.reassign_every == 0:
                rec["reassign"] = reassign(self, next(it), next(it))
                reassigned.append(rec["reassign"])
            if update % cfg.validate_every == 0 or update == cfg.updates:
                v = self.rel("val")
                rec["val_rel"] = v
                if v < best:
                    best, best_at, best_lat = v, update, [es.snapshot() for es in self.experts]
                elif v > best * (1 + cfg.worse_tol):
                    worse += 1
                if cfg.adaptive and not decayed and worse >= cfg.worse_checks:
                    decayed, decayed_at = True, update  # the earlier LR reduction
                if cfg.adaptive and decayed and update - max(best_at, decayed_at) >= cfg.patience:
                    history.append(rec)
                    stop = "early_stop"
                    break
            history.append(rec)
            self.log("pv_update", layer=self.p.layer, **rec)
        for es, snap in zip(self.experts, best_lat):
            es.lat = snap
        return {"initial_val_rel": initial, "best_val_rel": best, "best_update": best_at, "stop": stop,
                "history": history, "reassign": reassigned, "config": asdict(cfg)}
