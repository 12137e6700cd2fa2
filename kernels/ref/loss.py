"""Fused, chunked cross-entropy + z-loss over the LM head (OPEN-1B 3.1: the [N, V] logits exist once).

Per chunk of tokens: logits = hp_matmul(h, W^T), lse = m + log(exact sum exp(logits - m)),
ce_i = lse_i - logit_i[target], z_i = lse_i^2, and in the same pass the gradient
dlogits = softmax * (1 + 2 z_weight lse) - onehot, contracted at once into dh = dlogits W and
dW = dlogits^T h; the logits are then dropped. The 1/n of the mean is applied after the contractions.
Chunk independence (bits): ce_i, z_i, logits and dh rows depend on their own token only; dW is a sum
over fixed blocks of TOKEN_BLOCK tokens (by token index, one hp contraction each, rounded to float32)
added in float64 in ascending block order and rounded once, so any chunk that is a multiple of
TOKEN_BLOCK gives the same bits. With no target left (all ignored) loss, ce, z and grads are 0.
"""
from __future__ import annotations

import math

import torch

from kernels.ref.checks import expect, same_device
from kernels.ref.contraction import DEFAULT_SLICES, hp_matmul_
from kernels.ref.elementary import log64, reciprocal_
from kernels.ref.reduce import exact_sum
from kernels.ref.softmax import shifted_exp

F32 = torch.float32
F64 = torch.float64
TOKEN_BLOCK = 1024  # the dW contraction unit: part of the op's definition, `chunk` must be a multiple
# (1024, not smaller: each block ends in a float32 rounding and a float64 add per dW element, which a fast
# kernel pays per block; at 1024 tokens that epilogue is cheap next to the block's contraction)


def _chunk_pass(h, w, targets, valid, z2, need_h, need_w, slices):
    """One chunk: (ce, z) per token, dh rows (unscaled) and the chunk's dW blocks (unscaled, float32)."""
    logits = hp_matmul_(h, w.t(), slices)
    m, e, s = shifted_exp(logits, -1)
    lse = (m.to(F64) + log64(s)).to(F32)[:, 0]
    idx = torch.where(valid, targets, torch.zeros_like(targets)).unsqueeze(1)
    zero = torch.zeros_like(lse)
    ce = torch.where(valid, lse - logits.gather(1, idx)[:, 0], zero)
    z = torch.where(valid, lse * lse, zero)
    dh, dw_blocks = None, []
    if need_h or need_w:
        p = e * reciprocal_(s.to(F32))                  # bits of softmax_(logits)
        g = p * (1.0 + z2 * lse).unsqueeze(1)           # separate * and +: no FMA
        hit = torch.arange(w.shape[0], device=h.device).unsqueeze(0) == idx
        g = torch.where(hit, g - 1.0, g)
        g = torch.where(valid.unsqueeze(1), g, torch.zeros_like(g))
        if need_h:
            dh = hp_matmul_(g, w, slices)
        if need_w:
            gt = g.t()
            for b0 in range(0, h.shape[0], TOKEN_BLOCK):
                dw_blocks.append(hp_matmul_(gt[:, b0:b0 + TOKEN_BLOCK], h[b0:b0 + TOKEN_BLOCK], slices))
    return ce, z, dh, dw_blocks


class _CrossEntropyZLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, z_weight, chunk, ignore_index, slices):
        n, d = h.shape
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        valid_all = targets != ignore_index
        count = int(torch.count_nonzero(valid_all))
        inv_n = 1.0 / count if count else 0.0  # br-ok: host double division, IEEE on every host
        inv_n32 = torch.tensor(inv_n, dtype=F32, device=h.device)
        z2 = torch.tensor(2.0 * z_weight, dtype=F32, device=h.device)
        ce = torch.zeros(n, dtype=F32, device=h.device)
        z = torch.zeros(n, dtype=F32, device=h.device)
        dh = torch.zeros_like(h) if need_h else None
        dw64 = torch.zeros(w.shape, dtype=F64, device=h.device) if need_w else None
        if count:
            for c0 in range(0, n, chunk):
                sl = slice(c0, c0 + chunk)
                ce_c, z_c, dh_c, blocks = _chunk_pass(h[sl], w, targets[sl], valid_all[sl], z2, need_h, need_w,
                                                        slices)
                ce[sl], z[sl] = ce_c, z_c
                if need_h:
                    dh[sl] = dh_c * inv_n32
                for part in blocks:                     # ascending token blocks, float64 adds
                    dw64 = dw64 + part.to(F64)
        ce_mean = exact_sum(ce, 0, scale=inv_n)
        z_mean = exact_sum(z, 0, scale=inv_n)
        loss = ce_mean + torch.tensor(z_weight, dtype=F32, device=h.device) * z_mean
        # 1/n in float64 before the one rounding of dW to float32
        dw = (dw64 * inv_n).to(F32) if need_w else None
        ctx.save_for_backward(dh, dw)
        ctx.mark_non_differentiable(ce_mean, z_mean)
        return loss, ce_mean, z_mean

    @staticmethod
    def backward(ctx, g_loss, g_ce, g_z):
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * g_loss, None if dw is None else dw * g_loss,
                None, None, None, None, None)


def _check(h, w_head, targets, z_weight, chunk, ignore_index, slices=DEFAULT_SLICES) -> None:
    op = "cross_entropy_zloss"
    expect(op, "h", h, dtype=F32, ndim=2)
    expect(op, "w_head", w_head, dtype=F32, shape=(None, h.shape[1]))
    expect(op, "targets", targets, dtype=torch.int64, shape=(h.shape[0],))
    same_device(op, h=h, w_head=w_head, targets=targets)
    if w_head.shape[0] < 1:
        raise ValueError(f"{op}: argument 'w_head' must have at least one vocabulary row, got {tuple(w_head.shape)}")
    if isinstance(z_weight, bool) or not isinstance(z_weight, (int, float)) or not math.isfinite(z_weight) \
            or z_weight < 0:
        raise ValueError(f"{op}: argument 'z_weight' must be a finite float >= 0, got {z_weight!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1 or chunk % TOKEN_BLOCK:
        raise ValueError(f"{op}: argument 'chunk' must be a positive multiple of {TOKEN_BLOCK}, got {chunk!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"{op}: argument 'ignore_index' must be an int, got {ignore_index!r}")
    if isinstance(slices, bool) or not isinstance(slices, int) or not 1 <= slices <= 4:
        raise ValueError(f"{op}: argument 'slices' must be an int in 1..4, got {slices!r}")
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= w_head.shape[0]))
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"{op}: argument 'targets' must lie in [0, {w_head.shape[0]}) or equal "
                         f"ignore_index={ignore_index}; targets[{i}] = {int(targets[i])}")


def cross_entropy_zloss(h: torch.Tensor, w_head: torch.Tensor, targets: torch.Tensor, *,
                        z_weight: float = 1e-4, chunk: int = 1024, ignore_index: int = -100,
                        slices: int = DEFAULT_SLICES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, ce_mean, z_mean) for h [N, D], w_head [V, D], targets [N]; gradients flow from loss only.

    loss = mean(ce) + z_weight * mean(lse^2) over tokens whose target is not ignore_index. `slices`: the int8
    slices of the head's three contractions (kernels/ref/contraction; their errors at the head's shape:
    docs/perf.md, docs/results/head_slices.json).
    """
    _check(h, w_head, targets, z_weight, chunk, ignore_index, slices)
    return _CrossEntropyZLoss.apply(h, w_head, targets, float(z_weight), chunk, ignore_index, slices)
