"""Point-to-point plumbing shared by the distributed collectives: one batched exchange per round, and the fold."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def post(sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]],
         group: dist.ProcessGroup | None = None) -> list:
    """Post sends and receives (peers are group ranks) as one batch; returns the works to wait on.

    Always batched: NCCL point-to-point is only reliable through batch_isend_irecv (docs/architecture.md,
    measured facts).
    """
    ops = [dist.P2POp(dist.isend, t, _global(p, group), group) for t, p in sends]
    ops += [dist.P2POp(dist.irecv, t, _global(p, group), group) for t, p in recvs]
    return dist.batch_isend_irecv(ops) if ops else []


def exchange(sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]],
             group: dist.ProcessGroup | None = None) -> None:
    """One round: post every send and receive as one batch and wait for all."""
    for w in post(sends, recvs, group):
        w.wait()


def _global(group_rank: int, group: dist.ProcessGroup | None) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def fold_into(acc: torch.Tensor, rank: int, fold: Sequence[int], got: dict[int, torch.Tensor],
              op: str = "sum") -> None:
    """acc <- the left-to-right sum (op "sum") or maximum (op "max") of the values of `fold` (acc itself for `rank`,
    else received)."""
    if not fold:
        return
    ops = [acc if x == rank else got[x] for x in fold]
    if len(ops) == 1:
        if ops[0] is not acc:
            acc.copy_(ops[0])
        return
    if rank in fold[2:]:
        raise ValueError(f"rank {rank}'s own value must be among the first two operands of {tuple(fold)}")
    if op == "max":  # exact in any order
        torch.maximum(ops[0], ops[1], out=acc)
        for o in ops[2:]:
            torch.maximum(acc, o, out=acc)
        return
    if op != "sum":
        raise ValueError(f"fold op must be 'sum' or 'max', got {op!r}")
    # bit-relevant: plain elementwise adds, strictly left to right (in place gives the same bits)
    torch.add(ops[0], ops[1], out=acc)
    for o in ops[2:]:
        acc.add_(o)
