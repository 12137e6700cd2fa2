"""Exact (fixed-point) all-reduce: the sum's bits stop depending on the order, the tree or the world size.

Each block of `block` elements gets a power-of-two scale from the largest exponent E of that block over
all ranks (agreed by an int32 MAX all-reduce: max is exact in any order). Every addend becomes
round(x * 2^(62 - H - E)) as int64 (|v| < 2^(62-H), so up to 2^H addends cannot overflow); the int64
sum is exact in any order, so torch's fast native all-reduce may do it. One conversion back:
int64 -> float32 (the one rounding, to nearest even) -> times 2^-(62-H-E) (exact unless the result is
subnormal, where that multiply rounds once more): the correctly rounded sum of the gridded addends.

Error: each addend moves by at most 2^(E-63+H), i.e. 2^-(62-H) relative to its block's max (2^-46 for
H = 16), far below float32's 2^-24; the result is the exact sum up to that and the final rounding.
The bits depend only on the addends, `block` and H: fix both for a run. Non-finite inputs raise.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

F32 = torch.float32
NONFINITE = 1 << 20  # exponent sentinel for a block holding inf or NaN


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k as float32 from integer bits (exact; k in [-126, 127])."""
    return ((k.to(torch.int32) + 127) << 23).view(F32)


def _scale_(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x (n_blocks, block) *= 2^k per block, as two power-of-two halves (each representable; k in [-252, 254])."""
    k1 = torch.div(k, 2, rounding_mode="floor")
    # bit-relevant: both halves move the same way, so the first product lies between x and the final
    # one; only a subnormal final product rounds (in encode it then rounds to 0 anyway)
    return x.mul_(_pow2(k1)[:, None]).mul_(_pow2(k - k1)[:, None])


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """A float32 copy of x as (n_blocks, block), zero-padded."""
    if x.dtype != F32:
        raise ValueError(f"exact all-reduce takes float32, got {x.dtype}")
    flat = x.detach().reshape(-1)
    nb = max(1, -(-flat.numel() // block))
    out = torch.empty(nb * block, dtype=F32, device=x.device)
    out[: flat.numel()] = flat
    out[flat.numel():] = 0
    return out.view(nb, block)


def block_exponents(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per block, the E with max|x| < 2^E (frexp's exponent; 0 for an all-zero block); int32."""
    amax = _blocks(x, block).abs_().amax(dim=1)
    _, e = torch.frexp(amax)
    return torch.where(torch.isfinite(amax), e.to(torch.int32), torch.full_like(e, NONFINITE, dtype=torch.int32))


def encode(x: torch.Tensor, e: torch.Tensor, block: int, headroom: int) -> torch.Tensor:
    """x on the shared grid as int64 (n_blocks, block)."""
    if bool((e >= NONFINITE).any()):
        raise ValueError("exact all-reduce: inf or NaN in the input")
    k = (62 - headroom) - e
    # bit-relevant: power-of-two scale (exact: |x * 2^k| < 2^(62-H) stays normal unless it rounds to 0
    # anyway), then one round half to even per element
    return _scale_(_blocks(x, block), k).round_().to(torch.int64)


def decode(v: torch.Tensor, e: torch.Tensor, like: torch.Tensor, headroom: int) -> torch.Tensor:
    """The int64 sums back to a float32 tensor shaped like `like`."""
    k = (62 - headroom) - e
    # bit-relevant: int64 -> float32 is the one rounding; the power-of-two scale is exact for normal results
    out = _scale_(v.to(F32), -k).reshape(-1)[: like.numel()]
    return out.reshape(like.shape)


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
