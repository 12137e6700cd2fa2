"""Typed, frozen configs (model, recipe, topology) with validation, and the named presets as data.

Defaults are OPEN-1B's (report tables 2-4, section 3.2); presets shrink the shape, never the recipe.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from training.errors import ConfigError
from kernels.ref.loss import TOKEN_BLOCK
from stream.fileio import canonical_json

REDUCTIONS = ("exact", "ordered")


def _int(v: object, name: str, lo: int = 1, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name}: expected an int {rng}, got {v!r}")


def _float(v: object, name: str, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        raise ConfigError(f"{name}: expected a finite float in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")


@dataclass(frozen=True)
class MoEConfig:
    """Routed top-k experts plus one always-on shared expert, replacing every layer's dense FFN."""

    n_experts: int = 8
    top_k: int = 2
    expert_ffn: int = 256
    shared_ffn: int = 256  # 0: no shared expert
    aux_loss_weight: float = 0.01  # Switch-style load balancing: E * sum_e f_e * P_e

    def __post_init__(self) -> None:
        _int(self.n_experts, "moe.n_experts", 2, 4096)
        _int(self.top_k, "moe.top_k", 1, self.n_experts)
        _int(self.expert_ffn, "moe.expert_ffn")
        _int(self.shared_ffn, "moe.shared_ffn", 0)
        _float(self.aux_loss_weight, "moe.aux_loss_weight", 0.0, 1.0)


