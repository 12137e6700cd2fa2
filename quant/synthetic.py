"""A synthetic MoE block with realistic activation outliers, to fit against until the project's MoE exists.

Activations are x = gain * (z A + noise) with z A a rank-r correlated part (hidden states live near a
low-dimensional subspace), per-channel gains spread like RMSNorm gains, and a few heavy channels: large,
mostly one-signed values on fixed channels ("massive activations"), which make E[x x^T] strongly
non-isotropic, the regime where Hessian-aware fitting matters. A share of tokens is drawn from a
shifted distribution and labelled "other" (standing in for multimodal tokens). The router is softmax
over the top-k logits, like app's MoE; one expert is made rare (bias) so the < 32-token fallback runs.
Every draw comes from its own torch.Generator seeded by (seed, layer, tensor), never global RNG state:
reproducible on one machine and torch version. (kernels.ref.philox would make it machine-independent,
but its integer Philox is ~50x slower on CPU: 13 s for this default block on two busy cores.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.capture import LayerCapture
from quant.errors import ConfigError


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes and statistics of the synthetic block (small defaults: tests and the CLI demo)."""
    hidden: int = 256
    ffn: int = 128
    experts: int = 8
    top_k: int = 2
    tokens: int = 4096
    rank: int = 32                 # dimension of the correlated subspace
    outlier_channels: int = 4      # heavy channels
    outlier_scale: float = 25.0    # their magnitude relative to a typical channel
    other_share: float = 0.25      # share of tokens from the shifted ("other") distribution
    rare_expert_bias: float = -2.5  # router bias on the last expert: few tokens, exercises the fallback
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "experts", "top_k", "tokens", "rank"):
            if getattr(self, name) < 1:
                raise ConfigError(f"SyntheticConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % 128 or self.ffn % 128:
            raise ConfigError(f"SyntheticConfig: hidden and ffn must be multiples of 128 (the scale block), "
                              f"got {self.hidden}, {self.ffn}")
        if not 1 <= self.top_k <= self.experts:
            raise ConfigError(f"SyntheticConfig.top_k must be in [1, experts={self.experts}], got {self.top_k}")
        if not 0 <= self.outlier_channels <= self.hidden:
            raise ConfigError(f"SyntheticConfig.outlier_channels must be in [0, hidden], got {self.outlier_channels}")
        if not 0.0 <= self.other_share < 1.0:
            raise ConfigError(f"SyntheticConfig.other_share must be in [0, 1), got {self.other_share}")


def _gen(cfg: SyntheticConfig, layer: int, tensor: int) -> torch.Generator:
    # one generator per (layer, tensor): adding a tensor never shifts another's numbers
    return torch.Generator().manual_seed((cfg.seed * 1_000_003 + layer) * 64 + tensor)


def _normal(cfg: SyntheticConfig, layer: int, tensor: int, shape, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(cfg, layer, tensor), dtype=torch.float32) * std


def _uniform(cfg: SyntheticConfig, layer: int, tensor: int, shape) -> torch.Tensor:
    return torch.rand(shape, generator=_gen(cfg, layer, tensor), dtype=torch.float32)


def activations(cfg: SyntheticConfig, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [T, H], domain [T], per-channel gain [H]) for one layer."""
    t, h, r = cfg.tokens, cfg.hidden, cfg.rank
    gain = torch.exp(0.35 * _normal(cfg, layer, 0, (h,)))                     # RMSNorm-like spread
    heavy = torch.argsort(_uniform(cfg, layer, 1, (h,)))[: cfg.outlier_channels]
    x = _normal(cfg, layer, 2, (t, r)) @ _normal(cfg, layer, 3, (r, h), std=r ** -0.5)
    x = x + _normal(cfg, layer, 4, (t, h), std=0.5)
    domain = (_uniform(cfg, layer, 5, (t,)) < cfg.other_share).long()
    shift = _normal(cfg, layer, 6, (h,), std=0.8)                            # "other" tokens: a mean offset
    x = x + domain[:, None].float() * shift
    # heavy channels: large, mostly one sign, varying per token (1 + 0.3 N), a sign per channel
    sign = torch.where(_uniform(cfg, layer, 7, (len(heavy),)) < 0.5, -1.0, 1.0)
    x[:, heavy] = cfg.outlier_scale * sign * (1.0 + 0.3 * _normal(cfg, layer, 8, (t, len(heavy))))
    return (x * gain).float(), domain, gain


def build_layer(cfg: SyntheticConfig, layer: int) -> LayerCapture:
    """A synthetic MoE layer's weights and the capture of its routing over cfg.tokens tokens."""
    e, h, f, k = cfg.experts, cfg.hidden, cfg.ffn, cfg.top_k
    x, domain, gain = activations(cfg, layer)
    scale = x.abs().mean(dim=0) + 1e-6
    # a trained router does not let the heavy channels decide everything: weight inputs by 1/typical size
    router = _normal(cfg, layer, 9, (e, h), std=h ** -0.5) / scale
    bias = torch.zeros(e)
    bias[-1] = cfg.rare_expert_bias
    logits = x @ router.T + bias
    top = torch.topk(logits, k, dim=1)  # ties: never exact with continuous draws
    gates = torch.softmax(top.values, dim=1)
    # expert weights: Gaussian rows with a mild per-row spread; inputs of heavy channels get small weights,
    # as trained layers do, so no single channel dominates every output
    row = torch.exp(0.2 * _normal(cfg, layer, 10, (e, 2 * f, 1)))
    w13 = _normal(cfg, layer, 11, (e, 2 * f, h), std=h ** -0.5) * row / scale.clamp(min=1.0).sqrt()
    w2 = _normal(cfg, layer, 12, (e, h, f), std=f ** -0.5) * torch.exp(0.2 * _normal(cfg, layer, 13, (e, h, 1)))
    return LayerCapture(layer=layer, x=x, topk=top.indices, gates=gates.float(), w13=w13.float(), w2=w2.float(),
                        domain=domain)
