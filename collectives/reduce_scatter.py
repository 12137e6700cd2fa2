"""Deterministic reduce-scatter (all-to-all, then a local sum in ascending rank order), all-gather and gather (A.2).

Shards of a flat buffer of n elements over R ranks follow `torch.tensor_split`: the first n % R shards
have n // R + 1 elements, the rest n // R. Both collectives work on the flattened tensor.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import exchange


def shard_bounds(n: int, world: int) -> list[tuple[int, int]]:
    """(start, stop) of each rank's shard of n elements (tensor_split's sizes)."""
    if world < 1 or n < 0:
        raise ValueError(f"shard_bounds needs n >= 0 and world >= 1, got n={n}, world={world}")
    q, extra = divmod(n, world)
    out, start = [], 0
    for r in range(world):
        stop = start + q + (r < extra)
        out.append((start, stop))
        start = stop
    return out


def ascending_sum(chunks: list[torch.Tensor]) -> torch.Tensor:
    """((c_0 + c_1) + c_2) + ...: the fixed order of the deterministic reduce-scatter (a new tensor).

    It starts from c_0, not from zeros: 0.0 + (-0.0) is +0.0, so a zero-initialised accumulator differs in sign bits.
    """
    acc = chunks[0].clone()
    for c in chunks[1:]:
        acc.add_(c)  # bit-relevant: ascending rank order, one elementwise add each
    return acc


def split_bounds(n: int, world: int, sizes: list[int] | None = None) -> list[tuple[int, int]]:
    """(start, stop) of each rank's shard: `shard_bounds`, or consecutive pieces of the given `sizes` (summing to n)."""
    if sizes is None:
        return shard_bounds(n, world)
    if len(sizes) != world or sum(sizes) != n or min(sizes) < 0:
        raise ValueError(f"reduce-scatter sizes {sizes} must be {world} counts >= 0 summing to {n}")
    out, start = [], 0
    for k in sizes:
        out.append((start, start + k))
        start += k
    return out


def simulate_reduce_scatter(inputs: list[torch.Tensor], sizes: list[int] | None = None) -> list[torch.Tensor]:
    """Rank r's shard of the ascending-rank sum of `inputs` (one full buffer per rank), in one process."""
    world = len(inputs)
    flat = [x.detach().reshape(-1) for x in inputs]
    bounds = split_bounds(flat[0].numel(), world, sizes)
    # all-to-all: rank r receives slice r of every rank's buffer (data movement only)
    inbox = [[flat[s][a:b].clone() for s in range(world)] for a, b in bounds]
    return [ascending_sum(chunks) for chunks in inbox]


def simulate_all_gather(shards: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's concatenation of all ranks' shards, in rank order."""
    full = torch.cat([s.reshape(-1) for s in shards])
    return [full.clone() for _ in shards]


def reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                   sizes: list[int] | None = None) -> torch.Tensor:
    """This rank's shard (1-D; `shard_bounds` sizes, or the given `sizes`) of the ascending-rank sum of `tensor` over
    `group`."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    flat = tensor.detach().reshape(-1).contiguous()
    bounds = split_bounds(flat.numel(), world, sizes)
    a, b = bounds[rank]
    chunks = [flat[a:b] if s == rank else torch.empty(b - a, dtype=flat.dtype, device=flat.device)
              for s in range(world)]
    sends = [(flat[lo:hi], s) for s, (lo, hi) in enumerate(bounds) if s != rank and hi > lo]
    recvs = [(chunks[s], s) for s in range(world) if s != rank and b > a]
    exchange(sends, recvs, group)
    return ascending_sum(chunks)


def all_gather(shard: torch.Tensor, numel: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The full 1-D buffer of `numel` elements from every rank's `shard_bounds` shard (data movement only)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    bounds = shard_bounds(numel, world)
    a, b = bounds[rank]
    shard = shard.detach().reshape(-1)
    if shard.numel() != b - a:
        raise ValueError(f"rank {rank}'s shard has {shard.numel()} elements, expected {b - a} of {numel}")
    out = torch.empty(numel, dtype=shard.dtype, device=shard.device)
    out[a:b] = shard
    sends = [(out[a:b], s) for s in range(world) if s != rank and b > a]
    recvs = [(out[lo:hi], s) for s, (lo, hi) in enumerate(bounds) if s != rank and hi > lo]
    exchange(sends, recvs, group)
    return out


def gather(shard: torch.Tensor, numel: int, group: dist.ProcessGroup | None = None,
           dst: int = 0) -> torch.Tensor | None:
    """On group rank `dst`, the full 1-D buffer of `numel` elements from every rank's shard; None elsewhere."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    bounds = shard_bounds(numel, world)
    a, b = bounds[rank]
    shard = shard.detach().reshape(-1)
    if shard.numel() != b - a:
        raise ValueError(f"rank {rank}'s shard has {shard.numel()} elements, expected {b - a} of {numel}")
    if rank != dst:
        exchange([(shard.contiguous(), dst)] if b > a else [], [], group)
        return None
    out = torch.empty(numel, dtype=shard.dtype, device=shard.device)
    out[a:b] = shard
    exchange([], [(out[lo:hi], s) for s, (lo, hi) in enumerate(bounds) if s != rank and hi > lo], group)
    return out
