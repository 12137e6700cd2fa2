"""Recursive-doubling all-reduce for any replica count; its bits equal TreeFold's (report section 5, A.1).

`simulate_allreduce` runs the schedule of `collectives.schedule` in one process (messages are copies);
`all_reduce_` runs the same schedule over a torch.distributed process group with batched point-to-point.
"""
from __future__ import annotations

import sys
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
                scratch: list[torch.Tensor] | None = None, op: str = "sum", width: int | None = None) -> torch.Tensor:
    """Deterministic in-place sum of `tensor` over `group`; every rank gets TreeFold's bits. Returns tensor.
    op "max": the elementwise maximum over the same schedule (exact in any order).

    chunks > 1 pipelines each round: all chunk exchanges are posted, and chunk c is added as soon as it
    has arrived, overlapping the adds with the transfers. Elementwise adds per chunk: the same bits.
    scratch: receive buffers kept by the caller between calls (grown here as needed); fresh ones otherwise.
    width (int64 only): each value travels as its low `width` bytes, two's complement (`packed_all_reduce_`); the
    caller guarantees that every value and every partial sum lies in [-2^(8 width - 1), 2^(8 width - 1)).
    """
    if not tensor.is_contiguous():
        raise ValueError("all_reduce_ needs a contiguous tensor (it sends and folds its storage in place)")
    if width is not None and width != tensor.element_size():
        if op != "sum":
            raise ValueError(f"packed all-reduce: sums only, got op {op!r}")
        return packed_all_reduce_(tensor, width, group, scratch)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    flat = tensor.view(-1)
    bounds = _chunk_bounds(flat.numel(), chunks)
    pool = scratch if scratch is not None else []
    for row in schedule(world):
        step = row[rank]
        if step.idle:
            continue
        bufs = _buffers(pool, len(step.recvs), flat.numel(), flat.dtype, flat.device)
        works = []
        for a, b in bounds:
            works.append(post([(flat[a:b], p) for p in step.sends],
                              [(buf[a:b], p) for p, buf in zip(step.recvs, bufs)], group))
        for (a, b), ws in zip(bounds, works):
            for w in ws:
                w.wait()
            fold_into(flat[a:b], rank, step.fold, {p: buf[a:b] for p, buf in zip(step.recvs, bufs)}, op)
    return tensor


def packed_all_reduce_(tensor: torch.Tensor, width: int, group: dist.ProcessGroup | None = None,
                       scratch: list[torch.Tensor] | None = None) -> torch.Tensor:
    """`all_reduce_`'s sum of an int64 tensor whose values and partial sums all fit `width` bytes (two's complement),
    with `width` bytes an element on the wire: each round sends the accumulator's low bytes and adds what arrives,
    sign-extended. Integer sums in any order: the int64 all-reduce's results. On a CPU the byte passes are
    collectives/wire_cpu.py's loops where its library builds, else torch's. scratch: the caller's kept byte buffers
    (as `all_reduce_`'s; a pool of its own, uint8)."""
    if tensor.dtype != torch.int64 or not 1 <= width < 8:
        raise ValueError(f"packed all-reduce: int64 with a width of 1..7 bytes, got {tensor.dtype}, width {width}")
    rank = dist.get_rank(group)
    flat = tensor.view(-1)
    narrow_into, widen_add = _byte_passes(flat, width)
    pool = scratch if scratch is not None else []
    for row in schedule(dist.get_world_size(group)):
        step = row[rank]
        if step.idle:
            continue
        *got, out = (b.view(-1, width) for b in _buffers(pool, len(step.recvs) + 1, flat.numel() * width,
                                                          torch.uint8, flat.device))
        if step.sends:
            narrow_into(flat, width, out)
        bufs = dict(zip(step.recvs, got))
        for w in post([(out, p) for p in step.sends], [(b, p) for p, b in bufs.items()], group):
            w.wait()
        for i, x in enumerate(x for x in step.fold if x != rank):  # acc = the sum of the fold's values
            widen_add(bufs[x], flat, i == 0 and rank not in step.fold)
    return tensor


def _byte_passes(flat: torch.Tensor, width: int):
    """(narrow_into, widen_add): collectives/wire_cpu.py's loops where they take this tensor and width, else torch's."""
    if flat.device.type == "cpu":
        import collectives.wire_cpu as wire_cpu  # the module, not the package, which imports this one

        if width in wire_cpu.WIDTHS and wire_cpu.takes(flat):
            return wire_cpu.narrow, wire_cpu.widen_add
    return _narrow_into, _widen_add


def _narrow_into(values: torch.Tensor, width: int, out: torch.Tensor) -> None:
    out.copy_(narrow(values, width))


def _widen_add(packed: torch.Tensor, acc: torch.Tensor, assign: bool) -> None:
    """acc = (0 if assign else acc) + widen(packed)."""
    if assign:
        acc.copy_(widen(packed))
    else:
        acc.add_(widen(packed))


def narrow(values: torch.Tensor, width: int) -> torch.Tensor:
    """int64 values (n,) -> their low `width` bytes (n, width) uint8 (the values must fit)."""
    return _bytes(values)[:, :width].contiguous()


def widen(packed: torch.Tensor) -> torch.Tensor:
    """`narrow`'s inverse: (n, width) uint8 -> int64 (n,), the top byte's sign bit extended."""
    n, width = packed.shape
    full = torch.empty((n, 8), dtype=torch.uint8, device=packed.device)
    full[:, :width] = packed
    full[:, width:] = (packed[:, width - 1:] >= 0x80).to(torch.uint8).mul_(0xFF)  # 0x00 or 0xFF, broadcast
    return full.view(torch.int64).view(-1)


def _bytes(values: torch.Tensor) -> torch.Tensor:
    """An int64 tensor's bytes as (n, 8), least significant first (every machine we run on is little-endian)."""
    if sys.byteorder != "little":
        raise RuntimeError("the packed all-reduce reads int64 bytes least significant first: a little-endian host")
    return values.view(torch.uint8).view(-1, 8)


def _buffers(pool: list[torch.Tensor], k: int, n: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """k buffers of n elements: views into pool entries, reallocated when too small."""
    while len(pool) < k:
        pool.append(torch.empty(n, dtype=dtype, device=device))
    for i in range(k):
        b = pool[i]
        if b.numel() < n or b.dtype != dtype or b.device != device:
            pool[i] = torch.empty(n, dtype=dtype, device=device)
    return [pool[i][:n] for i in range(k)]


def _chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    step = max(1, -(-n // chunks))
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]
