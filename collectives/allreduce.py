"""Recursive-doubling all-reduce for any replica count; its bits equal TreeFold's (report section 5, A.1).

`simulate_allreduce` runs the schedule of `collectives.schedule` in one process (messages are copies);
`all_reduce_` runs the same schedule over a torch.distributed process group with batched point-to-point.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist

from .p2p import fold_into, post
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


def all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None, chunks: int = 1,
                scratch: list[torch.Tensor] | None = None, op: str = "sum") -> torch.Tensor:
    """Deterministic in-place sum of `tensor` over `group`; every rank gets TreeFold's bits. Returns tensor.
    op "max": the elementwise maximum over the same schedule (exact in any order).

    chunks > 1 pipelines each round: all chunk exchanges are posted, and chunk c is added as soon as it
    has arrived, overlapping the adds with the transfers. Elementwise adds per chunk: the same bits.
    scratch: receive buffers kept by the caller between calls (grown here as needed); fresh ones otherwise.
    """
    if not tensor.is_contiguous():
        raise ValueError("all_reduce_ needs a contiguous tensor (it sends and folds its storage in place)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    flat = tensor.view(-1)
    bounds = _chunk_bounds(flat.numel(), chunks)
    pool = scratch if scratch is not None else []
    for row in schedule(world):
        step = row[rank]
        if step.idle:
            continue
        bufs = _buffers(pool, len(step.recvs), flat)
        works = []
        for a, b in bounds:
            works.append(post([(flat[a:b], p) for p in step.sends],
                              [(buf[a:b], p) for p, buf in zip(step.recvs, bufs)], group))
        for (a, b), ws in zip(bounds, works):
            for w in ws:
                w.wait()
            fold_into(flat[a:b], rank, step.fold, {p: buf[a:b] for p, buf in zip(step.recvs, bufs)}, op)
    return tensor


def _buffers(pool: list[torch.Tensor], k: int, like: torch.Tensor) -> list[torch.Tensor]:
    """k receive buffers shaped like `like`: views into pool entries, reallocated when too small."""
    n = like.numel()
    while len(pool) < k:
        pool.append(torch.empty(n, dtype=like.dtype, device=like.device))
    for i in range(k):
        b = pool[i]
        if b.numel() < n or b.dtype != like.dtype or b.device != like.device:
            pool[i] = torch.empty(n, dtype=like.dtype, device=like.device)
    return [pool[i][:n] for i in range(k)]


def _chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    step = max(1, -(-n // chunks))
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]
