"""Recursive-doubling all-reduce for any replica count; its bits equal TreeFold's (report section 5, A.1).

`simulate_allreduce` runs the schedule of `collectives.schedule` in one process (messages are copies);
`all_reduce_` runs the same schedule over a torch.distributed process group with batched point-to-point.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist

from .p2p import exchange, fold_into
from .schedule import Step, allreduce_schedule, check_schedule


@lru_cache(maxsize=64)
def schedule(world: int) -> tuple[tuple[Step, ...], ...]:
    """The checked, cached all-reduce schedule for `world` ranks."""
    rounds = allreduce_schedule(world)
    check_schedule(rounds)
    return tuple(tuple(row) for row in rounds)


def simulate_allreduce(partials: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's result of the deterministic all-reduce of `partials` (one per rank), in one process."""
    if not partials:
        raise ValueError("simulate_allreduce needs at least one partial")
    world = len(partials)
    acc = [p.detach().clone() for p in partials]
    for row in schedule(world):
        # messages carry the sender's value at the start of the round (a copy, like the wire)
        inbox = [{src: acc[src].clone() for src in step.recvs} for step in row]
        for r, step in enumerate(row):
            fold_into(acc[r], r, step.fold, inbox[r])
    return acc


def all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Deterministic in-place sum of `tensor` over `group`; every rank gets TreeFold's bits. Returns tensor."""
    if not tensor.is_contiguous():
        raise ValueError("all_reduce_ needs a contiguous tensor (it sends and folds its storage in place)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    flat = tensor.view(-1)
    bufs: list[torch.Tensor] = []
    for row in schedule(world):
        step = row[rank]
        if step.idle:
            continue
        while len(bufs) < len(step.recvs):
            bufs.append(torch.empty_like(flat))
        got = dict(zip(step.recvs, bufs))
        exchange([(flat, p) for p in step.sends], [(b, p) for p, b in got.items()], group)
        fold_into(flat, rank, step.fold, got)
    return tensor