@dataclass(frozen=True)
class ModelConfig:
    """The OPEN-1B architecture at a configurable size (report tables 2 and 3)."""

    vocab_size: int = 128_256
    d_model: int = 2048
    n_layers: int = 24
    n_heads: int = 16
    n_kv_heads: int = 4
    head_dim: int = 128
    ffn_hidden: int = 5632
    seq_len: int = 4096
    rope_theta: float = 5e5
    window: int = 512  # sliding window of the local layers; every `full_every`-th layer and the last are global
    full_every: int = 5
    norm_eps: float = 1e-6
    init_std: float = 0.02  # truncated normal, no depth or width scaling (OLMo 2)
    init_bound: float = 2.0  # truncation at +-2 sigma
    pv_block: int = 64  # keys per int8 block of attention's P.V (kernels.ref.attention)
    loss_chunk: int = 1024  # tokens per chunk of the fused CE + z-loss (a multiple of TOKEN_BLOCK, 1024)
    head_slices: int = 3  # int8 slices of the LM head's contractions: 3 keep 20 bits below a row's largest
    # |element|; s slices cost s (s + 1) / 2 int8 products each, and each slice fewer ~10-100x in error (docs/perf.md)
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        _int(self.vocab_size, "model.vocab_size", 2)
        _int(self.d_model, "model.d_model", 2)
        _int(self.n_layers, "model.n_layers")
        _int(self.n_heads, "model.n_heads")
        _int(self.n_kv_heads, "model.n_kv_heads", 1, self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_kv_heads: must divide n_heads={self.n_heads}, got {self.n_kv_heads}")
        _int(self.head_dim, "model.head_dim", 2)
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim: must be even (RoPE pairs), got {self.head_dim}")
        _int(self.ffn_hidden, "model.ffn_hidden")
        _int(self.seq_len, "model.seq_len")
        _float(self.rope_theta, "model.rope_theta", 1.0, 1e12, lo_open=True)
        _int(self.window, "model.window")
        _int(self.full_every, "model.full_every")
        _float(self.norm_eps, "model.norm_eps", 0.0, 1.0)
        _float(self.init_std, "model.init_std", 0.0, 1.0, lo_open=True)
        _float(self.init_bound, "model.init_bound", 0.0, 10.0, lo_open=True)
        _int(self.pv_block, "model.pv_block", 1, 1024)
        _int(self.loss_chunk, "model.loss_chunk", TOKEN_BLOCK)
        if self.loss_chunk % TOKEN_BLOCK:
            raise ConfigError(f"model.loss_chunk: must be a multiple of {TOKEN_BLOCK} (the loss's dW block), "
                              f"got {self.loss_chunk}")
        _int(self.head_slices, "model.head_slices", 1, 4)
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise ConfigError(f"model.moe: expected a MoEConfig or None, got {type(self.moe).__name__}")

    def is_global(self, layer: int) -> bool:
        """Full causal attention on every `full_every`-th layer (1-based) and on the last one."""
        return (layer + 1) % self.full_every == 0 or layer == self.n_layers - 1

    def window_of(self, layer: int) -> int | None:
        """The layer's attention window (None: full causal)."""
        return None if self.is_global(layer) or self.window >= self.seq_len else self.window


@dataclass(frozen=True)
class TrainConfig:
    """The recipe (report section 3.2): AdamW, clipping, spike protocol, z-loss, schedules, seed."""

    seed: int = 42
    corpus: str = "data/demo"
    # batch ramp as (until_tokens, windows_per_step) phases, anchored to consumed tokens (stream.BatchSchedule)
    batch_phases: tuple[tuple[int, int], ...] = ((4_000_000_000, 768), (360_000_000_000, 1152),
                                                 (400_000_000_000, 2304))
    micro_batch: int = 4  # windows a rank computes together (memory and speed only: no bit depends on it)
    lr_peak: float = 4.5e-4
    lr_warmup_tokens: int = 667 * 768 * 4096
    lr_budget_tokens: int = 400_000_000_000
    lr_final_fraction: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # linears and the LM head only
    clip_norm: float = 1.0
    spike_threshold: float = 5.0  # a pre-clip norm above this arms the spike protocol
    spike_skip: int = 5  # optimizer steps skipped per event, the triggering one included
    z_loss: float = 1e-4
    reduction: str = "exact"  # "exact": int64 fixed point, any topology same bits; "ordered": the paper's fold
    heldout_window: int = 6000  # first window of the held-out slice; training must stay below it
    heldout_windows: int = 32
    heldout_stride: int = 1  # held-out window i is heldout_window + i * stride: many documents, not one
    stage_digests: bool = True  # per-stage digests in the hash log (what a replay localizes a mismatch with)

    def __post_init__(self) -> None:
        _int(self.seed, "train.seed", 0, 2**63 - 1)
        if not isinstance(self.corpus, str) or not self.corpus:
            raise ConfigError(f"train.corpus: expected a corpus directory, got {self.corpus!r}")
        phases = self.batch_phases
        if not isinstance(phases, tuple) or not phases:
            raise ConfigError("train.batch_phases: expected a non-empty tuple of (until_tokens, windows_per_step)")
        for i, p in enumerate(phases):
            if not isinstance(p, tuple) or len(p) != 2:
                raise ConfigError(f"train.batch_phases[{i}]: expected (until_tokens, windows_per_step), got {p!r}")
            _int(p[0], f"train.batch_phases[{i}].until_tokens")
            _int(p[1], f"train.batch_phases[{i}].windows_per_step")
        _int(self.micro_batch, "train.micro_batch")
        _float(self.lr_peak, "train.lr_peak", 0.0, 1.0, lo_open=True)
        _int(self.lr_warmup_tokens, "train.lr_warmup_tokens", 0)
        _int(self.lr_budget_tokens, "train.lr_budget_tokens", self.lr_warmup_tokens + 1)
        _float(self.lr_final_fraction, "train.lr_final_fraction", 0.0, 1.0)
        _float(self.beta1, "train.beta1", 0.0, 0.999999)
        _float(self.beta2, "train.beta2", 0.0, 0.999999)
        _float(self.eps, "train.eps", 0.0, 1.0, lo_open=True)
        _float(self.weight_decay, "train.weight_decay", 0.0, 10.0)
        _float(self.clip_norm, "train.clip_norm", 0.0, 1e6, lo_open=True)
        _float(self.spike_threshold, "train.spike_threshold", 0.0, 1e9, lo_open=True)
        _int(self.spike_skip, "train.spike_skip", 0)
        _float(self.z_loss, "train.z_loss", 0.0, 1.0)
        if self.reduction not in REDUCTIONS:
            raise ConfigError(f"train.reduction: expected one of {REDUCTIONS}, got {self.reduction!r}")
        _int(self.heldout_window, "train.heldout_window", 0)
        _int(self.heldout_windows, "train.heldout_windows", 0)
        _int(self.heldout_stride, "train.heldout_stride")
        if not isinstance(self.stage_digests, bool):
            raise ConfigError(f"train.stage_digests: expected a bool, got {self.stage_digests!r}")


@dataclass(frozen=True)
class Topology:
    """The data-parallel mesh a step runs on (really or virtually): dp_replicate x dp_shard ranks.

    A rank runs its windows (m mod world == rank) in microbatches of micro_batch windows.
    """

    dp_replicate: int = 1
    dp_shard: int = 1

    def __post_init__(self) -> None:
        _int(self.dp_replicate, "topology.dp_replicate", 1, 1 << 16)
        _int(self.dp_shard, "topology.dp_shard", 1, 1 << 16)

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard

    def label(self) -> str:
        return f"{self.dp_replicate}x{self.dp_shard}"

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """'RxS' (e.g. '2x4') -> Topology."""
        try:
            r, s = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise ConfigError(f"topology: expected 'RxS' such as '2x4', got {text!r}") from None
        return cls(r, s)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run's bits depend on besides the code and the corpus: the model and the recipe."""

    name: str
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"config.name: expected a non-empty string, got {self.name!r}")
        if self.train.heldout_windows and self.train.heldout_window == 0:
            raise ConfigError("train.heldout_window: must be > 0 when held-out windows are requested")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity_json(self) -> str:
        """What the state hash carries of the config (`identity_json` of its dict)."""
        return identity_json(self.to_dict())

    def replace(self, **train_or_model: Any) -> "RunConfig":
        """A copy with fields changed: keys 'model.<f>' / 'train.<f>' or a whole 'model' / 'train'."""
        model, train, top = {}, {}, {}
        for k, v in train_or_model.items():
            if k.startswith("model."):
                model[k[6:]] = v
            elif k.startswith("train."):
                train[k[6:]] = v
            else:
                top[k] = v
        out = dataclasses.replace(self, **top)
        if model:
            out = dataclasses.replace(out, model=dataclasses.replace(out.model, **model))
        if train:
            out = dataclasses.replace(out, train=dataclasses.replace(out.train, **train))
        return out


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def from_dict(d: dict[str, Any]) -> RunConfig:
    """The inverse of RunConfig.to_dict (JSON lists become the tuples the dataclasses hold)."""
    try:
        m = dict(d["model"])
        moe = m.pop("moe", None)
        model = ModelConfig(**m, moe=MoEConfig(**moe) if moe is not None else None)
        train = TrainConfig(**{k: _tuples(v) for k, v in d["train"].items()})
        return RunConfig(d["name"], model, train)
    except (KeyError, TypeError) as e:
        raise ConfigError(f"config: malformed record ({e})") from None


# what a config may change without changing a bit: where the corpus lies (the state hash carries the corpus by its
# manifest digest, in the stream state) and how a rank cuts its windows into microbatches (training/windows.py)
NOT_IDENTITY = ("corpus", "micro_batch")


def identity_json(config: dict[str, Any]) -> str:
    """Canonical JSON (sorted keys, no spaces) of a config dict without the `train` fields in NOT_IDENTITY, so a run
    trained, replayed or resumed from a copy of its corpus at another path, or with other microbatches, has the
    same hashes."""
    train = {k: v for k, v in config["train"].items() if k not in NOT_IDENTITY}
    return canonical_json({**config, "train": train}).decode()
