"""The compact exact wire as a reduce-scatter over a mesh: each element's sum to its owner only (HSDP).

The mesh: a `replica` group of S ranks that split the elements among themselves (owner r of the replica group
gets its parts), and an `across` group of the ranks in the other replicas that own the same elements. Every rank
of the mesh holds a partial sum of every element; the owner gets the float32 result the all-reduce version
(collectives/exact_wire.py) gives, with the same phases, each exact in any order:

1. MAX of the per-block bytes (`agree_tops`) in the replica, then across: every rank knows every block's shift s.
2. The words (one int64 an element, K = bit_length of the mesh's size) reduce-scattered in the replica to the
   owners, then summed across (7 bytes a word on that wire): each owner decodes its elements, and finds those whose
   interval is unsettled.
3. The owners' unsettled positions, made known in the replica by an integer sum (each rank fills only its own
   span; the ranks across hold the same positions, from the same summed words); every rank's low parts of them
   reduce-scattered to their owners and summed across; the owners finish those elements.
4. The flagged blocks' non-finite stand-ins reduce-scattered and summed across (float64, as the limb wire's).

Parts are given per owner, in the same order and sizes on every rank of the mesh; a rank's parts are views of
its accumulators' limbs, carry-normalized in place (the same integers).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .exact_wire import (MANT, WIRE_BYTES, WORD, SumGroup, WireStats, _layout, _low, _Piece, _shifted, agree_tops,
                         decode_part, encode_part, fused_passes, scan_part)
from .limbs import F64, combine, normalize, scaled, to_float32

I32, I64 = torch.int32, torch.int64
Part = tuple[torch.Tensor, torch.Tensor | None]


class ScatterGroup(SumGroup, Protocol):
    """A replica group: the wire's all-reduces, its rank, and a reduce-scatter into shards of given sizes."""

    rank: int

    def reduce_scatter(self, t: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor: ...


def compact_exact_reduce_scatter(parts: Sequence[Sequence[Part]], replica: ScatterGroup, across: SumGroup,
                                 scale: float, block: int = 1024,
                                 chunk: int | None = None,
                                 fused: bool = True) -> tuple[list[torch.Tensor], WireStats]:
    """`parts[r]`: the parts (limbs (3, n) int64, bad (n,) float64 or None) that rank r of `replica` owns. Returns,
    for this rank's own parts, the float32 results of the sums over every rank of the mesh (module doc). `fused`:
    the hot passes fused where they can run (exact_wire.fused_passes), else eager torch; the same bits."""
    me, shards = replica.rank, replica.world
    if len(parts) != shards:
        raise ValueError(f"compact exact reduce-scatter: {len(parts)} owners' parts for a replica group of {shards}")
    world = shards * across.world
    dev = next((lb.device for ps in parts for lb, _ in ps), torch.device("cpu"))
    chunk = chunk or (1 << 16 if dev.type == "cpu" else 1 << 24)
    owners, ends, blocks = [], [0], 0
    for ps in parts:
        pieces = _layout(ps, block, world, scale, chunk)
        for p in pieces:
            p.first += blocks
            p.at += ends[-1]  # its first word in the whole (owner-major) word buffer
        blocks += sum(p.nb for p in pieces)
        ends.append(ends[-1] + sum(p.n for p in pieces))
        owners.append(pieces)
    mine = owners[me]
    stats = WireStats(ends[me + 1] - ends[me], sum(p.nb for p in mine))
    outs = [torch.empty(p.n, dtype=torch.float32, device=dev) for p in mine]
    k = world.bit_length()
    fast = fused_passes([p for pieces in owners for p in pieces]) if fused else None
    info = torch.zeros((2, blocks), dtype=I32, device=dev)
    for pieces in owners:
        for p in pieces:
            scan_part(p, info[:, p.blocks], block, chunk, fast)
    top, flagged = agree_tops(info, [replica, across])
    s = (top + (k - min(MANT, WORD - k))).clamp_(min=0)
    words = torch.empty(ends[-1], dtype=I64, device=dev)
    for pieces in owners:
        for p in pieces:
            encode_part(p, s[p.blocks], k, words[p.at:p.at + p.n], block, chunk, fast)
    sizes = [b - a for a, b in zip(ends, ends[1:])]
    got = replica.reduce_scatter(words, sizes)
    across.all_reduce_sum_(got, width=WIRE_BYTES)
    late = []
    for p, out in zip(mine, outs):
        at = p.at - ends[me]
        idx, tested = decode_part(s[p.blocks], k, got[at:at + p.n], scale, out, block, chunk, fast)
        late.append(idx)
        stats.interval += tested
    stats.unsettled = sum(int(i.numel()) for i in late)
    _resend(owners, ends, late, s, k, got, scale, outs, block, replica, across)
    stats.flagged_blocks = int(flagged.numel())
    if stats.flagged_blocks:
        _non_finite(owners, flagged, outs, block, replica, across)
    return outs, stats


def _resend(owners: list[list[_Piece]], ends: list[int], late: list[torch.Tensor], s: torch.Tensor, k: int,
            got: torch.Tensor, scale: float, outs: list[torch.Tensor], block: int, replica: ScatterGroup,
            across: SumGroup) -> None:
    """Phase 3 (module doc); collective on every rank of the mesh, a no-op past one sum where nothing is unsettled."""
    me, shards, dev = replica.rank, replica.world, got.device
    counts = torch.zeros(shards, dtype=I64, device=dev)
    counts[me] = sum(int(i.numel()) for i in late)
    replica.all_reduce_sum_(counts)
    c = [int(x) for x in counts.tolist()]
    if not sum(c):
        return
    spans = [sum(c[:r]) for r in range(shards + 1)]
    pos = torch.zeros(spans[-1], dtype=I64, device=dev)  # positions in the owner's span of the word buffer
    if c[me]:
        pos[spans[me]:spans[me + 1]] = torch.cat([p.at - ends[me] + idx for p, idx in zip(owners[me], late)])
    replica.all_reduce_sum_(pos)
    lows = [_lows_at(owners[r], pos[spans[r]:spans[r + 1]] + ends[r], s, block).reshape(-1) for r in range(shards)]
    low = replica.reduce_scatter(torch.cat(lows), [3 * x for x in c]).view(3, -1)
    across.all_reduce_sum_(low)  # R limbs below 2^40 each: no overflow
    at = 0
    for p, idx, out in zip(owners[me], late, outs):
        if idx.numel():
            se = s[p.first + idx // block]
            n0, n1, n2 = _shifted(got[p.at - ends[me] + idx] >> k, se)
            sl = low[:, at:at + idx.numel()]
            out[idx] = to_float32(scaled(combine(*normalize(n0 + sl[0], n1 + sl[1], n2 + sl[2])), scale), None)
            at += idx.numel()


def _lows_at(pieces: list[_Piece], pos: torch.Tensor, s: torch.Tensor, block: int) -> torch.Tensor:
    """(3, len(pos)): this rank's low parts (limbs of L mod 2^s) at word positions `pos` of these pieces."""
    out = torch.zeros((3, pos.numel()), dtype=I64, device=pos.device)
    if not pos.numel():
        return out
    starts = torch.tensor([p.at for p in pieces], dtype=I64, device=pos.device)
    which = torch.searchsorted(starts, pos, right=True) - 1
    for j, p in enumerate(pieces):
        sel = (which == j).nonzero().squeeze(1)
        if sel.numel():
            e = pos[sel] - p.at
            out[:, sel] = torch.stack(_low(*(p.limbs[i, e] for i in range(3)), s[p.first + e // block]))
    return out


def _non_finite(owners: list[list[_Piece]], flagged: torch.Tensor, outs: list[torch.Tensor], block: int,
                replica: ScatterGroup, across: SumGroup) -> None:
    """Phase 4: the flagged blocks' `bad` values to their owners (float64 sums, as the limb wire's)."""
    cols = torch.arange(block, device=flagged.device)
    sel, vals, sizes = [], [], []
    for r, pieces in enumerate(owners):
        size = 0
        for p in pieces:
            mine = flagged[(flagged >= p.first) & (flagged < p.first + p.nb)] - p.first
            idx = (mine[:, None] * block + cols).view(-1)
            idx = idx[idx < p.n]
            vals.append(p.bad[idx] if p.bad is not None else torch.zeros(idx.numel(), dtype=F64, device=idx.device))
            if r == replica.rank:
                sel.append(idx)
            size += idx.numel()
        sizes.append(size)
    bad = replica.reduce_scatter(torch.cat(vals), sizes)
    across.all_reduce_sum_(bad)  # sums of 0, +-inf and NaN
    at = 0
    for idx, out in zip(sel, outs):
        out[idx] = to_float32(out[idx], bad[at:at + idx.numel()])  # float32 -> float64 -> float32 is exact
        at += idx.numel()
