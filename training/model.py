"""The OPEN-1B transformer (report tables 2 and 3), written only from kernels/ref ops.

    h = RMSNorm(embed(ids))                                        # embedding norm
    per layer:  a = RMSNorm(h);  q|k|v = int8_linear(a, Wqkv)       # no biases anywhere
                q, k = RoPE(RMSNorm_gainfree(q)), RoPE(RMSNorm_gainfree(k))   # per head, before RoPE
                h = h + int8_linear(attention(q, k, v, window), Wo)  # GQA, sliding window or global
                h = h + FFN(RMSNorm(h))                              # SwiGLU, fused gate|up (or MoE)
    loss = CE + z * lse^2 over RMSNorm(h) W_head^T                   # BR contraction, untied head

Functional: parameters come in as a dict of float32 tensors (the bf16 masters widened once per step)
so the same code serves training, evaluation, calibration and the replay. The batch's windows are separate
samples: the loss terms come out per window, and a parameter given as a tuple of per-window leaves gets each
window's own gradient (training/windows.py: how the step's bits stay independent of its microbatches). `ops` is the op namespace the
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
from training.windows import Param, Window, per_window

F32 = torch.float32


@dataclass
class ForwardOut:
    """Per window [windows]: each window's own means over its tokens."""

    loss: torch.Tensor  # what backward runs on: ce + z_loss * z (+ MoE balance term)
    ce: torch.Tensor
    z: torch.Tensor
    aux: torch.Tensor  # MoE load-balancing term (0 for dense)
    load: dict[str, torch.Tensor]  # MoE tokens per expert, per layer, over the batch (empty for dense)


def _heads(x: torch.Tensor, b: int, t: int, n: int, hd: int) -> torch.Tensor:
    return x.reshape(b, t, n, hd).transpose(1, 2).contiguous()


def attention_block(p: dict[str, Param], cfg: ModelConfig, i: int, x: torch.Tensor,
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


def forward(p: dict[str, Param], cfg: ModelConfig, ids: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
            *, z_loss: float = 1e-4, calib: Calibration | None = None, ops=REF) -> ForwardOut:
    """Per-window losses of windows `ids` [B, T+1] (inputs ids[:, :-1], targets ids[:, 1:]) under float32 params
    `p`: tensors shared by the batch, or tuples of B per-window leaves (module doc)."""

    x_ids, targets = ids[:, :-1], ids[:, 1:]
    b, t = x_ids.shape
    rmsnorm = ops.rmsnorm.rmsnorm

    def norm(x, name):
        return per_window(lambda xi, w: rmsnorm(xi, w, cfg.norm_eps), x, p[name])

    h = norm(per_window(ops.embedding.embedding, x_ids, p["embed.weight"]), "embed_norm.weight")
    aux = torch.zeros(b, dtype=F32, device=h.device)
    load: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_layers):
        a = norm(h, f"layers.{i}.attn_norm.weight")
        h = h + attention_block(p, cfg, i, a, rope, calib, ops)
        f = norm(h, f"layers.{i}.ffn_norm.weight")
        if cfg.moe is None:
            h = h + ffn(p, f"layers.{i}.ffn", f, calib, ops)
        else:
            y, bal, counts = moe_layer(p, cfg, i, f, calib, ops)
            h = h + y
            aux = aux + bal
            load[f"layers.{i}"] = counts
    h = norm(h, "final_norm.weight")
    loss, ce, z = _window_losses(p["head.weight"], cfg, h, targets, z_loss, ops)
    if cfg.moe is not None and cfg.moe.aux_loss_weight:
        loss = loss + aux * torch.tensor(cfg.moe.aux_loss_weight, dtype=F32, device=h.device)
    return ForwardOut(loss, ce, z, aux, load)


def _window_losses(head: Param, cfg: ModelConfig, h: torch.Tensor, targets: torch.Tensor, z_loss: float,
                   ops) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, ce, z) [windows]: the fused head and loss on each window alone, so each is its tokens' mean."""
    rows = [ops.loss.cross_entropy_zloss(h[i], head[i] if isinstance(head, tuple) else head, targets[i],
                                         z_weight=z_loss, chunk=cfg.loss_chunk, slices=cfg.head_slices)
            for i in range(h.shape[0])]
    return tuple(torch.stack(col) for col in zip(*rows))


def moe_layer(p: dict[str, Param], cfg: ModelConfig, i: int, f: torch.Tensor, calib: Calibration | None,
              ops) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y [B, T, D], balance term [B], tokens per expert over the batch) of layer i's MoE FFN. The balance term's
    shares and means are data-dependent groups, so with per-window leaves each window routes alone; shared
    parameters (evaluation, calibration) route the batch as one."""
    prefix = f"layers.{i}.moe"
    if not isinstance(p[f"{prefix}.router.weight"], tuple):
        y, bal, counts = moe_ffn(p, cfg, prefix, f, calib, ops)
        return y, bal.expand(f.shape[0]), counts
    outs = [moe_ffn(Window(p, w), cfg, prefix, f[w:w + 1], calib, ops) for w in range(f.shape[0])]
    return (torch.cat([y for y, _, _ in outs]), torch.stack([bal for _, bal, _ in outs]),
            torch.stack([c for _, _, c in outs]).sum(0))  # br-ok: int64 token counts, an exact sum


def rope_for(cfg: ModelConfig, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables (theta from the config) for the model's sequence length."""
    return rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta, device=device)
