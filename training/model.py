"""The OPEN-1B transformer (report tables 2 and 3), written only from kernels/ref ops.

    h = RMSNorm(embed(ids))                                        # embedding norm
    per layer:  a = RMSNorm(h);  q|k|v = int8_linear(a, Wqkv)       # no biases anywhere
                q, k = RoPE(RMSNorm_gainfree(q)), RoPE(RMSNorm_gainfree(k))   # per head, before RoPE
                h = h + int8_linear(attention(q, k, v, window), Wo)  # GQA, sliding window or global
                h = h + FFN(RMSNorm(h))                              # SwiGLU, fused gate|up (or MoE)
    loss = CE + z * lse^2 over RMSNorm(h) W_head^T                   # BR contraction, untied head

Functional: parameters come in as a dict of float32 tensors (the bf16 masters widened once per step)
so the same code serves training, evaluation, calibration and the replay. `ops` is the op namespace the
forward calls through: kernels.ref (the definitions, the default) or kernels.backend("triton") (the Triton
twins where they exist, the same bits on CUDA); the choice never changes a bit, only the speed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels.ref.attention
import kernels.ref.embedding
import kernels.ref.int8_linear
import kernels.ref.loss
import kernels.ref.rmsnorm
import kernels.ref.rope
from kernels import ref as REF
from kernels.ref.rope import rope_tables
from training.config import ModelConfig
from training.layers import Calibration, ffn, linear
from training.moe import moe_ffn

F32 = torch.float32


@dataclass
class ForwardOut:
    loss: torch.Tensor  # what backward runs on: ce + z_loss * z (+ MoE balance term)
    ce: torch.Tensor
    z: torch.Tensor
    aux: torch.Tensor  # MoE load-balancing term (0 for dense)
    load: dict[str, torch.Tensor]  # MoE tokens per expert, per layer (empty for dense)


def _heads(x: torch.Tensor, b: int, t: int, n: int, hd: int) -> torch.Tensor:
    return x.reshape(b, t, n, hd).transpose(1, 2).contiguous()


def attention_block(p: dict[str, torch.Tensor], cfg: ModelConfig, i: int, x: torch.Tensor,
                    rope: tuple[torch.Tensor, torch.Tensor], calib: Calibration | None = None,
                    ops=REF) -> torch.Tensor:
    """GQA attention of layer i on normalized input x [B, T, D] -> [B, T, D] (before the residual)."""
    b, t, _ = x.shape
    hq, hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    qkv = linear(p, f"layers.{i}.attn.wqkv", x, calib, ops)
    # one split node: its backward is a concatenation, not a sum whose order autograd would pick
    q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
    q, k, v = _heads(q, b, t, hq, hd), _heads(k, b, t, hkv, hd), _heads(v, b, t, hkv, hd)
    cos, sin = rope
    rope_, norm = ops.rope.apply_rope, ops.rmsnorm.rmsnorm
    q = rope_(norm(q, None, cfg.norm_eps), cos[:t], sin[:t])  # gain-free QK norm, per head, before RoPE
    k = rope_(norm(k, None, cfg.norm_eps), cos[:t], sin[:t])
    o = ops.attention.attention(q, k, v, causal=True, window=cfg.window_of(i), pv_block=cfg.pv_block)
    o = o.transpose(1, 2).reshape(b, t, hq * hd)
    return linear(p, f"layers.{i}.attn.wo", o, calib, ops)


def forward(p: dict[str, torch.Tensor], cfg: ModelConfig, ids: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
            *, z_loss: float = 1e-4, calib: Calibration | None = None, ops=REF) -> ForwardOut:
    """Loss of windows `ids` [B, T+1] (inputs ids[:, :-1], targets ids[:, 1:]) under float32 params `p`."""

    x_ids, targets = ids[:, :-1], ids[:, 1:]
    b, t = x_ids.shape
    rmsnorm = ops.rmsnorm.rmsnorm
    h = rmsnorm(ops.embedding.embedding(x_ids, p["embed.weight"]), p["embed_norm.weight"], cfg.norm_eps)
    aux = torch.zeros((), dtype=F32, device=h.device)
    load: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_layers):
        a = rmsnorm(h, p[f"layers.{i}.attn_norm.weight"], cfg.norm_eps)
        h = h + attention_block(p, cfg, i, a, rope, calib, ops)
        f = rmsnorm(h, p[f"layers.{i}.ffn_norm.weight"], cfg.norm_eps)
        if cfg.moe is None:
            h = h + ffn(p, f"layers.{i}.ffn", f, calib, ops)
        else:
            y, bal, counts = moe_ffn(p, cfg, f"layers.{i}.moe", f, calib, ops)
            h = h + y
            aux = aux + bal
            load[f"layers.{i}"] = counts
    h = rmsnorm(h, p["final_norm.weight"], cfg.norm_eps)
    loss, ce, z = ops.loss.cross_entropy_zloss(h.reshape(b * t, -1), p["head.weight"], targets.reshape(-1).to(torch.int64),
                                      z_weight=z_loss, chunk=cfg.loss_chunk, slices=cfg.head_slices)
    if cfg.moe is not None and cfg.moe.aux_loss_weight:
        loss = loss + aux * torch.tensor(cfg.moe.aux_loss_weight, dtype=F32, device=h.device)
    return ForwardOut(loss, ce, z, aux, load)


def rope_for(cfg: ModelConfig, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables (theta from the config) for the model's sequence length."""
    return rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta, device=device)
