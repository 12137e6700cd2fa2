"""Exact (fixed-point) all-reduce: the sum's bits stop depending on the order, the tree or the world size.

Each block of `block` elements gets a power-of-two scale from the largest exponent E of that block over
all ranks (agreed by an int32 MAX all-reduce: max is exact in any order). Every addend becomes
round(x * 2^(62 - H - E)) as int64 (|v| < 2^(62-H), so up to 2^H addends cannot overflow); the int64
sum is exact in any order, so torch's fast native all-reduce may do it. One conversion back:
int64 -> float64 (rounds past 2^53) -> times 2^-(62-H-E) (exact) -> float32 (rounds): deterministic.

Error: each addend moves by at most 2^(E-63+H), i.e. 2^-(62-H) relative to its block's max (2^-46 for
H = 16), far below float32's 2^-24; the result is the exact sum up to that and the final rounding.
The bits depend only on the addends, `block` and H: fix both for a run. Non-finite inputs raise.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

F64 = torch.float64
NONFINITE = 1 << 20  # exponent sentinel for a block holding inf or NaN


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k as float64 from integer bits (exact; k in [-1022, 1023])."""
    return ((k.to(torch.int64) + 1023) << 52).view(F64)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as float64 (n_blocks, block), zero-padded."""
    flat = x.detach().reshape(-1)
    nb = max(1, -(-flat.numel() // block))
    out = torch.zeros(nb * block, dtype=F64, device=x.device)
    out[: flat.numel()] = flat  # float32 -> float64 is exact
    return out.view(nb, block)


def block_exponents(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per block, the E with max|x| < 2^E (frexp's exponent; 0 for an all-zero block); int32."""
    amax = _blocks(x, block).abs().amax(dim=1)
    _, e = torch.frexp(amax)
    return torch.where(torch.isfinite(amax), e.to(torch.int32), torch.full_like(e, NONFINITE, dtype=torch.int32))


def encode(x: torch.Tensor, e: torch.Tensor, block: int, headroom: int) -> torch.Tensor:
    """x on the shared grid as int64 (n_blocks, block)."""
    if bool((e >= NONFINITE).any()):
        raise ValueError("exact all-reduce: inf or NaN in the input")
    k = (62 - headroom) - e.to(torch.int64)
    # bit-relevant: power-of-two scale (exact), one round half to even per element
    return torch.round(_blocks(x, block) * _pow2(k)[:, None]).to(torch.int64)


def decode(v: torch.Tensor, e: torch.Tensor, like: torch.Tensor, headroom: int) -> torch.Tensor:
    """The int64 sums back to a float32 tensor shaped like `like`."""
    k = (62 - headroom) - e.to(torch.int64)
    # bit-relevant: int64 -> float64 (IEEE rounding), exact power-of-two scale, one float32 rounding
    out = (v.to(F64) * _pow2(-k)[:, None]).reshape(-1)[: like.numel()]
    return out.to(like.dtype).reshape(like.shape)


def exact_sum(partials: list[torch.Tensor], block: int = 1024, headroom: int = 16) -> torch.Tensor:
    """Single-process reference: what `exact_all_reduce_` gives for these partials, on any world size or order."""
    _check(len(partials), headroom)
    e = torch.stack([block_exponents(p, block) for p in partials]).amax(dim=0)
    total = encode(partials[0], e, block, headroom)
    for p in partials[1:]:
        total += encode(p, e, block, headroom)
    return decode(total, e, partials[0], headroom)


def exact_all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None, block: int = 1024,
                      headroom: int = 16) -> torch.Tensor:
    """In-place exact sum over `group`: `exact_sum`'s bits on every rank (torch's native all-reduce moves the ints)."""
    _check(dist.get_world_size(group), headroom)
    e = block_exponents(tensor, block)
    dist.all_reduce(e, op=dist.ReduceOp.MAX, group=group)  # max is exact in any order
    v = encode(tensor, e, block, headroom)
    dist.all_reduce(v, op=dist.ReduceOp.SUM, group=group)  # integer sums are exact in any order
    tensor.copy_(decode(v, e, tensor, headroom))
    return tensor


def _check(world: int, headroom: int) -> None:
    if not 0 <= headroom <= 30 or world > 1 << headroom:
        raise ValueError(f"exact all-reduce: {world} addends need headroom >= log2 of it (0..30), got {headroom}")
