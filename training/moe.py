"""Mixture-of-experts FFN: a full-precision router, top-k experts with deterministic ties, a shared expert.

    logits = hp_matmul(x, W_router^T)                       # BR contraction, float32 [N, E]
    top-k experts per token: largest logits, ties to the lower expert index (never device order)
    gates = softmax over the k selected logits              # kernels softmax
    y = shared(x) + sum_slot gates[:, slot] * expert_slot(x)  # slots added in slot order
    aux = E * sum_e f_e * P_e                               # Switch load balancing: f routed share, P mean prob

Every expert is the dense SwiGLU FFN (int8 QAT linears, own activation steps). Where one tensor feeds
several consumers, the backward sums their gradients in a fixed order (`_FanOut`, `_Dispatch`), never in
whatever order the autograd engine or atomics would pick.
"""
from __future__ import annotations

import torch

from kernels import ref as REF
from training.config import ModelConfig
from training.layers import Calibration, ffn
from kernels.ref.contraction import hp_matmul
from kernels.ref.reduce import mean, sum as exact_sum_grad
from kernels.ref.softmax import softmax

F32 = torch.float32


class _FanOut(torch.autograd.Function):
    """n aliases of x whose gradients are added in output order (0 + 1 + ... + n-1)."""

    @staticmethod
    def forward(ctx, x, n):
        return tuple(x.view_as(x) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):
        total = None
        for g in grads:
            if g is not None:
                total = g if total is None else total + g
        return total, None


class _Dispatch(torch.autograd.Function):
    """xs = x[order] for (token, slot) pairs sorted by expert; backward adds each token's k slots in slot order."""

    @staticmethod
    def forward(ctx, x, order, pos):
        ctx.save_for_backward(pos)
        return x.index_select(0, order)

    @staticmethod
    def backward(ctx, g):
        (pos,) = ctx.saved_tensors
        dx = g.index_select(0, pos[:, 0])
        for slot in range(1, pos.shape[1]):
            dx = dx + g.index_select(0, pos[:, slot])  # gathers without duplicates: no atomics, fixed order
        return dx, None, None


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[N, k] expert indices by descending logit; equal logits go to the lower index; NaN counts as -inf."""
    vals = torch.where(torch.isnan(logits), torch.full_like(logits, float("-inf")), logits.detach())
    n, e = vals.shape
    pos = torch.arange(e, device=vals.device).expand(n, e)
    taken = torch.zeros_like(vals, dtype=torch.bool)
    out = []
    for _ in range(k):
        free = torch.where(taken, torch.full_like(vals, float("-inf")), vals)
        m = torch.amax(free, dim=1, keepdim=True)
        first = torch.amin(torch.where((free == m) & ~taken, pos, torch.full_like(pos, e)), dim=1)
        out.append(first)
        taken = taken | (pos == first[:, None])
    return torch.stack(out, dim=1)


def moe_ffn(p: dict[str, torch.Tensor], cfg: ModelConfig, prefix: str, x: torch.Tensor,
            calib: Calibration | None = None, ops=REF) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y [B, T, D], aux loss 0-dim, tokens routed per expert int64 [E]) for normalized input x [B, T, D]."""
    moe = cfg.moe
    b, t, d = x.shape
    n, e, k = b * t, moe.n_experts, moe.top_k
    x_router, x_experts, x_shared = _FanOut.apply(x.reshape(n, d), 3)
    logits = hp_matmul(x_router, p[f"{prefix}.router.weight"].t())
    idx = top_k(logits, k)                                            # [N, k], no gradient
    gates = softmax(logits.gather(1, idx), -1)                        # softmax over the selected logits
    counts = torch.bincount(idx.reshape(-1), minlength=e)            # exact int64 counts
    # pairs (token, slot) sorted by (expert, token): each expert's tokens are one contiguous segment
    key = idx * n + torch.arange(n, device=x.device)[:, None]        # unique int64 keys
    order_pairs = torch.sort(key.reshape(-1), stable=True).indices    # flat pair index j = token * k + slot
    pos = torch.empty_like(order_pairs)
    pos[order_pairs] = torch.arange(n * k, device=x.device)           # where pair (token, slot) sits in xs
    pos = pos.reshape(n, k)
    if calib is not None:
        # before the router has trained, routing says nothing: every expert calibrates on every token
        for j in range(e):
            ffn(p, f"{prefix}.experts.{j}", x_experts.detach(), calib, ops)
    xs = _Dispatch.apply(x_experts, torch.div(order_pairs, k, rounding_mode="floor"), pos)
    parts = []
    for j, seg in enumerate(xs.split(counts.tolist(), dim=0)):
        parts.append(ffn(p, f"{prefix}.experts.{j}", seg, calib, ops) if seg.shape[0] else seg)
    ys = torch.cat(parts, dim=0).index_select(0, pos.reshape(-1)).reshape(n, k, d)  # a permutation: no duplicates
    y = ys[:, 0] * gates[:, 0:1]
    for slot in range(1, k):
        y = y + ys[:, slot] * gates[:, slot:slot + 1]
    if moe.shared_ffn:
        y = y + ffn(p, f"{prefix}.shared", x_shared, calib, ops)
    # load balancing: f_e (no gradient) = routed share, P_e = mean router probability (exact mean)
    frac = counts.to(F32) * torch.tensor(1.0 / (n * k), dtype=F32, device=x.device)
    prob = mean(softmax(logits, -1), dim=0)
    aux = exact_sum_grad(frac * prob, dim=0) * torch.tensor(float(e), dtype=F32, device=x.device)
    return y.reshape(b, t, d), aux, counts
