"""The model's parameters as data: name -> (shape, kind). Dtypes, init, decay and counts follow the kind.

Kinds: `embedding` (input embedding), `head` (LM head), `linear` (int8 QAT weight), `router` (MoE router,
full precision), `norm` (RMSNorm gain), `act_step` (a linear's learned LSQ activation step, 0-dim).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from training.config import ModelConfig

KINDS = ("embedding", "head", "linear", "router", "norm", "act_step")
DECAYED = frozenset({"linear", "head", "router"})  # report 3.2: linears and the LM head; not embedding/norms
STORED_DTYPE = {"act_step": torch.float32}  # everything else is held in bf16


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def dtype(self) -> torch.dtype:
        return STORED_DTYPE.get(self.kind, torch.bfloat16)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def decayed(self) -> bool:
        return self.kind in DECAYED


def _linear(out: list[ParamSpec], prefix: str, n_out: int, n_in: int) -> None:
    out.append(ParamSpec(f"{prefix}.weight", (n_out, n_in), "linear"))
    out.append(ParamSpec(f"{prefix}.s_x", (), "act_step"))


def _ffn(out: list[ParamSpec], prefix: str, d: int, f: int) -> None:
    _linear(out, f"{prefix}.w_gate_up", 2 * f, d)  # fused gate and up: one GEMM, [gate | up] rows
    _linear(out, f"{prefix}.w_down", d, f)


def param_specs(cfg: ModelConfig) -> list[ParamSpec]:
    """Every parameter in a fixed order (embedding, layers, final norm, head)."""
    d, hd = cfg.d_model, cfg.head_dim
    out = [ParamSpec("embed.weight", (cfg.vocab_size, d), "embedding"),
           ParamSpec("embed_norm.weight", (d,), "norm")]
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        out.append(ParamSpec(f"{p}.attn_norm.weight", (d,), "norm"))
        # fused Q|K|V: one int8 GEMM and one activation step for the one input they share
        _linear(out, f"{p}.attn.wqkv", (cfg.n_heads + 2 * cfg.n_kv_heads) * hd, d)
        _linear(out, f"{p}.attn.wo", d, cfg.n_heads * hd)
        out.append(ParamSpec(f"{p}.ffn_norm.weight", (d,), "norm"))
        if cfg.moe is None:
            _ffn(out, f"{p}.ffn", d, cfg.ffn_hidden)
        else:
            out.append(ParamSpec(f"{p}.moe.router.weight", (cfg.moe.n_experts, d), "router"))
            for e in range(cfg.moe.n_experts):
                _ffn(out, f"{p}.moe.experts.{e}", d, cfg.moe.expert_ffn)
            if cfg.moe.shared_ffn:
                _ffn(out, f"{p}.moe.shared", d, cfg.moe.shared_ffn)
    out.append(ParamSpec("final_norm.weight", (d,), "norm"))
    out.append(ParamSpec("head.weight", (cfg.vocab_size, d), "head"))
    return out


def spec_map(cfg: ModelConfig) -> dict[str, ParamSpec]:
    return {s.name: s for s in param_specs(cfg)}


def count_params(cfg: ModelConfig) -> tuple[int, int]:
    """(total, non-embedding) parameter counts; non-embedding excludes the input embedding and the LM head."""
    total = non_embedding = 0
    for s in param_specs(cfg):
        total += s.numel
        if s.kind not in ("embedding", "head"):
            non_embedding += s.numel
    return total, non_embedding
