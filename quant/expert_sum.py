"""The coupled sum of routed expert contributions, the same bits however experts are spread over a gang.

Each expert's addend goes onto one fixed-point grid whose per-block exponent is the max over all experts
(an int32 MAX all-reduce: exact in any order), is rounded to int64 once, and the int64 addends are summed
(locally, then a SUM all-reduce: integer sums are exact in any order). The result is
collectives.exact.exact_sum of the per-expert addends, whichever actor owns which expert and however many
actors there are: N = 1, 2, 4 give one set of bits. Backward hands each addend the output gradient.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from collectives.exact import block_exponents, decode, encode

BLOCK, HEADROOM = 1024, 16
LOWEST = -(1 << 20)  # exponent of "no addend here": loses every MAX


class Reducer:
    """Sums over the gang's experts; `group is None` and not distributed means a gang of one."""

    def __init__(self, group: dist.ProcessGroup | None = None, distributed: bool = False,
                 device: torch.device | str = "cpu") -> None:
        self.group, self.distributed, self.device = group, distributed, torch.device(device)

    def expert_sum(self, parts: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        """Exact sum of every gang member's `parts` (float32, all `shape`); differentiable in the parts."""
        if parts and any(p.requires_grad for p in parts):
            return _ExpertSum.apply(self, shape, *parts)
        return self._sum(list(parts), shape)

    def _sum(self, parts: list[torch.Tensor], shape) -> torch.Tensor:
        dev = parts[0].device if parts else self.device
        like = torch.zeros(shape, dtype=torch.float32, device=dev)
        nb = max(1, -(-like.numel() // BLOCK))
        e = torch.full((nb,), LOWEST, dtype=torch.int32, device=dev)
        for p in parts:
            e = torch.maximum(e, block_exponents(p.detach(), BLOCK))
        if self.distributed:
            dist.all_reduce(e, op=dist.ReduceOp.MAX, group=self.group)
        e = torch.where(e == LOWEST, torch.zeros_like(e), e)
        v = torch.zeros((nb, BLOCK), dtype=torch.int64, device=dev)
        for p in parts:
            v += encode(p.detach(), e, BLOCK, HEADROOM)   # integer adds: exact, order-free
        if self.distributed:
            dist.all_reduce(v, op=dist.ReduceOp.SUM, group=self.group)
        return decode(v, e, like, HEADROOM)

    def scalar_sum(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Exact sum over the gang of per-expert 0-dim float32 values."""
        return self._sum([v.reshape(1) for v in values], (1,))[0]


class _ExpertSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, reducer, shape, *parts):
        ctx.n = len(parts)
        return reducer._sum(list(parts), shape)

    @staticmethod
    def backward(ctx, g):
        return (None, None) + tuple(g for _ in range(ctx.n))
