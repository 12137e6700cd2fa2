"""Initialization from the counter-based Philox stream: a function of (config, seed) alone.

- Matrices (embedding, linears, router, LM head): truncated normal, std 0.02, cut at +-2 sigma, no depth
  or width scaling (report 3.1); drawn in float32 by kernels.ref.philox, rounded once to bf16.
- Each parameter draws from its own Philox stream: the first 4 bytes (big-endian) of SHA-256 of its
  name (never Python's salted hash()), so adding or reordering parameters never shifts another's values.
- RMSNorm gains: 1.
- Activation steps s_x: LSQ's data-driven init 2 mean|x| / sqrt(127), evaluated in one forward pass on
  a calibration window of Philox-drawn token ids. At init the embedding rows are i.i.d., so random ids
  give the activation statistics real text would, while the init stays independent of the corpus.
  Layer by layer: each step is set from its input as the pass reaches it (models.Calibration).
"""
from __future__ import annotations

import hashlib

import torch

from training.config import ModelConfig
from training.errors import ConfigError
from training.layers import Calibration
from training.model import forward, rope_for
from training.params import ParamSpec, param_specs
from kernels.ref import philox

CALIBRATION_STREAM = "init/calibration-ids"


def stream_id(name: str) -> int:
    """The parameter's Philox stream: SHA-256(name)[:4] as a big-endian uint32."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def _check_streams(specs: list[ParamSpec]) -> None:
    seen: dict[int, str] = {stream_id(CALIBRATION_STREAM): CALIBRATION_STREAM}
    for s in specs:
        sid = stream_id(s.name)
        if sid in seen:
            raise ConfigError(f"init: parameters {seen[sid]!r} and {s.name!r} share Philox stream {sid}; rename one")
        seen[sid] = s.name


def calibration_ids(cfg: ModelConfig, seed: int, device=None) -> torch.Tensor:
    """One window [1, seq_len + 1] of token ids from Philox (uint32 words mod vocab: exact integer ops)."""
    words = philox.random_bits(seed, stream_id(CALIBRATION_STREAM), cfg.seq_len + 1, device=device)
    return (words % cfg.vocab_size).reshape(1, -1)


def init_params(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """All parameters at init: bf16 matrices and gains, float32 activation steps (calibrated)."""
    specs = param_specs(cfg)
    _check_streams(specs)
    params: dict[str, torch.Tensor] = {}
    for s in specs:
        if s.kind in ("embedding", "head", "linear", "router"):
            w = philox.trunc_normal(seed, stream_id(s.name), s.shape, std=cfg.init_std, bound=cfg.init_bound,
                                    device=device)
            params[s.name] = w.to(s.dtype)  # one rounding float32 -> bf16
        elif s.kind == "norm":
            params[s.name] = torch.ones(s.shape, dtype=s.dtype, device=device)
    widened = {k: v.to(torch.float32) for k, v in params.items()}
    calib = Calibration()
    with torch.no_grad():
        forward(widened, cfg, calibration_ids(cfg, seed, device), rope_for(cfg, device), calib=calib)
    for s in specs:
        if s.kind == "act_step":
            if s.name not in calib.steps:
                raise ConfigError(f"init: calibration pass never reached activation step {s.name!r}")
            params[s.name] = calib.steps[s.name].to(torch.float32).reshape(())
    return {s.name: params[s.name] for s in specs}
